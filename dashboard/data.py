"""The pages' data: dashboard/queries.py's pure queries behind Streamlit's caches.

One cached mirror per process (queries.open_mirror), synced at most every REFRESH_SECONDS;
each query below is queries' function of the same name, cached on the sequences of the tables
it reads (Version, cached_on), so it reruns exactly when one of them changed; the claims' rows
are cached per claim on the runs each claim could select (queries.claim_key). Everything that
computes a figure lives in dashboard/queries.py, which imports no Streamlit: `specfleet
report` reads the same queries on a mirror of its own.
"""

from __future__ import annotations

import contextlib
import os
import threading
from dataclasses import dataclass
from pathlib import Path

import grpc
import pandas as pd
import streamlit as st

from dashboard import after_sync, group_figures, queries
from dashboard import claims as ledger
from dashboard.mirror import Mirror
from dashboard.queries import (  # noqa: F401  the names the pages and tests know them by
    DOWNLOAD_BATCH,
    FILTER_COLUMNS,
    FILTER_FIELDS,
    FLAG_NAMES,
    FLAGS,
    LABELS,
    NOMINAL,
    RUN_SYSTEMS,
    RUNS_SHOWN,
    UNIT_FIGURE,
    Filters,
    group_label,
    ledger_path,
    model_label,
    sampler_label,
    selected,
)
from specfleet.data_dir import ADMIN_TOKEN_FILE, Address, admin_credential, coordinator_address, default_data_dir

REFRESH_SECONDS = 5


class CoordinatorUnavailable(Exception):
    """The coordinator cannot be read: its one-line explanation, shown by dashboard/app.py."""


@dataclass(frozen=True)
class Coordinator:
    """Where the dashboard reads from, resolved again at every rerun (a coordinator started after
    the dashboard writes coordinator.json and admin.token later): SPECFLEET_COORDINATOR and
    SPECFLEET_ADMIN_TOKEN when `specfleet dashboard` was given them, else SPECFLEET_DATA_DIR's
    files (specfleet/data_dir.py)."""

    where: Address
    token: str
    data_dir: Path

    @property
    def start(self) -> str:
        return f"specfleet coordinator serve --data-dir {self.data_dir}"


def coordinator() -> Coordinator:
    data_dir = Path(os.environ.get("SPECFLEET_DATA_DIR") or default_data_dir())
    where = coordinator_address(os.environ.get("SPECFLEET_COORDINATOR"), data_dir)
    try:
        token = os.environ.get("SPECFLEET_ADMIN_TOKEN") or admin_credential(data_dir) or ""
    except ValueError as e:  # admin.token unreadable
        raise CoordinatorUnavailable(f"{e}: pass --admin-token to specfleet dashboard") from None
    return Coordinator(where, token, data_dir)


def unavailable(c: Coordinator, error: grpc.RpcError) -> CoordinatorUnavailable:
    """The one line a page shows for an error of the coordinator's read path."""
    code = error.code() if callable(getattr(error, "code", None)) else None
    at = f"{c.where.address} (from {c.where.source})"
    refused = code in (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED)
    if refused and not c.token:
        return CoordinatorUnavailable(
            f"The coordinator at {at} wants an admin credential: no --admin-token or SPECFLEET_ADMIN_TOKEN was"
            f" given and there is no {ADMIN_TOKEN_FILE} in {c.data_dir} (a coordinator writes it at its first"
            f" start: `{c.start}`). Trying again."
        )
    if refused:
        return CoordinatorUnavailable(
            f"The coordinator at {at} refused the admin credential ({error.details()}): pass the one in its data"
            f" directory's {ADMIN_TOKEN_FILE} with --admin-token, or --data-dir. Trying again."
        )
    if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
        return CoordinatorUnavailable(
            f"No coordinator answers at {at}: start one with `{c.start}`, or point --coordinator at a running one."
            " Trying again."
        )
    name = code.name if code else type(error).__name__
    return CoordinatorUnavailable(f"The coordinator at {at} failed a read ({name}: {error.details()}). Trying again.")


