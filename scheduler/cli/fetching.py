"""``idlegpu fetch``: the pool's history from Prometheus, into a history file. The command's
signature; what it does is ``idlegpu.scheduler.cli.actions.fetching``, imported when it runs
(pandas and the fetch with it), not for its ``--help``."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from idlegpu.scheduler.cli.common import ConfigOption
from idlegpu.scheduler.cli.registry import command_group

# this module's commands: the root loads it to run one or show its help (registry.COMMANDS)
app = command_group()


@app.command(short_help="Pull the pool's history from Prometheus.")
def fetch(
    config: ConfigOption,
    start: Annotated[str, typer.Option(help="First timestamp (ISO 8601; naive = UTC).")],
    end: Annotated[str, typer.Option(help="Last timestamp (ISO 8601; naive = UTC).")],
    out: Annotated[Path, typer.Option(help="Output history file (.parquet, .csv, .csv.gz).")],
    service: Annotated[
        Optional[list[str]], typer.Option(help="Only this service (repeatable).")
    ] = None,
    step: Annotated[
        Optional[int], typer.Option(help="Step in seconds (default: prometheus.step_seconds).")
    ] = None,
    workers: Annotated[
        Optional[int], typer.Option(help="Parallel range queries (default: prometheus.workers).")
    ] = None,
) -> None:
    """Pull the pool's history from Prometheus into a tidy history file."""
    from idlegpu.scheduler.cli.actions import fetching as actions  # pandas, the fetch

    actions.fetch(config=config, start=start, end=end, out=out, service=service, step=step,
                  workers=workers)
