"""The files a coordinator keeps in its data directory for other processes to read: the admin
credential (admin.token, 0600) and the endpoints it serves (coordinator.json). Apart from
coordinator/server.py so that the CLI reads them without importing the server (gRPC services,
the store, scipy for /metrics: over a second of start-up per admin command)."""

from __future__ import annotations

import logging
import os
from pathlib import Path

log = logging.getLogger("specfleet.coordinator")

ADMIN_TOKEN_FILE = "admin.token"
ENDPOINTS_FILE = "coordinator.json"


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
