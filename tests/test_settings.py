"""The settings declaration (specfleet/settings.py): what each row derives, checked row by row so
that a setting added there is parsed, carried, applied and recorded without another edit."""

from __future__ import annotations

import dataclasses
import os
import re

import psutil
import pytest

from agent import worker
from specfleet import settings as declared
from specfleet.record import CHECKED_KEYS, SCHEMA_VERSION, JobSpec, RunRecord, Settings
from specfleet.server_arms import recorded_flags as server_flags
from specfleet.sweeps import SweepError, parse_sweep
from tests.support.fleet import another_value, as_schema, run_record

BASE = """name: s
engines: [llama.cpp, llama-server, mlx]
models: {llama.cpp: {target: t.gguf}, llama-server: {target: t.gguf}, mlx: {target: t}}
prompt_sets: [qa]
"""


def field(setting: declared.Setting, value) -> str:
    """The sweep file lines that set `setting` to `value`."""
    section, _, key = setting.sweep.rpartition(".")
    return f"{section}: {{{key}: {value!r}}}\n" if section else f"{key}: {value!r}\n"


@pytest.mark.parametrize("setting", declared.SWEEP_SETTINGS, ids=lambda s: s.name)
def test_every_sweep_setting_is_parsed_carried_and_recorded(setting):
    other = another_value(setting)
    sweep = parse_sweep(BASE + field(setting, other))
    for cell in sweep.cells():
        expected = other if cell.engine in setting.engines else None
        assert getattr(cell.settings, setting.name) == expected, cell.engine
        assert JobSpec.from_json(cell.to_json()).settings == cell.settings
    record = run_record("job-1", settings=Settings(**{setting.name: other}))
    assert RunRecord.from_json(record.to_json()) == record
    assert record.row()[setting.name] == other  # one store column, named as the setting
    assert (setting.name in CHECKED_KEYS) == setting.checked


@pytest.mark.parametrize("setting", declared.SWEEP_SETTINGS, ids=lambda s: s.name)
def test_every_sweep_setting_is_a_dimension_and_refuses_bad_values_by_name(setting):
    values = [setting.default, another_value(setting)] if setting.default is not None else [another_value(setting)]
    sweep = parse_sweep(BASE + field(setting, values).replace("'", '"'))
    applies = [c for c in sweep.cells() if c.engine in setting.engines]
    assert sorted(map(repr, {getattr(c.settings, setting.name) for c in applies})) == sorted(map(repr, values))
    bad = "not-a-value" if setting.type is not str or setting.choices else 12
    with pytest.raises(SweepError, match=re.escape(setting.sweep) + ": must be"):
        parse_sweep(BASE + field(setting, bad))


def test_a_server_flag_a_setting_owns_is_refused_in_free_flags():
    for flag, setting in declared.OWNED_SERVER_FLAGS.items():
        with pytest.raises(SweepError, match=f"must not hold {flag}: it is the sweep setting {setting.sweep}"):
            parse_sweep(BASE + f"server: {{flags: '{flag} 4'}}\n")


def test_the_engines_apply_the_declared_knobs():
    settings = Settings(threads=3, kv_cache_type="q8_0")
    argv = declared.server_argv(settings)
    assert argv[argv.index("-t") + 1] == "3" and argv[argv.index("-ctk") + 1] == "q8_0"
    assert argv[argv.index("-ctv") + 1] == "q8_0"
    cparams = declared.llama_cparams(settings)
    assert cparams["type_k"] == ("q8_0", "GGML_TYPE_") and cparams["n_threads"] == (3, "")
    assert "-t" not in declared.server_argv(Settings(threads=0))  # 0: the agent decides, no flag


def test_the_agent_resolves_threads_once_for_both_llama_cpp_engines():
    spec = parse_sweep(BASE).cells()
    resolved = {c.engine: worker.resolved(c).settings.threads for c in spec}
    assert resolved["llama.cpp"] == resolved["llama-server"] == worker.default_threads() >= 1
    assert resolved["mlx"] is None  # not a llama.cpp engine: recorded as not applicable
    named = parse_sweep(BASE + "threads: 2\n").cells()
    assert {worker.resolved(c).settings.threads for c in named if c.engine != "mlx"} == {2}


