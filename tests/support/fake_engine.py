"""A fake engine that records every call the measurement protocol makes (agent/protocol.py),
a job spec for it, and run(): the protocol run on it, with its log and its records."""

from __future__ import annotations

from agent.engines.base import Generation, Request
from agent.protocol import run_job
from specfleet.record import Arm, JobSpec, ModelIdentity, Prompt

ARMS = (Arm("baseline", 0), Arm("draft", 2), Arm("ngram", 3))
TARGET = ModelIdentity(reference="t", digest="ab" * 32, context_length=4096)


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


def spec(**overrides) -> JobSpec:
    fields = dict(
        engine="mlx",
        model={"target": "/models/t", "draft": "/models/d"},
        prompt_set="code",
        prompt_category="code",
        prompt_set_digest="cd" * 32,
        prompts=(Prompt("p1", "hello"), Prompt("p2", "world!")),
        arms=ARMS,
        max_new_tokens=5,
        warmup=3,
        repeats=3,
    )
    fields.update(overrides)
    return JobSpec(**fields)


def run(s, warmup_speeds=None, samples=None, target=TARGET):
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
        job_id="job-1",
        attempt=2,
        target=target,
        sample=sample,
        sleep=lambda seconds: log.append(("sleep", seconds)),
    )
    assert n == len(runs)
    return engine, log, runs
