"""Fingerprint parsers on real captured output from several Macs (tests/captured/README.md
says where each came from), and the fingerprint of this Linux machine taken for real."""

import os
import re
from pathlib import Path

import pytest

from agent import fingerprint as fpmod
from agent.fingerprint import (
    BANDWIDTH_GBPS,
    fingerprint,
    gpu_model,
    parse_cpuinfo_model,
    parse_ioreg_gpu_cores,
    parse_meminfo_bytes,
    parse_nvidia_smi,
    parse_nvidia_smi_cuda,
    parse_sysctl,
)

CAPTURED = Path(__file__).parent / "captured"


def captured(name: str) -> str:
    return (CAPTURED / name).read_text()


def test_m1_macbook_air_sysctl_hw():
    values = parse_sysctl(captured("macos-m1-macbookair-sysctl-hw.txt"))
    assert values["hw.memsize"] == "17179869184"  # 16 GiB
    assert (values["hw.perflevel0.physicalcpu"], values["hw.perflevel1.physicalcpu"]) == ("4", "4")
    assert values["hw.targettype"] == "J313"
    assert values["hw.osenvironment"] == ""  # a key with an empty value is still a key
    assert parse_sysctl(captured("macos-m1-sysctl-machdep-cpu.txt"))["machdep.cpu.brand_string"] == "Apple M1"


def test_m3_max_and_m4_pro_sysctl():
    m3 = parse_sysctl(captured("macos-m3-max-sysctl.txt"))
    assert m3["machdep.cpu.brand_string"] == "Apple M3 Max" and int(m3["hw.memsize"]) == 36 * 2**30
    topology = parse_sysctl(captured("macos-m3-max-16core-sysctl-perflevels.txt"))
    assert (topology["hw.perflevel0.physicalcpu"], topology["hw.perflevel1.physicalcpu"]) == ("12", "4")
    m4 = parse_sysctl(captured("macos-m4-pro-sysctl.txt"))
    assert m4["machdep.cpu.brand_string"] == "Apple M4 Pro" and int(m4["hw.memsize"]) == 48 * 2**30


def test_m5_max_perflevels_name_super_and_performance_cores():
    values = parse_sysctl(captured("macos-m5-max-sysctl-perflevels.txt"))
    # On M5 Max perflevel0 is "Super" and perflevel1 "Performance": no efficiency cores at all.
    assert (values["hw.perflevel0.name"], values["hw.perflevel0.physicalcpu"]) == ("Super", "6")
    assert (values["hw.perflevel1.name"], values["hw.perflevel1.physicalcpu"]) == ("Performance", "12")


def test_ioreg_gpu_core_count():
    assert parse_ioreg_gpu_cores(captured("macos-m4-ioreg-agx.txt")) == 10
    assert parse_ioreg_gpu_cores(captured("macos-m5-max-ioreg-agx.txt")) == 40
    assert parse_ioreg_gpu_cores(captured("macos-m1-macbookair-sysctl-hw.txt")) is None


def test_bandwidth_keys_are_chip_names_as_sysctl_prints_them():
    for chip, cores in BANDWIDTH_GBPS:
        assert re.fullmatch(r"Apple M[1-9]( Pro| Max| Ultra)?", chip), chip
        assert 4 <= cores <= 80
    # GPU core counts of the captured machines (system_profiler's "Total Number of Cores").
    m3 = parse_sysctl(captured("macos-m3-max-sysctl.txt"))
    assert BANDWIDTH_GBPS[(m3["machdep.cpu.brand_string"], int(m3["Total Number of Cores"]))] == 300
    m4 = parse_sysctl(captured("macos-m4-pro-sysctl.txt"))
    assert BANDWIDTH_GBPS[(m4["machdep.cpu.brand_string"], int(m4["Total Number of Cores"]))] == 273
    assert BANDWIDTH_GBPS[("Apple M4", parse_ioreg_gpu_cores(captured("macos-m4-ioreg-agx.txt")))] == 120


def fake_mac(outputs: dict[str, str]):
    def run(cmd):
        return outputs.get(cmd[0])

    return run


