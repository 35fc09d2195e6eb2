"""`specfleet agent doctor`: its checks on this Linux machine's real readings, on captured (and
transcribed) macOS output through the real parsers, and against a real coordinator process:
valid, revoked, stopped; the exit status follows the verdicts."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from agent import doctor, environment
from agent.doctor import FAIL, NOT_AVAILABLE, NOT_HERE, OK, WARN
from agent.fingerprint import engine_versions
from tests.support.processes import ROOT, cli, start_coordinator, stop

CAPTURED = Path(__file__).parent / "captured"


def mac(**files: str):
    """A Mac's commands answering with captured output (no Mac here): pmset -g, -g batt, -g therm."""
    outputs = {
        ("pmset", "-g"): files.get("settings"),
        ("pmset", "-g", "batt"): files.get("batt"),
        ("pmset", "-g", "therm"): files.get("therm"),
        ("sysctl", "vm.swapusage"): files.get("swap"),
        ("notifyutil", "-g", environment.THERMAL_PRESSURE_KEY): files.get("pressure"),
    }
    texts = {k: (CAPTURED / v).read_text() if v else None for k, v in outputs.items()}
    return lambda cmd: texts.get(tuple(cmd))


def by_name(checks) -> dict[str, doctor.Check]:
    return {c.name: c for c in checks}


@pytest.mark.process
def test_a_busy_process_fails_the_cpu_check():
    """A busy loop is found with the share of the CPU it really had (its own CPU time over the
    window), and fails the check. What share it gets depends on the load: beside two other busy
    loops on 2 cores it may be well under CPU_SHARE_LIMIT, so the search here takes a limit any
    running loop passes."""
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    watched = psutil.Process(busy.pid)
    try:
        time.sleep(0.3)
        before, start = sum(watched.cpu_times()[:2]), time.monotonic()
        found = doctor.busy_processes({os.getpid()}, seconds=1.5, limit=0.01)
        used, elapsed = sum(watched.cpu_times()[:2]) - before, time.monotonic() - start
    finally:
        busy.kill()
        busy.wait()
    (mine,) = [b for b in found if b.pid == busy.pid]
    assert mine.share == pytest.approx(used / elapsed / psutil.cpu_count(), abs=0.05), (mine, used, elapsed)
    assert all(b.share > 0.01 for b in found)
    check = doctor.check_cpu([mine])
    assert check.verdict == FAIL and f"(pid {busy.pid})" in check.detail and check.fix
    assert doctor.check_cpu([]).verdict == OK


def test_macos_checks_on_captured_output():
    plugged = environment.sample_macos(
        mac(
            settings="macos-pmset-g-powermode-high.txt",
            batt="macos-m2-pro-pmset-batt-ac.txt",
            therm="macos-m2-pro-pmset-therm-quiet.txt",
            swap="macos-m2-pro-sysctl-swapusage.txt",
            pressure="macos-notifyutil-thermalpressurelevel.txt",
        )
    )
    assert doctor.check_thermal_pressure(plugged, "darwin") == doctor.Check("thermal pressure", OK, "nominal")
    assert doctor.check_power_source(plugged).verdict == OK
    assert doctor.check_low_power(plugged, "darwin") == doctor.Check("low-power mode", OK, "off")
    assert doctor.check_power_mode(plugged, "darwin", True).verdict == OK
    assert doctor.check_thermal(plugged).verdict == OK
    swap = doctor.check_swap(plugged)
    assert swap.verdict == WARN and swap.detail == "933 MiB of swap in use" and swap.fix

    unplugged = environment.sample_macos(
        mac(
            settings="macos-pmset-g-powermode-low.txt",
            batt="macos-m2-pro-pmset-batt-battery.txt",
            therm="macos-pmset-therm-limited.txt",
        )
    )
    for check in (
        doctor.check_power_source(unplugged),
        doctor.check_low_power(unplugged, "darwin"),
        doctor.check_power_mode(unplugged, "darwin", True),
        doctor.check_thermal(unplugged),
    ):
        assert check.verdict == FAIL and check.fix, check
    assert doctor.check_thermal(unplugged).detail == "throttled: CPU_Speed_Limit=50"

    # Automatic: a warning where the Mac has High Power Mode, fine where it has not (a real M1 capture).
    automatic = environment.sample_macos(mac(settings="macos-pmset-g-powermode-automatic.txt"))
    assert doctor.check_power_mode(automatic, "darwin", True).verdict == WARN
    assert "pmset -a powermode 2" in doctor.check_power_mode(automatic, "darwin", True).fix
    m1 = environment.sample_macos(mac(settings="macos-m1-mbp-pmset-g.txt"))
    assert doctor.check_power_mode(m1, "darwin", False).verdict == OK
    assert doctor.has_high_power_mode(mac(settings="macos-pmset-g-powermode-automatic.txt"))
    assert not doctor.has_high_power_mode(mac(settings="macos-m1-mbp-pmset-g.txt"))
    # A Mac whose commands print nothing: unavailable, never a made-up value.
    silent = environment.sample_macos(lambda cmd: None)
    assert {doctor.check_power_source(silent).verdict, doctor.check_thermal(silent).verdict} == {NOT_AVAILABLE}
    assert doctor.check_thermal_pressure(silent, "darwin").verdict == NOT_AVAILABLE
    # thermald throttling the SoC while pmset's CPU limit still reads nominal: a failed check.
    heavy = doctor.check_thermal_pressure(plugged | {"thermal_pressure": "heavy"}, "darwin")
    assert heavy.verdict == FAIL and heavy.detail.startswith("heavy") and heavy.fix
    linux = doctor.check_thermal_pressure(environment.sample_linux(), "linux")
    assert linux == doctor.Check("thermal pressure", NOT_AVAILABLE, NOT_HERE)


