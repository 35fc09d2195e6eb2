"""The ledger file (dashboard/claims.yaml) as a pydantic 2 model, read into Claims.

Each record is a `ClaimRecord`: strict types (an integer is never a string or a bool), `Literal`s
for the engines, metrics, rules and prompt categories, pydantic's `Field` bounds for counts, and
an unknown key refused at every level. The rules between fields are model validators: a
`Conditions` checks its system and method against its engine, a `VerdictFields` its band, a
`ClaimRecord` what needs the whole record (the metric against the rule and the version, the
depth a claim needs, the sweep's fields against the engine). A model validator runs once its
own fields are sound, and names every rule it finds broken (`_broken`), each under its field.

`parse_claims` reads every record and raises one ClaimError naming every problem of the file:
`claims[3] (mtplx-2-3x).conditions.depth: <why> (line 112)`, the line found from the YAML node
tree (`yaml.compose`) by the problem's field path. The values a Claim holds are the file's as
given (a YAML 2 stays 2, never 2.0: the generated sweep writes them back).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Annotated, Any, Literal

import pydantic
import yaml
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError, WrapValidator
from pydantic_core import PydanticCustomError

from dashboard.claims.claim import (
    DECLARED_CONDITIONS,
    ID_RE,
    LLAMA_SERVER,
    METRICS,
    MIN_MACHINES_FLEET,
    MIN_MACHINES_NAMED_CHIP,
    MIN_PROMPTS,
    OURS,
    RATIO_METRICS,
    RULE_FIELDS,
    RULE_METRICS,
    SAMPLER_KEYS,
    SERVER_PRESETS,
    Claim,
    Rule,
    _as_list,
)
from specfleet import schemas, versions
from specfleet.record import (
    ENGINE_METHODS,
    ENGINES,
    IN_PROCESS_ENGINES,
    MAX_DEPTH,
    PROMPT_CATEGORIES,
    VERIFY_COST,
    is_method,
    is_speculative,
    least_depth,
)

LEDGER = Path(__file__).parents[1] / "claims.yaml"
CONFIG = ConfigDict(extra="forbid", strict=True)
MAX_NEW_TOKENS = 16384


class ClaimError(ValueError):
    def __init__(self, problems: list[str]):
        super().__init__("invalid claims ledger: " + "; ".join(problems))
        self.problems = problems


# ---------------------------------------------------------------- field types


def _worded(message: str) -> WrapValidator:
    """Any fault of the field named in one sentence of ours (`message`), not pydantic's own."""

    def check(value, handler):
        try:
            return handler(value)
        except ValidationError:
            schemas.refuse("worded", message)

    return WrapValidator(check)


def _that(test, message: str) -> AfterValidator:
    """A value `test` holds for; `message` otherwise."""

    def check(value):
        if not test(value):
            schemas.refuse("worded", message)
        return value

    return AfterValidator(check)


def _one_or_many(tp, message: str | None = None):
    """A value of `tp` or a list of them, kept as given (the claim selects on every item): a
    faulty item named by `message`, or by its own problem."""
    adapter = pydantic.TypeAdapter(tp, config=CONFIG)

    def check(value):
        for item in value if isinstance(value, list) else [value]:
            if item is None:
                schemas.refuse("worded", message or "must not be null")
            try:
                adapter.validate_python(item)
            except ValidationError as e:
                schemas.refuse("worded", message or schemas.why(e.errors(include_url=False)[0]).removeprefix(": "))
        return value

    return Annotated[Any, AfterValidator(check)]


Text = Annotated[str, _that(str.strip, "must be a non-empty string")]
Number = Annotated[schemas.Int | schemas.Float, _worded("must be a number")]
Slug = Annotated[str, _that(ID_RE.match, "is required: lower-case letters, digits, '_', '.', '-'")]


def _is_reference(m: str) -> bool:
    return not (m.count("/") > 1 or m.startswith(("/", "~", ".")))


