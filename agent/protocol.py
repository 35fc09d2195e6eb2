"""The measurement protocol inside one job (one cell on one machine).

Load once; warm up each arm until two consecutive runs agree or a cap is reached; take one
unmeasured baseline output per prompt as the reference for `lossless`; then for every repeat
run every prompt with all arms back to back, rotating the arms' order each repeat, so that
paired ratios come from adjacent runs in the same thermal window. With `cooldown_seconds`
in the spec the machine rests that long before every measured run. Environment readings are
taken before and after every run; a run whose readings were not nominal is flagged
(params env.nominal = "false", env.reasons).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass

from agent import environment
from agent.engines.base import VERIFY_COST, Engine, Request, Sampler
from agent.summary import acceptance_flags, relative_spread, summarise

WARMUP_AGREEMENT = 0.10  # two consecutive warm-up runs within 10% of each other count as steady


@dataclass(frozen=True)
class Arm:
    method: str
    depth: int


def rotated(arms: list[Arm], repeat: int) -> list[Arm]:
    k = repeat % len(arms)
    return arms[k:] + arms[:k]


def fit_prompt(engine: Engine, text: str, length: int | None) -> tuple[int, ...]:
    """The prompt's tokens, exactly `length` of them when given: the text is repeated until it
    is long enough and then cut, so every model prefills the same number of tokens."""
    tokens = engine.tokenize(text)
    if length is None:
        return tokens
    while len(tokens) < length:
        text = f"{text}\n{text}"
        tokens = engine.tokenize(text)
    return tokens[:length]


def run_job(
    spec: dict,
    engine: Engine,
    emit: Callable[[dict], None],
    sample: Callable[[], dict[str, str]] = environment.sample,
    sleep: Callable[[float], None] = time.sleep,
    extra_params: dict[str, str] | None = None,
    memory_total_bytes: int | None = None,
) -> int:
    """Run a job spec on a loaded-or-not engine, calling emit(fields) for every measured run.
    `sample` reads the environment, `sleep` cools down; `extra_params` (model hashes, ...) go
    into every run's params. Returns the number of runs emitted."""
    model = spec["model"]
    cooldown = float(spec.get("cooldown_seconds", 0) or 0)
    load_seconds = engine.load(model["target"], model.get("draft"))
    sampler = Sampler(**spec["sampler"])
    arms = [Arm(a["method"], a["depth"]) for a in spec["arms"]]
    prompts = [(p["id"], fit_prompt(engine, p["text"], spec.get("prompt_tokens"))) for p in spec["prompts"]]
    max_new = spec["max_new_tokens"]
    ngram = spec.get("ngram", {})

    def request(arm: Arm, tokens) -> Request:
        return Request(
            prompt_tokens=tokens,
            max_new_tokens=max_new,
            method=arm.method,
            depth=arm.depth,
            sampler=sampler,
            ngram_min=ngram.get("n_min", 1),
            ngram_max=ngram.get("n_max", 3),
        )

    # Warm-up: per arm, on the first prompt, until steady or the cap.
    warmup_runs = {}
    for arm in arms:
        speeds = []
        for _ in range(spec["warmup"]):
            speeds.append(summarise(engine.generate(request(arm, prompts[0][1])))["decode_tokens_per_second"])
            if len(speeds) >= 2 and relative_spread(speeds[-2:]) <= WARMUP_AGREEMENT:
                break
        warmup_runs[f"{arm.method}-{arm.depth}"] = len(speeds)

    baseline = Arm("baseline", 0)
    reference = {pid: engine.generate(request(baseline, tokens)).tokens for pid, tokens in prompts}
    common = {
        "load_seconds": f"{load_seconds:.6f}",
        "sampler": ",".join(f"{k}={v}" for k, v in spec["sampler"].items()),
        "prompt_set": spec["prompt_set"],
        "max_new_tokens": str(max_new),
        "warmup_runs": ",".join(f"{k}:{v}" for k, v in warmup_runs.items()),
        **{f"version.{k}": v for k, v in engine.versions().items()},
        "model.target": model["target"],
        "model.draft": model.get("draft", ""),
        "cooldown_seconds": f"{cooldown:g}",
        **(extra_params or {}),
    }

    emitted = 0
    for repeat in range(spec["repeats"]):
        for pid, tokens in prompts:
            for position, arm in enumerate(rotated(arms, repeat)):
                if cooldown > 0:
                    sleep(cooldown)
                env_before = sample()
                started = time.time()
                gen = engine.generate(request(arm, tokens))
                env_after = sample()
                fields = summarise(gen)
                fields.update(
                    engine=spec["engine"],
                    method=arm.method,
                    depth=arm.depth,
                    prompt_id=pid,
                    repeat=repeat,
                    position=position,
                    started_at_unix_seconds=started,
                    params={
                        **common,
                        **environment.run_flags(env_before, env_after, os.cpu_count(), memory_total_bytes),
                        **acceptance_flags(arm.method, gen),
                    },
                )
                if sampler.greedy:
                    fields["lossless"] = gen.tokens == reference[pid]
                emit(fields)
                emitted += 1
    if spec.get("verify_cost"):
        emitted += verify_cost_runs(spec, engine, common, emit)
    return emitted


def verify_cost_runs(spec: dict, engine: Engine, params: dict[str, str], emit: Callable[[dict], None]) -> int:
    """One run per context depth: the target's forward time for 1..M query rows, and T(M)/T(1),
    the curve that decides whether verifying K drafted tokens can be cheaper than K decodes."""
    vc = spec["verify_cost"]
    for context in vc["context_tokens"]:
        started = time.time()
        seconds = engine.verify_cost(context, vc["max_rows"], vc["repeats"])
        metrics = {f"rows_{m}_seconds": t for m, t in enumerate(seconds, start=1)}
        metrics.update({f"rows_{m}_ratio": t / seconds[0] for m, t in enumerate(seconds, start=1)})
        emit(
            dict(
                engine=spec["engine"],
                method=VERIFY_COST,
                depth=0,
                prompt_id=f"context-{context}",
                repeat=0,
                position=0,
                prompt_tokens=context,
                generated_tokens=0,
                prefill_seconds=0.0,
                ttft_seconds=0.0,
                decode_seconds=0.0,
                wall_seconds=time.time() - started,
                decode_tokens_per_second=0.0,
                prefill_tokens_per_second=0.0,
                peak_memory_bytes=0,
                output_sha256="",
                started_at_unix_seconds=started,
                metrics=metrics,
                params={**params, "verify_cost.repeats": str(vc["repeats"])},
            )
        )
    return len(vc["context_tokens"])
