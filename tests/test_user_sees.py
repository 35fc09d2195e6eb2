"""What a user needs to see (issue 26, item 6): a text sample per prompt and arm (stored, on the
Runs page's table), admin commands that find the coordinator through --data-dir's
coordinator.json, the report's server command lines once per configuration, and runs that go to
the spool as each is measured."""

from __future__ import annotations

import argparse
import json
from types import SimpleNamespace

import duckdb
import pandas as pd
import pytest

from agent.protocol import run_job
from agent.summary import text_sample
from cli import main as cli_main
from cli.report import server_commands
from specfleet.design import rounded_repeats
from specfleet.record import SCHEMA_VERSION, TEXT_SAMPLE_CHARS, RunRecord, Sampler
from tests.support.fake_engine import TARGET, FakeEngine, spec
from tests.support.fleet import run_record
from tests.support.processes import cli

# ---------------------------------------------------------------- text samples


def test_a_text_sample_is_bounded_valid_text_and_absent_where_the_engine_cannot_decode():
    engine = SimpleNamespace(detokenize=lambda tokens: "ab\ud800" + "x" * 1000)  # a lone surrogate
    sample = text_sample(engine, [1, 2])
    assert len(sample) == TEXT_SAMPLE_CHARS and sample.startswith("ab?x")
    assert text_sample(SimpleNamespace(), [1]) is None  # a server engine: no detokenize
    broken = SimpleNamespace(detokenize=lambda tokens: 1 / 0)
    assert text_sample(broken, [1]) is None


def test_the_sample_is_part_of_the_record_and_bounded_there():
    record = run_record("j1", text_sample="The answer is: 4")
    assert RunRecord.from_json(record.to_json()).text_sample == "The answer is: 4" and record.schema == SCHEMA_VERSION
    with pytest.raises(ValueError, match="text_sample must be 0-512 characters"):
        run_record("j1", text_sample="x" * 513)


# ---------------------------------------------------------------- runs as measured


class Decoding(FakeEngine):
    def detokenize(self, tokens):
        return " ".join(map(str, tokens))


def _interleaving(**overrides) -> list[tuple]:
    log: list = []
    s = spec(warmup=2, repeats=3, **overrides)
    engine = Decoding(log, {})
    emit = lambda record: log.append(("emit", record.method, record.repeat))  # noqa: E731
    run_job(s, engine, emit, "job-1", 1, TARGET, sample=lambda: {}, sleep=lambda s: None)
    return [e for e in log if e[0] in ("generate", "emit")]


def test_every_greedy_run_goes_to_the_spool_as_soon_as_it_is_measured():
    events = _interleaving()
    emits = [i for i, e in enumerate(events) if e[0] == "emit"]
    assert len(emits) == 2 * rounded_repeats(3, 3) * 3  # two prompts, the repeats, three arms
    assert all(events[i - 1][0] == "generate" and events[i - 1][1] == events[i][1] for i in emits)


def test_a_run_checked_against_its_repeats_baseline_waits_only_for_that_baseline():
    """Sampled llama.cpp runs are checked against the same-seed baseline of their repeat: an arm
    measured before the baseline goes up with it, the others at once."""
    events = _interleaving(engine="llama.cpp", sampler=Sampler(temperature=1.0, seed=3))
    emits = [i for i, e in enumerate(events) if e[0] == "emit"]
    assert len(emits) == 2 * rounded_repeats(3, 3) * 3
    at_once = [i for i in emits if events[i - 1][0] == "generate" and events[i - 1][1] == events[i][1]]
    held = [i for i in emits if events[i - 1][1] == "baseline" and events[i][1] != "baseline"]
    assert any(events[i][1] != "baseline" for i in at_once)  # after its row's baseline: at once
    assert held  # measured before it: emitted right after the baseline was measured


# ---------------------------------------------------------------- admin commands and --data-dir


def _args(data_dir, coordinator=None):
    return argparse.Namespace(coordinator=coordinator, data_dir=str(data_dir))


def test_admin_commands_dial_the_address_in_the_data_dirs_coordinator_json(tmp_path):
    assert cli_main._coordinator(_args(tmp_path)) == cli_main.DEFAULT_COORDINATOR  # no file: the default
    (tmp_path / "coordinator.json").write_text(json.dumps({"grpc": "0.0.0.0:61234", "pid": 1}))
    assert cli_main._coordinator(_args(tmp_path)) == "127.0.0.1:61234"
    (tmp_path / "coordinator.json").write_text(json.dumps({"grpc": "10.0.0.5:5000"}))
    assert cli_main._coordinator(_args(tmp_path)) == "10.0.0.5:5000"
    assert cli_main._coordinator(_args(tmp_path, "host:1")) == "host:1"  # --coordinator wins
    (tmp_path / "coordinator.json").write_text("{not json")
    assert cli_main._coordinator(_args(tmp_path)) == cli_main.DEFAULT_COORDINATOR


@pytest.mark.process
def test_token_create_with_only_data_dir_reaches_a_coordinator_on_another_port(coord, monkeypatch):
    address, data = coord
    assert not address.endswith(":50551")
    monkeypatch.delenv("SPECFLEET_COORDINATOR", raising=False)
    made = cli("token", "create", "--data-dir", str(data), timeout=60)
    assert made.stdout.startswith("sft.")


# ---------------------------------------------------------------- the report's command lines


def test_the_reports_server_command_lines_are_one_row_per_arm_and_flags():
    runs = [
        {
            "system_method": "llama-server draft-simple",
            "server_flags": "-fa on --spec-type draft-simple",
            "server_command": f"llama-server -m /m/t.gguf --port {port} -fa on --spec-type draft-simple",
            "agent_id": agent,
            "machine_id": agent,
        }
        for port, agent in ((8001, "a"), (8002, "a"), (8003, "b"), (8004, "b"))
    ]
    runs.append(
        {"system_method": "llama-server baseline", "server_flags": "-fa on", "server_command": "x", "agent_id": "a"}
    )
    runs.append(
        {"system_method": "specfleet mlx baseline", "server_flags": None, "server_command": "", "agent_id": "a"}
    )
    con = duckdb.connect()
    con.register("runs", pd.DataFrame(runs))
    table = server_commands(SimpleNamespace(query=lambda sql: con.execute(sql).df()))
    assert table["system_method"].tolist() == ["llama-server baseline", "llama-server draft-simple"]
    simple = table.iloc[1]
    assert (simple.command_lines, simple.machines, simple.runs) == (4, 2, 4)
    assert simple.server_command.endswith("--port 8001 -fa on --spec-type draft-simple")
