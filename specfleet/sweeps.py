"""Sweep files: parse, validate, expand into jobs.

A sweep is a matrix. engines x samplers x prompt sets x context depths give the cells; methods
x depths give the arms inside a cell, always with the autoregressive baseline. A cell is a
`JobSpec` (specfleet/record.py). One job is one cell on one
agent, so every speedup is a ratio measured on one machine with the arms interleaved.

Validation collects every problem, each naming its line of the file and its field
(`line 12: arms[2].depth: must be ...`), before anything is stored. Types and bounds are checked
by pydantic (strict: specfleet/schemas.py): the declared rows (specfleet/settings.py: the settings,
`SamplerFields` and `JobFields`, generated from them), the file's other parts (`VerifyCostFields`,
`TargetFields`, `ModelFields`) and its numbers (`_Checker.number`); what relates one field to
another (an engine's methods, a model per engine) is checked here by hand, in the same pass.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import re
from dataclasses import dataclass
from typing import Annotated, Any

import pydantic
from pydantic import BaseModel, Field

from specfleet import prompt_library, schemas, server_arms, yaml_limits
from specfleet import settings as declared
from specfleet.design import rounded_repeats
from specfleet.record import (
    ENGINE_METHODS,
    ENGINES,
    IN_PROCESS_ENGINES,
    MAX_DEPTH,
    METHODS,
    REFERENCE_METHODS,
    SPECULATIVE_METHODS,
    Arm,
    JobSpec,
    Sampler,
    ServerSpec,
    Settings,
    VerifyCost,
)

ARM_METHODS = tuple(m for m in METHODS + REFERENCE_METHODS if m != "baseline")  # baseline is always an arm
NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,99}$")
# The file's own structure, and every declared row's key (its first part: "ngram", "samplers", "arms").
TOP_KEYS = {
    "name",
    "target",
    "models",
    "engines",
    "prompt_sets",
    "methods",
    "server",
    "verify_cost",
    *{re.split(r"[.\[]", s.sweep)[0] for s in declared.DECLARED if s.sweep},
}
MAX_YAML_BYTES = 256 * 1024
MAX_CONTEXT_TOKENS = declared.BY_NAME["context_tokens"].hi
MAX_PROBLEM_CHARS = 300  # one problem, as reported
MAX_MESSAGE_CHARS = 2000  # the whole message: a gRPC status travels in metadata (8 KiB at most)


def drafter_warning(method: str, depth: int, settings: Settings, max_new_tokens: int) -> str:
    """Why an in-process arm's n-gram drafter cannot draft within max_new_tokens at its settings
    ("" when it can): its first draft needs a span that the output alone cannot hold, so it drafts
    only where the output copies the prompt. ngram-mod (agent/engines/ngram.py NgramMod) hashes
    n_match tokens and drops a chain shorter than min(n_min, depth): its output must hold the span
    and the key again, 2 x n_match + min(n_min, depth) tokens. ngram-map-k4v proposes the depth
    tokens after a size_n key seen min_hits times before: (min_hits + 1) x size_n + depth."""
    if method == "ngram-mod" and None not in (settings.ngram_mod_n_match, settings.ngram_mod_n_min):
        n_match, n_min = settings.ngram_mod_n_match, settings.ngram_mod_n_min
        need, how = 2 * n_match + min(n_min, depth), f"2 x n_match {n_match} + min(n_min {n_min}, depth {depth})"
    elif method == "ngram-map-k4v" and None not in (settings.ngram_map_size_n, settings.ngram_map_min_hits):
        size_n, hits = settings.ngram_map_size_n, settings.ngram_map_min_hits
        need, how = (hits + 1) * size_n + depth, f"(min_hits {hits} + 1) x size_n {size_n} + depth {depth}"
    else:
        return ""
    if need < max_new_tokens:
        return ""
    return (
        f"{method} at depth {depth} cannot draft from its own output within max_new_tokens {max_new_tokens}: "
        f"its first draft needs {need} tokens of output ({how}); it drafts only where the output copies the prompt"
    )


class SweepError(ValueError):
    """Every problem of a sweep file, each cut to MAX_PROBLEM_CHARS; the message lists as many as
    fit in MAX_MESSAGE_CHARS and counts the rest."""

    def __init__(self, problems: list[str]):
        self.problems = [p if len(p) <= MAX_PROBLEM_CHARS else p[: MAX_PROBLEM_CHARS - 3] + "..." for p in problems]
        message = "invalid sweep: "
        for i, problem in enumerate(self.problems):
            rest = f"; and {len(self.problems) - i} more problem(s)"
            if len(message) + len(problem) + 2 + len(rest) > MAX_MESSAGE_CHARS:
                message += rest
                break
            message += ("; " if i else "") + problem
        super().__init__(message)


@dataclass(frozen=True)
@declared.with_fields(declared.JOB_FIELDS)  # then max_new_tokens, prompts, warmup, repeats, ...: the job's rows
class Sweep:
    name: str
    target: dict[str, Any]
    models: dict[str, list[dict[str, Any]]]  # engine -> its model pairs ({target, draft, memory_gb}), a cell each
    engines: list[str]
    samplers: list[Sampler]
    prompt_sets: list[str]
    context_tokens: list[int]
    arms: list[Arm]  # in-process engines' arms, from `methods`
    settings: dict[str, list]  # declared setting -> its values (more than one: a dimension of the matrix)
    verify_cost: VerifyCost | None
    server: ServerSpec | None = None  # server engines: what every arm shares
    server_arms: dict[str, list[Arm]] | None = None  # server engine -> its arms (specfleet/server_arms.py)

    def arms_of(self, engine: str) -> list[Arm]:
        if engine in IN_PROCESS_ENGINES:
            return [a for a in self.arms if a.method in ENGINE_METHODS[engine]]
        return list((self.server_arms or {}).get(engine, []))

    def cells(self) -> list[JobSpec]:
        """One job spec per cell: what a worker needs to run it."""
        sets = prompt_library.prompt_sets()
        cells = []
        for engine, model, (build, arms) in (
            (e, m, group) for e in self.engines for m in self.models[e] for group in self.arm_groups(e)
        ):
            alone = bool(model.get("baseline_only"))  # the source's baseline file: the baseline arm alone
            if alone:
                arms = [a for a in arms if a.method == "baseline"]
                if not arms:
                    continue
            server = None if engine in IN_PROCESS_ENGINES else self.server
            if build:  # a llama-server build pinned by the sweep's arms: a cell of its own
                server = dataclasses.replace(server, build=build)
            for sampler in self.samplers:
                for name in self.prompt_sets:
                    prompts = sets[name].prompts[: self.prompts]
                    for context, settings in itertools.product(self.context_tokens, self.settings_of(engine)):
                        docs = prompt_library.context_documents(context)
                        cells.append(
                            JobSpec(
                                engine=engine,
                                model={k: model[k] for k in ("target", "draft") if k in model},
                                memory_gb=float(model.get("memory_gb", 0.0)),
                                prompt_set=name,
                                prompt_category=sets[name].category,
                                prompt_set_digest=prompt_library.digest(prompts, docs),
                                prompts=prompts,
                                documents=docs,
                                context_tokens=context,
                                arms=tuple(arms),
                                sampler=sampler,
                                settings=settings,
                                verify_cost=self.verify_cost if engine in IN_PROCESS_ENGINES and not alone else None,
                                server=server,
                                **{s.name: getattr(self, s.name) for s in declared.JOB_SPEC_FIELDS},
                            )
                        )
        return cells

    def arm_groups(self, engine: str) -> list[tuple[str, list[Arm]]]:
        """The engine's arms as cells: (pinned llama-server build or "", arms), server_arms.by_build."""
        if engine in IN_PROCESS_ENGINES:
            return [("", self.arms_of(engine))]
        return server_arms.by_build(self.arms_of(engine))

    def settings_of(self, engine: str) -> list[Settings]:
        """The engine's cells' settings: one per combination of the values of the settings that
        apply to it (the others at their defaults, recorded as not applicable)."""
        names = [s.name for s in declared.SWEEP_SETTINGS if engine in s.engines]
        values = [self.settings[name] for name in names]
        return [
            declared.for_engine(Settings(**dict(zip(names, combo))), engine) for combo in itertools.product(*values)
        ]

    def notes(self) -> list[str]:
        """What the sweep will do differently from what the file says, for the submitter."""
        out = []
        for engine in self.engines:
            if engine not in IN_PROCESS_ENGINES:
                out += server_arms.notes(engine, self.arms_of(engine))
                if self.verify_cost is not None:
                    out.append(f"{engine}: verify_cost is measured by the in-process engines only")
            if engine in IN_PROCESS_ENGINES:
                out += sorted(
                    {
                        f"{engine}: {warning}"
                        for arm in self.arms_of(engine)
                        for settings in self.settings_of(engine)
                        if (warning := drafter_warning(arm.method, arm.depth, settings, self.max_new_tokens))
                    }
                )
            for arms in sorted({len(group) for _, group in self.arm_groups(engine)}):  # a cell's arms
                rounded = rounded_repeats(self.repeats, arms)
                if rounded != self.repeats:
                    out.append(
                        f"{engine}: repeats rounded up from {self.repeats} to {rounded} to complete the Williams "
                        f"design of {arms} arms (each arm follows every other equally often)"
                    )
        return out


