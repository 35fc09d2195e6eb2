"""The agent's configuration, built once at start (`AgentConfig.load`) from its flags, its
environment and its settings.json, then passed to whatever needs it; nothing else in agent/
reads the agent's SPECFLEET_* variables or settings.json.

One row of FIELDS per setting, as the Buildkite agent's AgentStartConfig tags each field with its
flag and variable: the field's name, its flag of `specfleet agent run` (which cli/main.py's
`flag` also reads from the flag's variable), its variable, its settings.json key, how its text
or stored value is read, normalised and checked, and its default. Where a field comes from, in
order: the flag (or its variable, as the command line reads it), the variable of a field that
has no flag, settings.json, the default. A bad value is a ValueError naming the field and its
source: the flag, the variable (with the text it held) or the settings.json file.

A table rather than pydantic-settings (not a dependency): what the agent needs is the source of
each value in its error, which a model's validators do not know.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

from agent import settings as settings_file
from specfleet.settings import BY_NAME

# Where a directory of builds holds its binaries: DIR/llama-server, DIR/*/llama-server (one build a
# directory: ~/llama-builds/b9500/llama-server) or DIR/*/bin/llama-server (a CMake build or install).
BUILD_GLOBS = ("llama-server", "*/llama-server", "*/bin/llama-server")
CONFIG_DIR_ENV = "SPECFLEET_CONFIG_DIR"


def default_config_dir(environ: Mapping[str, str] = os.environ, platform: str = sys.platform) -> Path:
    """SPECFLEET_CONFIG_DIR, else the platform's: ~/Library/Application Support/specfleet on
    macOS, $XDG_CONFIG_HOME/specfleet (~/.config/specfleet) elsewhere."""
    if given := environ.get(CONFIG_DIR_ENV):
        return Path(given).expanduser()
    if platform == "darwin":
        return Path.home() / "Library" / "Application Support" / "specfleet"
    return xdg_config_home(environ) / "specfleet"


def xdg_config_home(environ: Mapping[str, str] = os.environ) -> Path:
    """$XDG_CONFIG_HOME, else ~/.config (where systemd --user also reads its units)."""
    return Path(environ.get("XDG_CONFIG_HOME") or Path.home() / ".config")


def _executable(path: Path) -> bool:
    return path.is_file() and os.access(path, os.X_OK)


def _paths(text: str) -> list[str]:
    """An os.pathsep-separated list of paths, as the variables of path lists hold them."""
    return [p for p in text.split(os.pathsep) if p]


def _path_list(value) -> list[Path]:
    if not isinstance(value, (list, tuple)) or not all(isinstance(p, (str, Path)) for p in value):
        raise ValueError("must be a list of paths")
    return [Path(p).expanduser().resolve() for p in value]


def _model_dirs(value) -> tuple[Path, ...]:
    """Every directory must exist: a typo would otherwise refuse every job."""
    dirs = _path_list(value)
    for d in dirs:
        if not d.is_dir():
            raise ValueError(f"model directory {d} does not exist or is not a directory")
    return tuple(dirs)


def _llama_server(value) -> Path | None:
    """A path given must be an executable file: a typo would otherwise fail every llama-server job."""
    if not value:
        return None
    if not isinstance(value, (str, Path)):
        raise ValueError("must be a path")
    path = Path(value).expanduser().resolve()
    if not _executable(path):
        raise ValueError(f"llama-server {path} does not exist or is not an executable file")
    return path


def _llama_server_builds(value) -> tuple[Path, ...]:
    """Each entry a binary or a directory of builds (BUILD_GLOBS), each binary once."""
    binaries = []
    for path in _path_list(value):
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
    return tuple(dict.fromkeys(binaries))


def _threads(value) -> int:
    most = BY_NAME["threads"].hi  # the setting's own bound
    text = str(value).strip()
    if not text.isdigit() or not 1 <= int(text) <= most:
        raise ValueError(f"must be a whole number from 1 to {most}")
    return int(text)


def _port(value) -> int | None:
    if value is None:
        return None
    if not isinstance(value, int) or not 0 <= value <= 65535:
        raise ValueError(f"must be a port from 0 (any free one) to 65535, got {value!r}")
    return value


TRUE_WORDS, FALSE_WORDS = ("1", "true", "yes", "on"), ("", "0", "false", "no", "off")  # as cli/main.py reads switches


def _switch(text: str) -> bool:
    word = text.strip().lower()
    if word not in TRUE_WORDS + FALSE_WORDS:
        raise ValueError(f"must be one of {', '.join(w for w in TRUE_WORDS + FALSE_WORDS if w)}")
    return word in TRUE_WORDS


def physical_cores() -> int:
    """llama.cpp's own default thread count: the machine's physical cores."""
    return psutil.cpu_count(logical=False) or os.cpu_count() or 1


@dataclass(frozen=True)
class Field:
    """One setting of the agent: where it comes from and how it is read.

    `parse` turns its variable's text into a value as the flag would hold it (the command line
    reads a flag's variable itself, cli/main.py `flag`; the agent reads it where no flag value
    is given, and a variable of no flag); `normalise` turns a value from any source into the
    field's value, raising ValueError with the problem (without the source); `default` is the
    value where no source gives one."""

    name: str
    flag: str | None = None
    env: str | None = None
    setting: str | None = None  # its key in settings.json
    parse: Callable[[str], Any] = str
    normalise: Callable[[Any], Any] = lambda value: value
    default: Callable[[], Any] = lambda: None


def _switch_field(name: str, flag: str, env: str) -> Field:
    return Field(name, flag=flag, env=env, parse=_switch, normalise=bool, default=lambda: False)


FIELDS = (
    Field(
        "model_dirs",
        flag="--model-dir",
        env="SPECFLEET_MODEL_DIRS",
        setting="model_dirs",  # chosen at enrolment
        parse=_paths,
        normalise=_model_dirs,
        default=tuple,  # none: jobs may name model files anywhere
    ),
    Field(
        "llama_server",
        flag="--llama-server",
        env="SPECFLEET_LLAMA_SERVER",
        setting="llama_server",
        normalise=_llama_server,  # None: the engine looks on PATH, then in this checkout's build
    ),
    Field(
        "llama_server_builds",  # further builds that sweeps may pin (their arms' server_build)
        env="SPECFLEET_LLAMA_SERVER_BUILDS",
        setting="llama_server_builds",
        parse=_paths,
        normalise=_llama_server_builds,
        default=tuple,
    ),
    Field("threads", env="SPECFLEET_THREADS", normalise=_threads, default=physical_cores),
    Field("metrics_port", flag="--metrics-port", env="SPECFLEET_AGENT_METRICS_PORT", parse=int, normalise=_port),
    _switch_field("allow_battery", "--allow-battery", "SPECFLEET_ALLOW_BATTERY"),
    _switch_field("ignore_doctor", "--ignore-doctor", "SPECFLEET_IGNORE_DOCTOR"),
    _switch_field("allow_downloads", "--allow-downloads", "SPECFLEET_ALLOW_DOWNLOADS"),
)
BY_FIELD = {f.name: f for f in FIELDS}


@dataclass(frozen=True)
class AgentConfig:
    """What the agent runs with (FIELDS), fixed at start; `config_dir` holds its credential,
    settings.json, spool and jobs."""

    config_dir: Path
    model_dirs: tuple[Path, ...] = ()
    llama_server: Path | None = None
    llama_server_builds: tuple[Path, ...] = ()
    threads: int = field(default_factory=physical_cores)
    metrics_port: int | None = None
    allow_battery: bool = False
    ignore_doctor: bool = False
    allow_downloads: bool = False

    @classmethod
    def load(
        cls,
        config_dir: Path | str | None = None,
        flags: Mapping[str, Any] | None = None,
        environ: Mapping[str, str] = os.environ,
    ) -> AgentConfig:
        """The configuration from `flags` (field name -> the command line's value, None or empty
        where not given), `environ` and `config_dir`'s settings.json (`config_dir` None: the
        default, default_config_dir). ValueError naming the first bad field and its source."""
        directory = Path(config_dir).expanduser() if config_dir else default_config_dir(environ)
        stored = settings_file.load(directory)
        values = {f.name: value_of(f, flags or {}, environ, stored, directory) for f in FIELDS}
        return cls(config_dir=directory, **values)


def value_of(f: Field, flags: Mapping[str, Any], environ: Mapping[str, str], stored: dict, config_dir: Path):
    """One field's value from the first source that gives one (module docstring), normalised;
    ValueError naming the field and that source when it is bad."""
    given = flags.get(f.name)
    text = environ.get(f.env, "").strip() if f.env else ""
    if not _unset(given):
        return _normalised(f, given, f"{f.env}={text!r}" if text and _holds(f, text, given) else f.flag or f.name)
    if text:
        return _normalised(f, text, f"{f.env}={text!r}", parse=True)
    if f.setting and f.setting in stored:
        return _normalised(f, stored[f.setting], f"{config_dir / settings_file.SETTINGS_FILE}'s {f.setting}")
    return f.default()


def _unset(given) -> bool:
    """Whether a flag's value says "not given": None, False (a switch left off) or empty."""
    return given is None or given is False or (isinstance(given, (str, list, tuple)) and not given)


def _holds(f: Field, text: str, given) -> bool:
    """Whether the flag's value is what its variable says (the command line took it from there)."""
    try:
        parsed = f.parse(text)
    except ValueError:
        return False
    return parsed == given or (isinstance(given, (list, tuple)) and list(map(str, given)) == parsed)


def _normalised(f: Field, value, source: str, parse: bool = False):
    try:
        return f.normalise(f.parse(value) if parse else value)
    except (ValueError, TypeError) as e:
        raise ValueError(f"{f.name} from {source}: {e}") from None


def load_field(name: str, config_dir: Path, flags: Mapping[str, Any] | None = None, environ=os.environ):
    """One field of the configuration AgentConfig.load would build, alone: `agent doctor` reports
    each bad field as its own check. ValueError naming the field and its source (or the
    settings.json file that cannot be read)."""
    return value_of(BY_FIELD[name], flags or {}, environ, settings_file.load(config_dir), config_dir)


def field_from_environment(name: str, environ: Mapping[str, str] = os.environ):
    """One field as a child of the agent sees it in its inherited environment (the agent's
    worker), by the same row: the variable's value, else the default."""
    return value_of(BY_FIELD[name], {}, environ, {}, Path())
