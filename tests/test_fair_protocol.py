"""The fair protocol for server arms (agent/protocol.py, setting server_state; issue 27 item 3):
a pair's baseline and arm run in the same server state (both warm by the same number of
requests, or both fresh and warmed up after the start), the state is recorded, warm-up follows
every restart, and a pair's two runs are adjacent in time in every interleaving mode.

A fake server engine models what made the old protocol unfair: a server is slow on its first
requests after a start (cold) and the machine slows down as it heats (drift over time). A
drafter with no effect must then measure 1.00x in every mode. The same is checked on the real
llama-server with an ngram-mod arm that cannot draft (n_min longer than the generation)."""

import math
import os
import random
import statistics
from dataclasses import replace
from pathlib import Path

import pytest

from agent.engines.base import Generation, ServerRun
from agent.protocol import run_job
from specfleet.record import Arm, JobSpec, ModelIdentity, Prompt
from specfleet.settings import Settings
from tests.support.processes import needs_llama_server

TARGET = ModelIdentity(reference="t.gguf", digest="ab" * 32, context_length=4096)
NO_EFFECT = Arm("ngram-mod", 64, ("--spec-ngram-mod-n-min", "48"))  # 48 > 16 new tokens: never drafts
ARMS = (Arm("baseline"), NO_EFFECT)
COLD = (0.5, 0.8)  # decode speed of a server's first and second request, relative to a warm one


class StatefulServers:
    """llama-server as the protocol sees it: one server per arm (blocks: one at a time), each slow
    while cold, on a machine that slows down by `drift` per request served anywhere."""

    name = "llama-server"

    def __init__(self, plan: str, drift: float = 0.004, noise: float = 0.01, restarts: bool = True):
        self.plan, self.drift, self.noise = plan, drift, noise
        self.up: dict[tuple, int] = {}  # arm key -> requests its server has served
        self.log: list[tuple] = []  # (method, requests its server had served, measured clock)
        self.clock = 0
        self.rng = random.Random(7)
        if not restarts:  # the old engine: it restarted stateful drafters itself, nothing else
            self.restart = self.served = None

    @staticmethod
    def _key(arm) -> tuple:
        return (arm.method, arm.depth, tuple(arm.flags))

    def restart(self, arm):
        self.up.pop(self._key(arm), None)

    def served(self, arm):
        return self.up.get(self._key(arm), 0)

    def interleaving(self, arms):
        return self.plan

    def load(self, target, draft=None):
        self.up[("baseline", 0, ())] = 0
        return 0.1

    def tokenize(self, text):
        return tuple(ord(c) % 50 for c in text)

    def versions(self):
        return {"llama-server.build": "1"}

    def generate(self, request) -> Generation:
        key = (request.method, request.depth, tuple(request.flags))
        if self.plan == "blocks":
            self.up = {k: v for k, v in self.up.items() if k == key}
        if self.restart is None and request.method == "ngram-mod":
            self.up.pop(key, None)  # the old engine's fresh server for a stateful drafter
        served = self.up.setdefault(key, 0)
        speed = 100.0 * (COLD[served] if served < len(COLD) else 1.0)
        speed *= (1 - self.drift) ** self.clock * math.exp(self.rng.gauss(0, self.noise))
        self.log.append((request.method, served, self.clock))
        self.up[key] = served + 1
        self.clock += 1
        n = request.max_new_tokens
        return Generation(
            tokens=list(range(n)),
            prompt_tokens=len(request.prompt_tokens),
            prefill_seconds=0.01,
            decode_seconds=(n - 1) / speed,
            token_times_seconds=[0.01 + i / speed for i in range(n)],
            peak_memory_bytes=0,
            server=ServerRun(system="llama-server", version="b1-abc", command="llama-server -m t.gguf",
                             drafted=0 if request.method != "baseline" else None,
                             accepted=0 if request.method != "baseline" else None,
                             interleaving=self.plan),
        )  # fmt: skip


def spec(state: str = "warm", **overrides) -> JobSpec:
    fields = dict(
        engine="llama-server",
        model={"target": "/models/t.gguf"},
        prompt_set="conversation",
        prompt_category="conversation",
        prompt_set_digest="cd" * 32,
        prompts=tuple(Prompt(f"p{i}", f"prompt number {i}, a distinct one") for i in range(4)),
        arms=ARMS,
        max_new_tokens=16,
        warmup=10,
        repeats=6,
        settings=Settings(server_state=state),
    )
    fields.update(overrides)
    return JobSpec(**fields)


def measure(engine, s):
    runs = []
    run_job(s, engine, runs.append, "job", 1, TARGET, sample=lambda: {}, sleep=lambda _: None)
    return runs


def pairs(runs):
    by = {}
    for r in runs:
        by.setdefault((r.prompt_id, r.repeat), {})[r.method] = r
    return [(p["baseline"], p["ngram-mod"]) for p in by.values()]