# ---------------------------------------------------------------- the file's parts, as pydantic models


@functools.cache
def _bounded(integer: bool, lo, hi):
    """A number's annotation, made once per bounds (pydantic's adapters are cached by it)."""
    return schemas.bounded(schemas.Int if integer else schemas.Float, lo, hi)


class _Part(BaseModel):
    model_config = schemas.CONFIG


# One entry of `samplers` and the job's own fields (max_new_tokens, warmup, repeats, ...), generated
# from the declaration (specfleet/settings.py SAMPLER, JOB_FIELDS): their types, bounds and defaults.
SamplerFields = pydantic.create_model(
    "SamplerFields", __config__=schemas.CONFIG, **schemas.fields_of(declared.SAMPLER, lambda s: False)
)
JobFields = pydantic.create_model(
    "JobFields",
    __config__=schemas.CONFIG,
    **{s.sweep: (schemas.setting_type(s, s.default is None), s.default) for s in declared.JOB_FIELDS},
)


class VerifyCostFields(_Part):
    """`verify_cost`: the target's forward-pass times of 1..max_rows rows at each context depth."""

    context_tokens: Annotated[list[_bounded(True, 0, MAX_CONTEXT_TOKENS)], Field(min_length=1)] = list(
        VerifyCost.context_tokens
    )
    max_rows: _bounded(True, 1, 64) = VerifyCost.max_rows
    repeats: _bounded(True, 1, 1000) = VerifyCost.repeats


