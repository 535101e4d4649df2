"""What ``idlegpu forecast``, ``windows`` and ``backtest`` do (their signatures:
``idlegpu.scheduler.cli.forecasting``): the forecasters on a history, and what ``auto`` chose
for each series (``plan`` shows it too)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import typer
from rich.markup import escape
from rich.text import Text

from idlegpu.forecast.backtest import (
    CALIBRATED,
    CUTOFF,
    backtest,
    daily_cutoffs,
    score,
    series_calibration,
    window_quality,
)
from idlegpu.forecast.capacity import (
    FREE,
    forecast_pool_usage,
    idle_windows,
    pool_usage,
    windows_frame,
)
from idlegpu.forecast.models import MODEL_NAMES, model_for, served_summary, validate_quantiles
from idlegpu.forecast.scenarios import forecast_levels, pool_forecast_usage
from idlegpu.forecast.schema import REPLICAS, metric_rows
from idlegpu.forecast.tables import write_csv
from idlegpu.scheduler.cli.common import _check, console, err_console
from idlegpu.scheduler.cli.inputs import (
    _check_horizon,
    _check_services,
    _history_until,
    _load_settings,
    _optional_config,
    _parse_horizon,
)
from idlegpu.scheduler.output import plain

if TYPE_CHECKING:
    from collections.abc import Callable

    from idlegpu.forecast.models.base import Forecaster

def _parse_quantiles(text: str) -> list[float]:
    try:
        return list(validate_quantiles([float(part) for part in text.split(",") if part.strip()]))
    except ValueError as exc:
        raise typer.BadParameter(f"{text!r}: {exc}", param_hint="--quantiles") from None


def _fit_predict_with_progress(name, settings, history, horizon, quantiles):
    import pandas as pd
    from rich.progress import Progress

    groups = list(history.groupby("unique_id", sort=True, observed=True))
    frames = []
    with Progress(console=err_console, transient=True) as progress:
        task = progress.add_task(escape(plain(f"fitting {name}")), total=len(groups))
        for uid, group in groups:
            progress.update(task, description=f"fitting {name} on {uid}")
            frames.append(model_for(name, settings).fit(group).predict(horizon, quantiles))
            progress.advance(task)
    return pd.concat(frames, ignore_index=True)


def _print_served(forecast, title: str = "What forecasts each series") -> None:
    """``auto``'s choice per series (in the order of lead time) and its backtest skill against
    the better seasonal naive; nothing for models that do not choose."""
    from rich.table import Table

    summary = served_summary(forecast)
    if summary.empty:
        return
    view = Table(title=f"{title} (auto: the backtest's choice per lead block; skill = 1 - "
                 "pinball / the better seasonal naive's)", title_justify="left")
    for col in ("series", "served by", "skill"):
        view.add_column(col, justify="right" if col == "skill" else "left")
    for _, row in summary.iterrows():
        skill = row["skill"]
        view.add_row(escape(plain(str(row["unique_id"]))), escape(plain(str(row["served_by"]))),
                     Text(f"{skill:+.0%}", style="green" if skill > 0 else "yellow"))
    console.print(view)


def forecast_cmd(*, history: Path, out: Path, horizon: str, quantiles: str, model: str,
                 config: Path | None, metric: list[str] | None, now: str | None,
                 from_last_sample: bool, plot: Path | None) -> None:
    """``idlegpu forecast``."""
    from idlegpu.forecast import plots  # matplotlib: loaded for a chart

    if model not in MODEL_NAMES:
        raise typer.BadParameter(f"choose one of {', '.join(MODEL_NAMES)}", param_hint="--model")
    qs = _parse_quantiles(quantiles)
    span = _parse_horizon(horizon)
    settings = _optional_config(config)
    frame = _history_until(history, now, metric, from_last_sample)
    _check_horizon(span, frame, horizon)
    frame = _check_services(frame, settings, required=False)
    result = _fit_predict_with_progress(model, settings, frame, span, qs)
    out.parent.mkdir(parents=True, exist_ok=True)
    if out.suffix == ".parquet":
        result.to_parquet(out, index=False)
    else:
        write_csv(result, out, tz=settings.pool.timezone if settings else None, decimals=4)
    console.print(
        f"wrote {len(result):,} rows ({result['unique_id'].nunique()} series x {horizon} "
        f"ahead) to {out}"
    )
    _print_served(result)
    if plot is not None:
        tz = settings.pool.timezone if settings else "UTC"
        plots.forecast_chart(frame, result, plot, tz=tz, quantiles=qs)
        console.print(f"chart: {plot}")


def windows(*, history: Path, config: Path, confidence: float, horizon: str, model: str,
            now: str | None, from_last_sample: bool, granularity: int, min_hours: float,
            out: Path) -> None:
    """``idlegpu windows``."""
    from rich.table import Table

    from idlegpu.forecast import plots  # matplotlib: loaded for a chart

    if not 0.5 <= confidence < 1:
        raise typer.BadParameter("use a confidence from 0.5 to 0.99", param_hint="--confidence")
    _check(model in MODEL_NAMES, f"choose one of {', '.join(MODEL_NAMES)}", "--model")
    _check(granularity >= 1, "use at least 1 GPU", "--granularity")
    _check(min_hours > 0, "use a number of hours above 0", "--min-hours")
    span = _parse_horizon(horizon)
    settings = _load_settings(config)
    frame = _history_until(history, now, ["replicas"], from_last_sample)
    _check_horizon(span, frame, horizon)
    frame = _check_services(frame, settings)
    qs = forecast_levels(settings, confidence)
    forecast = _fit_predict_with_progress(model, settings, frame, span, qs)
    at_conf = pool_forecast_usage(forecast, settings, confidence,
                                  metric_rows(frame, REPLICAS))[FREE]
    median = forecast_pool_usage(forecast, settings, 0.5)[FREE]
    found = idle_windows(at_conf, confidence=confidence, granularity=granularity,
                         min_hours=min_hours)
    tz = settings.pool.timezone
    table = windows_frame(found, tz)
    out.mkdir(parents=True, exist_ok=True)
    write_csv(table, out / "windows.csv", tz=tz, decimals=3)
    past = pool_usage(frame, settings)[FREE]
    pool = settings.pool
    chart = plots.free_gpu_chart(
        past[past.index > past.index.max() - 2 * span],
        {"free, median forecast": median, f"free with {confidence:.0%} confidence": at_conf},
        table, out / "free_gpus.png", tz=tz,
        capacity=pool.lendable_gpus,
        title=f"{pool.name}: free GPUs after {pool.headroom_gpus} headroom, forecast by {model}",
    )
    origin = frame["ds"].max().tz_convert(tz)
    view = Table(
        title=f"Idle windows after {origin:%a %Y-%m-%d %H:%M} ({tz}), {confidence:.0%} confidence",
        title_justify="left",
    )
    for col in ("from", "until", "GPUs free", "hours", "GPU-hours"):
        view.add_column(col, justify="right")
    for row in table.itertuples():
        until = f"{row.end:%a %H:%M}" + ("+" if row.open_end else "")
        view.add_row(f"{row.start:%a %H:%M}", until, str(row.gpus), f"{row.hours:.1f}",
                     f"{row.gpu_hours:,.0f}")
    console.print(view)
    if table.empty:
        console.print(f"no window of {granularity}+ GPUs for {min_hours:g}+ hours",
                      style="yellow")
    else:
        deepest = table.loc[(table["hours"] * table["gpus"]).idxmax()]
        console.print(
            f"Largest: {deepest['gpus']} GPUs from {deepest['start']:%a %H:%M} to "
            f"{deepest['end']:%a %H:%M} ({deepest['hours']:.1f} h, "
            f"{deepest['gpu_hours']:,.0f} GPU-hours).", style="bold green"
        )
    console.print(f"windows: {out / 'windows.csv'}; chart: {chart}")


def backtest_cmd(*, history: Path, config: Path | None, models: str, horizon: str, days: int,
                 cutoff_hour: int, quantiles: str, metric: list[str] | None, confidence: float,
                 out: Path) -> None:
    """``idlegpu backtest``."""
    from functools import partial

    import pandas as pd
    from rich.progress import Progress
    from rich.table import Table

    names = [m.strip() for m in models.split(",") if m.strip()]
    unknown = [m for m in names if m not in MODEL_NAMES]
    if unknown:
        raise typer.BadParameter(
            f"unknown model(s) {', '.join(unknown)}; choose from {', '.join(MODEL_NAMES)}",
            param_hint="--models",
        )
    _check(days >= 1, "use at least 1 day", "--days")
    _check(0 <= cutoff_hour <= 23, "use a local hour from 0 to 23", "--cutoff-hour")
    _check(0 < confidence < 1, "use a confidence strictly between 0 and 1", "--confidence")
    qs = _parse_quantiles(quantiles)
    span = _parse_horizon(horizon)
    settings = _optional_config(config)
    metrics = metric or ["replicas"]
    frame = _history_until(history, None, metrics)
    _check_horizon(span, frame, horizon)
    frame = _check_services(frame, settings, required=False)
    tz = settings.pool.timezone if settings else "UTC"
    cutoffs = daily_cutoffs(frame, timezone=tz, hour=cutoff_hour, days=days, horizon=span)
    factories: dict[str, Callable[[], Forecaster]] = {
        name: partial(model_for, name, settings) for name in names}
    with Progress(console=err_console, transient=True) as progress:
        task = progress.add_task("backtesting", total=len(names) * len(cutoffs))

        def step(name, cutoff):
            progress.update(task, advance=1, description=f"backtesting {name}")

        run = backtest(frame, factories, cutoffs=cutoffs, horizon=span, quantiles=qs,
                       on_step=step)
    table = score(run.forecasts, qs)
    table["fit_predict_s"] = pd.Series(run.seconds)
    ids = set(frame["unique_id"])
    if settings is not None and metrics == ["replicas"] and confidence in qs and all(
            f"{name}/replicas" in ids for name in settings.service_names):  # else: no pool view
        table = table.join(window_quality(run.forecasts, frame, settings, confidence))
    out.parent.mkdir(parents=True, exist_ok=True)
    write_csv(table, out, decimals=5, index=True)
    view = Table(
        title=f"Backtest: {len(cutoffs)} daily cutoffs at {cutoff_hour:02d}:00 ({tz}), "
        f"horizon {horizon}, {', '.join(metrics)}",
        title_justify="left",
    )
    view.add_column("metric")
    for name in table.index:
        view.add_column(name, justify="right")
    for col in table.columns:
        view.add_row(col, *[f"{v:,.4g}" for v in table[col]])
    console.print(view)
    console.print(f"table: {out}")
    # per series: is the q0.9 (else the highest quantile) calibrated, or over/under-covering?
    target = 0.9 if 0.9 in qs else max(qs)
    series = series_calibration(run.forecasts, qs)
    series_out = out.with_name(f"{out.stem}_series{out.suffix or '.csv'}")
    write_csv(series, series_out, decimals=5)
    view = Table(title=f"Per series: q{target:g} calibrated when strict coverage (y < q) <= "
                 f"{target:g} <= coverage (y <= q)", title_justify="left")
    for col in ("model", "series", "strict cov.", "coverage", f"q{target:g}"):
        view.add_column(col, justify="right" if "cov" in col else "left")
    for _, row in series.iterrows():
        mark = row[f"verdict_{target:g}"]
        style = "green" if mark == CALIBRATED else "yellow"
        view.add_row(row["model"], row["unique_id"], f"{row[f'strict_coverage_{target:g}']:.3f}",
                     f"{row[f'coverage_{target:g}']:.3f}", Text(str(mark), style=style))
    console.print(view)
    console.print(f"per series: {series_out}")
    if "auto" in names:
        auto = run.forecasts[run.forecasts["model"] == "auto"]
        _print_served(auto[auto[CUTOFF] == auto[CUTOFF].max()],
                      "What auto chose at the last cutoff")
