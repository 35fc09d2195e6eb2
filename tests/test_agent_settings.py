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
