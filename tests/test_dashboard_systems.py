"""The systems under test on the pages: runs of llama-server, of an OpenAI-compatible server
(MTPLX) and of our own loop on the same weights are named by their system on the Runs and
Compare pages, never pooled, server runs show the server's own figures, version and command
beside the client's, disagreeing timings and warm drafters are flagged, and a claim about
llama-server is settled by llama-server's runs with our loop's beside it."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from tests.support.dashboard import GGUF_9B, MLX_27B, fingerprint, frame, group_ids, record, run_job, texts
from tests.support.fleet import enrol

PROMPTS, REPEATS = 3, 2
GGUF_9B_PLAIN = dataclasses.replace(GGUF_9B, reference="Qwen3.5-9B-Q4_K_M.gguf", digest="e" * 64, has_mtp=False)
LLAMA_SERVER = dict(
    engine="llama-server",
    system="llama-server",
    server_version="version: 9330 (328874d)",
    interleaving="rotated",
)
MTPLX = dict(engine="openai", system="MTPLX", server_version="mtplx 2.12.0", interleaving="blocks")
COMMANDS = {
    ("llama-server", "baseline"): "llama-server -m Qwen3.5-9B-MTP-Q4_K_M.gguf -ngl 99 --port 41001",
    ("llama-server", "draft-mtp"): "llama-server -m Qwen3.5-9B-MTP-Q4_K_M.gguf -ngl 99 --port 41002"
    " --spec-type draft-mtp --spec-draft-n-max 2",
    ("llama-server", "ngram-mod"): "llama-server -m Qwen3.5-9B-MTP-Q4_K_M.gguf -ngl 99 --port 41003"
    " --spec-type ngram-mod",
    ("llama-server", "non-MTP baseline"): "llama-server -m Qwen3.5-9B-Q4_K_M.gguf -ngl 99 --port 41006",
    ("MTPLX", "baseline"): "mtplx serve --model Youssofal/Qwen3.6-27B-MTPLX-Optimized-Speed --port 41004",
    ("MTPLX", "mtp"): "mtplx serve --model Youssofal/Qwen3.6-27B-MTPLX-Optimized-Speed --mtp --depth 3 --port 41005",
}


def cell(job_id, rng, method, depth, base_tps, ratio, server=None, disagree=(), warm=False, **fields):
    """One job's runs: per prompt and repeat a baseline and one arm. A server's runs carry its
    version and command; llama-server's also its own decode tok/s (1% above the client's; 20%
    above for the arm's (prompt, repeat) pairs in `disagree`, which are flagged); `warm`: the
    ngram-mod drafter inherited state after the first repeat."""
    out = []
    for repeat in range(REPEATS):
        for p in range(PROMPTS):
            common = {"prompt_id": f"code-{p + 1:02d}", "repeat": repeat, "target": GGUF_9B} | fields
            base = base_tps * (1 + rng.normal(0, 0.01))
            for m, d, tps in (("baseline", 0, base), (method, depth, base * ratio * (1 + rng.normal(0, 0.01)))):
                extra = {}
                if server is not None:
                    extra = dict(server, server_command=COMMANDS[(server["system"], m)])
                    if server["engine"] == "llama-server":
                        off = (p, repeat) in disagree and m != "baseline"
                        extra["server_decode_tokens_per_second"] = tps * (1.2 if off else 1.01)
                        extra["timings_disagree"] = off
                    if m == "ngram-mod":
                        extra["drafter_warm"] = warm and repeat > 0
                out.append(record(job_id, m, d, tps, **common, **extra))
    return out


def seed_fleet(coordinator):
    """The `fleet` fixture's runs (tests/support/fixtures.py). An M1 Max running the bug report's
    GGUF three ways: llama-server draft-mtp at n_max 2 (a loss, two runs whose timings disagree),
    llama-server ngram-mod (a warm drafter), our own llama.cpp MTP loop (a gain); and an M4 Pro
    running MTPLX's server."""
    rng = np.random.default_rng(3)
    mbp = enrol(coordinator, "mbp", fingerprint("mbp", "Apple M1 Max", 24, 32))
    mbp.name = "mbp"
    mini = enrol(coordinator, "mini", fingerprint("mini", "Apple M4 Pro", 20, 48, 273))
    mini.name = "mini"
    truth = {}

    def job(agent, name, records):
        def make(job_id):
            truth[name] = records(job_id)
            return truth[name]

        run_job(coordinator, agent, name, "/models/x", make)

    job(
        mbp,
        "draft-mtp",
        lambda j: cell(j, rng, "draft-mtp", 2, 25.3, 0.87, LLAMA_SERVER, disagree={(0, 0), (1, 1)}),
    )
    job(mbp, "ngram-mod", lambda j: cell(j, rng, "ngram-mod", 64, 25.3, 1.1, LLAMA_SERVER, warm=True))
    # the bug report's baseline, the non-MTP file, on the same Mac: the draft-mtp claims' denominator
    command = COMMANDS[("llama-server", "non-MTP baseline")]
    job(
        mbp,
        "non-mtp-baseline",
        lambda j: [
            dataclasses.replace(r, server_command=command)
            for r in cell(j, rng, "draft-mtp", 2, 25.3, 1.0, LLAMA_SERVER, target=GGUF_9B_PLAIN)
            if r.method == "baseline"
        ],
    )
    job(mbp, "ours", lambda j: cell(j, rng, "mtp", 2, 25.3, 1.05, engine="llama.cpp"))
    job(mini, "mtplx", lambda j: cell(j, rng, "mtp", 3, 12.0, 2.4, MTPLX, target=MLX_27B))
    return truth


