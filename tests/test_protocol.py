"""The measurement protocol with a fake engine that records every call: load once, warm-up
stopping rule, rotation of the arms, cool-down before every run, paired runs adjacent."""

import pytest

from agent.engines.base import Generation, Request, Round
from agent.protocol import WARMUP_AGREEMENT, Arm, fit_prompt, rotated, run_job
from agent.summary import acceptance_flags

ARMS = [{"method": "baseline", "depth": 0}, {"method": "draft", "depth": 2}, {"method": "ngram", "depth": 3}]


class FakeEngine:
    name = "mlx"
    methods = ("baseline", "draft", "ngram")

    def __init__(self, log: list, warmup_speeds: dict[str, list[float]]):
        self.log = log
        self.warmup_speeds = {k: list(v) for k, v in warmup_speeds.items()}
        self.loads = 0

    def load(self, target, draft=None):
        self.loads += 1
        self.log.append(("load", target, draft))
        return 0.25

    def tokenize(self, text):
        return tuple(ord(c) % 50 for c in text)

    def generate(self, request: Request) -> Generation:
        queue = self.warmup_speeds.get(request.method)
        speed = queue.pop(0) if queue else 100.0
        self.log.append(("generate", request.method, request.depth, request.prompt_tokens))
        return Generation(
            tokens=[1, 2, 3, 4, 5],
            prompt_tokens=len(request.prompt_tokens),
            prefill_seconds=0.01,
            decode_seconds=4 / speed,
            token_times_seconds=[0.01, 0.02, 0.03, 0.04, 0.05],
            peak_memory_bytes=1000,
        )

    def versions(self):
        return {"fake": "1"}

    def verify_cost(self, context_tokens, max_rows=16, repeats=5):
        return [0.01] * max_rows


def spec(**overrides):
    s = {
        "engine": "mlx",
        "model": {"target": "/models/t", "draft": "/models/d"},
        "sampler": {"temperature": 0.0},
        "prompt_set": "code",
        "prompts": [{"id": "p1", "text": "hello"}, {"id": "p2", "text": "world!"}],
        "arms": ARMS,
        "max_new_tokens": 5,
        "warmup": 3,
        "repeats": 3,
    }
    s.update(overrides)
    return s


def run(s, warmup_speeds=None, samples=None):
    log, runs = [], []
    engine = FakeEngine(log, warmup_speeds or {})
    readings = iter(samples or [])

    def sample():
        log.append(("sample",))
        return next(readings, {"power_source": "ac", "thermal": "nominal"})

    n = run_job(
        s,
        engine,
        runs.append,
        sample=sample,
        sleep=lambda seconds: log.append(("sleep", seconds)),
        extra_params={"model.target.sha256": "ab" * 32},
    )
    assert n == len(runs)
    return engine, log, runs


def test_rotation_order():
    arms = [Arm("a", 0), Arm("b", 1), Arm("c", 2)]
    assert [[a.method for a in rotated(arms, r)] for r in range(4)] == [
        ["a", "b", "c"],
        ["b", "c", "a"],
        ["c", "a", "b"],
        ["a", "b", "c"],
    ]


def test_warmup_stops_when_two_runs_agree_or_at_the_cap():
    # baseline: 100 then 150 (50% apart) then 152 (within 10%): 3 runs. draft: 100, 101: 2 runs.
    # ngram: never steady, capped at warmup=3.
    speeds = {"baseline": [100, 150, 152], "draft": [100, 101], "ngram": [100, 200, 400]}
    engine, log, runs = run(spec(), speeds)
    assert engine.loads == 1 and log[0] == ("load", "/models/t", "/models/d")
    assert runs[0]["params"]["warmup_runs"] == "baseline-0:3,draft-2:2,ngram-3:3"
    assert abs(152 - 150) / 151 <= WARMUP_AGREEMENT < abs(150 - 100) / 125
    generates = [e for e in log if e[0] == "generate"]
    # 8 warm-up runs on the first prompt, one reference baseline per prompt, then the measured runs.
    warmups = generates[:8]
    assert [g[1] for g in warmups] == ["baseline"] * 3 + ["draft"] * 2 + ["ngram"] * 3
    assert all(g[3] == generates[0][3] for g in warmups)
    assert [g[1] for g in generates[8:10]] == ["baseline", "baseline"]
    assert len(generates) == 8 + 2 + 3 * 2 * 3


def test_measured_runs_rotate_and_paired_runs_are_adjacent():
    _, _, runs = run(spec(warmup=0))
    assert len(runs) == 3 * 2 * 3
    for repeat in range(3):
        for pid in ("p1", "p2"):
            block = [r for r in runs if r["repeat"] == repeat and r["prompt_id"] == pid]
            expected = [a["method"] for a in ARMS[repeat:] + ARMS[:repeat]]
            assert [r["method"] for r in block] == expected
            assert [r["position"] for r in block] == [0, 1, 2]
            # The arms of one prompt and repeat are back to back in emission order: adjacent.
            first = runs.index(block[0])
            assert runs[first : first + 3] == block
    assert all(r["lossless"] is True for r in runs)


