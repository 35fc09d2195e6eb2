"""The package as a Mac user installs it (README "Running a fleet"): `uv build` makes a wheel and
an sdist; the wheel goes into a clean virtual environment offline, from uv's cache, with the
agent's and the coordinator's extras only (no dashboard stack); a coordinator and an agent
started from that install, never from this checkout, run a one-cell llama-server sweep to done,
the agent finding llama-server on PATH (where Homebrew puts it on a Mac) and recording its
version; install-service writes its unit from the templates the wheel carries."""

from __future__ import annotations

import json
import os
import shutil
import site
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import yaml

from agent.engines.llama_server import PROJECT_BUILD, read_version, version_label
from specfleet.data_dir import ENDPOINTS_FILE
from tests.support.processes import ROOT, needs_llama_server, wait_until

pytestmark = [pytest.mark.process, needs_llama_server]

UV = shutil.which("uv") or str(Path(site.getuserbase()) / "bin" / "uv")  # scripts/setup.sh installs it there
DASHBOARD_STACK = ("streamlit", "statsmodels", "altair", "vl_convert")


def run(*cmd, **kw) -> subprocess.CompletedProcess:
    result = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=300, **kw)
    assert result.returncode == 0, f"{' '.join(map(str, cmd))} failed ({result.returncode}):\n{result.stderr}"
    return result


def install(tmp_path: Path) -> Path:
    """The wheel with its agent and coordinator extras in a fresh venv, offline: its bin directory."""
    dist = tmp_path / "dist"
    run(UV, "build", "--offline", "--wheel", "--sdist", "--out-dir", dist, cwd=ROOT)
    (wheel,) = dist.glob("specfleet-*-py3-none-any.whl")
    assert list(dist.glob("specfleet-*.tar.gz")), "uv build made no sdist"
    # The locked versions of the two extras (uv.lock) into a fresh venv, from uv's cache as the
    # set-up installs them, then the wheel itself; `uv pip check`: the wheel's own requirements hold.
    venv = tmp_path / "venv"
    run(UV, "venv", "--offline", "--python", sys.executable, venv)
    run(UV, "sync", "--frozen", "--offline", "--no-dev", "--no-install-project", "--extra", "agent",
        "--extra", "coordinator", cwd=ROOT, env={**os.environ, "UV_PROJECT_ENVIRONMENT": str(venv)})  # fmt: skip
    python = venv / "bin" / "python"
    run(UV, "pip", "install", "--offline", "--no-deps", "--python", python, wheel)
    run(UV, "pip", "check", "--python", python)
    return venv / "bin"


def environ(tmp_path: Path, path_dirs: list[Path]) -> dict[str, str]:
    """A user's shell: no SPECFLEET_* settings but one thread, no checkout on sys.path, its own home,
    llama-server on PATH (as `brew install llama.cpp` leaves it)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SPECFLEET_", "VIRTUAL_ENV", "PYTHON"))}
    home = tmp_path / "home"
    home.mkdir(exist_ok=True)
    env.update(HOME=str(home), XDG_CONFIG_HOME=str(home / ".config"), XDG_DATA_HOME=str(home / ".local/share"))
    env.update(SPECFLEET_THREADS="1", PATH=os.pathsep.join([*map(str, path_dirs), env.get("PATH", "")]))
    return env


def test_the_wheel_installs_offline_and_its_agent_completes_a_sweep(tmp_path, tiny_models):
    bin_dir = install(tmp_path)
    brew = tmp_path / "brew-bin"
    brew.mkdir()
    (brew / "llama-server").symlink_to(PROJECT_BUILD)
    env = environ(tmp_path, [brew, bin_dir])
    specfleet = [bin_dir / "specfleet"]

    def cli(*args) -> str:
        return run(*specfleet, *args, cwd=tmp_path, env=env).stdout

    # Installed, not this checkout; the dashboard's stack absent, and the agent's imports without it.
    probe = (
        "import importlib.util, json, agent.daemon, agent.worker, agent.engines.llama_server, coordinator.server;"
        f"print(json.dumps([agent.daemon.__file__, [importlib.util.find_spec(m) is None for m in {DASHBOARD_STACK}]]))"
    )
    where, absent = json.loads(run(bin_dir / "python", "-c", probe, cwd=tmp_path, env=env).stdout)
    assert "site-packages" in where and not where.startswith(str(ROOT)), where
    assert all(absent), dict(zip(DASHBOARD_STACK, absent))

    data, config = tmp_path / "coordinator", tmp_path / "agent"
    coordinator = subprocess.Popen(
        [*specfleet, "coordinator", "serve", "--data-dir", data, "--port", "0", "--metrics-port", "0"],
        cwd=tmp_path, env=env, stdout=open(tmp_path / "coordinator.log", "w"), stderr=subprocess.STDOUT,
    )  # fmt: skip
    agent = None
    try:
        wait_until(lambda: (data / ENDPOINTS_FILE).exists() or coordinator.poll() is not None, "the coordinator")
        address = json.loads((data / ENDPOINTS_FILE).read_text())["grpc"]
        admin = ["--coordinator", address, "--data-dir", data]
        token = cli("token", "create", "--ttl", "60", *admin).strip()
        assert "enrolled wheel-agent" in cli(
            "agent", "enrol", "--coordinator", address, "--token", token, "--name", "wheel-agent",
            "--config-dir", config, "--model-dir", tiny_models.gguf_target.parent,
        )  # fmt: skip
        unit_dir = tmp_path / "units"
        cli("agent", "install-service", "--config-dir", config, "--no-load", "--dest-dir", unit_dir)
        assert str(bin_dir / "python") in (unit_dir / "specfleet-agent.service").read_text()
        agent = subprocess.Popen(
            [*specfleet, "agent", "run", "--config-dir", config, "--ignore-doctor"],
            cwd=tmp_path, env=env, stdout=open(tmp_path / "agent.log", "w"), stderr=subprocess.STDOUT,
        )  # fmt: skip
        sweep = tmp_path / "sweep.yaml"
        sweep.write_text(
            yaml.safe_dump(
                {
                    "name": "wheel",
                    "engines": ["llama-server"],
                    "models": {"llama-server": {"target": str(tiny_models.gguf_target)}},
                    "server": {"flags": "-c 512 --parallel 1"},
                    "prompt_sets": ["qa"],
                    "prompts": 1,
                    "max_new_tokens": 4,
                    "warmup": 0,
                    "repeats": 1,
                }
            )
        )
        sweep_id = cli("sweep", "submit", sweep, *admin).split()[1].rstrip(":")

        def finished() -> str:
            out = cli("sweep", "status", sweep_id, *admin)
            return out if out.split()[2] != "running" else ""

        status = wait_until(finished, "the sweep", timeout=240, every=1.0)
        assert "done" in status and "failed 0" in status, status + (tmp_path / "agent.log").read_text()
        export = tmp_path / "runs.parquet"
        cli("export", "--format", "parquet", "--output", export, *admin)
    finally:
        for proc in (agent, coordinator):
            if proc is not None and proc.poll() is None:
                proc.terminate()
                proc.wait(timeout=30)
    (run_row,) = pq.read_table(export).to_pylist()
    # The llama-server found on PATH, its version recorded as for any build.
    assert run_row["engine"] == "llama-server" and run_row["server_version"]
    assert run_row["server_version"] == version_label(read_version(brew / "llama-server"))
    assert run_row["server_command"].startswith(str(brew / "llama-server")), run_row["server_command"]
