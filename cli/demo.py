"""`specfleet demo`: the whole fleet on one machine with the project's tiny models.

Builds the models if missing, starts a coordinator and an agent as separate processes on
loopback, submits a sweep over both engines, waits, prints a summary, and serves the
dashboard until Ctrl-C (or exits at once with --no-dashboard).
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import duckdb
import pandas as pd
import pyarrow.compute as pc
import yaml
from rich.console import Console

from agent.credentials import CREDENTIAL_FILE, AgentIdentity
from agent.fingerprint import available_engines, fingerprint
from cli import postgres
from cli.tiny import make_tiny
from cli.watch import watch
from dashboard.serve import command as dashboard_command
from dashboard.serve import environment as dashboard_environment
from dashboard.serve import start_child, stop_child
from protos.specfleet.v1 import fleet_pb2 as pb
from specfleet import settings as declared
from specfleet import speedup
from specfleet.client import AdminApi, AgentApi, channel, fetch_table
from specfleet.data_dir import ENDPOINTS_FILE, admin_credential
from specfleet.record import VERIFY_COST

DEMO_AGENT = "demo-agent"
SWEEP_TIMEOUT_SECONDS = 3600  # --real on a busy 2-core machine took over 30 minutes
START_TIMEOUT_SECONDS = 60
WATCH_SECONDS = 1.0  # between polls of the sweeps' progress


# What every demo sweep shares: the demo agent, greedy sampling, two question-answering prompts
# (the shortest set: on this CPU prefill, not decoding, is most of a run's time).
DEMO_COMMON = {
    "target": {"agents": [DEMO_AGENT]},
    "samplers": [{"temperature": 0.0}],
    "prompt_sets": ["qa"],
    "prompts": 2,
    "max_new_tokens": 32,
    "warmup": 2,  # at most 2 warm-up runs per arm and prompt (the default is 10): the demo stays short
    "repeats": 3,
}
# `--small` (SPECFLEET_DEMO_SMALL): every sweep and arm of the demo on both engines, at the least
# that measures them: one prompt, one warm-up, one repeat (rounded up to complete the arms'
# Williams design), 16 new tokens, a verify-cost curve to 4 rows, one llama.cpp thread (its
# threads spin at their barriers: on a busy machine two run several times slower than one). What
# the tests run.
SMALL = {"prompts": 1, "max_new_tokens": 16, "warmup": 1, "repeats": 1, "threads": 1}
SMALL_VERIFY_COST = {"context_tokens": [128], "max_rows": 4, "repeats": 2}


# llama-server as the in-process llama.cpp engine runs: its context, flash attention, one slot.
SERVER_FLAGS = "-c 4096 -fa on --parallel 1"
# The tiny models' ngram-mod parameters (their text repeats only in short n-grams: the declared defaults,
# 24 and 48, draft nothing in their outputs); bench/servers.py and bench/overhead.py import them.
NGRAM_MOD = {"n_match": 4, "n_min": 1}


def ngram_mod_settings(params: dict[str, int] = NGRAM_MOD) -> dict[str, int]:
    """ngram-mod's parameters by sweep key ({"n_match": 4}) as the declared settings our loops take
    ({"ngram_mod_n_match": 4}: specfleet/settings.py, sweep key ngram_mod.<key>)."""
    rows = {s.sweep.partition(".")[2]: s.name for s in declared.SWEEP_SETTINGS if s.sweep.startswith("ngram_mod.")}
    return {rows[key]: value for key, value in params.items()}


def ngram_mod_flags(params: dict[str, int] = NGRAM_MOD) -> tuple[str, ...]:
    """The same parameters as llama-server's flags (specfleet/settings.py TYPE_PARAMS["ngram-mod"])."""
    return tuple(word for key, value in params.items() for word in (declared.TYPE_PARAMS["ngram-mod"][key], str(value)))


