"""An agent daemon against an in-process coordinator (tests/support/fleet.py): its enrolled
identity, the daemon on a thread, and the sweeps it is given."""

from __future__ import annotations

import threading

import yaml

from agent.credentials import AgentIdentity
from protos.specfleet.v1 import fleet_pb2 as pb
from tests.support.fleet import admin_for, enrol


def identity_for(coordinator, config_dir, name="agent-under-test"):
    """Enrol an agent called `name` and save its identity in `config_dir`, beating every 0.5 s."""
    api = enrol(coordinator, name=name)
    identity = AgentIdentity(
        coordinator=f"127.0.0.1:{coordinator.port}",
        agent_id=api.agent_id,
        name=name,
        credential=api._metadata[0][1].removeprefix("Bearer "),
        heartbeat_interval_seconds=0.5,
    )
    identity.save(config_dir)
    return identity


class Running:
    """An Agent on a thread, stopped and joined on exit."""

    def __init__(self, agent):
        self.agent = agent
        self.thread = threading.Thread(target=agent.run, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self.agent

    def __exit__(self, *exc):
        self.agent.stop.set()
        self.thread.join(timeout=30)
        assert not self.thread.is_alive(), "agent did not stop"


def submit(coordinator, doc) -> str:
    """Submit the sweep `doc` (a dict, as its YAML would read); its id."""
    return admin_for(coordinator).SubmitSweep(pb.SubmitSweepRequest(yaml=yaml.safe_dump(doc))).sweep_id


def sweep(coordinator, sweep_id):
    """The coordinator's SweepStatus of `sweep_id`."""
    return admin_for(coordinator).GetSweep(pb.GetSweepRequest(sweep_id=sweep_id))
