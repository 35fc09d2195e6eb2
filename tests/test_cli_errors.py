"""The CLI's flags and errors: every flag of every subcommand is read from its SPECFLEET_*
variable; every error, run as a user runs it (a subprocess), is one line on stderr naming what
was wrong, with a non-zero exit status and no traceback (configuration files it cannot read:
tests/test_bad_input.py)."""

import argparse
import os
import socket
import stat

import pytest

from cli import main as cli
from specfleet.data_dir import ADMIN_TOKEN_FILE, admin_credential
from specfleet.yaml_limits import MAX_NODES
from tests.support.fleet import start_coordinator
from tests.support.processes import one_line_error, specfleet
from tests.support.sweeps import alias_bomb, yaml_of

pytestmark = [pytest.mark.process]


def subcommands(parser: argparse.ArgumentParser, path=()):
    """(command words, parser) for every parser under this one, itself included."""
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, child in action.choices.items():
                yield from subcommands(child, (*path, name))


def flags(parser: argparse.ArgumentParser):
    return [a for a in parser._actions if a.option_strings and not isinstance(a, argparse._HelpAction)]


def sample(action) -> tuple[str, object]:
    """A value for the action's variable that differs from its default, and what it parses to."""
    if action.nargs == 0:  # a switch
        return "yes", True
    if action.choices:
        choice = next(c for c in action.choices if c != action.default)
        return choice, choice
    if action.type is not None and action.type("7") == 7:
        return "7", action.type("7")
    if isinstance(action.default, list):
        separator = os.pathsep if action.env == "SPECFLEET_MODEL_DIRS" else ","
        return f"one{separator}two", ["one", "two"]
    return "from-env", "from-env"


def positionals(parser) -> list[str]:
    return ["x" for a in parser._actions if not a.option_strings and not isinstance(a, argparse._SubParsersAction)]


def every_flag():
    return [
        (words, a.dest, getattr(a, "env", None))
        for words, parser in subcommands(cli.build_parser())
        for a in flags(parser)
    ]


def test_every_flag_has_a_variable_named_in_its_help():
    found = every_flag()
    assert len(found) > 60 and ("agent", "enrol") in {w for w, _, _ in found}
    for words, parser in subcommands(cli.build_parser()):
        for action in flags(parser):
            assert action.env.startswith("SPECFLEET_") and action.env in action.help, (words, action.dest)


@pytest.mark.parametrize(
    "words, dest, variable", every_flag(), ids=lambda v: " ".join(v) if isinstance(v, tuple) else str(v)
)
def test_every_flag_is_read_from_its_variable(monkeypatch, words, dest, variable):
    monkeypatch.delenv(variable, raising=False)  # the suite's own defaults (conftest) aside
    parsers = dict(subcommands(cli.build_parser()))
    action = next(a for a in flags(parsers[words]) if a.dest == dest)
    text, expected = sample(action)
    assert action.default != expected
    monkeypatch.setenv(variable, text)
    parser = dict(subcommands(cli.build_parser()))[words]
    required = [a for a in flags(parser) if a.required]
    argv = [*words, *positionals(parser), *(x for a in required for x in (a.option_strings[0], "given"))]
    if words == ():  # the top-level flags: any command will do
        argv = ["agent", "status"]
    args = cli.build_parser().parse_args(argv)
    assert getattr(args, dest) == expected


def test_a_flag_given_wins_over_its_variable_and_repeated_flags_replace_it(monkeypatch):
    monkeypatch.setenv("SPECFLEET_PORT", "1234")
    monkeypatch.setenv("SPECFLEET_MODEL_DIRS", f"a{os.pathsep}b")
    assert cli.build_parser().parse_args(["coordinator", "serve", "--port", "99"]).port == 99
    assert cli.build_parser().parse_args(["agent", "run", "--model-dir", "c", "--model-dir", "d"]).model_dir == [
        "c",
        "d",
    ]


@pytest.fixture(scope="module")
def module_coordinator(tmp_path_factory):
    c = start_coordinator(tmp_path_factory.mktemp("cli-errors"))
    yield c
    c.stop()


