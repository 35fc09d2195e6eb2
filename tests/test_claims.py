"""The claims ledger: every record checks, every sweep parses, verdicts from known runs, and a
malformed record is refused with its field named."""

import numpy as np
import pandas as pd
import pytest
import yaml

from agent.engines import ENGINE_METHODS
from coordinator.sweeps import parse_sweep
from dashboard import claims, stats

REQUIRED = {
    "mtplx-2-3x",
    "mtplx-m4-pro-2.6x",
    "mtplx-m5-max-55.4-vs-29.7",
    "llamacpp-mtp-m5-max-dense-27b",
    "llamacpp-mtp-m5-max-moe-35b",
    "llamacpp-mtp-m1-max-net-loss-n2",
    "optiq-depth-k1",
    "optiq-depth-k2",
    "optiq-depth-k3",
    "optiq-depth-k4",
    "depth-1-3-optimal-on-metal",
    "small-target-loses",
    "mtp-cuts-prefill-m2-ultra",
    "matched-truncation-acceptance",
    "ngram-mod-gain-3-9pct",
    "no-mac-ngram-mod-benchmark",
}
GOOD = {
    "id": "my-claim",
    "statement": "Drafting wins on an M4 Pro.",
    "source": {"file": "seeds/x.txt", "section": "Somewhere", "quote": "wins"},
    "conditions": {
        "engine": "mlx",
        "method": "draft",
        "chip": "Apple M4 Pro",
        "depth": 2,
        "sampler": {"temperature": 0},
    },
    "metric": "speedup",
    "expected": "above 1",
    "verdict": {"rule": "above", "threshold": 1.0, "min_machines": 1, "min_runs": 3},
}


def test_the_ledger_holds_the_seed_claims_with_their_sources():
    ledger = claims.load_claims()
    assert REQUIRED <= {c.id for c in ledger}
    seeds = {"seeds/000_1adc8d5e08f1ad2a.txt", "seeds/001_8593c58e23d2b69a.txt"}
    assert all(c.source["file"] in seeds and c.source.get("quote") for c in ledger)


@pytest.mark.parametrize("claim", claims.load_claims(), ids=lambda c: c.id)
def test_every_generated_sweep_parses(claim):
    """Every claim's sweep is ready to submit: the coordinator accepts it as it is."""
    method, engine = claim.conditions["method"], claim.conditions["engine"]
    assert method in ENGINE_METHODS[engine]
    sweep = parse_sweep(claims.sweep_yaml(claim))
    assert sweep.engines == [engine]
    assert {(a["method"], a["depth"]) for a in sweep.arms} == {("baseline", 0)} | {(method, d) for d in claim.depths}
    chip = claim.conditions.get("chip")
    if chip == "Apple*":
        assert sweep.target["chip_families"] == list(claims.MAC_FAMILIES)
    elif chip:
        assert sweep.target["chips"] == [chip]


def test_a_supported_method_gives_a_sweep_that_parses():
    sweep = parse_sweep(claims.sweep_yaml(claims.parse_claims(yaml.safe_dump([GOOD]))[0]))
    assert sweep.models["mlx"]["draft"]  # a draft model is required for method draft, and given


@pytest.mark.parametrize(
    "change, field",
    [
        ({"verdict": {"rule": "range", "low": 1.0}}, "claims[0] (my-claim).verdict.high"),
        ({"metric": "vibes"}, "claims[0] (my-claim).metric"),
        ({"conditions": {**GOOD["conditions"], "engine": "vllm"}}, "claims[0] (my-claim).conditions.engine"),
        ({"conditions": {**GOOD["conditions"], "depth": "three"}}, "claims[0] (my-claim).conditions.depth"),
        ({"conditions": {**GOOD["conditions"], "gpu": "x"}}, "claims[0] (my-claim).conditions.gpu"),
        ({"source": "the internet"}, "claims[0] (my-claim).source"),
        ({"statement": None}, "claims[0] (my-claim).statement"),
        ({"id": "Not A Slug"}, "claims[0] (Not A Slug).id"),
        ({"verdict": {"rule": "none_measured"}}, "claims[0] (my-claim).verdict.rule"),  # needs metric runs
    ],
)
def test_a_malformed_record_names_its_field(change, field):
    with pytest.raises(claims.ClaimError) as e:
        claims.parse_claims(yaml.safe_dump([{**GOOD, **change}]))
    assert any(p.startswith(field + ":") for p in e.value.problems), e.value.problems
    assert field in str(e.value)


def test_ledger_level_mistakes():
    with pytest.raises(claims.ClaimError, match="file: must be a list"):
        claims.parse_claims("id: x")
    with pytest.raises(claims.ClaimError, match=r"\(my-claim\).id: used twice"):
        claims.parse_claims(yaml.safe_dump([GOOD, GOOD]))
    with pytest.raises(claims.ClaimError, match=r"claims\[1\]: must be a mapping"):
        claims.parse_claims(yaml.safe_dump([GOOD, "oops"]))


