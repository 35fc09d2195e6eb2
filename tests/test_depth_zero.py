"""Depth 0: llama-server with its MTP drafter loaded at `--spec-draft-n-max 0` (the bug report's
n_max 0 run, seeds/001). A sweep asks for it as a depth of a draft type; the real llama-server
built in set-up runs it on the tiny MTP model; its runs record method draft-mtp at depth 0, apart
from the baseline's, pair with the baseline like any arm, and settle the ledger's depth-0 claim
without ever being pooled with the baseline."""

import dataclasses
import math
import statistics

import pandas as pd
import pytest
import yaml

from agent.engines import make_engine
from dashboard import claims
from specfleet import speedup
from specfleet.record import ModelIdentity, Prompt
from specfleet.sweeps import SweepError, parse_sweep
from tests.support.dashboard import row
from tests.support.fleet import fleet_db
from tests.support.processes import needs_llama_server

MODEL = "mtp-hybrid.gguf"
MACHINES = ("mbp-1", "mbp-2")
PROMPTS = tuple(
    Prompt(f"p{i}", text)
    for i, text in enumerate(
        (
            "def add(a, b):\n    return a + b\n",
            "The capital of France is",
            "for i in range(10):\n    print(i)\n",
            "Once upon a time there was",
            "SELECT name FROM users WHERE",
        )
    )
)


def sweep_text(arms, **fields) -> str:
    doc = {
        "name": "depth-zero",
        "engines": ["llama-server"],
        "models": {"llama-server": {"target": MODEL}},
        "prompt_sets": ["code"],
        "server": {"flags": "-c 1024"},
        "arms": arms,
        **fields,
    }
    return yaml.safe_dump(doc)


def test_depth_zero_is_a_draft_types_arm_and_nothing_elses():
    cell = parse_sweep(sweep_text([{"spec_type": "draft-mtp", "depths": [0, 2]}])).cells()[0]
    assert [(a.method, a.depth) for a in cell.arms] == [("baseline", 0), ("draft-mtp", 0), ("draft-mtp", 2)]
    line = f"llama-server -m {MODEL} -ngl 99 --spec-type draft-mtp --spec-draft-n-max 0"  # the report's form
    (cell,) = parse_sweep(sweep_text([{"command": line}])).cells()
    assert [(a.method, a.depth) for a in cell.arms] == [("baseline", 0), ("draft-mtp", 0)]
    # an n-gram type's depth is its own maximum: 0 drafts nothing it could be told apart by
    with pytest.raises(SweepError, match=r"arms\[0\]\.depths\[0\]"):
        parse_sweep(sweep_text([{"spec_type": "ngram-mod", "depths": [0]}]))
    ngram_zero = f"llama-server -m {MODEL} --spec-type ngram-mod --spec-ngram-mod-n-max 0"
    with pytest.raises(SweepError, match=r"--spec-ngram-mod-n-max 0: must be a depth from 1"):
        parse_sweep(sweep_text([{"command": ngram_zero}]))
    # our in-process loops have no drafter-loaded-and-idle arm
    doc = yaml.safe_load(sweep_text([{"spec_type": "draft-mtp", "depths": [0]}]))
    doc["engines"].append("llama.cpp")
    doc["models"]["llama.cpp"] = {"target": MODEL}
    doc["methods"] = {"mtp": [0]}
    with pytest.raises(SweepError, match=r"methods\.mtp"):
        parse_sweep(yaml.safe_dump(doc))


@pytest.fixture(scope="module")
def measured(tiny_models, tmp_path_factory):
    """The sweep's cell (the baseline and draft-mtp at depth 0) run through the measurement
    protocol on the real llama-server, once per machine of a two-machine fleet (the same host)."""
    from agent.protocol import run_job

    text = sweep_text(
        [{"spec_type": "draft-mtp", "depths": [0]}],
        max_new_tokens=8,
        warmup=1,
        repeats=2,
        samplers=[{"temperature": 0}],
    )
    (cell,) = parse_sweep(text).cells()
    # short prompts of its own: a long prefill on a shared host would only slow the test
    spec = dataclasses.replace(cell.with_models(target=str(tiny_models.gguf_mtp_hybrid)), prompts=PROMPTS)
    target = ModelIdentity(reference=MODEL, digest="ab" * 32, quantisation="Q4_K_M", context_length=4096)
    rows = []
    for agent in MACHINES:
        e = make_engine(
            "llama-server",
            memory_bytes=16 * 2**30,
            log_dir=str(tmp_path_factory.mktemp(agent)),
            flags=spec.server.flags,
            settings=spec.settings,
        )
        records = []
        try:
            run_job(spec, e, records.append, job_id=f"job-{agent}", attempt=1, target=target)
        finally:
            e.close()
        rows += [row(r, agent, "Apple M1 Max") for r in records]
    # What is under test is the record and the pairing, not this host's load: a shared host is
    # rarely nominal, and runs that are not never pair (the readings stay on the record).
    return pd.DataFrame(rows).assign(env_nominal=True)