def demo_sweeps(models, small: bool = False) -> list[dict]:
    """The tiny Llama pair with every method on both engines; MTP (and draft, n-gram, which
    must roll back recurrent state) on the hybrid Qwen3.5-style model on both engines, and
    llama.cpp's own `llama-server --spec-type draft-mtp` beside them; llama.cpp's ngram-mod in
    our loops and in llama-server on the Llama target (small n_match and n_min: the demo's
    generations are short); MTP on the all-attention model, which only MLX runs (llama.cpp's
    qwen35 graph needs layers of both kinds). `small`: the same sweeps and arms, smaller (SMALL)."""
    llama = {
        "name": "demo",
        "models": {
            "mlx": {"target": str(models.mlx_target), "draft": str(models.mlx_draft)},
            "llama.cpp": {"target": str(models.gguf_target), "draft": str(models.gguf_draft)},
        },
        "engines": ["mlx", "llama.cpp"],
        # Our loops, and the libraries' own paths beside them (each engine runs the arms it has).
        "methods": {"draft": [2, 4], "ngram": [3], "ref-baseline": [0], "ref-draft": [2], "ref-ngram": [3]},
        "verify_cost": {"context_tokens": [128], "max_rows": 8, "repeats": 5},
    }
    hybrid = {
        "name": "demo-mtp-hybrid",
        "models": {
            "mlx": {"target": str(models.mlx_mtp_hybrid), "draft": str(models.mlx_mtp_hybrid_draft)},
            "llama.cpp": {"target": str(models.gguf_mtp_hybrid), "draft": str(models.gguf_mtp_hybrid_draft)},
        },
        "engines": ["mlx", "llama.cpp", "llama-server"],
        "methods": {"mtp": [1, 2, 3], "draft": [2], "ngram": [3]},
        "server": {"flags": SERVER_FLAGS},
        "arms": [{"spec_type": "draft-mtp", "depths": [1, 2, 3]}],
    }
    hybrid["models"]["llama-server"] = {"target": str(models.gguf_mtp_hybrid)}
    ngram_mod = {
        "name": "demo-ngram-mod",
        "models": {
            "mlx": {"target": str(models.mlx_target)},
            "llama.cpp": {"target": str(models.gguf_target)},
            "llama-server": {"target": str(models.gguf_target)},
        },
        "engines": ["mlx", "llama.cpp", "llama-server"],
        "methods": {"ngram-mod": [8]},
        "ngram_mod": NGRAM_MOD,
        "server": {"flags": SERVER_FLAGS},
        "arms": [{"spec_type": "ngram-mod", "depths": [8], "params": NGRAM_MOD}],
        "max_new_tokens": 128,  # the tiny target repeats itself only after a while: drafts to count
    }
    dense = {
        "name": "demo-mtp-dense",
        "models": {"mlx": {"target": str(models.mlx_mtp_dense)}},
        "engines": ["mlx"],
        "methods": {"mtp": [1, 2, 3]},
    }
    if small:
        llama["verify_cost"] = SMALL_VERIFY_COST
        return [{**DEMO_COMMON, **sweep, **SMALL} | _kept(sweep) for sweep in (llama, hybrid, ngram_mod, dense)]
    return [{**DEMO_COMMON, **sweep} for sweep in (llama, hybrid, ngram_mod, dense)]


def _kept(sweep: dict) -> dict:
    """What SMALL leaves as a sweep set it: ngram-mod's 128 tokens (it drafts only once the tiny
    target repeats itself)."""
    return {"max_new_tokens": sweep["max_new_tokens"]} if "max_new_tokens" in sweep else {}