@st.cache_resource
def mirror(address: str, token: str) -> Mirror:
    """The process's mirror of the coordinator, which after every sync computes the Compare
    page's costly figures of the groups it keeps that the sync changed (dashboard/group_figures.py)
    and every claim's selection (selections), before the first sync returns and on a worker
    after later ones (dashboard/after_sync.py)."""
    m, state = queries.open_mirror(address, token), _selection_state(address, token)
    group_figures.attach(m)
    after_sync.attach(m, lambda seqs: group_figures.refresh(m), lambda seqs: _count_selections(m, state))
    return m


@st.cache_data(ttl=REFRESH_SECONDS)
def synced(address: str, token: str) -> dict[str, int]:
    """Sync at most every REFRESH_SECONDS: each table's highest mirrored sequence."""
    return mirror(address, token).sync()


@dataclass(frozen=True)
class Version:
    """What the queries below take as their first argument: the coordinator and each mirrored
    table's sequence. A query's cache is keyed on the tables it reads (cached_on), so it reruns
    exactly when one of them changed: an agent's heartbeat reruns no figure of runs."""

    address: str
    token: str
    agents: int = 0
    sweeps: int = 0
    jobs: int = 0
    runs: int = 0
    imported_results: int = 0


def version() -> Version:
    """The mirror synced (at most every REFRESH_SECONDS) and its tables' sequences; a coordinator
    that cannot be read is CoordinatorUnavailable."""
    c = coordinator()
    try:
        return Version(c.where.address, c.token, **synced(c.where.address, c.token))
    except grpc.RpcError as e:
        raise unavailable(c, e) from None


CACHE_ENTRIES = 64  # per query function: versions and filters a dashboard goes through


def cached_on(*tables: str):
    """st.cache_data keyed on the coordinator and the named tables' sequences of the Version
    argument (and the other arguments as usual); no time limit, a bounded number of entries."""
    key = lambda v: (v.address, v.token, *(getattr(v, t) for t in tables))  # noqa: E731
    return st.cache_data(hash_funcs={Version: key}, max_entries=CACHE_ENTRIES)


on_runs = cached_on("runs", "jobs")  # a run counts only on its job's current attempt
on_fleet = cached_on("agents", "sweeps", "jobs", "runs")


def _db(v: Version) -> Mirror:
    return mirror(v.address, v.token)


# ---------------------------------------------------------------- fleet and sweeps


@on_fleet
def agents(v: Version) -> pd.DataFrame:
    return queries.agents(_db(v))


@on_fleet
def chips(v: Version) -> list[str]:
    """Every chip the fleet has seen, sorted: the domain of the one chip->colour mapping."""
    return queries.chips(_db(v))


@on_fleet
def sweeps(v: Version) -> pd.DataFrame:
    """Progress per sweep (queries.sweeps)."""
    return queries.sweeps(_db(v))


@on_fleet
def failures(v: Version) -> pd.DataFrame:
    """Jobs that failed or that their agent refused, with the state and the reason."""
    return queries.failures(_db(v))


# ---------------------------------------------------------------- runs


@on_runs
def run_count(v: Version) -> int:
    return queries.run_count(_db(v))


@on_runs
def filter_options(v: Version) -> dict[str, list[str]]:
    return queries.filter_options(_db(v))


@on_runs
def runs_table(
    v: Version, f: Filters, chips: tuple[str, ...] = (), states: tuple[str, ...] = (), limit: int = RUNS_SHOWN
) -> pd.DataFrame:
    return queries.runs_table(_db(v), f, chips, states, limit)


@on_runs
def runs_summary(v: Version, f: Filters, chips: tuple[str, ...] = (), states: tuple[str, ...] = ()) -> dict:
    return queries.runs_summary(_db(v), f, chips, states)


def runs_download(v: Version, f: Filters, chips: tuple[str, ...], states: tuple[str, ...], fmt: str) -> bytes:
    return queries.runs_download(_db(v), f, chips, states, fmt)


@on_runs
def nominal_counts(v: Version, f: Filters) -> dict[str, int]:
    return queries.nominal_counts(_db(v), f)


@on_runs
def collapsed_acceptance(v: Version, f: Filters) -> pd.DataFrame:
    return queries.collapsed_acceptance(_db(v), f)


def lossy_runs(v: Version, f: Filters) -> pd.DataFrame:
    return queries.lossy_runs(_db(v), f)


