"""The claims ledger: every record checks, every sweep parses, verdicts from known runs by the
interval rule, and a malformed record is refused with its field named."""

import dataclasses

import duckdb
import numpy as np
import pandas as pd
import pytest
import yaml

from coordinator.sweeps import parse_sweep
from dashboard import claims, inference
from specfleet import speedup
from specfleet.record import CHECKED_KEYS, ENGINE_METHODS, ModelIdentity, Sampler
from tests.fleet import jobs_of, register_runs
from tests.test_dashboard import MLX_27B, VARIANTS, record, row, sha

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
    assert {(a.method, a.depth) for a in sweep.arms} == {("baseline", 0)} | {(method, d) for d in claim.depths}
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
        ({"verdict": {"rule": "range", "low": 1.2, "high": 1.2}}, "claims[0] (my-claim).verdict.low"),  # an empty band
        ({"verdict": {"rule": "below", "threshold": 0}}, "claims[0] (my-claim).verdict.threshold"),
        (
            {"verdict": {"rule": "above", "threshold": 1.0, "min_machines": 0}},
            "claims[0] (my-claim).verdict.min_machines",
        ),
        # models are named by exact reference: the old substring family is refused, naming the field
        ({"conditions": {**GOOD["conditions"], "model_family": "9b"}}, "claims[0] (my-claim).conditions.model_family"),
        ({"conditions": {**GOOD["conditions"], "models": "Qwen3.5-9B"}}, "claims[0] (my-claim).conditions.models"),
        (
            {"conditions": {**GOOD["conditions"], "models": ["/models/x.gguf"]}},
            "claims[0] (my-claim).conditions.models",
        ),
        ({"conditions": {**GOOD["conditions"], "digests": ["abc"]}}, "claims[0] (my-claim).conditions.digests"),
        (
            {"conditions": {**GOOD["conditions"], "implementation": "vllm"}},
            "claims[0] (my-claim).conditions.implementation",
        ),
        (
            {"conditions": {**GOOD["conditions"], "prompt_category": "chat"}},
            "claims[0] (my-claim).conditions.prompt_category",
        ),
        (
            {"conditions": {**GOOD["conditions"], "context_tokens": -1}},
            "claims[0] (my-claim).conditions.context_tokens",
        ),
        ({"conditions": {**GOOD["conditions"], "chip": "Apple*Pro"}}, "claims[0] (my-claim).conditions.chip"),
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


Q9B = ModelIdentity(
    reference="Qwen3.5-9B-MTP-Q4_K_M.gguf",
    digest=sha("q9b"),
    architecture="qwen35",
    parameters=9_400_000_000,
    quantisation="Q4_K_M",
)
REPRODUCED, CONTRADICTED, INCONCLUSIVE = inference.REPRODUCED, inference.CONTRADICTED, inference.INCONCLUSIVE


def fleet_runs(chip, agent, job, ratios, engine="llama.cpp", method="mtp", depth=2, model=Q9B, degraded=(), **fields):
    """Stored rows of one machine's job: per prompt a baseline at 25 tok/s and the arm at
    25 x ratio; the prompts in `degraded` ran hot (env_nominal false)."""
    rows = []
    for i, ratio in enumerate(ratios):
        common = {"engine": engine, "target": model, "prompt_id": f"p{i}", "env_nominal": i not in degraded, **fields}
        for m, d, tps in (("baseline", 0, 25.0), (method, depth, 25.0 * ratio)):
            rows.append(row(record(job, m, d, tps, **common), agent, chip))
    return rows


def claim(claim_id):
    return next(c for c in claims.load_claims() if c.id == claim_id)


def ours(claim_id):
    """A ledger claim with its conditions, about specfleet's own loop: a claim about
    llama-server or MTPLX selects no run until the fleet runs them, so the rules are tested
    on the same conditions and band in the fleet's own system."""
    c = claim(claim_id)
    return dataclasses.replace(c, conditions={**c.conditions, "implementation": claims.OURS})