def test_secret_files_are_made_0600_when_opened(tmp_path):
    token = tmp_path / ADMIN_TOKEN_FILE
    token.write_text("sfadmin.secret\n")
    token.chmod(0o644)
    assert admin_credential(tmp_path) == "sfadmin.secret"
    assert stat.S_IMODE(token.stat().st_mode) == 0o600
    token.chmod(0o644)
    start_coordinator(tmp_path).stop()  # writes it again
    assert stat.S_IMODE(token.stat().st_mode) == 0o600

    from agent.credentials import AgentIdentity

    AgentIdentity("127.0.0.1:1", "agent-1", "mac", "sfa.secret", 5.0).save(tmp_path)
    (tmp_path / "agent.json").chmod(0o640)
    assert AgentIdentity.load(tmp_path).credential == "sfa.secret"
    assert stat.S_IMODE((tmp_path / "agent.json").stat().st_mode) == 0o600


def test_cli_errors_are_one_line(tmp_path, module_coordinator):
    coordinator = module_coordinator
    address = f"127.0.0.1:{coordinator.port}"
    admin = ["--coordinator", address, "--data-dir", str(coordinator.config.data_dir)]
    binary, bomb = tmp_path / "binary.yaml", tmp_path / "bomb.yaml"
    binary.write_bytes(b"\xff\xfe\x00name")
    bomb.write_text(alias_bomb())
    enrol = ["agent", "enrol", "--coordinator", address, "--config-dir", str(tmp_path / "agent")]
    one_line_error(specfleet(*enrol, "--token", "sft.wrong", home=tmp_path), "enrol", "token")
    assert not (tmp_path / "agent").exists()
    one_line_error(specfleet(*enrol, home=tmp_path, env={"SPECFLEET_TOKEN": "sft.wrong"}), "enrol", "token")
    one_line_error(specfleet("sweep", "submit", str(binary), *admin, home=tmp_path), str(binary))
    one_line_error(specfleet("sweep", "submit", str(tmp_path / "absent.yaml"), *admin, home=tmp_path), "absent.yaml")
    result = specfleet("sweep", "submit", str(bomb), *admin, home=tmp_path)
    assert result.returncode == 1 and f"more than {MAX_NODES} values" in result.stderr and len(result.stderr) < 4000
    many = tmp_path / "many.yaml"
    many.write_text(yaml_of(prompt_sets=[f"set-{i}" for i in range(1000)]))
    result = specfleet("sweep", "submit", str(many), *admin, home=tmp_path)
    assert result.returncode == 1 and "1000 problem(s)" in result.stderr and result.stderr.endswith("and 950 more\n")
    one_line_error(specfleet("coordinator", "serve", home=tmp_path, env={"SPECFLEET_PORT": "abc"}), "SPECFLEET_PORT")
    one_line_error(specfleet("coordinator", "serve", "--lease-seconds", "-1", home=tmp_path), "--lease-seconds")
    one_line_error(specfleet("coordinator", "serve", "--tls-cert", "x", home=tmp_path), "--tls-key")
    one_line_error(specfleet("export", "--format", "xls", "--output", "o", home=tmp_path), "--format")
    switch = {"SPECFLEET_ALLOW_BATTERY": "maybe"}
    one_line_error(specfleet("agent", "run", home=tmp_path, env=switch), "SPECFLEET_ALLOW_BATTERY")
    one_line_error(specfleet("sweep", "status", "s-1", "--coordinator", "127.0.0.1:1", home=tmp_path), "admin")


def test_a_second_coordinator_on_a_taken_port_fails_naming_it(tmp_path, module_coordinator):
    coordinator = module_coordinator
    result = specfleet(
        "coordinator", "serve", "--data-dir", str(tmp_path / "other"), "--port", str(coordinator.port), home=tmp_path
    )
    one_line_error(result, f"127.0.0.1:{coordinator.port}", "Address already in use")
    with socket.socket() as s:  # the first one still answers there
        s.connect(("127.0.0.1", coordinator.port))
    metrics = specfleet(
        "coordinator",
        "serve",
        "--data-dir",
        str(tmp_path / "third"),
        "--port",
        "0",
        "--metrics-port",
        str(coordinator.metrics_port),
        home=tmp_path,
    )
    one_line_error(metrics, "/metrics", str(coordinator.metrics_port), "Address already in use")
