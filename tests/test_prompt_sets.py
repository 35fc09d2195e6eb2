"""The benchmark prompt sets and long-context documents in specfleet/prompt_sets/.

Speculative decoding with n-gram or prompt-lookup drafting speeds up text that repeats itself,
so prompts padded by repetition inflate acceptance. These tests hold the data to its promise:
every prompt and document is distinct text, checked with the tiny models' tokenizer for spans
of SPAN tokens that occur twice (in one text, or in two texts of one set).
"""

from __future__ import annotations

import os
import re
from functools import cache
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
SETS_DIR = ROOT / "specfleet" / "prompt_sets"
CATEGORIES = ("conversation", "translation", "summarisation", "qa", "math", "rag", "code")
MIN_CHARS = {
    "conversation": 300,
    "translation": 300,
    "qa": 300,
    "math": 400,
    "code": 600,
    "summarisation": 1400,
    "rag": 1400,
}
MIN_PROMPTS = 20
MIN_DOCUMENT_CHARS = 220_000
SPAN = 16
# The template every prompt of a set carries by design: instruction and answer-cue lines, and the
# labels that open a line ("Document 2: ", "Question: "). The cross-prompt span check removes them
# first, as it is about each prompt's own text; the check of a prompt against itself does not.
FRAME = {
    "conversation": (r"^User: ", r"^Assistant: ?"),
    "translation": (r"^Translate the following English text into [A-Z][a-z]+:$", r"^Translation:$"),
    "summarisation": (r"^Summarise the following text in three sentences\.$", r"^Summary:$"),
    "qa": (r"^Question: ", r"^Answer:$"),
    "math": (r"^Question: ", r"^Answer: Let's think step by step\.$"),
    "rag": (
        r"^Answer the question using only the documents below\.$",
        r"^Document \d+: ",
        r"^Question: ",
        r"^Answer:$",
    ),
    "code": (),
}


def spans(tokens: list[int], n: int = SPAN) -> list[tuple[int, ...]]:
    return [tuple(tokens[i : i + n]) for i in range(len(tokens) - n + 1)]


def repeated_spans(tokens: list[int], n: int = SPAN) -> set[tuple[int, ...]]:
    """Spans of n tokens that occur more than once in tokens."""
    seen: set[tuple[int, ...]] = set()
    repeated: set[tuple[int, ...]] = set()
    for span in spans(tokens, n):
        (repeated if span in seen else seen).add(span)
    return repeated


def shared_spans(texts: dict[str, list[int]], n: int = SPAN) -> dict[tuple[int, ...], list[str]]:
    """Spans of n tokens found in more than one of the named token lists, with the names."""
    owners: dict[tuple[int, ...], list[str]] = {}
    for name, tokens in texts.items():
        for span in set(spans(tokens, n)):
            owners.setdefault(span, []).append(name)
    return {span: names for span, names in owners.items() if len(names) > 1}


def strip_frame(category: str, text: str) -> str:
    for pattern in FRAME[category]:
        text = re.sub(pattern, "", text, flags=re.MULTILINE)
    return text


