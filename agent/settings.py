"""The agent's settings.json, beside its credential: settings chosen at enrolment (model
directories) or written by hand (the llama-server to run, further llama-server builds beside
it). agent/config.py reads it once, into AgentConfig, where each key's row says how it is
checked; flags of `specfleet agent run` and SPECFLEET_* variables override it."""

from __future__ import annotations

import json
import os
from pathlib import Path

SETTINGS_FILE = "settings.json"


def load(config_dir: Path) -> dict:
    """The file's object ({} where there is no file); a ValueError naming the file when it is
    unreadable, not JSON or not an object."""
    path = config_dir / SETTINGS_FILE
    if not path.exists():
        return {}
    try:
        settings = json.loads(path.read_text())
    except OSError as e:
        raise ValueError(f"cannot read {path} ({e.strerror}); fix or delete it") from None
    except ValueError as e:
        raise ValueError(f"{path} is not valid JSON ({e}); fix or delete it") from None
    if not isinstance(settings, dict):
        raise ValueError(f"{path} must hold an object (model_dirs, llama_server, llama_server_builds)")
    return settings


def save(config_dir: Path, **settings) -> Path:
    config_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    path = config_dir / SETTINGS_FILE
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({**load(config_dir), **settings}, indent=2))
    os.replace(tmp, path)
    return path
