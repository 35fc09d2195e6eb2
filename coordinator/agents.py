"""The fleet's agents: enrolment, and an admin's revocation, draining and undraining.

An agent's state follows coordinator/states.py's AGENTS table: enrolled, then idle or busy as
it takes and ends jobs (coordinator/scheduler.py), draining while an admin wants no new job
for it, and revoked for good. Lengths of names, labels and fingerprint fields are bounded at
the service (coordinator/limits.py); last contact and status: Scheduler.record_beats.

A machine is its hardware (migration 018): the agent's fingerprint carries the SHA-256 of its
hardware ids, which `machine_of` keys with the fleet's salt; an agent re-enrolled on the same
hardware is the same machine, and only the salted hash is stored.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import re
import secrets
import time
import uuid

from coordinator.auth import consume_token, new_agent_credential
from coordinator.scheduler import Scheduler
from coordinator.states import AGENTS, AgentState, StateError, current_state, transition
from coordinator.store import Store, next_seq
from specfleet.record import ENGINES

NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
# What an admin may ask for (SetAgentState.state), and the state it leads to; "idle" undrains.
ADMIN_STATES = {"revoked": AgentState.REVOKED, "draining": AgentState.DRAINING, "idle": AgentState.IDLE}


HARDWARE_DIGEST_RE = re.compile(r"^[0-9a-f]{64}$")


def fleet_salt(con) -> str:
    """The fleet's salt for hardware ids, made once (secrets.token_hex) inside the caller's
    transaction: no other fleet has it, so no other fleet's machine ids can be joined to ours."""
    row = con.execute("SELECT salt FROM fleet_salt").fetchone()
    if row is not None:
        return row[0]
    salt = secrets.token_hex(32)
    con.execute("INSERT INTO fleet_salt VALUES (?)", [salt])
    return salt


def machine_of(con, agent_id: str, hardware_digest: str) -> str:
    """The machine an agent runs on: "hw-" and 16 hex digits of HMAC-SHA-256(fleet salt,
    hardware digest); an agent that reported no hardware id is its own machine (its agent_id)."""
    if not hardware_digest:
        return agent_id
    if not HARDWARE_DIGEST_RE.match(hardware_digest):
        raise ValueError("fingerprint.hardware_digest: must be 64 lowercase hex digits (a SHA-256), or empty")
    keyed = hmac.new(fleet_salt(con).encode(), hardware_digest.encode(), hashlib.sha256)
    return "hw-" + keyed.hexdigest()[:16]


def enrol(
    store: Store,
    token: str,
    name: str,
    fingerprint: dict,
    labels: dict,
    engines: list[str],
    now: float | None = None,
    hardware_digest: str = "",
) -> tuple[str, str]:
    """Create an agent from an enrolment token; return (agent_id, credential). Its machine is
    `machine_of` its hardware digest: the same hardware enrolled twice is one machine."""
    if not NAME_RE.match(name):
        raise ValueError(f"name: agent name {name!r} must be 1-64 letters, digits, '_', '.', '-'")
    unknown = [e for e in engines if e not in ENGINES]
    if unknown:
        raise ValueError(f"engines: unknown engines {unknown} (known: {', '.join(ENGINES)})")
    now = time.time() if now is None else now
    agent_id = "ag-" + uuid.uuid4().hex[:12]
    credential, credential_hash = new_agent_credential(agent_id)
    with store.tx() as con:
        consume_token(con, token, now)
        if con.execute("SELECT 1 FROM agents WHERE name = ? AND state != 'revoked'", [name]).fetchone():
            raise ValueError(f"an agent named {name!r} is already enrolled: revoke it first or pick another name")
        con.execute(
            "INSERT INTO agents VALUES (?, ?, ?, ?, ?, ?, ?, ?, 'enrolled', '', NULL, ?, ?, ?, ?)",
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
                machine_of(con, agent_id, hardware_digest),
            ],
        )
    return agent_id, credential


def set_state(scheduler: Scheduler, agent_id: str, state: str) -> AgentState:
    """An admin's change of the agent's state, in one transaction; returns the state it is in.

    "revoked": its credential is refused from now on, for good, and its open jobs are
    cancelled (no other agent can run them). "draining": it finishes its job and takes no
    other. "idle": a draining agent takes jobs again (busy if it still holds one). A move the
    AGENTS table does not allow is refused (StateError): nothing brings a revoked agent back.
    ValueError for a state an admin cannot ask for; UnknownEntity for an unknown agent."""
    if state not in ADMIN_STATES:
        raise ValueError(f"state: cannot set an agent to {state!r} (one of: {', '.join(ADMIN_STATES)})")
    to = ADMIN_STATES[state]
    with scheduler.transaction() as con:
        current = current_state(con, AGENTS, agent_id)
        if to == AgentState.IDLE and current == AgentState.DRAINING:
            (holds_job,) = con.execute(
                "SELECT current_job_id IS NOT NULL FROM agents WHERE agent_id = ?", [agent_id]
            ).fetchone()
            to = AgentState.BUSY if holds_job else AgentState.IDLE
        elif to == AgentState.IDLE and AGENTS.can(current, to):  # idle or busy by its own doing
            raise StateError(f"agent {agent_id} is {current.value}; only a draining agent can be undrained")
        transition(con, AGENTS, agent_id, to)
        if to == AgentState.REVOKED:
            scheduler.end_agent_jobs(con, agent_id, "agent revoked")
    return to