Models = Annotated[
    list[Text],
    Field(min_length=1),
    _worded("must be a list of exact model references (Hugging Face ids or file names)"),
    _that(
        lambda ms: all(map(_is_reference, ms)),
        "a reference is a Hugging Face id (org/name) or a file name, never a path",
    ),
]
Digests = Annotated[
    list[Annotated[str, Field(pattern=r"^[0-9a-f]{64}$")]],
    Field(min_length=1),
    _worded("must be a list of SHA-256 digests (64 lower-case hex digits)"),
]
Chip = Annotated[Text, _that(lambda c: "*" not in c[:-1], "an exact chip name, or a prefix ending in '*' (Apple*)")]
DEPTHS = f"is required: a draft depth 0-{MAX_DEPTH} or a list of them (a claim of metric runs may leave it out)"
Depths = _one_or_many(Annotated[int, Field(ge=0, le=MAX_DEPTH)], DEPTHS)
Categories = _one_or_many(
    Literal[PROMPT_CATEGORIES], f"must be one of {', '.join(PROMPT_CATEGORIES)} or a list of them"
)
Contexts = _one_or_many(Annotated[int, Field(ge=0)], "must be a token count >= 0 or a list of them")


def _version_problem(value):
    if value is not None and (why := versions.condition_problem(value)):
        schemas.refuse("worded", why)
    return value


def _floor_words(floor: int) -> str:
    if floor == 1:
        return "must be a positive integer"
    return (
        f"must be an integer >= {floor}: fewer gives wrong verdicts more often than the nominal 2.5%"
        " (bench/verdicts.py)"
    )


def _floor(floor: int) -> AfterValidator:
    """An integer count of at least `floor`: fewer machines or prompts give wrong verdicts more
    often than the nominal rate."""
    return _that(lambda n: n >= floor, _floor_words(floor))


def _broken(found: list[tuple[tuple, str]]) -> None:
    """Raise every broken rule of a model validator at once, each under its field (loc, why)."""
    if found:
        raise PydanticCustomError("rules", "{count} rule(s) broken", {"count": len(found), "found": found})


# ---------------------------------------------------------------- the record's parts


class SourceFields(BaseModel):
    model_config = CONFIG
    file: str
    section: str
    quote: str | None = None


SamplerFields = pydantic.create_model(
    "SamplerFields", __config__=CONFIG, **{key: (Number | None, None) for key in SAMPLER_KEYS}
)
# Every declared setting a claim may select on (specfleet/settings.py `condition`): a value or a
# list of values, each checked against the setting's own generated annotation.
_DeclaredConditions = pydantic.create_model(
    "DeclaredConditions",
    __config__=CONFIG,
    **{
        name: (_one_or_many(schemas.setting_type(s, optional=False)) | None, None)
        for name, s in DECLARED_CONDITIONS.items()
    },
)


def system_problem(engine: str, system: str | None) -> str:
    """Why a claim's system is not one runs of `engine` record ("" when it is)."""
    if engine in IN_PROCESS_ENGINES and system not in (None, OURS):
        return (
            f"engine {engine} runs specfleet's own in-process loops, system {OURS!r}, never {system!r}"
            " (a claim about another system names the engine its runs record: llama-server or openai)"
        )
    if engine == LLAMA_SERVER and system not in (None, LLAMA_SERVER):
        return f"engine llama-server's runs are system 'llama-server', never {system!r}"
    if engine == "openai" and system is None:
        return (
            "is required for engine openai: the OpenAI-compatible server's name as its runs record it"
            " (MTPLX, OptiQ, oMLX, mlx_lm.server, ...)"
        )
    if engine == "openai" and system in (OURS, LLAMA_SERVER):
        return f"{system!r} is not an OpenAI-compatible server's name (engine openai)"
    return ""


