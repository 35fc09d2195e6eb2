"""Energy per run (agent/energy.py) and the compute backend (agent/engines/llamacpp_lib.py).

RAPL is read from a powercap tree laid out as the kernel lays it out (this machine and the lent
H200, a Firecracker VM, have none). NVML's counter is read for real where a GPU has one (the
lent H200: bench/h200.sh runs this file there) and skipped elsewhere. The protocol's energy
fields come from a real tiny-model job with a counter that stands in for hardware this machine
lacks: a constant 50 W, as a clock."""

import json
import os
import sys
import time
import types
from pathlib import Path

import pytest

import agent.engines.llamacpp_lib as lib
from agent import energy
from agent.engines import make_engine
from agent.model_identity import identify
from agent.models import resolve
from agent.protocol import run_job
from specfleet.record import Arm, InvalidRecord, JobSpec, Prompt, RunRecord


def zone(root: Path, name: str, energy_uj, wrap=262143328850) -> None:
    (root / name).mkdir(parents=True)
    (root / name / "energy_uj").write_text(f"{energy_uj}\n")
    (root / name / "max_energy_range_uj").write_text(f"{wrap}\n")


def test_rapl_reads_package_domains_unwrapped_and_skips_what_it_cannot_read(tmp_path):
    zone(tmp_path, "intel-rapl:0", 1_000_000, wrap=10_000_000)
    zone(tmp_path, "intel-rapl:1", 5_000_000)
    zone(tmp_path, "intel-rapl:0:0", 123)  # a sub-zone (core): the package counts it already
    (tmp_path / "intel-rapl:2").mkdir()  # no energy_uj readable
    assert [p.parent.name for p, _ in energy.rapl_domains(tmp_path)] == ["intel-rapl:0", "intel-rapl:1"]
    counter = energy.rapl_counter(tmp_path)
    assert counter.source == "rapl" and counter.read() == 0.0
    (tmp_path / "intel-rapl:0/energy_uj").write_text("9000000\n")
    (tmp_path / "intel-rapl:1/energy_uj").write_text("5500000\n")
    assert counter.read() == pytest.approx(8.5)
    (tmp_path / "intel-rapl:0/energy_uj").write_text("1000000\n")  # wrapped past 10 J
    assert counter.read() == pytest.approx(10.5)
    assert energy.rapl_counter(tmp_path / "none") is None


class Ticking:
    """A counter that moves every `period` seconds of a fake clock at `watts`, like NVML's."""

    def __init__(self, watts=100.0, period=0.1):
        self.now, self.watts, self.period = 0.0, watts, period

    def clock(self):
        return self.now

    def sleep(self, seconds):
        self.now += seconds

    def read(self):
        return self.watts * self.period * int(self.now / self.period)


def test_meter_charges_the_run_the_average_power_between_ticks_times_its_duration():
    fake = Ticking(watts=100.0)
    meter = energy.Meter(energy.Counter("nvml", fake.read), clock=fake.clock, sleep=fake.sleep)

    def run():
        fake.now += 0.034  # a 34 ms run, shorter than one tick
        return "done"

    result, drawn = meter.measure(run)
    assert result == "done" and drawn.source == "nvml"
    assert drawn.joules == pytest.approx(3.4, rel=0.05)
    stuck = energy.Meter(energy.Counter("nvml", lambda: 7.0), clock=fake.clock, sleep=fake.sleep)
    assert stuck.measure(run) == ("done", None)  # a counter that never moves gives no figure
    assert energy.Meter(None).measure(lambda: 3) == (3, None)


def test_nvml_counter_on_a_gpu_reads_idle_power():
    counter = energy.nvml_counter()
    if counter is None:
        pytest.skip("no NVIDIA GPU with an energy counter here (NVML): CI never has one")
    _, drawn = energy.Meter(counter).measure(lambda: time.sleep(0.5))
    assert drawn.source == "nvml" and 5.0 < drawn.joules / 0.5 < 1500.0  # watts: an H200 idles near 80


