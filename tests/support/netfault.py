"""A fault-injecting TCP proxy for tests: the link between an agent and its coordinator, made to
fail as Wi-Fi does. This kernel has no `tc netem` and no iptables, so the tests' own asyncio
proxy stands in for the network (written here: no library on the package lists does this).

`FaultProxy(port).start()` listens on a free loopback port and forwards every connection to
127.0.0.1:`port`, chunk by chunk, in both directions. Faults, switched at any time:
- `hold()`: every connection, open or new, stays open and nothing is forwarded either way (a
  Wi-Fi drop: TCP still up, nothing arrives) until `release()`, when what was sent meanwhile goes on;
- `delay(seconds)`: every chunk is forwarded `seconds` after it arrived, in order (a slow link:
  latency, as netem's delay adds it; chunks behind one another are not delayed twice).
`accepted` holds the monotonic time of every connection accepted, so a test can see a client
give up a hung connection and open a new one.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time

CHUNK_BYTES = 64 * 1024


class FaultProxy:
    def __init__(self, target_port: int, target_host: str = "127.0.0.1"):
        self.target = (target_host, target_port)
        self.port = 0
        self.accepted: list[float] = []
        self._delay = 0.0
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="fault-proxy", daemon=True)
        self._flowing: asyncio.Event | None = None
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task] = set()

    def start(self) -> FaultProxy:
        self._thread.start()
        self.port = asyncio.run_coroutine_threadsafe(self._listen(), self._loop).result(10)
        return self

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    async def _listen(self) -> int:
        self._flowing = asyncio.Event()
        self._flowing.set()
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return self._server.sockets[0].getsockname()[1]

    def hold(self) -> None:
        self._loop.call_soon_threadsafe(self._flowing.clear)

    def release(self) -> None:
        self._loop.call_soon_threadsafe(self._flowing.set)

    def delay(self, seconds: float) -> None:
        self._delay = seconds

    def close(self) -> None:
        async def shut():
            self._server.close()
            for task in list(self._tasks):
                task.cancel()
            await asyncio.gather(*self._tasks, return_exceptions=True)

        with contextlib.suppress(Exception):
            asyncio.run_coroutine_threadsafe(shut(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)

    async def _serve(self, client_reader, client_writer) -> None:
        self.accepted.append(time.monotonic())
        try:
            upstream_reader, upstream_writer = await asyncio.open_connection(*self.target)
        except OSError:
            client_writer.close()
            return
        for reader, writer in ((client_reader, upstream_writer), (upstream_reader, client_writer)):
            chunks: asyncio.Queue = asyncio.Queue()
            for coro in (self._read(reader, chunks), self._write(chunks, writer)):
                task = asyncio.ensure_future(coro)
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)

    async def _read(self, reader, chunks: asyncio.Queue) -> None:
        try:
            while True:
                await self._flowing.wait()  # held: nothing is read, so nothing is acknowledged upstream
                data = await reader.read(CHUNK_BYTES)
                await chunks.put((time.monotonic() + self._delay, data))
                if not data:
                    return
        except (OSError, asyncio.IncompleteReadError):
            await chunks.put((time.monotonic(), b""))

    async def _write(self, chunks: asyncio.Queue, writer) -> None:
        try:
            while True:
                due, data = await chunks.get()
                await asyncio.sleep(max(0.0, due - time.monotonic()))
                await self._flowing.wait()  # held: what was read waits too
                if not data:
                    break
                writer.write(data)
                await writer.drain()
        except OSError:
            pass
        finally:
            with contextlib.suppress(Exception):
                writer.close()
