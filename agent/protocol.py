"""The measurement protocol inside one job (one cell on one machine).

Load once. Build every prompt's tokens: the cell's context depth of distinct documents, then
the prompt (agent/prompts.py), refusing a length the model cannot hold. Then for every repeat
run every prompt with all arms back to back, in the order of one row of a Williams design
(specfleet/design.py: each arm follows every other equally often; the repeats are rounded up to
complete the design), so that paired ratios come from adjacent runs in the same thermal window.
Server arms whose servers cannot all stay up at once (the engine's `interleaving`) run in blocks
instead: per repeat, each arm in the Williams row's order runs every prompt on its own server.
Before a prompt's first measured run each arm warms up on it until two consecutive runs agree
within 5% (at most `warmup_cap` runs); the baseline's last warm-up output is the greedy
reference for `lossless`. Sampled runs take a seed per prompt and repeat, derived from the
sweep's (`run_seed`), shared by the repeat's arms; on engines whose loops reproduce the baseline
with the same seed a sampled arm must emit the same-seed baseline's tokens. With
`cooldown_seconds` the machine rests that long before every measured run.
Environment readings are taken before and after every run (agent/environment.py), and the energy
the run drew where the machine has a readable counter (agent/energy.py). Every run is
emitted as a `RunRecord`, built here once, naming the system under test (`system_of`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import time
import uuid
from collections.abc import Callable

from agent import energy, environment, prompts
from agent.engines.base import Engine, EngineError, Generation, Request
from agent.summary import acceptance_flags, relative_spread, server_flags, summarise
from specfleet import settings as declared
from specfleet.design import rounded_repeats, williams
from specfleet.record import (
    IN_PROCESS_ENGINES,
    SAME_SEED_REPRODUCIBLE,
    VERIFY_COST,
    Arm,
    JobSpec,
    ModelIdentity,
    RunRecord,
    Sampler,
    Settings,
)

WARMUP_AGREEMENT = 0.05  # two consecutive warm-up runs within 5% of each other count as steady


class ContextTooLong(EngineError):
    """A prompt with its context and generation does not fit in the model's own context."""


def engine_version(versions: dict[str, str]) -> str:
    """Every library version of an engine in one checked string, "k=v k=v" sorted by key."""
    return " ".join(f"{k}={v}" for k, v in sorted(versions.items()))


def run_seed(base: int, repeat: int, prompt_id: str) -> int:
    """The seed of one (prompt, repeat): derived from the sweep's seed, so that sampled repeats are
    replicates and every machine samples the same seeds; every arm of the repeat shares it."""
    digest = hashlib.sha256(f"{base}:{repeat}:{prompt_id}".encode()).digest()
    return int.from_bytes(digest[:4], "little") & 0x7FFFFFFF


def check_context(length: int, spec: JobSpec, target: ModelIdentity, prompt_id: str) -> None:
    """Refuse a run that needs more positions than the model was made for."""
    needed = length + spec.max_new_tokens + max((a.depth for a in spec.arms), default=0) + 1
    if target.context_length and needed > target.context_length:
        raise ContextTooLong(
            f"prompt {prompt_id} needs {needed} positions ({length} prompt tokens with {spec.context_tokens} of "
            f"context, {spec.max_new_tokens} new tokens and the draft depth) but the model "
            f"{target.reference} holds at most {target.context_length} (its own context length)"
        )


def system_of(spec: JobSpec) -> str:
    """The system a job's runs measure: our loops, llama-server, or the named OpenAI server."""
    if spec.engine in IN_PROCESS_ENGINES:
        return "specfleet"
    if spec.engine == "llama-server":
        return "llama-server"
    return (spec.server.system if spec.server else "") or "openai"


def run_job(
    spec: JobSpec,
    engine: Engine,
    emit: Callable[[RunRecord], None],
    job_id: str,
    attempt: int,
    target: ModelIdentity,
    draft: ModelIdentity | None = None,
    sample: Callable[[], dict[str, str]] = environment.sample,
    sleep: Callable[[float], None] = time.sleep,
    memory_total_bytes: int | None = None,
    meter: energy.Meter | None = None,
) -> int:
    """Run a job spec on an engine, calling emit(record) for every measured run. `sample` reads
    the environment, `sleep` cools down, `meter` reads the energy of every measured run (by
    default this machine's counter, agent/energy.py). Returns the number of runs emitted. The
    engine is closed at the end, whatever happens (a server engine stops its servers)."""
    meter = meter or energy.Meter(energy.detect())
    try:
        return _run_job(spec, engine, emit, job_id, attempt, target, draft, sample, sleep, memory_total_bytes, meter)
    finally:
        close = getattr(engine, "close", None)
        if close is not None:
            close()