Names = list[Annotated[schemas.Str, schemas.text(1, 200)]] | None


class TargetFields(_Part):
    """`target`: which agents a sweep's jobs go to."""

    chips: Names = None
    chip_families: Names = None
    agents: Names = None
    min_memory_gb: _bounded(False, 0, 16384) = 0.0
    labels: dict[schemas.Str, schemas.Str] = {}


class ModelFields(_Part):
    """One model pair of `models.<engine>`. memory_gb: unified memory an agent needs to run this
    engine's target and draft together (weights, KV cache, activations); agents with less get no
    job for that engine. baseline_only: the pair's cells run the baseline arm alone: the model a
    claim's source measured its baseline on (the bug report's non-MTP GGUF beside the MTP one),
    which the other arms could not run."""

    target: Annotated[schemas.Str, schemas.text(1, 4096)]
    draft: schemas.Str | None = None
    memory_gb: _bounded(False, 0, 16384) | None = None
    baseline_only: schemas.Bool = False


@functools.cache
def _adapter(annotation) -> pydantic.TypeAdapter:
    """An annotation's adapter under the file's config (no NaN, no infinity); a model its own."""
    try:
        return pydantic.TypeAdapter(annotation, config=schemas.CONFIG)
    except pydantic.PydanticUserError:
        return pydantic.TypeAdapter(annotation)


def _given(mapping: dict) -> dict:
    """A mapping's fields that are given: a null is a field left out (its default)."""
    return {k: v for k, v in mapping.items() if v is not None}


