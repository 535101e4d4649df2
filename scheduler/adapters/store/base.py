"""The store's engine and transactions: the SQLite or PostgreSQL engine for a URL, one
transaction per call (``StoreBase._tx``), and what every part of the store shares."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Self

import sqlalchemy as sa
from sqlalchemy import exc as sa_exc
from sqlalchemy.engine import Connection, Engine

from idlegpu.scheduler.adapters.store.codec import _short
from idlegpu.scheduler.adapters.store.errors import StoreError, StoreUnavailableError
from idlegpu.scheduler.adapters.store.schema import SCHEMA_VERSION_TABLE, STORE_META


def _make_engine(url: str, busy_timeout_s: float) -> Engine:
    try:
        parsed = sa.engine.make_url(url)
    except sa_exc.ArgumentError as exc:
        raise StoreError(f"invalid store URL {url!r}: {exc}") from None
    backend = parsed.get_backend_name()
    try:
        if backend == "sqlite":
            db = parsed.database
            if db and db != ":memory:" and not db.startswith("file:"):
                parent = Path(db).expanduser().resolve().parent
                if not parent.is_dir():
                    raise StoreError(
                        f"store directory {parent} does not exist; create it or set store.url"
                    )
            engine = sa.create_engine(parsed, connect_args={"timeout": busy_timeout_s})
            _configure_sqlite(engine, busy_timeout_s)
        else:
            engine = sa.create_engine(parsed, pool_pre_ping=True)
    except (ImportError, sa_exc.NoSuchModuleError) as exc:
        raise StoreError(
            f"cannot load the database driver for {parsed.drivername}: {exc}; install it "
            "(for PostgreSQL: pip install 'psycopg[binary]' and use postgresql+psycopg://...)"
        ) from None
    return engine


def _configure_sqlite(engine: Engine, busy_timeout_s: float) -> None:
    """Real transactions on pysqlite: the driver's own BEGIN handling is off (it would commit
    DDL implicitly and start transactions late); we BEGIN ourselves, IMMEDIATE for writes so a
    read-then-write transaction never fails half-way on a lock upgrade."""

    @sa.event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn: Any, _record: Any) -> None:
        dbapi_conn.isolation_level = None
        cursor = dbapi_conn.cursor()
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.execute(f"PRAGMA busy_timeout={int(busy_timeout_s * 1000)}")
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.close()

    @sa.event.listens_for(engine, "begin")
    def _on_begin(conn: Connection) -> None:
        write = conn.get_execution_options().get("idlegpu_write", False)
        conn.exec_driver_sql("BEGIN IMMEDIATE" if write else "BEGIN")


class StoreBase:
    """What every part of ``JobStore`` stands on: its engine, its redacted URL and one
    transaction per call (``_tx``); the store's identity and schema version."""

    url: str
    _where: str
    _engine: Engine

    def close(self) -> None:
        self._engine.dispose()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @contextmanager
    def _tx(self, *, write: bool) -> Iterator[Connection]:
        try:
            with self._engine.connect() as conn:
                if write:
                    conn.execution_options(idlegpu_write=True)
                with conn.begin():
                    yield conn
        except sa_exc.IntegrityError:
            raise
        except sa_exc.OperationalError as exc:
            raise StoreUnavailableError(
                f"job store {self._where} unavailable: {_short(exc)}", delay=5.0
            ) from exc
        except sa_exc.DBAPIError as exc:
            raise StoreError(f"job store {self._where}: {_short(exc)}") from exc

    def store_id(self) -> str:
        """This store's random identity (8 hex digits), made once when it was created."""
        with self._tx(write=False) as conn:
            return conn.execute(
                sa.select(STORE_META.c.value).where(STORE_META.c.key == "store_id")
            ).scalar_one()

    @property
    def location(self) -> str:
        """Where the store is (its URL, without its credentials: ``forecast.redact``)."""
        return self._where

    def schema_version(self) -> int:
        with self._tx(write=False) as conn:
            return conn.execute(
                sa.select(sa.func.max(SCHEMA_VERSION_TABLE.c.version))
            ).scalar() or 0
