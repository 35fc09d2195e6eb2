"""What the agent's loops (agent/heartbeat.py, poll.py, runner.py, preflight.py) see of the agent:
its state, and `AgentParts`, the attributes and calls they use, which agent/daemon.py's Agent
provides. The loops depend on this page, not on the daemon that wires them, so that no module
of agent/ imports itself through another (tests/test_import_cycles.py)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from agent.config import AgentConfig
from agent.credentials import AgentIdentity
from agent.job_runner import JobRunner
from agent.metrics import AgentMetrics
from agent.models import HashCache
from agent.spool import Spool
from agent.upload import Uploader
from protos.specfleet.v1 import fleet_pb2 as pb
from specfleet.client import AgentApi


@dataclass
class AgentState:
    job_id: str = ""
    lease_id: str = ""
    status: str = "starting"
    last_contact: float = 0.0
    draining: bool = False
    not_starting: str = ""  # why no job is started now (battery, low-power mode); "" when none


class AgentParts(Protocol):
    """The agent as its loops use it (agent/daemon.py Agent)."""

    config: AgentConfig
    identity: AgentIdentity
    api: AgentApi
    spool: Spool
    uploader: Uploader
    metrics: AgentMetrics
    hashes: HashCache
    fingerprint: pb.Fingerprint
    state: AgentState  # guarded by `lock`
    lock: threading.Lock
    stop: threading.Event  # set: the agent stops
    beat: threading.Event  # set: send a heartbeat now
    heard: threading.Event  # set once a heartbeat was answered
    job_runner: JobRunner | None  # the job running now
    engines: list[str]
    llama_builds: dict
    hf_cache: Path | None
    sample_environment: Callable
    doctor_hold: Callable[[], str] | None  # agent/doctor.py agent_hold; None: --ignore-doctor
    clock_hold: Callable[[], str]

    def die(self, reason: str) -> None: ...

    def status_line(self) -> str: ...

    def write_status(self) -> None: ...

    def kill_worker(self) -> None: ...
