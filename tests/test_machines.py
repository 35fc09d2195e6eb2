"""A machine is its hardware, never its enrolment (issue 37): one Mac enrolled twice is one
machine in every figure, its raw hardware id is never stored, and two fleets cannot join their
machines. Real DuckDB files, the real ingest and the real speedup definition."""

from __future__ import annotations

import hashlib
import json

import pytest
from prometheus_client.parser import text_string_to_metric_families

from agent.fingerprint import fingerprint, hardware_digest, linux_hardware_ids, parse_ioreg_platform_uuid
from coordinator import agents, auth
from coordinator.ingest import Report, ingest_many
from coordinator.metrics import FleetCollector
from coordinator.scheduler import Scheduler
from coordinator.store import Store
from specfleet import inference, speedup
from specfleet.sweeps import parse_sweep
from tests.support.captured import CAPTURED
from tests.support.clocks import FakeClock
from tests.support.fleet import make_run


def captured(name: str) -> str:
    return (CAPTURED / name).read_text()


MAC = hashlib.sha256(b"IOPlatformUUID:0A1B2C3D-0000-4000-8000-00000000CAFE").hexdigest()
OTHER_MAC = hashlib.sha256(b"IOPlatformUUID:0A1B2C3D-0000-4000-8000-00000000BEEF").hexdigest()
FP = {"chip": "Apple M4 Pro", "memoryBytes": str(48 * 2**30)}
SWEEP = """
name: machines
models:
  mlx: {target: /models/target, draft: /models/draft}
engines: [mlx]
prompt_sets: [code]
prompts: 5
methods: {draft: [2]}
max_new_tokens: 16
repeats: 1
"""


def test_the_ioreg_platform_uuid_and_linux_ids_make_a_stable_digest(tmp_path):
    assert (
        parse_ioreg_platform_uuid(captured("macos-ioreg-platform-expert.txt")) == "xxxxxx"
    )  # redacted by its publisher
    assert parse_ioreg_platform_uuid("") is None
    (tmp_path / "etc").mkdir()
    (tmp_path / "etc/machine-id").write_text("4C4C4544004B\n")
    ids = linux_hardware_ids(tmp_path, ["GPU-2", "GPU-1"])
    assert ids == ["machine-id:4c4c4544004b", "gpu:GPU-2", "gpu:GPU-1"]
    assert hardware_digest(ids) == hardware_digest(list(reversed(ids)))  # the order ids come in is no identity
    assert hardware_digest(ids) != hardware_digest(ids[:1]) and hardware_digest([]) == ""
    (tmp_path / "sys/class/dmi/id").mkdir(parents=True)
    (tmp_path / "sys/class/dmi/id/product_uuid").write_text("B2E1-BOARD\n")
    assert linux_hardware_ids(tmp_path, [])[0] == "product_uuid:b2e1-board"  # the board first, the OS install after
    mac = fingerprint(
        platform="darwin", run=lambda cmd: captured("macos-ioreg-platform-expert.txt") if cmd[0] == "ioreg" else None
    )
    assert mac.hardware_digest == hardware_digest(["IOPlatformUUID:xxxxxx"]) and "hardware_id" not in mac.unavailable
    assert "hardware_id" in fingerprint(platform="darwin", run=lambda cmd: None).unavailable


def machine_ids(store: Store) -> dict[str, str]:
    with store.reader() as con:
        return dict(con.execute("SELECT name, machine_id FROM agents").fetchall())


