"""``idlegpu fetch``: the pool's history from Prometheus, into a history file."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from idlegpu.forecast.sources import write_history
from idlegpu.forecast.sources.prometheus import fetch_history
from idlegpu.scheduler.cli.common import (
    ConfigOption,
    console,
    parse_time,
)
from idlegpu.scheduler.cli.inputs import (
    _load_settings,
)
from idlegpu.scheduler.cli.registry import command_group

# this module's commands: the root loads it when one of them runs (registry.COMMANDS)
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
    settings = _load_settings(config)
    t0 = parse_time(start, name="--start")
    t1 = parse_time(end, name="--end")
    if t1 <= t0:
        raise typer.BadParameter("--end must be after --start", param_hint="--end")
    for name in service or []:
        settings.service(name)
    frame = fetch_history(
        settings, t0, t1, services=service or None, step_seconds=step, workers=workers,
        progress=True,
    )
    write_history(frame, out)
    console.print(
        f"wrote {len(frame):,} samples of {frame['unique_id'].nunique()} series to {out}"
    )
