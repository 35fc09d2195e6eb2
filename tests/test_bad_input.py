"""Bad input from outside, in tables: sweep files sent to a running coordinator, runs uploaded
again under an id already stored, and configuration files the CLI cannot read. Every case is
refused with an error that names what was wrong (for the coordinator: within gRPC's metadata,
with the agents' calls answered meanwhile; for the CLI: on one line) and leaves everything
stored before as it was."""

import threading
import time
from pathlib import Path

import grpc
import pytest

from protos.specfleet.v1 import fleet_pb2 as pb
from specfleet.data_dir import ADMIN_TOKEN_FILE
from specfleet.sweeps import MAX_MESSAGE_CHARS
from specfleet.yaml_limits import MAX_NODES
from tests.support.fleet import SWEEP_YAML, admin_for, enrol, make_run, run_id, start_coordinator
from tests.support.processes import one_line_error, specfleet
from tests.support.sweeps import alias_bomb, yaml_of


@pytest.fixture(scope="module")
def leased_job(tmp_path_factory):
    """A coordinator with one agent holding a job of one stored sweep."""
    coordinator = start_coordinator(tmp_path_factory.mktemp("bad-input"))
    agent = enrol(coordinator)
    admin = admin_for(coordinator)
    admin.SubmitSweep(pb.SubmitSweepRequest(yaml=SWEEP_YAML))
    job = agent.acquire_job(1).job
    yield coordinator, admin, agent, job
    coordinator.stop()


STORED = {  # what a refused request must leave as it was (heartbeats move last_seen and leases on)
    "sweeps": "*",
    "runs": "*",
    "jobs": "job_id, sweep_id, agent_id, spec, state, attempt, lease_id, reason",
    "agents": "agent_id, name, credential_hash, state",
}


def stored(coordinator) -> dict:
    with coordinator.store.tx() as con:
        return {
            table: con.execute(f"SELECT {columns} FROM {table} ORDER BY ALL").fetchall()
            for table, columns in STORED.items()
        }


SWEEPS = [
    (alias_bomb(), f"line 4: more than {MAX_NODES} values with every alias expanded"),
    (
        "a: &a [x, x, x, x]\nb: &b [*a, *a, *a, *a]\nc: &c [*b, *b, *b, *b]\nd: [*c, *c, *c, *c]\nrepeats: *c\n",
        "repeats",
    ),
    ("name: s\nrepeats:\n" + "- " * 20_000 + "1\n", "line 3: nested deeper than 32 levels"),
    ("name: s\nrepeats: " + "[" * 20_000 + "]" * 20_000 + "\n", "not valid YAML"),
    (yaml_of() + "repeats: 2\nrepeats: 3\n", "key 'repeats' is given twice"),
    (yaml_of(repeats=list(range(4000))), "repeats: must be an integer"),
    (yaml_of(prompt_sets=[f"set-{i}" for i in range(2000)]), "prompt_sets: unknown prompt set 'set-0'"),
    ("name: [unclosed", "not valid YAML"),
]


@pytest.mark.parametrize("text, message", SWEEPS, ids=[m.split(":")[0] for _, m in SWEEPS])
def test_a_bad_sweep_is_refused_naming_the_problem_while_agents_are_answered(leased_job, text, message):
    coordinator, admin, agent, job = leased_job
    before = stored(coordinator)
    beats, done = [], threading.Event()

    def beat():
        while not done.is_set():
            start = time.perf_counter()
            agent.heartbeat(job.job_id, job.lease_id, status="busy")
            beats.append(time.perf_counter() - start)

    beater = threading.Thread(target=beat)
    beater.start()
    try:
        with pytest.raises(grpc.RpcError) as e:
            admin.SubmitSweep(pb.SubmitSweepRequest(yaml=text), timeout=10)
    finally:
        done.set()
        beater.join()
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert message in e.value.details() and len(e.value.details()) <= MAX_MESSAGE_CHARS
    assert stored(coordinator) == before
    assert beats and max(beats) < 1.0


def test_a_run_id_reused_with_other_content_is_refused_and_the_same_content_is_a_duplicate(leased_job):
    coordinator, _, agent, job = leased_job
    first = make_run(job.job_id, tps=100.0)
    assert not agent.report_result(job.job_id, job.lease_id, first).duplicate
    assert agent.report_result(job.job_id, job.lease_id, first).duplicate  # a retry: acknowledged
    before = stored(coordinator)
    other = make_run(job.job_id, tps=50.0, run_id=run_id(first))
    with pytest.raises(grpc.RpcError) as e:
        agent.report_result(job.job_id, job.lease_id, other)
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert f"run id {run_id(first)} was already stored with other content" in e.value.details()
    assert stored(coordinator) == before


def files_of(directory: Path) -> dict:
    return {p: p.read_bytes() for p in sorted(directory.rglob("*")) if p.is_file()}


# (what is written under config/specfleet/, the command, what the error must name)
FILE_CASES = [
    ({"agent.json": "{not json"}, ["agent", "run"], ["agent.json", "not valid JSON"]),
    ({"agent.json": '{"name": "x"}'}, ["agent", "run"], ["agent.json", "not an agent credential"]),
    ({"agent.json": b"\xff\xfe"}, ["agent", "run"], ["agent.json"]),
    ({"settings.json": "[1, 2"}, ["agent", "run"], ["settings.json", "not valid JSON"]),
    ({"settings.json": '{"model_dirs": "/m"}'}, ["agent", "run"], ["settings.json", "model_dirs"]),
    ({"status.json": "{"}, ["agent", "status"], ["status.json"]),
]


@pytest.mark.parametrize("files, command, names", FILE_CASES, ids=[" ".join(c[2]) for c in FILE_CASES])
@pytest.mark.process
def test_an_unreadable_configuration_file_is_named_on_one_line(tmp_path, files, command, names):
    config = tmp_path / "config" / "specfleet"
    config.mkdir(parents=True)
    for name, content in files.items():
        path = config / name
        path.write_bytes(content if isinstance(content, bytes) else content.encode())
        path.chmod(0o600)
    before = files_of(config)
    one_line_error(specfleet(*command, home=tmp_path), str(config), *names)
    assert files_of(config) == before


@pytest.mark.process
def test_an_admin_token_that_cannot_be_read_is_named(tmp_path):
    data = tmp_path / "data" / "specfleet"
    (data / ADMIN_TOKEN_FILE).mkdir(parents=True)
    one_line_error(specfleet("sweep", "list", home=tmp_path), str(data / ADMIN_TOKEN_FILE), "Is a directory")
    (data / ADMIN_TOKEN_FILE).rmdir()
    (data / ADMIN_TOKEN_FILE).write_bytes(b"\xff\xfe\x00")
    one_line_error(specfleet("sweep", "list", home=tmp_path), str(data / ADMIN_TOKEN_FILE), "not text")
