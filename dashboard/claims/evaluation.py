"""Verdicts: each claim's rows per comparable group and chip (and depth) from its selected
runs, by specfleet/inference.py's rules, and the false-discovery step across the ledger."""

from __future__ import annotations

import dataclasses
import math
import re
from dataclasses import replace

import duckdb
import numpy as np
import pandas as pd

from dashboard.claims.claim import FDR_Q, OURS, RUN_VALUES, SPEEDS, Claim, our_loop
from dashboard.claims.selection import (
    _FLEET,
    _chip_label,
    _matched,
    conditions_sql,
    has_runs,
    selection,
    selection_text,
)
from specfleet import inference, speedup, versions

VERDICT_COLUMNS = [
    "claim",
    "chip",
    "group",
    "verdict",
    "adjusted_verdict",
    "figure",
    "ci_low",
    "ci_high",
    "machines",
    "prompts",
    "runs",
    "excluded_runs",
    "unsteady_runs",
    "differs",
    "p_value",
    "adjusted_p",
    "tested",
    "probability",
    "why",
    "beside",
]
NAN = float("nan")


def _short(value) -> str:
    """A checked key's value as the page shows it: a SHA-256 by its first 12 hex digits."""
    text = str(value)
    return text[:12] if re.fullmatch(r"[0-9a-f]{64}", text) else text


def _from_decision(d: inference.Decision, runs: int | None = None, figure: float | None = None) -> dict:
    return dict(
        verdict=d.verdict,
        figure=d.speedup if figure is None else figure,
        ci_low=d.low,
        ci_high=d.high,
        machines=d.machines,
        prompts=d.prompts,
        runs=d.pairs if runs is None else runs,
        p_value=d.p_value,
        tested=d.tested,
        probability=NAN if d.probability is None else d.probability,
        why=d.why,
    )


# The attempts a verdict counts: completed ones only. A leased attempt's runs are real figures
# (the pages show them) but half a machine's prompts; counted, it would pass for a whole machine.
DONE_JOBS = "(SELECT * FROM jobs WHERE state = 'done')"


def _per_prompt(claim: Claim, con, value: str) -> pd.DataFrame:
    """per_prompt_sql on the claim's runs of completed attempts (value: the tok/s column the
    ratio is of), paired across weights where the claim names its baseline's files."""
    sql = speedup.per_prompt_sql("matched", DONE_JOBS, across_weights=bool(claim.baseline_models))
    if value != "decode_tokens_per_second":
        sql = sql.replace("decode_tokens_per_second", value)
    return con.execute(sql).df()


def _excluded(con) -> pd.DataFrame:
    """Arm runs of valid attempts left out as not nominal, per group, chip and depth."""
    return con.execute(
        f"SELECT comparable, chip, depth, count(*) AS excluded_runs FROM {speedup.valid_sql('arm', DONE_JOBS)}"
        " WHERE env_nominal IS NOT DISTINCT FROM false GROUP BY ALL"
    ).df()


def _too_few_runs(claim: Claim, d: inference.Decision, runs: int) -> inference.Decision:
    if runs >= claim.rule.min_runs:
        return d
    why = f"{inference.too_few(runs, claim.rule.min_runs, 'runs')} ({d.why})"
    return replace(d, verdict=inference.INCONCLUSIVE, why=why, tested=False, p_value=1.0)


def _finite(rows: pd.DataFrame) -> tuple[pd.DataFrame, int]:
    """The rows with a finite log ratio, and how many were not (a NaN speed reads as > 0 in SQL)."""
    ok = np.isfinite(rows["log_ratio"].to_numpy(dtype=float))
    return rows[ok], int((~ok).sum())


def _with_dropped(d: inference.Decision, dropped: int) -> inference.Decision:
    return d if not dropped else replace(d, why=f"{d.why}; {dropped} pair(s) with a non-finite ratio left out")