def test_project_build_is_used_only_where_it_holds_libllama(tmp_path):
    environ = {}
    assert lib.use_project_build(tmp_path, environ) is None and environ == {}
    (tmp_path / "libllama.so").write_bytes(b"")
    assert lib.use_project_build(tmp_path, environ) == tmp_path
    assert environ == {lib.LIB_PATH_VARIABLE: str(tmp_path)}
    assert lib.use_project_build(tmp_path / "other", {lib.LIB_PATH_VARIABLE: "/x"}) is None


def test_the_llama_cpp_engine_names_its_backend():
    # The package's own CPU library on Linux; a CUDA build of this checkout where a GPU sees it.
    cuda = os.environ.get(lib.LIB_PATH_VARIABLE) and Path("/dev/nvidiactl").exists()
    assert make_engine("llama.cpp").backend() == ("cuda" if cuda else "cpu")


def _baseline_job(model: str) -> JobSpec:
    """One baseline run of one prompt on the tiny llama.cpp target, after one warm-up."""
    return JobSpec(
        engine="llama.cpp",
        model={"target": model},
        prompt_set="qa",
        prompt_category="qa",
        prompt_set_digest="0" * 64,
        prompts=(Prompt("p1", "What is speculative decoding?"),),
        arms=(Arm("baseline"),),
        max_new_tokens=16,
        warmup=1,
        repeats=1,
    )


@pytest.mark.engine
def test_a_job_records_backend_and_energy_per_token(tiny_models):
    model = str(tiny_models.gguf_target)
    spec = _baseline_job(model)
    start = time.perf_counter()
    watts50 = energy.Counter("rapl", lambda: 50.0 * (time.perf_counter() - start))
    records: list[RunRecord] = []
    target = identify(resolve(model, []), "")
    run_job(spec, make_engine("llama.cpp"), records.append, "job", 1, target, meter=energy.Meter(watts50))
    elapsed = time.perf_counter() - start
    (r,) = records
    assert r.backend in ("cpu", "cuda") and r.energy_source == "rapl"
    # 50 W over the engine call, which holds the run's own wall time and lies within the job's: on
    # a busy machine the call's overhead around the run grows, so these bounds, not a tolerance.
    assert 50.0 * r.wall_seconds * 0.99 <= r.energy_joules <= 50.0 * elapsed
    assert r.joules_per_token == pytest.approx(r.energy_joules / r.generated_tokens)
    assert RunRecord.from_json(r.to_json()) == r
    records.clear()
    run_job(spec, make_engine("llama.cpp"), records.append, "job", 1, target, meter=energy.Meter(None))
    assert records[0].energy_source == "" and records[0].energy_joules is None and records[0].joules_per_token is None


# ---------------------------------------------------------------- macOS: IOReport through zeus-apple-silicon
# No Mac here: the library's measurement object (zeus_apple_silicon.AppleEnergyMonitor) is replaced
# at its boundary by one whose end_window returns the library's own M1 Max window
# (tests/captured/zeus-apple-silicon-m1-max-window.json, tests/captured/README.md). The macOS CI
# jobs measure a real window (.github/workflows/ci.yml).

M1_MAX_WINDOW = json.loads((Path(__file__).parent / "captured" / "zeus-apple-silicon-m1-max-window.json").read_text())


class CapturedMonitor:
    """zeus_apple_silicon.AppleEnergyMonitor's interface, answering the captured window."""

    windows: list[str] = []

    def __init__(self):
        self.open: set[str] = set()

    def begin_window(self, key, restart=False):
        if key in self.open and not restart:
            raise RuntimeError(f"window {key} already open")  # as the library does
        self.open.add(key)
        self.windows.append(f"begin {key}")

    def end_window(self, key):
        self.open.remove(key)  # KeyError for a window never begun: the library raises too
        self.windows.append(f"end {key}")
        return types.SimpleNamespace(**M1_MAX_WINDOW["end_window"])