def test_the_agents_thread_default_is_its_variable_else_the_physical_cores(monkeypatch):
    monkeypatch.setenv(worker.THREADS_ENV, "3")
    assert worker.default_threads() == 3
    monkeypatch.delenv(worker.THREADS_ENV)
    assert worker.default_threads() == (psutil.cpu_count(logical=False) or os.cpu_count())
    for bad in ("0", "two", "-1", "2000"):
        monkeypatch.setenv(worker.THREADS_ENV, bad)
        with pytest.raises(ValueError, match=f"SPECFLEET_THREADS='{bad}': must be a whole number from 1 to 1024"):
            worker.default_threads()


def test_a_server_command_is_recorded_without_paths_and_ports():
    command = "/opt/bin/llama-server -m /Users/me/t.gguf --host 127.0.0.1 --port 8081 -fa on -ctk q8_0 --model-draft d"
    assert server_flags(command) == "-fa on -ctk q8_0"
    assert server_flags("mtplx serve --model=/x/y --port=9000 --mtp --depth 3") == "serve --mtp --depth 3"


@pytest.mark.engine
def test_in_process_llama_cpp_runs_with_the_declared_kv_cache(tiny_models):
    pytest.importorskip("llama_cpp")
    from agent.engines import make_engine

    engine = make_engine("llama.cpp", settings=Settings(threads=1, kv_cache_type="q8_0"))
    engine.load(str(tiny_models.gguf_target))
    try:
        import llama_cpp as ll

        assert engine._target.cparams.type_k == ll.GGML_TYPE_Q8_0 == engine._target.cparams.type_v
        assert engine._target.cparams.n_threads == 1
    finally:
        engine.close()


def test_the_record_version_moves_with_a_declared_setting():
    assert SCHEMA_VERSION >= max(s.since for s in declared.DECLARED)
    previous = SCHEMA_VERSION - 1
    read = RunRecord.from_dict(as_schema(run_record("job-1").to_dict(), previous))
    for s in declared.CARRIED:  # what the older record predates is unknown, never the default
        assert (getattr(read.settings, s.name) is None) >= (s.since > previous), s.name
    assert read.schema == SCHEMA_VERSION and dataclasses.replace(read).schema == SCHEMA_VERSION


def _mixed_groups():
    """Two comparable groups as a query returns them when the runs behind the frame mix set and NULL
    settings: nullable pandas dtypes (Int64, string, boolean) hold pandas' NA, object columns None,
    float columns NaN, the threads column a float where the integer column mixed NULLs."""
    import pandas as pd

    return pd.DataFrame(
        {
            "comparable": ["a", "b"],
            "system_label": ["llama.cpp (specfleet)", "llama-server"],
            "model": ["tiny", "tiny"],
            "draft_model": pd.array([None, "tiny-draft"], dtype="string"),
            "prompt_set": ["qa", "qa"],
            "context_tokens": [0, 0],
            "sampler": ["greedy", "greedy"],
            "threads": pd.array([4, None], dtype="Int64"),
            "kv_cache_type": pd.array([None, "q8_0"], dtype="string"),
            "server_state": pd.array(["warm", None], dtype="string"),
            "spec_draft_n_min": [float("nan"), 2.0],
            "reasoning": [None, "off"],
            "warmup_converged": pd.array([True, None], dtype="boolean"),
            "power_mode": pd.array([None, "high"], dtype="string"),
        }
    )