def _ratio_rows(claim: Claim, con, cells: pd.DataFrame) -> list[dict]:
    value = "prefill_tokens_per_second" if claim.metric == "prefill_ratio" else "decode_tokens_per_second"
    pp = _per_prompt(claim, con, value)
    pp = pp[pp["method"] == claim.method]
    excluded = _excluded(con)
    r = claim.rule
    rows = []
    for cell in cells.itertuples():
        mine = pp[(pp["comparable"] == cell.comparable) & (pp["chip"] == cell.chip)]
        gone = excluded[(excluded["comparable"] == cell.comparable) & (excluded["chip"] == cell.chip)]
        where = dict(chip=cell.chip, group=cell.comparable, differs=cell.differs)
        if claim.metric == "best_depth":
            rows_, dropped = _finite(mine[["machine_id", "prompt_id", "depth", "log_ratio", "repeats"]])
            d = inference.decide_best_depth(
                rows_, r.band_low, r.band_high, min_machines=r.min_machines, min_prompts=r.min_prompts
            )
            d = _with_dropped(_too_few_runs(claim, d, d.pairs), dropped)
            figure = NAN if d.best_depth is None else float(d.best_depth)
            row = _from_decision(d, figure=figure)
            if d.best_depth is not None:
                row["why"] += f"; the best depth's speedup {d.speedup:.3g}x, 95% interval {d.low:.3g}-{d.high:.3g}x"
            rows.append(dict(where, **row, excluded_runs=int(gone["excluded_runs"].sum())))
            continue
        for depth in claim.depths:
            at = mine[mine["depth"] == depth]
            at, dropped = _finite(at.drop(columns=["target_reference", "draft_reference", "prompt_set", "engine"]))
            e = inference.estimate(at)
            d = inference.decide(e, r.band_low, r.band_high, r.min_machines, r.min_prompts)
            d = _with_dropped(_too_few_runs(claim, d, e.pairs), dropped)
            row = _from_decision(d)
            row["why"] = (f"K={depth}: " if len(claim.depths) > 1 else "") + row["why"]
            excl = int(gone.loc[gone["depth"] == depth, "excluded_runs"].sum())
            rows.append(dict(where, **row, excluded_runs=excl))
    return rows


def _change_rows(claim: Claim, con) -> list[dict]:
    """A claim about a change between versions (conditions.version {from, to}), settled by the
    version comparison (specfleet/versions.py settle): per setting (group: the setting's id),
    chip and depth, the ratio to / from of its figure, paired by machine, against its band."""
    where, params = conditions_sql(claim)
    per_prompt = con.execute(
        f"SELECT {versions.SETTING_SQL} AS setting, {versions.VERSION_SQL} AS version, chip, method, depth,"
        " machine_id, prompt_id, avg(ln(decode_tokens_per_second)) AS log_tps,"
        f" {versions.ACCEPTANCE_SQL}, count(*) AS repeats,"
        f" min(seq) AS first_seq FROM {speedup.valid_sql(_FLEET, DONE_JOBS)} WHERE {where}"
        " AND decode_tokens_per_second > 0 AND env_nominal IS DISTINCT FROM false AND lossless IS DISTINCT FROM false"
        " GROUP BY ALL",
        params,
    ).df()
    r, rows = claim.rule, []
    change = claim.conditions["version"]
    settled = versions.settle(
        per_prompt, change, claim.metric, claim.method, r.band_low, r.band_high, r.min_machines, r.min_prompts
    )
    for at, d in settled:
        if claim.depths and at["depth"] not in claim.depths:
            continue
        row = _from_decision(_too_few_runs(claim, d, d.pairs))
        row["why"] = f"{at['old']} → {at['new']}, K={at['depth']} ({at['how']}): {row['why']}"
        rows.append(dict(chip=at["chip"], group=at["setting"], differs="", excluded_runs=0, **row))
    if not rows:
        why = f"no setting with runs on both sides of {change['from']} → {change['to']}"
        rows.append(dict(chip=_chip_label(claim.conditions.get("chip")), group="", differs="", excluded_runs=0,
                         machines=0, prompts=0, runs=0, verdict=inference.INCONCLUSIVE, why=why))  # fmt: skip
    return rows