@cache
def load(name: str) -> dict:
    return yaml.safe_load((SETS_DIR / f"{name}.yaml").read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def tokenizer(request):
    """The tiny models' tokenizer, from SPECFLEET_TINY_DIR or .data/tiny (built there if absent)."""
    from tokenizers import Tokenizer

    root = Path(os.environ.get("SPECFLEET_TINY_DIR") or ROOT / ".data" / "tiny")
    found = sorted(root.rglob("tokenizer.json"), key=lambda p: (p.parent.name != "target", str(p)))
    path = found[0] if found else request.getfixturevalue("tiny_models").mlx_target / "tokenizer.json"
    return Tokenizer.from_file(str(path))


@pytest.fixture(scope="module")
def encode(tokenizer):
    return lambda text: tokenizer.encode(text, add_special_tokens=False).ids


@pytest.fixture(scope="module")
def decode(tokenizer):
    return lambda ids: tokenizer.decode(list(ids))


def describe(found: dict[tuple[int, ...], list[str]], decode) -> str:
    lines = [f"{names}: {decode(span)!r}" for span, names in list(found.items())[:10]]
    return f"{len(found)} spans, e.g.\n" + "\n".join(lines)


def test_span_helpers_catch_repetition(encode):
    text = (
        "Speculative decoding lets a small draft model propose a few tokens, and the large target model"
        " checks all of them in a single forward pass, keeping the longest prefix it agrees with."
    )
    tokens = encode(text)
    assert len(tokens) > 2 * SPAN
    assert repeated_spans(tokens) == set()
    assert repeated_spans(encode(text + " " + text))  # a doubled text must fail
    assert repeated_spans([1, 2, 3, 1, 2, 3], n=3) == {(1, 2, 3)}
    other = encode("A completely different sentence about gardens, rain and the smell of cut grass in May.")
    assert shared_spans({"a": tokens, "b": other}) == {}
    assert shared_spans({"a": tokens, "b": other + tokens[:SPAN]}) == {tuple(tokens[:SPAN]): ["a", "b"]}
    assert strip_frame("math", "Question: Q?\nAnswer: Let's think step by step.") == "Q?\n"
    assert strip_frame("rag", "Document 1: A.\n\nDocument 2: B.\n\nQuestion: C?\nAnswer:") == "A.\n\nB.\n\nC?\n"


def test_all_categories_present():
    assert set(FRAME) == set(CATEGORIES)
    found = sorted(p.stem for p in SETS_DIR.glob("*.yaml") if p.stem != "documents")
    assert found == sorted(CATEGORIES)
    assert (SETS_DIR / "__init__.py").is_file()


@pytest.mark.parametrize("name", CATEGORIES)
def test_prompt_set_shape(name):
    doc = load(name)
    assert set(doc) == {"category", "description", "source", "license", "min_chars", "prompts"}
    assert doc["category"] == name
    for key in ("description", "source", "license"):
        assert isinstance(doc[key], str) and doc[key].strip()
    assert doc["min_chars"] == MIN_CHARS[name]
    prompts = doc["prompts"]
    assert len(prompts) >= MIN_PROMPTS
    ids = [p["id"] for p in prompts]
    assert len(set(ids)) == len(ids)
    assert ids == [f"{name}-{i:02d}" for i in range(1, len(ids) + 1)]
    for p in prompts:
        assert set(p) == {"id", "text"}
        assert isinstance(p["text"], str)
        assert len(p["text"]) >= doc["min_chars"], (p["id"], len(p["text"]))
        assert p["text"] == p["text"].strip(), p["id"]
    assert len({p["text"] for p in prompts}) == len(prompts)


@pytest.mark.parametrize("name", CATEGORIES)
def test_prompt_set_format(name):
    for p in load(name)["prompts"]:
        text = p["text"]
        if name == "conversation":
            assert text.startswith("User: ") and text.endswith("\nAssistant:"), p["id"]
            assert 2 <= text.count("User: ") <= 4, p["id"]
        elif name == "translation":
            assert re.match(r"Translate the following English text into [A-Z][a-z]+:\n", text), p["id"]
            assert text.endswith("\nTranslation:"), p["id"]
        elif name == "summarisation":
            assert text.startswith("Summarise the following text in three sentences.\n\n"), p["id"]
            assert text.endswith("\n\nSummary:"), p["id"]
        elif name == "qa":
            assert text.startswith("Question: ") and text.endswith("\nAnswer:"), p["id"]
        elif name == "math":
            assert text.endswith("\nAnswer: Let's think step by step."), p["id"]
        elif name == "rag":
            assert text.startswith("Answer the question using only the documents below.\n\nDocument 1: "), p["id"]
            assert "\n\nDocument 2: " in text, p["id"]
            assert re.search(r"\n\nQuestion: [^\n]+\nAnswer:$", text), p["id"]


@pytest.mark.parametrize("name", CATEGORIES)
def test_prompts_do_not_repeat_spans(name, encode, decode):
    prompts = load(name)["prompts"]
    for p in prompts:
        repeated = repeated_spans(encode(p["text"]))
        assert not repeated, f"{p['id']} repeats itself: " + describe({s: [p["id"]] for s in repeated}, decode)
    shared = shared_spans({p["id"]: encode(strip_frame(name, p["text"])) for p in prompts})
    assert not shared, f"prompts of {name} share text: " + describe(shared, decode)


def test_documents(encode, decode):
    doc = load("documents")
    assert set(doc) == {"description", "source", "license", "documents"}
    documents = doc["documents"]
    assert 40 <= len(documents) <= 90
    ids = [d["id"] for d in documents]
    assert ids == [f"doc-{i:02d}" for i in range(1, len(ids) + 1)]
    for d in documents:
        assert set(d) == {"id", "title", "text"}
        assert d["title"].strip()
        assert 2000 <= len(d["text"]) <= 8192, (d["id"], len(d["text"]))
    assert sum(len(d["text"]) for d in documents) >= MIN_DOCUMENT_CHARS
    tokens = {d["id"]: encode(d["text"]) for d in documents}
    for name, ids_ in tokens.items():
        repeated = repeated_spans(ids_)
        assert not repeated, f"{name} repeats itself: " + describe({s: [name] for s in repeated}, decode)
    shared = shared_spans(tokens)
    assert not shared, "documents share text: " + describe(shared, decode)


@pytest.mark.parametrize("depth", [0, 512, 4096, 16384, 32768])
def test_built_prompts_repeat_nothing_their_sources_do_not_at_every_context_depth(depth, tokenizer):
    """What a run prefills: the context documents the coordinator sends for this depth, built to
    exactly `depth` tokens by the agent, then each shipped prompt. A span of SPAN tokens may
    occur twice only where one source text (a document, or the prompt) holds it twice itself;
    padding by repetition, or one document twice, would fail here."""
    from agent.prompts import build, context
    from specfleet import prompt_library

    def tokenize(text: str) -> tuple[int, ...]:
        return tuple(tokenizer.encode(text).ids)

    docs = prompt_library.context_documents(depth)
    allowed = set().union(*(repeated_spans(list(tokenize(d))) for d in docs)) if docs else set()
    prefix = context(tokenize, docs, depth)
    assert len(prefix) == depth
    context_spans = set(spans(list(prefix)))
    assert repeated_spans(list(prefix)) <= allowed
    for name, ps in prompt_library.prompt_sets().items():
        for p in ps.prompts:
            tokens = build(tokenize, p.text, prefix)
            assert tokens[:depth] == prefix
            own = repeated_spans(list(tokenize(p.text)))
            # Only the spans that reach into the prompt: the context's own were checked above.
            tail = spans(list(tokens[max(0, depth - SPAN + 1) :]))
            seen, repeated = set(), set()
            for span in tail:
                (repeated if span in seen or span in context_spans else seen).add(span)
            assert repeated <= own | allowed, (name, p.id, depth)
