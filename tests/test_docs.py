"""The newcomer's map stays true: every repository path that README.md or a page of docs/ names
(a backquoted or bare path under one of the repository's top-level folders, such as
`specfleet/settings.py` or docs/speedup.md, and every relative link) exists. Reads files only."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = sorted([ROOT / "README.md", *(ROOT / "docs").rglob("*.md")])
# Where a named path starts: the repository's tracked top-level folders.
TOP = ("agent", "bench", "cli", "coordinator", "dashboard", "deploy", "docs", "protos", "scripts", "specfleet",
       "tests", ".ci", ".github")  # fmt: skip
# A path under one of them, not inside another path (`~/.cache/specfleet`, `/models/x`, `a.specfleet/x`).
NAMED = re.compile(r"(?<![\w./~$-])((?:" + "|".join(re.escape(t) for t in TOP) + r")/[\w./*-]*)")
LINK = re.compile(r"\]\(([^)\s]+)\)")


def named_paths(text: str) -> set[str]:
    """The repository paths a page names: `dir/file` and `dir/` words (trailing punctuation and a
    `:line` or `::name` suffix dropped)."""
    found = set()
    for match in NAMED.finditer(text):
        path = match.group(1).rstrip(".,;:)")
        if "*" in path:  # a glob (`tests/test_*.py`): its folder must exist
            path = path[: path.index("*")].rsplit("/", 1)[0] + "/"
        found.add(path)
    return found


def linked_paths(page: Path, text: str) -> set[str]:
    """The files a page's relative links point to, as paths from the repository root."""
    found = set()
    for target in LINK.findall(text):
        if re.match(r"[a-z]+:", target) or target.startswith("#"):
            continue
        found.add((page.parent / target.split("#")[0]).resolve().relative_to(ROOT).as_posix())
    return found


def missing(page: Path) -> list[str]:
    text = page.read_text()
    paths = named_paths(text) | linked_paths(page, text)
    return sorted(p for p in paths if not (ROOT / p).exists())


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_path_a_page_names_exists(page):
    assert missing(page) == [], f"{page.relative_to(ROOT)} names paths that do not exist"


def test_the_check_finds_a_path_that_does_not_exist(tmp_path):
    page = ROOT / "docs" / "example.md"  # never written: only its folder is used to resolve links
    text = "See `specfleet/settings.py`, specfleet/nowhere.py: and [a page](speedup.md), [gone](gone.md)."
    assert named_paths(text) == {"specfleet/settings.py", "specfleet/nowhere.py"}
    assert linked_paths(page, text) == {"docs/speedup.md", "docs/gone.md"}
    assert named_paths("`~/.cache/specfleet` and /models/specfleet/x and `tests/test_*.py`") == {"tests/"}


def test_the_readme_is_a_map_not_a_manual():
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= 160, f"README.md has {len(lines)} lines: move detail to docs/ (issue 38 asks for ~150)"
    for page in ("docs/architecture.md", "docs/development.md", "docs/sweeps.md"):
        assert (ROOT / page).exists(), page
