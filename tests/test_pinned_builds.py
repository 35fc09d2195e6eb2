"""A sweep that pins llama-server arms to builds, on an agent with two llama-server binaries side by
side: each build's cell runs on that build's binary, its runs record which build ran, and the
Versions comparison compares the two builds paired on the one machine.

The two binaries: the project's own build (scripts/build-llama-cpp.sh, "0.5.0-dev (build 1, commit
0c1e570)") and a copy of it in a second directory behind a wrapper script that reports build 9500
for `--version` and otherwise execs the copy. A real second llama.cpp build is not available here
(building one takes about 7 minutes on 2 cores, and no other release can be downloaded in the
test), so the second "build" is the same code under another build number: what is tested is that
the pin chooses the binary and the records say which ran, not a difference between builds."""

import json
import shutil
from pathlib import Path

import duckdb
import pytest

from agent import settings
from agent.config import AgentConfig
from agent.daemon import Agent
from agent.engines import make_engine
from agent.engines.base import EngineError
from agent.engines.llama_server import PROJECT_BUILD, build_versions, find_builds
from coordinator import figures, version_figures
from tests.support.agents import Running, submit
from tests.support.fleet import ANY_LOAD, enrol
from tests.support.processes import needs_llama_server, wait_until

pytestmark = [needs_llama_server, pytest.mark.process]

OTHER_VERSION = "version: 9500 (9f0c1e5)\nbuilt with a wrapper for tests/test_pinned_builds.py\n"


def second_build(root: Path) -> Path:
    """A copy of the project's llama-server (and whatever shares its directory) in root/b9500/copy,
    behind a wrapper root/b9500/llama-server that reports build 9500."""
    copy = root / "b9500"
    shutil.copytree(PROJECT_BUILD.parent, copy / "copy")
    wrapper = copy / "llama-server"
    wrapper.write_text(
        "#!/bin/sh\n"
        f'if [ "$1" = "--version" ]; then printf \'{OTHER_VERSION.replace(chr(10), chr(92) + "n")}\'; exit 0; fi\n'
        f'exec "{copy / "copy" / "llama-server"}" "$@"\n'
    )
    wrapper.chmod(0o755)
    return wrapper


def any_load(coordinator) -> duckdb.DuckDBPyConnection:
    """The coordinator's runs and jobs in a database of their own, every run's environment judged
    unknown (tests/support/fleet.py ANY_LOAD: which runs enter the comparison must not depend on
    how busy the test machine is), and the figure tables built from them (figures.ensure)."""
    copy = duckdb.connect()
    with coordinator.store.tx() as con:
        runs = con.execute(f"SELECT * FROM {ANY_LOAD}").df()
        jobs = con.execute("SELECT * FROM jobs").df()
    for name, table in (("runs", runs), ("jobs", jobs)):
        copy.register("rows", table)
        copy.execute(f"CREATE TABLE {name} AS SELECT * FROM rows")
        copy.unregister("rows")
    figures.ensure(copy)
    return copy


def test_an_agent_finds_its_builds_and_the_engine_refuses_a_binary_that_is_not_the_pinned_build(tmp_path):
    wrapper = second_build(tmp_path)
    builds = find_builds(PROJECT_BUILD, [wrapper])
    assert {tag: (b.label, b.binary) for tag, b in builds.items()} == {
        "b1": ("0.5.0-dev b1-0c1e570", PROJECT_BUILD.resolve()),
        "b9500": ("b9500-9f0c1e5", wrapper.resolve()),
    }
    assert build_versions(builds) == {"llama-server@b1": "0.5.0-dev b1-0c1e570", "llama-server@b9500": "b9500-9f0c1e5"}
    broken = tmp_path / "broken" / "llama-server"
    broken.parent.mkdir()
    broken.write_text("#!/bin/sh\necho no version here\n")
    broken.chmod(0o755)
    with pytest.raises(ValueError, match=r"llama-server build .*broken/llama-server: .*printed no version line"):
        find_builds(PROJECT_BUILD, [broken])
    assert set(find_builds(broken, [wrapper])) == {"b9500"}  # a default that fails is left out (doctor says why)
    engine = make_engine("llama-server", binary=str(wrapper), build="b1", log_dir=str(tmp_path))
    with pytest.raises(EngineError, match=r"the job pins llama-server build b1, but .*llama-server is b9500-9f0c1e5"):
        engine.load(str(PROJECT_BUILD))  # refused before any server starts
    assert not engine._servers


