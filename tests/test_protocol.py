"""The measurement protocol with a fake engine that records every call: load once, warm-up
stopping rule per prompt, Williams order of the arms, cool-down before every run, paired runs
adjacent, context depth, typed records."""

from collections import Counter

import pytest

from agent import prompts
from agent.engines.base import Generation, Round
from agent.protocol import WARMUP_AGREEMENT, ContextTooLong, run_job, run_seed
from agent.summary import acceptance_flags, summarise
from specfleet.design import rounded_repeats, williams
from specfleet.record import Arm, ModelIdentity, Prompt, Sampler
from tests.support.fake_engine import ARMS, TARGET, FakeEngine, run, spec


def test_williams_design_balances_position_and_carry_over():
    for n in range(1, 8):
        rows = williams(n)
        assert len(rows) == (1 if n == 1 else n if n % 2 == 0 else 2 * n)
        assert all(sorted(r) == list(range(n)) for r in rows)
        for position in range(n):  # every arm in every position equally often
            assert Counter(r[position] for r in rows) == Counter({a: len(rows) // n for a in range(n)})
        follows = Counter((r[i], r[i + 1]) for r in rows for i in range(n - 1))
        if n > 1:  # every arm follows every other equally often
            assert set(follows) == {(a, b) for a in range(n) for b in range(n) if a != b}
            assert len(set(follows.values())) == 1, (n, follows)
    assert [rounded_repeats(r, 3) for r in (1, 6, 7)] == [6, 6, 12] and rounded_repeats(3, 2) == 4


def test_warmup_per_prompt_stops_when_two_runs_agree_within_5_percent_or_at_the_cap():
    # p1: baseline 100, 150, 154 (within 5%: 3 runs); draft 100, 104 (2 runs); ngram never steady (cap 3).
    # p2: every arm steady at once (100, 100: 2 runs each).
    speeds = {"baseline": [100, 150, 154], "draft": [100, 104], "ngram": [100, 200, 400]}
    engine, log, runs = run(spec(), speeds)
    assert engine.loads == 1 and log[0] == ("load", "/models/t", "/models/d")
    assert abs(154 - 150) / 152 <= WARMUP_AGREEMENT < abs(150 - 100) / 125
    warmups = {(r.prompt_id, r.method): r.warmup_runs for r in runs}
    assert warmups == {
        ("p1", "baseline"): 3, ("p1", "draft"): 2, ("p1", "ngram"): 3,
        ("p2", "baseline"): 2, ("p2", "draft"): 2, ("p2", "ngram"): 2,
    }  # fmt: skip
    generates = [e for e in log if e[0] == "generate"]
    p1, p2 = (FakeEngine([], {}).tokenize(t) for t in ("hello", "world!"))
    # Each prompt's warm-up comes right before its first measured run, on that prompt reversed
    # (never the measured request: issue 37), then one unmeasured baseline run on the prompt, the
    # greedy reference.
    assert [g[1] for g in generates[:8]] == ["baseline"] * 3 + ["draft"] * 2 + ["ngram"] * 3
    assert all(list(g[3]) == list(reversed(p1)) for g in generates[:8]) and list(p1) != list(reversed(p1))
    assert generates[8][1] == "baseline" and list(generates[8][3]) == list(p1)
    repeats = rounded_repeats(3, 3)
    first_p2 = 9 + repeats * 3
    assert all(list(g[3]) == list(reversed(p2)) for g in generates[first_p2 : first_p2 + 6])
    assert list(generates[first_p2 + 6][3]) == list(p2)
    assert len(generates) == 8 + 6 + 2 + 2 * repeats * 3  # a reference per prompt
    measured = [g for g in generates if g[1] != "baseline" and list(g[3]) in (list(p1), list(p2))]
    assert len(measured) == 2 * 2 * repeats  # every arm request of a prompt's own tokens is a measured run


def test_measured_runs_follow_the_williams_design_and_paired_runs_are_adjacent():
    _, log, runs = run(spec(warmup=0))
    repeats = rounded_repeats(3, 3)
    assert repeats == 6 and len(runs) == repeats * 2 * 3
    design = williams(3)
    for repeat in range(repeats):
        for pid in ("p1", "p2"):
            block = [r for r in runs if r.repeat == repeat and r.prompt_id == pid]
            assert [r.method for r in block] == [ARMS[i].method for i in design[repeat]]
            assert [r.position for r in block] == [0, 1, 2]
            first = runs.index(block[0])  # the arms of one prompt and repeat are back to back: adjacent
            assert runs[first : first + 3] == block
    assert all(r.lossless is True and r.arm_order == "williams" for r in runs)
    # Without warm-up a reference baseline is generated per prompt, unmeasured.
    assert sum(1 for e in log if e[0] == "generate") == len(runs) + 2


def test_cooldown_before_every_measured_run_and_environment_around_each():
    _, log, runs = run(spec(warmup=1, arms=ARMS[:2], repeats=2, cooldown_seconds=1.5))
    generates = [i for i, e in enumerate(log) if e[0] == "generate"]
    measured = generates[3:7] + generates[10:14]  # each prompt: 2 warm-ups and its reference, then 2 x 2 runs
    assert len(measured) == len(runs) == 2 * 2 * 2
    for i in measured:
        assert log[i - 2] == ("sleep", 1.5) and log[i - 1] == ("sample",) and log[i + 1] == ("sample",)
    assert sum(1 for e in log if e[0] == "sleep") == len(runs)  # never during warm-up
    assert runs[0].cooldown_seconds == 1.5

    _, log, _ = run(spec(warmup=0))
    assert not any(e[0] == "sleep" for e in log)


def test_runs_carry_typed_environment_readings_and_the_jobs_identity():
    battery = {"power_source": "battery", "thermal": "nominal"}
    unknown = {"thermal": "nominal"}  # no power reading at all
    _, _, runs = run(spec(warmup=0, repeats=1, arms=ARMS[:1]), samples=[battery, {}, unknown, unknown])
    first, second = runs
    assert first.env_nominal is False and "before: on battery power" in first.env_reasons
    assert first.env_before.power_source == "battery" and first.env_after.power_source is None
    assert first.env_before.low_power_mode is None  # unavailable is None, never a guess
    assert second.env_nominal is None and second.env_reasons == ()  # unknown, not nominal
    _, _, quiet = run(spec(warmup=0, repeats=1, arms=ARMS[:1]))
    assert all(r.env_nominal is True for r in quiet)
    assert first.target == TARGET and first.engine_version == "fake=1" and first.attempt == 2
    assert first.job_id == "job-1" and first.prompt_set_digest == "cd" * 32 and first.load_seconds == 0.25


def test_sweep_cooldown_reaches_every_job_and_bad_values_are_named():
    from specfleet.sweeps import SweepError, parse_sweep

    base = "name: cool\nmodels: {mlx: {target: /m}}\nengines: [mlx]\nprompt_sets: [code]\n"
    assert all(c.cooldown_seconds == 2.5 for c in parse_sweep(base + "cooldown_seconds: 2.5\n").cells())
    assert parse_sweep(base).cells()[0].cooldown_seconds == 0
    try:
        parse_sweep(base + "cooldown_seconds: -1\n")
    except SweepError as e:
        assert "line 5: cooldown_seconds: must be at least 0, got -1" in e.problems, e.problems
    else:
        raise AssertionError("a negative cool-down was accepted")


def test_context_depth_puts_distinct_documents_before_every_prompt():
    engine = FakeEngine([], {})
    docs = ("first document text", "second one", "third")
    prefix = prompts.context(engine.tokenize, docs, 25)
    assert prefix == engine.tokenize("first document text\n\nsecond one\n\nthird\n\n")[:25]
    built = prompts.build(engine.tokenize, "hello", prefix)
    assert built[:25] == prefix and built[25:] == engine.tokenize("hello") and len(built) == 30
    assert prompts.context(engine.tokenize, docs, 0) == ()
    assert prompts.build(engine.tokenize, "hello", ()) == engine.tokenize("hello")
    with pytest.raises(prompts.NotEnoughText, match="context of 500 tokens was asked for"):
        prompts.context(engine.tokenize, docs, 500)
    _, _, runs = run(spec(warmup=0, repeats=1, arms=ARMS[:1], documents=docs, context_tokens=25))
    assert {r.prompt_tokens for r in runs} == {30, 31} and all(r.context_tokens == 25 for r in runs)


def test_a_context_longer_than_the_models_own_limit_is_refused_with_the_reason():
    small = ModelIdentity(reference="t", digest="ab" * 32, context_length=12)
    with pytest.raises(ContextTooLong, match="needs 14 positions .* holds at most 12 .its own context length."):
        run(spec(warmup=0, repeats=1), target=small)


def _rounds(drafted: int, accepted: int, count: int) -> list[Round]:
    return [Round(drafted, accepted, 0.001, 0.002, tuple(range(drafted)))] * count


def test_runs_whose_drafted_proposals_collapse_are_flagged_with_the_causes(monkeypatch):
    generate = FakeEngine.generate

    def with_rounds(self, request):
        gen = generate(self, request)
        if request.method != "baseline":
            gen.rounds = _rounds(4, 0, 5)  # 20 proposals, none accepted
        return gen

    monkeypatch.setattr(FakeEngine, "generate", with_rounds)
    _, _, runs = run(spec(warmup=0, repeats=1))
    by_method = {r.method: r for r in runs}
    assert by_method["draft"].acceptance_collapsed is True
    assert by_method["draft"].acceptance_reason.startswith("0 of 20 draft proposals accepted (0.0%, below 3%)")
    assert by_method["baseline"].acceptance_collapsed is None
    assert by_method["ngram"].acceptance_collapsed is None  # prompt lookup legitimately finds nothing


@pytest.mark.parametrize(
    "method,rounds,collapsed",
    [
        ("mtp", _rounds(4, 0, 5), True),
        ("mtp", _rounds(4, 1, 5), False),  # 5 of 20: low, not collapsed
        ("mtp", _rounds(3, 0, 5), False),  # 15 proposals say too little
        ("draft", _rounds(1, 0, 40), True),
    ],
)
def test_collapse_threshold(method, rounds, collapsed):
    gen = Generation([1], 1, 0.1, 0.1, [0.1], 0, rounds=rounds)
    flags = acceptance_flags(method, gen)
    assert flags["acceptance_collapsed"] is collapsed
    assert ("norm convention" in flags["acceptance_reason"]) == (collapsed and method == "mtp")


def test_inter_token_gaps_are_between_arrivals_and_rounds_have_their_own_latency():
    # Tokens 2-4 arrive together (one speculative round): a streaming client sees two gaps.
    gen = Generation([1, 2, 3, 4, 5], 1, 0.01, 0.04, [0.01, 0.03, 0.03, 0.03, 0.05], 0, rounds=_rounds(2, 2, 2))
    figures = summarise(gen)
    assert figures["inter_token_latency_p50_seconds"] == pytest.approx(0.02)  # never 0 from the burst
    assert figures["round_latency_p50_seconds"] == pytest.approx(0.003)
    assert summarise(Generation([1], 1, 0.01, 0.0, [0.01], 0))["inter_token_latency_p50_seconds"] is None


def test_sampled_repeats_take_derived_seeds_and_are_checked_against_the_same_seed_baseline():
    sampled = Sampler(temperature=0.8, top_p=0.9, seed=11)
    _, _, runs = run(spec(warmup=0, repeats=2, arms=ARMS[:2], sampler=sampled))
    seeds = {(r.prompt_id, r.repeat): {x.run_seed for x in runs if (x.prompt_id, x.repeat) == (r.prompt_id, r.repeat)}
             for r in runs}  # fmt: skip
    assert all(len(s) == 1 for s in seeds.values())  # the arms of one repeat share a seed: pairs
    assert len({next(iter(s)) for s in seeds.values()}) == 4  # different per prompt and per repeat
    assert all(r.sampler == sampled for r in runs)  # the checked key is the sweep's sampler
    assert next(iter(seeds[("p1", 0)])) == run_seed(11, 0, "p1")  # the same on every machine
    assert all(r.lossless is None and r.lossless_check == "not checkable" for r in runs)  # the fake is "mlx"

    class SeededEngine(FakeEngine):
        name = "llama.cpp"

        def generate(self, request):
            gen = super().generate(request)
            gen.tokens = [request.sampler.seed % 7, 2, 3, 4, 5 if request.method != "ngram" else 6]
            return gen

    log, runs = [], []
    run_job(spec(engine="llama.cpp", warmup=0, repeats=2, sampler=sampled), SeededEngine(log, {}), runs.append,
            job_id="job-1", attempt=1, target=TARGET, sample=lambda: {})  # fmt: skip
    by_method = {m: [r for r in runs if r.method == m] for m in ("baseline", "draft", "ngram")}
    assert all(r.lossless is True and r.lossless_check == "same-seed baseline" for r in by_method["draft"])
    assert all(r.lossless is False for r in by_method["ngram"])  # it changed the sampled output: a defect
    greedy = run(spec(warmup=0, repeats=1))[2]
    assert all(r.lossless_check == "greedy reference" and r.run_seed == 0 for r in greedy)


class FakeServerEngine(FakeEngine):
    """A server engine as the protocol sees one: it says how its arms interleave, its runs carry
    the server's own accounting, and it is closed at the end."""

    name = "llama-server"

    def __init__(self, log, plan: str, server_tps: float):
        super().__init__(log, {})
        self.plan, self.server_tps, self.closed = plan, server_tps, 0

    def interleaving(self, arms):
        self.log.append(("interleaving", tuple(arms)))
        return self.plan

    def generate(self, request):
        from dataclasses import replace

        from agent.engines.base import ServerRun

        gen = super().generate(request)
        speculative = request.method != "baseline"
        return replace(
            gen,
            server=ServerRun(
                system="llama-server",
                version="b1 (0c1e570)",
                command=f"llama-server -m t --spec-type {request.method}" if speculative else "llama-server -m t",
                decode_tokens_per_second=self.server_tps,
                prefill_seconds=0.005,
                drafted=8 if speculative else None,
                accepted=6 if speculative else None,
                drafter_warm=False if request.method == "ngram-mod" else None,
                interleaving=self.plan,
            ),
        )

    def close(self):
        self.closed += 1


SERVER_ARMS = (Arm("baseline"), Arm("draft-mtp", 3), Arm("ngram-mod", 64, ("--spec-ngram-mod-n-min", "8")))


def run_server(plan: str, server_tps: float = 100.0):
    log, runs = [], []
    engine = FakeServerEngine(log, plan, server_tps)
    s = spec(engine="llama-server", arms=SERVER_ARMS, warmup=1, repeats=2)
    run_job(s, engine, runs.append, job_id="j", attempt=1, target=TARGET, sample=lambda: {}, sleep=lambda _: None)
    return engine, log, runs


def test_server_arms_that_cannot_stay_up_together_still_run_pairs_back_to_back_warmed_up_after_each_start():
    engine, log, runs = run_server("blocks")
    repeats = rounded_repeats(2, 3)
    assert engine.closed == 1
    assert {r.interleaving for r in runs} == {"blocks"} and len(runs) == 3 * 2 * repeats
    # Only one server can be up, so every measured run gets a server of its own, warmed up after
    # its start (warmup 1: one warm-up run of the same arm and prompt right before it), and
    # the arms of a prompt and repeat run back to back in their Williams order: pairs adjacent.
    generates = [e for e in log if e[0] == "generate"]
    order = [SERVER_ARMS[i].method for i in williams(3)[0]]
    assert [g[1] for g in generates[:3]] == order  # the prompt's settling warm-up: its count, 1
    for repeat in range(repeats):
        row = [SERVER_ARMS[i].method for i in williams(3)[repeat % len(williams(3))]]
        got = [r.method for r in runs if r.repeat == repeat and r.prompt_id == "p1"]
        assert got == row
    assert generates[3][1] == "baseline"  # the prompt's greedy reference, unmeasured
    p1 = generates[4 : 4 + 2 * 3 * repeats]  # p1's measured runs, each after its own warm-up
    assert [g[1] for g in p1[0::2]] == [g[1] for g in p1[1::2]]  # warm-up, then the run, same arm
    assert {r.settings.server_state for r in runs} == {"fresh"}  # blocks are fresh, whatever was asked
    assert {r.warmup_runs for r in runs} == {1}


def test_rotated_server_arms_interleave_like_in_process_ones():
    _, log, runs = run_server("rotated")
    methods = [e[1] for e in log if e[0] == "generate"][3:]  # after the first prompt's warm-ups
    assert methods[:3] != [methods[0]] * 3  # consecutive runs are of different arms
    assert {r.interleaving for r in runs} == {"rotated"}


def test_server_runs_carry_the_server_and_its_own_figures():
    _, _, runs = run_server("rotated", server_tps=100.0)  # the client sees 4 tokens in 0.04 s: 100 tok/s
    mtp = next(r for r in runs if r.method == "draft-mtp")
    assert mtp.system == "llama-server" and mtp.server_version == "b1 (0c1e570)"
    assert mtp.server_command.endswith("--spec-type draft-mtp")
    assert mtp.server_decode_tokens_per_second == 100.0 and mtp.timings_disagree is False
    assert (mtp.tokens_drafted, mtp.tokens_accepted) == (8, 6)  # the server's counts: a client sees no rounds
    assert next(r for r in runs if r.method == "ngram-mod").drafter_warm is False
    assert next(r for r in runs if r.method == "baseline").drafter_warm is None
    _, _, slow = run_server("rotated", server_tps=120.0)  # 100 on the client, 120 on the server: > 5% apart
    assert all(r.timings_disagree for r in slow)


def test_the_engine_is_closed_when_a_run_fails():
    class Dying(FakeServerEngine):
        def generate(self, request):
            raise RuntimeError("server died mid-run")

    engine = Dying([], "rotated", 100.0)
    with pytest.raises(RuntimeError, match="server died"):
        run_job(spec(engine="llama-server", arms=SERVER_ARMS), engine, [].append, "j", 1, TARGET, sample=lambda: {})
    assert engine.closed == 1


def test_every_run_records_the_power_mode_it_started_in():
    high = {"power_source": "ac", "thermal": "nominal", "power_mode": "high"}
    _, _, runs = run(spec(arms=(Arm("baseline"),), repeats=1, prompts=(Prompt("p1", "hello"),)), samples=[high] * 99)
    assert runs and {r.power_mode for r in runs} == {"high"}
    _, _, unknown = run(spec(arms=(Arm("baseline"),), repeats=1, prompts=(Prompt("p1", "hello"),)))
    assert {r.power_mode for r in unknown} == {None}  # not readable: unknown, not a guess