def log_ratios(runs) -> list[float]:
    return [math.log(a.decode_tokens_per_second / b.decode_tokens_per_second) for b, a in pairs(runs)]


def within_noise(logs: list[float], floor: float = 0.03) -> bool:
    """The geometric-mean ratio is 1.00x within 4 standard errors of the paired log ratios (and a
    floor), the noise of this very measurement."""
    se = statistics.stdev(logs) / math.sqrt(len(logs))
    return abs(statistics.fmean(logs)) <= max(floor, 4 * se)


@pytest.mark.parametrize("plan,state", [("rotated", "warm"), ("rotated", "fresh"), ("blocks", "warm")])
def test_a_drafter_with_no_effect_measures_1x_in_every_mode(plan, state):
    engine = StatefulServers(plan)
    runs = measure(engine, spec(state))
    logs = log_ratios(runs)
    assert len(logs) == 4 * 6
    gm = math.exp(statistics.fmean(logs))
    assert within_noise(logs), (plan, state, gm)
    assert abs(gm - 1) < 0.02, gm  # noise 1% a run: 24 pairs put the mean well inside 2%
    recorded = "fresh" if plan == "blocks" else state
    assert {r.settings.server_state for r in runs} == {recorded}
    for base, arm in pairs(runs):  # the same state: both servers had served as many requests
        assert base.settings.server_requests == arm.settings.server_requests > 0
        assert base.warmup_runs == arm.warmup_runs
        assert abs(base.position - arm.position) == 1  # back to back in their repeat
    assert all(r.settings.warmup_converged is True for r in runs)


def test_the_old_protocol_measured_the_same_drafter_slower_a_cold_server_against_a_warm_one():
    """What the fair protocol fixes, shown on the same fake: with a fresh server per ngram-mod run
    (the old engine's) and no state kept equal, no-effect ngram-mod measures about 0.5x."""
    engine = StatefulServers("rotated", restarts=False)
    runs = measure(engine, spec("warm"))
    gm = math.exp(statistics.fmean(log_ratios(runs)))
    assert gm < 0.6 and not within_noise(log_ratios(runs))


def test_blocks_pairs_are_adjacent_in_time_so_drift_cancels():
    """A machine slowing 1% a request: a pair a whole block apart would read about 0.9x; adjacent
    pairs, each on a server started for it and warmed up after the start, read 1.00x."""
    engine = StatefulServers("blocks", drift=0.01, noise=0.0)
    runs = measure(engine, spec("warm", warmup=3))
    # Every measured run comes right after its own warm-up on a server started for it (served
    # counts 0, 1, 2 the warm-up, 3 the measured run), and its pair partner follows the next one.
    # After the first prompt's settling warm-ups (2 arms x 3) and its greedy reference (a baseline run).
    served = [n for _, n, _ in engine.log[2 * 3 + 1 :]]
    assert served[:8] == [0, 1, 2, 3] * 2
    for base, arm in pairs(runs):
        assert base.settings.server_requests == arm.settings.server_requests == base.warmup_runs == 3
    gm = math.exp(statistics.fmean(log_ratios(runs)))
    assert abs(gm - 1) < 0.05, gm  # 1 - (0.99 ** 4): the pair is 4 requests apart, its order balanced


def test_warm_servers_are_topped_up_to_the_same_count_and_unsteady_warm_up_is_flagged():
    class Unsteady(StatefulServers):
        def generate(self, request):
            gen = super().generate(request)
            if request.method == "ngram-mod":  # never two runs within 5%: reaches the cap
                gen = replace(gen, decode_seconds=gen.decode_seconds * (1.5 if self.clock % 2 else 1.0))
            return gen

    engine = Unsteady("rotated")
    runs = measure(engine, spec("warm", warmup=4, repeats=2))
    assert {r.warmup_runs for r in runs} == {4}  # the baseline's 3 topped up to ngram-mod's 4
    for base, arm in pairs(runs):
        assert base.settings.server_requests == arm.settings.server_requests
    assert {r.settings.warmup_converged for r in runs if r.method == "ngram-mod"} == {False}
    assert {r.settings.warmup_converged for r in runs if r.method == "baseline"} == {True}
    none = measure(StatefulServers("rotated"), spec("warm", warmup=0, repeats=2))
    assert {r.settings.warmup_converged for r in none} == {None}  # no warm-up asked: unknown


# ---------------------------------------------------------------- the real llama-server


