"""The kill drill: a coordinator and two agents killed with SIGKILL at random, at least
KILLS times, while three sweeps run; each is restarted on its own data. Afterwards nothing is
lost (every run a worker measured is stored, or parked in its agent's spool with the reason:
a run of a lease that expired meanwhile), nothing is stored twice, and no job is stuck (every
sweep ends, every job in a final state, every job done with its whole cell stored for its last
attempt). Real processes on loopback, the tiny GGUF, a seeded schedule printed on failure."""

import os
import random
import signal
import time

import pytest
import yaml

from agent.credentials import AgentIdentity
from agent.spool import Spool
from coordinator.store import open_readonly
from protos.specfleet.v1 import fleet_pb2 as pb
from specfleet.client import AdminApi, AgentApi, channel
from specfleet.data_dir import ENDPOINTS_FILE, admin_credential
from tests.support.ports import free_port
from tests.support.processes import spawn, stop

pytestmark = [pytest.mark.slow, pytest.mark.process, pytest.mark.engine]
# 24 in the slow suite; the full drill (issue 31) is SPECFLEET_DRILL_KILLS=100.
KILLS = int(os.environ.get("SPECFLEET_DRILL_KILLS", "24"))
SEED = int(os.environ.get("SPECFLEET_DRILL_SEED", "17"))
AGENTS = ("drill-a", "drill-b")
SWEEPS = 3
PROMPTS, ARMS, REPEATS = 2, 2, 4  # 16 runs a job
FINAL_JOB_STATES = {"done", "failed", "refused", "cancelled"}
# How long the sweeps have to end after the last kill: a busy machine needs more (a job of 16 runs
# took 1-2 minutes at a load of 12 on 2 cores).
SETTLE_SECONDS = float(os.environ.get("SPECFLEET_DRILL_SETTLE_SECONDS", "240"))
START_SECONDS = 300  # a coordinator's start, on a machine busy with other tests (60 s was too short)
# The drill's own limit, past pytest's default: a kill cycle takes up to about 15 s on a busy machine.
TIMEOUT_SECONDS = 300 + 15 * KILLS + SETTLE_SECONDS


def start_coordinator(data, port: int):
    """A coordinator process on `data` and `port`, once it serves (its endpoints file written)."""
    data.mkdir(parents=True, exist_ok=True)
    (data / ENDPOINTS_FILE).unlink(missing_ok=True)
    proc = spawn("coordinator", "serve", "--data-dir", str(data), "--port", str(port), "--metrics-port", "0",
                 log=data / "coordinator.log")  # fmt: skip
    deadline = time.monotonic() + START_SECONDS
    try:
        while not (data / ENDPOINTS_FILE).exists():
            assert proc.poll() is None, (data / "coordinator.log").read_text()[-3000:]
            assert time.monotonic() < deadline, f"the coordinator did not start within {START_SECONDS} s"
            time.sleep(0.1)
    except BaseException:
        stop(proc, signal.SIGKILL)  # never left behind by a failed drill
        raise
    return proc


