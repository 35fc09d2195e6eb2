"""The typed run record: validated in its constructor, named field by field when wrong, carried
through JSON and store rows unchanged; the job spec likewise; the checked keys."""

import dataclasses
import json

import pytest

from specfleet import record as record_module
from specfleet import settings as declared
from specfleet.record import (
    CHECKED_KEYS,
    SCHEMA_VERSION,
    Environment,
    InvalidRecord,
    JobSpec,
    ModelIdentity,
    NewerSchema,
    RunRecord,
    Sampler,
    differences,
)
from specfleet.record import FIELD_VERSIONS as RECORD_FIELD_VERSIONS
from tests.support.fleet import another_value, as_schema, run_record, setting_changes


def full_record() -> RunRecord:
    """A record with every kind of field set: nested parts, lists, None and booleans."""
    return run_record(
        "job-1",
        method="draft",
        depth=2,
        draft=ModelIdentity(reference="org/draft", revision="abc123", digest="12" * 32, source="huggingface"),
        lossless=True,
        rounds=10,
        tokens_drafted=20,
        tokens_accepted=13,
        drafted_by_position=(10, 10),
        acceptance_by_position=(0.8, 0.5),
        inter_token_latency_p50_seconds=0.004,
        env_before=Environment(thermal="nominal", power_source="ac", low_power_mode=False, loadavg_1m=0.5),
        env_nominal=None,
        env_reasons=("after: load average 3.5 above 2 cores",),
        acceptance_collapsed=False,
    )


def test_a_record_survives_json_and_store_rows_unchanged():
    record = full_record()
    assert RunRecord.from_json(record.to_json()) == record
    row = record.row()
    assert list(row) == RunRecord.columns()
    assert row["draft_reference"] == "org/draft" and row["env_before_loadavg_1m"] == 0.5
    assert row["acceptance_by_position"] == [0.8, 0.5] and row["env_after_thermal"] is None
    assert RunRecord.from_row({**row, "seq": 7, "chip": "Apple M4"}) == record  # store columns beside it
    assert record.schema == SCHEMA_VERSION


@pytest.mark.parametrize(
    "change, message",
    [
        ({"decode_tokens_per_second": float("nan")}, "decode_tokens_per_second: must be finite"),
        ({"depth": "2"}, "depth: must be an integer"),
        ({"lossless": "yes"}, "lossless: must be true or false"),
        ({"method": "medusa"}, "method 'medusa' is unknown"),
        ({"engine": "vllm"}, "engine: must be one of mlx, llama.cpp, llama-server, openai, got 'vllm'"),
        ({"depth": 0}, "depth = 0 is not in [1, 64]"),
        ({"tokens_accepted": 30}, "tokens_accepted (30) exceeds tokens_drafted (20)"),
        ({"acceptance_by_position": [1.5, 0.5]}, "acceptance_by_position holds a share outside [0, 1]"),
        ({"drafted_by_position": [1]}, "differ in length"),
        ({"verify_cost_seconds": [0.1]}, "verify_cost_seconds belongs to verify-cost runs"),
        ({"prompt_category": "poetry"}, "prompt_category 'poetry' is not one of"),
        ({"output_sha256": "xyz"}, "output_sha256 'xyz' is not 64 lowercase hex digits"),
        ({"colour": "red"}, "colour: unknown field"),
        ({"schema": 1}, "system: unknown field in a schema 1 record"),  # a field schema 1 did not have
        ({"schema": SCHEMA_VERSION + 1}, f"record schema {SCHEMA_VERSION + 1} is newer than {SCHEMA_VERSION}"),
        ({"schema": "3"}, "schema: must be a positive integer, got '3'"),
        ({"settings": {"threads": -1}}, "settings.threads: must be at least 0, got -1"),
        ({"settings": {"kv": 1}}, "settings.kv: unknown field"),
        ({"run_id": ""}, "run_id must be 1-128 characters"),
        ({"prompt_id": "p" * 500}, "prompt_id must be 1-128 characters, got 500"),
        ({"env_reasons": ["x" * 5000]}, "env_reasons[0] must be 0-4096 characters"),
        ({"sampler": {"temperature": -1.0}}, "sampler.temperature: must be at least 0, got -1.0"),
        ({"sampler": {"heat": 1}}, "sampler.heat: unknown field"),
        ({"target": {"reference": "/Users/me/models/x.gguf", "digest": "ab" * 32}}, "is a path"),
        ({"target": {"reference": "x.gguf", "digest": "nothex"}}, "target.digest 'nothex' is not 64"),
        ({"env_before": {"loadavg_1m": "high"}}, "env_before.loadavg_1m: must be a number"),
    ],
)
def test_every_bad_field_is_refused_by_name(change, message):
    data = full_record().to_dict()
    data.update(change)
    with pytest.raises(InvalidRecord) as e:
        RunRecord.from_dict(data)
    assert message in str(e.value)