class Conditions(_DeclaredConditions):
    """The runs a claim is about (the ledger's header says what each field selects)."""

    engine: Literal[ENGINES]
    system: Annotated[Text, _worded("must be the system's name as its runs record it")] | None = None
    method: str
    models: Models | None = None
    baseline_models: Models | None = None  # the files the source's baseline ran (dashboard/claims.yaml)
    digests: Digests | None = None
    quantisation: Text | None = None
    architecture: Text | None = None
    chip: Chip | None = None
    depth: Depths | None = None
    sampler: SamplerFields = SamplerFields()
    prompt_category: Categories | None = None
    prompt_set: Text | None = None
    context_tokens: Contexts | None = None
    version: Annotated[Any, AfterValidator(_version_problem)] = None

    @property
    def resolved_system(self) -> str:
        """The system as runs of the engine record it: specfleet for our loops and llama-server
        for llama.cpp's server (either may be left out), an OpenAI-compatible server's own name."""
        return {LLAMA_SERVER: LLAMA_SERVER}.get(self.engine, OURS) if self.system is None else self.system

    @pydantic.model_validator(mode="after")
    def _runs_can_record_it(self):
        found = []
        if why := system_problem(self.engine, self.system):
            found.append((("system",), why))
        if self.method in ("baseline", VERIFY_COST) or not is_method(self.engine, self.method):
            known = ", ".join(m for m in ENGINE_METHODS[self.engine] if m != "baseline")
            lists = " or a comma list of them" if self.engine == LLAMA_SERVER else ""
            found.append(
                (
                    ("method",),
                    f"is required: a method engine {self.engine} runs ({known}){lists}, got {self.method!r}",
                )
            )
        elif is_speculative(self.method) and 0 in _as_list(self.depth) and least_depth(self.engine, self.method) > 0:
            found.append((("depth",), f"a {self.method} run records a depth 1-{MAX_DEPTH}: depth 0 selects none"))
        _broken(found)
        return self


class VerdictFields(BaseModel):
    """The rule that settles a claim, its tolerance band and what a verdict needs."""

    model_config = CONFIG
    rule: Literal[tuple(RULE_FIELDS)]
    low: Number | None = None
    high: Number | None = None
    threshold: Number | None = None
    min_machines: Annotated[int, _floor(min(MIN_MACHINES_NAMED_CHIP, MIN_MACHINES_FLEET))] | None = None
    min_prompts: Annotated[int, _floor(MIN_PROMPTS)] = MIN_PROMPTS
    min_runs: Annotated[int, _floor(1)] = 1

    @pydantic.model_validator(mode="after")
    def _band_holds(self):
        found = [
            ((name,), f"is required for rule {self.rule}: a number")
            for name in RULE_FIELDS[self.rule]
            if getattr(self, name) is None
        ]
        low, high, threshold = self.low, self.high, self.threshold
        if low is not None and high is not None:
            if self.rule == "range" and not 0 <= low < high:
                found.append((("low",), f"must lie in [0, verdict.high) ({high})"))
            if self.rule == "best_depth_in" and low > high:
                found.append((("low",), f"must not exceed verdict.high ({high})"))
        if self.rule in ("above", "below") and threshold is not None:
            if threshold < 0 or (self.rule == "below" and threshold == 0):
                found.append((("threshold",), "must be a ratio > 0"))
        _broken(found)
        return self

    def band(self) -> tuple[float, float]:
        if self.rule == "above":
            return float(self.threshold), math.inf
        if self.rule == "below":
            return 0.0, float(self.threshold)
        if self.rule == "none_measured":
            return 0.0, 0.0
        return float(self.low), float(self.high)


class SweepFields(BaseModel):
    """What the generated sweep needs beyond the conditions (dashboard/claims/sweeps.py)."""

    model_config = CONFIG
    # Each may be left out; given, it is a non-empty string (a null is refused, as a typo would be).
    target: Text = None
    draft: Text = None
    flags: Text = None
    command: Text = None
    arm_command: Text = None
    max_new_tokens: Annotated[
        int, Field(ge=1, le=MAX_NEW_TOKENS), _worded(f"must be a token count 1-{MAX_NEW_TOKENS}")
    ] = 256


def sweep_problems(sweep: SweepFields, c: Conditions) -> list[tuple[tuple, str]]:
    """The sweep's fields against the claim's system: llama-server's flags on llama-server, an
    OpenAI-compatible server's command templates on openai (required where SERVER_PRESETS has
    none, and setting the claim's depth: a command without {depth} would run the server's own
    depth under the claim's K)."""
    given = sweep.model_fields_set
    found = []
    if "flags" in given and c.engine != LLAMA_SERVER:
        found.append(
            (
                ("sweep", "flags"),
                "llama-server's flags apply to engine llama-server (openai: sweep.command, arm_command)",
            )
        )
    for key in ("command", "arm_command"):
        if key in given and c.engine != "openai":
            found.append((("sweep", key), "an OpenAI-compatible server's command template applies to engine openai"))
    if c.engine != "openai":
        return found
    system, method = c.resolved_system, c.method
    preset = SERVER_PRESETS.get(system, {})
    if "command" not in given and "baseline" not in preset:
        known = ", ".join(SERVER_PRESETS)
        found.append(
            (("sweep", "command"), f"is required: no command is known for {system} (known: {known}); a template")
        )
    if "arm_command" not in given and method not in preset:
        found.append((("sweep", "arm_command"), f"is required: no {method} command is known for {system}; a template"))
    arm = sweep.arm_command or preset.get(method)
    if _as_list(c.depth) and arm is not None and "{depth}" not in arm:
        found.append(
            (
                ("conditions", "depth"),
                f"{system}'s {method} command sets no depth ({arm!r} has no {{depth}}): its runs would record K"
                f" while {system} runs its own depth; give sweep.arm_command with {{depth}}, or list the claim in"
                " docs/claims.md until the server's depth option is known",
            )
        )
    return found


