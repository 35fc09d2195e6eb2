"""The agent's configuration (agent/config.py AgentConfig): each field from its flag (or the
flag's variable), else its own variable, else settings.json, else its default; a bad value named
with its field and its source."""

import os

import pytest

from agent import settings
from agent.config import FIELDS, AgentConfig, default_config_dir, load_field


def load(config, flags=None, **environ):
    return AgentConfig.load(config, flags, environ)


def test_flags_then_environment_then_enrolment(tmp_path):
    a, b, c = (tmp_path / n for n in "abc")
    for d in (a, b, c):
        d.mkdir()
    config = tmp_path / "config"
    assert load(config).model_dirs == ()  # nothing configured anywhere
    settings.save(config, model_dirs=[str(c)])
    assert load(config).model_dirs == (c,)
    env = {"SPECFLEET_MODEL_DIRS": f"{a}{os.pathsep}{b}"}
    assert load(config, **env).model_dirs == (a, b)
    assert load(config, {"model_dirs": [str(a)]}, **env).model_dirs == (a,)
    assert load_field("model_dirs", config, {"model_dirs": [str(b)]}, {}) == (b,)


def test_bad_settings_and_missing_directories_are_named_with_their_source(tmp_path):
    nope = tmp_path / "nope"
    with pytest.raises(ValueError, match=r"model_dirs from --model-dir: model directory .*nope does not exist"):
        load(tmp_path, {"model_dirs": [str(nope)]})
    with pytest.raises(ValueError, match=r"model_dirs from SPECFLEET_MODEL_DIRS='.*nope': model directory .*nope"):
        load(tmp_path, {"model_dirs": [str(nope)]}, SPECFLEET_MODEL_DIRS=str(nope))  # the flag read its variable
    with pytest.raises(ValueError, match=r"model_dirs from SPECFLEET_MODEL_DIRS='.*nope': model directory .*nope"):
        load(tmp_path, SPECFLEET_MODEL_DIRS=str(nope))  # no command line: the agent reads it itself
    (tmp_path / "settings.json").write_text("{not json")
    with pytest.raises(ValueError, match="settings.json is not valid JSON"):
        load(tmp_path)
    (tmp_path / "settings.json").write_text('{"model_dirs": "/models"}')
    with pytest.raises(ValueError, match=r"model_dirs from .*settings.json's model_dirs: must be a list of paths"):
        load(tmp_path)


def test_the_threads_and_switches_come_from_their_variables(tmp_path):
    assert load(tmp_path, SPECFLEET_THREADS="3").threads == 3
    assert load(tmp_path).threads == (__import__("psutil").cpu_count(logical=False) or os.cpu_count())
    for bad in ("0", "two", "-1", "2000"):
        with pytest.raises(ValueError, match=f"threads from SPECFLEET_THREADS='{bad}': must be a whole number from 1"):
            load(tmp_path, SPECFLEET_THREADS=bad)
    assert load(tmp_path, SPECFLEET_ALLOW_BATTERY="yes").allow_battery is True
    assert load(tmp_path, {"allow_battery": True}).allow_battery is True
    assert load(tmp_path, SPECFLEET_IGNORE_DOCTOR="off").ignore_doctor is False
    with pytest.raises(ValueError, match="allow_downloads from SPECFLEET_ALLOW_DOWNLOADS='maybe': must be one of 1"):
        load(tmp_path, SPECFLEET_ALLOW_DOWNLOADS="maybe")
    with pytest.raises(ValueError, match="metrics_port from --metrics-port: must be a port from 0"):
        load(tmp_path, {"metrics_port": 70000})
    assert load(tmp_path, SPECFLEET_AGENT_METRICS_PORT="9100").metrics_port == 9100


def test_the_config_is_frozen_and_every_field_is_declared_once(tmp_path):
    config = load(tmp_path)
    with pytest.raises(AttributeError):
        config.threads = 2
    names = [f.name for f in FIELDS]
    assert len(set(names)) == len(names) and all(f.env.startswith("SPECFLEET_") for f in FIELDS)
    assert set(names) | {"config_dir"} == set(AgentConfig.__dataclass_fields__)


def test_the_config_directory_is_its_variable_else_the_platforms(tmp_path):
    assert default_config_dir({"SPECFLEET_CONFIG_DIR": str(tmp_path)}) == tmp_path
    assert default_config_dir({"XDG_CONFIG_HOME": str(tmp_path)}, "linux") == tmp_path / "specfleet"
    assert default_config_dir({}, "darwin").parts[-3:] == ("Library", "Application Support", "specfleet")
    assert load(None, SPECFLEET_CONFIG_DIR=str(tmp_path)).config_dir == tmp_path


def test_llama_server_builds_are_binaries_or_directories_of_builds(tmp_path):
    """settings.json's llama_server_builds (or SPECFLEET_LLAMA_SERVER_BUILDS): binaries, and
    directories holding one build each (DIR/b9500/llama-server) or CMake trees (DIR/x/bin/llama-server)."""
    config = tmp_path / "config"

    def binary(path):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("#!/bin/sh\n")
        path.chmod(0o755)
        return path

    single = binary(tmp_path / "brew" / "llama-server")
    builds = tmp_path / "builds"
    tagged, cmake = binary(builds / "b9500" / "llama-server"), binary(builds / "src" / "bin" / "llama-server")
    (builds / "b9600").mkdir()  # a directory without a binary inside a directory of builds: skipped
    assert load(config).llama_server_builds == ()
    settings.save(config, llama_server_builds=[str(single), str(builds), str(single)])
    assert load(config).llama_server_builds == (single, tagged, cmake)  # each once
    assert load(config, SPECFLEET_LLAMA_SERVER_BUILDS=str(builds / "b9500")).llama_server_builds == (tagged,)


@pytest.mark.parametrize(
    "value, message",
    [
        ("not-a-list", "llama_server_builds from .*settings.json's llama_server_builds: must be a list of paths"),
        (["{tmp}/missing"], "llama-server build .*missing does not exist or is not an executable file or directory"),
        (["{tmp}/empty"], "llama-server build directory .*empty holds no executable llama-server"),
        (["{tmp}/plain"], "llama-server build .*plain does not exist or is not an executable"),
    ],
)
def test_bad_llama_server_builds_are_named(tmp_path, value, message):
    (tmp_path / "empty").mkdir()
    (tmp_path / "plain").write_text("not executable")
    value = [v.format(tmp=tmp_path) for v in value] if isinstance(value, list) else value
    settings.save(tmp_path, llama_server_builds=value)
    with pytest.raises(ValueError, match=message):
        load(tmp_path)


def test_a_port_of_zero_is_a_value_given(tmp_path):
    """0 (any free port) is given, not "unset": the variable does not override it."""
    assert load(tmp_path, {"metrics_port": 0}, SPECFLEET_AGENT_METRICS_PORT="9100").metrics_port == 0
