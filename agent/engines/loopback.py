"""HTTP to a server on 127.0.0.1, standard library only: plain requests, JSON, and streamed
server-sent events timed as each one arrives.

Connection failures surface as OSError (ConnectionError for a malformed HTTP answer), so that
the caller can ask whether the server died; an answer that is not what was asked for (an HTTP
error status, a body that is not JSON, an `error` event) is a BadAnswer naming what came back.
"""

from __future__ import annotations

import http.client
import json
import time
from collections.abc import Iterator

from .base import EngineError

HOST = "127.0.0.1"
EXCERPT_CHARS = 300


class BadAnswer(EngineError):
    """The server answered, but not with what was asked for."""


def _excerpt(body: bytes | str) -> str:
    text = body.decode(errors="replace") if isinstance(body, bytes) else body
    text = text.strip()
    return text[:EXCERPT_CHARS] + ("..." if len(text) > EXCERPT_CHARS else "")


def request(
    port: int, method: str, path: str, body: dict | None = None, timeout: float = 60.0, host: str = HOST
) -> tuple[int, bytes]:
    """(status, body) of one request; `body` is sent as JSON."""
    conn = http.client.HTTPConnection(host, port, timeout=timeout)
    try:
        data = json.dumps(body).encode() if body is not None else None
        conn.request(method, path, body=data, headers={"Content-Type": "application/json"} if data else {})
        resp = conn.getresponse()
        return resp.status, resp.read()
    except http.client.HTTPException as e:
        raise ConnectionError(f"malformed HTTP answer: {type(e).__name__}: {e}") from None
    finally:
        conn.close()


def json_of(status: int, body: bytes, what: str) -> dict:
    """The JSON object of a 200 answer; BadAnswer for anything else."""
    if status != 200:
        raise BadAnswer(f"{what} answered HTTP {status}: {_excerpt(body)}")
    return _object(body, f"{what} answered", "something")


def _object(text: bytes, sent: str, thing: str) -> dict:
    """`text` as a JSON object; BadAnswer saying what was `sent` otherwise."""
    try:
        value = json.loads(text)
    except ValueError:
        raise BadAnswer(f"{sent} {thing} that is not JSON: {_excerpt(text)!r}") from None
    if not isinstance(value, dict):
        raise BadAnswer(f"{sent} JSON that is not an object: {_excerpt(text)!r}")
    return value


def post_json(port: int, path: str, body: dict, timeout: float = 60.0, host: str = HOST) -> dict:
    return json_of(*request(port, "POST", path, body, timeout, host), f"POST {path}")


def stream_events(port: int, path: str, body: dict, timeout: float, host: str = HOST) -> Iterator[tuple[float, dict]]:
    """POST `body` and yield (time.perf_counter() at arrival, event) for every `data:` line of the
    event stream, until `data: [DONE]` or the end of the stream. One timestamp per event, taken as
    soon as its line has been read."""
    conn = http.client.HTTPConnection(host, port, timeout=timeout)
    try:
        conn.request("POST", path, body=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        if resp.status != 200:
            raise BadAnswer(f"POST {path} answered HTTP {resp.status}: {_excerpt(resp.read())}")
        while True:
            line = resp.readline()
            arrived = time.perf_counter()
            if not line:
                return
            line = line.strip()
            if not line or line.startswith(b":"):
                continue  # event separator or keep-alive comment
            field, _, value = line.partition(b":")
            value = value.strip()
            if field == b"error":
                raise BadAnswer(f"POST {path} streamed an error: {_excerpt(value)}")
            if field != b"data":
                continue
            if value == b"[DONE]":
                return
            event = _object(value, f"POST {path} streamed", "an event")
            if "error" in event:
                raise BadAnswer(f"POST {path} streamed an error: {_excerpt(json.dumps(event['error']))}")
            yield arrived, event
    except http.client.HTTPException as e:
        raise ConnectionError(f"malformed HTTP answer: {type(e).__name__}: {e}") from None
    finally:
        conn.close()
