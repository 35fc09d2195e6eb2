"""What the tests (and bench/) share, in one place; a test module imports from here and uses
the fixtures of `fixtures`, never another test module or tests/conftest.py (issues 29, 38).

fleet        an in-process coordinator, enrolled agents, run records and stored-run tables
synthetic    a large synthetic fleet written straight into a store (bench/ and the query tests)
processes    the `specfleet` CLI as real processes (a coordinator, an agent), waiting, stopping
agents       an agent daemon on a thread against an in-process coordinator
dashboard    a seeded fleet of several chips, its records and rows, and readers of a page
browser      headless system Chromium driven by Playwright, and what a page must show
claims, sweeps, versions, fake_engine, admin_cli   what several test modules of one subject share
clocks       a fake clock; ports: a free loopback port; captured: where captured output lies
poison_worker, record_schema_seam, fake_server   programs the tests run in place of ours
fixtures     the shared fixtures (tests/conftest.py loads it), each one name and one shape:
             `tiny_models`, `coordinator` (an in-process coordinator), `coord` (a coordinator
             process: address, data directory), `fleet` (a coordinator seeded by the module's
             `seed_fleet`: coordinator, admin token, truth; what `page` opens pages on),
             `fleet_db` (the module's `fleet_rows()` stored in a mirror stand-in), `llama_bench_output`"""
