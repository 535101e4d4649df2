"""``idlegpu sample``, ``export-openmetrics`` and ``analyze``: the pool's history, bundled,
exported and analysed (``fetching`` pulls it from Prometheus). The commands' signatures; what
they do is ``idlegpu.scheduler.cli.actions.history``, imported when one of them runs."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from idlegpu.scheduler.cli.common import (
    DEFAULT_CONFIG,
    ConfigOption,
    HistoryOption,
)
from idlegpu.scheduler.cli.registry import command_group

# this module's commands: the root loads it to run one or show its help (registry.COMMANDS)
app = command_group()


@app.command(short_help="Regenerate the bundled sample pool history.")
def sample(
    out: Annotated[Path, typer.Option(help="Directory for the sample files (--out data/sample "
                                      "replaces the bundled sample).")] = Path("out/sample"),
    seed: Annotated[int, typer.Option(help="Random seed of the generator.")] = 20251001,
    openmetrics: Annotated[
        Optional[Path],
        typer.Option(help="Also write the history as OpenMetrics text for promtool backfill."),
    ] = None,
) -> None:
    """Regenerate the bundled sample pool history (deterministic: same seed, same bytes)."""
    from idlegpu.scheduler.cli.actions import history as actions  # pandas: when it runs

    actions.sample(out=out, seed=seed, openmetrics=openmetrics)


@app.command("export-openmetrics", short_help="Write a history as OpenMetrics for promtool.")
def export_openmetrics(
    history: HistoryOption,
    out: Annotated[Path, typer.Option(help="OpenMetrics text file to write.")],
) -> None:
    """Write a history as OpenMetrics text, for `promtool tsdb create-blocks-from openmetrics`."""
    from idlegpu.scheduler.cli.actions import history as actions  # pandas: when it runs

    actions.export_openmetrics(history=history, out=out)


@app.command(short_help="Where and when the pool's GPUs sit idle.")
def analyze(
    history: HistoryOption,
    config: ConfigOption = DEFAULT_CONFIG,
    out: Annotated[Path, typer.Option(help="Directory for charts and tables.")] = Path(
        "out/analysis"
    ),
    min_hours: Annotated[
        float, typer.Option(help="Idle stretch (hours) that counts as a usable night.")
    ] = 8.0,
) -> None:
    """Where and when the pool's GPUs sit idle: tables on screen, charts and CSVs in --out."""
    from idlegpu.scheduler.cli.actions import history as actions  # pandas: when it runs

    actions.analyze(history=history, config=config, out=out, min_hours=min_hours)