def test_cooldown_before_every_measured_run_and_environment_around_each():
    _, log, runs = run(spec(warmup=1, repeats=2, cooldown_seconds=1.5))
    measured = [i for i, e in enumerate(log) if e[0] == "generate"][3 + 2 :]  # after warm-up and references
    assert len(measured) == len(runs) == 2 * 2 * 3
    for i in measured:
        assert log[i - 2] == ("sleep", 1.5) and log[i - 1] == ("sample",) and log[i + 1] == ("sample",)
    assert sum(1 for e in log if e[0] == "sleep") == len(runs)  # never during warm-up
    assert runs[0]["params"]["cooldown_seconds"] == "1.5"

    _, log, _ = run(spec(warmup=0))
    assert not any(e[0] == "sleep" for e in log)


def test_runs_carry_environment_flags_and_extra_params():
    battery = {"power_source": "battery", "thermal": "nominal"}
    _, _, runs = run(spec(warmup=0, repeats=1, arms=ARMS[:1]), samples=[battery])
    first, second = runs
    assert first["params"]["env.nominal"] == "false" and "before: on battery power" in first["params"]["env.reasons"]
    assert first["params"]["env.before.power_source"] == "battery"
    assert first["params"]["env.after.power_source"] == "ac"
    assert first["params"]["env.before.low_power_mode"] == "unavailable"
    assert second["params"]["env.nominal"] == "true"
    assert first["params"]["model.target.sha256"] == "ab" * 32 and first["params"]["version.fake"] == "1"


def test_sweep_cooldown_reaches_every_job_and_bad_values_are_named():
    from coordinator.sweeps import SweepError, parse_sweep

    base = "name: cool\nmodels: {mlx: {target: /m}}\nengines: [mlx]\nprompt_sets: [code]\n"
    assert all(c["cooldown_seconds"] == 2.5 for c in parse_sweep(base + "cooldown_seconds: 2.5\n").cells())
    assert parse_sweep(base).cells()[0]["cooldown_seconds"] == 0
    try:
        parse_sweep(base + "cooldown_seconds: -1\n")
    except SweepError as e:
        assert any(p.startswith("cooldown_seconds: must be between 0 and 3600") for p in e.problems), e.problems
    else:
        raise AssertionError("a negative cool-down was accepted")


def test_prompts_are_fitted_to_the_sets_token_length():
    engine = FakeEngine([], {})
    assert fit_prompt(engine, "hello", None) == engine.tokenize("hello")
    fitted = fit_prompt(engine, "hello", 12)  # doubled until at least 12 tokens, then cut
    assert fitted == engine.tokenize("hello\nhello\nhello\nhello")[:12] and len(fitted) == 12
    assert fit_prompt(engine, "a long prompt", 4) == engine.tokenize("a long")[:4]
    log = []
    run_job(spec(prompt_tokens=20), FakeEngine(log, {}), lambda fields: log.append(("run", fields["prompt_tokens"])))
    measured = [entry[1] for entry in log if entry[0] == "run"]
    assert measured and set(measured) == {20}


def test_every_shipped_prompt_set_has_a_fixed_length():
    from coordinator.sweeps import parse_sweep, prompt_sets

    for name, ps in prompt_sets().items():
        assert isinstance(ps["tokens"], int) and ps["tokens"] > 0 and ps["prompts"], name
    sweep = parse_sweep("name: s\nmodels: {mlx: {target: /m}}\nengines: [mlx]\nprompt_sets: [summarise]\n")
    assert sweep.cells()[0]["prompt_tokens"] == prompt_sets()["summarise"]["tokens"]


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
    by_method = {r["method"]: r["params"] for r in runs}
    assert by_method["draft"]["acceptance.collapsed"] == "true"
    assert by_method["draft"]["acceptance.reason"].startswith("0 of 20 draft proposals accepted (0.0%, below 3%)")
    assert "acceptance.collapsed" not in by_method["baseline"]
    assert "acceptance.collapsed" not in by_method["ngram"]  # prompt lookup legitimately finds nothing


@pytest.mark.parametrize(
    "method,rounds,collapsed",
    [
        ("mtp", _rounds(4, 0, 5), "true"),
        ("mtp", _rounds(4, 1, 5), "false"),  # 5 of 20: low, not collapsed
        ("mtp", _rounds(3, 0, 5), "false"),  # 15 proposals say too little
        ("draft", _rounds(1, 0, 40), "true"),
    ],
)
def test_collapse_threshold(method, rounds, collapsed):
    gen = Generation([1], 1, 0.1, 0.1, [0.1], 0, rounds=rounds)
    flags = acceptance_flags(method, gen)
    assert flags["acceptance.collapsed"] == collapsed
    assert ("norm convention" in flags["acceptance.reason"]) == (collapsed == "true" and method == "mtp")