def test_one_machine_enrolled_twice_is_one_machine_and_no_raw_id_is_stored(tmp_path):
    store = Store(tmp_path / "fleet")
    token, _ = auth.create_token(store, 60, 10)
    agents.enrol(store, token, "mac-a", FP, {}, ["mlx"], hardware_digest=MAC)
    agents.enrol(store, token, "mac-b", FP, {}, ["mlx"], hardware_digest=MAC)  # the same Mac, enrolled again
    agents.enrol(store, token, "mac-c", FP, {}, ["mlx"], hardware_digest=OTHER_MAC)
    agents.enrol(store, token, "mac-d", FP, {}, ["mlx"])  # reported no hardware id: its own machine
    ids = machine_ids(store)
    assert ids["mac-a"] == ids["mac-b"] != ids["mac-c"] and ids["mac-a"].startswith("hw-")
    with store.reader() as con:
        assert ids["mac-d"] == con.execute("SELECT agent_id FROM agents WHERE name = 'mac-d'").fetchone()[0]
        dumped = json.dumps(con.execute("SELECT * FROM agents").fetchall(), default=str)
    assert MAC not in dumped and OTHER_MAC not in dumped  # only the salted hash is kept
    with pytest.raises(ValueError, match="hardware_digest"):
        agents.enrol(store, token, "mac-e", FP, {}, ["mlx"], hardware_digest="not a sha-256")
    store.close()
    other = Store(tmp_path / "another-fleet")  # another fleet's salt: the same Mac cannot be joined
    token, _ = auth.create_token(other, 60, 1)
    agents.enrol(other, token, "mac-a", FP, {}, ["mlx"], hardware_digest=MAC)
    assert machine_ids(other)["mac-a"] != ids["mac-a"]
    other.close()


def test_two_enrolments_of_one_mac_stay_one_machine_inconclusive(tmp_path):
    store = Store(tmp_path)
    clock = FakeClock()
    scheduler = Scheduler(store, clock=clock, lease_seconds=30)
    token, _ = auth.create_token(store, 60, 5, now=clock.now)
    both = [
        agents.enrol(store, token, f"mac-{n}", FP, {}, ["mlx"], now=clock.now, hardware_digest=MAC)[0] for n in "ab"
    ]
    scheduler.submit(parse_sweep(SWEEP), SWEEP)
    for agent_id, level in zip(both, (1.50, 1.52)):
        job = scheduler.acquire(agent_id)
        runs = [
            make_run(
                job.job_id,
                method,
                depth,
                tps=100 * (level if depth else 1.0) * (1 + p / 100),
                prompt_id=f"p{p}",
                repeat=0,
            )
            for p in range(5)
            for method, depth in (("baseline", 0), ("draft", 2))
        ]
        assert all(
            isinstance(r, tuple)
            for r in ingest_many(scheduler, [Report(agent_id, job.job_id, job.lease_id, r) for r in runs])
        )
        scheduler.complete(agent_id, job.job_id, job.lease_id, len(runs))
    with store.reader() as con:
        (figure,) = speedup.speedups(con).itertuples()
        per_prompt = con.execute(speedup.per_prompt_sql("runs")).df()
        assert con.execute("SELECT count(DISTINCT agent_id), count(DISTINCT machine_id) FROM runs").fetchone() == (2, 1)
    assert figure.machines == 1  # two enrolments, one Mac
    decision = inference.decide(inference.estimate(per_prompt), 1.2, 2.0)
    assert decision.verdict == inference.INCONCLUSIVE and decision.why.startswith("inconclusive: 1 of 3 machines")
    gauges = {f.name: f for f in text_string_to_metric_families(_exposition(scheduler))}
    assert [s.value for s in gauges["specfleet_machines"].samples] == [1]
    assert sum(s.value for s in gauges["specfleet_agents"].samples) == 2
    store.close()


def _exposition(scheduler) -> str:
    from prometheus_client import CollectorRegistry, generate_latest

    registry = CollectorRegistry()
    registry.register(FleetCollector(scheduler))
    return generate_latest(registry).decode()


def test_enrolment_over_grpc_keeps_one_machine_and_never_stores_the_digest(coordinator):
    """The real Enrol call: the fingerprint's hardware digest reaches the salting, not the store."""
    from protos.specfleet.v1 import fleet_pb2 as pb
    from tests.support.fleet import enrol

    mac = pb.Fingerprint(hostname="mini", os="macos", chip="Apple M4", memory_bytes=16 * 2**30, hardware_digest=MAC)
    first, second = enrol(coordinator, "mini-a", mac), enrol(coordinator, "mini-b", mac)
    with coordinator.store.reader() as con:
        rows = con.execute("SELECT agent_id, machine_id, fingerprint FROM agents ORDER BY name").fetchall()
    assert [r[0] for r in rows] == [first.agent_id, second.agent_id]
    assert rows[0][1] == rows[1][1] and rows[0][1].startswith("hw-")
    assert all(MAC not in str(r[2]) for r in rows) and "hardwareDigest" not in str(rows[0][2])