@pytest.mark.process
@needs_llama_server
def test_a_depth_zero_arm_runs_on_the_real_server_and_is_recorded_apart(measured):
    runs = measured
    assert len(runs) == len(MACHINES) * 5 * 2 * 2  # machines x prompts x arms x repeats
    zero = runs[(runs["method"] == "draft-mtp") & (runs["depth"] == 0)]
    base = runs[runs["method"] == "baseline"]
    assert len(zero) == len(base) == len(MACHINES) * 5 * 2
    assert all(c.endswith("--spec-type draft-mtp --spec-draft-n-max 0") for c in zero["server_command"])
    assert not any("--spec-type" in c for c in base["server_command"])
    assert (base["depth"] == 0).all() and (base["tokens_drafted"] == 0).all()
    # greedy: the drafter loaded changes no token
    assert (zero["lossless"] == True).all()  # noqa: E712 (a column of booleans)
    # what the server did at n_max 0 is its own count, on the record: this build's MTP drafter checks
    # n_max after adding a token (common/speculative.cpp), so it still drafts one token per step
    assert zero["tokens_drafted"].sum() > 0 and (zero["tokens_accepted"] <= zero["tokens_drafted"]).all()


@pytest.mark.process
@needs_llama_server
def test_depth_zero_pairs_with_the_baseline_and_is_never_pooled_with_it(measured):
    runs = measured
    con = fleet_db(runs)
    pairs = con.execute(speedup.per_prompt_sql("runs", "jobs")).df()
    assert set(zip(pairs["method"], pairs["depth"])) == {("draft-mtp", 0)}  # the baseline is no arm
    # each depth-0 ratio is its own runs over the baseline's of the same machine and prompt, by hand
    for p in pairs[pairs["depth"] == 0].itertuples():
        mine = runs[(runs["machine_id"] == p.machine_id) & (runs["prompt_id"] == p.prompt_id)]
        arm = mine[(mine["method"] == "draft-mtp") & (mine["depth"] == 0)].sort_values("repeat")
        b = mine[mine["method"] == "baseline"].sort_values("repeat")
        ratios = arm["decode_tokens_per_second"].to_numpy() / b["decode_tokens_per_second"].to_numpy()
        assert p.log_ratio == pytest.approx(statistics.median(math.log(r) for r in ratios))  # the repeats' median
    # the ledger's depth-0 claim, on this fleet's chip and model: only depth-0 draft-mtp runs are its arm
    rec = next(r for r in yaml.safe_load(claims.LEDGER.read_text()) if r["id"] == "llamacpp-mtp-m1-max-n-max-0")
    rec["conditions"] = {**rec["conditions"], "models": [MODEL], "kv_cache_type": "f16"}
    # this fleet ran one file, so the claim pairs within the job; its pairing with the bug report's
    # non-MTP file (baseline_models) is tests/test_claims.py's
    rec["conditions"].pop("baseline_models")
    rec.pop("conflicts")  # claims of the whole ledger, not of this one-record ledger
    claim = claims.parse_claims(yaml.safe_dump([rec]))[0]
    matched = claims.matching_runs(claim, fleet_db(runs))
    assert set(zip(matched["method"], matched["depth"])) == {("baseline", 0), ("draft-mtp", 0)}
    (verdict,) = claims.evaluate(claim, fleet_db(runs)).itertuples()
    zero = pairs[pairs["depth"] == 0]
    per_machine = zero.groupby("machine_id")["log_ratio"].mean()
    assert verdict.figure == pytest.approx(math.exp(per_machine.mean()))
    assert (verdict.machines, verdict.prompts, verdict.runs) == (2, 5, 2 * 5 * 2)
