"""/metrics after a small scripted fleet run: every family the issue names, with bounded labels
and figures that follow from what the run did."""

import time
import urllib.request

import grpc
import pytest
from prometheus_client.parser import text_string_to_metric_families

from protos.specfleet.v1 import fleet_pb2 as pb
from specfleet.client import AgentApi, channel
from specfleet.record import CHECKED_KEYS
from tests.support.fleet import LINUX_BOX, SWEEP_YAML, admin_for, enrol, make_run, start_coordinator

M4 = pb.Fingerprint(hostname="m4", os="macos", chip="Apple M4 Pro", memory_bytes=48 * 2**30)
M1 = pb.Fingerprint(hostname="m1", os="macos", chip="Apple M1 Max", memory_bytes=64 * 2**30)
# Every label a family may carry: chip, engine, method, depth, state, RPC method and code, sweep name.
ALLOWED_LABELS = {
    "specfleet_agents": {"state", "chip"},
    "specfleet_jobs": {"state"},
    "specfleet_sweep_progress_ratio": {"sweep"},
    "specfleet_runs_ingested": set(),
    "specfleet_runs_duplicate": set(),
    "specfleet_lease_expiries": set(),
    "specfleet_rpc_duration_seconds": {"method", "code", "le"},
    "specfleet_decode_tokens_per_second": {"comparable", "chip", "engine", "model", "method", "depth"},
    "specfleet_speedup_ratio": {"comparable", "chip", "engine", "model", "method", "depth"},
    "specfleet_stall_ratio": {"comparable", "chip", "engine", "model", "method", "depth"},
    "specfleet_comparable_group_info": {
        "comparable", "engine", "engine_version", "system", "model", "model_digest", "draft", "draft_digest",
        "sampler", "prompt_set", "prompt_set_digest", "context_tokens", "max_new_tokens",
        # and one per checked key the declaration adds (specfleet/settings.py): power_mode, threads, ...
        *(k for k in CHECKED_KEYS if not k.startswith("sampler_") and k != "target_digest"),
    },
}  # fmt: skip


def scrape(coordinator) -> dict:
    url = f"http://127.0.0.1:{coordinator.metrics_port}/metrics"
    text = urllib.request.urlopen(url, timeout=10).read().decode()
    return {f.name: f for f in text_string_to_metric_families(text) if f.name.startswith("specfleet_")}


def value(families, name, sample_name=None, **labels) -> float:
    matches = [
        s.value
        for s in families[name].samples
        if s.name == (sample_name or name) and all(s.labels.get(k) == v for k, v in labels.items())
    ]
    assert len(matches) == 1, (name, labels, families[name].samples)
    return matches[0]


@pytest.fixture
def short_lease_coordinator(tmp_path):
    """An in-process coordinator whose leases last 3 s, the shortest it accepts (three heartbeats)."""
    c = start_coordinator(tmp_path, lease_seconds=3.0)
    yield c
    c.stop()


