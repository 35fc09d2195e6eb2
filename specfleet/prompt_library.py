"""The prompt sets and context documents shipped in specfleet/prompt_sets/, and their digests.

One YAML file per set (its category, source, licence and prompts) and documents.yaml (distinct
prose from which long contexts are built; see agent/prompts.py). A cell's prompt-set digest is
the SHA-256 of exactly the texts its runs read: the prompts it measures and, when it has a
context depth, the documents it sends. Runs with equal digests read the same text.
"""

from __future__ import annotations

import functools
import hashlib
import json
from dataclasses import dataclass
from importlib import resources

import yaml

from specfleet.record import Prompt

DOCUMENTS_FILE = "documents.yaml"
# Characters of documents sent per context token: a tokenizer rarely packs fewer than one
# character into a token, so eight is ample for any tokenizer without sending every document.
CHARS_PER_CONTEXT_TOKEN = 8


@dataclass(frozen=True)
class PromptSet:
    name: str
    category: str
    source: str
    license: str
    prompts: tuple[Prompt, ...]


def _files():
    return resources.files("specfleet.prompt_sets")


@functools.cache
def prompt_sets() -> dict[str, PromptSet]:
    """Every shipped set by name (the file's stem)."""
    sets = {}
    for entry in sorted(_files().iterdir(), key=lambda e: e.name):
        if not entry.name.endswith(".yaml") or entry.name == DOCUMENTS_FILE:
            continue
        doc = yaml.safe_load(entry.read_text())
        name = entry.name.removesuffix(".yaml")
        sets[name] = PromptSet(
            name=name,
            category=doc["category"],
            source=doc["source"],
            license=doc["license"],
            prompts=tuple(Prompt(p["id"], p["text"]) for p in doc["prompts"]),
        )
    return sets


@functools.cache
def documents() -> tuple[str, ...]:
    """The context documents' texts, in order."""
    doc = yaml.safe_load(_files().joinpath(DOCUMENTS_FILE).read_text())
    return tuple(d["text"] for d in doc["documents"])


def context_documents(context_tokens: int) -> tuple[str, ...]:
    """The documents a cell of this context depth sends: none at depth 0, else the first ones
    until they hold CHARS_PER_CONTEXT_TOKEN characters per token (all, if they hold fewer)."""
    if context_tokens <= 0:
        return ()
    chosen, chars = [], 0
    for text in documents():
        chosen.append(text)
        chars += len(text)
        if chars >= context_tokens * CHARS_PER_CONTEXT_TOKEN:
            break
    return tuple(chosen)


def digest(prompts: tuple[Prompt, ...], docs: tuple[str, ...]) -> str:
    """SHA-256 of the prompts (ids and texts) and documents a cell reads."""
    payload = json.dumps({"prompts": [[p.id, p.text] for p in prompts], "documents": list(docs)})
    return hashlib.sha256(payload.encode()).hexdigest()
