"""A REAL PostgreSQL server for tests, and the ``postgres_url`` session fixture.

    server = PostgresServer().start()         # initdb into a temp dir, a free port
    url = server.create_database("jobs")      # postgresql+psycopg://postgres@127.0.0.1:PORT/jobs
    server.stop()                             # stops exactly the server start() started

Debian's ``postgresql`` package provides the binaries (``/usr/lib/postgresql/<major>/bin``;
``PG_BIN`` names another directory). PostgreSQL refuses to run as root, so when the tests run
as root the server runs as the ``postgres`` user (``runuser -u postgres --``), in a temp dir
outside pytest's (root-only) tmp tree. It listens on 127.0.0.1 and on a unix socket in its
own directory, trusts local connections, and trades durability for speed (``fsync=off``):
test data only.
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest


class PostgresMissingError(RuntimeError):
    pass


def find_bin_dir() -> Path:
    """The directory of ``initdb``, ``pg_ctl`` and ``postgres`` (newest major first)."""
    named = os.environ.get("PG_BIN")
    candidates = [named] if named else sorted(
        glob.glob("/usr/lib/postgresql/*/bin"), key=lambda p: int(Path(p).parent.name),
        reverse=True)
    for directory in candidates:
        if directory and all((Path(directory) / b).is_file() for b in ("initdb", "pg_ctl")):
            return Path(directory)
    raise PostgresMissingError(
        "no PostgreSQL server binaries (initdb, pg_ctl) under /usr/lib/postgresql/*/bin or "
        "$PG_BIN: install Debian's postgresql (apt-get install postgresql)")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class PostgresServer:
    def __init__(self, bin_dir: Path | None = None) -> None:
        self.bin_dir = bin_dir
        self.dir: Path | None = None
        self.port: int | None = None
        self._started = False
        self._as_postgres = os.geteuid() == 0

    # ------------------------------------------------------------------ commands
    def _cmd(self, binary: str, *args: str) -> list[str]:
        cmd = [str(self.bin_dir / binary), *args]
        return ["runuser", "-u", "postgres", "--", *cmd] if self._as_postgres else cmd

    def _run(self, binary: str, *args: str, timeout: float = 120) -> str:
        proc = subprocess.run(self._cmd(binary, *args), capture_output=True, text=True,
                              timeout=timeout, stdin=subprocess.DEVNULL, check=False)
        if proc.returncode != 0:
            raise RuntimeError(f"{binary} {' '.join(args)} failed ({proc.returncode}): "
                               f"{proc.stdout[-2000:]}{proc.stderr[-2000:]}{self.log_tail()}")
        return proc.stdout

    @property
    def data(self) -> Path:
        return self.dir / "data"

    @property
    def log(self) -> Path:
        return self.dir / "postgres.log"

    def log_tail(self, chars: int = 2000) -> str:
        try:
            return "\n--- postgres.log:\n" + self.log.read_text(errors="replace")[-chars:]
        except (OSError, TypeError):
            return ""

    # ------------------------------------------------------------------ start / stop
    def start(self, timeout: float = 60) -> PostgresServer:
        self.bin_dir = self.bin_dir or find_bin_dir()
        self.dir = Path(tempfile.mkdtemp(prefix="idlegpu-pg-"))
        if self._as_postgres:
            pw = pwd.getpwnam("postgres")
            os.chown(self.dir, pw.pw_uid, pw.pw_gid)
        self._run("initdb", "-D", str(self.data), "-U", "postgres", "--auth=trust",
                  "-E", "UTF8", "--locale=C", "--no-sync")
        for _attempt in range(3):  # a probed free port can be taken before the server binds
            self.port = free_port()
            options = (f"-p {self.port} -k {self.dir} -c listen_addresses=127.0.0.1 "
                       "-c fsync=off -c synchronous_commit=off -c full_page_writes=off "
                       "-c max_connections=100")
            try:
                self._run("pg_ctl", "start", "-D", str(self.data), "-l", str(self.log), "-w",
                          "-t", str(int(timeout)), "-o", options, timeout=timeout + 10)
            except RuntimeError:
                if "already in use" in self.log_tail(20000):
                    continue
                raise
            self._started = True
            return self
        raise RuntimeError(f"PostgreSQL could not bind a free port{self.log_tail()}")

    def stop(self) -> None:
        """Stop the server this object started (fast shutdown), then remove its files."""
        if self._started:
            self._started = False
            try:
                self._run("pg_ctl", "stop", "-D", str(self.data), "-m", "fast", "-w",
                          "-t", "30", timeout=45)
            except (RuntimeError, subprocess.TimeoutExpired):
                self._run("pg_ctl", "stop", "-D", str(self.data), "-m", "immediate", "-w",
                          timeout=45)
        if self.dir is not None:
            shutil.rmtree(self.dir, ignore_errors=True)
            self.dir = None

    def __enter__(self) -> PostgresServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ------------------------------------------------------------------ databases
    def url(self, database: str = "postgres") -> str:
        return f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/{database}"

    def create_database(self, name: str) -> str:
        """Create database ``name``; return its SQLAlchemy URL."""
        import psycopg

        with psycopg.connect(host="127.0.0.1", port=self.port, user="postgres",
                             dbname="postgres", autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        return self.url(name)


_counter = iter(range(1_000_000))


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[PostgresServer]:
    """One real PostgreSQL server per test session (skipped without the binaries, failed when
    ``CI`` is set)."""
    try:
        find_bin_dir()
    except PostgresMissingError as exc:
        if os.environ.get("CI"):
            pytest.fail(f"the PostgreSQL tests need a real server: {exc}", pytrace=False)
        pytest.skip(str(exc))
    server = PostgresServer().start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def postgres_url(postgres_server: PostgresServer) -> str:
    """The SQLAlchemy URL of an empty database on the session's server."""
    return postgres_server.create_database(f"idlegpu_{next(_counter)}")


@pytest.fixture
def fresh_postgres_url(postgres_server: PostgresServer) -> str:
    """A new empty database per test, on the session's server."""
    return postgres_server.create_database(f"idlegpu_t{next(_counter)}_{time.time_ns()}")
