"""Commands that start children stop them (issue 31, item 6): `specfleet dashboard` asked to
stop with SIGTERM or SIGINT stops its Streamlit first, and killed with SIGKILL its Streamlit
stops itself (the lifeline, dashboard/serve.py); `specfleet demo` asked to stop, or killed,
leaves none of its coordinator, agent and workers behind; `specfleet agent run` asked to stop
stops its worker. Real processes on loopback."""

import signal
import subprocess
import sys
import time
import urllib.request

import psutil
import pytest
import yaml

from agent.credentials import AgentIdentity
from protos.specfleet.v1 import fleet_pb2 as pb
from specfleet.client import AdminApi, AgentApi, channel
from specfleet.data_dir import admin_credential
from tests.support.ports import free_port
from tests.support.processes import ROOT, spawn, start_coordinator, stop

pytestmark = [pytest.mark.process]

START_SECONDS = 180  # Streamlit and the demo's processes on a busy 2-core machine
GONE_SECONDS = 60


def wait_until(condition, what: str, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, f"{what} within {seconds} s"
        time.sleep(0.3)


def answers(port: int) -> bool:
    try:
        return urllib.request.urlopen(f"http://127.0.0.1:{port}/_stcore/health", timeout=2).read() == b"ok"
    except OSError:
        return False


def descendants(pid: int) -> list[psutil.Process]:
    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []


def running(procs: list[psutil.Process]) -> list[psutil.Process]:
    alive = []
    for p in procs:
        try:
            if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                alive.append(p)
        except psutil.NoSuchProcess:
            pass
    return alive


def kill_all(procs) -> None:
    """What a test leaves running when it fails: killed, so that no failure leaks processes."""
    for p in running(procs):
        p.kill()


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGKILL], ids=["term", "int", "kill"])
def test_dashboard_stops_its_streamlit(tmp_path, sig):
    port = free_port()
    log = open(tmp_path / "dashboard.log", "w")  # noqa: SIM115
    cmd = [sys.executable, "-m", "cli.main", "dashboard", "--coordinator", "127.0.0.1:1", "--admin-token", "x"]
    proc = subprocess.Popen([*cmd, "--port", str(port)], stdout=log, stderr=subprocess.STDOUT, cwd=ROOT)
    children = []
    try:
        wait_until(lambda: answers(port) or proc.poll() is not None, "Streamlit answering", START_SECONDS)
        assert proc.poll() is None, (tmp_path / "dashboard.log").read_text()
        children = descendants(proc.pid)
        assert children, "no Streamlit child"
        proc.send_signal(sig)
        status = proc.wait(timeout=GONE_SECONDS)
        if sig != signal.SIGKILL:
            assert status == 128 + sig, (tmp_path / "dashboard.log").read_text()[-2000:]
        wait_until(lambda: not running(children), f"Streamlit {[c.pid for c in children]} gone", GONE_SECONDS)
        assert not answers(port)
    finally:
        proc.kill()
        kill_all(children)


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["term", "kill"])
def test_demo_leaves_no_process_behind(tmp_path, sig):
    cmd = [sys.executable, "-m", "cli.main", "demo", "--no-dashboard", "--data-dir", str(tmp_path / "demo")]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT)
    children, lines = [], []
    try:
        deadline = time.monotonic() + START_SECONDS
        for line in proc.stdout:  # the demo prints as it goes; stop once its agent runs
            lines.append(line)
            if line.startswith("agent: ") or time.monotonic() > deadline:
                break
        assert lines and lines[-1].startswith("agent: "), "".join(lines)
        wait_until(lambda: len(descendants(proc.pid)) >= 2, "the coordinator and the agent", START_SECONDS)
        time.sleep(3)  # the agent acquires a job and starts its worker, often
        children = descendants(proc.pid)
        proc.send_signal(sig)
        proc.wait(timeout=GONE_SECONDS)
        gone = lambda: not running(children)  # noqa: E731
        wait_until(gone, f"the demo's processes {[(c.pid, c.name()) for c in running(children)]} gone", GONE_SECONDS)
    finally:
        proc.kill()
        proc.stdout.close()
        kill_all(children)


@pytest.mark.slow
@pytest.mark.engine
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["term", "int"])
def test_agent_run_stops_its_worker(tmp_path, tiny_models, sig):
    data, config = tmp_path / "coordinator", tmp_path / "agent"
    coordinator, endpoints = start_coordinator(data)
    address = endpoints["grpc"]
    agent = None
    try:
        admin = AdminApi(channel(address), admin_credential(data))
        token = admin.CreateToken(pb.CreateTokenRequest(ttl_seconds=60, max_uses=1)).token
        resp = AgentApi(channel(address)).enrol(token, "signals", pb.Fingerprint(hostname="s"), {}, ["llama.cpp"])
        AgentIdentity(address, resp.agent_id, "signals", resp.credential, resp.heartbeat_interval_seconds).save(config)
        doc = {
            "name": "signals",
            "models": {"llama.cpp": {"target": str(tiny_models.gguf_target)}},
            "engines": ["llama.cpp"],
            "prompt_sets": ["code"],
            "prompts": 2,
            "methods": {"ngram": [3]},
            "max_new_tokens": 128,
            "warmup": 0,
            "repeats": 50,  # long enough to be signalled mid-job
        }
        admin.SubmitSweep(pb.SubmitSweepRequest(yaml=yaml.safe_dump(doc)))
        agent = spawn("agent", "run", "--config-dir", str(config), "--ignore-doctor", log=tmp_path / "agent.log")
        worker_pid = lambda: [int(p.read_text()) for p in config.glob("jobs/*/worker.pid") if p.read_text()]  # noqa: E731
        wait_until(lambda: worker_pid() or agent.poll() is not None, "a worker to start", START_SECONDS)
        assert agent.poll() is None, (tmp_path / "agent.log").read_text()[-2000:]
        worker = psutil.Process(worker_pid()[0])
        children = [worker, *descendants(worker.pid)]
        agent.send_signal(sig)
        assert agent.wait(timeout=GONE_SECONDS) == 0, (tmp_path / "agent.log").read_text()[-2000:]
        wait_until(lambda: not running(children), "the worker gone", GONE_SECONDS)
    finally:
        if agent is not None:
            stop(agent, signal.SIGKILL)
        stop(coordinator)
