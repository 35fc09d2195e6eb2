"""The measurement protocol inside one job (one cell on one machine).

Load once. Build every prompt's tokens: the cell's context depth of distinct documents, then
the prompt (agent/prompts.py), refusing a length the model cannot hold. Then for every repeat
run every prompt with all arms back to back, in the order of one row of a Williams design
(specfleet/design.py: each arm follows every other equally often; the repeats are rounded up to
complete the design), so that paired ratios come from adjacent runs in the same thermal window.
Before a prompt's first measured run each arm warms up until two consecutive runs agree within 5%
(at most `warmup` runs); a run whose arm reached the cap unsteady records
`warmup_converged=False`. No measured request is one the drafter has seen (issue 37): warm-ups
never send the measured request but its tokens reversed (`warmup_tokens`: the same length and
vocabulary, so the same shapes, caches and clocks, none of its n-grams in order), and the greedy
reference for `lossless` is an unmeasured baseline run on the prompt (the baseline has no
drafter). Drafters that keep state across requests (llama-server's ngram-mod, ngram-cache,
ngram-map-k, ngram-map-k4v: the engine's `keeps_state`) are measured fresh: each measured run on a
server started for it, so that a repeat never inherits the n-grams of the repeats before it. Every
run records `drafter_start` "unseen" (a checked key) where this holds; a warm OpenAI-compatible
server, whose drafter's state we cannot know, records None (unknown).

Server arms (llama-server) are measured in one server state for the baseline and the arm of
every pair (setting server_state, a checked key; docs/verdicts.md): "warm" keeps every arm's
server up across the job and tops every arm's warm-up up to the same number of requests
(`served`), so each pair's two servers have served equally many; "fresh" starts a server for
every measured run (`restart`) and warms it up after the start by the prompt's warm-up count
(the most any arm needed on it). Arms whose servers cannot all stay up at once (the engine's
`interleaving`: "blocks") are always fresh, so that a pair's runs stay adjacent in time there
too: in every mode the arms of one prompt and repeat run back to back. Each run records its
state and the requests its server had served before it (`server_requests`).

Sampled runs take a seed per prompt and repeat, derived from the
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
from agent.divergence import Divergences
from agent.engines.base import Engine, EngineError, Generation, Request
from agent.summary import acceptance_flags, relative_spread, summarise, text_sample
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
from specfleet.sweeps import drafter_warning

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


def warmup_tokens(tokens) -> list[int]:
    """The request a warm-up sends in place of the measured one: its tokens reversed (module
    docstring). A palindrome would be its own reverse: then rotated by one as well."""
    tokens = list(tokens)
    backwards = tokens[::-1]
    return backwards if backwards != tokens else backwards[1:] + backwards[:1]


def drafter_start(spec: JobSpec, state: str | None, stateless: bool) -> str | None:
    """What the job's drafters had seen before each measured run ("unseen", or None: unknown):
    in process, a drafter is made for each generation; a server started for the run (fresh) or
    one whose drafters keep no state (`stateless`, llama-server's word for its types) has seen
    only warm-ups on other text."""
    if spec.engine in IN_PROCESS_ENGINES or state == "fresh" or (state is not None and stateless):
        return "unseen"
    return None


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
    spec = prompts.resolved_spec(spec, engine)  # chat or raw, reasoning: what the runs use and record
    prefix = prompts.context(engine.tokenize, spec.documents, spec.context_tokens)
    tokenize_prompt = prompts.tokenizer(engine, spec.settings)
    prompt_tokens = {}
    for p in spec.prompts:
        tokens = prompts.build(tokenize_prompt, p.text, prefix, engine.tokenize)
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

    def steady(speeds: list[float]) -> bool:
        return len(speeds) >= 2 and relative_spread(speeds[-2:]) <= WARMUP_AGREEMENT

    def warm_up(arm: Arm, tokens, runs: int | None = None) -> tuple[int, bool | None, Generation | None]:
        """Runs until two consecutive decode speeds agree within WARMUP_AGREEMENT, at most the
        cap, or exactly `runs`; (runs, whether the last two agreed (None: no warm-up asked), the
        last generation)."""
        speeds, gen = [], None
        for _ in range(spec.warmup if runs is None else runs):
            gen = engine.generate(request(arm, warmup_tokens(tokens)))
            speeds.append(summarise(gen)["decode_tokens_per_second"])
            if runs is None and steady(speeds):
                break
        return len(speeds), (None if spec.warmup == 0 else steady(speeds)), gen

    # The state server arms are measured in (None: no server arms); blocks and drafters that keep
    # state across requests are always fresh.
    state = common["settings"].server_state
    keeps_state = getattr(engine, "keeps_state", None)
    stateful = keeps_state is not None and any(keeps_state(arm) for arm in arms)
    if state is not None and (plan == "blocks" or stateful):
        state = "fresh"
    start = drafter_start(spec, state, stateless=keeps_state is not None and not stateful)
    restart = getattr(engine, "restart", None)
    served = getattr(engine, "served", None)
    warmups: dict[tuple[str, Arm], int] = {}  # warm-up runs before an arm's measured runs of a prompt
    converged: dict[tuple[str, Arm], bool | None] = {}
    counts: dict[str, int] = {}  # server arms: every arm's warm-up runs on a prompt (the most any needed)
    references: dict[str, list[int]] = {}  # greedy reference per prompt: an unmeasured baseline run

    def settle(pid: str, order: list[Arm]) -> None:
        """A prompt's first warm-up: each arm until steady or the cap (fresh: on a server started
        for it). Server arms then share the prompt's warm-up count, the most any arm needed, and
        warm servers are topped up so that every arm's has served as many requests."""
        tokens = prompt_tokens[pid]
        for arm in order:
            if state == "fresh" and restart is not None:
                restart(arm)
            warmups[pid, arm], converged[pid, arm], _ = warm_up(arm, tokens)
        # The greedy reference: an unmeasured run of the baseline (no drafter to prime) on the prompt.
        references[pid] = engine.generate(request(Arm("baseline"), tokens)).tokens
        if state == "warm" and served is None:  # the top-up below counts it as the baseline's warm-up
            warmups[pid, Arm("baseline")] = warmups.get((pid, Arm("baseline")), 0) + 1
        if state is None:
            return
        counts[pid] = max(warmups[pid, arm] for arm in order)
        if state == "warm":
            have = {arm: served(arm) if served else warmups[pid, arm] for arm in order}
            for arm in order:
                warm_up(arm, tokens, runs=max(have.values()) - have[arm])
        for arm in order:
            warmups[pid, arm] = counts[pid]

    def measure(pid: str, arm: Arm, position: int, sampler: Sampler) -> tuple[Arm, Generation, dict]:
        steady_run = converged[pid, arm]
        if state == "fresh":  # a server started for this run, warmed up after the start
            if restart is not None:
                restart(arm)
            _, steady_run, _ = warm_up(arm, prompt_tokens[pid], runs=counts[pid])
        run_settings = dataclasses.replace(
            common["settings"],
            server_state=state,
            server_requests=served(arm) if state is not None and served else None,
            warmup_converged=steady_run,
            drafter_start=start,
        )
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
                settings=run_settings,
            ),
        )

    emitted = 0
    divergences = Divergences(engine)

    def emit_repeat(pid: str, repeat: int, seed: int, block: list, ready: list | None = None) -> None:
        """Emit `ready` (by default all) of one prompt's runs of one repeat, `block` the runs of
        the repeat measured so far: its same-seed baseline, once measured, checks them."""
        nonlocal emitted
        if pid not in references:
            references[pid] = engine.generate(request(Arm("baseline"), prompt_tokens[pid])).tokens
        same_seed = next((g.tokens for a, g, _ in block if a.method == "baseline"), None)
        for arm, gen, fields in block if ready is None else ready:
            fields = dict(fields)
            settings = fields.pop("settings")  # the run's own: its server state and warm-up
            lossless, check = losslessness(spec, gen.tokens, references[pid], same_seed)
            # Where the output left its reference, and whether that is a near-tie (agent/divergence.py).
            reference = references[pid] if check == "greedy reference" else same_seed
            judged = divergences.judge(prompt_tokens[pid], gen.tokens, reference, check, arm.depth + 1)
            lossless = judged.pop("lossless", lossless)
            diverged = judged.get("divergence") in ("near-tie", "defect")
            emit(
                RunRecord(
                    run_id=str(uuid.uuid4()),
                    method=arm.method,
                    depth=arm.depth,
                    prompt_id=pid,
                    repeat=repeat,
                    lossless=lossless,
                    lossless_check=check,
                    **judged,
                    drafter_warning=drafter_warning(arm.method, arm.depth, spec.settings, spec.max_new_tokens),
                    text_sample=text_sample(engine, gen.tokens) if repeat == 0 or diverged else None,
                    run_seed=seed,
                    warmup_runs=warmups[pid, arm],
                    **fields,
                    **summarise(gen),
                    **acceptance_flags(arm.method, gen),
                    **{**common, "settings": settings, **server_settings(settings, gen)},
                )
            )
            emitted += 1

    def seed_of(repeat: int, pid: str) -> int:
        return spec.sampler.seed if spec.sampler.greedy else run_seed(spec.sampler.seed, repeat, pid)

    def sampler_of(seed: int) -> Sampler:
        return dataclasses.replace(spec.sampler, seed=seed)

    # In every mode (rotated or blocks) the arms of one prompt and repeat run back to back, in a
    # Williams row's order: a pair's two runs are adjacent in time.
    same_seed_checked = not spec.sampler.greedy and spec.engine in SAME_SEED_REPRODUCIBLE
    for pid in prompt_tokens:
        settle(pid, [arms[i] for i in design[0]])
        for repeat in range(repeats):
            seed = seed_of(repeat, pid)
            row = (arms[i] for i in design[repeat % len(design)])
            # Each run goes to the spool (and up) as soon as it is measured, unless its check is
            # the same-seed baseline of its repeat, which it then waits for.
            block, ready = [], []
            for position, arm in enumerate(row):
                block.append(measure(pid, arm, position, sampler_of(seed)))
                ready.append(block[-1])
                if not same_seed_checked or any(a.method == "baseline" for a, _, _ in block):
                    emit_repeat(pid, repeat, seed, block, ready)
                    ready = []
            emit_repeat(pid, repeat, seed, block, ready)
    if spec.verify_cost is not None:
        emitted += verify_cost_runs(spec, engine, common, emit)
    return emitted


def server_settings(settings: Settings, gen: Generation) -> dict:
    """A server run's settings with the flags every arm's server of the job shares (a checked key)."""
    if gen.server is None:
        return {}
    return {"settings": dataclasses.replace(settings, server_flags=gen.server.flags)}


def energy_fields(drawn: energy.Energy | None, tokens: int) -> dict:
    """A run record's energy fields: nothing where no counter was read."""
    if drawn is None:
        return {}
    return dict(
        energy_source=drawn.source,
        energy_joules=drawn.joules,
        joules_per_token=drawn.joules / tokens if tokens else None,
        **drawn.record_fields(),
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