def _mean_rows(claim: Claim, con, cells: pd.DataFrame) -> list[dict]:
    """Acceptance rate or decode tok/s (the client's clock or the server's: SPEEDS) of the arm's
    runs (RUN_VALUES), calibrated as the speedups are. Acceptance: each run's accepted / drafted,
    the mean over a prompt's runs, then machines x prompts crossed on the rate's own scale
    (inference.estimate_mean). Tok/s, whose machines differ by a factor: the same on the log scale,
    as the speedups' (inference.estimate on each prompt's mean log tok/s; the figure is the
    geometric mean; docs/verdicts.md, "Absolute tok/s"). The band rule with its p-values, and the
    false-discovery step with every other verdict. Runs of completed attempts only; runs that
    were not nominal are left out and counted."""
    value, has = RUN_VALUES[claim.metric]
    values = con.execute(
        f"SELECT comparable, chip, depth, machine_id, prompt_id, {value} AS rate, tokens_accepted, tokens_drafted,"
        " env_nominal IS NOT DISTINCT FROM false AS degraded"
        f" FROM {speedup.flagged_sql(speedup.valid_sql('arm', DONE_JOBS))} WHERE {has}"
    ).df()
    r = claim.rule
    rows = []
    for cell in cells.itertuples():
        where = dict(chip=cell.chip, group=cell.comparable, differs=cell.differs)
        for depth in claim.depths:
            at = values[
                (values["comparable"] == cell.comparable) & (values["chip"] == cell.chip) & (values["depth"] == depth)
            ]
            degraded = at["degraded"].fillna(False).astype(bool)
            if claim.metric in SPEEDS:
                logs = at[~degraded].assign(log_ratio=np.log(at.loc[~degraded, "rate"].astype(float)))
                per_prompt = logs.groupby(["machine_id", "prompt_id"], as_index=False).agg(
                    log_ratio=("log_ratio", "mean"), repeats=("log_ratio", "size")
                )
                e = inference.estimate(per_prompt)
            else:
                e = inference.estimate_mean(at[~degraded], "rate")
            d = _too_few_runs(
                claim, inference.decide(e, r.band_low, r.band_high, r.min_machines, r.min_prompts), e.pairs
            )
            row = _from_decision(d)
            if claim.metric in SPEEDS:  # the log scale's figures are speeds, not ratios
                row["why"] = re.sub(r"(\d)x\b", r"\1 tok/s", row["why"]).replace(" pair(s)", " run(s)")
            if claim.metric == "acceptance_rate" and len(at[~degraded]):  # llama-server's own: the pooled ratio
                kept = at[~degraded]
                pooled = float(kept["tokens_accepted"].sum()) / max(float(kept["tokens_drafted"].sum()), 1.0)
                row["why"] += f"; pooled accepted / drafted {pooled:.3f} (the ratio llama-server reports)"
            row["why"] = (f"K={depth}: " if len(claim.depths) > 1 else "") + row["why"]
            rows.append(dict(where, **row, excluded_runs=int(degraded.sum())))
    return rows


def _runs_rows(con, cells: pd.DataFrame) -> list[dict]:
    counts = con.execute(
        "SELECT comparable, chip, count(*) FILTER (WHERE env_nominal IS DISTINCT FROM false) AS runs,"
        " count(*) FILTER (WHERE env_nominal IS NOT DISTINCT FROM false) AS excluded_runs,"
        " count(DISTINCT machine_id) FILTER (WHERE env_nominal IS DISTINCT FROM false) AS machines,"
        " count(DISTINCT prompt_id) FILTER (WHERE env_nominal IS DISTINCT FROM false) AS prompts"
        " FROM arm GROUP BY ALL ORDER BY chip, runs DESC, comparable"
    ).df()
    label = dict(zip(cells["comparable"], cells["differs"]))
    return [
        dict(
            chip=r.chip,
            group=r.comparable,
            verdict=inference.CONTRADICTED,
            figure=float(r.runs),
            machines=int(r.machines),
            prompts=int(r.prompts),
            runs=int(r.runs),
            excluded_runs=int(r.excluded_runs),
            differs=label.get(r.comparable, ""),
            tested=False,
            why=f"the fleet holds {r.runs} run(s) on {r.machines} machine(s)",
        )
        for r in counts.itertuples()
        if r.runs > 0
    ]


def _no_run(claim: Claim, none: dict, sel: dict) -> dict:
    """The one row of a claim no run matches: an absence claim holds, any other is
    inconclusive, saying whether the fleet holds no run of the claim's system at all or none
    on its other conditions, and what the conditions left out."""
    if claim.metric == "runs":
        return dict(none, verdict=inference.REPRODUCED, figure=0.0, why=f"no run of {claim.label} in the fleet yet")
    if claim.system == OURS:
        why = "no run in the fleet matches its conditions"
    elif not sel.get("of_system"):
        why = f"no runs of {claim.label} in the fleet yet"
    else:
        why = f"no run of {claim.label} in the fleet matches its other conditions"
    if sel.get("excluded"):
        why += " (" + selection_text(sel) + ")"
    return dict(none, verdict=inference.INCONCLUSIVE, why=why)