def median(records, method, field="decode_tokens_per_second"):
    return float(np.median([getattr(r, field) for r in records if r.method == method]))


def test_runs_page_names_each_runs_system_and_shows_the_servers_own_figures(page):
    at = page("runs")
    runs = at.dataframe[0].value
    assert set(runs["system_method"]) == {
        "llama-server baseline",
        "llama-server draft-mtp",
        "llama-server ngram-mod",
        "specfleet llama.cpp baseline",
        "specfleet llama.cpp mtp",
        "MTPLX (openai) baseline",
        "MTPLX (openai) mtp",
    }
    # the names first, then the client's decode tok/s beside the server's own, its version and command
    columns = list(runs.columns)
    assert columns.index("system_method") < columns.index("model")
    decode = columns.index("decode_tokens_per_second")
    assert columns[decode : decode + 4] == [
        "decode_tokens_per_second",
        "server_decode_tokens_per_second",
        "server_version",
        "server_command",
    ]
    server = runs[runs["system"] == "llama-server"]
    assert set(server["server_version"]) == {"version: 9330 (328874d)"}
    assert set(server["server_command"]) == {c for (system, _), c in COMMANDS.items() if system == "llama-server"}
    assert server["server_decode_tokens_per_second"].notna().all()
    assert runs.loc[runs["system"] == "specfleet", "server_version"].eq("").all()
    # flagged as lossy runs are: in the flags column, and counted above the table
    flags = runs.set_index("system_method")["flags"]
    assert (flags.loc["llama-server draft-mtp"] == "timings disagree").sum() == 2
    assert (flags.loc["llama-server ngram-mod"] == "warm drafter").sum() == PROMPTS * (REPEATS - 1)
    assert (runs["flags"] != "").sum() == 2 + PROMPTS * (REPEATS - 1)
    warnings = " ".join(w.value for w in at.warning)
    assert "2 run(s) were timed more than 5% apart by the client and by the server" in warnings
    assert f"{PROMPTS * (REPEATS - 1)} run(s) started with drafter state inherited" in warnings


