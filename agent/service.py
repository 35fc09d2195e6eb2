"""`specfleet agent install-service`: run the agent at login, restarted after a crash.

macOS: a LaunchAgent (deploy/com.specfleet.agent.plist) in ~/Library/LaunchAgents, loaded with
`launchctl bootstrap gui/<uid>`. Linux: a systemd user unit (deploy/specfleet-agent.service) in
~/.config/systemd/user, loaded with `systemctl --user daemon-reload && enable --now`. Where the
loader is missing or fails (no user session, a container) the file is still written and the
result says so, with the commands that load it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from string import Template
from xml.sax.saxutils import escape

from agent.config import xdg_config_home

ROOT = Path(__file__).resolve().parent.parent
# The templates: a checkout's deploy/, or the copy an installed wheel carries in agent/deploy/
# (pyproject.toml force-include), so that `uv tool install 'specfleet[agent]'` can install-service.
DEPLOY = next((d for d in (ROOT / "deploy", Path(__file__).parent / "deploy") if d.is_dir()), ROOT / "deploy")
LABEL = "com.specfleet.agent"
PLIST_TEMPLATE = "com.specfleet.agent.plist"
UNIT = "specfleet-agent.service"


@dataclass(frozen=True)
class Installed:
    path: Path
    loaded: bool
    message: str


def agent_command(config_dir: Path, run_args: list[str]) -> list[str]:
    return [sys.executable, "-m", "cli.main", "agent", "run", "--config-dir", str(config_dir), *run_args]


def _template(name: str) -> Template:
    path = DEPLOY / name
    if not path.exists():
        raise FileNotFoundError(f"service template {path} is missing: reinstall specfleet (or run from a checkout)")
    return Template(path.read_text())


def render_plist(command: list[str], log_path: Path, working_directory: Path = ROOT) -> str:
    arguments = "\n".join(f"        <string>{escape(arg)}</string>" for arg in command)
    return _template(PLIST_TEMPLATE).substitute(
        label=LABEL,
        program_arguments=arguments,
        working_directory=escape(str(working_directory)),
        log_path=escape(str(log_path)),
    )


def systemd_quote(arg: str) -> str:
    """One ExecStart word: quoted when it must be; % and $ escaped (systemd expands them)."""
    arg = arg.replace("%", "%%").replace("$", "$$")
    if arg and not any(c in arg for c in " \t\"\\'"):
        return arg
    return '"' + arg.replace("\\", "\\\\").replace('"', '\\"') + '"'


def render_unit(command: list[str], working_directory: Path = ROOT) -> str:
    return _template(UNIT).substitute(
        working_directory=systemd_quote(str(working_directory)), exec_start=" ".join(map(systemd_quote, command))
    )


def _attempt(run, cmd: list[str]) -> str | None:
    """Run a loader command; None when it worked, else what went wrong."""
    try:
        result = run(cmd, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError) as e:
        return f"`{' '.join(cmd)}` could not run: {e}"
    if result.returncode != 0:
        detail = (result.stderr or result.stdout or "").strip().splitlines()
        return f"`{' '.join(cmd)}` failed ({result.returncode}): {detail[-1] if detail else 'no output'}"
    return None


def install(
    config_dir: Path,
    run_args: list[str],
    platform: str = sys.platform,
    dest_dir: Path | None = None,
    log_dir: Path | None = None,
    load: bool = True,
    run: Callable = subprocess.run,
    which: Callable[[str], str | None] = shutil.which,
) -> Installed:
    """Write the service file for this platform and load it when possible."""
    command = agent_command(config_dir, run_args)
    if platform == "darwin":
        dest = dest_dir or Path.home() / "Library" / "LaunchAgents"
        logs = log_dir or Path.home() / "Library" / "Logs" / "specfleet"
        logs.mkdir(parents=True, exist_ok=True)
        path = dest / f"{LABEL}.plist"
        text = render_plist(command, logs / "agent.log")
        domain = f"gui/{os.getuid()}"
        loaders = [["launchctl", "bootstrap", domain, str(path)]]
        how = f"launchctl bootout {domain}/{LABEL}; launchctl bootstrap {domain} {path}"
        tool = "launchctl"
    elif platform.startswith("linux"):
        dest = dest_dir or xdg_config_home() / "systemd" / "user"
        path = dest / UNIT
        text = render_unit(command)
        loaders = [["systemctl", "--user", "daemon-reload"], ["systemctl", "--user", "enable", "--now", UNIT]]
        how = f"systemctl --user daemon-reload && systemctl --user enable --now {UNIT}"
        tool = "systemctl"
    else:
        raise ValueError(f"install-service supports macOS (launchd) and Linux (systemd), not {platform!r}")
    dest.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    if not load:
        return Installed(path, False, f"wrote {path}; not loaded (--no-load). To load it: {how}")
    if which(tool) is None:
        return Installed(path, False, f"wrote {path}, but could not load it: {tool} is not on this machine. {how}")
    if platform == "darwin":
        # A LaunchAgent loaded before must go first, or bootstrap refuses; failing here is fine.
        _attempt(run, ["launchctl", "bootout", f"{domain}/{LABEL}"])
    for cmd in loaders:
        problem = _attempt(run, cmd)
        if problem:
            return Installed(path, False, f"wrote {path}, but could not load it: {problem}. To load it later: {how}")
    return Installed(path, True, f"wrote {path} and loaded it ({tool}); the agent now starts at login")