@pytest.mark.timeout(TIMEOUT_SECONDS)
def test_random_kills_lose_nothing_double_nothing_and_leave_no_job_stuck(tmp_path, tiny_models):
    """What the scripted durability test (tests/test_durability.py) cannot reach: SIGKILLs of the
    coordinator and of two agents at random moments, many times over three sweeps, wherever they
    land; checked by invariants only (nothing lost, nothing stored twice, every run of an expired
    lease parked with its reason, no job stuck), with the seeded schedule printed on failure."""
    rng = random.Random(SEED)
    data = tmp_path / "coordinator"
    port = free_port()
    address = f"127.0.0.1:{port}"
    coordinator = start_coordinator(data, port)
    configs = {name: tmp_path / name for name in AGENTS}
    agents: dict[str, object] = {}
    schedule: list[str] = []
    try:
        admin = AdminApi(channel(address), admin_credential(data))
        for name, config in configs.items():
            token = admin.CreateToken(pb.CreateTokenRequest(ttl_seconds=60, max_uses=1)).token
            resp = AgentApi(channel(address)).enrol(token, name, pb.Fingerprint(hostname=name), {}, ["llama.cpp"])
            AgentIdentity(address, resp.agent_id, name, resp.credential, resp.heartbeat_interval_seconds).save(config)
        sweep_ids = []
        for i in range(SWEEPS):
            doc = {
                "name": f"drill-{i}",
                "target": {"agents": list(AGENTS)},
                "models": {"llama.cpp": {"target": str(tiny_models.gguf_target)}},
                "engines": ["llama.cpp"],
                "prompt_sets": ["qa", "code"],
                "prompts": PROMPTS,
                "methods": {"ngram": [3]},
                "max_new_tokens": 24,
                "warmup": 0,
                "repeats": REPEATS,
                "max_attempts": 20,  # a job may be interrupted many times: it must still end done
            }
            sweep_ids.append(admin.SubmitSweep(pb.SubmitSweepRequest(yaml=yaml.safe_dump(doc))).sweep_id)
        for name, config in configs.items():
            agents[name] = spawn("agent", "run", "--config-dir", str(config), log=tmp_path / f"{name}.log")

        for kill in range(KILLS):
            time.sleep(rng.uniform(0.5, 2.5))
            victim = rng.choice(["coordinator", *AGENTS])
            down = rng.uniform(0.0, 1.5)
            schedule.append(f"{kill}: {victim} down {down:.1f}s")
            if victim == "coordinator":
                coordinator.send_signal(signal.SIGKILL)
                coordinator.wait(timeout=10)
                time.sleep(down)
                coordinator = start_coordinator(data, port)
            else:
                agents[victim].send_signal(signal.SIGKILL)
                agents[victim].wait(timeout=10)
                time.sleep(down)
                agents[victim] = spawn(
                    "agent", "run", "--config-dir", str(configs[victim]), log=tmp_path / f"{victim}.log"
                )

        admin = AdminApi(channel(address), admin_credential(data))
        deadline = time.monotonic() + SETTLE_SECONDS
        while any(admin.GetSweep(pb.GetSweepRequest(sweep_id=s)).state == "running" for s in sweep_ids):
            assert time.monotonic() < deadline, "sweeps still running after the drill:\n" + "\n".join(schedule)
            time.sleep(1)
        # Let the agents upload what they still hold, then stop them as a user would.
        time.sleep(3)
        for name in AGENTS:
            assert stop(agents.pop(name)) == 0, (tmp_path / f"{name}.log").read_text()[-3000:]
        assert stop(coordinator) == 0
    finally:
        for proc in agents.values():
            stop(proc, signal.SIGKILL)
        stop(coordinator, signal.SIGKILL)

    con = open_readonly(data)
    stored = [r[0] for r in con.execute("SELECT run_id FROM runs").fetchall()]
    jobs = con.execute("SELECT job_id, state, attempt, reason FROM jobs").fetchall()
    per_attempt = dict(
        ((job, attempt), n)
        for job, attempt, n in con.execute("SELECT job_id, attempt, count(*) FROM runs GROUP BY ALL").fetchall()
    )
    sweeps = con.execute("SELECT state FROM sweeps").fetchall()
    con.close()
    spools = [Spool(config / "spool") for config in configs.values()]
    measured = {run for spool in spools for run in spool.measured()}
    parked = {p.stem for spool in spools for p in spool.refused.glob("*.json")}
    pending = {p.stem for spool in spools for p in spool.pending.glob("*.json")}
    context = "\n".join(schedule)

    assert len(stored) == len(set(stored)), "a run was stored twice\n" + context
    assert not pending, f"{len(pending)} runs never uploaded\n{context}"
    assert measured <= set(stored) | parked, f"{len(measured - set(stored) - parked)} measured runs lost\n{context}"
    assert len(schedule) >= min(KILLS, 20) and {s.split()[1] for s in schedule} >= {"coordinator"}, context
    assert all(state == "done" for (state,) in sweeps), (sweeps, context)
    assert {state for _, state, _, _ in jobs} <= FINAL_JOB_STATES, (jobs, context)
    for job, state, attempt, reason in jobs:
        if state == "done":  # the attempt that completed stored its whole cell
            assert per_attempt.get((job, attempt)) == PROMPTS * ARMS * REPEATS, (job, attempt, reason, context)
    assert sum(state == "done" for _, state, _, _ in jobs) == len(jobs), (jobs, context)
    # The kills did interrupt jobs: some were requeued and ran again.
    assert max(attempt for _, _, attempt, _ in jobs) > 1, (jobs, context)
    kinds = {v: sum(s.split()[1] == v for s in schedule) for v in ("coordinator", *AGENTS)}
    print(
        f"{len(schedule)} kills {kinds}: {len(stored)} runs stored, {len(measured)} measured, {len(parked)} parked, "
        f"0 stored twice, 0 pending; {len(jobs)} jobs done, attempts {sorted(a for _, _, a, _ in jobs)}"
    )
