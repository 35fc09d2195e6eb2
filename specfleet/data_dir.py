"""The files a coordinator keeps in its data directory for other processes to read: the admin
credential (admin.token, 0600) and the endpoints it serves (coordinator.json), and where a
client finds its coordinator from them (`coordinator_address`). In the kernel, apart from
coordinator/server.py, so that the CLI and the dashboard read them without importing the server
(gRPC services, the store, scipy for /metrics: over a second of start-up per admin command)."""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger("specfleet.coordinator")

ADMIN_TOKEN_FILE = "admin.token"
ENDPOINTS_FILE = "coordinator.json"
DEFAULT_COORDINATOR = "127.0.0.1:50551"
EXPLICIT = "--coordinator or SPECFLEET_COORDINATOR"


def default_data_dir() -> Path:
    """Where a coordinator keeps its data, and clients look for it, unless told otherwise."""
    return Path(os.environ.get("XDG_DATA_HOME", Path.home() / ".local/share")) / "specfleet"


@dataclass(frozen=True)
class Address:
    """The coordinator a client dials and where that address came from, for its errors."""

    address: str
    source: str  # EXPLICIT, "coordinator.json in DIR", or "the default: no coordinator.json in DIR"


def coordinator_address(explicit: str | None, data_dir: Path) -> Address:
    """`explicit` (--coordinator, SPECFLEET_COORDINATOR) when given, else the gRPC address the
    coordinator wrote to data_dir's coordinator.json (a wildcard host dialled on loopback), else
    DEFAULT_COORDINATOR."""
    if explicit:
        return Address(explicit, EXPLICIT)
    path = data_dir / ENDPOINTS_FILE
    try:
        address = json.loads(path.read_text())["grpc"]
        host, port = str(address).rsplit(":", 1)
    except (OSError, ValueError, KeyError, TypeError):
        return Address(DEFAULT_COORDINATOR, f"the default: no readable {ENDPOINTS_FILE} in {data_dir}")
    host = "127.0.0.1" if host in ("", "0.0.0.0", "::", "[::]") else host
    return Address(f"{host}:{port}", f"{path}")


def admin_credential(data_dir: Path) -> str | None:
    """The admin credential in data_dir's admin.token, None without one; the file is made 0600
    if it was not. A file that cannot be read is a ValueError naming it and why."""
    path = data_dir / ADMIN_TOKEN_FILE
    if not path.exists():
        return None
    try:
        fd = os.open(path, os.O_RDONLY)
        with os.fdopen(fd) as f:
            _make_private(fd, path)
            return f.read().strip() or None
    except (OSError, UnicodeDecodeError) as e:
        why = e.strerror if isinstance(e, OSError) else "not text"
        raise ValueError(f"cannot read the admin credential {path} ({why})") from None


def write_private(path: Path, text: str) -> None:
    """text written to path, which is made (or left) 0600."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)  # the mode applies to a new file only
    with os.fdopen(fd, "w") as f:
        _make_private(fd, path)
        f.write(text)


def _make_private(fd: int, path: Path) -> None:
    if os.fstat(fd).st_mode & 0o077:
        os.fchmod(fd, 0o600)
        log.warning("%s was readable by other users: made 0600", path)
