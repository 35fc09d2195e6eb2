"""The state machines of the coordinator's entities: jobs, agents and sweeps.

Each entity has one enum of states, one table of allowed transitions and goes through one
function, `transition`, which moves a row inside the caller's transaction and refuses any move
the table does not allow, naming the entity, its state and the move. A state with no way out
is final: a revoked agent stays revoked, whatever an admin asks afterwards and across restarts,
because the state lives in the table and every change of it passes through `transition`.
Side effects (leases in memory, wake-ups, credential caches) are the callers', after commit.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from coordinator.store import next_seq


class StateError(Exception):
    """A request that does not fit an entity's state: a transition not allowed, a stale lease."""


class UnknownEntity(StateError):
    """No row has the id asked for."""


class JobState(enum.StrEnum):
    QUEUED = "queued"
    LEASED = "leased"
    DONE = "done"
    FAILED = "failed"
    REFUSED = "refused"  # the agent refused the job (FailJob refused=True), with its reason: not a failure
    CANCELLED = "cancelled"
    # Ended, with runs its agent holds for a coordinator upgrade (a record schema newer than it
    # reads): done once they are all stored.
    HELD = "held"


class AgentState(enum.StrEnum):
    ENROLLED = "enrolled"  # enrolled, not heard from since
    IDLE = "idle"
    BUSY = "busy"  # holds a lease
    DRAINING = "draining"  # finishes its job, takes no new one
    REVOKED = "revoked"  # its credential is refused for good


class SweepState(enum.StrEnum):
    RUNNING = "running"
    DONE = "done"  # every job ended
    CANCELLED = "cancelled"


@dataclass(frozen=True)
class Machine:
    """One entity's states: its name in errors, its table and key column, allowed moves."""

    entity: str
    table: str
    key: str
    states: type[enum.StrEnum]
    allowed: dict[enum.StrEnum, frozenset[enum.StrEnum]]

    def final(self) -> set[enum.StrEnum]:
        """The states with no way out."""
        return {s for s in self.states if not self.allowed.get(s)}

    def can(self, current: enum.StrEnum, to: enum.StrEnum) -> bool:
        return to in self.allowed.get(current, frozenset())


JOBS = Machine(
    "job",
    "jobs",
    "job_id",
    JobState,
    {
        JobState.QUEUED: frozenset({JobState.LEASED, JobState.CANCELLED, JobState.FAILED}),
        JobState.LEASED: frozenset(
            {JobState.QUEUED, JobState.DONE, JobState.FAILED, JobState.REFUSED, JobState.CANCELLED, JobState.HELD}
        ),
        JobState.HELD: frozenset({JobState.DONE}),
    },
)
AGENTS = Machine(
    "agent",
    "agents",
    "agent_id",
    AgentState,
    {
        AgentState.ENROLLED: frozenset({AgentState.IDLE, AgentState.BUSY, AgentState.DRAINING, AgentState.REVOKED}),
        AgentState.IDLE: frozenset({AgentState.BUSY, AgentState.DRAINING, AgentState.REVOKED}),
        AgentState.BUSY: frozenset({AgentState.IDLE, AgentState.DRAINING, AgentState.REVOKED}),
        AgentState.DRAINING: frozenset({AgentState.IDLE, AgentState.BUSY, AgentState.REVOKED}),  # undrain
    },
)
SWEEPS = Machine(
    "sweep",
    "sweeps",
    "sweep_id",
    SweepState,
    {SweepState.RUNNING: frozenset({SweepState.DONE, SweepState.CANCELLED})},
)


def current_state(con, machine: Machine, entity_id: str) -> enum.StrEnum:
    """The entity's state as the table holds it, or UnknownEntity."""
    row = con.execute(f"SELECT state FROM {machine.table} WHERE {machine.key} = ?", [entity_id]).fetchone()
    if row is None:
        raise UnknownEntity(f"unknown {machine.entity} {entity_id}")
    return machine.states(row[0])


def transition(con, machine: Machine, entity_id: str, to: enum.StrEnum, **columns) -> enum.StrEnum:
    """Move the entity to `to` inside the caller's transaction, setting `columns` beside the
    state and a fresh seq; refuse (StateError) a move its table does not allow. Returns the
    state it was in."""
    current = current_state(con, machine, entity_id)
    if not machine.can(current, to):
        final = " (final)" if current in machine.final() else ""
        raise StateError(f"{machine.entity} {entity_id} is {current.value}{final}; it cannot become {to.value}")
    sets = "".join(f", {name} = ?" for name in columns)  # names from the callers, never from a request
    con.execute(
        f"UPDATE {machine.table} SET state = ?, seq = ?{sets} WHERE {machine.key} = ?",
        [to.value, next_seq(con), *columns.values(), entity_id],
    )
    return current