# `specfleet demo --real`: the same fleet on the real models `scripts/setup.sh --real-models`
# installs in the models directory (file names as it writes them).
REAL_MODELS_DIR = Path(".data/models")
SMOLLM2 = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_DRAFT = "SmolLM2-135M-Instruct.Q2_K.gguf"  # llama.cpp's Q2_K requantisation of the same file
SMOLLM2_MLX = "SmolLM2-135M-Instruct-Q4_1-mlx"  # specfleet models gguf-to-mlx
GEMMA3 = "gemma-3-270m-q4_k_m.gguf"
GEMMA3_DRAFT = "gemma-3-270m-q2_k.gguf"
# A first look: one prompt per set, one warm-up, one repeat
# (rounded up to complete the arms' Williams design: 2 arms, 2 repeats; 4 arms, 4), one llama.cpp
# thread in our loop and in llama-server alike (steady on a busy machine; the same greedy tokens
# from both). More prompts and repeats: a sweep of your own (the figures of one prompt are noisy).
REAL_COMMON = {
    **DEMO_COMMON,
    "prompts": 1,
    "max_new_tokens": 48,
    "warmup": 1,
    "repeats": 1,
    "threads": 1,
}
REAL_NGRAM_MOD = {"n_match": 4, "n_min": 2}  # the defaults (24, 48) draft nothing within 48 tokens
# Gemma's near-tie (issue 26): on summarisation-01 as raw text, at one thread, prompt lookup's
# 4-row verify batch ranks two tokens 0.07 apart the other way round at token 51: labelled, kept.
GEMMA_NEAR_TIE = {
    "prompt_sets": ["summarisation"],
    "prompt_format": "raw",
    "max_new_tokens": 64,
    "methods": {"ngram": [3]},
    "ngram": {"n_min": 1, "n_max": 4},
}
REAL_DESCRIPTION = """specfleet demo --real: a first look at real models (16 minutes here, 2 cores kept busy by others).
  real-smollm2: SmolLM2-135M-Instruct Q4_1 through its chat template, one qa, rag and code prompt each,
    48 new tokens: prompt lookup (ngram K=3) in our llama.cpp loop, llama-server's ngram-simple beside it,
    both at one thread (do their greedy baselines give the same tokens?)
  real-smollm2-draft, real-smollm2-ngram-mod: the code prompt: its Q2_K requantisation as a draft (K=3), and
    ngram-mod, each in our loop and in llama-server (draft-simple, ngram-mod)
  real-gemma3: Gemma 3 270M Q4_K_M on summarisation-01 as raw text, 64 tokens: prompt lookup's 4-row verify
    batch flips a near-tie at token 51 (lossless says near-tie: kept in the figures)
  real-smollm2-mlx: SmolLM2 on MLX from its converted directory (on Linux MLX runs on the CPU: slow)
One warm-up and the fewest repeats a balanced order allows: noisy figures; write a sweep for more."""


def real_sweeps(models_dir: Path) -> list[dict]:
    """REAL_DESCRIPTION's sweeps: SmolLM2 (target, its Q2_K draft) through its chat template
    (prompt_format auto: chat) in our llama.cpp loop with llama-server's own types beside it;
    Gemma 3 270M's near-tie (GEMMA_NEAR_TIE) in our llama.cpp loop, whose greedy check records
    the margin; SmolLM2 on MLX from its converted directory (MLX on Linux runs on the CPU, far
    slower than llama.cpp: one short cell)."""
    d = models_dir.resolve()
    missing = [n for n in (SMOLLM2, SMOLLM2_DRAFT, SMOLLM2_MLX, GEMMA3, GEMMA3_DRAFT) if not (d / n).exists()]
    if missing:
        raise FileNotFoundError(f"{', '.join(missing)} not in {d}: run scripts/setup.sh --real-models first")
    pair = {"target": str(d / SMOLLM2), "draft": str(d / SMOLLM2_DRAFT)}
    both = {"models": {"llama.cpp": pair, "llama-server": pair}, "engines": ["llama.cpp", "llama-server"]}
    lookup = {
        **REAL_COMMON,
        **both,
        "name": "real-smollm2",
        "prompt_sets": ["qa", "rag", "code"],  # prompt lookup pays on rag and code, not on qa
        "methods": {"ngram": [3]},
        "server": {"flags": SERVER_FLAGS},
        "arms": [{"spec_type": "ngram-simple", "depths": [3]}],
    }
    # Two arms a cell (2 repeats): a quantised draft, and ngram-mod, each beside its baseline.
    drafts = [
        {
            **REAL_COMMON,
            **both,
            "name": f"real-smollm2-{name}",
            "prompt_sets": ["code"],
            "methods": methods,
            "ngram_mod": REAL_NGRAM_MOD,
            "server": {"flags": SERVER_FLAGS},
            "arms": [arm],
        }
        for name, methods, arm in (
            ("draft", {"draft": [3]}, {"spec_type": "draft-simple", "depths": [3]}),
            ("ngram-mod", {"ngram-mod": [8]}, {"spec_type": "ngram-mod", "depths": [8], "params": REAL_NGRAM_MOD}),
        )
    ]
    gemma = {
        **REAL_COMMON,
        "name": "real-gemma3",
        "models": {"llama.cpp": {"target": str(d / GEMMA3), "draft": str(d / GEMMA3_DRAFT)}},
        "engines": ["llama.cpp"],
        **GEMMA_NEAR_TIE,
    }
    mlx = {
        **{k: v for k, v in REAL_COMMON.items() if k != "threads"},  # threads: a llama.cpp setting
        "name": "real-smollm2-mlx",
        "models": {"mlx": {"target": str(d / SMOLLM2_MLX)}},
        "engines": ["mlx"],
        "prompt_sets": ["qa"],  # the shortest prompts: MLX on a Linux CPU prefills quantised weights slowly
        "max_new_tokens": 16,
        "methods": {"ngram": [3]},
    }
    return [lookup, *drafts, gemma, mlx]


