"""docs/sweeps.md is the declaration's page: generated from it, and current."""

from __future__ import annotations

from specfleet import settings as declared
from specfleet import sweep_reference
from specfleet.record import FIELD_VERSIONS


def test_the_sweep_reference_is_current():
    """A row added to specfleet/settings.py without `python -m specfleet.sweep_reference` fails here."""
    assert sweep_reference.PAGE.read_text() == sweep_reference.render(), (
        "docs/sweeps.md is stale: run .venv/bin/python -m specfleet.sweep_reference"
    )


def test_the_page_names_every_key_its_bounds_default_and_schema():
    page = sweep_reference.render()
    for s in (s for s in declared.DECLARED if s.sweep):
        line = next(line for line in page.splitlines() if line.startswith(f"| `{s.sweep}` |") and s.doc in line)
        cells = [c.strip() for c in line.split(" | ")]
        if s.lo is not None:
            assert cells[2].startswith(f"{s.lo:g}" if isinstance(s.lo, float) else str(s.lo)), line
        assert cells[3] == ("unset" if s.default is None else f"`{s.default!r}`" if s.type is str else f"`{s.default}`")
        assert cells[5].rstrip(" |") == (str(s.since) if s.recorded else "not recorded"), line
    for path in FIELD_VERSIONS:
        assert f"`{path}`" in page, path