def test_labels_follow_the_declaration_on_a_frame_that_mixes_null_and_set_settings():
    from dashboard.queries import group_label

    frame = _mixed_groups()
    a, b = (group_label(g) for g in frame.itertuples())
    # set and other than the default: shown; NA, None, NaN and defaults: not
    assert a == "llama.cpp (specfleet) · tiny · no draft · qa · context 0 · greedy · threads 4 · group a"
    assert b == (
        "llama-server · tiny · draft tiny-draft · qa · context 0 · greedy · power mode high · KV cache q8_0"
        " · draft n_min 2 · reasoning off · group b"
    )
    # the same labels from plain Python values (what a query gives without pandas' dtypes)
    plain = [dict(zip(frame.columns, row)) for row in frame.astype(object).itertuples(index=False)]
    for row in plain:
        for key, value in row.items():
            row[key] = None if declared.is_missing(value) else value
    assert [declared.describe(r) for r in plain] == [declared.describe(g._asdict()) for g in frame.itertuples()]


@pytest.mark.parametrize("value", [None, float("nan"), "pd.NA", "pd.NaT"])
def test_a_missing_value_is_missing_whatever_its_type(value):
    import pandas as pd

    value = {"pd.NA": pd.NA, "pd.NaT": pd.NaT}.get(value, value) if isinstance(value, str) else value
    assert declared.is_missing(value)
    assert declared.describe({"threads": value, "power_mode": value}) == ""


@pytest.mark.parametrize("value", [0, 4, "", "high", False, 0.0])
def test_a_set_value_is_not_missing(value):
    assert not declared.is_missing(value)


# ---------------------------------------------------------------- rows that are not Settings' fields


def _one_engine_sweep(engine: str, extra: str) -> str:
    return f"name: s\nengines: [{engine}]\nmodels: {{{engine}: {{target: t.gguf}}}}\nprompt_sets: [qa]\n{extra}"


@pytest.mark.parametrize("row", declared.SAMPLER, ids=lambda s: s.name)
def test_every_sampler_row_is_parsed_recorded_labelled_and_sent(row):
    """A sampler row alone makes a sampler field: the sweep's samplers entry, Sampler, the job spec,
    the record's column (and the store's: a migration adds it), the label in Python and in SQL,
    each engine's request (llama.cpp's chain, a server's body) and its line in docs/sweeps.md; an
    engine that does not apply it (the row's `engines`) is refused it, by the sweep and the engine."""
    import duckdb

    from agent.engines.base import EngineError, Request, validate
    from agent.engines.llama_server import LlamaServerEngine
    from coordinator.store import migrate
    from specfleet import sweep_reference

    engine = next(e for e in ("llama.cpp", "llama-server", "mlx") if e in row.engines)
    other = another_value(row)
    fields = {**({"temperature": 0.7} if row.key != "temperature" else {}), row.key: other}
    entry = ", ".join(f"{k}: {v!r}" for k, v in fields.items())
    (cell,) = parse_sweep(_one_engine_sweep(engine, f"samplers: [{{{entry}}}]\n")).cells()
    assert getattr(cell.sampler, row.key) == other and JobSpec.from_json(cell.to_json()).sampler == cell.sampler
    record = run_record("job-1", sampler=cell.sampler)
    assert record.row()[row.name] == other and RunRecord.from_json(record.to_json()) == record
    assert row.name in CHECKED_KEYS
    with duckdb.connect() as store:
        migrate(store)
        assert row.name in {c for (c,) in store.execute("SELECT column_name FROM (DESCRIBE runs)").fetchall()}
    columns = ", ".join(f"{getattr(cell.sampler, s.key)!r} AS {s.name}" for s in declared.SAMPLER)
    label = duckdb.connect().execute(f"SELECT {declared.sampler_label_sql()} FROM (SELECT {columns})").fetchone()[0]
    assert label == cell.sampler.label() and f"{row.short or row.label}=" in label
    if row.llama_sampler:
        assert (row, other) in declared.sampler_chain(cell.sampler)
    if row.request_key and "llama-server" in row.engines:
        body = LlamaServerEngine._body(None, Request((1, 2), 4, sampler=cell.sampler))
        assert body[row.request_key] == other and (not row.server_sampler or row.server_sampler in body["samplers"])
    assert any(line.startswith(f"| `{row.sweep}` |") for line in sweep_reference.render().splitlines())
    with pytest.raises(SweepError, match=re.escape(f"samplers[0].{row.key}: must be")):
        parse_sweep(BASE + f"samplers: [{{{row.key}: {row.hi * 2 if row.hi else 'x'}}}]\n")
    for ignoring in (e for e in ("llama.cpp", "llama-server", "mlx") if e not in row.engines):
        with pytest.raises(SweepError, match=re.escape(f"samplers[0].{row.key}: applies to")):
            parse_sweep(_one_engine_sweep(ignoring, f"samplers: [{{{entry}}}]\n"))
        with pytest.raises(EngineError, match=re.escape(f"bad sampler: {row.key}: applies to")):
            validate(Request((1, 2), 4, sampler=cell.sampler), ignoring, ("baseline",), 10, False)