def test_two_faults_of_one_record_are_named_in_one_refusal():
    """Issue 39: a record with engine cuda and method magic was refused naming only the engine. Both
    are named; a rule between fields is judged on the sound fields beside a faulty one; and a field
    an older schema predates is named with the others."""
    data = full_record().to_dict()
    with pytest.raises(InvalidRecord) as e:
        RunRecord.from_dict({**data, "engine": "cuda", "method": "magic"})
    assert "engine: must be one of mlx, llama.cpp, llama-server, openai, got 'cuda'" in str(e.value)
    assert "method 'magic' is unknown to every engine" in str(e.value)
    with pytest.raises(InvalidRecord) as e:
        RunRecord.from_dict({**data, "engine": "cuda", "energy_joules": 3.0, "energy_source": ""})
    assert "engine: must be one of" in str(e.value)
    assert "energy_joules and energy_source go together" in str(e.value)
    older = {**data, "schema": 3, "settings": {**data["settings"], "kv_cache_type": "f16"}, "method": "magic"}
    with pytest.raises(InvalidRecord) as e:
        RunRecord.from_dict(older)
    assert "settings.kv_cache_type: unknown field in a schema 3 record" in str(e.value)
    assert "method 'magic' is unknown to every engine" in str(e.value)


def test_every_mistyped_field_is_named_in_one_refusal():
    """Types, bounds, nested parts, settings, unknown and missing fields: all in one message."""
    data = full_record().to_dict()
    data.update(
        depth="2",
        lossless="yes",
        wall_seconds=float("nan"),
        env_reasons=["ok", 3],
        colour=1,
        run_id="",
        settings={"threads": -1, "kv_cache_type": "q9"},
        sampler={"top_k": 1.5},
        target={**data["target"], "parameters": True},
    )
    del data["job_id"]
    with pytest.raises(InvalidRecord) as e:
        RunRecord.from_dict(data)
    for message in (
        "run_id must be 1-128 characters, got 0",
        "job_id: is required",
        "depth: must be an integer, got '2'",
        "lossless: must be true or false, got 'yes'",
        "wall_seconds: must be finite, got nan",
        "env_reasons[1]: must be a string, got 3",
        "colour: unknown field",
        "settings.threads: must be at least 0, got -1",
        "settings.kv_cache_type: must be one of f32, f16, q8_0, q4_0, q4_1, iq4_nl, q5_0, q5_1, got 'q9'",
        "sampler.top_k: must be an integer, got 1.5",
        "target.parameters: must be an integer, got True",
    ):
        assert message in str(e.value), message
    with pytest.raises(InvalidRecord, match="depth: must be an integer, got '3'; .*lossless: must be true or false"):
        dataclasses.replace(full_record(), depth="3", lossless=1)  # the constructor, not only from_dict
    with pytest.raises(InvalidRecord, match="model identity: digest 'XY' is not 64 lowercase hex digits"):
        ModelIdentity(reference="x", digest="XY")


def test_a_job_spec_names_every_faulty_field():
    with pytest.raises(InvalidRecord) as e:
        JobSpec.from_json(json.dumps({"engine": 3, "model": {"target": 1}, "arms": [{"method": "x", "depth": "1"}]}))
    for message in (
        "job spec: engine: must be a string, got 3",
        "model.target: must be a string, got 1",
        "prompt_set: is required",
        "arms[0].depth: must be an integer, got '1'",
    ):
        assert message in str(e.value), message
    with pytest.raises(InvalidRecord, match="settings.ngram_mod_n_match: must be at least 1, got 0"):
        JobSpec.from_json(json.dumps({"ngram_mod_n_match": 0}))  # a spec of schema 2: its drafter parameters on top


