"""A throw-away PostgreSQL server on loopback for the storage tests.

``initdb`` + ``pg_ctl`` in a temporary folder, a free TCP port on 127.0.0.1 and the unix socket in
that folder. PostgreSQL refuses to run as root, so as root the server runs as the ``postgres``
user (Debian's package creates it) or, failing that, ``nobody``, via ``runuser``.

When the server cannot be started the tests are skipped with the reason, except in CI
(``ADAPTIVE_SPEC_REQUIRE_POSTGRES=1``, set by ``.ci/run``, or ``CI``), where they fail.
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
from pathlib import Path

import pytest

REQUIRED = os.environ.get("ADAPTIVE_SPEC_REQUIRE_POSTGRES") == "1" or os.environ.get("CI", "") not in ("", "0", "false")


def find_binary(name: str) -> str | None:
    """``name`` on PATH, else in Debian's /usr/lib/postgresql/<version>/bin (newest version)."""
    found = shutil.which(name)
    if found:
        return found
    candidates = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"), key=lambda p: int(p.split("/")[4]))
    return candidates[-1] if candidates else None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class PostgresServer:
    """Start with :meth:`start` (returns the SQLAlchemy URL), stop with :meth:`stop`."""

    def __init__(self) -> None:
        self.root: Path | None = None
        self.user: str | None = None
        self.pg_ctl: str | None = None
        self.url: str | None = None

    def _run(self, argv: list[str], timeout: float = 120) -> subprocess.CompletedProcess:
        if self.user is not None:
            argv = ["runuser", "-u", self.user, "--", *argv]
        return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)

    def start(self) -> str:
        """Initialise and start the server; raise RuntimeError with the reason when that fails."""
        initdb, pg_ctl = find_binary("initdb"), find_binary("pg_ctl")
        if not initdb or not pg_ctl:
            raise RuntimeError("initdb/pg_ctl not found (on PATH or in /usr/lib/postgresql/*/bin)")
        self.pg_ctl = pg_ctl
        self.root = Path(tempfile.mkdtemp(prefix="adaptive-spec-pg-"))
        if os.geteuid() == 0:
            for name in ("postgres", "nobody"):
                try:
                    entry = pwd.getpwnam(name)
                except KeyError:
                    continue
                self.user = name
                os.chown(self.root, entry.pw_uid, entry.pw_gid)
                break
            else:
                raise RuntimeError("running as root and there is neither a 'postgres' nor a 'nobody' user")
            if not shutil.which("runuser"):
                raise RuntimeError("running as root and 'runuser' is missing")
        os.chmod(self.root, 0o700)
        data, log = self.root / "data", self.root / "server.log"
        init = self._run([initdb, "-D", str(data), "-U", "tuner", "--auth=trust", "-E", "UTF8", "--no-sync"])
        if init.returncode != 0:
            raise RuntimeError(f"initdb failed: {(init.stderr or init.stdout).strip()[-500:]}")
        port = _free_port()
        options = f"-p {port} -k {self.root} -c listen_addresses=127.0.0.1 -c fsync=off -c max_connections=50"
        started = self._run([pg_ctl, "-D", str(data), "-l", str(log), "-o", options, "-w", "-t", "60", "start"])
        if started.returncode != 0:
            tail = log.read_text()[-500:] if log.exists() else ""
            raise RuntimeError(f"pg_ctl start failed: {(started.stderr or started.stdout).strip()[-300:]} {tail}")
        self.url = f"postgresql+psycopg2://tuner@127.0.0.1:{port}/postgres"
        return self.url

    def stop(self) -> None:
        if self.root is None:
            return
        if self.pg_ctl and (self.root / "data" / "postmaster.pid").exists():
            self._run([self.pg_ctl, "-D", str(self.root / "data"), "-m", "immediate", "-w", "stop"], timeout=60)
        shutil.rmtree(self.root, ignore_errors=True)
        self.root = None


@pytest.fixture(scope="session")
def postgres_url():
    """SQLAlchemy URL of a fresh PostgreSQL server (skipped, or failed in CI, when none can start)."""
    server = PostgresServer()
    try:
        url = server.start()
    except (RuntimeError, OSError, subprocess.TimeoutExpired) as err:
        server.stop()
        reason = f"PostgreSQL server could not be started: {err}"
        print(reason)
        if REQUIRED:
            pytest.fail(reason + " (required in CI)")
        pytest.skip(reason)
    yield url
    server.stop()
