"""A YAML loader with limits, for files that come from other people (sweep files).

`load` first reads the file's event stream (libyaml, in C) and refuses, naming the line:
nesting deeper than MAX_DEPTH, more than MAX_NODES values once every alias is expanded (an
"alias bomb" of a few hundred bytes otherwise expands to billions), and a key given twice in
one mapping (YAML would keep the later value silently). Only a stream that passes is built
into Python objects, so building and validating it is bounded in time and memory by the
limits, not by the file.

`load_located` also returns where each value starts (`Located.line("arms[2].depth")`), so that a
problem found in the built objects can name its line.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import yaml

MAX_DEPTH = 32  # nested sequences and mappings
MAX_NODES = 5_000  # scalars, sequences and mappings, each alias counted as what it expands to
_RESOLVER = yaml.resolver.Resolver()


class YamlLimitError(ValueError):
    """The text is not YAML, or passes a limit; the message names the line."""


@dataclass
class _Collection:
    """A sequence or mapping being read: where its node count started and, for a mapping,
    the keys seen so far and whether the next node is a key."""

    anchor: str | None
    first_node: int
    mapping: bool
    keys: set = field(default_factory=set)
    next_is_key: bool = True


def _line(event) -> int:
    return event.start_mark.line + 1


def _key(event) -> tuple | None:
    """A scalar key as YAML resolves it (1 and '1' differ); None for any other key."""
    if not isinstance(event, yaml.ScalarEvent):
        return None
    tag = event.tag or _RESOLVER.resolve(yaml.ScalarNode, event.value, event.implicit)
    return tag, event.value


def check(text: str) -> None:
    """Raise YamlLimitError unless the text is YAML within the limits above."""
    stack: list[_Collection] = []
    sizes: dict[str, int] = {}  # anchor -> nodes it expands to
    nodes = 0
    try:
        for event in yaml.parse(text, Loader=yaml.CSafeLoader):
            if isinstance(event, (yaml.ScalarEvent, yaml.AliasEvent, yaml.CollectionStartEvent)):
                parent = stack[-1] if stack else None
                if parent is not None and parent.mapping:
                    key = _key(event) if parent.next_is_key else None
                    if key is not None and key in parent.keys:
                        raise YamlLimitError(f"line {_line(event)}: key {event.value[:100]!r} is given twice")
                    if key is not None:
                        parent.keys.add(key)
                    parent.next_is_key = not parent.next_is_key
            if isinstance(event, yaml.AliasEvent):
                if event.anchor not in sizes:  # an anchor still open, or none: a loop, or an error
                    raise YamlLimitError(f"line {_line(event)}: alias *{event.anchor[:100]} refers to no complete node")
                nodes += sizes[event.anchor]
            elif isinstance(event, yaml.ScalarEvent):
                nodes += 1
                if event.anchor:
                    sizes[event.anchor] = 1
            elif isinstance(event, yaml.CollectionStartEvent):
                nodes += 1
                stack.append(_Collection(event.anchor, nodes, isinstance(event, yaml.MappingStartEvent)))
                if len(stack) > MAX_DEPTH:
                    raise YamlLimitError(f"line {_line(event)}: nested deeper than {MAX_DEPTH} levels")
            elif isinstance(event, yaml.CollectionEndEvent):
                done = stack.pop()
                if done.anchor:
                    sizes[done.anchor] = nodes - done.first_node + 1
            if nodes > MAX_NODES:
                raise YamlLimitError(f"line {_line(event)}: more than {MAX_NODES} values with every alias expanded")
    except yaml.YAMLError as e:
        raise YamlLimitError(f"not valid YAML ({' '.join(str(e).split())[:300]})") from None


def load(text: str):
    """The text's one document as Python objects, once `check` has passed it."""
    check(text)
    try:
        return yaml.load(text, Loader=yaml.CSafeLoader)
    except yaml.YAMLError as e:
        raise YamlLimitError(f"not valid YAML ({' '.join(str(e).split())[:300]})") from None


class _LineLoader(yaml.CSafeLoader):
    """The safe loader that also notes, for every mapping and sequence it builds, the line each
    of its keys (or items) starts on: `lines[id(container), key or index]`, and the container's
    own first line under `lines[id(container), None]`."""

    def __init__(self, stream):
        super().__init__(stream)
        self.lines: dict[tuple[int, object], int] = {}

    def construct_located_map(self, node):
        data: dict = {}
        self.lines[id(data), None] = node.start_mark.line + 1
        yield data
        data.update(self.construct_mapping(node))
        for key_node, _ in node.value:
            key = self.construct_object(key_node)  # built already: the loader's cache returns it
            if isinstance(key, (str, int, float, bool)) or key is None:
                self.lines[id(data), key] = key_node.start_mark.line + 1

    def construct_located_seq(self, node):
        data: list = []
        self.lines[id(data), None] = node.start_mark.line + 1
        yield data
        data.extend(self.construct_sequence(node))
        for i, item in enumerate(node.value):
            self.lines[id(data), i] = item.start_mark.line + 1


_LineLoader.add_constructor("tag:yaml.org,2002:map", _LineLoader.construct_located_map)
_LineLoader.add_constructor("tag:yaml.org,2002:seq", _LineLoader.construct_located_seq)
_INDEX = re.compile(r"\[(\d+)\]")


@dataclass(frozen=True)
class Located:
    """A loaded document and the lines its values start on."""

    doc: object
    lines: dict[tuple[int, object], int]

    def line(self, where: str) -> int | None:
        """The line of the value a field path names (`models.llama.cpp.target`, `arms[2].depth`):
        of its key or item, or, for a part that is not there, of the nearest enclosing one that is;
        None where the document has no lines (a scalar document)."""
        node, rest = self.doc, where
        line = self.lines.get((id(node), None))
        while rest:
            index = _INDEX.match(rest)
            if index and isinstance(node, list) and int(index[1]) < len(node):
                i = int(index[1])
                line, node, rest = self.lines.get((id(node), i), line), node[i], rest[index.end() :]
                continue
            if not isinstance(node, dict):
                break
            rest = rest.removeprefix(".")
            # The longest key the path starts with ("llama.cpp" before "llama"), followed by a part or the end.
            keys = [
                k for k in node if (t := str(k)) and rest.startswith(t) and rest[len(t) : len(t) + 1] in ("", ".", "[")
            ]
            if not keys:
                break
            key = max(keys, key=lambda k: len(str(k)))
            line, node, rest = self.lines.get((id(node), key), line), node[key], rest[len(str(key)) :]
        return line


def load_located(text: str) -> Located:
    """The text's one document, as `load` reads it, with the line each of its values starts on."""
    check(text)
    loader = _LineLoader(text)
    try:
        return Located(loader.get_single_data(), loader.lines)
    except yaml.YAMLError as e:
        raise YamlLimitError(f"not valid YAML ({' '.join(str(e).split())[:300]})") from None
    finally:
        loader.dispose()