def test_a_missing_field_and_non_json_are_named():
    data = full_record().to_dict()
    del data["job_id"]
    with pytest.raises(InvalidRecord, match="job_id: is required"):
        RunRecord.from_dict(data)
    with pytest.raises(InvalidRecord, match="run record is not JSON"):
        RunRecord.from_json("{not json")
    with pytest.raises(InvalidRecord, match="must be finite"):
        RunRecord.from_json(json.dumps({**full_record().to_dict(), "wall_seconds": float("inf")}))


def test_the_constructor_itself_validates():
    with pytest.raises(InvalidRecord, match="decode_tokens_per_second = -1.0 is not in"):
        run_record("job-1", decode_tokens_per_second=-1.0)
    with pytest.raises(dataclasses.FrozenInstanceError):
        full_record().depth = 3  # immutable


def test_job_spec_round_trips_with_its_defaults_in_one_place():
    from specfleet.record import Arm, Prompt

    spec = JobSpec(
        engine="mlx",
        model={"target": "t"},
        prompt_set="code",
        prompt_category="code",
        prompt_set_digest="ab" * 32,
        prompts=(Prompt("code-01", "def f():"),),
        arms=(Arm("baseline"), Arm("ngram", 3)),
    )
    assert JobSpec.from_json(spec.to_json()) == spec
    assert spec.warmup == 10 and spec.sampler == Sampler() and spec.context_tokens == 0
    assert spec.with_models(target="/local/t").model == {"target": "/local/t"}
    with pytest.raises(InvalidRecord, match="job spec"):
        JobSpec.from_json(json.dumps({**json.loads(spec.to_json()), "colour": 1}))


# One row per checked key: a change that must keep two runs apart.
KEY_CHANGES = {
    "target_digest": {"target": ModelIdentity(reference="target", digest="ee" * 32)},
    "draft_digest": {"draft": ModelIdentity(reference="draft", digest="ff" * 32)},
    "engine": {"engine": "llama.cpp"},
    "engine_version": {"engine_version": "mlx=0.1"},
    "system": {"system": "OptiQ"},  # from an MTPLX run: two OpenAI-compatible servers, one engine
    **{s.name: {"sampler": Sampler(**{s.key: another_value(s)})} for s in declared.SAMPLER},  # every sampler row
    "prompt_set_digest": {"prompt_set_digest": "99" * 32},
    "context_tokens": {"context_tokens": 4096},
    "max_new_tokens": {"max_new_tokens": 256},
    "power_mode": {"power_mode": "high"},  # from unknown (None): High Power Mode runs are not pooled with it
    "backend": {"backend": "cuda"},
    "server_version": {"server_version": "version: 9999 (0c1e570)"},
    **setting_changes(),  # every declared setting the record carries
}


def test_every_checked_key_keeps_runs_apart():
    assert set(KEY_CHANGES) == set(CHECKED_KEYS)
    base = run_record("job-1")
    assert differences(base.row(), run_record("job-2", method="ngram", depth=3, tps=50.0, repeat=4).row()) == []
    mtplx = dataclasses.replace(base, engine="openai", system="MTPLX")
    for key, change in KEY_CHANGES.items():
        one = mtplx if key == "system" else base
        other = dataclasses.replace(one, **change)
        assert differences(one.row(), other.row()) == [key], key


def test_power_mode_is_a_short_name_or_unknown():
    assert run_record("job-1", power_mode="automatic").power_mode == "automatic"
    assert run_record("job-1").power_mode is None
    for bad in ("", "x" * 33):
        with pytest.raises(InvalidRecord, match="power_mode must be 1-32 characters"):
            run_record("job-1", power_mode=bad)
    a, b = run_record("job-1", power_mode="high"), run_record("job-2", power_mode="automatic")
    assert differences(a.row(), b.row()) == ["power_mode"]


def test_a_record_without_schema_is_refused():
    data = full_record().to_dict()
    del data["schema"]
    with pytest.raises(InvalidRecord, match="schema: is required"):
        RunRecord.from_dict(data)


def test_a_newer_record_is_held_not_faulty():
    """NewerSchema is what the coordinator answers so that the agent holds the record."""
    data = {**full_record().to_dict(), "schema": SCHEMA_VERSION + 1}
    with pytest.raises(NewerSchema) as e:
        RunRecord.from_dict(data)
    assert e.value.schema == SCHEMA_VERSION + 1


