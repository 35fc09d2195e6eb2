"""Where the agent keeps its credential: a 0600 JSON file in the user's config directory."""

from __future__ import annotations

import json
import os
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

CREDENTIAL_FILE = "agent.json"


def default_config_dir() -> Path:
    if env := os.environ.get("SPECFLEET_CONFIG_DIR"):
        return Path(env)
    if sys.platform == "darwin":
        return Path.home() / "Library" / "Application Support" / "specfleet"
    return Path(os.environ.get("XDG_CONFIG_HOME", Path.home() / ".config")) / "specfleet"


@dataclass(frozen=True)
class AgentIdentity:
    coordinator: str
    agent_id: str
    name: str
    credential: str
    heartbeat_interval_seconds: float
    tls_ca: str | None = None
    tls_cert: str | None = None  # client certificate and key, for a coordinator that requires mTLS
    tls_key: str | None = None

    def tls_files(self) -> dict[str, Path | None]:
        """The ca/cert/key keyword arguments of agent.api.channel."""
        return {
            k: Path(v) if v else None for k, v in (("ca", self.tls_ca), ("cert", self.tls_cert), ("key", self.tls_key))
        }

    def save(self, config_dir: Path) -> Path:
        config_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        path = config_dir / CREDENTIAL_FILE
        tmp = path.with_suffix(".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump(asdict(self), f, indent=2)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        return path

    @classmethod
    def load(cls, config_dir: Path) -> AgentIdentity:
        path = config_dir / CREDENTIAL_FILE
        if not path.exists():
            raise FileNotFoundError(f"no agent credential at {path}: run `specfleet agent enrol` first")
        if path.stat().st_mode & 0o077:
            raise PermissionError(f"{path} is readable by other users; run `chmod 600 {path}`")
        return cls(**json.loads(path.read_text()))
