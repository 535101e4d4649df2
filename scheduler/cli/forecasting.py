"""``idlegpu forecast``, ``windows`` and ``backtest``: the forecasters on a history, and what
``auto`` chose for each series (``plan`` shows it too). The commands' signatures; what they do
is ``idlegpu.scheduler.cli.actions.forecasting``, imported when one of them runs (the forecast
stack, pandas and the models, with it), not for their ``--help``."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from idlegpu.scheduler.cli.common import (
    DEFAULT_CONFIG,
    ConfigOption,
    FromLastSampleOption,
    HistoryOption,
    NowOption,
)
from idlegpu.scheduler.cli.registry import command_group

# this module's commands: the root loads it to run one or show its help (registry.COMMANDS)
app = command_group()

ModelOption = Annotated[
    str, typer.Option("--model", "-m",
                      help="auto | curve | seasonal_naive | prophet | statsmodels | gbm")
]


@app.command("forecast", short_help="Forecast every series as quantiles.")
def forecast_cmd(
    history: HistoryOption,
    out: Annotated[Path, typer.Option(help="Forecast file (.parquet, .csv).")],
    horizon: Annotated[str, typer.Option(help="How far ahead, e.g. 24h or 7d.")] = "24h",
    quantiles: Annotated[str, typer.Option(help="Comma-separated quantiles.")] = "0.5,0.9,0.95",
    model: ModelOption = "auto",
    config: Annotated[
        Optional[Path], typer.Option("--config", "-c", help="Pool config (time zone, holidays, "
                                     "replica bounds); default ./idlegpu.yaml if present.")
    ] = None,
    metric: Annotated[
        Optional[list[str]], typer.Option(help="Only series of this metric, e.g. replicas.")
    ] = None,
    now: NowOption = None,
    from_last_sample: FromLastSampleOption = False,
    plot: Annotated[
        Optional[Path], typer.Option(help="Also draw history, forecast and bands to this PNG.")
    ] = None,
) -> None:
    """Forecast every series of a history as quantiles: unique_id, ds, model, q0.5, q0.9, ..."""
    from idlegpu.scheduler.cli.actions import forecasting as actions  # pandas, the models

    actions.forecast_cmd(history=history, out=out, horizon=horizon, quantiles=quantiles,
                         model=model, config=config, metric=metric, now=now,
                         from_last_sample=from_last_sample, plot=plot)


@app.command(short_help="The coming idle windows, with confidence.")
def windows(
    history: HistoryOption,
    config: ConfigOption = DEFAULT_CONFIG,
    confidence: Annotated[
        float, typer.Option(help="Probability that the promised GPUs really are free.")
    ] = 0.9,
    horizon: Annotated[str, typer.Option(help="How far ahead to look.")] = "24h",
    model: ModelOption = "auto",
    now: NowOption = None,
    from_last_sample: FromLastSampleOption = False,
    granularity: Annotated[
        int, typer.Option(help="Window sizes in multiples of this many GPUs.")] = 4,
    min_hours: Annotated[
        float, typer.Option(help="Shortest window worth listing, in hours.")] = 1.0,
    out: Annotated[Path, typer.Option(help="Directory for windows.csv and the chart.")] = Path(
        "out/windows"
    ),
) -> None:
    """The coming idle windows: when, how many GPUs, for how long, with what confidence."""
    from idlegpu.scheduler.cli.actions import forecasting as actions  # pandas, the models

    actions.windows(history=history, config=config, confidence=confidence, horizon=horizon,
                    model=model, now=now, from_last_sample=from_last_sample,
                    granularity=granularity, min_hours=min_hours, out=out)


@app.command("backtest", short_help="Rolling-origin backtest of forecasters.")
def backtest_cmd(
    history: HistoryOption,
    config: Annotated[
        Optional[Path], typer.Option("--config", "-c", help="Pool config; default ./idlegpu.yaml.")
    ] = None,
    models: Annotated[str, typer.Option(help="Comma-separated models.")] = "auto,seasonal_naive",
    horizon: Annotated[str, typer.Option(help="Forecast horizon per cutoff.")] = "24h",
    days: Annotated[int, typer.Option(help="Daily cutoffs over this many last days.")] = 28,
    cutoff_hour: Annotated[int, typer.Option(help="Local hour of each daily cutoff.")] = 18,
    quantiles: Annotated[str, typer.Option(help="Comma-separated quantiles.")] = "0.5,0.9,0.95",
    metric: Annotated[
        Optional[list[str]], typer.Option(help="Series metrics to evaluate (default replicas).")
    ] = None,
    confidence: Annotated[float, typer.Option(help="Confidence for window quality.")] = 0.9,
    out: Annotated[Path, typer.Option(help="CSV of the metrics table.")] = Path(
        "out/backtest.csv"
    ),
) -> None:
    """Rolling-origin backtest: refit at each daily cutoff on the past only, score the future."""
    from idlegpu.scheduler.cli.actions import forecasting as actions  # pandas, the models

    actions.backtest_cmd(history=history, config=config, models=models, horizon=horizon,
                         days=days, cutoff_hour=cutoff_hour, quantiles=quantiles, metric=metric,
                         confidence=confidence, out=out)