@needs_llama_server
@pytest.mark.process
@pytest.mark.parametrize(
    "memory,state", [(16 * 2**30, "warm"), (16 * 2**30, "fresh"), (2**20, "warm")], ids=["rotated", "fresh", "blocks"]
)
def test_real_llama_server_ngram_mod_that_cannot_draft_measures_1x(tiny_models, tmp_path, memory, state):
    from agent.engines import make_engine

    engine = make_engine("llama-server", memory_bytes=memory, log_dir=str(tmp_path))
    target = ModelIdentity(reference="tiny.gguf", digest="ab" * 32, context_length=256)
    texts = [
        "The quick brown fox jumps over the lazy dog.",
        "A cat sat on a mat by the door.",
        "Rain fell on the quiet town all night.",
        "Numbers add up when you count them.",
    ]
    # ngram-mod keeps state across requests: a server started for every run in every mode (issue 37)
    s = spec(state, model={"target": str(tiny_models.gguf_target)}, warmup=3, repeats=2,
             prompts=tuple(Prompt(f"p{i}", t) for i, t in enumerate(texts[:3])))  # fmt: skip
    runs = []
    run_job(s, engine, runs.append, "job", 1, target, sample=lambda: {}, sleep=lambda _: None)
    plan = "blocks" if memory < 2**30 else "rotated"
    assert {r.interleaving for r in runs} == {plan}
    assert {r.settings.server_state for r in runs} == {"fresh"}
    assert {r.settings.drafter_start for r in runs} == {"unseen"}
    arms = [r for r in runs if r.method == "ngram-mod"]
    assert arms and all(r.tokens_drafted == 0 for r in arms)  # it cannot draft: no effect
    assert all(r.lossless is True for r in runs)
    for base, arm in pairs(runs):
        assert base.settings.server_requests == arm.settings.server_requests
    logs = log_ratios(runs)
    # A shared machine is noisy: the bound is this measurement's own noise (4 standard errors of
    # the paired log ratios), never a fixed figure; a cold arm against a warm baseline fails it.
    assert within_noise(logs, floor=0.1), math.exp(statistics.fmean(logs))


# ---------------------------------------------------------------- a drafter that drafts (issue 37)


def test_warm_ups_never_send_the_measured_request_and_runs_say_so():
    """Every warm-up and topping-up request is the measured one reversed; the only unmeasured
    request of a prompt's own tokens is one baseline run (the greedy reference: no drafter to
    prime). Runs record drafter_start: unseen where a drafter cannot have seen the request (a
    server started for the run), unknown on a warm server that does not say whether it keeps state."""

    class Recording(StatefulServers):
        def generate(self, request):
            self.sent.append((request.method, tuple(request.prompt_tokens)))
            return super().generate(request)

    for state in ("warm", "fresh"):
        engine = Recording("rotated")
        engine.sent = []
        runs = measure(engine, spec(state, repeats=2))
        tokens = {engine.tokenize(p.text) for p in spec().prompts}
        forward = [(m, sent) for m, sent in engine.sent if sent in tokens]
        backward = [(m, sent) for m, sent in engine.sent if tuple(reversed(sent)) in tokens]
        assert len(forward) + len(backward) == len(engine.sent) and backward  # nothing else was sent
        assert len(forward) == len(runs) + len(tokens)  # the measured runs and one reference per prompt
        unmeasured = [m for m, _ in forward]
        for r in runs:
            unmeasured.remove(r.method)
        assert unmeasured == ["baseline"] * len(tokens)
        assert {r.settings.drafter_start for r in runs} == ({"unseen"} if state == "fresh" else {None})


def test_a_drafter_that_keeps_state_is_measured_fresh_in_every_mode():
    class Stateful(StatefulServers):
        def keeps_state(self, arm):
            return arm.method == "ngram-mod"

    for plan in ("rotated", "blocks"):
        for state in ("warm", "fresh"):
            runs = measure(Stateful(plan), spec(state, repeats=2))
            assert {r.settings.server_state for r in runs} == {"fresh"}
            assert {r.settings.drafter_start for r in runs} == {"unseen"}


SMOLLM2 = (
    Path(os.environ.get("SPECFLEET_MODELS_DIR") or Path(__file__).resolve().parents[1] / ".data" / "models")
    / "SmolLM2-135M-Instruct.Q4_1.gguf"
)
DRAFTING = Arm("ngram-mod", 16, ("--spec-ngram-mod-n-match", "4", "--spec-ngram-mod-n-min", "1"))
# Prompts whose answers repeat their own words, where ngram-mod drafts on SmolLM2.
REPEATING = (
    "Write the numbers from one to twenty in words, separated by commas.",
    "List the days of the week twice, one per line.",
)


def acceptance(run) -> float:
    return run.tokens_accepted / run.tokens_drafted if run.tokens_drafted else 0.0


MODES = [(16 * 2**30, "warm"), (16 * 2**30, "fresh"), (2**20, "warm")]


# A server started for every ngram-mod run and its warm-up, on a real model: 950 s for one mode
# on the shared 2-core machine at load 12 (the default 600 s timeout stopped it mid-request).
REAL_DRAFTING_SECONDS = 1800


