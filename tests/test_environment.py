"""Environment readings: parsers on captured macOS output (tests/captured/README.md), the Linux
reader on this machine and on fake /sys trees, and the nominal / refusal rules."""

import os
from pathlib import Path

from agent import environment as env
from agent.environment import UNAVAILABLE

CAPTURED = Path(__file__).parent / "captured"


def captured(name: str) -> str:
    return (CAPTURED / name).read_text()


def test_pmset_parsers_on_captured_output():
    assert env.parse_pmset_batt(captured("macos-m2-pro-pmset-batt-battery.txt")) == "battery"
    assert env.parse_pmset_batt(captured("macos-m1-mbp-pmset-batt-battery.txt")) == "battery"
    assert env.parse_pmset_batt(captured("macos-m2-pro-pmset-batt-ac.txt")) == "ac"
    assert env.parse_pmset_batt(captured("macos-pmset-batt-desktop.txt")) == "no-battery"
    assert env.parse_pmset_batt("") is None
    assert env.parse_pmset_therm(captured("macos-m2-pro-pmset-therm-quiet.txt")) == "nominal"
    assert env.parse_pmset_therm(captured("macos-pmset-therm-limited.txt")) == "throttled: CPU_Speed_Limit=50"
    assert env.parse_pmset_therm(" - CPU_Speed_Limit               = 100\n") == "nominal"
    assert env.parse_pmset_therm("") is None
    assert env.parse_pmset_lowpowermode(captured("macos-m1-mbp-pmset-g.txt")) == "off"
    assert (
        env.parse_pmset_lowpowermode(
            captured("macos-m1-mbp-pmset-g.txt").replace("lowpowermode         0", "lowpowermode         1")
        )
        == "on"
    )
    assert env.parse_pmset_lowpowermode(captured("macos-m2-pro-pmset-batt-ac.txt")) is None


def test_memory_parsers_on_captured_output():
    assert env.parse_vm_stat_available(captured("macos-m2-pro-vm_stat.txt")) == (7061 + 310694 + 14767) * 16384
    assert env.parse_vm_stat_available("garbage") is None
    assert env.parse_swapusage(captured("macos-m2-pro-sysctl-swapusage.txt")) == int(933.06 * 2**20)
    assert env.parse_swapusage("vm.swapusage: total = 0,00M  used = 1,50G  free = 0,00M") == int(1.5 * 2**30)
    assert env.parse_swapusage("") is None


def test_macos_sample_records_unavailable_readings():
    outputs = {
        ("pmset", "-g", "therm"): captured("macos-m2-pro-pmset-therm-quiet.txt"),
        ("pmset", "-g", "batt"): captured("macos-m2-pro-pmset-batt-battery.txt"),
        ("vm_stat",): captured("macos-m2-pro-vm_stat.txt"),
    }
    s = env.sample_macos(run=lambda cmd: outputs.get(tuple(cmd)))
    assert s["thermal"] == "nominal" and s["power_source"] == "battery"
    assert s["low_power_mode"] == UNAVAILABLE and s["swap_used_bytes"] == UNAVAILABLE
    assert set(s) == set(env.KEYS)
    assert env.refusal_reason(s).startswith("on battery power")


def test_linux_sample_of_this_machine_for_real():
    s = env.sample_linux()
    assert set(s) == set(env.KEYS)
    assert float(s["loadavg_1m"]) >= 0 and int(s["memory_available_bytes"]) > 0
    assert int(s["swap_used_bytes"]) >= 0
    # This VM has no power supplies and no thermal zones: said so, not guessed.
    if not any(Path("/sys/class/power_supply").iterdir()):
        assert s["power_source"] == "no-battery"
    if not list(Path("/sys/class/thermal").glob("thermal_zone*")):
        assert s["thermal"] == UNAVAILABLE
    assert env.refusal_reason(s) is None


def fake_sys(root: Path, supplies: dict, zones=(), profile=None) -> Path:
    for name, files in supplies.items():
        d = root / "sys/class/power_supply" / name
        d.mkdir(parents=True)
        for k, v in files.items():
            (d / k).write_text(v + "\n")
    (root / "sys/class/power_supply").mkdir(parents=True, exist_ok=True)
    for i, files in enumerate(zones):
        d = root / "sys/class/thermal" / f"thermal_zone{i}"
        d.mkdir(parents=True)
        for k, v in files.items():
            (d / k).write_text(v + "\n")
    if profile:
        (root / "sys/firmware/acpi").mkdir(parents=True)
        (root / "sys/firmware/acpi/platform_profile").write_text(profile + "\n")
    (root / "proc").mkdir(exist_ok=True)
    (root / "proc/loadavg").write_text("0.50 0.40 0.30 1/100 1234\n")
    (root / "proc/meminfo").write_text(
        "MemTotal:       16384000 kB\nMemAvailable:    8192000 kB\n"
        "SwapTotal:       2097152 kB\nSwapFree:        1048576 kB\n"
    )
    return root