def test_an_older_record_reads_with_what_it_predates_unknown():
    """A schema 2 record (before the declared settings) reads with every setting None (unknown),
    never the declaration's defaults; a schema 1 record also lacks the systems and accelerator."""
    data = as_schema(full_record().to_dict(), 3)
    since = {s.name: s.since for s in declared.CARRIED}
    settings3 = {k: v if since[k] <= 3 else None for k, v in data["settings"].items()}
    schema3 = RunRecord.from_dict({**data, "settings": settings3, "schema": 3})  # before divergence, text sample
    assert (schema3.divergence, schema3.divergence_margin, schema3.text_sample) == (None, None, None)
    with pytest.raises(InvalidRecord, match="divergence: unknown field in a schema 3 record"):
        RunRecord.from_dict({**data, "settings": settings3, "schema": 3, "divergence": "near-tie"})
    del data["settings"]
    old = RunRecord.from_dict({**data, "schema": 2})
    assert old.schema == SCHEMA_VERSION
    assert all(getattr(old.settings, s.name) is None for s in declared.CARRIED)
    oldest = {k: v for k, v in data.items() if RECORD_FIELD_VERSIONS.get(k, 1) <= 1}
    assert RunRecord.from_dict({**oldest, "schema": 1}).power_mode is None
    with pytest.raises(InvalidRecord, match="threads: unknown field|settings: unknown field"):
        RunRecord.from_dict({**data, "schema": 2, "settings": {"threads": 4}})


def test_the_schema_version_moved_with_every_field():
    """Every field of the record is the first schema's or named in FIELD_VERSIONS, and every
    declared setting's `since` is a schema this code reads: a field added without moving the
    version fails here."""
    first = {
        "run_id", "job_id", "attempt", "engine", "engine_version", "method", "depth", "target", "sampler",
        "prompt_set", "prompt_set_digest", "prompt_category", "prompt_id", "context_tokens", "max_new_tokens",
        "repeat", "position", "prompt_tokens", "generated_tokens", "prefill_seconds", "ttft_seconds",
        "decode_seconds", "wall_seconds", "decode_tokens_per_second", "prefill_tokens_per_second",
        "peak_memory_bytes", "output_sha256", "started_at_unix_seconds", "draft", "lossless", "lossless_check",
        "run_seed", "inter_token_latency_p50_seconds", "inter_token_latency_p90_seconds",
        "inter_token_latency_p99_seconds", "round_latency_p50_seconds", "round_latency_p90_seconds", "rounds",
        "tokens_drafted", "tokens_accepted", "draft_seconds", "verify_seconds", "drafted_by_position",
        "acceptance_by_position", "acceptance_collapsed", "acceptance_reason", "verify_cost_seconds", "warmup_runs",
        "arm_order", "load_seconds", "cooldown_seconds", "env_before", "env_after", "env_nominal", "env_reasons",
        "schema",
    }  # fmt: skip
    fields = {f.name for f in dataclasses.fields(RunRecord)}
    assert fields - first == {path for path in RECORD_FIELD_VERSIONS if "." not in path}
    # A part's fields (settings.<name>, sampler.<key>) are in the one table with the version that added them.
    parts = {"settings": declared.Settings, "sampler": Sampler}
    for path in (p for p in RECORD_FIELD_VERSIONS if "." in p):
        part, key = path.split(".")
        assert key in {f.name for f in dataclasses.fields(parts[part])}, path
    assert {f"settings.{s.name}" for s in declared.CARRIED} <= set(RECORD_FIELD_VERSIONS)
    # The version is the newest field's, a record's own or a declared row's (its `since`).
    assert max(RECORD_FIELD_VERSIONS.values()) == SCHEMA_VERSION
    assert all(1 <= s.since <= SCHEMA_VERSION for s in declared.DECLARED)
    # The history at the top of specfleet/record.py (pyperf's format history) names every version its
    # own fields moved to (a declared row's later version is its own `since`, listed in docs/sweeps.md).
    own = {1, *(v for path, v in RECORD_FIELD_VERSIONS.items() if "." not in path)}
    assert own <= set(record_module.SCHEMA_HISTORY), own
    assert all(path in RECORD_FIELD_VERSIONS for _, paths in record_module.SCHEMA_HISTORY.values() for path in paths)
