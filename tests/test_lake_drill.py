"""The lake drill (issue 42): two coordinator processes on one DuckLake (a real PostgreSQL catalog,
tests/support/postgres.py), four agents given both addresses (two list one first, two the other),
and a SIGKILL of a coordinator every few seconds for SPECFLEET_LAKE_DRILL_SECONDS (20 s in make
test, and at least SPECFLEET_LAKE_DRILL_KILLS kills: 2; the five-minute drill is 300), each
restarted on the lake the other went on writing.
Afterwards: nothing lost (every run a worker measured is stored, or parked with its reason),
nothing stored twice, one lease per attempt (no job leased twice at once across coordinators),
every job done with its whole cell stored for its last attempt."""

import os
import random
import signal
import time

import pytest
import yaml

from agent.credentials import AgentIdentity
from agent.spool import Spool
from coordinator import lake
from protos.specfleet.v1 import fleet_pb2 as pb
from specfleet.client import AdminApi, AgentApi, channel
from specfleet.data_dir import ENDPOINTS_FILE, admin_credential
from tests.support import postgres
from tests.support.ports import free_port
from tests.support.processes import spawn, stop

pytestmark = [pytest.mark.slow, pytest.mark.process, pytest.mark.engine]
DRILL_SECONDS = float(os.environ.get("SPECFLEET_LAKE_DRILL_SECONDS", "20"))
# At least this many kills however slow the machine (a restart under load can outlast DRILL_SECONDS).
KILLS = int(os.environ.get("SPECFLEET_LAKE_DRILL_KILLS", "2"))
SWEEPS = int(os.environ.get("SPECFLEET_LAKE_DRILL_SWEEPS", "1"))
SEED = int(os.environ.get("SPECFLEET_DRILL_SEED", "42"))
AGENTS = ("lake-a", "lake-b", "lake-c", "lake-d")
PROMPTS, ARMS, REPEATS = 2, 2, 2  # 8 runs a job
SETTLE_SECONDS = float(os.environ.get("SPECFLEET_DRILL_SETTLE_SECONDS", "300"))
START_SECONDS = 300


def start_coordinator(data, port: int, store: str, name: str):
    """A coordinator process on the lake, once it serves (its endpoints file written)."""
    data.mkdir(parents=True, exist_ok=True)
    (data / ENDPOINTS_FILE).unlink(missing_ok=True)
    proc = spawn("coordinator", "serve", "--data-dir", str(data), "--port", str(port), "--metrics-port", "0",
                 "--store", store, "--name", name, "--lease-seconds", "20", log=data / "coordinator.log")  # fmt: skip
    deadline = time.monotonic() + START_SECONDS
    try:
        while not (data / ENDPOINTS_FILE).exists():
            assert proc.poll() is None, (data / "coordinator.log").read_text()[-3000:]
            assert time.monotonic() < deadline, f"the coordinator did not start within {START_SECONDS} s"
            time.sleep(0.1)
    except BaseException:
        stop(proc, signal.SIGKILL)
        raise
    return proc


def sweep(i: int, tiny_models) -> str:
    return yaml.safe_dump(
        {
            "name": f"lake-drill-{i}",
            "target": {"agents": list(AGENTS)},
            "models": {"llama.cpp": {"target": str(tiny_models.gguf_target)}},
            "engines": ["llama.cpp"],
            "prompt_sets": ["qa", "code"],
            "prompts": PROMPTS,
            "methods": {"ngram": [3]},
            "max_new_tokens": 16,
            "warmup": 0,
            "repeats": REPEATS,
            "max_attempts": 20,
        }
    )


@pytest.fixture
def cluster():
    if postgres.bin_dir() is None:
        pytest.skip("no PostgreSQL server: scripts/setup.sh installs it")
    with postgres.cluster() as c:
        yield c


