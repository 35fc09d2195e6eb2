"""Honest failure and warnings (issue 26, item 5): one-line failure reasons with the traceback in
the agent's log, drafters that cannot draft within max_new_tokens named at submission and on the
run, outlier runs flagged and left out of the figures with their count, and a failing doctor
check holding the agent's jobs unless overridden. (A model in the wrong format for its engine:
tests/test_preflight.py.)"""

from __future__ import annotations

import logging
import threading
from types import SimpleNamespace

import duckdb
import numpy as np
import pandas as pd
import pytest
import yaml

from agent import doctor, poll, runner
from specfleet import speedup
from specfleet.record import Arm, Settings
from specfleet.sweeps import drafter_warning, parse_sweep
from tests.support.fake_engine import run, spec
from tests.support.fleet import run_record

# ---------------------------------------------------------------- one-line failures

TRACEBACK = """Traceback (most recent call last):
  File "agent/worker.py", line 80, in main
    engine.load(spec.model["target"])
  File "mlx_lm/utils.py", line 120, in load
    config = load_config(model_path)
NotADirectoryError: [Errno 20] Not a directory: '/models/smollm2.gguf/config.json'
"""


def _agent():
    failed = []
    api = SimpleNamespace(fail_job=lambda job_id, lease_id, reason, refused: failed.append(reason))
    metrics = SimpleNamespace(job_ended=lambda outcome: None, jobs=None)
    return SimpleNamespace(api=api, metrics=metrics, stop=threading.Event()), failed


def test_a_worker_crash_reaches_the_coordinator_in_one_line_and_its_traceback_the_log(tmp_path, caplog):
    (tmp_path / "worker.err").write_text(TRACEBACK)
    agent, failed = _agent()
    with caplog.at_level(logging.ERROR, logger="specfleet.agent"):
        runner._finish(agent, runner.JobRunner(SimpleNamespace(job_id="j1", lease_id="l1")), 1, False, tmp_path, [])
    crash = "NotADirectoryError: [Errno 20] Not a directory: '/models/smollm2.gguf/config.json'"
    assert failed == [f"worker exited with status 1: {crash}"]
    assert 'File "mlx_lm/utils.py", line 120' in caplog.text  # the whole traceback, in the agent's log


def test_every_failure_reason_is_one_bounded_line():
    agent, failed = _agent()
    runner._fail(agent, SimpleNamespace(job_id="j1", lease_id="l1"), "first\n  second\n" + "x" * 5000)
    assert "\n" not in failed[0] and failed[0].startswith("first second x") and len(failed[0]) == 2000


# ---------------------------------------------------------------- drafters that cannot draft

MOD = Settings(ngram_mod_n_match=24, ngram_mod_n_min=48, ngram_map_size_n=12, ngram_map_min_hits=1)


@pytest.mark.parametrize(
    "method, depth, settings, max_new, warns",
    [
        ("ngram-mod", 16, MOD, 64, True),  # 2 x 24 + 16 = 64 tokens before a first draft
        ("ngram-mod", 8, MOD, 64, False),  # 56
        ("ngram-mod", 16, MOD, 256, False),
        ("ngram-map-k4v", 16, MOD, 64, False),  # (1 + 1) x 12 + 16 = 40
        ("ngram-map-k4v", 16, Settings(ngram_map_size_n=12, ngram_map_min_hits=4), 64, True),  # 76
        ("ngram", 16, MOD, 8, False),
        ("draft", 16, MOD, 8, False),
    ],
)
def test_a_drafter_that_cannot_draft_within_max_new_tokens_is_named(method, depth, settings, max_new, warns):
    warning = drafter_warning(method, depth, settings, max_new)
    assert bool(warning) is warns
    if warns:
        assert warning.startswith(f"{method} at depth {depth} cannot draft") and f"max_new_tokens {max_new}" in warning


def test_the_warning_is_a_note_at_submission_and_on_every_run_of_the_arm():
    doc = {
        "name": "s",
        "engines": ["llama.cpp"],
        "prompt_sets": ["code"],
        "models": {"llama.cpp": {"target": "/m/t.gguf"}},
        "methods": {"ngram-mod": [16], "ngram": [4]},
        "max_new_tokens": 64,
    }
    notes = parse_sweep(yaml.safe_dump(doc)).notes()
    assert [n for n in notes if "cannot draft" in n] == [
        "llama.cpp: " + drafter_warning("ngram-mod", 16, Settings(ngram_mod_n_match=24, ngram_mod_n_min=48), 64)
    ]
    arms = (Arm("baseline"), Arm("ngram-mod", 16))
    _, _, runs = run(spec(arms=arms, max_new_tokens=64, settings=MOD, repeats=2))
    assert {r.method: bool(r.drafter_warning) for r in runs} == {"baseline": False, "ngram-mod": True}


