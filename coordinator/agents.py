"""The fleet's agents: enrolment, revocation and draining (last contact: Scheduler.record_beats)."""

from __future__ import annotations

import json
import re
import time
import uuid

from coordinator.auth import consume_token, new_agent_credential
from coordinator.store import Store, next_seq
from specfleet.record import ENGINES

NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
MAX_LABELS = 32


def enrol(
    store: Store, token: str, name: str, fingerprint: dict, labels: dict, engines: list[str], now: float | None = None
) -> tuple[str, str]:
    """Create an agent from an enrolment token; return (agent_id, credential)."""
    if not NAME_RE.match(name):
        raise ValueError(f"agent name {name!r} must be 1-64 letters, digits, '_', '.', '-'")
    if len(labels) > MAX_LABELS or any(len(k) > 64 or len(v) > 256 for k, v in labels.items()):
        raise ValueError(f"at most {MAX_LABELS} labels, keys up to 64 and values up to 256 characters")
    unknown = [e for e in engines if e not in ENGINES]
    if unknown:
        raise ValueError(f"unknown engines {unknown} (known: {', '.join(ENGINES)})")
    now = time.time() if now is None else now
    agent_id = "ag-" + uuid.uuid4().hex[:12]
    credential, credential_hash = new_agent_credential(agent_id)
    with store.tx() as con:
        consume_token(con, token, now)
        if con.execute("SELECT 1 FROM agents WHERE name = ? AND state != 'revoked'", [name]).fetchone():
            raise ValueError(f"an agent named {name!r} is already enrolled: revoke it first or pick another name")
        con.execute(
            "INSERT INTO agents VALUES (?, ?, ?, ?, ?, ?, ?, ?, 'idle', '', NULL, ?, ?, ?)",
            [
                agent_id,
                name,
                credential_hash,
                json.dumps(fingerprint),
                json.dumps(labels),
                json.dumps(engines),
                fingerprint.get("chip", ""),
                int(fingerprint.get("memoryBytes", 0)),
                now,
                now,
                next_seq(con),
            ],
        )
    return agent_id, credential


def set_state(store: Store, agent_id: str, state: str) -> None:
    """Revoke (credential refused from now on) or drain (no new jobs) an agent."""
    if state not in ("revoked", "draining"):
        raise ValueError(f"cannot set agent state to {state!r}")
    with store.tx() as con:
        if con.execute("SELECT 1 FROM agents WHERE agent_id = ?", [agent_id]).fetchone() is None:
            raise ValueError(f"unknown agent {agent_id}")
        con.execute("UPDATE agents SET state = ?, seq = ? WHERE agent_id = ?", [state, next_seq(con), agent_id])
