"""What ``idlegpu serve`` (the job API) and ``idlegpu token`` (its tokens) do (their
signatures: ``idlegpu.scheduler.cli.server``). The server and the job store come with the
server and daemon extras: the functions import them."""

from __future__ import annotations

import getpass
import logging
import re
import socket
from datetime import timedelta
from pathlib import Path

import typer

from idlegpu.forecast.errors import ConfigError
from idlegpu.forecast.sources import read_history
from idlegpu.forecast.tables import iso_time
from idlegpu.scheduler.cli.common import (
    DEFAULT_CONFIG,
    _now,
    console,
    err_console,
)
from idlegpu.scheduler.cli.inputs import (
    _load_settings,
    _optional_config,
    _store_url,
)
from idlegpu.scheduler.clock import ReplayClock
from idlegpu.scheduler.output import Column, emit
from idlegpu.scheduler.specs import SpecError, parse_duration

_NAME = re.compile(r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")


def _cli_actor() -> tuple[str, str]:
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = "unknown"
    return f"cli:{user}", f"local ({socket.gethostname()})"


def serve(*, config: Path | None, store: str | None, host: str | None, port: int | None,
          now: str | None, history: Path | None) -> None:
    """``idlegpu serve``."""
    import uvicorn

    from idlegpu.scheduler.adapters.store import JobStore
    from idlegpu.scheduler.server import create_server

    path = config if config is not None else DEFAULT_CONFIG
    if not Path(path).is_file():
        raise ConfigError(f"idlegpu serve needs the pool's config ({path} not found); pass "
                          "--config idlegpu.yaml")
    settings = _load_settings(path)
    if not logging.getLogger().handlers:
        logging.basicConfig(level=logging.INFO,
                            format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("idlegpu").setLevel(logging.INFO)
    job_store = JobStore(_store_url(settings, store))
    try:
        clock = None
        if now is not None:
            clock = ReplayClock(_now(now))
        forecasts = None
        if history is not None:
            from idlegpu.scheduler.api.forecasts import Forecasts

            forecasts = Forecasts(settings, read_history(history))
        application = create_server(settings, job_store, clock=clock, forecasts=forecasts)
        bind_host = host or settings.api.host
        bind_port = settings.api.port if port is None else port
        err_console.print(f"job API on http://{bind_host}:{bind_port}/v1 (docs at /docs), "
                          f"web console at http://{bind_host}:{bind_port}/, store "
                          f"{job_store!r}", highlight=False, markup=False)
        # proxy_headers off: the peer address is the connection's, so only api.trusted_proxies
        # decides whose forwarded headers count
        uvicorn.run(application, host=bind_host, port=bind_port, proxy_headers=False,
                    log_level="info", access_log=True)
    finally:
        job_store.close()


def _expiry(text: str) -> timedelta | None:
    if text.strip().lower() in ("never", "none"):
        return None
    try:
        seconds = parse_duration(text)
    except (SpecError, ValueError) as exc:
        raise typer.BadParameter(f"{text!r}: {exc}; use a duration such as 30d, 12h or never",
                                 param_hint="--expires") from None
    if not 0 < seconds <= 10 * 366 * 86400:
        raise typer.BadParameter(f"{text!r}: use a duration from 1s to 10 years, or never",
                                 param_hint="--expires")
    return timedelta(seconds=seconds)


def token_create(*, team: str, name: str, role: str, expires: str, config: Path | None,
                 store: str | None, now: str | None) -> None:
    """``idlegpu token create``."""
    from idlegpu.scheduler.adapters.store import AuditEntry, JobStore
    from idlegpu.scheduler.api.auth import ROLES, new_token, token_sha256

    if role not in ROLES:
        raise typer.BadParameter(f"{role!r}: use one of {', '.join(ROLES)}", param_hint="--role")
    if not _NAME.fullmatch(name) or len(name) > 63:
        raise typer.BadParameter(f"{name!r}: use lowercase letters, digits, '-' and '.' (at "
                                 "most 63)", param_hint="--name")
    if not re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", team) or len(team) > 63:
        raise typer.BadParameter(f"{team!r}: use lowercase letters, digits and '-', e.g. "
                                 "alignment", param_hint="--team")
    valid_for = _expiry(expires)
    settings = _optional_config(config)
    when = _now(now)
    expires_at = when + valid_for if valid_for is not None else None
    token = new_token()
    actor, where = _cli_actor()
    with JobStore(_store_url(settings, store)) as job_store:
        job_store.create_api_token(
            name, team, role, token_sha256(token), when, expires_at,
            AuditEntry(at=when, actor=actor, auth="cli", role="operator", team=None,
                       action="token.create", target=name, address=where,
                       detail={"team": team, "role": role,
                               "expires_at": expires_at.isoformat() if expires_at else None}))
    zone = settings.pool.timezone if settings is not None else "UTC"
    until = f"until {iso_time(expires_at, zone)}" if expires_at else "with no expiry"
    err_console.print(f"token {name} for team {team} ({role}), valid {until}; it is shown "
                      "once, here, and stored only hashed:", highlight=False, markup=False)
    print(token)


def token_list(*, config: Path | None, store: str | None) -> None:
    """``idlegpu token list``."""
    from idlegpu.scheduler.adapters.store import JobStore

    settings = _optional_config(config)
    with JobStore(_store_url(settings, store)) as job_store:
        rows = job_store.api_tokens()
    if not rows:
        console.print("no tokens; `idlegpu token create --team T --name N` makes one")
        return
    when = _now(None)
    zone = settings.pool.timezone if settings is not None else "UTC"  # the CLI's one rule
    listed = [{"name": r.name, "team": r.team, "role": r.role,
               "created": iso_time(r.created_at, zone),
               "expires": iso_time(r.expires_at, zone) if r.expires_at else "never",
               "state": ("revoked" if r.revoked_at else "expired" if not r.valid_at(when)
                         else "valid")} for r in rows]
    # the list commands' tables (idlegpu.scheduler.output): names and times never cut
    emit(console, listed, [Column("name", "name", identifier=True), Column("team", "team"),
                           Column("role", "role"), Column("created", "created", identifier=True),
                           Column("expires", "expires", identifier=True),
                           Column("state", "state")], "table",
         title=f"job API tokens ({len(rows)})")


def token_revoke(*, name: str, config: Path | None, store: str | None) -> None:
    """``idlegpu token revoke``."""
    from idlegpu.scheduler.adapters.store import AuditEntry, JobStore

    settings = _optional_config(config)
    when = _now(None)
    actor, where = _cli_actor()
    with JobStore(_store_url(settings, store)) as job_store:
        row = job_store.revoke_api_token(name, when, AuditEntry(
            at=when, actor=actor, auth="cli", role="operator", team=None,
            action="token.revoke", target=name, address=where))
    console.print(f"token {row.name} ({row.team}, {row.role}) is revoked", markup=False,
                  highlight=False)
