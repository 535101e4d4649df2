"""``idlegpu serve`` (the job API) and ``idlegpu token`` (its tokens). The commands'
signatures; what they do is ``idlegpu.scheduler.cli.actions.server``, imported when one of them
runs (the server and the job store, of the server and daemon extras, with it), not for their
``--help``."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from idlegpu.scheduler.cli.common import (
    OptionalConfig,
    StoreOption,
)
from idlegpu.scheduler.cli.registry import command_group

# this module's commands: the root loads it to run one or show its help (registry.COMMANDS)
app = command_group()

token_app = typer.Typer(help="Tokens of the job API (idlegpu serve): create, list, revoke.",
                        no_args_is_help=True, rich_markup_mode=None)
app.add_typer(token_app, name="token", short_help="Tokens of the job API: create, list, revoke.")


@app.command(short_help="The job API: an authenticated HTTP front door to the job store.")
def serve(
    config: OptionalConfig = None,
    store: StoreOption = None,
    host: Annotated[str | None, typer.Option(help="Address to listen on (default: api.host, "
                                                     "127.0.0.1).")] = None,
    port: Annotated[int | None, typer.Option(help="Port (default: api.port, 8080).")] = None,
    now: Annotated[str | None, typer.Option(
        help="Demos and replays: the server's clock starts at this time (it stamps "
             "submitted_at), like `idlegpu run --now`.")] = None,
    history: Annotated[Path | None, typer.Option(
        "--history", "-H", help="Plan, windows and forecast from this recorded history, "
        "replayed at the server's clock (like `idlegpu run --once --history --now`), instead "
        "of Prometheus.")] = None,
) -> None:
    """Serve the job API (routes under /v1, OpenAPI at /docs) with this config's admission
    rules, identities and teams, in front of the job store; run it beside `idlegpu run`."""
    from idlegpu.scheduler.cli.actions import server as actions  # the job API, the store

    actions.serve(config=config, store=store, host=host, port=port, now=now, history=history)


@token_app.command("create")
def token_create(
    team: Annotated[str, typer.Option(help="The team the token acts for.")],
    name: Annotated[str, typer.Option(help="A unique name (who or what holds it).")],
    role: Annotated[str, typer.Option(help="member (submit, cancel the team's work), operator "
                                           "(cancel anyone's, read the audit log) or viewer "
                                           "(read only).")] = "member",
    expires: Annotated[str, typer.Option(help="Valid for this long (30d, 12h) or never.")] = "90d",
    config: OptionalConfig = None,
    store: StoreOption = None,
    now: Annotated[str | None, typer.Option(hidden=True)] = None,
) -> None:
    """Create a token of the job API and print it once (only its hash is stored)."""
    from idlegpu.scheduler.cli.actions import server as actions  # the job API, the store

    actions.token_create(team=team, name=name, role=role, expires=expires, config=config,
                         store=store, now=now)


@token_app.command("list")
def token_list(config: OptionalConfig = None, store: StoreOption = None) -> None:
    """The tokens: name, team, role, created, expires, revoked (never the tokens)."""
    from idlegpu.scheduler.cli.actions import server as actions  # the job API, the store

    actions.token_list(config=config, store=store)


@token_app.command("revoke")
def token_revoke(
    name: Annotated[str, typer.Argument(help="The token's name (idlegpu token list).")],
    config: OptionalConfig = None,
    store: StoreOption = None,
) -> None:
    """Revoke a token: from now on it authenticates nobody."""
    from idlegpu.scheduler.cli.actions import server as actions  # the job API, the store

    actions.token_revoke(name=name, config=config, store=store)
