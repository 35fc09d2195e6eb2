"""What the tests (and bench/) share, in one place; a test module imports from here or from
tests/conftest.py's fixtures, never from another test module (issue 29).

fleet        an in-process coordinator, enrolled agents, run records and stored-run tables
synthetic    a large synthetic fleet written straight into a store (bench/ and the query tests)
processes    the `specfleet` CLI as real processes (a coordinator, an agent), waiting, stopping
agents       an agent daemon on a thread against an in-process coordinator
dashboard    a seeded fleet of several chips, its records and rows, and readers of a page
browser      headless system Chromium driven by Playwright, and what a page must show
claims, sweeps, versions, fake_engine, admin_cli   what several test modules of one subject share
clocks       a fake clock; ports: a free loopback port; captured: where captured output lies

conftest's fixtures each have one name and one shape: `tiny_models`, `coordinator` (an
in-process coordinator), `coord` (a coordinator process: address, data directory), `fleet` (a
module's seeded coordinator: coordinator, admin token, truth; what `page` opens pages on)."""