def beside(claim: Claim, con: duckdb.DuckDBPyConnection) -> str:
    """For a claim about another system than ours: our loop of the same method on the same
    weights and the claim's other conditions (our_loop), per chip, as one line ("our loop,
    same weights (specfleet llama.cpp mtp) on Apple M1 Max: 0.87 [0.84, 0.9], 2 machine(s)").
    Shown beside the claim's verdict, never as it; '' when there is no such loop or run."""
    ours = our_loop(claim)
    if ours is None or not has_runs(con):
        return ""
    out = _evaluate(ours, con)
    out = out[out["runs"] > 0]
    parts = []
    for r in out.itertuples():
        depth = r.why.split(": ", 1)[0] + " " if r.why.startswith("K=") else ""
        if claim.metric == "runs":
            parts.append(f"{r.chip}: {r.runs} run(s) on {r.machines} machine(s)")
        elif r.figure == r.figure:
            interval = "" if r.ci_low != r.ci_low else f" [{r.ci_low:.3g}, {r.ci_high:.3g}]"
            parts.append(f"{r.chip}: {depth}{r.figure:.3g}{interval}, {r.machines} machine(s)")
    if not parts:
        return ""
    return f"our loop, same weights ({ours.label}) on " + "; ".join(parts)


def evaluate(claim: Claim, con: duckdb.DuckDBPyConnection) -> pd.DataFrame:
    """One row per comparable group and chip (and depth, for a claim of several) in
    VERDICT_COLUMNS: the verdict, the figure (specfleet.speedup's speedup for ratios), its
    interval, the machines, fewest prompts and runs (pairs, for a ratio) behind it, the runs
    left out as not nominal, the verdict's p-value, and why. Runs that differ in a checked key
    are never pooled: `differs` names each group's values of the keys in which the claim's
    groups differ. `con` holds the runs (`runs`: the typed run columns, RunRecord.columns() and
    the coordinator's, as the mirror holds them) and `jobs` (job_id, attempt, state: which
    attempts are valid); evaluate leaves temporary views and a table on it. Only runs of
    the claim's system settle it; for a claim about another system, `beside` holds our loop's
    figure of the same method on the same weights wherever it has runs (never the verdict).
    adjusted_verdict is the verdict itself here; `evaluate_all` applies the false-discovery
    step across claims."""
    out = _evaluate(claim, con)
    out["beside"] = beside(claim, con)
    return out


def _evaluate(claim: Claim, con: duckdb.DuckDBPyConnection) -> pd.DataFrame:
    pattern = claim.conditions.get("chip")
    none = dict(
        chip=_chip_label(pattern), group="", machines=0, prompts=0, runs=0, excluded_runs=0, unsteady_runs=0, differs=""
    )
    if not has_runs(con):
        return _rows(claim, [_no_run(claim, none, {})])
    _matched(claim, con)
    cells = con.execute(
        "SELECT comparable, chip, count(*) AS runs FROM arm GROUP BY ALL ORDER BY chip, runs DESC, comparable"
    ).df()
    if cells.empty:
        return _rows(claim, [_no_run(claim, none, selection(claim, con))])
    groups = speedup.groups(con, "arm").set_index("comparable")
    differs = speedup.what_differs(groups.reset_index())
    cells["differs"] = ["; ".join(f"{k}={_short(groups.loc[g, k])}" for k in differs) for g in cells["comparable"]]
    if claim.metric == "runs":
        rows = _runs_rows(con, cells)
        if not rows:
            excluded = int(
                con.execute("SELECT count(*) FROM arm WHERE env_nominal IS NOT DISTINCT FROM false").fetchone()[0]
            )
            rows = [dict(_no_run(claim, none, {}), excluded_runs=excluded)]
    elif versions.is_change(claim.conditions.get("version")):
        rows = _change_rows(claim, con)
    elif claim.metric in RUN_VALUES:
        rows = _mean_rows(claim, con, cells)
    else:
        rows = _ratio_rows(claim, con, cells)
    return _with_unsteady(_rows(claim, rows), con)


