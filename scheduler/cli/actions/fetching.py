"""What ``idlegpu fetch`` does (its signature: ``idlegpu.scheduler.cli.fetching``): the pool's
history from Prometheus, into a history file."""

from __future__ import annotations

from pathlib import Path

import typer

from idlegpu.forecast.sources import write_history
from idlegpu.forecast.sources.prometheus import fetch_history
from idlegpu.scheduler.cli.common import console, parse_time
from idlegpu.scheduler.cli.inputs import (
    _load_settings,
)


def fetch(*, config: Path, start: str, end: str, out: Path, service: list[str] | None,
          step: int | None, workers: int | None) -> None:
    """``idlegpu fetch``."""
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
