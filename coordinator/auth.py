"""Enrolment tokens, agent and admin credentials, and the one interceptor that checks them.

Only SHA-256 hashes of secrets are stored. Agent credentials have the form
`sfa.<agent_id>.<secret>` so the interceptor finds the row without scanning; admin
credentials `sfadm.<secret>`; enrolment tokens `sft.<secret>`.
"""

from __future__ import annotations

import contextvars
import functools
import hashlib
import hmac
import secrets
import time

import grpc

from coordinator.batching import Batcher, Database
from coordinator.interceptors import WrappingInterceptor, stream_handler, unary_handler
from coordinator.store import Store, placeholders

AGENT_SERVICE = "/specfleet.v1.AgentService/"
ADMIN_SERVICE = "/specfleet.v1.AdminService/"
UNAUTHENTICATED_METHODS = {AGENT_SERVICE + "Enrol", "/grpc.health.v1.Health/Check", "/grpc.health.v1.Health/Watch"}

# The agent id of the caller, set by the interceptor for the duration of an agent RPC.
current_agent: contextvars.ContextVar[str] = contextvars.ContextVar("current_agent")


class AuthError(Exception):
    def __init__(self, code: grpc.StatusCode, message: str):
        super().__init__(message)
        self.code = code


def hash_secret(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def create_token(store: Store, ttl_seconds: float, max_uses: int, note: str = "", now: float | None = None):
    if not (0 < ttl_seconds <= 365 * 86400):
        raise ValueError(f"ttl_seconds must be in (0, 1 year], got {ttl_seconds}")
    if not (1 <= max_uses <= 100_000):
        raise ValueError(f"max_uses must be in [1, 100000], got {max_uses}")
    now = time.time() if now is None else now
    token = "sft." + secrets.token_urlsafe(24)
    with store.tx() as con:
        con.execute(
            "INSERT INTO tokens VALUES (?, ?, ?, ?, ?, 0)",
            [hash_secret(token), note, now, now + ttl_seconds, max_uses],
        )
    return token, now + ttl_seconds


def consume_token(con, token: str, now: float) -> None:
    """Count one use of an enrolment token inside the caller's transaction, or raise."""
    row = con.execute(
        "SELECT expires_at, max_uses, uses FROM tokens WHERE token_hash = ?", [hash_secret(token)]
    ).fetchone()
    if row is None:
        raise AuthError(grpc.StatusCode.UNAUTHENTICATED, "unknown enrolment token")
    expires_at, max_uses, uses = row
    if now >= expires_at:
        raise AuthError(grpc.StatusCode.UNAUTHENTICATED, "enrolment token expired")
    if uses >= max_uses:
        raise AuthError(grpc.StatusCode.PERMISSION_DENIED, f"enrolment token already used {uses} of {max_uses} times")
    con.execute("UPDATE tokens SET uses = uses + 1 WHERE token_hash = ?", [hash_secret(token)])


def new_agent_credential(agent_id: str) -> tuple[str, str]:
    """(credential to hand out once, hash to store)."""
    secret = secrets.token_urlsafe(32)
    return f"sfa.{agent_id}.{secret}", hash_secret(secret)


def ensure_admin_credential(store: Store, existing: str | None) -> str:
    """Register `existing` (or a new credential) as an admin credential and return it."""
    credential = existing or "sfadm." + secrets.token_urlsafe(32)
    with store.tx() as con:
        con.execute(
            "INSERT INTO admin_credentials SELECT $hash, $now"  # no key on a lake table to conflict on
            " WHERE NOT EXISTS (SELECT 1 FROM admin_credentials WHERE credential_hash = $hash)",
            {"hash": hash_secret(credential), "now": time.time()},
        )
    return credential


def _bearer(metadata) -> str:
    for key, value in metadata or ():
        if key == "authorization":
            if not value.startswith("Bearer "):
                raise AuthError(grpc.StatusCode.UNAUTHENTICATED, "authorization metadata must be 'Bearer <credential>'")
            return value[len("Bearer ") :]
    raise AuthError(grpc.StatusCode.UNAUTHENTICATED, "missing credential (authorization metadata)")


def admin_identity(metadata) -> str:
    """The identity of the admin credential in `metadata`, as the coordinator knows it: admin
    credentials carry no name, so it is "admin:" and the first 12 hex digits of the hash the
    coordinator stores (admin_credentials.credential_hash), never the secret."""
    return "admin:" + hash_secret(_bearer(metadata))[:12]


def _agent_rows(store: Store, agent_ids: list[str]) -> list[tuple[str, str] | None]:
    """(credential hash, state) of each agent, None for an unknown one: one query for many."""
    with store.tx() as con:
        rows = con.execute(
            f"SELECT agent_id, credential_hash, state FROM agents WHERE agent_id IN {placeholders(agent_ids)}",
            agent_ids,
        ).fetchall()
    found = {agent_id: (digest, state) for agent_id, digest, state in rows}
    return [found.get(agent_id) for agent_id in agent_ids]


def _is_admin(store: Store, credential_hash: str) -> bool:
    with store.tx() as con:
        return con.execute("SELECT 1 FROM admin_credentials WHERE credential_hash = ?", [credential_hash]).fetchone()


def _check_agent(credential: str, load) -> str:
    parts = credential.split(".")
    if len(parts) != 3 or parts[0] != "sfa":
        raise AuthError(grpc.StatusCode.UNAUTHENTICATED, "malformed agent credential")
    _, agent_id, secret = parts
    row = load(agent_id)
    if row is None or not hmac.compare_digest(row[0], hash_secret(secret)):
        raise AuthError(grpc.StatusCode.UNAUTHENTICATED, "unknown or wrong agent credential")
    if row[1] == "revoked":
        raise AuthError(grpc.StatusCode.PERMISSION_DENIED, f"agent {agent_id} has been revoked")
    return agent_id


class Credentials:
    """Checks credentials with an in-memory copy of each agent's (hash, state) and of the admin
    hashes seen. The coordinator is the database's only writer, so the copy stays exact as long
    as every change of an agent's state calls `forget`."""

    def __init__(self, store: Store, db: Database):
        self._store = store
        self._db = db
        self._agents: dict[str, tuple[str, str]] = {}
        self._admins: set[str] = set()
        # Agents not seen yet are looked up together: a restarted coordinator's first calls
        # from a thousand agents cost a few queries, not a thousand transactions in a queue.
        self._lookups = Batcher(db, functools.partial(_agent_rows, store))

    async def agent(self, metadata) -> str:
        credential = _bearer(metadata)
        agent_id = credential.split(".")[1] if credential.count(".") == 2 else ""
        if agent_id and agent_id not in self._agents:
            row = await self._lookups.submit(agent_id)
            if row is not None:
                self._agents[agent_id] = row
        return _check_agent(credential, self._agents.get)

    async def admin(self, metadata) -> None:
        digest = hash_secret(_bearer(metadata))
        if digest not in self._admins:
            if not await self._db.run(_is_admin, self._store, digest):
                raise AuthError(grpc.StatusCode.PERMISSION_DENIED, "not an admin credential")
            self._admins.add(digest)

    def checked_against(self, agent_id: str) -> tuple[str, str] | None:
        """The copy of the agent's (hash, state) its credential was last checked against: the
        same object until `forget` drops it."""
        return self._agents.get(agent_id)

    def forget(self, agent_id: str) -> None:
        self._agents.pop(agent_id, None)


class AuthInterceptor(WrappingInterceptor):
    """Checks every call: agent credentials for AgentService, admin credentials for AdminService.

    The check runs inside the wrapped handler, in the task that serves the call, so the
    authenticated agent id can be handed to the servicer through a context variable. A stream
    is checked when it opens, and every message looks whether an admin changed the agent's
    state since (one dictionary lookup); if one did, the credential is checked again: revoking
    an agent ends its open streams at their next message.
    """

    def __init__(self, credentials: Credentials):
        super().__init__()
        self._credentials = credentials

    def wrap(self, method: str, handler):
        if method in UNAUTHENTICATED_METHODS:
            return handler
        if method.startswith(AGENT_SERVICE):

            async def check(md):
                current_agent.set(await self._credentials.agent(md))

        elif method.startswith(ADMIN_SERVICE):
            check = self._credentials.admin
        else:
            return handler

        async def checked(context, metadata):
            try:
                await check(metadata)
            except AuthError as e:
                await context.abort(e.code, str(e))

        if handler.unary_unary is not None:
            inner = handler.unary_unary

            async def guarded(request, context):
                await checked(context, context.invocation_metadata())
                return await inner(request, context)

            return unary_handler(guarded, handler)
        if handler.stream_stream is not None and method.startswith(AGENT_SERVICE):
            inner_stream = handler.stream_stream
            credentials = self._credentials

            async def guarded_stream(requests, context):
                metadata = context.invocation_metadata()  # a stream's metadata is sent once
                await checked(context, metadata)
                agent_id = current_agent.get()
                entry = credentials.checked_against(agent_id)

                async def each_checked():
                    nonlocal entry
                    async for request in requests:
                        # Revoking or draining the agent drops its entry: only then is the
                        # credential checked again (a revoked agent is refused here).
                        if credentials.checked_against(agent_id) is not entry:
                            await checked(context, metadata)
                            entry = credentials.checked_against(agent_id)
                        yield request

                async for response in inner_stream(each_checked(), context):
                    yield response

            return stream_handler(guarded_stream, handler)
        raise NotImplementedError(f"{method}: only unary methods and AgentService streams can be authenticated")
