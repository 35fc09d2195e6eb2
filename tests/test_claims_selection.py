"""Exact claim selection and the interval rules on seeded fleets: each claim selects only the
runs its conditions name (model by reference, system, sampler, chip, prompts), a run of
another system or of our own loop never settles a claim about a system (our loop's stand
beside it), figures of different models are never blended, an interval across the band's edge
is inconclusive, a claim about any Mac needs three machines, and the false-discovery step
across the ledger turns a lone marginal verdict inconclusive among nulls."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pandas as pd
import pytest
import yaml

from dashboard import claims
from specfleet import inference
from specfleet.record import BACKENDS, MAX_DEPTH, ModelIdentity, Sampler, is_method
from specfleet.settings import Settings
from tests.support.claims import GOOD, claim, ours
from tests.support.dashboard import MLX_27B, record, row, sha
from tests.support.fleet import fleet_db, jobs_of

MTPLX_27B = MLX_27B  # Youssofal/Qwen3.6-27B-MTPLX-Optimized-Speed
OPTIQ_27B = ModelIdentity(
    reference="mlx-community/Qwen3.6-27B-OptiQ-4bit",
    digest=sha("optiq-27b"),
    architecture="Qwen3_5ForCausalLM",
    parameters=27_300_000_000,
    quantisation="4bit-g64",
    has_mtp=True,
    source="huggingface",
)
OPTIQ = {1: 1.36, 2: 1.34, 3: 0.94, 4: 0.74}  # the seed's OptiQ figures by depth
OPTIQ_BANDS = {1: (1.22, 1.5), 2: (1.2, 1.48), 3: (0.85, 1.03), 4: (0.67, 0.81)}


def optiq_record(depth: int) -> dict:
    """OptiQ's claim at depth K, as a record would give it once OptiQ's depth option is known: it
    waits in docs/claims.md (the ledger refuses a depth the server's command cannot set), so the
    tests give a hypothetical option (`--depth {depth}`, test data only)."""
    low, high = OPTIQ_BANDS[depth]
    return {
        "id": f"optiq-depth-k{depth}",
        "statement": f"OptiQ Qwen3.6-27B greedy MTP at depth K={depth} gives {OPTIQ[depth]}x.",
        "source": {"file": "seeds/000_1adc8d5e08f1ad2a.txt", "section": "Draft depth", "quote": "K=1 1.36x"},
        "conditions": {"engine": "openai", "system": "OptiQ", "method": "mtp", "models": [OPTIQ_27B.reference],
                       "chip": "Apple*", "depth": depth, "sampler": {"temperature": 0}},
        "metric": "speedup",
        "expected": f"{OPTIQ[depth]}x",
        "verdict": {"rule": "range", "low": low, "high": high},
        "sweep": {"target": OPTIQ_27B.reference,
                  "arm_command": "optiq serve --model {model} --mtp --depth {depth} --port {port}"},
    }  # fmt: skip


def optiq_k(depth: int) -> claims.Claim:
    return claims.parse_claims(yaml.safe_dump([optiq_record(depth)]))[0]


MTPLX = {1: 1.9, 2: 2.3, 3: 2.6, 4: 2.1}
MACS = ("mini-1", "mini-2", "mini-3")


def job_rows(chip, agent, job, model, by_depth, prompts=5, rng=None, engine="mlx", method="mtp", **fields):
    """One machine's job: per prompt a baseline at 20 tok/s and the arm at each depth at 20 x
    its ratio (times a little per-prompt noise when rng is given)."""
    rows = []
    for p in range(prompts):
        common = dict(engine=engine, target=model, prompt_id=f"p{p}", **fields)
        rows.append(row(record(job, "baseline", 0, 20.0, **common), agent, chip))
        for depth, ratio in by_depth.items():
            noise = 1.0 if rng is None else math.exp(rng.normal(0, 0.01))
            rows.append(row(record(job, method, depth, 20.0 * ratio * noise, **common), agent, chip))
    return rows


def frame(rows) -> pd.DataFrame:
    return pd.DataFrame(rows)


MTPLX_SERVER = dict(engine="openai", system="MTPLX")
OPTIQ_SERVER = dict(engine="openai", system="OptiQ")


# ---------------------------------------------------------------- models are never blended


@pytest.fixture(scope="module")
def blended():
    """Three M4 Pros, each running both Qwen3.6-27B builds in our own loop: MTPLX's optimised
    pack and OptiQ."""
    rng = np.random.default_rng(11)
    rows = []
    for i, agent in enumerate(MACS):
        level = 1 + 0.01 * (i - 1)  # machines differ a little in level
        metal = dict(rng=rng, backend="metal")  # MLX on a Mac's GPU, as the Metal claims name it
        rows += job_rows(
            "Apple M4 Pro", agent, f"mtplx-{agent}", MTPLX_27B, {d: r * level for d, r in MTPLX.items()}, **metal
        )
        rows += job_rows(
            "Apple M4 Pro", agent, f"optiq-{agent}", OPTIQ_27B, {d: r * level for d, r in OPTIQ.items()}, **metal
        )
    runs = frame(rows)
    return runs, jobs_of(runs)


@pytest.mark.parametrize("depth", sorted(OPTIQ))
def test_optiq_claims_select_only_the_optiq_model(blended, depth):
    runs, jobs = blended
    c = claims.our_loop(optiq_k(depth))  # the claim on our loop, as it stands beside OptiQ's verdict
    matched = claims.matching_runs(c, fleet_db(runs))
    assert set(matched["target_reference"]) == {OPTIQ_27B.reference}
    assert len(matched) == len(MACS) * 5 * 2  # each machine's baselines and arm at this depth
    out = claims.evaluate(c, fleet_db(runs, jobs))
    assert len(out) == 1  # one comparable group: the MTPLX build is not in it
    r = out.iloc[0]
    assert r["figure"] == pytest.approx(OPTIQ[depth], rel=0.02)
    assert (r["machines"], r["prompts"], r["runs"]) == (3, 5, 15)
    assert r["verdict"] == inference.REPRODUCED and r["ci_low"] < OPTIQ[depth] < r["ci_high"]
    sel = claims.selection(c, fleet_db(runs))
    assert sel["models"] == [OPTIQ_27B.reference] and sel["systems"] == ["specfleet mlx"]
    assert sel["excluded"]["models"] == len(MACS) * 5 * 5  # every MTPLX-build run, baselines included
    # the claim itself is OptiQ's: our loop's runs never settle it, and stand beside it on its model only
    r = claims.evaluate(optiq_k(depth), fleet_db(runs, jobs)).iloc[0]
    assert (r["verdict"], r["runs"]) == (inference.INCONCLUSIVE, 0) and r["why"].startswith("no runs of OptiQ")
    ours_figure = f"{claims.evaluate(c, fleet_db(runs, jobs)).iloc[0]['figure']:.3g}"
    assert r["beside"].startswith(f"our loop, same weights (specfleet mlx mtp) on Apple M4 Pro: {ours_figure} [")


def test_mtplx_claims_select_no_run_of_our_loop_and_show_it_beside(blended):
    runs, jobs = blended
    c = claim("mtplx-2-3x")
    r = claims.evaluate(c, fleet_db(runs, jobs)).iloc[0]
    assert (r["verdict"], r["runs"], r["chip"]) == (inference.INCONCLUSIVE, 0, "any Mac")
    assert r["why"].startswith("no runs of MTPLX (openai) mtp")
    # beside it, never as the verdict: our loop on the MTPLX build only (2.6x, not blended with OptiQ's 0.94x)
    assert r["beside"].startswith("our loop, same weights (specfleet mlx mtp) on Apple M4 Pro: 2.6")
    excluded = claims.selection(c, fleet_db(runs))["excluded"]
    assert excluded["engine"] == excluded["system"] == len(runs)
    mine = ours("mtplx-2-3x")
    assert set(claims.matching_runs(mine, fleet_db(runs))["target_reference"]) == {MTPLX_27B.reference}
    r = claims.evaluate(mine, fleet_db(runs, jobs)).iloc[0]
    assert r["figure"] == pytest.approx(MTPLX[3], rel=0.02) and r["verdict"] == inference.REPRODUCED


@pytest.fixture(scope="module")
def systems():
    """Three M4 Pros running the MTPLX build three ways: MTPLX's own server (its speedups),
    OptiQ's server (another system, on the same engine and weights), and our own MLX loop."""
    rng = np.random.default_rng(12)
    rows = []
    for agent in MACS:
        rows += job_rows("Apple M4 Pro", agent, f"mtplx-{agent}", MTPLX_27B, {3: 2.6}, rng=rng, **MTPLX_SERVER)
        rows += job_rows("Apple M4 Pro", agent, f"optiq-{agent}", MTPLX_27B, {3: 1.3}, rng=rng, **OPTIQ_SERVER)
        rows += job_rows("Apple M4 Pro", agent, f"ours-{agent}", MTPLX_27B, {3: 1.8}, rng=rng)
    runs = frame(rows)
    return runs, jobs_of(runs)


def test_a_system_claim_is_settled_by_that_system_only(systems):
    runs, jobs = systems
    c = claim("mtplx-2-3x")
    matched = claims.matching_runs(c, fleet_db(runs))
    assert set(matched["system"]) == {"MTPLX"} and set(matched["engine"]) == {"openai"}
    assert set(matched["job_id"]) == {f"mtplx-{agent}" for agent in MACS}
    out = claims.evaluate(c, fleet_db(runs, jobs))
    assert len(out) == 1
    r = out.iloc[0]
    assert r["figure"] == pytest.approx(2.6, rel=0.02) and r["verdict"] == inference.REPRODUCED
    assert (r["machines"], r["runs"]) == (3, 15)
    # our loop beside it, even though the system has runs of its own; OptiQ's server in neither
    assert r["beside"].startswith("our loop, same weights (specfleet mlx mtp) on Apple M4 Pro: 1.8")
    assert "3 machine(s)" in r["beside"]
    sel = claims.selection(c, fleet_db(runs))
    assert sel["systems"] == ["MTPLX (openai)"] and sel["of_system"] == len(MACS) * 5
    assert sel["excluded"]["system"] == 2 * len(MACS) * 5 * 2  # OptiQ's and our loop's, baselines included
    # a claim about OptiQ on the same weights is OptiQ's runs' alone
    optiq = claims.parse_claims(
        yaml.safe_dump(
            [
                {
                    **GOOD,
                    "conditions": {**c.conditions, "system": "OptiQ", "chip": None},
                    "verdict": {"rule": "range", "low": 1.2, "high": 1.4},
                    "sweep": {"arm_command": optiq_record(3)["sweep"]["arm_command"]},  # sets the depth
                }
            ]
        )
    )[0]
    r = claims.evaluate(optiq, fleet_db(runs, jobs)).iloc[0]
    assert r["figure"] == pytest.approx(1.3, rel=0.02) and r["verdict"] == inference.REPRODUCED
    assert set(claims.matching_runs(optiq, fleet_db(runs))["system"]) == {"OptiQ"}


def test_best_depth_of_one_model_with_its_confidence_set(blended):
    runs, jobs = blended
    r = claims.evaluate(claim("depth-1-3-optimal-on-metal"), fleet_db(runs, jobs)).iloc[0]
    assert r["figure"] == 1 and r["runs"] == len(MACS) * 5 * 4  # OptiQ's depths 1-4 only
    assert r["verdict"] == inference.REPRODUCED and r["tested"] and r["p_value"] <= 0.05
    assert 0.95 <= r["probability"] <= 1 and "95% set for the best depth" in r["why"]


# ---------------------------------------------------------------- the interval rule


def test_an_interval_across_the_band_edge_is_inconclusive():
    c = optiq_k(1)  # band 1.22-1.5, OptiQ's server
    rows = []
    for agent, ratio in zip(MACS, (1.16, 1.22, 1.28)):  # the truth at the band's lower edge
        rng = np.random.default_rng(1)
        rows += job_rows("Apple M4 Pro", agent, f"j-{agent}", OPTIQ_27B, {1: ratio}, rng=rng, **OPTIQ_SERVER)
    runs = frame(rows)
    r = claims.evaluate(c, fleet_db(runs)).iloc[0]
    assert r["ci_low"] < 1.22 < r["ci_high"] < 1.5
    assert (r["verdict"], r["machines"], r["tested"], r["p_value"]) == (inference.INCONCLUSIVE, 3, True, 1.0)
    assert "reaches across an edge of 1.22-1.5x" in r["why"] and "3 machine(s), fewest 5 prompt(s)" in r["why"]


def test_a_claim_about_any_mac_needs_the_simulated_minimum_of_machines():
    c = optiq_k(1)
    assert c.rule.min_machines == claims.MIN_MACHINES_FLEET == 3  # bench/verdicts.py section crossed
    rng = np.random.default_rng(2)
    one = frame(job_rows("Apple M4 Pro", MACS[0], "j-0", OPTIQ_27B, {1: 1.35}, rng=rng, **OPTIQ_SERVER))
    r = claims.evaluate(c, fleet_db(one)).iloc[0]
    assert (r["verdict"], r["machines"], r["tested"]) == (inference.INCONCLUSIVE, 1, False)
    assert r["why"].startswith("inconclusive: 1 of 3 machines; the figure 1.35x")  # the figure is shown
    rows = []
    for agent, ratio in zip(MACS, (1.35, 1.37, 1.36)):
        rows += job_rows("Apple M4 Pro", agent, f"j-{agent}", OPTIQ_27B, {1: ratio}, rng=rng, **OPTIQ_SERVER)
    runs = frame(rows)
    # two machines, one fewer than the minimum: the figure is shown, untested
    two = runs[runs["agent_id"] != MACS[2]]
    r = claims.evaluate(c, fleet_db(two)).iloc[0]
    assert (r["verdict"], r["machines"], r["tested"]) == (inference.INCONCLUSIVE, 2, False)
    assert r["why"].startswith("inconclusive: 2 of 3 machines; the figure 1.3")
    r = claims.evaluate(c, fleet_db(runs)).iloc[0]
    assert r["machines"] == 3 and r["tested"] and not r["why"].startswith("inconclusive: 3 of")
    # min_machines in the record may raise the minimum
    k1 = optiq_record(1)
    four = claims.parse_claims(yaml.safe_dump([{**k1, "verdict": {**k1["verdict"], "min_machines": 4}}]))[0]
    r = claims.evaluate(four, fleet_db(runs)).iloc[0]
    assert r["why"].startswith("inconclusive: 3 of 4 machines") and not r["tested"]


# ---------------------------------------------------------------- every ledger claim selects exactly


def _sampler(values: dict) -> Sampler:
    return Sampler(**{k: int(v) if k in ("top_k", "seed") else float(v) for k, v in values.items()})


# The ledger's conditions as its file says them, read as plain YAML and not through
# claims.parse_claims: the runs a claim must select are built from what the record names, so that a
# parser or selector that drops or ignores a condition selects a decoy and fails the test.
RAW_CONDITIONS = {r["id"]: r["conditions"] for r in yaml.safe_load(claims.LEDGER.read_text())}


def _named(c: claims.Claim) -> dict:
    """The conditions the claim's record names (a null value names none)."""
    return {k: v for k, v in RAW_CONDITIONS[c.id].items() if v is not None}


def _other_value(setting, values: list):
    """A valid value of a declared setting outside `values`."""
    choices = setting.choices or (BACKENDS[1:] if setting.name == "backend" else ())  # the record's own list
    if choices:  # every choice named (reasoning on and off): a run that recorded none is outside
        return next((x for x in choices if x not in values), None)
    if setting.type is int:
        return max((v for v in values if v is not None), default=int(setting.lo or 0)) + 1
    if setting.type is bool:
        return not values[0] if values else True
    return "another-" + "-".join(map(str, values))


def _wanted(c: claims.Claim) -> dict:
    """A run's fields inside every condition the claim's record names."""
    cond = _named(c)
    engine = cond["engine"]
    gguf = engine in ("llama.cpp", "llama-server")
    ref = (cond.get("models") or ["Some-Model-Q8_0.gguf" if gguf else "some-org/Some-Model-4bit"])[0]
    model = ModelIdentity(
        reference=ref,
        digest=(cond.get("digests") or [sha(ref)])[0],
        architecture=cond.get("architecture") or "Qwen3_5ForCausalLM",
        quantisation=cond.get("quantisation") or "4bit-g64",
        source="huggingface" if "/" in ref else "local",
    )
    chip = cond.get("chip") or "Apple M4 Pro"
    return dict(
        engine=engine,
        system=c.system,
        method=c.method,
        model=model,
        chip="Apple M4 Pro" if chip == "Apple*" else chip,
        sampler=_sampler(cond.get("sampler") or {}),
        prompt_category=(claims._as_list(cond.get("prompt_category")) or ["code"])[0],
        context_tokens=(claims._as_list(cond.get("context_tokens")) or [0])[0],
        depth=claims.sweep_depths(c)[0],
        backend=(claims._as_list(cond.get("backend")) or [""])[0],
        settings=Settings(
            **{
                name: claims._as_list(cond[name])[0]
                for name in claims.DECLARED_CONDITIONS
                if name in cond and name in Settings.__dataclass_fields__
            }
        ),
    )


def _another_system(c: claims.Claim, w: dict) -> dict:
    """The claim's run as another system would record it: another OpenAI-compatible server on
    the same engine for a claim about one, else an OpenAI-compatible server (its engine then
    differs too: our loops and llama-server are one system each)."""
    if c.engine == "openai":
        return dict(w, system="oMLX" if c.system != "oMLX" else "MTPLX")
    method = c.method if is_method("openai", c.method) else "mtp"
    return dict(w, engine="openai", system="MTPLX", method=method, depth=max(w["depth"], 1))  # its depths: 1-64


def _another_engine(c: claims.Claim, w: dict) -> dict:
    """The claim's run on another engine: for a claim about our loops, our other loop; for a
    claim about another system, our loop of the same method (what stands beside it)."""
    ours = claims.our_loop(c)
    if ours is not None:
        return dict(w, engine=ours.engine, system=claims.OURS, method=ours.method)
    if (c.engine, c.method) in claims.OUR_LOOP:  # a depth our loop has no arm of (llama-server's 0)
        engine, method = claims.OUR_LOOP[(c.engine, c.method)]
        return dict(w, engine=engine, system=claims.OURS, method=method, depth=max(w["depth"], 1))
    other = "mlx" if w["engine"] == "llama.cpp" else "llama.cpp"
    assert is_method(other, c.method)
    return dict(w, engine=other)


def _variants(c: claims.Claim, w: dict) -> list[tuple[str, dict, bool]]:
    """(name, fields, selected?): one change each. A change in a condition the claim names is a
    decoy; a change in one it leaves out must still be selected."""
    cond = _named(c)
    sibling = dataclasses.replace(
        w["model"], reference=w["model"].reference.replace("-", "-DWQ-", 1), digest=sha("sibling")
    )
    other_sampler = Sampler(temperature=0.7 if w["sampler"].temperature == 0 else 0.0, top_p=0.8, top_k=40, seed=3)
    out = [
        ("engine", _another_engine(c, w), False),
        ("system", _another_system(c, w), False),
        ("models", dict(w, model=sibling), not (cond.get("models") or cond.get("digests"))),
        ("sampler", dict(w, sampler=other_sampler), not cond.get("sampler")),
        ("prompt_category", dict(w, prompt_category="math"), cond.get("prompt_category") is None),
        ("context_tokens", dict(w, context_tokens=4096), cond.get("context_tokens") is None),
        ("chip", dict(w, chip="AMD EPYC" if cond.get("chip") == "Apple*" else "Apple M3"), not cond.get("chip")),
    ]
    if cond.get("quantisation"):
        out.append(("quantisation", dict(w, model=dataclasses.replace(w["model"], quantisation="Q4_0")), False))
    # another depth: a decoy where the claim names its depths; selected by a claim of any depth
    out.append(("depth", dict(w, depth=max(c.depths or [1]) % MAX_DEPTH + 1), "depth" not in cond))
    # every declared condition (specfleet/settings.py: threads, backend, kv_cache_type, ...): a
    # decoy where the record names it; where it does not, another value on the claim's engine is selected
    for name, setting in claims.DECLARED_CONDITIONS.items():
        named = name in cond
        if not named and w["engine"] not in setting.engines:
            continue
        value = _other_value(
            setting, claims._as_list(cond.get(name)) if named else [w.get(name, getattr(w["settings"], name, None))]
        )
        if name in Settings.__dataclass_fields__:
            out.append((name, dict(w, settings=dataclasses.replace(w["settings"], **{name: value})), not named))
        else:
            out.append((name, dict(w, **{name: value}), not named))
    return out


def _baseline_file(c: claims.Claim, model: ModelIdentity) -> ModelIdentity:
    """The file a claim with baseline_models (the source's non-MTP GGUF) pairs `model`'s arm
    with: the claim's baseline file for its own model, another file for a decoy's; the model's
    other fields kept, so a decoy's quantisation is its baseline's too."""
    ref = c.baseline_models[0] if model.reference in _named(c).get("models", []) else "Other-" + c.baseline_models[0]
    return dataclasses.replace(model, reference=ref, digest=sha("baseline " + model.digest))


def _job(name: str, f: dict, c: claims.Claim) -> pd.DataFrame:
    """A job of the run `f` on one machine; for a claim with baseline_models, also that
    machine's job of the baseline file (job-<name>-plain), its baselines alone."""

    def rows_of(job: str, model: ModelIdentity) -> list[dict]:
        return job_rows(
            f["chip"],
            f"agent-{name}",
            job,
            model,
            {f["depth"]: 1.1},
            prompts=2,
            engine=f["engine"],
            method=f["method"],
            system=f["system"],
            sampler=f["sampler"],
            prompt_category=f["prompt_category"],
            prompt_set=f["prompt_category"],
            context_tokens=f["context_tokens"],
            backend=f["backend"],
            settings=f["settings"],
        )

    rows = rows_of(f"job-{name}", f["model"])
    if c.baseline_models:
        plain = rows_of(f"job-{name}-plain", _baseline_file(c, f["model"]))
        rows += [r for r in plain if r["method"] == "baseline"]
    runs = frame(rows)
    # a server's runs carry its own clock's figure too (its final timings), as llama-server's do
    served = runs["system"] != "specfleet"
    runs.loc[served, "server_decode_tokens_per_second"] = runs.loc[served, "decode_tokens_per_second"]
    return runs


@pytest.mark.parametrize("c", claims.load_claims(), ids=lambda c: c.id)
def test_every_claim_selects_exactly_the_runs_its_conditions_name(c):
    w = _wanted(c)
    variants = _variants(c, w)
    fleet = pd.concat([_job("wanted", w, c)] + [_job(name, f, c) for name, f, _ in variants], ignore_index=True)
    matched = claims.matching_runs(c, fleet_db(fleet))
    expected = {"job-wanted"} | {f"job-{name}" for name, _, selected in variants if selected}
    arm = matched[matched["method"] == c.method]
    assert set(arm["job_id"]) == expected and len(arm) == 2 * len(expected)
    assert set(matched["system"]) == {c.system} and set(matched["engine"]) == {c.engine}
    # baselines pair only within their own job, so another depth's job keeps its baselines
    baselines = expected | ({"job-depth"} if c.depths else set())
    if c.baseline_models:  # the source's baseline file's, never the arm's own file's
        baselines = {f"{job}-plain" for job in baselines}
    assert set(matched.loc[matched["method"] == "baseline", "job_id"]) == baselines
    assert len(matched) == len(arm) + 2 * len(baselines)
    sel = claims.selection(c, fleet_db(fleet))
    assert sel["selected"] == len(matched) and sel["fleet"] == len(fleet)
    for name, _, selected in variants:  # each decoy is left out by its own condition, and counted
        if selected:
            continue
        left_out = sum(n for k, n in sel["excluded"].items() if k == name or k.startswith(name + "."))
        assert left_out >= (2 if name == "depth" else 4), (name, sel["excluded"])  # a depth leaves baselines in
    out = claims.evaluate(c, fleet_db(fleet))
    if c.metric not in ("runs", "acceptance_rate"):
        assert (out["runs"] > 0).any()  # the wanted job is settled...
        assert out["machines"].max() <= len(expected)  # ...with none of the decoys in it
    # our loop of the same method on the same weights (the engine decoy of a claim about another
    # system) stands beside the verdict, never in it
    beside = out["beside"].iloc[0]
    if c.system == claims.OURS or claims.our_loop(c) is None:
        assert beside == ""
    elif c.metric != "acceptance_rate":  # the decoys record no draft counts
        assert beside.startswith(f"our loop, same weights ({claims.our_loop(c).label}) on {w['chip']}: ")
        assert beside.endswith("1 machine(s)")  # the engine decoy's one machine, none of the others


# ---------------------------------------------------------------- the false-discovery step


def _chip_runs(chip: str, levels, prompts: int = 5, seed: int = 0) -> list[dict]:
    rng = np.random.default_rng(seed)
    model = ModelIdentity(reference="some-org/M", digest=sha("m"), source="huggingface")
    rows = []
    for i, level in enumerate(levels):
        agent = f"{chip}-{i}"
        for p in range(prompts):
            common = dict(target=model, prompt_id=f"p{p}")
            rows.append(row(record(f"{agent}-j", "baseline", 0, 20.0, **common), agent, chip))
            ratio = math.exp(level + rng.normal(0, 0.005))
            rows.append(row(record(f"{agent}-j", "mtp", 2, 20.0 * ratio, **common), agent, chip))
    return rows


def _fleet_claim(low: float, high: float) -> claims.Claim:
    cond = {"engine": "mlx", "method": "mtp", "depth": 2, "chip": None}
    rec = {**GOOD, "conditions": cond, "verdict": {"rule": "range", "low": low, "high": high}}
    return claims.parse_claims(yaml.safe_dump([rec]))[0]


def test_the_false_discovery_step_turns_a_lone_marginal_verdict_inconclusive():
    marginal = frame(_chip_runs("Chip 00", [0.17, 0.20, 0.23], seed=1))
    wide = claims.evaluate(_fleet_claim(0.5, 2.0), fleet_db(marginal)).iloc[0]
    # a band just wider than the interval: reproduced alone, with a p-value just under 0.025
    low, high = float(wide["ci_low"]) / 1.003, float(wide["ci_high"]) * 1.003
    c = _fleet_claim(low, high)
    alone = claims.evaluate_all([c], fleet_db(marginal)).iloc[0]
    assert alone["verdict"] == alone["adjusted_verdict"] == inference.REPRODUCED
    assert 0.01 < alone["p_value"] < 0.025 and alone["adjusted_p"] == pytest.approx(alone["p_value"])
    # nineteen more chips whose truth sits on the band's lower edge: tested, inconclusive, p 1
    edge = math.log(low)
    nulls = [_chip_runs(f"Chip {k:02d}", [edge - 0.05, edge, edge + 0.05], seed=k) for k in range(1, 20)]
    fleet = frame(_chip_runs("Chip 00", [0.17, 0.20, 0.23], seed=1) + sum(nulls, []))
    out = claims.evaluate_all([c], fleet_db(fleet)).set_index("chip")
    assert len(out) == 20 and out["tested"].all()
    assert (out.drop(index="Chip 00")["verdict"] == inference.INCONCLUSIVE).all()
    m = out.loc["Chip 00"]
    assert m["verdict"] == inference.REPRODUCED  # the raw verdict, shown beside...
    assert m["adjusted_verdict"] == inference.INCONCLUSIVE  # ...the one that stands
    # Benjamini-Yekutieli (decisions share runs: valid under any dependence): p x 20 x (1 + 1/2 + ... + 1/20)
    harmonic = sum(1 / i for i in range(1, 21))
    assert m["adjusted_p"] == pytest.approx(min(1.0, m["p_value"] * 20 * harmonic)) and m["adjusted_p"] > claims.FDR_Q
    assert "false-discovery step over 20 tested decisions" in m["why"]


def test_identical_decisions_enter_the_false_discovery_step_once():
    """The same claim twice (or two claims with one band on the same runs) is one decision: the
    family does not grow, and both rows get the same adjusted verdict."""
    marginal = frame(_chip_runs("Chip 00", [0.17, 0.20, 0.23], seed=1))
    wide = claims.evaluate(_fleet_claim(0.5, 2.0), fleet_db(marginal)).iloc[0]
    c = _fleet_claim(float(wide["ci_low"]) / 1.003, float(wide["ci_high"]) * 1.003)
    twice = claims.evaluate_all([c, c], fleet_db(marginal))
    assert len(twice) == 2 and (twice["adjusted_verdict"] == inference.REPRODUCED).all()
    assert twice["adjusted_p"].tolist() == pytest.approx([twice["p_value"].iloc[0]] * 2)  # a family of one
