"""Agent settings chosen at enrolment (model directories) or written by hand (the llama-server to
run, and further llama-server builds beside it), kept beside the credential in `settings.json`;
flags of `specfleet agent run` and their SPECFLEET_* variables override them."""

from __future__ import annotations

import json
import os
from pathlib import Path

SETTINGS_FILE = "settings.json"


def load(config_dir: Path) -> dict:
    path = config_dir / SETTINGS_FILE
    if not path.exists():
        return {}
    try:
        settings = json.loads(path.read_text())
    except OSError as e:
        raise ValueError(f"cannot read {path} ({e.strerror}); fix or delete it") from None
    except ValueError as e:
        raise ValueError(f"{path} is not valid JSON ({e}); fix or delete it") from None
    if not isinstance(settings, dict) or not isinstance(settings.get("model_dirs", []), list):
        raise ValueError(f"{path} must hold an object with a list of model_dirs")
    return settings


def save(config_dir: Path, **settings) -> Path:
    config_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    path = config_dir / SETTINGS_FILE
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({**load(config_dir), **settings}, indent=2))
    os.replace(tmp, path)
    return path


def model_dirs(flags: list[str], config_dir: Path) -> list[Path]:
    """--model-dir flags, else SPECFLEET_MODEL_DIRS (os.pathsep-separated), else the enrolment's.
    Every directory must exist: a typo would otherwise refuse every job."""
    env = os.environ.get("SPECFLEET_MODEL_DIRS", "")
    chosen = flags or [d for d in env.split(os.pathsep) if d] or load(config_dir).get("model_dirs", [])
    dirs = [Path(d).expanduser().resolve() for d in chosen]
    for d in dirs:
        if not d.is_dir():
            raise ValueError(f"model directory {d} does not exist or is not a directory")
    return dirs


def llama_server(flag: str | None, config_dir: Path) -> Path | None:
    """--llama-server, else SPECFLEET_LLAMA_SERVER, else settings.json's "llama_server"; None when
    none is given (the engine then looks on PATH, then in this checkout's build). A path given
    must be an executable file: a typo would otherwise fail every llama-server job."""
    chosen = flag or os.environ.get("SPECFLEET_LLAMA_SERVER") or load(config_dir).get("llama_server")
    if not chosen:
        return None
    path = Path(chosen).expanduser().resolve()
    if not path.is_file() or not os.access(path, os.X_OK):
        raise ValueError(f"llama-server {path} does not exist or is not an executable file")
    return path


# Where a directory of builds holds its binaries: DIR/llama-server, DIR/*/llama-server (one build a
# directory: ~/llama-builds/b9500/llama-server) or DIR/*/bin/llama-server (a CMake build or install).
BUILD_GLOBS = ("llama-server", "*/llama-server", "*/bin/llama-server")


def llama_server_builds(config_dir: Path) -> list[Path]:
    """Further llama-server binaries that sweeps may pin by build (their arms' server_build):
    SPECFLEET_LLAMA_SERVER_BUILDS (os.pathsep-separated), else settings.json's
    "llama_server_builds", a list; each entry a binary or a directory of builds (BUILD_GLOBS). The
    agent reads each one's build from its own --version (agent/engines/llama_server.py
    find_builds). A path that does not exist, or a directory without a llama-server, is refused."""
    env = os.environ.get("SPECFLEET_LLAMA_SERVER_BUILDS", "")
    chosen = [p for p in env.split(os.pathsep) if p] or load(config_dir).get("llama_server_builds", [])
    if not isinstance(chosen, list) or not all(isinstance(p, str) for p in chosen):
        raise ValueError(f"{config_dir / SETTINGS_FILE}: llama_server_builds must be a list of paths")
    binaries = []
    for entry in chosen:
        path = Path(entry).expanduser().resolve()
        if path.is_dir():
            found = sorted(p for pattern in BUILD_GLOBS for p in path.glob(pattern) if _executable(p))
            if not found:
                raise ValueError(
                    f"llama-server build directory {path} holds no executable llama-server "
                    f"(looked for {', '.join(BUILD_GLOBS)})"
                )
            binaries += found
        elif _executable(path):
            binaries.append(path)
        else:
            raise ValueError(f"llama-server build {path} does not exist or is not an executable file or directory")
    return list(dict.fromkeys(binaries))


def _executable(path: Path) -> bool:
    return path.is_file() and os.access(path, os.X_OK)