def _run_job(spec, engine, emit, job_id, attempt, target, draft, sample, sleep, memory_total_bytes, meter) -> int:
    load_seconds = engine.load(spec.model["target"], spec.model.get("draft"))
    arms = list(spec.arms)
    prefix = prompts.context(engine.tokenize, spec.documents, spec.context_tokens)
    prompt_tokens = {}
    for p in spec.prompts:
        tokens = prompts.build(engine.tokenize, p.text, prefix)
        check_context(len(tokens), spec, target, p.id)
        prompt_tokens[p.id] = tokens
    design = williams(len(arms))
    repeats = rounded_repeats(spec.repeats, len(arms))
    # Server arms that cannot all stay up at once run in blocks: one arm's server, every prompt.
    plan = engine.interleaving(arms) if hasattr(engine, "interleaving") else "rotated"
    common = dict(
        job_id=job_id,
        attempt=attempt,
        engine=spec.engine,
        engine_version=engine_version(engine.versions()),
        backend=engine.backend() if hasattr(engine, "backend") else "",
        system=system_of(spec),
        target=target,
        draft=draft or ModelIdentity(),
        sampler=spec.sampler,
        prompt_set=spec.prompt_set,
        prompt_set_digest=spec.prompt_set_digest,
        prompt_category=spec.prompt_category,
        context_tokens=spec.context_tokens,
        max_new_tokens=spec.max_new_tokens,
        load_seconds=load_seconds,
        cooldown_seconds=spec.cooldown_seconds,
        arm_order="williams" if len(arms) > 1 else "single",
        settings=declared.for_engine(spec.settings, spec.engine),  # what the job ran with, as recorded
    )

    def request(arm: Arm, tokens, sampler: Sampler = spec.sampler) -> Request:
        return Request(
            prompt_tokens=tokens,
            max_new_tokens=spec.max_new_tokens,
            method=arm.method,
            depth=arm.depth,
            sampler=sampler,
            settings=spec.settings,
            flags=arm.flags,
            command=arm.command,
        )

    def warm_up(arm: Arm, tokens) -> tuple[int, Generation | None]:
        """Runs until two consecutive decode speeds agree within WARMUP_AGREEMENT, at most the
        cap; (runs, the last generation)."""
        speeds, gen = [], None
        for _ in range(spec.warmup_cap):
            gen = engine.generate(request(arm, tokens))
            speeds.append(summarise(gen)["decode_tokens_per_second"])
            if len(speeds) >= 2 and relative_spread(speeds[-2:]) <= WARMUP_AGREEMENT:
                break
        return len(speeds), gen

    warmups: dict[tuple[str, Arm], int] = {}
    references: dict[str, list[int]] = {}  # greedy reference per prompt: the baseline's last warm-up

    def warm(pid: str, arm: Arm) -> None:
        if (pid, arm) not in warmups:
            warmups[pid, arm], gen = warm_up(arm, prompt_tokens[pid])
            if arm.method == "baseline" and gen is not None:
                references[pid] = gen.tokens

    def measure(pid: str, arm: Arm, position: int, sampler: Sampler) -> tuple[Arm, Generation, dict]:
        if spec.cooldown_seconds > 0:
            sleep(spec.cooldown_seconds)
        env_before = sample()
        started = time.time()
        gen, drawn = meter.measure(lambda: engine.generate(request(arm, prompt_tokens[pid], sampler)))
        env_after = sample()
        nominal, reasons = environment.judge(env_before, env_after, os.cpu_count(), memory_total_bytes)
        return (
            arm,
            gen,
            dict(
                position=position,
                started_at_unix_seconds=started,
                env_before=environment.reading(env_before),
                env_after=environment.reading(env_after),
                env_nominal=nominal,
                env_reasons=tuple(reasons),
                **energy_fields(drawn, len(gen.tokens)),
                power_mode=environment.power_mode(env_before),
            ),
        )

    emitted = 0

    def emit_repeat(pid: str, repeat: int, seed: int, block: list) -> None:
        """Emit one prompt's runs of one repeat, once its same-seed baseline is known."""
        nonlocal emitted
        if pid not in references:
            references[pid] = engine.generate(request(Arm("baseline"), prompt_tokens[pid])).tokens
        same_seed = next((g.tokens for a, g, _ in block if a.method == "baseline"), None)
        for arm, gen, fields in block:
            lossless, check = losslessness(spec, gen.tokens, references[pid], same_seed)
            emit(
                RunRecord(
                    run_id=str(uuid.uuid4()),
                    method=arm.method,
                    depth=arm.depth,
                    prompt_id=pid,
                    repeat=repeat,
                    lossless=lossless,
                    lossless_check=check,
                    run_seed=seed,
                    warmup_runs=warmups[pid, arm],
                    **fields,
                    **summarise(gen),
                    **acceptance_flags(arm.method, gen),
                    **{**common, **server_settings(common["settings"], gen)},
                )
            )
            emitted += 1

    def seed_of(repeat: int, pid: str) -> int:
        return spec.sampler.seed if spec.sampler.greedy else run_seed(spec.sampler.seed, repeat, pid)

    def sampler_of(seed: int) -> Sampler:
        return dataclasses.replace(spec.sampler, seed=seed)

    if plan == "blocks":
        # Each arm in turn runs every prompt (the arms' order a Williams row per repeat).
        for repeat in range(repeats):
            blocks: dict[str, list] = {pid: [] for pid in prompt_tokens}
            for position, arm in enumerate(arms[i] for i in design[repeat % len(design)]):
                for pid in prompt_tokens:
                    warm(pid, arm)
                    blocks[pid].append(measure(pid, arm, position, sampler_of(seed_of(repeat, pid))))
            for pid, block in blocks.items():
                emit_repeat(pid, repeat, seed_of(repeat, pid), block)
    else:
        for pid in prompt_tokens:
            for arm in (arms[i] for i in design[0]):
                warm(pid, arm)
            for repeat in range(repeats):
                seed = seed_of(repeat, pid)
                row = (arms[i] for i in design[repeat % len(design)])
                block = [measure(pid, arm, position, sampler_of(seed)) for position, arm in enumerate(row)]
                emit_repeat(pid, repeat, seed, block)
    if spec.verify_cost is not None:
        emitted += verify_cost_runs(spec, engine, common, emit)
    return emitted