# ---------------------------------------------------------------- stalls


def _row(job, method, prompt, repeat, tps) -> dict:
    record = run_record(job, method, 0 if method == "baseline" else 2, tps, prompt_id=prompt, repeat=repeat)
    return {**record.row(), "lease_id": f"{job}-lease", "agent_id": "a", "machine_id": "a", "chip": "Apple M4 Pro"}


def _con(rows: list[dict]):
    con = duckdb.connect()
    con.register("runs", pd.DataFrame(rows))
    con.register("jobs", pd.DataFrame([("j1", 1, "done")], columns=["job_id", "attempt", "state"]))
    return con


def test_a_stalled_run_is_flagged_counted_and_kept_and_the_median_shrugs_it_off():
    # Issue 26: one draft repeat at 11.6 tok/s among repeats near 95; baselines near 80.
    speeds = {"baseline": [80.0, 81.0, 79.0, 80.5, 79.5], "draft": [95.0, 96.0, 11.6, 94.0, 95.5]}
    rows = [_row("j1", m, "p1", i, tps) for m, values in speeds.items() for i, tps in enumerate(values)]
    con = _con(rows)
    flagged = con.execute(f"SELECT method, repeat FROM {speedup.flagged_sql('runs')} WHERE stall").fetchall()
    assert flagged == [("draft", 2)]
    counts = con.execute(speedup.stall_counts_sql("runs")).df()
    assert counts[["method", "stalled_runs", "judged_runs"]].values.tolist() == [["draft", 1, 5]]
    assert counts.stall_rate[0] == pytest.approx(0.2)
    everything = speedup.speedups(con)  # every pair is in: the median of the prompt's five log ratios
    ratios = sorted(d / b for b, d in zip(speeds["baseline"], speeds["draft"]))
    assert everything.pairs[0] == 5 and everything.speedup[0] == pytest.approx(ratios[2])
    assert everything.speedup[0] == pytest.approx(1.19, abs=0.01)  # the mean with the stall would be 0.77


def test_ordinary_noise_is_never_a_stall():
    """Three repeats at 5% noise, 2000 prompts: no run is ever half its repeats' median."""
    rng = np.random.default_rng(26)
    rows = [
        _row("j1", "draft", f"p{p}", i, float(tps))
        for p in range(2000)
        for i, tps in enumerate(rng.normal(100.0, 5.0, 3))
    ]
    con = _con(rows)
    flagged = con.execute(f"SELECT count(*) FROM {speedup.flagged_sql('runs')} WHERE stall").fetchone()[0]
    assert flagged == 0


# ---------------------------------------------------------------- the doctor's hold


def _polling_agent(hold):
    return SimpleNamespace(
        config=SimpleNamespace(allow_battery=False),
        sample_environment=lambda: {"power_source": "ac", "low_power_mode": False, "thermal": "nominal"},
        lock=threading.Lock(),
        state=SimpleNamespace(not_starting="", status="idle"),
        metrics=SimpleNamespace(not_starting=SimpleNamespace(set=lambda value: None)),
        beat=threading.Event(),
        doctor_hold=hold,
        clock_hold=lambda: "",  # this machine's clock agrees with the coordinator's
    )


def test_a_failing_doctor_check_holds_jobs_until_it_passes_and_the_override_takes_them():
    verdicts = iter(["agent doctor fails: other processes: yes (pid 7) 50% of the CPU", ""])
    agent = _polling_agent(lambda: next(verdicts))
    assert poll.holding_back(agent)
    assert agent.state.status == "not starting jobs: agent doctor fails: other processes: yes (pid 7) 50% of the CPU"
    assert agent.beat.is_set()  # the coordinator hears it at once
    assert not poll.holding_back(agent) and agent.state.not_starting == ""  # it passed: jobs again
    assert not poll.holding_back(_polling_agent(None))  # --ignore-doctor: no hold is installed


def test_the_hold_names_only_failed_checks():
    checks = [
        doctor.Check("swap", doctor.WARN, "10 MiB of swap in use"),
        doctor.Check("thermal state", doctor.FAIL, "throttled: serious"),
        doctor.Check("other processes", doctor.FAIL, "yes (pid 7) 50% of the CPU"),
    ]
    assert doctor.hold_reason(checks) == (
        "agent doctor fails: thermal state: throttled: serious; other processes: yes (pid 7) 50% of the CPU"
    )
    assert doctor.hold_reason(checks[:1]) == ""


def test_agent_run_holds_by_default_and_ignore_doctor_overrides(monkeypatch):
    from cli.main import build_parser

    monkeypatch.delenv("SPECFLEET_IGNORE_DOCTOR", raising=False)
    assert build_parser().parse_args(["agent", "run"]).ignore_doctor is False
    assert build_parser().parse_args(["agent", "run", "--ignore-doctor"]).ignore_doctor is True
