"""A PostgreSQL cluster of our own for the lake store's catalog, for `specfleet demo --store lake`,
the tests (tests/support/postgres.py) and bench/: initdb in a directory, the server on a free
loopback port (and a socket directory of its own), stopped by its pid. PostgreSQL refuses to run
as root: as root, the cluster runs as the `postgres` user that the Debian package creates
(scripts/setup.sh installs it)."""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

BIN_DIRS = [Path(f"/usr/lib/postgresql/{v}/bin") for v in (17, 16, 15)]
START_SECONDS = 30.0


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now (another process may take it before the server binds it,
    which the start-up's wait reports)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def bin_dir() -> Path | None:
    """Where initdb and postgres are (Debian's versioned directory, else PATH), or None."""
    for d in BIN_DIRS:
        if (d / "initdb").exists():
            return d
    found = shutil.which("initdb")
    return Path(found).parent if found else None


@dataclass
class Cluster:
    port: int
    directory: Path
    process: subprocess.Popen

    def url(self, database: str = "postgres") -> str:
        """The libpq URI of a database of this cluster."""
        return f"postgresql://postgres@127.0.0.1:{self.port}/{database}"

    def store(self, data_path: Path, database: str = "postgres") -> str:
        """The coordinator's --store for a lake with its catalog in `database`."""
        return f"ducklake:postgres://postgres@127.0.0.1:{self.port}/{database}?data_path={data_path}"

    def create_database(self, name: str) -> None:
        _run([str(bin_dir() / "createdb"), "-h", "127.0.0.1", "-p", str(self.port), "-U", "postgres", name])


def _as_owner() -> dict:
    """Popen arguments that run a PostgreSQL program as a user it accepts."""
    if os.getuid() != 0:
        return {}
    user = pwd.getpwnam("postgres")
    return {"user": user.pw_uid, "group": user.pw_gid, "extra_groups": []}


def _run(args: list[str]) -> None:
    result = subprocess.run(args, capture_output=True, text=True, timeout=120, **_as_owner())
    if result.returncode:
        raise RuntimeError(f"{' '.join(args[:1])} failed ({result.returncode}): {result.stderr.strip()}")


@contextlib.contextmanager
def cluster(keep: Path | None = None) -> Iterator[Cluster]:
    """A PostgreSQL server on 127.0.0.1 for the block, trust authentication, stopped by its pid
    with SIGINT (fast shutdown; SIGKILL after 10 s). Its files in `keep` (made once, kept for
    the next time: the demo's), else in a temporary directory of its own, removed afterwards (a
    test's tmp_path is closed to other users than root)."""
    binaries = bin_dir()
    if binaries is None:
        raise RuntimeError("no PostgreSQL server here (initdb): run scripts/setup.sh, which installs it")
    directory = keep or Path(tempfile.mkdtemp(prefix="specfleet-pg-"))
    directory.mkdir(parents=True, exist_ok=True)
    if os.getuid() == 0:
        user = pwd.getpwnam("postgres")
        os.chown(directory, user.pw_uid, user.pw_gid)
    data = directory / "data"
    if not (data / "PG_VERSION").exists():
        _run([str(binaries / "initdb"), "-D", str(data), "-U", "postgres", "--auth=trust", "-E", "UTF8", "--no-sync"])
    port = free_port()
    log = open(directory / "postgres.log", "a")
    process = subprocess.Popen(
        [str(binaries / "postgres"), "-D", str(data), "-p", str(port), "-k", str(directory)]
        + ["-c", "listen_addresses=127.0.0.1", "-c", "fsync=off", "-c", "max_connections=200"],
        stdout=log,
        stderr=subprocess.STDOUT,
        **_as_owner(),
    )
    try:
        _wait_ready(binaries, port, process, directory)
        yield Cluster(port, directory, process)
    finally:
        process.send_signal(signal.SIGINT)  # fast shutdown: open sessions are ended
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(10)
        log.close()
        if keep is None:
            shutil.rmtree(directory, ignore_errors=True)


def _wait_ready(binaries: Path, port: int, process: subprocess.Popen, directory: Path) -> None:
    deadline = time.monotonic() + START_SECONDS
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"postgres exited ({process.returncode}): see {directory / 'postgres.log'}")
        ready = subprocess.run(
            [str(binaries / "pg_isready"), "-h", "127.0.0.1", "-p", str(port), "-q"], capture_output=True
        )
        if ready.returncode == 0:
            return
        time.sleep(0.1)
    raise RuntimeError(f"postgres did not accept connections within {START_SECONDS:g} s")
