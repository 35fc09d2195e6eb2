"""Where the tests' captured output and importer fixtures lie (tests/captured/README.md says
where each file came from)."""

from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
CAPTURED = TESTS / "captured"
MTPLX_RUN = TESTS / "importer_fixtures" / "mtplx-bench-run"