def geometric(*machines):
    """specfleet's speedup by hand: a geometric mean per machine, then over machines (one
    repeat per prompt)."""
    return float(np.exp(np.mean([np.mean(np.log(m)) for m in machines])))


def t_interval(*machines):
    """The interval by hand: Student's t over machine means of log ratios (one machine: over
    its prompts), exponentiated."""
    from scipy import stats as sps

    values = [np.mean(np.log(m)) for m in machines] if len(machines) > 1 else list(np.log(machines[0]))
    n, mean, sd = len(values), np.mean(values), np.std(values, ddof=1)
    half = sps.t.ppf(0.975, n - 1) * sd / np.sqrt(n)
    return float(np.exp(mean - half)), float(np.exp(mean + half))


def test_m1_max_net_loss_reproduced_contradicted_and_inconclusive_by_the_interval():
    c = ours("llamacpp-mtp-m1-max-net-loss-n2")  # below 1.0, an M1 Max: one machine may settle it
    assert (c.rule.band_low, c.rule.band_high, c.rule.min_machines) == (0.0, 1.0, 1)
    loss = pd.DataFrame(
        fleet_runs("Apple M1 Max", "mbp-1", "j1", [0.86, 0.88, 0.87, 0.85])
        + fleet_runs("Apple M1 Max", "mbp-2", "j2", [0.9, 0.87, 0.86, 0.5], degraded={3})
    )
    row = claims.evaluate(c, loss, jobs_of(loss)).iloc[0]
    assert (row["chip"], row["verdict"]) == ("Apple M1 Max", REPRODUCED)
    assert row["figure"] == pytest.approx(geometric([0.86, 0.88, 0.87, 0.85], [0.9, 0.87, 0.86]))
    assert (row["machines"], row["prompts"], row["runs"], row["excluded_runs"]) == (2, 3, 7, 1)
    # the interval is t over the two machine means, and it lies inside (0, 1]
    low, high = t_interval([0.86, 0.88, 0.87, 0.85], [0.9, 0.87, 0.86])
    assert (row["ci_low"], row["ci_high"]) == (pytest.approx(low), pytest.approx(high))
    assert row["ci_low"] < row["figure"] < row["ci_high"] < 1.0
    assert row["tested"] and 0 < row["p_value"] < 0.025 and "lies inside below 1x" in row["why"]

    win = pd.DataFrame(fleet_runs("Apple M1 Max", "mbp-1", "j1", [1.2, 1.25, 1.22, 1.18, 1.21, 1.24]))
    row = claims.evaluate(c, win, jobs_of(win)).iloc[0]
    assert row["verdict"] == CONTRADICTED and row["ci_low"] > 1.0 and row["p_value"] < 0.025
    assert "one machine" in row["why"] or row["machines"] == 1

    # the median of these prompts is below 1 (the old rule said reproduced), but the interval
    # reaches across 1: inconclusive, with the interval and counts behind it
    straddle = pd.DataFrame(fleet_runs("Apple M1 Max", "mbp-1", "j1", [0.8, 0.85, 0.9, 1.15]))
    row = claims.evaluate(c, straddle, jobs_of(straddle)).iloc[0]
    assert np.median([0.8, 0.85, 0.9, 1.15]) < 1 and row["figure"] < 1
    assert row["ci_low"] < 1.0 < row["ci_high"]
    assert (row["verdict"], row["machines"], row["prompts"], row["runs"]) == (INCONCLUSIVE, 1, 4, 4)
    assert row["tested"] and row["p_value"] == 1.0 and "reaches across an edge" in row["why"]

    few = pd.DataFrame(fleet_runs("Apple M1 Max", "mbp-1", "j1", [0.8]))  # one prompt: no interval
    row = claims.evaluate(c, few, jobs_of(few)).iloc[0]
    assert (row["verdict"], row["machines"], row["runs"], row["tested"]) == (INCONCLUSIVE, 1, 1, False)


