"""The event loop's way to the database: one thread does all DuckDB work, and calls that arrive
while it is busy are batched into one transaction.

DuckDB's cost is per statement and per commit, not per row: hundreds of results a second fit
easily as a few dozen transactions, and not at all as hundreds.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

MAX_BATCH = 1000


class Database:
    """Runs blocking store work on one thread, off the event loop, in the caller's context,
    through `retrying(fn, *args)` (Store.retrying: a lake transaction that lost the race to
    another coordinator runs again)."""

    def __init__(self, retrying: Callable = lambda fn, *args: fn(*args)):
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="duckdb")
        self._retrying = retrying

    async def run(self, fn: Callable, *args: Any) -> Any:
        call = functools.partial(contextvars.copy_context().run, self._retrying, fn, *args)
        return await asyncio.get_running_loop().run_in_executor(self._executor, call)

    def close(self) -> None:
        self._executor.shutdown(wait=True)


class Batcher:
    """`await submit(item)` returns item's result from `run_batch(items) -> [result | Exception]`,
    which runs on the database thread with every item submitted while the previous batch ran."""

    def __init__(self, db: Database, run_batch: Callable[[list], list], linger_seconds: float = 0.0):
        self._db = db
        self._linger = linger_seconds  # wait this long for company before a batch: fewer, larger commits
        self._run_batch = run_batch
        self._pending: list[tuple[Any, asyncio.Future]] = []
        self._draining = False

    async def submit(self, item: Any) -> Any:
        future = asyncio.get_running_loop().create_future()
        self._pending.append((item, future))
        if not self._draining:
            self._draining = True
            asyncio.get_running_loop().create_task(self._drain())
        return await future

    async def _drain(self) -> None:
        try:
            while self._pending:
                if self._linger:
                    await asyncio.sleep(self._linger)
                batch, self._pending = self._pending[:MAX_BATCH], self._pending[MAX_BATCH:]
                try:
                    results = await self._db.run(self._run_batch, [item for item, _ in batch])
                except Exception as e:  # the whole transaction failed: every caller hears why
                    results = [e] * len(batch)
                for (_, future), result in zip(batch, results):
                    if future.done():  # the caller went away (cancelled RPC)
                        continue
                    if isinstance(result, Exception):
                        future.set_exception(result)
                    else:
                        future.set_result(result)
        finally:
            self._draining = False