def test_a_sweep_pinning_each_arm_to_a_build_runs_each_on_its_binary_and_the_versions_compare_them(
    tmp_path, coordinator, tiny_models, monkeypatch
):
    from agent.credentials import AgentIdentity

    monkeypatch.delenv("SPECFLEET_LLAMA_SERVER_BUILDS", raising=False)
    wrapper = second_build(tmp_path / "builds")
    models, config = tmp_path / "models", tmp_path / "agent"
    models.mkdir()
    shutil.copy(tiny_models.gguf_target, models / "target.gguf")
    api = enrol(coordinator, name="box-1", engines=("llama-server", "openai"))
    AgentIdentity(
        coordinator=f"127.0.0.1:{coordinator.port}",
        agent_id=api.agent_id,
        name="box-1",
        credential=api._metadata[0][1].removeprefix("Bearer "),
        heartbeat_interval_seconds=0.5,
    ).save(config)
    settings.save(config, llama_server_builds=[str(tmp_path / "builds")])  # a directory of builds

    def reported() -> dict:
        with coordinator.store.tx() as con:
            (fp,) = con.execute("SELECT fingerprint FROM agents WHERE agent_id = ?", [api.agent_id]).fetchone()
        return json.loads(fp).get("engineVersions", {})

    with Running(Agent(AgentConfig.load(config, {"model_dirs": [models], "llama_server": PROJECT_BUILD}))) as agent:
        assert set(agent.llama_builds) == {"b1", "b9500"}
        wait_until(lambda: "llama-server@b9500" in reported(), "the agent's fingerprint with its builds")
        arm = {"spec_type": "ngram-simple", "depths": [4]}
        sweep_id = submit(
            coordinator,
            {
                "name": "two-builds",
                "engines": ["llama-server"],
                "models": {"llama-server": {"target": str(models / "target.gguf")}},
                "server": {"flags": "-c 1024 --parallel 1"},
                "threads": 1,
                "prompt_sets": ["code"],
                "prompts": 2,
                "max_new_tokens": 8,
                "warmup": 0,
                "repeats": 2,
                "arms": [{**arm, "server_build": "b1"}, {**arm, "server_build": "b9500"}],
            },
        )

        def finished() -> bool:
            with coordinator.store.tx() as con:
                states = con.execute("SELECT state, reason FROM jobs WHERE sweep_id = ?", [sweep_id]).fetchall()
            failed = [reason for state, reason in states if state in ("failed", "refused")]
            assert not failed, failed
            return len(states) == 2 and all(state == "done" for state, _ in states)

        wait_until(finished, "both builds' jobs", timeout=300)

    with coordinator.store.tx() as con:
        runs = con.execute(
            "SELECT j.spec, r.server_version, r.server_command, r.method FROM runs r JOIN jobs j USING (job_id)"
        ).fetchall()
    assert len(runs) == 2 * 2 * 2 * 2  # builds x prompts x arms x repeats
    ran = {(json.loads(spec)["server"]["build"], version, command.split()[0]) for spec, version, command, _ in runs}
    assert ran == {
        ("b1", "0.5.0-dev b1-0c1e570", str(PROJECT_BUILD.resolve())),
        ("b9500", "b9500-9f0c1e5", str(wrapper.resolve())),
    }

    changes = version_figures.changes(any_load(coordinator))
    decode = changes[(changes.figure == "decode tok/s") & (changes.method == "ngram-simple")]
    assert len(decode) == 1, changes
    (row,) = decode.itertuples()
    assert {"b1-0c1e570" in row.old, "b9500-9f0c1e5" in row.new} in ({True}, {False})  # either may run first
    assert "b9500-9f0c1e5" in row.old + row.new and "b1-0c1e570" in row.old + row.new
    assert row.machines == 1 and row.prompts == 2 and row.ratio > 0  # paired on the one machine


def test_an_agent_refuses_a_job_pinning_a_build_it_lacks_and_hands_a_pinned_job_its_builds_binary(tmp_path):
    """Between submission and the job the agent's builds may change (a binary removed, the
    settings edited): preflight refuses the job, naming the builds it has; the runner gives the
    worker the pinned build's binary, else the agent's own."""
    from types import SimpleNamespace

    from agent import preflight, runner
    from agent.models import ModelRefused
    from specfleet.record import Arm, JobSpec, ServerSpec

    wrapper = second_build(tmp_path)
    agent = SimpleNamespace(
        engines=["llama-server", "openai"],
        llama_builds=find_builds(PROJECT_BUILD, [wrapper]),
        config=SimpleNamespace(llama_server=None),
    )

    def spec(build: str) -> JobSpec:
        return JobSpec(
            engine="llama-server",
            model={"target": "t.gguf"},
            prompt_set="code",
            prompt_category="code",
            prompt_set_digest="cd" * 32,
            prompts=(),
            arms=(Arm("baseline"),),
            server=ServerSpec(build=build),
        )

    with pytest.raises(
        ModelRefused, match=r"pins llama-server build b9330, which this agent does not have \(it has: b1"
    ):
        preflight.check(agent, spec("b9330"))
    assert runner.llama_server_for(agent, spec("b9500")) == str(wrapper.resolve())
    assert runner.llama_server_for(agent, spec("b1")) == str(PROJECT_BUILD.resolve())
    assert runner.llama_server_for(agent, spec("")) is None  # the engine's own search