def test_macos_fingerprint_from_captured_output_marks_what_is_missing():
    m4 = captured("macos-m4-pro-sysctl.txt")
    fp = fingerprint(platform="darwin", run=fake_mac({"sysctl": m4, "sw_vers": "15.3.1\n"}))
    assert (fp.os, fp.os_version, fp.chip, fp.memory_bytes) == ("macos", "15.3.1", "Apple M4 Pro", 48 * 2**30)
    # No ioreg output, no hw.model, no perflevels in this capture: listed, not invented.
    assert {"gpu_cores", "model_identifier", "performance_cores", "memory_bandwidth"} <= set(fp.unavailable)
    assert fp.memory_bandwidth_bytes_per_second == 0

    m4_ioreg = captured("macos-m4-ioreg-agx.txt")
    sysctl = "machdep.cpu.brand_string: Apple M4\nhw.memsize: 17179869184\n"
    fp = fingerprint(platform="darwin", run=fake_mac({"sysctl": sysctl, "ioreg": m4_ioreg}))
    assert fp.gpu_cores == 10 and fp.memory_bandwidth_bytes_per_second == 120e9
    assert "os_version" in fp.unavailable

    fp = fingerprint(platform="darwin", run=fake_mac({}))  # every command missing
    assert fp.chip == "" and {"chip", "memory", "gpu_cores", "os_version"} <= set(fp.unavailable)

    m5 = captured("macos-m5-max-sysctl-perflevels.txt") + "machdep.cpu.brand_string: Apple M5 Max\n"
    fp = fingerprint(platform="darwin", run=fake_mac({"sysctl": m5, "ioreg": captured("macos-m5-max-ioreg-agx.txt")}))
    assert (fp.performance_cores, fp.efficiency_cores, fp.gpu_cores) == (6, 12, 40)
    # No published bandwidth for the M5 Max in the table yet: unavailable, not guessed.
    assert "memory_bandwidth" in fp.unavailable and fp.memory_bandwidth_bytes_per_second == 0


@pytest.mark.process  # nvidia-smi runs where it is installed (the lent H200)
def test_linux_fingerprint_of_this_machine_for_real():
    fp = fingerprint()
    cpuinfo, meminfo = Path("/proc/cpuinfo").read_text(), Path("/proc/meminfo").read_text()
    cpu = parse_cpuinfo_model(cpuinfo)
    assert fp.os == "linux" and cpu
    if fp.gpus and fpmod.cuda_build():  # a GPU machine with a CUDA llama.cpp (the lent H200) is named by its GPU
        assert (fp.chip, fp.model_identifier) == (gpu_model(fp.gpus[0]), cpu)
    else:
        assert fp.chip == cpu
        assert "model_identifier" in fp.unavailable
    assert fp.memory_bytes == parse_meminfo_bytes(meminfo) > 0
    assert fp.cpu_cores == os.cpu_count()
    assert "llama-cpp-python" in fp.engine_versions and "mlx" in fp.engine_versions
    assert re.fullmatch(r"[0-9a-f]{7,40}(-dirty)?", fp.engine_versions["llama.cpp.commit"])
    assert {"gpu_cores", "memory_bandwidth"} <= set(fp.unavailable)