def _specfleet(*args: str) -> list[str]:
    return [sys.executable, "-m", "cli.main", *args]


def _wait_for(path: Path, proc: subprocess.Popen, what: str, log: Path) -> dict:
    deadline = time.monotonic() + START_TIMEOUT_SECONDS
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            last = log.read_text().strip().splitlines()[-1:] if log.exists() else []
            raise RuntimeError(
                f"{what} exited with status {proc.returncode} before it was ready: "
                f"{last[0] if last else 'no output'} (full log: {log})"
            )
        if path.exists():
            return json.loads(path.read_text())
        time.sleep(0.1)
    raise RuntimeError(f"{what} did not start within {START_TIMEOUT_SECONDS}s")


def _enrol(address: str, admin: AdminApi, config_dir: Path) -> None:
    if (config_dir / CREDENTIAL_FILE).exists():
        return  # enrolled by an earlier demo run in this data dir
    token = admin.CreateToken(pb.CreateTokenRequest(ttl_seconds=600, max_uses=1, note="demo")).token
    resp = AgentApi(channel(address)).enrol(token, DEMO_AGENT, fingerprint(), {"demo": "true"}, available_engines())
    AgentIdentity(
        coordinator=address,
        agent_id=resp.agent_id,
        name=DEMO_AGENT,
        credential=resp.credential,
        heartbeat_interval_seconds=resp.heartbeat_interval_seconds,
    ).save(config_dir)


# The checked keys a summary's group header names in its own words (or that every group of one
# engine shares); the others follow the declaration (specfleet/settings.py describe).
SUMMARY_KEYS = frozenset({"target_digest", "draft_digest", "engine", "engine_version", "system", "prompt_set_digest",
                          "context_tokens", "max_new_tokens", "server_flags"})  # fmt: skip


NOT_NOMINAL = "*"  # marks a speedup computed from runs judged not nominal


def summary_table(runs, jobs) -> str:
    """Per comparable group of runs (specfleet/speedup.py): per arm the median decode tokens/s,
    the speedup over the baseline, acceptance, lossless ("near-tie" where a run diverged at a
    near-tie and was kept), the runs and the stalls among them (speedup.flagged_sql: counted,
    kept in every figure of the row); then whether the greedy baselines of the systems that ran
    the same target agree token for token (_same_tokens), and the verify-cost curves. `runs`
    and `jobs` are the coordinator's tables as Arrow (the export)."""
    con = duckdb.connect()
    con.register("runs", runs)
    con.register("jobs", jobs)
    figures = speedup.speedups(con).set_index(["comparable", "method", "depth"])["speedup"]
    # The one definition of speedup leaves out runs judged not nominal (a busy or hot machine). On a
    # machine busy throughout, an arm has no such pair: its figure is then the same definition over
    # every run, printed with a mark that says so: the load changes a label, never the figures.
    con.execute("CREATE VIEW runs_any_load AS SELECT * REPLACE (NULL::BOOLEAN AS env_nominal) FROM runs")
    any_load = speedup.speedups(con, "runs_any_load").set_index(["comparable", "method", "depth"])["speedup"]
    arms = con.execute(
        f"SELECT {speedup.COMPARABLE_ID} AS comparable, engine, system, method, depth,"
        " median(decode_tokens_per_second) AS tps, median(server_decode_tokens_per_second) AS server_tps,"
        " sum(tokens_accepted) / nullif(sum(tokens_drafted), 0) AS acceptance,"
        " bool_and(lossless IS NOT false) AS lossless,"
        " coalesce(bool_or(divergence = 'near-tie'), false) AS near_tie, count(*) AS runs,"
        " count(*) FILTER (WHERE stall) AS stalls"
        f" FROM {speedup.flagged_sql('runs')} WHERE method != '{VERIFY_COST}'"
        " GROUP BY ALL ORDER BY engine, comparable, method, depth"
    ).df()
    groups = speedup.groups(con).set_index("comparable")
    lines, flagged = [], False
    for comparable, rows in arms.groupby("comparable", sort=False):
        group_lines, group_flagged = _group_lines(comparable, rows, groups.loc[comparable], figures, any_load)
        lines += group_lines
        flagged = flagged or group_flagged
    lines += _footnotes(arms, flagged)
    differ = speedup.what_differs(groups.reset_index())
    if differ:
        lines += [f"{len(groups)} comparable groups, never pooled: they differ in {', '.join(differ)}", ""]
    lines += _divergences(con)
    lines += _same_tokens(con)
    lines += _verify_cost_lines(con)
    return "\n".join(lines).rstrip()


