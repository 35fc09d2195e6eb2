"""Validation by pydantic 2: the types, bounds and choices of the run record, the job spec and the
sweep file, and the problems they name.

`model(error, what, rules)` makes a frozen pydantic dataclass of a class: its constructor (and so
`dataclasses.replace`) checks every field against its annotation and raises one `error` naming
every faulty field and every broken rule between fields (`rules`: each judged on the sound fields,
unless it reads a faulty one). Scalars are strict (an int is never a string or a bool; ints may
stand for floats, as JSON writes them); lists are read into tuples; nested parts may be given as
mappings; an unknown field is refused.

A declared setting's annotation is generated from its row of specfleet/settings.py
(`setting_type`: its choices a Literal, its bounds pydantic's own Field(ge, le); `SettingsField`),
the one checker of the record, the job spec, the sweep file and the engines; the record's other
fields use `between`, `text`, `one_of`, `sha256`. `problems` turns pydantic's errors into the
fleet's wording: `<field>: must be an integer, got '2'`, `<field>: must be at least 1, got 0`,
`<field> = -1.0 is not in [0, 604800.0]`.
"""

from __future__ import annotations

import dataclasses
import functools
import re
from collections.abc import Callable, Sequence
from typing import Annotated, Any, Literal, get_type_hints

import pydantic
from pydantic import AfterValidator, ConfigDict, Field, Strict, ValidationError
from pydantic_core import PydanticCustomError, core_schema

from specfleet import settings as declared
from specfleet.settings import Settings

CONFIG = ConfigDict(extra="forbid", allow_inf_nan=False)
Int = Annotated[int, Strict()]
Float = Annotated[float, Strict()]  # an int is accepted and read as a float
Str = Annotated[str, Strict()]
Bool = Annotated[bool, Strict()]
STRICT = {int: Int, float: Float, str: Str, bool: Bool}
MAX_SHOWN = 80  # characters of a faulty value quoted in a problem


def refuse(kind: str, message: str):
    # No context: the message is final, whatever braces the value holds.
    raise PydanticCustomError(kind, message)


def _shown(value) -> str:
    text = repr(value)
    return text if len(text) <= MAX_SHOWN else text[: MAX_SHOWN - 3] + "..."


def between(lo: float, hi: float) -> AfterValidator:
    """A number in [lo, hi]: `<field> = <value> is not in [lo, hi]`."""

    def check(value):
        if not lo <= value <= hi:
            refuse("range", f" = {_shown(value)} is not in [{lo}, {hi}]")
        return value

    return AfterValidator(check)


def _number(x) -> str:
    return str(int(x)) if isinstance(x, float) and x.is_integer() and abs(x) < 1e15 else str(x)


def bounded(tp, lo: float | None, hi: float | None):
    """`tp` in [lo, hi] by pydantic's own bounds (either end may be open): `<field>: must be at
    least lo, got v`."""
    bounds = {k: v for k, v in (("ge", lo), ("le", hi)) if v is not None}
    return Annotated[tp, Field(**bounds)] if bounds else tp


def text(lo: int, hi: int) -> AfterValidator:
    """A string of lo..hi characters: `<field> must be lo-hi characters, got n`."""

    def check(value: str):
        if not lo <= len(value) <= hi:
            refuse("text_length", f" must be {lo}-{hi} characters, got {len(value)}")
        return value

    return AfterValidator(check)


def one_of(choices: tuple[str, ...]) -> AfterValidator:
    """One of `choices`: `<field> 'x' is not one of 'a', 'b'`."""
    allowed = frozenset(choices)

    def check(value):
        if value not in allowed:
            refuse("choice", f" {_shown(value)} is not one of {', '.join(map(repr, choices))}")
        return value

    return AfterValidator(check)


def sha256(value: str) -> str:
    """Empty, or 64 lowercase hex digits."""
    if value and (len(value) != 64 or value.strip("0123456789abcdef")):
        refuse("sha256", f" {_shown(value[:MAX_SHOWN])} is not 64 lowercase hex digits")
    return value


Sha256 = Annotated[str, Strict(), AfterValidator(sha256)]


# ---------------------------------------------------------------- the declared settings