LAPTOP_ON_BATTERY = {
    "AC": {"type": "Mains", "online": "0"},
    "BAT0": {"type": "Battery", "status": "Discharging"},
}


def test_linux_laptop_on_battery_hot_and_in_low_power(tmp_path):
    hot = {"type": "x86_pkg_temp", "temp": "95000", "trip_point_0_type": "passive", "trip_point_0_temp": "90000"}
    root = fake_sys(tmp_path, LAPTOP_ON_BATTERY, zones=[hot], profile="low-power")
    s = env.sample_linux(root)
    assert s["power_source"] == "battery" and s["low_power_mode"] == "on"
    assert s["thermal"].startswith("hot: x86_pkg_temp at 95.0 C")
    assert s["swap_used_bytes"] == str(1048576 * 1024) and s["loadavg_1m"] == "0.50"
    assert env.refusal_reason(s).startswith("on battery power")
    reasons = env.not_nominal(s, cpu_count=2)
    assert any("thermal" in r for r in reasons) and "on battery power" in reasons and "low-power mode on" in reasons


def test_linux_laptop_on_ac(tmp_path):
    supplies = {"AC": {"type": "Mains", "online": "1"}, "BAT0": {"type": "Battery", "status": "Charging"}}
    cool = {"type": "acpitz", "temp": "45000", "trip_point_0_type": "critical", "trip_point_0_temp": "105000"}
    s = env.sample_linux(fake_sys(tmp_path, supplies, zones=[cool], profile="balanced"))
    assert (s["power_source"], s["thermal"], s["low_power_mode"]) == ("ac", "nominal", "off")
    assert env.refusal_reason(s) is None and env.not_nominal(s, cpu_count=2) == []


def test_low_power_mode_alone_refuses():
    s = {k: UNAVAILABLE for k in env.KEYS} | {"power_source": "ac", "low_power_mode": "on"}
    assert env.refusal_reason(s).startswith("low-power mode is on")


def test_judge_marks_runs_not_nominal_with_reasons_and_unavailable_as_unknown():
    quiet = {
        "thermal": "nominal",
        "power_source": "ac",
        "low_power_mode": "off",
        "loadavg_1m": "0.10",
        "memory_available_bytes": str(8 * 2**30),
        "swap_used_bytes": "0",
    }
    assert env.judge(quiet, quiet, cpu_count=2, memory_total_bytes=16 * 2**30) == (True, [])
    typed = env.reading(quiet)
    assert typed.thermal == "nominal" and typed.swap_used_bytes == 0 and typed.low_power_mode is False

    busy = quiet | {
        "loadavg_1m": "3.50",
        "swap_used_bytes": str(512 * 2**20),
        "thermal": "throttled: CPU_Speed_Limit=50",
    }
    nominal, reasons = env.judge(quiet, busy, cpu_count=2, memory_total_bytes=16 * 2**30)
    assert nominal is False
    assert "after: load average 3.50 above 3 (1.5 per core on 2 cores)" in reasons
    assert any(r.startswith("after: thermal throttled") for r in reasons)
    assert "swap grew by 512 MiB during the run" in reasons

    unknown = {k: UNAVAILABLE for k in env.KEYS}
    # Unavailable is recorded as None and makes the run unknown: neither nominal nor degraded.
    assert env.judge(unknown, unknown, cpu_count=os.cpu_count()) == (None, [])
    assert env.reading(unknown).power_source is None and env.reading(unknown).loadavg_1m is None
    no_thermal = quiet | {"thermal": UNAVAILABLE}
    assert env.judge(quiet, no_thermal, cpu_count=2)[0] is None
    # Something wrong still decides, whatever is unavailable.
    assert env.judge(unknown, unknown | {"power_source": "battery"}, cpu_count=2)[0] is False