def test_metal_is_checked_on_macos_only():
    assert doctor.check_metal("linux") == doctor.Check("Metal device", NOT_AVAILABLE, NOT_HERE)
    # MLX's Metal probe cannot run here (no Mac): what the check makes of its answers.
    assert doctor.check_metal("darwin", lambda: "Apple M4 Max").verdict == OK
    assert doctor.check_metal("darwin", lambda: None).verdict == FAIL


def test_engines_import_with_their_versions():
    checks = by_name(doctor.check_engines(engine_versions()))
    versions = engine_versions()
    assert checks["engine mlx"].verdict == OK and f"mlx {versions['mlx']}" in checks["engine mlx"].detail
    llama = checks["engine llama.cpp"]
    assert llama.verdict == OK and versions["llama-cpp-python"] in llama.detail

    def broken(module):
        if module == "llama_cpp":
            raise OSError("libggml.so: cannot open shared object file")

    failed = by_name(doctor.check_engines(versions, broken))["engine llama.cpp"]
    assert failed.verdict == FAIL and "libggml.so" in failed.detail


def test_model_directories_and_disk(tmp_path):
    models = tmp_path / "models"
    models.mkdir()
    assert doctor.check_model_dirs([models], None).verdict == OK
    assert doctor.check_model_dirs([], None).verdict == WARN
    missing = doctor.check_model_dirs([], f"model directory {tmp_path / 'gone'} does not exist or is not a directory")
    assert missing.verdict == FAIL and "gone" in missing.detail
    disk = doctor.check_disk([tmp_path / "not-made-yet", models])
    free = psutil.disk_usage(str(tmp_path)).free
    expected = FAIL if free < doctor.DISK_FAIL_BYTES else WARN if free < doctor.DISK_WARN_BYTES else OK
    assert disk.verdict == expected and "GiB free at" in disk.detail


@pytest.mark.process  # run_checks asks llama-server for its version
def test_linux_readings_say_what_is_not_available_here(tmp_path):
    checks = by_name(doctor.run_checks(tmp_path, [], None, platform="linux"))
    assert checks["Metal device"].detail == NOT_HERE
    sample = environment.sample_linux()
    if sample["power_mode"] == environment.UNAVAILABLE:  # no ACPI platform profile on this machine
        assert checks["power mode"] == doctor.Check("power mode", NOT_AVAILABLE, NOT_HERE)
    assert checks["swap"].verdict in (OK, WARN) and checks["engine mlx"].verdict == OK
    assert checks["coordinator"].verdict == FAIL and "run `specfleet agent enrol` first" in checks["coordinator"].detail
    assert "clock offset" not in checks  # needs the coordinator's answer


def doctor_cli(config_dir: Path) -> tuple[int, dict[str, str]]:
    result = subprocess.run(
        [sys.executable, "-m", "cli.main", "agent", "doctor", "--config-dir", str(config_dir)],
        capture_output=True, text=True, timeout=120, cwd=ROOT,
    )  # fmt: skip
    verdicts = {}
    for line in result.stdout.splitlines():
        verdict, _, rest = line.partition(" ")
        if verdict in (OK, WARN, FAIL, NOT_AVAILABLE):
            verdicts[rest.strip().split("  ")[0]] = line
    assert result.returncode == (1 if any(v.startswith(FAIL) for v in verdicts.values()) else 0), result.stdout
    return result.returncode, verdicts


@pytest.mark.slow
@pytest.mark.process
def test_coordinator_checks_valid_revoked_and_stopped(tmp_path):
    data, agent_dir = tmp_path / "coordinator", tmp_path / "agent"
    coordinator, endpoints = start_coordinator(data)
    admin = ["--coordinator", endpoints["grpc"], "--data-dir", str(data)]
    try:
        token = cli("token", "create", "--ttl", "60", *admin).stdout.strip()
        cli("agent", "enrol", "--coordinator", endpoints["grpc"], "--token", token, "--name", "doc",
            "--config-dir", str(agent_dir))  # fmt: skip
        agent_id = json.loads((agent_dir / "agent.json").read_text())["agent_id"]

        _, verdicts = doctor_cli(agent_dir)
        assert verdicts["coordinator"].startswith(OK) and f"as doc ({agent_id})" in verdicts["coordinator"]
        assert verdicts["clock offset"].startswith(OK)  # one machine, one clock
        # The agent's clock a minute behind the coordinator's: the offset is named and fails.
        late = doctor.check_coordinator(agent_dir, clock=lambda: time.time() - 60)
        assert late[1].verdict == FAIL and late[1].detail.startswith("+60.0"), late

        cli("agents", "revoke", agent_id, *admin)
        code, verdicts = doctor_cli(agent_dir)
        assert code == 1 and verdicts["coordinator"].startswith(FAIL), verdicts
        assert "refused the credential of doc" in verdicts["coordinator"] and "clock offset" not in verdicts
    finally:
        stop(coordinator)
    code, verdicts = doctor_cli(agent_dir)
    assert code == 1 and "unreachable: UNAVAILABLE" in verdicts["coordinator"], verdicts