@pytest.mark.timeout(START_SECONDS + DRILL_SECONDS * 3 + SETTLE_SECONDS + 120)
def test_two_coordinators_on_one_lake_survive_kill_9_every_few_seconds(tmp_path, tiny_models, cluster):
    rng = random.Random(SEED)
    store = cluster.store(tmp_path / "lake-data")
    ports = {"one": free_port(), "two": free_port()}
    data = {name: tmp_path / f"coordinator-{name}" for name in ports}
    addresses = [f"127.0.0.1:{port}" for port in ports.values()]
    coordinators = {"one": start_coordinator(data["one"], ports["one"], store, "one")}
    configs = {name: tmp_path / name for name in AGENTS}
    agents: dict[str, object] = {}
    schedule: list[str] = []
    try:
        admin = AdminApi(channel(addresses[0]), admin_credential(data["one"]))
        for i, (name, config) in enumerate(configs.items()):
            token = admin.CreateToken(pb.CreateTokenRequest(ttl_seconds=60, max_uses=1)).token
            resp = AgentApi(channel(addresses[0])).enrol(token, name, pb.Fingerprint(hostname=name), {}, ["llama.cpp"])
            listed = ",".join(addresses if i % 2 == 0 else addresses[::-1])  # two start on each
            AgentIdentity(listed, resp.agent_id, name, resp.credential, resp.heartbeat_interval_seconds).save(config)
        sweep_ids = [
            admin.SubmitSweep(pb.SubmitSweepRequest(yaml=sweep(i, tiny_models))).sweep_id for i in range(SWEEPS)
        ]
        # The second starts on a lake the first has written: it serves those sweeps.
        coordinators["two"] = start_coordinator(data["two"], ports["two"], store, "two")
        second = AdminApi(channel(addresses[1]), admin_credential(data["two"]))
        assert [second.GetSweep(pb.GetSweepRequest(sweep_id=s)).state for s in sweep_ids] == ["running"] * SWEEPS
        for name, config in configs.items():
            agents[name] = spawn("agent", "run", "--config-dir", str(config), log=tmp_path / f"{name}.log")

        end = time.monotonic() + DRILL_SECONDS
        while time.monotonic() < end or len(schedule) < KILLS:
            time.sleep(rng.uniform(2.0, 5.0))
            victim = rng.choice(sorted(coordinators))
            down = rng.uniform(0.0, 2.0)
            schedule.append(f"{len(schedule)}: coordinator {victim} down {down:.1f}s")
            coordinators[victim].send_signal(signal.SIGKILL)
            coordinators[victim].wait(timeout=10)
            time.sleep(down)
            coordinators[victim] = start_coordinator(data[victim], ports[victim], store, victim)

        admin = AdminApi(channel(addresses[0]), admin_credential(data["one"]))
        deadline = time.monotonic() + SETTLE_SECONDS
        while any(admin.GetSweep(pb.GetSweepRequest(sweep_id=s)).state == "running" for s in sweep_ids):
            assert time.monotonic() < deadline, "sweeps still running after the drill:\n" + "\n".join(schedule)
            time.sleep(1)
        time.sleep(3)  # the agents upload what they still hold
        for name in AGENTS:
            assert stop(agents.pop(name)) == 0, (tmp_path / f"{name}.log").read_text()[-3000:]
        for name in list(coordinators):
            assert stop(coordinators.pop(name)) == 0
    finally:
        for proc in [*agents.values(), *coordinators.values()]:
            stop(proc, signal.SIGKILL)

    con = lake.connect(lake.LakeUrl.parse(store))
    stored = [r[0] for r in con.execute("SELECT run_id FROM runs").fetchall()]
    jobs = con.execute("SELECT job_id, state, attempt, reason FROM jobs").fetchall()
    per_attempt = dict(
        ((job, attempt), n)
        for job, attempt, n in con.execute("SELECT job_id, attempt, count(*) FROM runs GROUP BY ALL").fetchall()
    )
    leases_per_attempt = con.execute(
        "SELECT job_id, attempt, count(DISTINCT lease_id) FROM runs GROUP BY ALL HAVING count(DISTINCT lease_id) > 1"
    ).fetchall()
    con.close()
    spools = [Spool(config / "spool") for config in configs.values()]
    measured = {run for spool in spools for run in spool.measured()}
    parked = {p.stem for spool in spools for p in spool.refused.glob("*.json")}
    pending = {p.stem for spool in spools for p in spool.pending.glob("*.json")}
    context = "\n".join(schedule)

    assert len(stored) == len(set(stored)), "a run was stored twice\n" + context
    assert not leases_per_attempt, f"an attempt held two leases: {leases_per_attempt}\n{context}"
    assert not pending, f"{len(pending)} runs never uploaded\n{context}"
    assert measured <= set(stored) | parked, f"{len(measured - set(stored) - parked)} measured runs lost\n{context}"
    assert {state for _, state, _, _ in jobs} == {"done"}, (jobs, context)
    for job, _, attempt, reason in jobs:  # the attempt that completed stored its whole cell
        assert per_attempt.get((job, attempt)) == PROMPTS * ARMS * REPEATS, (job, attempt, reason, context)
    print(
        f"lake drill: {DRILL_SECONDS:g} s, {len(schedule)} coordinator kills: {len(stored)} runs stored, "
        f"{len(measured)} measured, {len(parked)} parked, 0 stored twice, 0 pending, 0 attempts with two leases; "
        f"{len(jobs)} jobs done, attempts {sorted(a for _, _, a, _ in jobs)}"
    )