def test_power_mode_parser_on_captured_and_transcribed_output():
    # The three powermode files are transcribed from Apple's format, not captured on a Mac
    # (tests/captured/README.md); the M1 file is a real capture of a Mac without High Power Mode.
    assert env.parse_pmset_powermode(captured("macos-pmset-g-powermode-automatic.txt")) == "automatic"
    assert env.parse_pmset_powermode(captured("macos-pmset-g-powermode-low.txt")) == "low"
    assert env.parse_pmset_powermode(captured("macos-pmset-g-powermode-high.txt")) == "high"
    assert env.parse_pmset_lowpowermode(captured("macos-pmset-g-powermode-high.txt")) == "off"
    assert env.parse_pmset_lowpowermode(captured("macos-pmset-g-powermode-low.txt")) == "on"
    real = captured("macos-m1-mbp-pmset-g.txt")
    assert env.parse_pmset_powermode(real) == "automatic"
    assert env.parse_pmset_powermode(real.replace("lowpowermode         0", "lowpowermode         1")) == "low"
    assert env.parse_pmset_powermode(" powermode 2\n lowpowermode 1\n") == "low"  # low power wins
    assert env.parse_pmset_powermode(" powermode 7\n") == "powermode 7"  # a mode Apple adds later: named
    assert env.parse_pmset_powermode(captured("macos-m2-pro-pmset-batt-ac.txt")) is None


def test_macos_sample_reads_the_power_mode_from_pmset():
    outputs = {
        ("pmset", "-g"): captured("macos-pmset-g-powermode-high.txt"),
        ("pmset", "-g", "batt"): captured("macos-m2-pro-pmset-batt-ac.txt"),
    }
    s = env.sample_macos(lambda cmd: outputs.get(tuple(cmd)))  # a Mac's commands: not runnable here
    assert s["power_mode"] == "high" and s["low_power_mode"] == "off" and s["power_source"] == "ac"
    assert env.power_mode(s) == "high" and env.power_mode(env.sample_macos(lambda cmd: None)) is None


def test_linux_power_mode_is_the_platform_profile(tmp_path):
    (tmp_path / "sys/firmware/acpi").mkdir(parents=True)
    (tmp_path / "sys/firmware/acpi/platform_profile").write_text("balanced\n")
    assert env.sample_linux(tmp_path)["power_mode"] == "balanced"
    assert env.sample_linux(tmp_path / "none")["power_mode"] == UNAVAILABLE


def test_a_power_mode_change_during_a_run_is_not_nominal():
    quiet = {k: UNAVAILABLE for k in env.KEYS} | {"thermal": "nominal", "power_source": "ac"}
    assert env.judge(quiet | {"power_mode": "high"}, quiet | {"power_mode": "high"}, cpu_count=2) == (True, [])
    nominal, reasons = env.judge(quiet | {"power_mode": "high"}, quiet | {"power_mode": "automatic"}, cpu_count=2)
    assert nominal is False and reasons == ["power mode changed from high to automatic during the run"]


def test_thermal_pressure_on_captured_output_and_its_gating():
    """thermald's level (`notifyutil -g com.apple.system.thermalpressurelevel`): the captured
    nominal reading, the other levels of OSThermalNotification.h in the same line, and a level
    other than nominal flags the run as the CPU's limit does."""
    text = captured("macos-notifyutil-thermalpressurelevel.txt")
    assert env.parse_thermal_pressure(text) == "nominal"
    heavy = text.replace(" 0", " 2")
    assert env.parse_thermal_pressure(heavy) == "heavy"
    assert env.parse_thermal_pressure(text.replace(" 0", " 7")) == "level 7"
    assert env.parse_thermal_pressure("") is None
    assert env.parse_thermal_pressure("com.apple.system.thermalpressurelevel: Failed with code 1\n") is None
    outputs = {
        ("notifyutil", "-g", env.THERMAL_PRESSURE_KEY): heavy,
        ("pmset", "-g", "therm"): captured("macos-m2-pro-pmset-therm-quiet.txt"),
        ("pmset", "-g", "batt"): captured("macos-m2-pro-pmset-batt-ac.txt"),
    }
    hot = env.sample_macos(run=lambda cmd: outputs.get(tuple(cmd)))
    assert (hot["thermal"], hot["thermal_pressure"]) == ("nominal", "heavy")
    cool = hot | {"thermal_pressure": "nominal"}
    assert env.judge(cool, cool, cpu_count=64) == (True, [])
    nominal, reasons = env.judge(cool, hot, cpu_count=64)
    assert nominal is False and reasons == ["after: thermal pressure heavy (the SoC, GPU included, is being throttled)"]
    assert env.reading(hot).thermal_pressure == "heavy" and env.reading(env.sample_linux()).thermal_pressure is None