class _Checker:
    """Collects a sweep's problems, each as `line N: <field>: <why>` (the line from the YAML
    loader, `source:N:` when the file is named)."""

    def __init__(self, located: yaml_limits.Located | None = None, source: str = ""):
        self.problems: list[str] = []
        self.located = located
        self.source = source

    def _add(self, where: str, why: str) -> None:
        line = self.located.line(where) if self.located else None
        at = "" if line is None else f"{self.source}:{line}: " if self.source else f"line {line}: "
        self.problems.append(f"{at}{where}{why}")

    def fail(self, where: str, why: str) -> None:
        self._add(where, f": {why}")

    def valid(self, where: str, annotation, value, default=None):
        """`value` as pydantic reads it against `annotation`; every problem named under `where`
        and `default` when it has any."""
        try:
            return _adapter(annotation).validate_python(value)
        except pydantic.ValidationError as e:
            for error in e.errors(include_url=False):
                why = schemas.why(error)
                if why == ": unknown field" and isinstance(annotation, type) and issubclass(annotation, BaseModel):
                    why += f" (allowed: {', '.join(sorted(annotation.model_fields))})"
                self._add(schemas.where_of(error["loc"], where), why)
            return default

    def part(self, where: str, fields: type[BaseModel], value) -> BaseModel | None:
        """A mapping of the file read into its part's model (nulls left out); None when faulty."""
        if not isinstance(value, dict):
            self.fail(where, "must be a mapping")
            return None
        return self.valid(where, fields, _given(value))

    def number(self, where, value, lo, hi, integer=False, default=None):
        """A number of the file in [lo, hi]; `default` when it is absent (None: it is required) or faulty."""
        if value is None:
            if default is None:
                self.fail(where, "is required")
            return default
        return self.valid(where, _bounded(integer, lo, hi), value, default)

    def unknown_keys(self, where, mapping, allowed):
        for key in sorted(set(mapping) - allowed, key=str):
            self.fail(f"{where}{key}", f"unknown field (allowed: {', '.join(sorted(allowed))})")

    def str_list(self, where, value):
        if value is None:
            return []
        if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
            self.fail(where, "must be a list of non-empty strings")
            return []
        return value


def parse_sweep(text: str, source: str = "") -> Sweep:
    """Parse and validate a sweep file; raise SweepError listing every problem, each naming its
    line (`source:N:` when `source`, the file's name, is given; else `line N:`) and its field.
    Each part of the file is checked by a function of its own below, all into one checker, so
    that every fault of the file is named in the one refusal."""
    if len(text.encode()) > MAX_YAML_BYTES:
        raise SweepError([f"file: larger than {MAX_YAML_BYTES} bytes"])
    try:
        located = yaml_limits.load_located(text)
    except yaml_limits.YamlLimitError as e:
        raise SweepError([f"file: {e}"]) from None
    doc = located.doc
    if not isinstance(doc, dict):
        raise SweepError(["file: must be a mapping of sweep fields"])
    c = _Checker(located, source)
    c.unknown_keys("", doc, TOP_KEYS)

    name = doc.get("name")
    if not isinstance(name, str) or not NAME_RE.match(name):
        c.fail("name", "is required: 1-100 characters of letters, digits, '_', '.', '-'")
    target = c.part("target", TargetFields, doc.get("target") or {})
    engines = _engines(c, doc)
    known_engines = [e for e in engines if e in ENGINES]
    methods = doc.get("methods") or {}
    if not isinstance(methods, dict):
        c.fail("methods", "must be a mapping of method to a list of depths")
        methods = {}
    arms = _arms(c, methods, known_engines)
    clean_models = _models(c, doc, known_engines, methods)
    settings = parse_settings(c, doc)
    if max(settings["ngram_n_min"]) > min(settings["ngram_n_max"]):
        c.fail(
            "ngram", f"n_min ({max(settings['ngram_n_min'])}) must not exceed n_max ({min(settings['ngram_n_max'])})"
        )
    verify_cost = doc.get("verify_cost")
    if verify_cost is not None:
        fields = c.part("verify_cost", VerifyCostFields, verify_cost)
        verify_cost = VerifyCost(**fields.model_dump()) if fields is not None else None
    server = server_arms.parse_server(c, doc, known_engines)
    serving = _server_arms(c, located, source, doc, known_engines, clean_models, server)
    job = c.valid("", JobFields, _given({k: doc[k] for k in JobFields.model_fields if k in doc}), JobFields())
    sweep = Sweep(
        name=name if isinstance(name, str) else "",
        target=target.model_dump(exclude_unset=True) if target is not None else {},
        models=clean_models,
        engines=engines,
        samplers=_samplers(c, doc, known_engines),
        prompt_sets=_prompt_sets(c, doc),
        context_tokens=_contexts(c, doc),
        arms=arms,
        settings=settings,
        verify_cost=verify_cost,
        **job.model_dump(),
        server=server,
        server_arms=serving,
    )
    if c.problems:
        raise SweepError(c.problems)
    return sweep


def _engines(c: _Checker, doc: dict) -> list[str]:
    engines = c.str_list("engines", doc.get("engines"))
    if not engines:
        c.fail("engines", f"is required: a list drawn from {', '.join(ENGINES)}")
    for e in engines:
        if e not in ENGINES:
            c.fail("engines", f"unknown engine {e!r} (known: {', '.join(ENGINES)})")
    if len(set(engines)) != len(engines):
        c.fail("engines", "lists an engine twice")
    return engines