def test_min_runs_in_a_record_still_counts():
    c = claims.parse_claims(yaml.safe_dump([{**GOOD, "verdict": {"rule": "below", "threshold": 1.0, "min_runs": 6}}]))[
        0
    ]
    c = dataclasses.replace(
        c, conditions={**c.conditions, "engine": "llama.cpp", "method": "mtp", "chip": "Apple M1 Max"}
    )
    runs = pd.DataFrame(fleet_runs("Apple M1 Max", "a", "j1", [0.8, 0.81, 0.79, 0.8]))
    row = claims.evaluate(c, runs, jobs_of(runs)).iloc[0]
    assert (row["verdict"], row["runs"], row["tested"]) == (INCONCLUSIVE, 4, False) and "at least 6" in row["why"]


def test_runs_outside_the_conditions_do_not_count():
    c = ours("llamacpp-mtp-m1-max-net-loss-n2")
    ratios = [0.8] * 8
    llama = ModelIdentity(reference="Llama-3-8B-Q4_K_M.gguf", digest=sha("llama"), architecture="llama")
    other = pd.DataFrame(
        fleet_runs("Apple M4 Pro", "mini", "j1", ratios)  # another chip
        + fleet_runs("Apple M1 Max", "a", "j2", ratios, model=llama)  # another model
        + fleet_runs("Apple M1 Max", "b", "j3", ratios, sampler=Sampler(temperature=0.7, top_p=0.9, seed=1))
        + fleet_runs("Apple M1 Max", "c", "j4", ratios, depth=6)  # another depth
        + fleet_runs("Apple M1 Max", "d", "j5", ratios, engine="mlx")  # another engine
        # the name says Q4_K_M, the weights say Q8_0: the recorded quantisation decides
        + fleet_runs("Apple M1 Max", "e", "j6", ratios, model=dataclasses.replace(Q9B, quantisation="Q8_0"))
        # a name that holds the claimed one is another file: no substring matching
        + fleet_runs(
            "Apple M1 Max",
            "f",
            "j7",
            ratios,
            model=dataclasses.replace(Q9B, reference="Qwen3.5-9B-MTP-Q4_K_M-imat.gguf"),
        )
    )
    decoy = pd.DataFrame(fleet_runs("Apple M1 Max", "g", "j8", ratios)).assign(implementation="llama-server draft-mtp")
    other = pd.concat([other.assign(implementation=""), decoy], ignore_index=True)  # "" is ours
    out = claims.evaluate(c, other, jobs_of(other))
    assert out["chip"].tolist() == ["Apple M1 Max"] and out.iloc[0]["runs"] == 0
    assert out.iloc[0]["verdict"] == INCONCLUSIVE and out.iloc[0]["why"].startswith("no run in the fleet matches")
    sel = claims.selection(c, other)
    assert (sel["selected"], sel["arm"], sel["fleet"]) == (8, 0, len(other))  # the depth-6 job's baselines
    # each condition counts the runs it leaves out (a baseline fails only the conditions of baselines)
    assert sel["excluded"] == {
        "implementation": 16,
        "engine": 16,
        "depth": 8,
        "chip": 16,
        "models": 32,
        "quantisation": 32,  # Q8_0, and the Llama file that records none
        "sampler.temperature": 16,
    }
    # the claim itself, about llama-server, selects only llama-server's runs
    out = claims.evaluate(claim("llamacpp-mtp-m1-max-net-loss-n2"), other, jobs_of(other))
    assert out.iloc[0]["runs"] == 8 and out.iloc[0]["verdict"] == REPRODUCED