@on_runs
def timings_disagree(v: Version, f: Filters) -> pd.DataFrame:
    return queries.timings_disagree(_db(v), f)


@on_runs
def warm_drafters(v: Version, f: Filters) -> pd.DataFrame:
    return queries.warm_drafters(_db(v), f)


@on_runs
def server_figures(v: Version, f: Filters) -> pd.DataFrame:
    return queries.server_figures(_db(v), f)


# ---------------------------------------------------------------- comparable groups and comparisons


@on_runs
def groups(v: Version, f: Filters) -> pd.DataFrame:
    return queries.groups(_db(v), f)


def _of_group(v: Version, f: Filters, name: str) -> pd.DataFrame | None:
    """Figure `name` of the whole comparable group `f` selects (no other filter) as group_figures
    keeps it: stored when the group's runs and jobs have not changed since, else computed now and
    stored; None for narrower filters (the caller computes them)."""
    if not f.comparable or f != Filters(comparable=f.comparable):
        return None
    return group_figures.read(_db(v), f.comparable, name)


@on_runs
def speedups(v: Version, f: Filters) -> pd.DataFrame:
    kept = _of_group(v, f, "speedups")
    return queries.speedups(_db(v), f, groups(v, f)) if kept is None else kept


@on_runs
def decode_speed(v: Version, f: Filters) -> pd.DataFrame:
    kept = _of_group(v, f, "decode_speed")
    return queries.decode_speed(_db(v), f) if kept is None else kept


@on_runs
def energy(v: Version, f: Filters) -> pd.DataFrame:
    return queries.energy(_db(v), f)


@on_runs
def acceptance_by_position(v: Version, f: Filters) -> pd.DataFrame:
    return queries.acceptance_by_position(_db(v), f)


@on_runs
def draft_verify(v: Version, f: Filters) -> pd.DataFrame:
    return queries.draft_verify(_db(v), f)


@on_runs
def verify_cost(v: Version, f: Filters) -> pd.DataFrame:
    return queries.verify_cost(_db(v), f)


@on_runs
def roofline(v: Version, f: Filters) -> pd.DataFrame:
    return queries.roofline(_db(v), f)


@on_runs
def version_changes(v: Version, f: Filters, tolerance: float = queries.versions.TOLERANCE) -> pd.DataFrame:
    return queries.version_changes(_db(v), f, tolerance)


@on_runs
def version_settings(v: Version, f: Filters) -> pd.DataFrame:
    return queries.version_settings(queries.version_per_prompt(_db(v), f, several=True))


@on_runs
def unit_values(v: Version, f: Filters) -> pd.DataFrame:
    return queries.unit_values(_db(v), f)


@on_runs
def chip_components(v: Version, f: Filters) -> pd.DataFrame:
    kept = _of_group(v, f, "chip_components")
    return queries.chip_components(_db(v), f, unit_values(v, f)) if kept is None else kept


@on_runs
def chip_levels(v: Version, f: Filters) -> pd.DataFrame:
    kept = _of_group(v, f, "chip_levels")
    return queries.chip_levels(_db(v), f, unit_values(v, f)) if kept is None else kept


@on_runs
def chip_pairs(v: Version, f: Filters) -> pd.DataFrame:
    kept = _of_group(v, f, "chip_pairs")
    return queries.chip_pairs(_db(v), f, unit_values(v, f), chip_components(v, f)) if kept is None else kept


# ---------------------------------------------------------------- claims


@st.cache_data(max_entries=CACHE_ENTRIES)
def _claims(path: str, mtime: float) -> list[ledger.Claim]:
    return queries.load_claims(path)


def claims() -> list[ledger.Claim]:
    """The checked ledger, reread when the file changes; raises ClaimError naming faulty fields."""
    path = ledger_path()
    return _claims(path, os.path.getmtime(path))


def verdicts(v: Version) -> pd.DataFrame:
    """queries.verdicts, each claim's rows recomputed only when the ledger changed or runs it
    could select (of its engine, system and models, and of our loop beside it) or their jobs did."""
    path = ledger_path()
    mtime = os.path.getmtime(path)
    systems = _systems(v)
    keys = tuple(_key_with_fleet(c, systems, v) for c in _claims(path, mtime))
    return _adjusted(v.address, v.token, path, mtime, keys)


