"""`specfleet agent install-service`: the launchd plist and the systemd user unit it writes,
and what it says when it cannot load them."""

import plistlib
import shlex
import shutil
import subprocess
import sys

import pytest

from agent import service
from tests.support.processes import cli


def test_plist_parses_and_runs_the_agent_with_its_config_dir(tmp_path):
    config = tmp_path / "my config"  # a space: the argument must survive as one
    calls = []

    def run(cmd, **kw):
        calls.append(cmd)
        return subprocess.CompletedProcess(cmd, 0, "", "")

    result = service.install(
        config,
        ["--model-dir", "/Volumes/models & more"],
        platform="darwin",
        dest_dir=tmp_path / "LaunchAgents",
        log_dir=tmp_path / "Logs",
        run=run,
        which=lambda tool: "/bin/launchctl",
    )
    assert result.loaded and result.path == tmp_path / "LaunchAgents" / "com.specfleet.agent.plist"
    plist = plistlib.loads(result.path.read_bytes())
    assert plist["Label"] == "com.specfleet.agent"
    assert plist["ProgramArguments"] == [
        sys.executable, "-m", "cli.main", "agent", "run", "--config-dir", str(config),
        "--model-dir", "/Volumes/models & more",
    ]  # fmt: skip
    assert plist["KeepAlive"] == {"SuccessfulExit": False} and plist["RunAtLoad"] is True
    assert plist["StandardOutPath"] == plist["StandardErrorPath"] == str(tmp_path / "Logs" / "agent.log")
    assert plist["WorkingDirectory"] == str(service.ROOT)
    assert calls[-1][:2] == ["launchctl", "bootstrap"] and calls[-1][2].startswith("gui/")
    assert calls[-1][3] == str(result.path)


def test_systemd_unit_execstart_points_at_the_agent_with_its_config_dir(tmp_path):
    config = tmp_path / "cfg 100%"
    calls = []

    def run(cmd, **kw):
        calls.append(cmd)
        return subprocess.CompletedProcess(cmd, 0, "", "")

    result = service.install(
        config, ["--metrics-port", "9470"], platform="linux", dest_dir=tmp_path, run=run, which=lambda t: "/bin/x"
    )
    assert result.loaded and result.path == tmp_path / "specfleet-agent.service"
    text = result.path.read_text()
    lines = dict(line.split("=", 1) for line in text.splitlines() if "=" in line and not line.startswith("#"))
    words = shlex.split(lines["ExecStart"].replace("%%", "%"))
    assert words == [
        sys.executable, "-m", "cli.main", "agent", "run", "--config-dir", str(config), "--metrics-port", "9470",
    ]  # fmt: skip
    assert lines["Restart"] == "on-failure" and lines["WantedBy"] == "default.target"
    assert "${" not in text
    assert calls == [
        ["systemctl", "--user", "daemon-reload"],
        ["systemctl", "--user", "enable", "--now", "specfleet-agent.service"],
    ]


def test_no_loader_or_a_failing_one_is_reported_and_the_file_still_written(tmp_path):
    result = service.install(tmp_path, [], platform="linux", dest_dir=tmp_path / "a", which=lambda t: None)
    assert not result.loaded and result.path.exists()
    assert "could not load it: systemctl is not on this machine" in result.message
    assert "systemctl --user daemon-reload && systemctl --user enable --now" in result.message

    def no_bus(cmd, **kw):
        return subprocess.CompletedProcess(cmd, 1, "", "Failed to connect to bus: No medium found\n")

    result = service.install(tmp_path, [], platform="linux", dest_dir=tmp_path / "b", run=no_bus, which=lambda t: "x")
    assert not result.loaded and "Failed to connect to bus" in result.message and result.path.exists()

    result = service.install(tmp_path, [], platform="darwin", dest_dir=tmp_path / "c", log_dir=tmp_path / "l",
                             which=lambda t: None)  # fmt: skip
    assert not result.loaded and "launchctl is not on this machine" in result.message


@pytest.mark.process
def test_cli_install_service_on_this_machine(tmp_path):
    """Here (a container) systemd has no user session: the unit is written and the CLI says it
    could not be loaded, exiting non-zero, instead of pretending."""
    models = tmp_path / "models"
    models.mkdir()
    # Never enable a real agent on a developer's machine: load only where it cannot work.
    session = (
        shutil.which("systemctl")
        and subprocess.run(["systemctl", "--user", "show-environment"], capture_output=True, timeout=10).returncode == 0
    )
    out = cli(
        "agent", "install-service", "--config-dir", str(tmp_path / "cfg"), "--model-dir", str(models),
        "--dest-dir", str(tmp_path / "units"), *(["--no-load"] if session else []), check=False,
    )  # fmt: skip
    unit = tmp_path / "units" / "specfleet-agent.service"
    assert unit.exists() and f"--model-dir {models}" in unit.read_text()
    if not session:
        assert out.returncode == 1, out.stdout + out.stderr
        assert "could not load it" in out.stderr and "To load it" in out.stderr
    out = cli("agent", "install-service", "--config-dir", str(tmp_path), "--no-load", "--dest-dir", str(tmp_path))
    assert "not loaded (--no-load)" in out.stdout
    bad = cli("agent", "install-service", "--model-dir", str(tmp_path / "nope"), "--dest-dir", str(tmp_path),
              check=False)  # fmt: skip
    assert bad.returncode != 0 and "nope does not exist" in bad.stderr
