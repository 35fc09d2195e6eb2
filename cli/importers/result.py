"""What every importer returns: `ImportedResult`, one figure with its provenance, and `BadFile`,
the one-line refusal of a file. `Fields` reads a row's fields by name, converting and checking
each, so that every importer names a bad value the same way:
"results.jsonl line 3: field avg_ts: expected a number, got 'abc'"."""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass
from pathlib import Path

from coordinator.limits import MAX_IMPORT_ROWS
from protos.specfleet.v1 import fleet_pb2 as pb

MAX_FILE_BYTES = 64 * 1024 * 1024


class BadFile(ValueError):
    """A file that cannot be imported; the message is one line naming file, line and field."""


@dataclass(frozen=True)
class Source:
    """The file a result came from: its name (never its directory) and the SHA-256 of its bytes."""

    name: str
    sha256: str

    def bad(self, message: str, line: int | None = None) -> BadFile:
        return BadFile(f"{self.name}{f' line {line}' if line else ''}: {message}")


def read_source(path: Path) -> tuple[str, Source]:
    """The text of `path` and its Source; a file that is missing, too large or not UTF-8 is refused."""
    try:
        size = path.stat().st_size
        if size > MAX_FILE_BYTES:
            raise BadFile(f"{path.name}: {size} bytes; at most {MAX_FILE_BYTES} per import")
        data = path.read_bytes()
    except OSError as e:
        raise BadFile(f"cannot read {path}: {e.strerror}") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise BadFile(f"{path.name}: not UTF-8 text (byte {e.start})") from None
    return text, Source(path.name, hashlib.sha256(data).hexdigest())


@dataclass(frozen=True)
class ImportedResult:
    """One figure another tool measured (protos ImportedResult), validated by its importer."""

    tool: str
    tool_version: str
    source: Source
    line: int
    machine: str
    model: str
    test: str
    method: str
    draft_depth: int
    n_prompt: int
    n_gen: int
    n_depth: int
    tokens_per_second: float
    fields_json: str
    tokens_per_second_stddev: float | None = None
    samples_tokens_per_second: tuple[float, ...] = ()
    acceptance_by_depth: tuple[float, ...] = ()
    quality_gates_json: str = ""
    measured_at: str = ""

    def to_proto(self) -> pb.ImportedResult:
        return pb.ImportedResult(
            tool=self.tool,
            tool_version=self.tool_version,
            source_file=self.source.name,
            source_sha256=self.source.sha256,
            source_line=self.line,
            machine=self.machine,
            model=self.model,
            test=self.test,
            method=self.method,
            draft_depth=self.draft_depth,
            n_prompt=self.n_prompt,
            n_gen=self.n_gen,
            n_depth=self.n_depth,
            tokens_per_second=self.tokens_per_second,
            tokens_per_second_stddev=self.tokens_per_second_stddev or 0.0,
            has_stddev=self.tokens_per_second_stddev is not None,
            samples_tokens_per_second=self.samples_tokens_per_second,
            acceptance_by_depth=self.acceptance_by_depth,
            quality_gates_json=self.quality_gates_json,
            measured_at=self.measured_at,
            fields_json=self.fields_json,
        )


def at_most_rows(results: list, source: Source) -> list:
    if len(results) > MAX_IMPORT_ROWS:
        raise source.bad(f"{len(results)} results; at most {MAX_IMPORT_ROWS} per import: split the file")
    if not results:
        raise source.bad("no results in the file")
    return results


def _shown(value) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


class Fields:
    """A row's fields read by name. Values may be typed (JSON) or text (csv, sql): a number
    given as text is read as one; a boolean, NaN or infinity is never a number. `line_of(name)`
    says on which line a field is, where the importer can tell (else the row's line)."""

    def __init__(self, values: dict, source: Source, line: int, line_of=None, prefix: str = ""):
        self.values, self.source, self.line = values, source, line
        self._line_of = line_of or (lambda name: line)
        self._prefix = prefix

    def bad(self, name: str, message: str) -> BadFile:
        return self.source.bad(f"field {self._prefix}{name}: {message}", self._line_of(name))

    def has(self, name: str) -> bool:
        return self.values.get(name) not in (None, "")

    def _get(self, name: str, required: bool):
        if name not in self.values or self.values[name] is None:
            if required:
                raise self.source.bad(f"field {self._prefix}{name}: missing", self.line)
            return None
        return self.values[name]

    def text(self, name: str, required: bool = True, default: str = "") -> str:
        value = self._get(name, required)
        if value is None:
            return default
        if isinstance(value, bool) or not isinstance(value, str | int | float):
            raise self.bad(name, f"expected text, got {_shown(value)}")
        return str(value)

    def number(self, name: str, required: bool = True, default: float | None = None, low: float = 0.0) -> float | None:
        value = self._get(name, required)
        if value is None:
            return default
        number = None
        if isinstance(value, int | float) and not isinstance(value, bool):
            number = float(value)
        elif isinstance(value, str):
            try:
                number = float(value)
            except ValueError:
                pass
        if number is None or not math.isfinite(number):
            raise self.bad(name, f"expected a number, got {_shown(value)}")
        if number < low:
            raise self.bad(name, f"must be at least {low:g}, got {_shown(value)}")
        return number

    def integer(self, name: str, required: bool = True, default: int | None = None) -> int | None:
        number = self.number(name, required, None)
        if number is None:
            return default
        if number != int(number):
            raise self.bad(name, f"expected a whole number, got {_shown(self.values[name])}")
        return int(number)

    def numbers(self, name: str, high: float = math.inf, until_null: bool = False) -> tuple[float, ...]:
        """A list of numbers (absent: empty), each finite, at least 0 and at most `high`; with
        `until_null`, the numbers before the first null (a value the tool did not have)."""
        value = self._get(name, False)
        if value is None:
            return ()
        if not isinstance(value, list):
            raise self.bad(name, f"expected a list of numbers, got {_shown(value)}")
        if until_null and None in value:
            value = value[: value.index(None)]
        out = []
        for i, item in enumerate(value):
            if isinstance(item, bool) or not isinstance(item, int | float) or not math.isfinite(item):
                raise self.bad(f"{name}[{i}]", f"expected a number, got {_shown(item)}")
            if not 0 <= item <= high:
                raise self.bad(f"{name}[{i}]", f"must be in [0, {high:g}], got {_shown(item)}")
            out.append(float(item))
        return tuple(out)

    def nested(self, name: str, required: bool = True) -> Fields:
        """The object in field `name` (absent and not required: an empty one)."""
        value = self._get(name, required)
        if value is None:
            value = {}
        if not isinstance(value, dict):
            raise self.bad(name, f"expected an object, got {_shown(value)}")
        return Fields(value, self.source, self.line, self._line_of, f"{self._prefix}{name}.")