def _arms(c: _Checker, methods: dict, known_engines: list[str]) -> list[Arm]:
    """The in-process arms: the baseline, and each method at each of its depths."""
    arms = [Arm("baseline", 0)]
    for method, depths in methods.items():
        if method == "baseline":
            continue
        if method not in ARM_METHODS:
            c.fail(f"methods.{method}", f"unknown method (known: baseline, {', '.join(ARM_METHODS)})")
            continue
        in_process = [e for e in known_engines if e in IN_PROCESS_ENGINES]
        if not in_process:
            c.fail(f"methods.{method}", "applies to the in-process engines (mlx, llama.cpp); server engines take arms")
            continue
        if not any(method in ENGINE_METHODS[e] for e in in_process):
            c.fail(
                f"methods.{method}",
                f"not supported by {', '.join(in_process)} (supported: "
                + "; ".join(f"{e}: {', '.join(ENGINE_METHODS[e])}" for e in in_process)
                + ")",
            )
            continue
        if not isinstance(depths, list) or not depths:
            c.fail(f"methods.{method}", "must be a non-empty list of draft depths ([0] for ref-baseline)")
            continue
        lo, hi = (1, MAX_DEPTH) if method in SPECULATIVE_METHODS else (0, 0)
        for i, d in enumerate(depths):
            if c.number(f"methods.{method}[{i}]", d, lo, hi, integer=True) is not None:
                arms.append(Arm(method, d))
    if len(set(arms)) != len(arms):
        c.fail("methods", "lists a depth twice for one method")
    return arms


def _models(c: _Checker, doc: dict, known_engines: list[str], methods: dict) -> dict[str, list[dict]]:
    """models.<engine>: one pair, or a list of them (each a cell of its own)."""
    models = doc.get("models")
    if not isinstance(models, dict):
        c.fail("models", "is required: a mapping of engine to {target, draft} or to a list of them")
        models = {}
    c.unknown_keys("models.", models, set(ENGINES))
    clean_models = {}
    for e in known_engines:
        pairs = models.get(e)
        listed = isinstance(pairs, list)
        if listed and not pairs:
            c.fail(f"models.{e}", "lists no model")
        clean_models[e] = []
        for i, m in enumerate(pairs if listed else [pairs]):
            where = f"models.{e}[{i}]" if listed else f"models.{e}"
            pair = _model_pair(c, where, m, e, methods)
            if pair is not None:
                clean_models[e].append(pair)
        if len({(p["target"], p.get("draft")) for p in clean_models[e]}) != len(clean_models[e]):
            c.fail(f"models.{e}", "lists a target and draft pair twice")
    return clean_models


def _samplers(c: _Checker, doc: dict, engines: list[str]) -> list[Sampler]:
    """`samplers`: each entry a Sampler (SamplerFields), refused where it sets a row that one of
    the sweep's engines does not apply (settings.sampler_problems)."""
    samplers = doc.get("samplers") or [{}]
    if not isinstance(samplers, list):
        c.fail("samplers", f"must be a list of {{{', '.join(s.key for s in declared.SAMPLER)}}}")
        samplers = []
    out = []
    for i, entry in enumerate(samplers):
        fields = c.part(f"samplers[{i}]", SamplerFields, entry)
        if fields is not None:
            out.append(Sampler(**fields.model_dump()))
            for problem in dict.fromkeys(p for e in engines for p in declared.sampler_problems(out[-1], e)):
                c.fail(f"samplers[{i}].{problem.partition(':')[0]}", problem.partition(": ")[2])
    return out


def _prompt_sets(c: _Checker, doc: dict) -> list[str]:
    known_sets = prompt_library.prompt_sets()
    sets = c.str_list("prompt_sets", doc.get("prompt_sets"))
    if not sets:
        c.fail("prompt_sets", f"is required: a list drawn from {', '.join(known_sets)}")
    for ps in sets:
        if ps not in known_sets:
            c.fail("prompt_sets", f"unknown prompt set {ps!r} (known: {', '.join(known_sets)})")
    return sets


def _contexts(c: _Checker, doc: dict) -> list[int]:
    contexts = doc.get("context_tokens", [0])
    if not isinstance(contexts, list) or not contexts:
        c.fail("context_tokens", "must be a non-empty list of context depths in tokens, e.g. [512, 4096]")
        contexts = []
    context = schemas.setting_type(declared.BY_NAME["context_tokens"], optional=False)
    contexts = [c.valid(f"context_tokens[{i}]", context, d, 0) for i, d in enumerate(contexts)]
    if len(set(contexts)) != len(contexts):
        c.fail("context_tokens", "lists a depth twice")
    return contexts