def _group_lines(comparable: str, rows, g, figures, any_load) -> tuple[list[str], bool]:
    """One comparable group's heading and its arms' rows (summary_table); whether a speedup among
    them came from runs judged not nominal (marked NOT_NOMINAL)."""
    draft = f", draft {g.draft_reference}@{g.draft_digest[:12]}" if g.draft_reference else ""
    settings = declared.describe(g.to_dict(), SUMMARY_KEYS)  # the other checked settings not at their default
    lines = [
        f"comparable group {comparable}: {_system(rows.engine.iloc[0], rows.system.iloc[0])} "
        f"{g.target_reference}@{g.target_digest[:12]}{draft}, "
        f"prompts {g.prompt_set}, context {g.context_tokens} tokens, {g.max_new_tokens} new tokens"
        + (f", {settings.replace(' · ', ', ')}" if settings else ""),
        f"{'system':12} {'method':13} {'K':>2} {'decode tok/s':>13} {'server tok/s':>12} {'speedup':>8} "
        f"{'acceptance':>10} {'lossless':>8} {'runs':>5} {'stalls':>8}",
    ]
    flagged = False
    for r in rows.itertuples():
        key, mark = (comparable, r.method, r.depth), ""
        ratio = 1.0 if r.method == "baseline" else figures.get(key, float("nan"))
        if pd.isna(ratio) and key in any_load:
            ratio, mark, flagged = any_load[key], NOT_NOMINAL, True
        acceptance = "-" if pd.isna(r.acceptance) else f"{r.acceptance:.2f}"
        server_tps = "-" if pd.isna(r.server_tps) else f"{r.server_tps:.1f}"
        lossless = "NO" if not r.lossless else "near-tie" if r.near_tie else "yes"
        lines.append(
            f"{_system(r.engine, r.system):12} {r.method:13} {r.depth:>2} {r.tps:13.1f} {server_tps:>12} "
            f"{f'{ratio:.2f}{mark}':>8} {acceptance:>10} {lossless:>8} {r.runs:>5} {r.stalls:>8}"
        )
    return [*lines, ""], flagged


def _footnotes(arms, flagged: bool) -> list[str]:
    """What the summary's marks mean, for the marks it shows: not nominal, near-tie, stalls."""
    lines = []
    if flagged:
        lines += [f"{NOT_NOMINAL} from runs judged not nominal (a busy or hot machine): measure on a quiet one", ""]
    if arms.near_tie.any():
        lines += [
            "near-tie: a run's output left the baseline's where the target's top two tokens were closer than "
            "batch numerics can order (agent/divergence.py): kept in the figures, labelled",
            "",
        ]
    if arms.stalls.any():
        lines += [
            f"stalls: runs under 1/{speedup.STALL_FACTOR:g} of the median speed of their arm's repeats on the prompt:"
            " counted, kept in the row's figures (a speedup is the median over a prompt's repeats)",
            "",
        ]
    return lines


def _verify_cost_lines(con) -> list[str]:
    """The verify-cost curves, T(M)/T(1) for M = 1..max_rows, per engine and context."""
    curves = con.execute(
        f"SELECT engine, context_tokens, verify_cost_seconds FROM runs WHERE method = '{VERIFY_COST}' ORDER BY ALL"
    ).fetchall()
    return [
        f"verify cost, {engine}, {context} tokens of context: T(M)/T(1) for M = 1..{len(seconds)}: "
        + " ".join(f"{t / seconds[0]:.2f}" for t in seconds)
        for engine, context, seconds in curves
    ]


