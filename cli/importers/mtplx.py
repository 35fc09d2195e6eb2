"""A `mtplx bench run` directory (its envelope.json) and `mtplx tune` results as imported results.

envelope.json is read by the field names MTPLX's `build_benchmark_envelope` writes: `runtime`
(`tok_s`, `generated_tokens`, `acceptance_by_depth`, `drafted_by_depth`), `suite`, `created_at`,
`model` (its model inspection), `quality` (`passed`) and `strict_gates` ({gate: passed}). The
draft depth is the length of the acceptance (or drafted) by depth list; an empty one is an
autoregressive run. The envelope names neither the machine nor MTPLX's version: they are read
where present (`build.host`, `build.platform`, `mtplx_version`, the model's runtime contract's
`mtplx_version`) and otherwise left unknown (the importer's --machine-note says the machine).

`mtplx tune` results (tuning.json, the name of MTPLX's tune state file, or tune*.json) are read
by the fields tune writes per candidate: `results` [{`mode` ("ar", "d1", "d2", ...), `tok_s`,
`acceptance_by_depth`}], and the model from `model` or `model_repo`.

Acceptance by depth ends at the first depth with no value (MTPLX writes null for a depth never
drafted), so that no rate is made up.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from cli.importers.result import BadFile, Fields, ImportedResult, Source, at_most_rows, read_source

ENVELOPE = "envelope.json"
TUNE_PATTERNS = ("tuning.json", "tune*.json")
_MODE = re.compile(r"d(?:epth)?[-_ ]?(\d+)|mtp[-_ ]?(\d+)", re.IGNORECASE)


def _line(text: str, offset: int) -> int:
    return text.count("\n", 0, offset) + 1


def _document(path: Path) -> tuple[str, Source, dict]:
    text, source = read_source(path)
    source = Source(f"{path.parent.name}/{path.name}", source.sha256)
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        raise source.bad(f"not JSON: {e.msg} (column {e.colno})", e.lineno) from None
    if not isinstance(value, dict):
        raise source.bad(f"expected a JSON object, got {type(value).__name__}", 1)
    return text, source, value


def _key_lines(text: str, start: int = 0):
    """The line of a key's first occurrence in the text from `start` (else of `start`)."""

    def line_of(name: str) -> int:
        found = text.find(f'"{name.split(".")[-1].split("[")[0]}"', start)
        return _line(text, found if found >= 0 else start)

    return line_of


def _name(reference: str) -> str:
    """A model's name, never a local path: a Hugging Face cache path
    (.../models--ORG--NAME/snapshots/REV) as ORG/NAME, another path as its last part,
    anything else as given."""
    path = Path(reference)
    if not path.is_absolute():
        return reference
    for part in path.parts:
        if part.startswith("models--"):
            return part.removeprefix("models--").replace("--", "/")
    return path.name


def _gates(envelope: Fields) -> str:
    gates: dict[str, bool] = {}
    quality = envelope.nested("quality", required=False)
    if quality.has("passed"):
        if not isinstance(quality.values["passed"], bool):
            raise quality.bad("passed", f"expected true or false, got {quality.values['passed']!r}")
        gates["quality"] = quality.values["passed"]
    strict = envelope.nested("strict_gates", required=False)
    for name, passed in strict.values.items():
        if not isinstance(passed, bool):
            raise strict.bad(name, f"expected true or false, got {passed!r}")
        gates[name] = passed
    return json.dumps(gates, sort_keys=True) if gates else ""


def _model_name(envelope: Fields) -> str:
    value = envelope.values.get("model")
    if isinstance(value, str) and value:
        return _name(value)
    model = envelope.nested("model")
    for key in ("model_id", "ref", "reference", "repo", "name", "path", "model"):
        if model.has(key):
            return _name(model.text(key))
    raise envelope.bad("model", "names no model (none of model_id, ref, reference, repo, name, path, model)")


def _version(envelope: Fields) -> str:
    if envelope.has("mtplx_version"):
        return envelope.text("mtplx_version")
    contract = envelope.values.get("model")
    for key in ("compatibility", "runtime_contract", "mtplx_version"):
        contract = contract.get(key) if isinstance(contract, dict) else None
    if isinstance(contract, str) and contract not in ("", "unknown"):
        return contract
    return ""


def _machine(envelope: Fields) -> str:
    build = envelope.nested("build", required=False)
    return " / ".join(build.text(key) for key in ("host", "platform") if build.has(key))