def test_metrics_after_a_scripted_fleet_run(short_lease_coordinator):
    coordinator = short_lease_coordinator
    fast, slow = enrol(coordinator, "m4", fingerprint=M4), enrol(coordinator, "m1", fingerprint=M1)
    enrol(coordinator, "linux", fingerprint=LINUX_BOX, engines=("llama.cpp",))  # no mlx: never asks, stays enrolled
    admin_for(coordinator).SubmitSweep(pb.SubmitSweepRequest(yaml=SWEEP_YAML))

    job = fast.acquire_job(1).job
    runs = [
        make_run(job.job_id, "baseline", 0, tps=100.0),
        make_run(job.job_id, "draft", 2, tps=150.0),
        # Runs that differ in a checked key (max_new_tokens) form their own comparable group.
        # Four repeats of it, the draft's last at 13 tok/s among three at 100: a stall, kept and counted.
        *(make_run(job.job_id, "baseline", 0, tps=200.0, max_new_tokens=64, repeat=r) for r in range(4)),
        *(
            make_run(job.job_id, "draft", 2, tps=t, max_new_tokens=64, repeat=r)
            for r, t in enumerate([100.0] * 3 + [13.0])
        ),
        make_run(job.job_id, "verify-cost", 0, tps=0.0, verify_cost_seconds=[0.01, 0.012]),  # never a speedup
    ]
    for run in runs:
        fast.heartbeat(job.job_id, job.lease_id)  # the lease lasts 3 s: a loaded machine may take longer to report all
        fast.report_result(job.job_id, job.lease_id, run)
    fast.report_result(job.job_id, job.lease_id, runs[0])  # a retry: acknowledged, counted as duplicate
    fast.complete_job(job.job_id, job.lease_id, len(runs))
    slow.acquire_job(1)  # ... and never heartbeats: the lease expires and the job is requeued
    with pytest.raises(grpc.RpcError):
        AgentApi(channel(f"127.0.0.1:{coordinator.port}"), "sfa.nobody.wrong").heartbeat()

    deadline = time.monotonic() + 15
    while True:
        families = scrape(coordinator)
        # The fleet gauges are read before the counters in one scrape: wait for both to show the expiry.
        idle = [
            s for s in families["specfleet_agents"].samples if s.labels == {"state": "idle", "chip": "Apple M1 Max"}
        ]
        if value(families, "specfleet_lease_expiries", "specfleet_lease_expiries_total") >= 1 and idle:
            break
        assert time.monotonic() < deadline, "the lease did not expire within 15 s"
        time.sleep(0.25)

    for name, allowed in ALLOWED_LABELS.items():
        assert name in families, f"{name} missing from /metrics"
        for sample in families[name].samples:
            assert set(sample.labels) <= allowed, (sample.name, sample.labels)
            assert not any(v.startswith(("job-", "lease-", "ag-", "sw-")) for v in sample.labels.values())

    assert value(families, "specfleet_agents", state="idle", chip="Apple M4 Pro") == 1
    assert value(families, "specfleet_agents", state="idle", chip="Apple M1 Max") == 1
    assert value(families, "specfleet_agents", state="enrolled", chip="Test CPU") == 1
    assert value(families, "specfleet_jobs", state="done") == 1
    assert value(families, "specfleet_jobs", state="queued") == 1
    assert value(families, "specfleet_jobs", state="leased") == 0
    assert value(families, "specfleet_sweep_progress_ratio", sweep="test-sweep") == 0.5
    assert value(families, "specfleet_runs_ingested", "specfleet_runs_ingested_total") == len(runs)
    assert value(families, "specfleet_runs_duplicate", "specfleet_runs_duplicate_total") == 1
    assert value(families, "specfleet_lease_expiries", "specfleet_lease_expiries_total") == 1

    rpc = "specfleet_rpc_duration_seconds"
    assert families[rpc].type == "histogram"
    assert value(families, rpc, rpc + "_count", method="ReportResult", code="OK") == len(runs) + 1
    assert value(families, rpc, rpc + "_count", method="Heartbeat", code="UNAUTHENTICATED") == 1
    assert value(families, rpc, rpc + "_bucket", method="CompleteJob", code="OK", le="+Inf") == 1

    chip = {"chip": "Apple M4 Pro", "engine": "mlx", "model": "target"}
    info = families["specfleet_comparable_group_info"].samples
    groups = {s.labels["max_new_tokens"]: s.labels["comparable"] for s in info}
    assert set(groups) == {"32", "64"} and all(s.labels["model_digest"] == "cd" * 6 for s in info)
    assert {s.labels["system"] for s in info} == {"specfleet"}
    tps = "specfleet_decode_tokens_per_second"
    # Medians (of one run each here), exact up to rounding.
    assert value(families, tps, comparable=groups["32"], method="baseline", depth="0", **chip) == pytest.approx(100.0)
    assert value(families, tps, comparable=groups["32"], method="draft", depth="2", **chip) == pytest.approx(150.0)
    speedup = "specfleet_speedup_ratio"
    assert value(families, speedup, comparable=groups["32"], method="draft", depth="2", **chip) == pytest.approx(1.5)
    # The other group's runs are not pooled with these; its stall is in its figures (the medians
    # shrug it off: 0.5, 100 tok/s) and counted as its arm's stall rate, 1 of 4.
    assert value(families, speedup, comparable=groups["64"], method="draft", depth="2", **chip) == pytest.approx(0.5)
    assert value(families, tps, comparable=groups["64"], method="draft", depth="2", **chip) == pytest.approx(100.0)
    stalls = "specfleet_stall_ratio"
    assert value(families, stalls, comparable=groups["64"], method="draft", depth="2", **chip) == pytest.approx(0.25)
    assert value(families, stalls, comparable=groups["32"], method="draft", depth="2", **chip) == 0
    assert not [s for s in families[speedup].samples if s.labels["method"] in ("baseline", "verify-cost")]
    assert not [s for s in families[tps].samples if s.labels["method"] == "verify-cost"]
