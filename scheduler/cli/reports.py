"""``idlegpu report``: the monthly report of the harvested GPUs, from a run table or the job
store's attempts. The command's signature; what it does is
``idlegpu.scheduler.cli.actions.reports``, imported when it runs (pandas and the report's
charts with it), not for its ``--help``."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from idlegpu.scheduler.cli.common import OptionalConfig
from idlegpu.scheduler.cli.registry import command_group

# this module's commands: the root loads it to run one or show its help (registry.COMMANDS)
app = command_group()


@app.command(short_help="Monthly report: useful GPU-hours, GPU equivalents, savings.")
def report(
    month: Annotated[str, typer.Option(help="Month of the report, YYYY-MM (local time).")],
    months: Annotated[
        int, typer.Option(help="Months shown, ending with --month (trend, cumulative savings).")
    ] = 1,
    out: Annotated[Path, typer.Option(
        help="Directory for the report files.")] = Path("out/reports"),
    runs: Annotated[Optional[Path], typer.Option(
        help="Run table (one row per attempt), e.g. runs_forecast.csv of `idlegpu simulate`.")
    ] = None,
    store: Annotated[Optional[str], typer.Option(
        help="Job store URL to read attempts from (default: store.url of the config).")
    ] = None,
    history: Annotated[Optional[Path], typer.Option(
        "--history", "-H", help="Pool history, for the idle GPU-hours available.")] = None,
    config: OptionalConfig = None,
    price: Annotated[Optional[float], typer.Option(
        help="Price per GPU-hour (default: report.price_per_gpu_hour of the config).")] = None,
    currency: Annotated[Optional[str], typer.Option(
        help="ISO 4217 code of the price (default: report.currency of the config).")] = None,
) -> None:
    """Monthly report of the harvested GPUs: Markdown, HTML, summary.csv and charts in --out,
    from a run table (--runs) or the job store's attempts (--store)."""
    from idlegpu.scheduler.cli.actions import reports as actions  # pandas, the report

    actions.report(month=month, months=months, out=out, runs=runs, store=store, history=history,
                   config=config, price=price, currency=currency)
