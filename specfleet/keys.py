"""TLS key files: one rule for every process that reads a private key."""

from __future__ import annotations

import logging
import os
from pathlib import Path

log = logging.getLogger(__name__)


def private_key_file(path: Path) -> None:
    """A TLS private key must be its owner's alone: one readable by group or others is made 0600,
    with a warning; one that cannot be made so is refused (ValueError saying what to do). The
    coordinator's key, an agent's stored one and the CLI's --tls-key alike."""
    try:
        mode = path.stat().st_mode
    except OSError as e:
        raise ValueError(f"cannot read the TLS key {path} ({e.strerror})") from None
    if not mode & 0o077:
        return
    try:
        os.chmod(path, 0o600)
    except OSError as e:
        raise ValueError(
            f"the TLS key {path} is readable by other users (mode {mode & 0o777:o}) and cannot be made 0600 "
            f"({e.strerror}): `chmod 600 {path}` as its owner, and replace the key if others may have read it"
        ) from None
    log.warning("TLS key %s was readable by other users (mode %o): made 0600", path, mode & 0o777)
