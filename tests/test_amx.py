"""llamacpp_lib.cpu_has_amx on /proc/cpuinfo's flags line as this machine's CPU printed it (an
Intel Xeon with AMX: ggml's AMX matrix product segfaulted in llama_decode here, llama.cpp issue
20824), and on one without; and servers run without weight repacking exactly there."""

from agent.engines import server_process
from agent.engines.llamacpp_lib import cpu_has_amx

# /proc/cpuinfo's flags line of the Xeon this was written on (2026-12-02), cut to its SIMD part
AMX_FLAGS = (
    "flags\t\t: fpu vme de pse tsc msr pae mce cx8 apic sep mtrr pge mca cmov pat pse36 clflush mmx fxsr sse"
    " sse2 ss ht syscall nx pdpe1gb rdtscp lm avx512f avx512dq rdseed adx smap avx512ifma clflushopt clwb"
    " avx512cd sha_ni avx512bw avx512vl xsaveopt xsavec xgetbv1 xsaves avx_vnni avx512_bf16 wbnoinvd arat"
    " avx512vbmi umip pku ospke waitpkg avx512_vbmi2 gfni vaes vpclmulqdq avx512_vnni avx512_bitalg"
    " avx512_vpopcntdq la57 rdpid cldemote movdiri movdir64b md_clear serialize tsxldtrk amx_bf16"
    " avx512_fp16 amx_tile amx_int8 arch_capabilities"
)


def test_amx_is_read_from_the_flags_line():
    assert cpu_has_amx(f"processor\t: 0\nvendor_id\t: GenuineIntel\n{AMX_FLAGS}\n")
    without = AMX_FLAGS.replace(" amx_tile amx_int8", "").replace(" amx_bf16", "")
    assert not cpu_has_amx(f"processor\t: 0\n{without}\n")
    assert not cpu_has_amx("")  # no flags line (not an x86 Linux): no AMX


def test_servers_run_without_repacking_exactly_where_the_cpu_has_amx(monkeypatch):
    for amx in (True, False):
        monkeypatch.setattr(server_process, "cpu_has_amx", lambda amx=amx: amx)
        env = server_process.server_environment({"PATH": "/usr/bin"})
        assert env == ({"PATH": "/usr/bin", "LLAMA_ARG_REPACK": "0"} if amx else {"PATH": "/usr/bin"})