def test_compare_offers_each_system_apart_and_shows_the_servers_figures(page):
    at = page("compare")
    truth = page.truth
    labels = group_ids(at)
    # one group per system (llama-server's two spec types on one model are one group's arms): never pooled
    plain = [g for label, g in labels.items() if f" · {GGUF_9B_PLAIN.reference}@" in label]
    by_system = {label.split(" · ")[0]: g for label, g in labels.items() if g not in plain}
    assert sorted(by_system) == ["MTPLX (openai)", "llama-server", "specfleet llama.cpp"] and len(labels) == 4
    assert len(plain) == 1  # the non-MTP file's baselines: other weights, a group of their own
    assert "they differ in target_digest, engine, engine_version, system, server_version." in texts(at)
    assert sorted(at.sidebar.multiselect(key="compare-system").options) == sorted(by_system)

    # llama-server's group: the server's own figures, version and command beside the client's
    at.selectbox(key="compare-group").select(by_system["llama-server"]).run()
    assert not at.exception, at.exception
    assert "System under test: **llama-server**" in texts(at)
    speedups = frame(at, "ci_low", "method", "depth").set_index("method")
    assert set(speedups["system_label"]) == {"llama-server"} and sorted(speedups.index) == ["draft-mtp", "ngram-mod"]
    assert speedups.loc["draft-mtp", "speedup"] == pytest.approx(0.87, rel=0.02)
    servers = frame(at, "server_tokens_per_second").set_index("system_method")
    arm = servers.loc["llama-server draft-mtp"]
    assert arm["server_version"] == "version: 9330 (328874d)"
    assert arm["server_command"] == COMMANDS[("llama-server", "draft-mtp")]
    assert arm["client_tokens_per_second"] == pytest.approx(median(truth["draft-mtp"], "draft-mtp"))
    server_tps = median(truth["draft-mtp"], "draft-mtp", "server_decode_tokens_per_second")
    assert arm["server_tokens_per_second"] == pytest.approx(server_tps)
    assert (arm["timings_disagree_runs"], arm["runs"], arm["machines"]) == (2, PROMPTS * REPEATS, 1)
    assert servers.loc["llama-server ngram-mod", "warm_drafter_runs"] == PROMPTS * (REPEATS - 1)
    assert servers.loc["llama-server baseline", "runs"] == 2 * PROMPTS * REPEATS  # both jobs' baselines
    # flagged as lossy runs are: per chip, system, method and depth
    warnings = [w.value for w in at.warning]
    (disagree,) = [w for w in warnings if w.startswith("Timings disagree")]
    assert disagree.startswith("Timings disagree on Apple M1 Max · llama-server draft-mtp K=2: 2 run(s)")
    assert "Figures here are the client's." in disagree
    (warm,) = [w for w in warnings if w.startswith("Warm drafter")]
    assert warm == (
        f"Warm drafter on Apple M1 Max · llama-server ngram-mod K=64: {PROMPTS * (REPEATS - 1)} run(s) started with"
        " drafter state inherited from earlier requests (drafter_warm); a fresh server's acceptance and speed may be"
        " lower. They stay in the figures."
    )

    # our loop on the same weights: no server figures and no server flags
    at.selectbox(key="compare-group").select(by_system["specfleet llama.cpp"]).run()
    assert not at.exception, at.exception
    assert "The server's own figures beside the client's" not in [h.value for h in at.header]
    assert not any(w.value.startswith(("Timings disagree", "Warm drafter")) for w in at.warning)
    # MTPLX's server: its version and command; it reports no timings of its own
    at.selectbox(key="compare-group").select(by_system["MTPLX (openai)"]).run()
    assert not at.exception, at.exception
    servers = frame(at, "server_tokens_per_second").set_index("system_method")
    assert servers.loc["MTPLX (openai) mtp", "server_version"] == "mtplx 2.12.0"
    assert servers.loc["MTPLX (openai) mtp", "server_command"] == COMMANDS[("MTPLX", "mtp")]
    assert np.isnan(servers.loc["MTPLX (openai) mtp", "server_tokens_per_second"])


def test_the_system_filter_keeps_one_systems_runs(page):
    at = page("compare")
    at.sidebar.multiselect(key="compare-system").select("MTPLX (openai)").run()
    assert not at.exception, at.exception
    assert [label.split(" · ")[0] for label in group_ids(at)] == ["MTPLX (openai)"]
    speedups = frame(at, "ci_low", "method", "depth")
    assert speedups["chip"].tolist() == ["Apple M4 Pro"] and speedups["speedup"].iloc[0] == pytest.approx(2.4, rel=0.03)


def test_a_llama_server_claim_is_settled_by_its_runs_with_our_loop_beside(page):
    at = page("questions")
    verdicts = at.dataframe[0].value.set_index(["claim", "chip"])
    loss = verdicts.loc[("llamacpp-mtp-m1-max-net-loss-n2", "Apple M1 Max")]
    # One M1 Max: the figure is shown, the verdict waits for the simulated minimum of machines (issue 27)
    assert loss["verdict"] == "inconclusive" and loss["figure"] == pytest.approx(0.87, rel=0.02)
    assert (loss["machines"], loss["prompts"], loss["runs"]) == (1, PROMPTS, PROMPTS * REPEATS)
    assert loss["beside"].startswith("our loop, same weights (specfleet llama.cpp mtp) on Apple M1 Max: 1.05 [")
    # MTPLX's claim on the M4 Pro: settled by MTPLX's server; our MLX loop ran nothing to stand beside it
    mtplx = verdicts.loc[("mtplx-m4-pro-2.6x", "Apple M4 Pro")]
    assert mtplx["verdict"] == "inconclusive" and mtplx["figure"] == pytest.approx(2.4, rel=0.03)
    assert mtplx["runs"] == PROMPTS * REPEATS and mtplx["beside"] == ""
    # llama-server's ngram-mod on a Mac: the absence claim falls on that chip
    assert verdicts.loc[("no-mac-ngram-mod-benchmark", "Apple M1 Max"), "verdict"] == "contradicted"