@pytest.mark.process  # platform.processor() runs uname -p
def test_linux_without_nvidia_smi_has_no_gpus_and_does_not_crash(tmp_path):
    (tmp_path / "proc").mkdir()
    (tmp_path / "proc/cpuinfo").write_text("processor\t: 0\nmodel name\t: Test CPU 9000\n")
    (tmp_path / "proc/meminfo").write_text("MemTotal:       16384000 kB\n")
    fp = fingerprint(platform="linux", run=lambda cmd: None, root=tmp_path)
    assert list(fp.gpus) == [] and fp.chip == "Test CPU 9000" and fp.memory_bytes == 16384000 * 1024
    assert fpmod.run_command(["definitely-not-a-command-specfleet"]) is None
    query, plain = captured("linux-h200-nvidia-smi-query-gpu.txt"), captured("linux-h200-nvidia-smi.txt")

    def smi(cmd):  # a real GPU host's output, for the query and for plain nvidia-smi
        return None if cmd[0] != "nvidia-smi" else query if len(cmd) > 1 else plain

    fp = fingerprint(platform="linux", run=smi, root=tmp_path)
    h200 = "NVIDIA H200, 143771 MiB, driver 580.159.04, CUDA 13.0, SM 1980 MHz, memory 3201 MHz, power limit 700 W"
    assert list(fp.gpus) == [h200]
    assert parse_nvidia_smi_cuda(plain) == "13.0" and parse_nvidia_smi_cuda("") == ""
    # Without plain nvidia-smi's header the CUDA version is left out, not guessed.
    fp = fingerprint(platform="linux", run=lambda cmd: query if cmd[0] == "nvidia-smi" and len(cmd) > 1 else None)
    assert list(fp.gpus) == [h200.replace(", CUDA 13.0", "")]
    # A reading nvidia-smi does not support is left out; a line with too few fields is skipped.
    unsupported = "NVIDIA H200, 143771, 580.159.04, [N/A], 3201, [Not Supported], [N/A], 0\nNVIDIA H200, 1\n"
    assert parse_nvidia_smi(unsupported, "13.0") == [
        "NVIDIA H200, 143771 MiB, driver 580.159.04, CUDA 13.0, memory 3201 MHz"
    ]
    empty = tmp_path / "empty"
    empty.mkdir()
    fp = fingerprint(platform="linux", run=lambda cmd: None, root=empty)
    assert "memory" in fp.unavailable and fp.memory_bytes == 0


@pytest.mark.process  # platform.processor() runs uname -p
def test_a_cuda_machine_is_named_by_its_gpu(tmp_path):
    """The H200 machine (its captured nvidia-smi output) with a CUDA build of llama.cpp: its runs
    carry the GPU's model as their chip and the host CPU's model is kept; the same machine with a
    CPU-only llama.cpp, or a CUDA build on a machine without a GPU, stays named by its CPU."""
    (tmp_path / "proc").mkdir()
    (tmp_path / "proc/cpuinfo").write_text("processor\t: 0\nmodel name\t: Intel(R) Xeon(R) Processor\n")
    query, plain = captured("linux-h200-nvidia-smi-query-gpu.txt"), captured("linux-h200-nvidia-smi.txt")

    def smi(cmd):
        return None if cmd[0] != "nvidia-smi" else query if len(cmd) > 1 else plain

    fp = fingerprint(platform="linux", run=smi, root=tmp_path, cuda=lambda: True)
    assert (fp.chip, fp.model_identifier) == ("NVIDIA H200", "Intel(R) Xeon(R) Processor")
    assert "model_identifier" not in fp.unavailable and fp.gpus[0].startswith("NVIDIA H200, 143771 MiB")
    fp = fingerprint(platform="linux", run=smi, root=tmp_path, cuda=lambda: False)
    assert (fp.chip, fp.model_identifier) == ("Intel(R) Xeon(R) Processor", "") and "model_identifier" in fp.unavailable
    fp = fingerprint(platform="linux", run=lambda cmd: None, root=tmp_path, cuda=lambda: True)
    assert fp.chip == "Intel(R) Xeon(R) Processor" and list(fp.gpus) == []
    assert gpu_model("NVIDIA GeForce RTX 4090, 24564 MiB, driver 550.54") == "NVIDIA GeForce RTX 4090"


def test_cuda_build_reads_the_library_directory(tmp_path, monkeypatch):
    """A directory LLAMA_CPP_LIB_PATH names is a CUDA build when it holds libggml-cuda; this
    machine's own llama-cpp-python (a CPU build) is not."""
    monkeypatch.delenv("LLAMA_CPP_LIB_PATH", raising=False)
    assert fpmod.cuda_build() is False
    monkeypatch.setenv("LLAMA_CPP_LIB_PATH", str(tmp_path))
    assert fpmod.cuda_build() is False
    (tmp_path / "libggml-cuda.so").write_bytes(b"")
    assert fpmod.cuda_build() is True
