"""``idlegpu submit``, ``queue``, ``cancel`` and ``admission``: the job store's queue, as the
local operator (``cli:<login>``) through the services, or through the job API (``--server``).
The commands' signatures; what they do is ``idlegpu.scheduler.cli.actions.jobs``, imported when
one of them runs (the job store, of the daemon extra, and the API client with it), not for
their ``--help``."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from idlegpu.scheduler.cli.common import (
    NowOption,
    OptionalConfig,
    OutputOption,
    ServerOption,
    StoreOption,
    TokenFileOption,
)
from idlegpu.scheduler.cli.registry import command_group

# this module's commands: the root loads it to run one or show its help (registry.COMMANDS)
app = command_group()


@app.command(short_help="Queue a job request file.")
def submit(
    file: Annotated[Path, typer.Argument(help="Job request, YAML (see examples/jobs/).")],
    config: OptionalConfig = None,
    store: StoreOption = None,
    idempotency_key: Annotated[Optional[str], typer.Option(
        "--idempotency-key", help="Submitting again with the same key returns the first "
        "submission.")] = None,
    now: NowOption = None,
    server: ServerOption = None,
    token_file: TokenFileOption = None,
) -> None:
    """Validate a job request, expand it into units (pipeline steps x sweep members) and queue
    them in the job store, or (--server) through the job API, which checks it against the
    server's config and decides its team and time."""
    from idlegpu.scheduler.cli.actions import jobs as actions  # the job store, the API client

    actions.submit(file=file, config=config, store=store, idempotency_key=idempotency_key,
                   now=now, server=server, token_file=token_file)


@app.command(short_help="The job queue: units, states and runtime estimates.")
def queue(
    config: OptionalConfig = None,
    store: StoreOption = None,
    all_units: Annotated[bool, typer.Option(
        "--all", help="Also show succeeded, failed and cancelled units.")] = False,
    runs: Annotated[Optional[Path], typer.Option(
        "--runs", help="Past runs for runtime estimates (e.g. data/sample/runs.csv).")] = None,
    server: ServerOption = None,
    token_file: TokenFileOption = None,
    scope: Annotated[str, typer.Option(
        help="With --server: mine, team (your team's) or all.")] = "team",
    output: OutputOption = "table",
) -> None:
    """List the job units in the store, oldest first, with the runtime admission plans with
    (or, with --server, the units the job API shows you)."""
    from idlegpu.scheduler.cli.actions import jobs as actions  # the job store, the API client

    actions.queue(config=config, store=store, all_units=all_units, runs=runs, server=server,
                  token_file=token_file, scope=scope, output=output)


@app.command(short_help="Cancel a job request or a unit.")
def cancel(
    job_id: Annotated[str, typer.Argument(
        help="Request id, or unit id (units depending on it go too).")],
    config: OptionalConfig = None,
    store: StoreOption = None,
    reason: Annotated[str, typer.Option(help="Recorded with the cancel.")] = "cancelled by user",
    now: NowOption = None,
    server: ServerOption = None,
    token_file: TokenFileOption = None,
) -> None:
    """Cancel queued units at once; running units are marked and stopped by the admission
    daemon at its next pass (they checkpoint if they can). With --server, through the job API
    (members cancel their team's work, operators anyone's)."""
    from idlegpu.scheduler.cli.actions import jobs as actions  # the job store, the API client

    actions.cancel(job_id=job_id, config=config, store=store, reason=reason, now=now,
                   server=server, token_file=token_file)


admission_app = typer.Typer(help="Pause or resume admission for the whole pool (operators).",
                            no_args_is_help=True, rich_markup_mode=None)
app.add_typer(admission_app, name="admission",
              short_help="Pause or resume admission for the pool; its state.")


@admission_app.command("status")
def admission_status(config: OptionalConfig = None, store: StoreOption = None,
                     server: ServerOption = None, token_file: TokenFileOption = None) -> None:
    """Whether admission is paused: by whom, since when and why."""
    from idlegpu.scheduler.cli.actions import jobs as actions  # the job store, the API client

    actions.admission(action="status", config=config, store=store, server=server,
                      token_file=token_file, reason=None)


@admission_app.command("pause")
def admission_pause(
    reason: Annotated[str, typer.Option(
        "--reason", help="Why (required, one line, at most 500 characters): the queue shows "
        "it as every waiting unit's reason.")],
    config: OptionalConfig = None, store: StoreOption = None, server: ServerOption = None,
    token_file: TokenFileOption = None,
) -> None:
    """Pause admission for the pool: the daemon admits no unit from its next reconcile pass,
    while stops, the backstop and planned stops go on. Pausing twice keeps the first pause."""
    from idlegpu.scheduler.cli.actions import jobs as actions  # the job store, the API client

    actions.admission(action="pause", config=config, store=store, server=server,
                      token_file=token_file, reason=reason)


@admission_app.command("resume")
def admission_resume(config: OptionalConfig = None, store: StoreOption = None,
                     server: ServerOption = None, token_file: TokenFileOption = None) -> None:
    """Resume admission for the pool (audited; resuming what runs changes nothing)."""
    from idlegpu.scheduler.cli.actions import jobs as actions  # the job store, the API client

    actions.admission(action="resume", config=config, store=store, server=server,
                      token_file=token_file, reason=None)