def server_settings(settings: Settings, gen: Generation) -> dict:
    """A server run's settings with the flags its server was started with (a checked key)."""
    if gen.server is None:
        return {}
    return {"settings": dataclasses.replace(settings, server_flags=server_flags(gen.server.command))}


def energy_fields(drawn: energy.Energy | None, tokens: int) -> dict:
    """A run record's energy fields: nothing where no counter was read."""
    if drawn is None:
        return {}
    return dict(
        energy_source=drawn.source,
        energy_joules=drawn.joules,
        joules_per_token=drawn.joules / tokens if tokens else None,
    )


def losslessness(spec: JobSpec, tokens, greedy_reference, same_seed_baseline) -> tuple[bool | None, str]:
    """(lossless, how it was checked). Greedy: against the prompt's greedy reference. Sampled,
    on an engine whose loops draw one number per emitted token: against the same-seed baseline
    of the repeat. Otherwise not checkable."""
    if spec.sampler.greedy:
        return tokens == greedy_reference, "greedy reference"
    if spec.engine in SAME_SEED_REPRODUCIBLE and same_seed_baseline is not None:
        return tokens == same_seed_baseline, "same-seed baseline"
    return None, "not checkable"


def verify_cost_runs(spec: JobSpec, engine: Engine, common: dict, emit: Callable[[RunRecord], None]) -> int:
    """One run per context depth: the target's forward time for 1..M query rows, the curve that
    decides whether verifying K drafted tokens can be cheaper than K decodes."""
    vc = spec.verify_cost
    for context in vc.context_tokens:
        started = time.time()
        seconds = engine.verify_cost(context, vc.max_rows, vc.repeats)
        emit(
            RunRecord(
                run_id=str(uuid.uuid4()),
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
                verify_cost_seconds=tuple(seconds),
                **{**common, "context_tokens": context},
            )
        )
    return len(vc.context_tokens)
