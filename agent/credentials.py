"""Where the agent keeps its credential: a 0600 JSON file in the user's config directory, made
0600 again whenever it is read."""

from __future__ import annotations

import dataclasses
import json
import logging
import os
from dataclasses import asdict, dataclass
from pathlib import Path

from specfleet.keys import private_key_file

log = logging.getLogger("specfleet.agent")

CREDENTIAL_FILE = "agent.json"


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
        """The ca/cert/key keyword arguments of specfleet.client.channel; the key is made 0600
        first if others could read it (private_key_file)."""
        if self.tls_key:
            private_key_file(Path(self.tls_key))
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
        """The stored identity; a ValueError naming the file and what is wrong with it."""
        path = config_dir / CREDENTIAL_FILE
        if not path.exists():
            raise FileNotFoundError(f"no agent credential at {path}: run `specfleet agent enrol` first")
        try:
            fields = json.loads(read_private(path))
        except (OSError, ValueError) as e:
            why = e.strerror if isinstance(e, OSError) else f"not valid JSON: {e}"
            raise ValueError(f"cannot read the agent credential {path} ({why}); fix it or enrol again") from None
        names = {f.name for f in dataclasses.fields(cls)}
        required = {f.name for f in dataclasses.fields(cls) if f.default is dataclasses.MISSING}
        if not isinstance(fields, dict) or not required <= set(fields) or not set(fields) <= names:
            raise ValueError(
                f"{path} is not an agent credential (an object with {', '.join(sorted(required))}); enrol again"
            )
        return cls(**fields)


def read_private(path: Path) -> str:
    """A secret file's text; the file is made 0600 (owner only) first if it was not, with a warning:
    its content may have been read by others."""
    fd = os.open(path, os.O_RDONLY)
    with os.fdopen(fd) as f:
        if os.fstat(fd).st_mode & 0o077:
            os.fchmod(fd, 0o600)
            log.warning("%s was readable by other users: made 0600 (revoke it if others could read it)", path)
        return f.read()