def parse_envelope(path: Path) -> ImportedResult:
    text, source, value = _document(path)
    envelope = Fields(value, source, 1, _key_lines(text))
    runtime = envelope.nested("runtime")
    tokens_per_second = runtime.number("tok_s")
    if tokens_per_second <= 0:
        raise runtime.bad("tok_s", f"must be above 0, got {runtime.values['tok_s']!r}")
    acceptance = runtime.numbers("acceptance_by_depth", high=1.0, until_null=True)
    drafted = runtime.values.get("drafted_by_depth")
    depth = len(drafted) if isinstance(drafted, list) and drafted else len(acceptance)
    return ImportedResult(
        tool="mtplx bench",
        tool_version=_version(envelope),
        source=source,
        line=1,
        machine=_machine(envelope),
        model=_model_name(envelope),
        test=f"{envelope.text('suite', required=False) or 'bench'} {'mtp depth ' + str(depth) if depth else 'ar'}",
        method="mtp" if depth else "baseline",
        draft_depth=depth,
        n_prompt=0,
        n_gen=runtime.integer("generated_tokens", required=False, default=0),
        n_depth=0,
        tokens_per_second=tokens_per_second,
        acceptance_by_depth=acceptance,
        quality_gates_json=_gates(envelope),
        measured_at=envelope.text("created_at", required=False),
        fields_json=json.dumps(value, sort_keys=True),
    )


def _depth(row: Fields) -> int:
    if row.has("depth"):
        return row.integer("depth")
    mode = row.text("mode")
    if mode.lower() == "ar":
        return 0
    match = _MODE.fullmatch(mode.strip())
    if not match:
        raise row.bad("mode", f"expected 'ar' or a depth such as 'd2', got {mode!r}")
    return int(match.group(1) or match.group(2))


def parse_tune(path: Path) -> list[ImportedResult]:
    text, source, value = _document(path)
    tune = Fields(value, source, 1, _key_lines(text))
    model = _name(tune.text("model", required=False) or tune.text("model_repo", required=False))
    if not model:
        raise tune.bad("model", "missing: the tune results name no model (model or model_repo)")
    results = tune.values.get("results")
    if not isinstance(results, list) or not results:
        raise tune.bad("results", "expected a list of tuned candidates")
    out, offset = [], text.find('"results"')
    for i, candidate in enumerate(results):
        offset = text.find("{", offset + 1)
        if not isinstance(candidate, dict):
            raise tune.bad(f"results[{i}]", f"expected an object, got {type(candidate).__name__}")
        row = Fields(candidate, source, _line(text, offset), _key_lines(text, offset), f"results[{i}].")
        depth = _depth(row)
        tokens_per_second = row.number("tok_s")
        if tokens_per_second <= 0:
            raise row.bad("tok_s", f"must be above 0, got {candidate['tok_s']!r}")
        out.append(
            ImportedResult(
                tool="mtplx tune",
                tool_version=tune.text("mtplx_version", required=False),
                source=source,
                line=row.line,
                machine=_machine(tune),
                model=model,
                test=f"tune {'mtp depth ' + str(depth) if depth else 'ar'}",
                method="mtp" if depth else "baseline",
                draft_depth=depth,
                n_prompt=0,
                n_gen=0,
                n_depth=0,
                tokens_per_second=tokens_per_second,
                acceptance_by_depth=row.numbers("acceptance_by_depth", high=1.0, until_null=True),
                measured_at=tune.text("created_at", required=False) or tune.text("tuned_at", required=False),
                fields_json=json.dumps({"model": model, **candidate}, sort_keys=True),
            )
        )
        offset = text.find("}", offset)
    return out


def parse(directory: Path) -> list[ImportedResult]:
    """Every result of a `mtplx bench run` directory and the tune results in it, or BadFile."""
    if not directory.is_dir():
        raise BadFile(f"{directory}: not a directory (expected a `mtplx bench run` directory)")
    tunes = sorted({p for pattern in TUNE_PATTERNS for p in directory.glob(pattern)})
    envelope = directory / ENVELOPE
    if not envelope.exists() and not tunes:
        raise BadFile(f"{directory}: no {ENVELOPE} and no tune results ({', '.join(TUNE_PATTERNS)})")
    results = [parse_envelope(envelope)] if envelope.exists() else []
    for tune in tunes:
        results += parse_tune(tune)
    return at_most_rows(results, Source(directory.name, ""))
