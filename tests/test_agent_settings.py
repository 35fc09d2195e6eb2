"""Where the agent's model directories come from: --model-dir, SPECFLEET_MODEL_DIRS, enrolment."""

import os

import pytest

from agent import settings


def test_flags_then_environment_then_enrolment(tmp_path, monkeypatch):
    a, b, c = (tmp_path / n for n in "abc")
    for d in (a, b, c):
        d.mkdir()
    config = tmp_path / "config"
    monkeypatch.delenv("SPECFLEET_MODEL_DIRS", raising=False)
    assert settings.model_dirs([], config) == []  # nothing configured anywhere
    settings.save(config, model_dirs=[str(c)])
    assert settings.model_dirs([], config) == [c]
    monkeypatch.setenv("SPECFLEET_MODEL_DIRS", f"{a}{os.pathsep}{b}")
    assert settings.model_dirs([], config) == [a, b]
    assert settings.model_dirs([str(a)], config) == [a]


def test_bad_settings_and_missing_directories_are_named(tmp_path, monkeypatch):
    monkeypatch.delenv("SPECFLEET_MODEL_DIRS", raising=False)
    with pytest.raises(ValueError, match="model directory .*nope does not exist"):
        settings.model_dirs([str(tmp_path / "nope")], tmp_path)
    (tmp_path / "settings.json").write_text("{not json")
    with pytest.raises(ValueError, match="settings.json is not valid JSON"):
        settings.model_dirs([], tmp_path)
    (tmp_path / "settings.json").write_text('{"model_dirs": "/models"}')
    with pytest.raises(ValueError, match="a list of model_dirs"):
        settings.model_dirs([], tmp_path)


def test_llama_server_builds_are_binaries_or_directories_of_builds(tmp_path, monkeypatch):
    """settings.json's llama_server_builds (or SPECFLEET_LLAMA_SERVER_BUILDS): binaries, and
    directories holding one build each (DIR/b9500/llama-server) or CMake trees (DIR/x/bin/llama-server)."""
    monkeypatch.delenv("SPECFLEET_LLAMA_SERVER_BUILDS", raising=False)
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
    assert settings.llama_server_builds(config) == []
    settings.save(config, llama_server_builds=[str(single), str(builds), str(single)])
    assert settings.llama_server_builds(config) == [single, tagged, cmake]  # each once
    monkeypatch.setenv("SPECFLEET_LLAMA_SERVER_BUILDS", str(builds / "b9500"))
    assert settings.llama_server_builds(config) == [tagged]


@pytest.mark.parametrize(
    "value, message",
    [
        ("not-a-list", "llama_server_builds must be a list of paths"),
        (["{tmp}/missing"], "llama-server build .*missing does not exist or is not an executable file or directory"),
        (["{tmp}/empty"], "llama-server build directory .*empty holds no executable llama-server"),
        (["{tmp}/plain"], "llama-server build .*plain does not exist or is not an executable"),
    ],
)
def test_bad_llama_server_builds_are_named(tmp_path, monkeypatch, value, message):
    monkeypatch.delenv("SPECFLEET_LLAMA_SERVER_BUILDS", raising=False)
    (tmp_path / "empty").mkdir()
    (tmp_path / "plain").write_text("not executable")
    value = [v.format(tmp=tmp_path) for v in value] if isinstance(value, list) else value
    settings.save(tmp_path, llama_server_builds=value)
    with pytest.raises(ValueError, match=message):
        settings.llama_server_builds(tmp_path)