def setting_type(s: declared.Setting, optional: bool = True):
    """The annotation of a declared setting's value, generated from its row: its strict type, its
    choices as a Literal, its bounds as pydantic's own (`bounded`); None allowed when `optional`
    (unknown or not applicable)."""
    tp = bounded(Literal[s.choices] if s.choices else STRICT[s.type], s.lo, s.hi)
    return tp | None if optional else tp


def fields_of(rows, optional=lambda s: True) -> dict[str, tuple[Any, Any]]:
    """pydantic fields (name -> (annotation, default)) of declared rows, each named by its `key`."""
    return {s.key: (setting_type(s, optional(s)), s.default) for s in rows}


# The settings' fields, generated from the declaration: the carried settings with their defaults.
_SettingsFields = pydantic.create_model(
    "Settings",
    __config__=CONFIG,
    **fields_of(declared.CARRIED),
)


def _settings_schema(_source, handler) -> core_schema.CoreSchema:
    """Settings (specfleet/settings.py's dataclass) checked field by field by the generated model:
    given as a Settings or as a mapping, read back into a Settings."""

    def as_mapping(value):
        return value.__dict__ if isinstance(value, Settings) else value

    def as_settings(fields) -> Settings:
        return Settings(**fields.__dict__)

    return core_schema.no_info_before_validator_function(
        as_mapping,
        core_schema.no_info_after_validator_function(as_settings, handler.generate_schema(_SettingsFields)),
    )


SettingsField = Annotated[Settings, pydantic.GetPydanticSchema(_settings_schema)]
_SETTINGS = pydantic.TypeAdapter(SettingsField)
# Each declared setting's annotation, made once (the sweep file checks every value against it).
SETTING_TYPES = {s.name: setting_type(s) for s in declared.DECLARED}
SETTING_ADAPTERS = {name: pydantic.TypeAdapter(tp, config=CONFIG) for name, tp in SETTING_TYPES.items()}


def settings_problems(value, where: str = "settings") -> list[str]:
    """Every faulty field of declared settings (a Settings or a mapping), named `<where>.<name>`
    (`<name>` when `where` is "")."""
    try:
        _SETTINGS.validate_python(value)
    except ValidationError as e:
        return problems(e, f"{where}." if where else "")
    return []


def setting_problem(s: declared.Setting, value) -> str:
    """Why `value` is not a value of setting `s` ("" when it is), as `why` words it."""
    try:
        SETTING_ADAPTERS[s.name].validate_python(value)
    except ValidationError as e:
        return why(e.errors(include_url=False)[0]).removeprefix(": ")
    return ""


# ---------------------------------------------------------------- problems, in the fleet's words

_MUST_BE = {
    "int_type": "an integer",
    "int_from_float": "an integer",
    "float_type": "a number",
    "bool_type": "true or false",
    "string_type": "a string",
    "dict_type": "a mapping",
    "dataclass_type": "a mapping",
    "dataclass_exact_type": "a mapping",
    "model_type": "a mapping",
    "model_attributes_type": "a mapping",
    "tuple_type": "a list",
    "list_type": "a list",
    "iterable_type": "a list",
}


def where_of(loc: tuple, prefix: str = "", fields: tuple[str, ...] = ()) -> str:
    """A pydantic location as the fleet names a field: `env_reasons[1]`, `settings.threads`;
    a positional argument by its field's name."""
    out = prefix
    for i, part in enumerate(loc):
        if isinstance(part, int):
            out += fields[part] if i == 0 and part < len(fields) else f"[{part}]"
        else:
            out += ("." if out and not out.endswith(".") else "") + str(part)
    return out


def why(error: dict) -> str:
    """What is wrong in one pydantic error, as it follows the field's name: `: must be an integer,
    got '2'`, or a bound's own wording (` = -1.0 is not in [0, 10]`)."""
    kind, value, ctx = error["type"], error["input"], error.get("ctx")
    if kind in ("missing", "missing_argument", "missing_keyword_only_argument"):
        return ": is required"
    if kind in ("extra_forbidden", "unexpected_keyword_argument"):
        return ": unknown field"
    if kind in _MUST_BE:
        return f": must be {_MUST_BE[kind]}, got {_shown(value)}"
    if kind == "greater_than_equal":
        return f": must be at least {_number(ctx['ge'])}, got {_shown(value)}"
    if kind == "less_than_equal":
        return f": must be at most {_number(ctx['le'])}, got {_shown(value)}"
    if kind == "literal_error":
        choices = ", ".join(re.findall(r"'([^']*)'", ctx["expected"]))
        return f": must be one of {choices}, got {_shown(value)}"
    if kind == "finite_number":
        return f": must be finite, got {value!r}"
    if kind == "too_long":
        return f": holds {ctx['actual_length']} items; at most {ctx['max_length']}"
    if kind == "too_short":
        return f": must hold at least {ctx['min_length']} item(s)"
    if kind in ("range", "text_length", "choice", "sha256"):
        return error["msg"]
    return f": {error['msg']}"