def fleet_runs(
    chip,
    agent,
    job,
    ratios,
    engine="llama.cpp",
    method="mtp",
    depth=2,
    model="/m/Qwen3.5-9B-Q4_K_M.gguf",
    sampler="temperature=0.0,top_p=1.0,top_k=0,seed=0",
    degraded=(),
):
    rows = []
    for i, ratio in enumerate(ratios):
        nominal = "degraded" if i in degraded else "nominal"
        common = dict(
            job_id=job,
            agent_id=agent,
            chip=chip,
            engine=engine,
            prompt_id=f"p{i}",
            repeat=0,
            model=model,
            sampler=sampler,
            prompt_set="chat",
            nominal=nominal,
            prefill_tokens_per_second=1000.0,
            acceptance_rate=np.nan,
        )
        rows.append(dict(common, method="baseline", depth=0, decode_tokens_per_second=25.0))
        rows.append(dict(common, method=method, depth=depth, decode_tokens_per_second=25.0 * ratio))
    return rows


def claim(claim_id):
    return next(c for c in claims.load_claims() if c.id == claim_id)


def test_m1_max_net_loss_reproduced_contradicted_and_not_enough():
    c = claim("llamacpp-mtp-m1-max-net-loss-n2")
    loss = pd.DataFrame(
        fleet_runs("Apple M1 Max", "mbp-1", "j1", [0.86, 0.88, 0.87, 0.85])
        + fleet_runs("Apple M1 Max", "mbp-2", "j2", [0.9, 0.87, 0.86, 0.5], degraded={3})
    )
    row = claims.evaluate(c, loss).iloc[0]
    assert (row["chip"], row["verdict"]) == ("Apple M1 Max", stats.REPRODUCED)
    assert row["figure"] == pytest.approx(np.median([0.86, 0.88, 0.87, 0.85, 0.9, 0.87, 0.86]))
    assert (row["machines"], row["runs"], row["excluded_runs"]) == (2, 7, 1)
    assert row["ci_high"] < 1.0

    win = pd.DataFrame(fleet_runs("Apple M1 Max", "mbp-1", "j1", [1.2, 1.25, 1.22, 1.18, 1.21, 1.24]))
    assert claims.evaluate(c, win).iloc[0]["verdict"] == stats.CONTRADICTED

    few = pd.DataFrame(fleet_runs("Apple M1 Max", "mbp-1", "j1", [0.8, 0.82]))
    row = claims.evaluate(c, few).iloc[0]
    assert (row["verdict"], row["machines"], row["runs"]) == (stats.NOT_ENOUGH, 1, 2)


def test_runs_outside_the_conditions_do_not_count():
    c = claim("llamacpp-mtp-m1-max-net-loss-n2")
    ratios = [0.8] * 8
    other = pd.DataFrame(
        fleet_runs("Apple M4 Pro", "mini", "j1", ratios)  # another chip
        + fleet_runs("Apple M1 Max", "a", "j2", ratios, model="/m/Llama-3-8B-Q4_K_M.gguf")  # another model
        + fleet_runs("Apple M1 Max", "b", "j3", ratios, sampler="temperature=0.7,top_p=0.9,top_k=0,seed=1")
        + fleet_runs("Apple M1 Max", "c", "j4", ratios, depth=6)  # another depth
        + fleet_runs("Apple M1 Max", "d", "j5", ratios, engine="mlx", model="/m/qwen3.5-9b-q4_k_m")
    )
    out = claims.evaluate(c, other)
    assert out["chip"].tolist() == ["Apple M1 Max"] and out.iloc[0]["runs"] == 0
    assert out.iloc[0]["verdict"] == stats.NOT_ENOUGH


def test_acceptance_and_prefill_claims():
    acc = claim("matched-truncation-acceptance")
    rows = fleet_runs(
        "Apple M4 Pro",
        "mini",
        "j1",
        [1.2] * 6,
        engine="mlx",
        depth=3,
        model="/m/Qwen3.5-9B-MTP-4bit",
        sampler="temperature=1.0,top_p=0.95,top_k=20,seed=0",
    )
    for r in rows:
        if r["method"] == "mtp":
            r["acceptance_rate"] = 0.62
    row = claims.evaluate(acc, pd.DataFrame(rows)).iloc[0]
    assert (row["verdict"], row["figure"]) == (stats.REPRODUCED, pytest.approx(0.62))

    pre = claim("mtp-cuts-prefill-m2-ultra")
    rows = fleet_runs("Apple M2 Ultra", "studio", "j1", [1.1] * 6, depth=3)
    for r in rows:
        if r["method"] == "mtp":
            r["prefill_tokens_per_second"] = 830.0
    row = claims.evaluate(pre, pd.DataFrame(rows)).iloc[0]
    assert (row["verdict"], row["figure"]) == (stats.REPRODUCED, pytest.approx(0.83))


def test_absence_claim_is_contradicted_by_the_first_mac_run():
    c = claim("no-mac-ngram-mod-benchmark")
    assert claims.evaluate(c, pd.DataFrame()).iloc[0]["verdict"] == stats.REPRODUCED
    linux = pd.DataFrame(fleet_runs("AMD EPYC", "box", "j1", [1.05] * 3, method="ngram", depth=3))
    assert claims.evaluate(c, linux).iloc[0]["verdict"] == stats.REPRODUCED  # not a Mac
    mac = pd.DataFrame(fleet_runs("Apple M3", "air", "j2", [1.05] * 3, method="ngram", depth=3))
    row = claims.evaluate(c, mac).iloc[0]
    assert (row["chip"], row["verdict"], row["machines"], row["runs"]) == ("Apple M3", stats.CONTRADICTED, 1, 3)