def _divergences(con) -> list[str]:
    """Where each arm marked lossless NO or near-tie left its reference, per arm and prompt
    (agent/divergence.py): the generated-token index, the run's token for the reference's, in how
    many of its runs, and the target's margin there against the near-tie threshold, or why no
    margin was measured (divergence_cause)."""
    rows = con.execute(
        f"SELECT divergence, {_SYSTEM_SQL} AS system, method, depth, prompt_id, divergence_position::BIGINT,"
        " divergence_token::BIGINT, divergence_reference_token::BIGINT, any_value(divergence_margin),"
        " any_value(divergence_threshold), any_value(divergence_cause), count(*)"
        " FROM runs WHERE divergence IN ('defect', 'near-tie') GROUP BY ALL ORDER BY ALL"
    ).fetchall()
    out = []
    for divergence, system, method, depth, prompt, at, ours, theirs, margin, threshold, cause, runs in rows:
        pair = f" ({ours} for {theirs})" if ours is not None else ""
        against = f" against a near-tie threshold of {threshold:.3g}" if threshold is not None else ""
        why = f"margin {margin:.3g}{against}" if margin is not None else f"no margin: {cause or 'none measured'}"
        label = "lossless NO" if divergence == "defect" else "near-tie"
        out.append(
            f"{label}: {system} {method} {depth} on {prompt} left its reference at token {at}{pair}"
            f" in {runs} run(s): {why}"
        )
    return [*out, ""] if out else []


def _same_tokens(con) -> list[str]:
    """Where two systems (our llama.cpp loop and llama-server, ...) ran greedy baselines of the
    same target on the same prompts: on how many prompts every run of each gave the same tokens
    (output_sha256), at which thread counts, and on how many more the runs' texts (text_sample,
    the first TEXT_SAMPLE_CHARS characters) are one: llama-server's stream holds back the id of a
    token whose text is incomplete UTF-8 (UNKNOWN_ID), so its token hash differs from ours while
    its text is the same (frequent with byte tokens; bench/README.md, the CUDA baselines). The texts
    are compared without a trailing U+FFFD: a stream never sends the text of an output that ends in
    incomplete UTF-8, where a detokenized one renders those bytes as U+FFFD."""
    rows = con.execute(
        f"SELECT target_digest, prompt_id, list_sort(list(DISTINCT {_SYSTEM_SQL})) AS systems,"
        " list_sort(list(DISTINCT threads)) AS threads, count(DISTINCT output_sha256) = 1 AS same,"
        f" count(DISTINCT {_SYSTEM_SQL}) FILTER (WHERE text_sample IS NOT NULL) = len(systems)"
        "  AND count(DISTINCT rtrim(text_sample, '\ufffd')) = 1 AS same_text"
        " FROM runs WHERE method = 'baseline' AND sampler_temperature = 0"
        " GROUP BY target_digest, prompt_id, context_tokens, max_new_tokens HAVING len(systems) > 1"
        " ORDER BY systems, threads, target_digest, prompt_id"
    ).fetchall()
    out = []
    for (systems, threads), group in itertools.groupby(rows, lambda r: (tuple(r[2]), tuple(r[3]))):
        group = list(group)
        same = sum(r[4] for r in group)
        same_text = sum(r[5] and not r[4] for r in group)
        at = f" at {' and '.join(str(t) for t in threads if t is not None)} thread(s)" if any(threads) else ""
        text = f", the same text on {same_text} more (ids a server's stream held back)" if same_text else ""
        out.append(
            f"greedy baselines, {' and '.join(systems)}{at}: the same tokens on {same} of {len(group)} prompt(s){text}"
        )
    return [*out, ""] if out else []


_SYSTEM_SQL = "CASE WHEN system = 'specfleet' THEN engine ELSE system END"  # _system, in SQL


def _system(engine: str, system: str) -> str:
    """Our loops by engine ("llama.cpp"), a server by its name ("llama-server", "MTPLX")."""
    return engine if system == "specfleet" else system


