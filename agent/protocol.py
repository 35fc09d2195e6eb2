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
from agent.divergence import Divergences, first_divergence
from agent.engines.base import (
    Closes,
    Engine,
    EngineError,
    Generation,
    Interleaves,
    KeepsState,
    ReportsBackend,
    Request,
    RestartsServers,
    supports,
)
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
        job = Measurement(spec, engine, emit, job_id, attempt, target, draft, sample, sleep, memory_total_bytes, meter)
        return job.run()
    finally:
        if supports(engine, Closes):
            engine.close()


class Measurement:
    """One job's measurement (the module docstring): built with the job and its engine, `run()`
    loads the models, measures every prompt's repeats and returns the runs emitted. It owns what
    the job's runs share while it runs: every prompt's tokens, the arms' warm-up counts and
    convergence, the server arms' warm-up count per prompt, the greedy references, and the
    number of runs emitted."""

    def __init__(self, spec, engine, emit, job_id, attempt, target, draft, sample, sleep, memory_total_bytes, meter):
        self.spec, self.engine, self.emit = spec, engine, emit
        self.job_id, self.attempt, self.target, self.draft = job_id, attempt, target, draft
        self.sample, self.sleep, self.memory_total_bytes, self.meter = sample, sleep, memory_total_bytes, meter
        self.arms = list(spec.arms)
        self.prompt_tokens: dict[str, list[int]] = {}
        self.common: dict = {}  # the fields every run of the job shares
        self.state: str | None = None  # the state server arms are measured in (None: no server arms)
        self.start: str | None = None  # drafter_start of every run
        self.warmups: dict[tuple[str, Arm], int] = {}  # warm-up runs before an arm's measured runs of a prompt
        self.converged: dict[tuple[str, Arm], bool | None] = {}
        self.counts: dict[str, int] = {}  # server arms: every arm's warm-up runs on a prompt (the most any needed)
        self.references: dict[str, list[int]] = {}  # greedy reference per prompt: an unmeasured baseline run
        self.emitted = 0
        self.divergences = Divergences(engine)

    def run(self) -> int:
        """Load, then every prompt: its warm-up, then its repeats (each a Williams row), then the
        verify-cost runs where the job asks for them; the number of runs emitted."""
        self._load()
        design = williams(len(self.arms))
        repeats = rounded_repeats(self.spec.repeats, len(self.arms))
        for pid in self.prompt_tokens:
            self._settle(pid, [self.arms[i] for i in design[0]])
            for repeat in range(repeats):
                self._run_repeat(pid, repeat, [self.arms[i] for i in design[repeat % len(design)]])
        if self.spec.verify_cost is not None:
            self.emitted += verify_cost_runs(self.spec, self.engine, self.common, self.emit)
        return self.emitted

    def _load(self) -> None:
        """Load the models; resolve the spec's prompt settings; build and check every prompt's
        tokens; the fields every run shares; the state server arms are measured in."""
        load_seconds = self.engine.load(self.spec.model["target"], self.spec.model.get("draft"))
        spec = self.spec = prompts.resolved_spec(self.spec, self.engine)  # chat or raw, reasoning: as run and recorded
        prefix = prompts.context(self.engine.tokenize, spec.documents, spec.context_tokens)
        tokenize_prompt = prompts.tokenizer(self.engine, spec.settings)
        for p in spec.prompts:
            tokens = prompts.build(tokenize_prompt, p.text, prefix, self.engine.tokenize)
            check_context(len(tokens), spec, self.target, p.id)
            self.prompt_tokens[p.id] = tokens
        # Server arms that cannot all stay up at once run in blocks: one arm's server, every prompt.
        plan = self.engine.interleaving(self.arms) if supports(self.engine, Interleaves) else "rotated"
        self.common = dict(
            job_id=self.job_id,
            attempt=self.attempt,
            engine=spec.engine,
            engine_version=engine_version(self.engine.versions()),
            backend=self.engine.backend() if supports(self.engine, ReportsBackend) else "",
            system=system_of(spec),
            target=self.target,
            draft=self.draft or ModelIdentity(),
            sampler=spec.sampler,
            prompt_set=spec.prompt_set,
            prompt_set_digest=spec.prompt_set_digest,
            prompt_category=spec.prompt_category,
            context_tokens=spec.context_tokens,
            max_new_tokens=spec.max_new_tokens,
            load_seconds=load_seconds,
            cooldown_seconds=spec.cooldown_seconds,
            arm_order="williams" if len(self.arms) > 1 else "single",
            settings=declared.for_engine(spec.settings, spec.engine),  # what the job ran with, as recorded
        )
        self._choose_state(plan)

    def _choose_state(self, plan: str) -> None:
        """The state server arms are measured in: the job's server_state, but always fresh for
        arms that run in blocks (one arm's server at a time) or drafters that keep state across
        requests; and what that means for drafter_start."""
        engine = self.engine
        self.state = self.common["settings"].server_state
        declares = supports(engine, KeepsState)
        stateful = declares and any(engine.keeps_state(arm) for arm in self.arms)
        if self.state is not None and (plan == "blocks" or stateful):
            self.state = "fresh"
        self.start = drafter_start(self.spec, self.state, stateless=declares and not stateful)

    def _restart(self, arm: Arm) -> None:
        if supports(self.engine, RestartsServers):
            self.engine.restart(arm)

    def _served(self, arm: Arm) -> int | None:
        """The requests the arm's server has served; None where the engine does not count them."""
        return self.engine.served(arm) if supports(self.engine, RestartsServers) else None

    def request(self, arm: Arm, tokens, sampler: Sampler | None = None) -> Request:
        spec = self.spec
        return Request(
            prompt_tokens=tokens,
            max_new_tokens=spec.max_new_tokens,
            method=arm.method,
            depth=arm.depth,
            sampler=spec.sampler if sampler is None else sampler,
            settings=spec.settings,
            flags=arm.flags,
            command=arm.command,
        )

    def _warm_up(self, arm: Arm, tokens, runs: int | None = None) -> tuple[int, bool | None, Generation | None]:
        """Runs until two consecutive decode speeds agree within WARMUP_AGREEMENT, at most the
        cap, or exactly `runs`; (runs, whether the last two agreed (None: no warm-up asked), the
        last generation)."""
        speeds, gen = [], None
        for _ in range(self.spec.warmup if runs is None else runs):
            gen = self.engine.generate(self.request(arm, warmup_tokens(tokens)))
            speeds.append(summarise(gen)["decode_tokens_per_second"])
            if runs is None and steady(speeds):
                break
        return len(speeds), (None if self.spec.warmup == 0 else steady(speeds)), gen

    def _reference(self, pid: str) -> list[int]:
        """The greedy reference: an unmeasured run of the baseline (no drafter to prime) on the prompt."""
        return self.engine.generate(self.request(Arm("baseline"), self.prompt_tokens[pid])).tokens

    def _settle(self, pid: str, order: list[Arm]) -> None:
        """A prompt's first warm-up: each arm until steady or the cap (fresh: on a server started
        for it). Server arms then share the prompt's warm-up count, the most any arm needed, and
        warm servers are topped up so that every arm's has served as many requests."""
        tokens, state, served = self.prompt_tokens[pid], self.state, supports(self.engine, RestartsServers)
        for arm in order:
            if state == "fresh":
                self._restart(arm)
            self.warmups[pid, arm], self.converged[pid, arm], _ = self._warm_up(arm, tokens)
        self.references[pid] = self._reference(pid)
        if state == "warm" and not served:  # the top-up below counts it as the baseline's warm-up
            self.warmups[pid, Arm("baseline")] = self.warmups.get((pid, Arm("baseline")), 0) + 1
        if state is None:
            return
        self.counts[pid] = max(self.warmups[pid, arm] for arm in order)
        if state == "warm":
            have = {arm: self._served(arm) if served else self.warmups[pid, arm] for arm in order}
            for arm in order:
                self._warm_up(arm, tokens, runs=max(have.values()) - have[arm])
        for arm in order:
            self.warmups[pid, arm] = self.counts[pid]

    def _run_repeat(self, pid: str, repeat: int, row: list[Arm]) -> None:
        """One prompt's repeat: its arms back to back in a Williams row's order (in every mode, so
        that a pair's two runs are adjacent in time). Each run goes to the spool (and up) as soon
        as it is measured, unless its check is the same-seed baseline of its repeat, which it then
        waits for."""
        spec = self.spec
        seed = spec.sampler.seed if spec.sampler.greedy else run_seed(spec.sampler.seed, repeat, pid)
        sampler = dataclasses.replace(spec.sampler, seed=seed)
        same_seed_checked = not spec.sampler.greedy and spec.engine in SAME_SEED_REPRODUCIBLE
        block, ready = [], []
        for position, arm in enumerate(row):
            block.append(self._measure(pid, arm, position, sampler))
            ready.append(block[-1])
            if not same_seed_checked or any(a.method == "baseline" for a, _, _ in block):
                self._emit_repeat(pid, repeat, seed, block, ready)
                ready = []
        self._emit_repeat(pid, repeat, seed, block, ready)

    def _measure(self, pid: str, arm: Arm, position: int, sampler: Sampler) -> tuple[Arm, Generation, dict]:
        """One measured run, with its environment before and after and the energy it drew: (arm,
        generation, the record's fields of this run, its own settings under "settings")."""
        steady_run, state = self.converged[pid, arm], self.state
        if state == "fresh":  # a server started for this run, warmed up after the start
            self._restart(arm)
            _, steady_run, _ = self._warm_up(arm, self.prompt_tokens[pid], runs=self.counts[pid])
        run_settings = dataclasses.replace(
            self.common["settings"],
            server_state=state,
            server_requests=self._served(arm) if state is not None else None,
            warmup_converged=steady_run,
            drafter_start=self.start,
        )
        if self.spec.cooldown_seconds > 0:
            self.sleep(self.spec.cooldown_seconds)
        env_before = self.sample()
        started = time.time()
        measured = self.request(arm, self.prompt_tokens[pid], sampler)
        gen, drawn = self.meter.measure(lambda: self.engine.generate(measured))
        env_after = self.sample()
        nominal, reasons = environment.judge(env_before, env_after, os.cpu_count(), self.memory_total_bytes)
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

    def _emit_repeat(self, pid: str, repeat: int, seed: int, block: list, ready: list) -> None:
        """Emit `ready` of one prompt's runs of one repeat, `block` the runs of the repeat
        measured so far: its same-seed baseline, once measured, checks them."""
        if pid not in self.references:
            self.references[pid] = self._reference(pid)
        same_seed = next((g.tokens for a, g, _ in block if a.method == "baseline"), None)
        for arm, gen, fields in ready:
            self.emit(self._record(pid, repeat, seed, arm, gen, dict(fields), same_seed))
            self.emitted += 1

    def _record(self, pid: str, repeat: int, seed: int, arm: Arm, gen: Generation, fields: dict, same_seed):
        """A measured run's record: its losslessness against its check, where its output left
        the reference and whether that is a near-tie (agent/divergence.py), its figures."""
        spec, reference = self.spec, self.references[pid]
        settings = fields.pop("settings")  # the run's own: its server state and warm-up
        lossless, check = losslessness(spec, gen.tokens, reference, same_seed)
        compared = reference if check == "greedy reference" else same_seed
        judged = self.divergences.judge(self.prompt_tokens[pid], gen.tokens, compared, check, arm.depth + 1)
        lossless = judged.pop("lossless", lossless)
        diverged = judged.get("divergence") in ("near-tie", "defect")
        return RunRecord(
            run_id=str(uuid.uuid4()),
            method=arm.method,
            depth=arm.depth,
            prompt_id=pid,
            repeat=repeat,
            lossless=lossless,
            lossless_check=check,
            **judged,
            drafter_warning=drafter_warning(arm.method, arm.depth, spec.settings, spec.max_new_tokens),
            text_sample=text_sample(self.engine, gen.tokens) if repeat == 0 or diverged else None,
            run_seed=seed,
            warmup_runs=self.warmups[pid, arm],
            **fields,
            **summarise(gen),
            **acceptance_flags(arm.method, gen),
            **{**self.common, "settings": settings, **server_settings(settings, gen)},
        )


def steady(speeds: list[float]) -> bool:
    """Whether the last two warm-up runs' decode speeds agree within WARMUP_AGREEMENT."""
    return len(speeds) >= 2 and relative_spread(speeds[-2:]) <= WARMUP_AGREEMENT


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
    of the repeat. Otherwise not checkable. Ids either side does not know (UNKNOWN_ID) are not
    compared (divergence.first_divergence)."""
    if spec.sampler.greedy:
        return first_divergence(tokens, greedy_reference) is None, "greedy reference"
    if spec.engine in SAME_SEED_REPRODUCIBLE and same_seed_baseline is not None:
        return first_divergence(tokens, same_seed_baseline) is None, "same-seed baseline"
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