@pytest.mark.parametrize("row", declared.JOB_FIELDS, ids=lambda s: s.name)
def test_every_job_row_is_parsed_defaulted_and_bounded_by_its_row(row):
    sweep = parse_sweep(BASE)
    assert getattr(sweep, row.name) == row.default  # what a sweep that omits it gets
    if row.default is not None and row.name in {f.name for f in dataclasses.fields(JobSpec)}:
        assert getattr(JobSpec, row.name) == row.default  # the job spec's default is the row's
        other = another_value(row) if row.hi is None or another_value(row) <= row.hi else row.lo
        assert {getattr(c, row.name) for c in parse_sweep(BASE + f"{row.sweep}: {other}\n").cells()} == {other}
    for bad, why in ((row.lo - 1, "at least"), (".nan", "finite" if row.type is float else "an integer")):
        with pytest.raises(SweepError, match=re.escape(f"{row.sweep}: must be {why}")):
            parse_sweep(BASE + f"{row.sweep}: {bad}\n")


@pytest.mark.parametrize("row", declared.ARM_PARAMS, ids=lambda s: s.name)
def test_every_spec_type_parameter_is_its_arms_flag_within_llama_cpps_bounds(row):
    key, spec_type = row.sweep.rpartition(".")[2], row.spec_types[0]
    arms = f"arms: [{{spec_type: {spec_type}, depths: [2], params: {{{key}: {row.lo + 1}}}}}]\n"
    models = "models: {llama-server: {target: t.gguf, draft: d.gguf}}\n"
    sweep = parse_sweep(f"name: s\nengines: [llama-server]\n{models}prompt_sets: [qa]\n{arms}")
    (arm,) = [a for a in sweep.arms_of("llama-server") if a.method == spec_type]
    assert arm.flags[arm.flags.index(row.server_flags[0]) + 1] == str(row.lo + 1)
    too_big = arms.replace(f"{key}: {row.lo + 1}", f"{key}: {row.hi + 1}")
    with pytest.raises(SweepError, match=re.escape(f"arms[0].params.{key}: must be at most {row.hi:g}")):
        parse_sweep(f"name: s\nengines: [llama-server]\n{models}prompt_sets: [qa]\n{too_big}")


def test_the_demos_ngram_mod_parameters_are_the_declarations_settings_and_flags():
    """cli/demo.py's NGRAM_MOD (bench/servers.py and bench/overhead.py run it too) reaches our loop
    as the declared settings and llama-server as the declared flags, never spelled by hand."""
    from cli.demo import NGRAM_MOD, ngram_mod_flags, ngram_mod_settings

    assert ngram_mod_settings({"n_match": 4, "n_min": 1}) == {"ngram_mod_n_match": 4, "ngram_mod_n_min": 1}
    assert ngram_mod_flags({"n_match": 4, "n_min": 1}) == (
        "--spec-ngram-mod-n-match",
        "4",
        "--spec-ngram-mod-n-min",
        "1",
    )
    settings = Settings(**ngram_mod_settings())
    assert (settings.ngram_mod_n_match, settings.ngram_mod_n_min) == (NGRAM_MOD["n_match"], NGRAM_MOD["n_min"])