@pytest.fixture
def zeus(monkeypatch):
    CapturedMonitor.windows = []
    monkeypatch.setitem(sys.modules, "zeus_apple_silicon", types.SimpleNamespace(AppleEnergyMonitor=CapturedMonitor))
    return CapturedMonitor


def test_ioreport_window_is_the_run_energy_with_its_split(zeus):
    meter = energy.Meter(energy.detect())  # IOReport comes first where the library imports
    assert isinstance(meter.counter, energy.IOReportWindows)
    result, drawn = meter.measure(lambda: zeus.windows.append("run") or "done")
    assert result == "done" and zeus.windows == ["begin specfleet-run", "run", "end specfleet-run"]
    # CPU 1701 mJ, GPU 9, ANE 0, DRAM 358: the record's parts, and their sum the run's energy.
    assert drawn.source == "ioreport" and drawn.joules == pytest.approx(2.068)
    assert drawn.record_fields() == {
        "energy_cpu_joules": 1.701,
        "energy_gpu_joules": 0.009,
        "energy_ane_joules": 0.0,
        "energy_dram_joules": 0.358,
    }
    with pytest.raises(ZeroDivisionError):  # a failed run still closes its window
        meter.measure(lambda: 1 / 0)
    assert zeus.windows[-1] == "end specfleet-run"


def test_ioreport_parts_a_chip_does_not_report_are_left_out():
    older = types.SimpleNamespace(cpu_total_mj=1200, gpu_mj=300, ane_mj=None, dram_mj=None)
    drawn = energy.ioreport_energy(older)
    assert drawn.joules == pytest.approx(1.5)
    assert set(drawn.record_fields()) == {"energy_cpu_joules", "energy_gpu_joules"}
    nothing = types.SimpleNamespace(cpu_total_mj=None, gpu_mj=None, ane_mj=None, dram_mj=None)
    assert energy.ioreport_energy(nothing) is None


def test_no_ioreport_without_the_library_or_its_energy_group(monkeypatch):
    monkeypatch.setitem(sys.modules, "zeus_apple_silicon", None)  # not installed (Linux, Intel Macs)
    assert energy.ioreport_windows() is None

    def no_subscription():
        raise RuntimeError("Failed to create IOReport subscription.")  # the library's own message

    monkeypatch.setitem(sys.modules, "zeus_apple_silicon", types.SimpleNamespace(AppleEnergyMonitor=no_subscription))
    assert energy.ioreport_windows() is None


def test_the_split_belongs_to_ioreport_runs():
    from tests.support.fleet import run_record

    r = run_record("job-1")
    nvml = dict(r.to_dict(), energy_source="nvml", energy_joules=2.0, energy_gpu_joules=1.0)
    with pytest.raises(InvalidRecord, match="energy_source 'ioreport' only"):
        RunRecord.from_dict(nvml)
    mac = RunRecord.from_dict(dict(nvml, energy_source="ioreport"))
    assert RunRecord.from_row(mac.row()) == mac and mac.row()["energy_gpu_joules"] == 1.0


@pytest.mark.engine
def test_a_mac_job_records_ioreport_energy_per_token(tiny_models, zeus):
    """The protocol's path on a Mac: run_job's default meter (energy.detect()) finds IOReport."""
    model = str(tiny_models.gguf_target)
    spec = _baseline_job(model)
    records: list[RunRecord] = []
    run_job(spec, make_engine("llama.cpp"), records.append, "job", 1, identify(resolve(model, []), ""))
    (r,) = records
    assert (r.energy_source, r.energy_joules) == ("ioreport", pytest.approx(2.068))
    assert r.joules_per_token == pytest.approx(2.068 / r.generated_tokens)
    assert (r.energy_cpu_joules, r.energy_gpu_joules, r.energy_ane_joules, r.energy_dram_joules) == (
        1.701,
        0.009,
        0.0,
        0.358,
    )
    assert RunRecord.from_json(r.to_json()) == r