@needs_llama_server
@pytest.mark.process
@pytest.mark.engine
@pytest.mark.timeout(REAL_DRAFTING_SECONDS)
@pytest.mark.parametrize("model", ["smollm2", "tiny"])
@pytest.mark.parametrize("memory,state", MODES, ids=["rotated", "fresh", "blocks"])
def test_real_ngram_mod_that_drafts_is_never_primed_by_a_warm_up_or_an_earlier_repeat(
    tmp_path, tiny_models, model, memory, state
):
    """llama-server keeps ngram-mod's table across requests: the same request a second time on one
    server accepts far more (on SmolLM2 0% then 75%, issue 37). The protocol measures every
    ngram-mod run on a server started for it and warmed up on other text, so the first measured
    repeat's acceptance equals the later repeats' and a never-warmed server's, in every mode. On
    SmolLM2 (make real-models) and on the tiny target, whose greedy text loops: ngram-mod drafts there."""
    from agent.engines import make_engine
    from agent.engines.base import EngineError, Request

    path = SMOLLM2 if model == "smollm2" else tiny_models.gguf_target
    if not path.is_file():
        pytest.skip(f"{path} is not installed: make real-models")
    target = ModelIdentity(reference=path.name, digest="ab" * 32, context_length=8192 if model == "smollm2" else 256)
    s = spec(state, model={"target": str(path)}, arms=(Arm("baseline"), DRAFTING), warmup=1, repeats=2,
             max_new_tokens=48, prompts=tuple(Prompt(f"p{i}", t) for i, t in enumerate(REPEATING)))  # fmt: skip
    if model == "tiny":
        s = replace(s, max_new_tokens=96)  # its loops come after a few dozen tokens
    # One ggml thread per server: two spin-wait for each other at every op, and beside the
    # suite's other workers on two cores a descheduled one stalls both (a mode took 390 s, not 100).
    s = replace(s, settings=replace(s.settings, threads=1))
    engine = make_engine("llama-server", memory_bytes=memory, log_dir=str(tmp_path), settings=s.settings)
    runs = []
    try:
        run_job(s, engine, runs.append, "job", 1, target, sample=lambda: {}, sleep=lambda _: None)
    except EngineError as e:  # llama-server's CPU build dies loading real models on some hosts
        if model == "smollm2" and "exited at start with status -11" in str(e):
            pytest.skip(f"llama-server crashed loading {path.name} on this host (SIGSEGV at start): {e}"[:300])
        raise
    arms = [r for r in runs if r.method == "ngram-mod"]
    assert {r.settings.server_state for r in runs} == {"fresh"} and {r.settings.drafter_start for r in runs} == {
        "unseen"
    }
    assert all(r.lossless is True for r in runs) and sum(r.tokens_drafted for r in arms) > 0  # it drafts
    # A server that never saw anything, one request per prompt: the unprimed acceptance.
    fresh = make_engine("llama-server", memory_bytes=memory, log_dir=str(tmp_path / "fresh"), settings=s.settings)
    fresh.load(str(path))
    unprimed, primed = {}, {}
    try:
        for r in arms:
            if r.repeat == 0:
                fresh.restart(DRAFTING)
                request = Request(tokens_of(fresh, s, r.prompt_id), max_new_tokens=s.max_new_tokens, method="ngram-mod",
                                  depth=16, settings=s.settings, flags=DRAFTING.flags)  # fmt: skip
                first, second = fresh.generate(request), fresh.generate(request)
                unprimed[r.prompt_id] = first.server.accepted / max(first.server.drafted, 1)
                primed[r.prompt_id] = second.server.accepted / max(second.server.drafted, 1)
    finally:
        fresh.close()
    for pid in unprimed:
        mine = sorted((r for r in arms if r.prompt_id == pid), key=lambda r: r.repeat)
        rates = [acceptance(r) for r in mine]
        print(
            f"{model} {state} {pid}: measured repeats {rates}, unprimed {unprimed[pid]:.3f}, primed {primed[pid]:.3f}"
        )
        assert max(rates) - min(rates) <= 0.1, (pid, rates)  # the first repeat is like the later ones
        assert abs(rates[0] - unprimed[pid]) <= 0.15, (pid, rates, unprimed[pid], primed[pid])
    # what the protocol guards against: the identical request again on one server is primed
    assert sum(primed.values()) > sum(unprimed.values()) + 0.2, (primed, unprimed)


def tokens_of(engine, s: JobSpec, prompt_id: str) -> list[int]:
    """The prompt tokens the protocol measured for `prompt_id` (its chat template, no context)."""
    from agent import prompts

    resolved = prompts.resolved_spec(s, engine)
    text = next(p.text for p in resolved.prompts if p.id == prompt_id)
    return list(prompts.build(prompts.tokenizer(engine, resolved.settings), text, (), engine.tokenize))