class ClaimRecord(BaseModel):
    """One record of the ledger: a claim, where it comes from, the runs it is about and the rule
    that settles it."""

    model_config = CONFIG
    id: Slug
    statement: Text
    source: SourceFields
    conditions: Conditions
    metric: Literal[METRICS]
    expected: Annotated[str | int | float, _worded("is required: the figure or range as the source gives it")]
    verdict: VerdictFields
    sweep: SweepFields = SweepFields()
    note: str | None = None
    conflicts: Annotated[
        list[Slug], _worded("must be a list of claim ids (the claims the seeds hold against this one)")
    ] = []

    @property
    def named_chip(self) -> bool:
        chip = self.conditions.chip
        return chip is not None and not chip.endswith("*")

    @property
    def min_machines(self) -> int:
        """The machines per chip a verdict needs: the record's, or the least for its chip."""
        least = MIN_MACHINES_NAMED_CHIP if self.named_chip else MIN_MACHINES_FLEET
        return least if self.verdict.min_machines is None else self.verdict.min_machines

    @pydantic.model_validator(mode="after")
    def _parts_agree(self):
        found = []
        metric, rule, c = self.metric, self.verdict.rule, self.conditions
        if versions.is_change(c.version) and metric not in versions.CHANGE_FIGURES:
            found.append(
                (("metric",), f"a change between versions is settled on {' or '.join(versions.CHANGE_FIGURES)}")
            )
        depths = _as_list(c.depth)
        if not depths and metric != "runs":
            found.append((("conditions", "depth"), DEPTHS))
        if rule in RULE_METRICS and metric not in RULE_METRICS[rule]:
            found.append((("verdict", "rule"), f"{rule} needs metric {' or '.join(RULE_METRICS[rule])}"))
        if rule not in RULE_METRICS and metric in ("best_depth", "runs"):
            found.append((("verdict", "rule"), f"metric {metric} needs rule best_depth_in or none_measured"))
        if c.baseline_models and metric not in RATIO_METRICS:
            found.append(
                (
                    ("conditions", "baseline_models"),
                    f"a baseline pairs with a ratio: metric {' or '.join(RATIO_METRICS)}",
                )
            )
        least = MIN_MACHINES_NAMED_CHIP if self.named_chip else MIN_MACHINES_FLEET
        if self.min_machines < least:
            found.append((("verdict", "min_machines"), _floor_words(least)))
        _broken(found + sweep_problems(self.sweep, c))
        return self

    def claim(self, raw: dict) -> Claim:
        """The Claim of this record; `raw` is the record as the file gives it, whose values the
        claim keeps as given."""
        cond = raw["conditions"]
        return Claim(
            id=self.id,
            statement=self.statement.strip(),
            source=raw["source"],
            conditions={**cond, "system": self.conditions.resolved_system, "sampler": cond.get("sampler", {})},
            metric=self.metric,
            expected=str(self.expected),
            rule=Rule(
                self.verdict.rule,
                *self.verdict.band(),
                min_machines=self.min_machines,
                min_prompts=self.verdict.min_prompts,
                min_runs=self.verdict.min_runs,
            ),
            sweep=raw.get("sweep", {}),
            note=(self.note or "").strip(),
            conflicts=tuple(self.conflicts),
        )


# ---------------------------------------------------------------- problems, by line

# Hints for a key the ledger once had.
_RENAMED = {
    "model_family": " (models are named by exact reference: use models or digests)",
    "implementation": " (the system under test is `system`, as runs record it, with its engine and method)",
}
_PARTS = {
    (): ClaimRecord,
    ("source",): SourceFields,
    ("conditions",): Conditions,
    ("conditions", "sampler"): SamplerFields,
    ("verdict",): VerdictFields,
    ("sweep",): SweepFields,
}