def _with_unsteady(out: pd.DataFrame, con: duckdb.DuckDBPyConnection) -> pd.DataFrame:
    """unsteady_runs: the claim's runs (its arm's and their baselines') in each row's group and
    chip whose warm-up reached the sweep's cap without two runs within 5% (warmup_converged
    false). They still count; the Questions page flags them."""
    counts = con.execute(
        "SELECT comparable, chip, count(*) AS n FROM matched WHERE warmup_converged IS NOT DISTINCT FROM false"
        " GROUP BY ALL"
    ).fetchall()
    by = {(g, c): int(n) for g, c, n in counts}
    out["unsteady_runs"] = [by.get((g, c), 0) for g, c in zip(out["group"], out["chip"])]
    return out


def _rows(claim: Claim, rows: list[dict]) -> pd.DataFrame:
    defaults = dict(
        figure=NAN, ci_low=NAN, ci_high=NAN, p_value=NAN, tested=False, probability=NAN, beside="", unsteady_runs=0
    )
    out = pd.DataFrame([{**defaults, "claim": claim.id, **r} for r in rows], columns=VERDICT_COLUMNS)
    out["adjusted_verdict"] = out["verdict"]
    out["tested"] = out["tested"].astype(bool)
    return out


def _decision_key(r) -> tuple:
    """What makes two rows one decision: the same runs (group, chip) tested the same way (the same
    p-value and verdict): a claim stated twice, or with the same band twice, counts once."""
    return (r.group, r.chip, r.verdict, round(float(r.p_value), 12) if r.p_value == r.p_value else None)


def adjust(verdicts: pd.DataFrame, q: float = FDR_Q) -> pd.DataFrame:
    """The false-discovery step (inference.adjust) over every tested decision of the frame
    (claims x groups x chips x depths): adjusted_p, and adjusted_verdict, the verdict that stands
    after it (inconclusive when its adjusted p-value exceeds q). Decisions share runs (nested
    bands, the net-loss claims at n2 and n6, thinking on and off), so the step is
    Benjamini-Yekutieli's, valid under any dependence, and identical decisions (_decision_key)
    enter the family once. The raw verdict stays in `verdict`; untested rows keep theirs."""
    out = verdicts.copy()
    keys = [_decision_key(r) for r in out.itertuples()]
    first = {}
    for i, (key, tested) in enumerate(zip(keys, out["tested"])):
        if tested:
            first.setdefault(key, i)
    decisions = [
        inference.Decision(
            verdict=r.verdict,
            why=r.why,
            speedup=NAN,
            low=NAN,
            high=NAN,
            machines=0,
            prompts=0,
            pairs=0,
            band_low=0.0,
            band_high=math.inf,
            p_value=1.0 if r.p_value != r.p_value else float(r.p_value),
            tested=bool(r.tested) and first.get(keys[i]) == i,  # a repeat decision counts once
        )
        for i, r in enumerate(out.itertuples())
    ]
    adjusted = inference.adjust(decisions, q=q, dependent=True)
    for i, key in enumerate(keys):  # a repeat of a decision stands or falls with its first
        if out["tested"].iloc[i] and first.get(key) != i:
            lead = adjusted[first[key]]
            adjusted[i] = dataclasses.replace(
                adjusted[i], verdict=lead.verdict, why=lead.why, adjusted_p=lead.adjusted_p, tested=True
            )
    out["adjusted_verdict"] = [d.verdict for d in adjusted]
    out["adjusted_p"] = [NAN if d.adjusted_p is None else d.adjusted_p for d in adjusted]
    changed = out["adjusted_verdict"] != out["verdict"]
    out.loc[changed, "why"] = [d.why for d, c in zip(adjusted, changed) if c]
    return out


def evaluate_all(claims: list[Claim], con: duckdb.DuckDBPyConnection, q: float = FDR_Q) -> pd.DataFrame:
    """Every claim's rows, then the false-discovery step over all their tested decisions."""
    frames = [evaluate(c, con) for c in claims]
    if not frames:
        return pd.DataFrame(columns=VERDICT_COLUMNS)
    return adjust(pd.concat(frames, ignore_index=True), q)
