"""Free loopback ports for servers a test starts."""

from __future__ import annotations

import socket


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now (the kernel's choice; another process may take it before
    the caller binds it, which the callers' start-up checks report)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
