from __future__ import annotations

import os
from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory):
    """The project's tiny target and draft, built once per test session (or reused from
    SPECFLEET_TINY_DIR, which the setup script fills)."""
    from specfleet.tinymodels import make_tiny

    root = os.environ.get("SPECFLEET_TINY_DIR")
    directory = Path(root) if root else tmp_path_factory.mktemp("tiny")
    return make_tiny(directory)