def _server_arms(c: _Checker, located, source: str, doc: dict, known_engines, clean_models, server) -> dict:
    """Each server engine's arms (specfleet/server_arms.py), checked against every model pair."""
    serving = {}
    for e in known_engines:
        if e not in IN_PROCESS_ENGINES:
            pairs = clean_models.get(e) or [{}]
            serving[e] = server_arms.parse_arms(c, doc, e, pairs[0], server)
            for pair in pairs[1:]:  # command-line arms that name a model must name every pair's
                scratch = _Checker(located, source)
                server_arms.parse_arms(scratch, doc, e, pair, server)
                c.problems += [p for p in scratch.problems if p not in c.problems]
    if "arms" in doc and not serving:
        c.fail("arms", "server arms apply to engines llama-server and openai; in-process engines take methods")
    return serving


def _model_pair(c: _Checker, where: str, m, engine: str, methods: dict) -> dict[str, Any] | None:
    """One {target, draft, memory_gb} of models.<engine> (ModelFields): a cell of its own."""
    if not isinstance(m, dict) or not isinstance(m.get("target"), str) or not m["target"]:
        c.fail(f"{where}.target", "is required for every engine in engines")
        return None
    if engine in IN_PROCESS_ENGINES and {"draft", "ref-draft"} & set(methods) and not isinstance(m.get("draft"), str):
        c.fail(f"{where}.draft", "is required when methods include draft")
    fields = c.part(where, ModelFields, m)
    return fields.model_dump(exclude_defaults=True) if fields is not None else None


def parse_settings(c: _Checker, doc: dict[str, Any]) -> dict[str, list]:
    """Every declared sweep setting's values (specfleet/settings.py): a field of the file, top
    level ("threads") or in a section ("ngram_mod.n_match"); a scalar, or a list of distinct values
    (a dimension: one cell per value); absent, its default."""
    out: dict[str, list] = {}
    sections: dict[str, set[str]] = {}
    for s in declared.SWEEP_SETTINGS:
        section, _, key = s.sweep.rpartition(".")
        if section:
            sections.setdefault(section, set()).add(key)
    for section, keys in sections.items():
        if not isinstance(doc.get(section) or {}, dict):
            c.fail(section, f"must be a mapping {{{', '.join(sorted(keys))}}}")
        else:
            c.unknown_keys(f"{section}.", doc.get(section) or {}, keys)
    for s in declared.SWEEP_SETTINGS:
        section, _, key = s.sweep.rpartition(".")
        holder = doc.get(section) if section else doc
        given = holder.get(key) if isinstance(holder, dict) else None
        values = given if isinstance(given, list) else [given]
        if not values:
            c.fail(s.sweep, "must be a value or a non-empty list of values")
        elif len({repr(v) for v in values}) != len(values):
            c.fail(s.sweep, "lists a value twice")
        good = []
        for i, value in enumerate(values):
            where = s.sweep if len(values) == 1 and not isinstance(given, list) else f"{s.sweep}[{i}]"
            good.append(s.default if value is None else c.valid(where, schemas.SETTING_TYPES[s.name], value, s.default))
        out[s.name] = good or [s.default]
    return out


def agent_can_run(cell: JobSpec, agent: dict[str, Any]) -> bool:
    """Whether an agent (engines, memory_bytes) has the cell's engine and the memory its models need."""
    if cell.engine not in agent["engines"]:
        return False
    if cell.server is not None and cell.server.build and cell.server.build not in agent.get("llama_server_builds", ()):
        return False  # a llama-server build the sweep pins that the agent does not have
    return agent["memory_bytes"] >= cell.memory_gb * 2**30


def agent_matches(target: dict[str, Any], agent: dict[str, Any]) -> bool:
    """Whether an agent (name, chip, memory_bytes, labels) is selected by a sweep's target."""
    if target.get("agents") and agent["name"] not in target["agents"]:
        return False
    if target.get("chips") and agent["chip"] not in target["chips"]:
        return False
    families = target.get("chip_families")
    if families and not any(re.search(rf"\b{re.escape(f)}\b", agent["chip"]) for f in families):
        return False
    if agent["memory_bytes"] < target.get("min_memory_gb", 0) * 2**30:
        return False
    return all(agent["labels"].get(k) == v for k, v in target.get("labels", {}).items())