def test_models_quantisation_and_architecture_match_exactly():
    c = ours("llamacpp-mtp-m1-max-net-loss-n2")  # models [Qwen3.5-9B-MTP-Q4_K_M.gguf], quantisation Q4_K_M

    def matched(model, claim=c):
        return len(
            claims.matching_runs(claim, pd.DataFrame(fleet_runs("Apple M1 Max", "a", "j1", [0.8] * 6, model=model)))
        )

    assert matched(Q9B) == 12
    assert matched(dataclasses.replace(Q9B, reference="qwen3.5-9b-mtp-q4_k_m.gguf")) == 12  # case is not a name
    for reference in ("Qwen3.5-9B-Q4_K_M.gguf", "MTP-Q4_K_M.gguf", "Qwen3.5-9B-MTP-Q4_K_M.gguf.part", "model.gguf"):
        assert matched(dataclasses.replace(Q9B, reference=reference)) == 0, reference
    # the recorded quantisation, exactly once normalised: Q4_K is not Q4_K_M, unknown never matches
    assert matched(dataclasses.replace(Q9B, quantisation="q4_k_m")) == 12
    for quantisation in ("", "Q4_K", "Q4_K_M_L"):
        assert matched(dataclasses.replace(Q9B, quantisation=quantisation)) == 0, quantisation
    # the architecture in either format's spelling, and nothing that merely contains it
    arch = claims.parse_claims(
        yaml.safe_dump(
            [{**GOOD, "conditions": {"engine": "llama.cpp", "method": "mtp", "depth": 2, "architecture": "qwen3_5"}}]
        )
    )[0]
    for model in (Q9B, MLX_27B):  # "qwen35" (GGUF), "Qwen3_5ForCausalLM" (Hugging Face)
        assert matched(model, arch) == 12
    for architecture in ("qwen35moe", "Qwen3_5MoeForCausalLM", "qwen3", ""):
        assert matched(dataclasses.replace(Q9B, architecture=architecture), arch) == 0, architecture
    by_digest = claims.parse_claims(
        yaml.safe_dump(
            [{**GOOD, "conditions": {"engine": "llama.cpp", "method": "mtp", "depth": 2, "digests": [sha("q9b")]}}]
        )
    )[0]
    assert matched(Q9B, by_digest) == 12 and matched(dataclasses.replace(Q9B, digest=sha("other")), by_digest) == 0


def test_acceptance_and_prefill_claims():
    acc = claim("matched-truncation-acceptance")  # any Mac: three machines
    model = ModelIdentity(
        reference="mlx-community/Qwen3.5-9B-OptiQ-4bit",
        digest=sha("9b-mlx"),
        quantisation="4bit-g64",
        source="huggingface",
    )
    sampled = Sampler(temperature=1.0, top_p=0.95, top_k=20)
    rows = []
    for agent in ("mini-1", "mini-2", "mini-3"):
        rows += fleet_runs(
            "Apple M4 Pro", agent, f"j-{agent}", [1.2] * 6, engine="mlx", depth=3, model=model, sampler=sampled
        )
    for r in rows:
        if r["method"] == "mtp":
            r["tokens_drafted"], r["tokens_accepted"] = 100, 62
    runs = pd.DataFrame(rows)
    row = claims.evaluate(acc, runs, jobs_of(runs)).iloc[0]
    assert (row["verdict"], row["figure"], row["runs"], row["machines"]) == (REPRODUCED, pytest.approx(0.62), 18, 3)
    assert not row["tested"] and "bootstrap" in row["why"]  # the median's interval; no p-value
    one = runs[runs["agent_id"] == "mini-1"]
    assert claims.evaluate(acc, one, jobs_of(one)).iloc[0]["verdict"] == INCONCLUSIVE

    pre = ours("mtp-cuts-prefill-m2-ultra")
    rows = fleet_runs("Apple M2 Ultra", "studio", "j1", [1.1] * 6, depth=3)
    prefill = iter([1650.0, 1660.0, 1670.0, 1655.0, 1665.0, 1660.0])
    for r in rows:
        if r["method"] == "mtp":
            r["prefill_tokens_per_second"] = next(prefill)  # the baselines': 2000
    row = claims.evaluate(pre, pd.DataFrame(rows), jobs_of(pd.DataFrame(rows))).iloc[0]
    assert (row["verdict"], row["figure"]) == (REPRODUCED, pytest.approx(0.83, rel=0.01))
    assert 0.75 < row["ci_low"] < row["ci_high"] < 0.9