@st.cache_data(max_entries=CACHE_ENTRIES)
def _adjusted(address: str, token: str, path: str, mtime: float, keys: tuple) -> pd.DataFrame:
    """Every claim's rows (each cached on its key), then the false-discovery step over them."""
    frames = [_claim_rows(address, token, c.id, path, mtime, k) for c, k in zip(_claims(path, mtime), keys)]
    return queries.adjusted(frames)


def claim_sweeps() -> dict[str, tuple[str, list[str]]]:
    """Per claim id, the sweep file that would test it and what the coordinator's sweep
    parser refuses in it ([] when it would take it); reread when the ledger changes."""
    path = ledger_path()
    return _claim_sweeps(path, os.path.getmtime(path))


@st.cache_data(max_entries=CACHE_ENTRIES)
def _claim_sweeps(path: str, mtime: float) -> dict[str, tuple[str, list[str]]]:
    return queries.claim_sweeps(_claims(path, mtime))


@on_runs
def _systems(v: Version) -> pd.DataFrame:
    return queries.systems(_db(v))


_claim_key = queries.claim_key


def _key_with_fleet(claim: ledger.Claim, systems: pd.DataFrame, v: Version) -> tuple:
    """_claim_key, and for a claim with no run of its own system yet the runs' sequence too:
    its row says what the fleet's runs left out, which every new run changes. (A claim with
    runs of its system but none inside its conditions counts the others as of its last change.)"""
    key = _claim_key(claim, systems)
    return key if key[0] != (0, 0) else (*key, v.runs)


@st.cache_data(max_entries=4 * CACHE_ENTRIES)
def _claim_rows(address: str, token: str, claim_id: str, path: str, mtime: float, key: tuple) -> pd.DataFrame:
    (claim,) = [c for c in _claims(path, mtime) if c.id == claim_id]
    return queries.claim_rows(mirror(address, token), claim)


@st.cache_resource
def _selection_state(address: str, token: str) -> dict:
    """The claims' selections kept between counts: under "ledger" (its mtime, the claims read from
    it), under "counted" per claim id (ledger mtime, the runs' sequence counted up to, selection)."""
    return {"lock": threading.Lock(), "ledger": (None, []), "counted": {}}


def selections(v: Version) -> dict[str, dict]:
    """Per claim id, the runs its conditions select and what each condition left out, as of the
    mirror's runs (counted after each sync: mirror; else here)."""
    return _count_selections(_db(v), _selection_state(v.address, v.token))


def _count_selections(db: Mirror, state: dict) -> dict[str, dict]:
    """selections of the mirror's runs now, kept in `state` (_selection_state). Runs never change
    once stored: each claim's counts are carried forward and only the runs stored since are
    counted, for every claim in one scan (queries.selections_of, merge_selections)."""
    path = ledger_path()
    mtime = os.path.getmtime(path)
    with state["lock"], contextlib.closing(db.cursor()) as con:
        if state["ledger"][0] != mtime:  # read here, not through _claims: no Streamlit on the worker
            state["ledger"] = (mtime, queries.load_claims(path))
        claims, counts = state["ledger"][1], state["counted"]
        (runs,) = con.execute("SELECT coalesce(max(last_seq), 0) FROM _mirror WHERE tbl = 'runs'").fetchone()
        due: dict[int, list[ledger.Claim]] = {}  # per runs' sequence counted up to: the claims to count on
        for c in claims:
            seen, upto, sel = counts.get(c.id, (None, 0, None))
            if seen != mtime or sel is None:
                upto = 0
            if seen != mtime or sel is None or upto < runs:
                due.setdefault(upto, []).append(c)
        for upto, some in due.items():  # one scan for all claims counted up to the same run
            counted = queries.selections_of(some, con, (upto, runs), cells=True)
            for c in some:
                seen, _, sel = counts.get(c.id, (None, 0, None))
                new = counted[c.id]
                old = sel if seen == mtime and upto else None
                counts[c.id] = (mtime, runs, new if old is None else ledger.merge_selections(old, new))
        return {c.id: counts[c.id][2] for c in claims}
