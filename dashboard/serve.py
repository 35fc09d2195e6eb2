"""Start Streamlit on the dashboard app, pointed at a coordinator."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

APP = Path(__file__).with_name("app.py")


def command(port: int, host: str = "127.0.0.1") -> list[str]:
    return [
        sys.executable,
        "-m",
        "streamlit",
        "run",
        str(APP),
        "--server.headless=true",
        f"--server.port={port}",
        f"--server.address={host}",
        "--browser.gatherUsageStats=false",
    ]


def environment(coordinator: str, admin_token: str) -> dict[str, str]:
    root = str(Path(__file__).resolve().parent.parent)
    return {
        **os.environ,
        "SPECFLEET_COORDINATOR": coordinator,
        "SPECFLEET_ADMIN_TOKEN": admin_token,
        "PYTHONPATH": os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")])),
    }


def serve(coordinator: str, admin_token: str, port: int, host: str = "127.0.0.1") -> int:
    return subprocess.call(command(port, host), env=environment(coordinator, admin_token))
