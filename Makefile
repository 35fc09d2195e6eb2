# The two commands of the README. Both run the set-up first; it is quick once done.
.PHONY: setup demo test protos

setup:
	@scripts/setup.sh

demo: setup
	.venv/bin/specfleet demo $(ARGS)

test: setup
	.venv/bin/ruff check .
	.venv/bin/ruff format --check .
	.venv/bin/lint-imports
	SPECFLEET_TINY_DIR=$(CURDIR)/.data/tiny .venv/bin/python -m pytest $(ARGS)

protos: setup
	.venv/bin/python -m protos.generate