def problem(error: dict, prefix: str = "", fields: tuple[str, ...] = ()) -> str:
    """One pydantic error as `<field>: <why>`."""
    return where_of(error["loc"], prefix, fields) + why(error)


def problems(error: ValidationError, prefix: str = "", fields: tuple[str, ...] = ()) -> list[str]:
    """Every faulty field of one validation, in the fleet's words."""
    return [problem(e, prefix, fields) for e in error.errors(include_url=False)]


class _Faulty(Exception):
    """A rule read a field that failed its own check: the rule cannot be judged."""


class _Sound:
    """The fields of a construction that passed their own checks, read as attributes; reading a
    faulty one raises _Faulty."""

    def __init__(self, values: dict[str, Any]):
        self.__dict__.update(values)

    def __getattr__(self, name: str):
        raise _Faulty(name)


@functools.cache
def _field_adapter(cls, name: str) -> pydantic.TypeAdapter:
    tp = get_type_hints(cls, include_extras=True)[name]
    try:
        return pydantic.TypeAdapter(tp, config=CONFIG)
    except pydantic.PydanticUserError:  # a part with its own config (a nested model)
        return pydantic.TypeAdapter(tp)


def _sound_fields(cls, names: tuple[str, ...], args, kwargs, faulty: set[str]) -> _Sound:
    """What a failed construction's sound fields hold (each read by its own annotation), its
    defaults for those not given: the rules between fields judge what they can of it."""
    given = {**dict(zip(names, args)), **kwargs}
    values = {}
    for f in dataclasses.fields(cls):
        if f.name in faulty:
            continue
        if f.name in given:
            try:
                values[f.name] = _field_adapter(cls, f.name).validate_python(given[f.name])
            except ValidationError:
                continue
        elif f.default is not dataclasses.MISSING:
            values[f.name] = f.default
        elif f.default_factory is not dataclasses.MISSING:
            values[f.name] = f.default_factory()
    return _Sound(values)


def broken_rules(rules: Sequence[Callable[[Any], str]], record) -> list[str]:
    """What each rule between fields finds wrong ("" or None: nothing), leaving out the rules that
    read a faulty field."""
    out = []
    for rule in rules:
        try:
            problem = rule(record)
        except _Faulty:
            continue
        if problem:
            out.append(problem)
    return out


def _refusal(error: type[ValueError], what: str, problems: list[str]) -> ValueError:
    """`error("<what>: <problem>; <problem>")`, its problems kept as `problems`."""
    refused = error(f"{what}: " + "; ".join(problems))
    refused.problems = problems
    return refused


def model(error: type[ValueError], what: str, rules: Sequence[Callable[[Any], str]] = ()):
    """A class decorator: the class as a frozen pydantic dataclass (CONFIG) whose constructor
    raises `error("<what>: <problem>; <problem>")` naming every faulty field and every broken
    rule between fields (each rule: the instance -> a problem, or ""), in one message: a rule is
    judged on the sound fields even when others are faulty, unless it reads a faulty one."""

    def decorate(cls):
        cls = pydantic.dataclasses.dataclass(cls, frozen=True, config=CONFIG)
        init = cls.__init__
        names = tuple(f.name for f in dataclasses.fields(cls))

        @functools.wraps(init)
        def __init__(self, *args, **kwargs):
            try:
                init(self, *args, **kwargs)
            except ValidationError as e:
                errors = e.errors(include_url=False)
                faulty = {where_of(err["loc"][:1], "", names) for err in errors if err["loc"]}
                found = [problem(err, "", names) for err in errors]
                if rules:
                    found += broken_rules(rules, _sound_fields(cls, names, args, kwargs, faulty))
                raise _refusal(error, what, found) from None
            broken = broken_rules(rules, self)
            if broken:
                raise _refusal(error, what, broken)

        cls.__init__ = __init__
        return cls

    return decorate
