"""The claims ledger: every record checks, every sweep parses, verdicts from known runs, and a
malformed record is refused with its field named."""

import dataclasses

import duckdb
import numpy as np
import pandas as pd
import pytest
import yaml

from coordinator.sweeps import parse_sweep
from dashboard import claims, stats
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
    reference="Qwen3.5-9B-Q4_K_M.gguf",
    digest=sha("q9b"),
    architecture="qwen35",
    parameters=9_400_000_000,
    quantisation="Q4_K_M",
)


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


def geometric(*machines):
    """specfleet's speedup by hand: a geometric mean per machine, then over machines (one
    repeat per prompt)."""
    return float(np.exp(np.mean([np.mean(np.log(m)) for m in machines])))


def test_m1_max_net_loss_reproduced_contradicted_and_not_enough():
    c = claim("llamacpp-mtp-m1-max-net-loss-n2")
    loss = pd.DataFrame(
        fleet_runs("Apple M1 Max", "mbp-1", "j1", [0.86, 0.88, 0.87, 0.85])
        + fleet_runs("Apple M1 Max", "mbp-2", "j2", [0.9, 0.87, 0.86, 0.5], degraded={3})
    )
    row = claims.evaluate(c, loss, jobs_of(loss)).iloc[0]
    assert (row["chip"], row["verdict"]) == ("Apple M1 Max", stats.REPRODUCED)
    assert row["figure"] == pytest.approx(geometric([0.86, 0.88, 0.87, 0.85], [0.9, 0.87, 0.86]))
    assert (row["machines"], row["prompts"], row["runs"], row["excluded_runs"]) == (2, 3, 7, 1)
    assert row["ci_low"] < row["figure"] < row["ci_high"] < 1.0

    win = pd.DataFrame(fleet_runs("Apple M1 Max", "mbp-1", "j1", [1.2, 1.25, 1.22, 1.18, 1.21, 1.24]))
    assert claims.evaluate(c, win, jobs_of(win)).iloc[0]["verdict"] == stats.CONTRADICTED

    few = pd.DataFrame(fleet_runs("Apple M1 Max", "mbp-1", "j1", [0.8, 0.82]))
    row = claims.evaluate(c, few, jobs_of(few)).iloc[0]
    assert (row["verdict"], row["machines"], row["runs"]) == (stats.NOT_ENOUGH, 1, 2)


def test_runs_outside_the_conditions_do_not_count():
    c = claim("llamacpp-mtp-m1-max-net-loss-n2")
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
        # the name says 9B, the weights hold 27B parameters
        + fleet_runs("Apple M1 Max", "f", "j7", ratios, model=dataclasses.replace(Q9B, parameters=27 * 10**9))
    )
    out = claims.evaluate(c, other, jobs_of(other))
    assert out["chip"].tolist() == ["Apple M1 Max"] and out.iloc[0]["runs"] == 0
    assert out.iloc[0]["verdict"] == stats.NOT_ENOUGH


def test_model_family_and_quantisation_read_the_recorded_model():
    c = claim("llamacpp-mtp-m1-max-net-loss-n2")  # qwen3.5-9b, q4_k_m

    def matched(model):
        return len(claims.matching_runs(c, pd.DataFrame(fleet_runs("Apple M1 Max", "a", "j1", [0.8] * 6, model=model))))

    assert matched(Q9B) == 12
    # the file name does not say qwen3.5-9b, and the recorded architecture (qwen35) cannot
    plain = ModelIdentity(reference="model.gguf", digest=sha("plain"), architecture="qwen35", quantisation="Q4_K_M")
    assert matched(plain) == 0
    # an unrecorded size (0) does not contradict the name
    assert matched(dataclasses.replace(plain, reference="Qwen3.5-9B-MTP.gguf")) == 12
    # a quantisation the record leaves unknown never matches one the claim names, whatever the name says
    assert matched(dataclasses.replace(Q9B, quantisation="")) == 0
    # a family that names the architecture matches it in either format's spelling
    family = claims.parse_claims(
        yaml.safe_dump(
            [{**GOOD, "conditions": {"engine": "llama.cpp", "method": "mtp", "depth": 2, "model_family": "qwen3_5"}}]
        )
    )[0]
    for model in (plain, MLX_27B):  # "qwen35" (GGUF), "Qwen3_5ForCausalLM" (Hugging Face)
        runs = pd.DataFrame(fleet_runs("Apple M1 Max", "a", "j1", [0.8] * 6, model=model))
        assert len(claims.matching_runs(family, runs)) == 12
    assert claims.family_size("qwen3.6-35b-a3b") == 35e9 and claims.family_size("0.8b") == 0.8e9
    assert claims.family_size("qwen35") is None


def test_acceptance_and_prefill_claims():
    acc = claim("matched-truncation-acceptance")
    model = ModelIdentity(reference="Qwen3.5-9B-MTP-4bit", digest=sha("9b-mlx"), quantisation="4bit-g64")
    rows = fleet_runs(
        "Apple M4 Pro",
        "mini",
        "j1",
        [1.2] * 6,
        engine="mlx",
        depth=3,
        model=model,
        sampler=Sampler(temperature=1.0, top_p=0.95, top_k=20),
    )
    for r in rows:
        if r["method"] == "mtp":
            r["tokens_drafted"], r["tokens_accepted"] = 100, 62
    row = claims.evaluate(acc, pd.DataFrame(rows), jobs_of(pd.DataFrame(rows))).iloc[0]
    assert (row["verdict"], row["figure"], row["runs"]) == (stats.REPRODUCED, pytest.approx(0.62), 6)

    pre = claim("mtp-cuts-prefill-m2-ultra")
    rows = fleet_runs("Apple M2 Ultra", "studio", "j1", [1.1] * 6, depth=3)
    for r in rows:
        if r["method"] == "mtp":
            r["prefill_tokens_per_second"] = 1660.0  # the baselines': 2000
    row = claims.evaluate(pre, pd.DataFrame(rows), jobs_of(pd.DataFrame(rows))).iloc[0]
    assert (row["verdict"], row["figure"]) == (stats.REPRODUCED, pytest.approx(0.83))


def test_absence_claim_is_contradicted_by_the_first_mac_run():
    c = claim("no-mac-ngram-mod-benchmark")
    assert claims.evaluate(c, pd.DataFrame(), jobs_of(pd.DataFrame())).iloc[0]["verdict"] == stats.REPRODUCED
    linux = pd.DataFrame(fleet_runs("AMD EPYC", "box", "j1", [1.05] * 3, method="ngram", depth=3))
    assert claims.evaluate(c, linux, jobs_of(linux)).iloc[0]["verdict"] == stats.REPRODUCED  # not a Mac
    mac = pd.DataFrame(fleet_runs("Apple M3", "air", "j2", [1.05] * 3, method="ngram", depth=3))
    row = claims.evaluate(c, mac, jobs_of(mac)).iloc[0]
    assert (row["chip"], row["verdict"], row["machines"], row["runs"]) == ("Apple M3", stats.CONTRADICTED, 1, 3)


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
                    "verdict": {"rule": "range", "low": 0.75, "high": 0.85, "min_runs": 6},
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
            stats.REPRODUCED if truth.loc[g, "speedup"] < 0.85 else stats.CONTRADICTED for g in out.index
        ]
    for g, r in out.iterrows():
        assert r["figure"] == pytest.approx(truth.loc[g, "speedup"])
        assert (r["machines"], r["prompts"], r["runs"]) == (1, 6, 6)
    assert out["figure"].min() == pytest.approx(geometric(base))