def _errors(error: ValidationError) -> list[tuple[tuple, str]]:
    """Each problem of a record's validation as (field path, why), a model validator's broken
    rules each under its own field, an unknown key with the keys allowed there."""
    out = []
    for e in error.errors(include_url=False):
        loc = tuple(e["loc"])
        if e["type"] == "rules":
            out += [(loc + tuple(sub), f": {why}") for sub, why in e["ctx"]["found"]]
            continue
        why = schemas.why(e)
        if e["type"] == "extra_forbidden" and loc[:-1] in _PARTS:
            allowed = ", ".join(sorted(_PARTS[loc[:-1]].model_fields))
            why += f" (allowed: {allowed}){_RENAMED.get(str(loc[-1]), '') if loc[:-1] == ('conditions',) else ''}"
        out.append((loc, why))
    return out


def _line(node: yaml.Node, loc: tuple) -> int:
    """The line a field path starts on in the composed YAML: of its key or item, or, for a part
    that is not there, of the nearest enclosing one that is."""
    line = node.start_mark.line + 1
    for part in loc:
        if isinstance(node, yaml.SequenceNode) and isinstance(part, int) and part < len(node.value):
            node = node.value[part]
            line = node.start_mark.line + 1
        elif isinstance(node, yaml.MappingNode):
            pair = next(
                (kv for kv in node.value if isinstance(kv[0], yaml.ScalarNode) and kv[0].value == str(part)), None
            )
            if pair is None:
                break
            line, node = pair[0].start_mark.line + 1, pair[1]
        else:
            break
    return line


def _read(text: str) -> tuple[Any, yaml.Node | None]:
    """The file's records and its node tree (for lines)."""
    try:
        return yaml.load(text, Loader=yaml.CSafeLoader), yaml.compose(text, Loader=yaml.CSafeLoader)
    except yaml.YAMLError as e:
        raise ClaimError([f"file: not valid YAML ({str(e).splitlines()[0]})"]) from None


def _record(i: int, rec: Any, tree: yaml.Node) -> tuple[Claim | None, list[str]]:
    """One record as a Claim, or the problems that keep it from being one."""
    if not isinstance(rec, dict):
        return None, [f"claims[{i}]: must be a mapping of claim fields (line {_line(tree, (i,))})"]
    where = f"claims[{i}]" + (f" ({rec['id']})" if isinstance(rec.get("id"), str) else "")
    try:
        record = ClaimRecord.model_validate(rec)
    except ValidationError as e:
        return None, [f"{schemas.where_of(loc, where)}{why} (line {_line(tree, (i, *loc))})" for loc, why in _errors(e)]
    return record.claim(rec), []


def _ledger_problems(claims: list[tuple[int, Claim]], tree: yaml.Node) -> list[str]:
    """What is wrong between records: an id used twice, a conflict naming no other claim of the
    ledger (or the claim itself)."""
    problems = []
    seen: set[str] = set()
    for i, c in claims:
        if c.id in seen:
            problems.append(f"claims ({c.id}).id: used twice (line {_line(tree, (i, 'id'))})")
        seen.add(c.id)
    for i, c in claims:
        for other in c.conflicts:
            if other not in seen or other == c.id:
                line = _line(tree, (i, "conflicts"))
                problems.append(
                    f"claims ({c.id}).conflicts: {other!r} is not another claim of this ledger (line {line})"
                )
    return problems


def parse_claims(text: str) -> list[Claim]:
    """Parse and check a ledger; raise one ClaimError naming every problem of every record, each
    by its field and its line."""
    doc, tree = _read(text)
    if not isinstance(doc, list):
        raise ClaimError(["file: must be a list of claim records"])
    problems: list[str] = []
    claims: list[tuple[int, Claim]] = []  # each with its record's index
    for i, rec in enumerate(doc):
        claim, found = _record(i, rec, tree)
        problems += found
        claims += [(i, claim)] if claim is not None else []
    problems += _ledger_problems(claims, tree)
    if problems:
        raise ClaimError(problems)
    return [c for _, c in claims]


def load_claims(path: Path = LEDGER) -> list[Claim]:
    return parse_claims(Path(path).read_text())
