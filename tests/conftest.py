"""Shared fixtures. ``prometheus_factory`` starts REAL Prometheus servers backfilled from a
history frame (see ``tests/prom_server.py``); they are stopped at the end of the session."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator

import pandas as pd
import pytest
from hypothesis import settings as hypothesis_settings
from prom_server import PrometheusMissingError, PromServer, find_binaries

# CI explores the same examples on every run (reproducible); locally they vary and find more
hypothesis_settings.register_profile("ci", derandomize=True, print_blob=True)
if os.environ.get("CI"):
    hypothesis_settings.load_profile("ci")


@pytest.fixture
def cli(capsys: pytest.CaptureFixture[str]) -> Callable[[list[str]], tuple[int, str, str]]:
    """Run the ``idlegpu`` command in-process: ``cli(args) -> (exit code, stdout, stderr)``."""
    from scheduler.cli import main

    def run(args: list[str]) -> tuple[int, str, str]:
        try:
            main(args)
            code = 0
        except SystemExit as exc:
            code = exc.code or 0
        captured = capsys.readouterr()
        return code, captured.out, captured.err

    return run


@pytest.fixture(scope="session")
def prometheus_binaries() -> tuple[str, str]:
    """``(prometheus, promtool)``; fails loudly (never skips) when they are not installed."""
    try:
        return find_binaries()
    except PrometheusMissingError as exc:
        pytest.fail(f"Prometheus tests need a real server: {exc}", pytrace=False)


@pytest.fixture(scope="session")
def prometheus_factory(
    tmp_path_factory: pytest.TempPathFactory, prometheus_binaries: tuple[str, str]
) -> Iterator[Callable[..., PromServer]]:
    """``start(history, name="prom") -> PromServer``: backfill ``history`` into a fresh data
    directory and serve it on a free loopback port; ``.url`` is its address."""
    servers: list[PromServer] = []

    def start(history: pd.DataFrame, *, name: str = "prom", **kwargs: object) -> PromServer:
        server = PromServer.from_history(history, tmp_path_factory.mktemp(name), **kwargs)
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.stop()


# ---- a REAL PostgreSQL server (tests/pg_server.py): postgres_url, fresh_postgres_url -----------
from pg_server import fresh_postgres_url, postgres_server, postgres_url  # noqa: E402, F401