class _Children:
    """The demo's child processes (coordinator, agent, dashboard), each logging to logs/<name>.log,
    started with a lifeline (should the demo be killed, SIGKILL or a killed test, they stop too)
    and stopped in reverse order."""

    def __init__(self, logs: Path):
        self.logs = logs
        self.procs: list[subprocess.Popen] = []

    def start(self, name: str, cmd: list[str], env=None) -> subprocess.Popen:
        log = open(self.logs / f"{name}.log", "a")  # noqa: SIM115 - the child process owns it
        proc = start_child(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        self.procs.append(proc)
        return proc

    def stop(self) -> None:
        for proc in reversed(self.procs):
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in reversed(self.procs):
            stop_child(proc)
            os.close(proc.lifeline)


def run_demo(
    data_dir: Path,
    dashboard: bool = True,
    dashboard_port: int = 8501,
    real: bool = False,
    models_dir: Path | None = None,
    small: bool = False,
    only: list[str] | None = None,
    store: str = "file",
) -> int:
    """The demo: the tiny models' sweeps (demo_sweeps; `small`: SMALL's), or with `real` the real
    models' (real_sweeps, from `models_dir`), `only` those named if given, then their summaries
    and the dashboard. `store="lake"`: the coordinator on a DuckLake whose catalog is a PostgreSQL
    cluster of the demo's own (cli/postgres.py, in data_dir/postgres), data files in data_dir/lake."""
    data_dir = data_dir.resolve()
    if dashboard and not _port_free(dashboard_port):
        print(f"demo failed: dashboard port {dashboard_port} is in use; pass --dashboard-port", file=sys.stderr)
        return 1
    print(f"specfleet demo: everything goes in {data_dir}", flush=True)
    sweeps = _chosen_sweeps(data_dir, real, models_dir, small, only)
    if isinstance(sweeps, int):
        return sweeps
    suffix = "" if store == "file" else "-lake"  # an agent enrolled with one store is unknown to the other
    coordinator_dir, agent_dir = data_dir / f"coordinator{suffix}", data_dir / f"agent{suffix}"
    coordinator_dir.mkdir(parents=True, exist_ok=True)
    (coordinator_dir / ENDPOINTS_FILE).unlink(missing_ok=True)
    logs = data_dir / "logs"
    logs.mkdir(exist_ok=True)
    children = _Children(logs)
    # Ctrl-C and SIGTERM stop the demo through the finally below, even when started from a shell
    # that set SIGINT to be ignored (a background job).
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.default_int_handler)
    catalog = contextlib.ExitStack()
    try:
        store_flags = []
        if store == "lake":
            cluster = catalog.enter_context(postgres.cluster(keep=data_dir / "postgres"))
            store_flags = ["--store", cluster.store(data_dir / "lake")]
            print(f"lake: catalog in PostgreSQL on 127.0.0.1:{cluster.port}, data in {data_dir / 'lake'}", flush=True)
        admin, address = _start_fleet(children, coordinator_dir, agent_dir, logs, store_flags)
        if not _run_sweeps(admin, sweeps, children.procs):
            return 1
        if dashboard:
            token = admin_credential(coordinator_dir)
            dash = children.start("dashboard", dashboard_command(dashboard_port), dashboard_environment(address, token))
            _wait_for_http(
                f"http://127.0.0.1:{dashboard_port}/_stcore/health", dash, "dashboard", logs / "dashboard.log"
            )
            print(f"\ndashboard: http://127.0.0.1:{dashboard_port}  (Ctrl-C stops everything)", flush=True)
            while True:
                time.sleep(3600)
        return 0
    except KeyboardInterrupt:
        return 130
    except RuntimeError as e:
        print(f"demo failed: {e}", file=sys.stderr)
        return 1
    finally:
        children.stop()
        catalog.close()
        print("demo stopped", flush=True)


def _chosen_sweeps(data_dir: Path, real: bool, models_dir: Path | None, small: bool, only) -> list[dict] | int:
    """The demo's sweeps (run_demo), `only` those named if given; the exit status when there are
    none to run (1: the real models are missing, 2: `only` names no demo sweep)."""
    if real:
        try:
            sweeps = real_sweeps(models_dir or REAL_MODELS_DIR)
        except FileNotFoundError as e:
            print(f"demo failed: {e}", file=sys.stderr)
            return 1
        print(REAL_DESCRIPTION, flush=True)
    else:
        sweeps = demo_sweeps(make_tiny(data_dir / "models"), small)
        if small:
            print(
                "specfleet demo --small: every sweep and arm, one prompt, one repeat, 16 new tokens,"
                " one llama.cpp thread",
                flush=True,
            )
    if only:
        names = [sweep["name"] for sweep in sweeps]
        unknown = [name for name in only if name not in names]
        if unknown:
            print(f"demo failed: no demo sweep {', '.join(unknown)} (the demo's: {', '.join(names)})", file=sys.stderr)
            return 2
        sweeps = [sweep for sweep in sweeps if sweep["name"] in only]
    return sweeps