def test_absence_claim_is_contradicted_by_the_first_mac_run_of_its_system():
    c = claim("no-mac-ngram-mod-benchmark")
    assert claims.evaluate(c, pd.DataFrame(), jobs_of(pd.DataFrame())).iloc[0]["verdict"] == REPRODUCED
    # specfleet's own n-gram loop (prompt lookup) on a Mac is not ngram-mod
    loop = pd.DataFrame(fleet_runs("Apple M3", "air", "j0", [1.05] * 3, method="ngram", depth=3))
    assert claims.evaluate(c, loop, jobs_of(loop)).iloc[0]["verdict"] == REPRODUCED
    mod = "llama-server ngram-mod"
    linux = pd.DataFrame(fleet_runs("AMD EPYC", "box", "j1", [1.05] * 3, method="ngram", depth=3)).assign(
        implementation=mod
    )
    assert claims.evaluate(c, linux, jobs_of(linux)).iloc[0]["verdict"] == REPRODUCED  # not a Mac
    mac = pd.DataFrame(fleet_runs("Apple M3", "air", "j2", [1.05] * 3, method="ngram", depth=3)).assign(
        implementation=mod
    )
    row = claims.evaluate(c, mac, jobs_of(mac)).iloc[0]
    assert (row["chip"], row["verdict"], row["machines"], row["runs"]) == ("Apple M3", CONTRADICTED, 1, 3)


def test_every_checked_key_has_a_variant():
    assert set(VARIANTS) == set(CHECKED_KEYS)


@pytest.mark.parametrize("key", CHECKED_KEYS)
def test_runs_that_differ_in_a_checked_key_are_settled_apart(key):
    """Two machines on one chip, one in another comparable group: never pooled. Each group's
    figure is specfleet.speedup's on that group's runs alone."""
    c = claims.parse_claims(
        yaml.safe_dump(
            [
                {
                    **GOOD,
                    "conditions": {"engine": "mlx", "method": "mtp", "depth": 2},
                    "verdict": {"rule": "range", "low": 0.75, "high": 0.85, "min_machines": 1, "min_runs": 6},
                }
            ]
        )
    )[0]
    base = [0.78, 0.8, 0.82, 0.79, 0.81, 0.8]
    variant = [0.9, 0.92, 0.88, 0.91, 0.89, 0.9]
    rows = fleet_runs("Apple M4 Pro", "a", "j1", base, engine="mlx", model=MLX_27B)
    rows += fleet_runs("Apple M4 Pro", "b", "j2", variant, **{"engine": "mlx", "model": MLX_27B, **VARIANTS[key]})
    runs = pd.DataFrame(rows)
    out = claims.evaluate(c, runs, jobs_of(runs)).set_index("group")
    con = duckdb.connect()
    register_runs(con, runs)
    truth = speedup.speedups(con).set_index("comparable")
    assert len(truth) == 2  # the definition itself keeps them apart
    if key == "engine":  # the claim's conditions name one engine: the other group is not its
        assert list(out.index) == [truth.index[truth["engine"] == "mlx"][0]]
    else:
        assert sorted(out.index) == sorted(truth.index)
        assert out["differs"].str.startswith(f"{key}=").all()
        assert out["verdict"].tolist() == [
            REPRODUCED if truth.loc[g, "speedup"] < 0.85 else CONTRADICTED for g in out.index
        ]
    for g, r in out.iterrows():
        assert r["figure"] == pytest.approx(truth.loc[g, "speedup"])
        assert (r["machines"], r["prompts"], r["runs"]) == (1, 6, 6)
    assert out["figure"].min() == pytest.approx(geometric(base))