def _start_fleet(
    children: _Children, coordinator_dir: Path, agent_dir: Path, logs: Path, store_flags: list[str]
) -> tuple[AdminApi, str]:
    """A coordinator on a free port (with `store_flags`: its --store) and the demo agent enrolled
    with it and running: its admin client and gRPC address."""
    (logs / "coordinator.log").unlink(missing_ok=True)
    serve = ["coordinator", "serve", "--data-dir", str(coordinator_dir), "--port", "0", "--metrics-port", "0"]
    coordinator = children.start("coordinator", _specfleet(*serve, *store_flags))
    endpoints = _wait_for(coordinator_dir / ENDPOINTS_FILE, coordinator, "coordinator", logs / "coordinator.log")
    address = endpoints["grpc"]
    print(f"coordinator: gRPC {address}, metrics http://{endpoints['metrics']}/metrics", flush=True)
    admin = AdminApi(channel(address), admin_credential(coordinator_dir))
    _enrol(address, admin, agent_dir)
    identity = AgentIdentity.load(agent_dir)
    if identity.coordinator != address:  # the coordinator picked a new port this time
        AgentIdentity(**{**identity.__dict__, "coordinator": address}).save(agent_dir)
    # --ignore-doctor: the demo's own coordinator and dashboard share the machine with its agent.
    children.start("agent", _specfleet("agent", "run", "--config-dir", str(agent_dir), "--ignore-doctor"))
    print(f"agent: {DEMO_AGENT} running, logs in {logs}", flush=True)
    return admin, address


def _run_sweeps(admin: AdminApi, sweeps: list[dict], procs) -> bool:
    """Submit the sweeps, watch them to their end and print each one's outcome and summary;
    whether every one ran without a failed job."""
    submitted = []
    for spec in sweeps:
        sweep = admin.SubmitSweep(pb.SubmitSweepRequest(yaml=yaml.safe_dump(spec)))
        print(f"sweep {spec['name']} ({sweep.sweep_id}): {sweep.jobs} job(s) submitted", flush=True)
        for note in sweep.notes:
            print(f"  note: {note}", flush=True)
        submitted.append((spec, sweep.sweep_id))
    final = _watch_sweeps(admin, [sweep_id for _, sweep_id in submitted], procs)
    for spec, sweep_id in submitted:
        status = final[sweep_id]
        runs, _ = fetch_table(admin, "runs")
        jobs, _ = fetch_table(admin, "jobs")
        runs = runs.filter(pc.equal(runs["sweep_id"], sweep_id)) if runs is not None else None
        targets = ", ".join(f"{engine}: {Path(m['target']).name}" for engine, m in spec["models"].items())
        print(
            f"\nsweep {spec['name']} {status.state} ({targets}): {status.jobs_done} job(s) done, "
            f"{status.jobs_failed} failed, {status.runs} runs"
        )
        for failure in status.failures:
            print(f"  failed {failure}")
        if runs is None or status.jobs_failed:
            return False
        print("\n" + summary_table(runs, jobs), flush=True)
    return True


def _port_free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
            return True
        except OSError:
            return False


def _wait_for_http(url: str, proc: subprocess.Popen, what: str, log: Path) -> None:
    deadline = time.monotonic() + START_TIMEOUT_SECONDS
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            tail = log.read_text().strip().splitlines()[-3:] if log.exists() else []
            raise RuntimeError(f"{what} exited with status {proc.returncode}: {' / '.join(tail)} (full log: {log})")
        try:
            urllib.request.urlopen(url, timeout=2)
            return
        except OSError:
            time.sleep(0.3)
    raise RuntimeError(f"{what} did not answer at {url} within {START_TIMEOUT_SECONDS}s (log: {log})")


def _watch_sweeps(admin: AdminApi, sweep_ids: list[str], procs) -> dict[str, pb.SweepStatus]:
    """The sweeps' progress as `sweep status --watch` shows it, until all have ended; their last
    statuses by id. A demo process that exits, or SWEEP_TIMEOUT_SECONDS passing, stops it."""
    deadline = time.monotonic() + SWEEP_TIMEOUT_SECONDS

    def fetch() -> list[pb.SweepStatus]:
        return [s for s in admin.ListSweeps(pb.ListSweepsRequest()).sweeps if s.sweep_id in sweep_ids]

    def check() -> None:
        dead = [p for p in procs if p.poll() is not None]
        if dead:
            raise RuntimeError(f"{dead[0].args[3:5]} exited with status {dead[0].returncode}; see the logs")
        if time.monotonic() > deadline:
            raise RuntimeError(f"the demo's sweeps did not finish within {SWEEP_TIMEOUT_SECONDS}s")

    return {s.sweep_id: s for s in watch(fetch, Console(), WATCH_SECONDS, check)}
