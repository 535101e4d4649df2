"""The ``idlegpu`` command: the only place that reads flags and prints for people."""

from __future__ import annotations

import os
import re
import sys
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Optional, TypedDict

import typer
from rich.console import Console
from rich.markup import escape
from rich.text import Text

from idlegpu.forecast.errors import IdlegpuError
from idlegpu.scheduler.output import (
    FORMATS,
    PLAN_START_COLUMNS,
    PLAN_WAIT_COLUMNS,
    Column,
    plain,
)

if TYPE_CHECKING:
    from collections.abc import Callable

    from idlegpu.forecast.models.base import Forecaster

app = typer.Typer(
    name="idlegpu",
    help="Turn the idle GPUs of an LLM inference pool into research capacity.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)
# Nothing printed is read as rich markup or :emoji: codes: job names, args, reasons, paths,
# service names are the users' text ("[/]" would crash rich, "[on black][black]..." hide text).
# Styles are given explicitly (style=, Text.assemble); progress descriptions, which rich reads
# as markup whatever the console says, go through plain().
console = Console(markup=False, emoji=False)
err_console = Console(stderr=True, markup=False, emoji=False)
# for idlegpu.scheduler.cli_remote, which escapes what it prints itself
markup_console = Console()
markup_err_console = Console(stderr=True)



def _warning(text: str) -> Text:
    from idlegpu.forecast.redact import redact

    return Text.assemble(("warning:", "yellow"), " ", plain(redact(text)))

class _CommandState(TypedDict, total=False):
    debug: bool
    timezone: str | None  # the pool's, once a command has read its config
    said: set[tuple[str, str]]  # (option, value) of the times read without an offset
    config: str  # the config read, for messages


_state: _CommandState = {"debug": False}

ConfigOption = Annotated[
    Path,
    typer.Option(
        "--config", "-c", help="Pool configuration (see idlegpu.yaml).", envvar="IDLEGPU_CONFIG"
    ),
]
HistoryOption = Annotated[
    Path,
    typer.Option(
        "--history", "-H", help="History file with columns unique_id, ds, y (.parquet, .csv[.gz])."
    ),
]
DEFAULT_CONFIG = Path("idlegpu.yaml")
SAMPLE_HISTORY = "history.parquet"


OutputOption = Annotated[str, typer.Option(
    "--output", "-o", help="table (IDs never cut), wide (every column, unfitted), csv or json "
    "(times ISO 8601 with the offset).")]
QUEUE_COLUMNS = (
    Column("unit", "unit", identifier=True), Column("request", "request", identifier=True,
                                                     wide_only=True),
    Column("team", "team"), Column("step", "step", wide_only=True),
    Column("gpus", "GPUs", right=True), Column("state", "state"),
    Column("tries", "tries", right=True, wide_only=True),
    Column("done", "done", right=True, wide_only=True),
    Column("estimate", "estimate", right=True), Column("submitted", "submitted"))
QUEUE_DATA = (
    Column("unit", "unit"), Column("request", "request"), Column("team", "team"),
    Column("step", "step"), Column("gpus", "GPUs"), Column("state", "state"),
    Column("attempts", "attempts"), Column("preemptions", "preemptions"),
    Column("done_s", "done_s"), Column("estimate_s", "estimate_s"),
    Column("estimate_source", "estimate_source"), Column("submitted", "submitted"),
    Column("notice_deadline", "notice_deadline"))


@app.callback()
def _root(
    debug: Annotated[bool, typer.Option("--debug", help="Show tracebacks of errors.")] = False,
) -> None:
    _state["debug"] = debug
    _state["timezone"] = None  # the pool's, once a command has read its config
    _state["said"] = set()


def parse_time(value: str, *, name: str) -> datetime:
    """ISO 8601 date or time. One without an offset is read in the pool's time zone (of the
    config the command read; UTC without one), and the reading is said on stderr: a time typed
    in Seoul means Seoul, and nobody has to guess what was understood."""
    try:
        parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        raise typer.BadParameter(
            f"{value!r} is not an ISO 8601 time (e.g. 2025-10-01 or 2025-10-01T00:00:00Z)",
            param_hint=name,
        ) from None
    if parsed.tzinfo is None:
        from zoneinfo import ZoneInfo

        zone = _state.get("timezone")
        parsed = parsed.replace(tzinfo=ZoneInfo(zone) if zone else timezone.utc)
        whose = f"{zone}, the pool's zone" if zone else "UTC: no config names a zone"
        said = _state.setdefault("said", set())
        if (name, value) not in said:  # a command may read its --now twice
            said.add((name, value))
            err_console.print(f"{name} {value} has no offset: read as {parsed.isoformat()} "
                              f"({whose})", highlight=False, soft_wrap=True)
    return parsed


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
    from idlegpu.forecast.sources import write_history
    from idlegpu.forecast.synthetic import SAMPLE_POOL, generate_pool_history

    with console.status("generating the sample pool history..."):
        frame = generate_pool_history(SAMPLE_POOL, seed=seed)
        path = write_history(frame, out / SAMPLE_HISTORY)
    console.print(
        f"wrote {len(frame):,} samples of {frame['unique_id'].nunique()} series "
        f"({SAMPLE_POOL.start} to {SAMPLE_POOL.end}, {SAMPLE_POOL.timezone}) to {path}"
    )
    if openmetrics is not None:
        from idlegpu.forecast.sources.openmetrics import write_openmetrics

        with console.status("writing OpenMetrics..."):
            write_openmetrics(frame, None, openmetrics)
        console.print(f"wrote OpenMetrics for promtool backfill to {openmetrics}")


@app.command("export-openmetrics", short_help="Write a history as OpenMetrics for promtool.")
def export_openmetrics(
    history: HistoryOption,
    out: Annotated[Path, typer.Option(help="OpenMetrics text file to write.")],
) -> None:
    """Write a history as OpenMetrics text, for `promtool tsdb create-blocks-from openmetrics`."""
    from idlegpu.forecast.sources import read_history
    from idlegpu.forecast.sources.openmetrics import write_openmetrics

    frame = read_history(history)
    write_openmetrics(frame, None, out)
    console.print(f"wrote {len(frame):,} samples to {out}")


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
    from idlegpu.forecast.analysis import analyze_pool
    from idlegpu.forecast.sources import read_history

    _check(min_hours > 0, "use a number of hours above 0", "--min-hours")
    settings = _load_settings(config)
    frame = _check_services(read_history(history), settings)
    result = analyze_pool(frame, settings, min_hours=min_hours)
    files = result.write(out)
    _print_analysis(result)
    console.print(Text.assemble("\n", ("charts and tables", "bold"),
                                f" in {plain(out)}/: " + ", ".join(p.name for p in files)))


def _print_analysis(result) -> None:
    from rich.table import Table

    s = result.settings
    pool = s.pool
    console.print(Text.assemble(
        (plain(pool.name), "bold"),
        f": {pool.total_gpus} GPUs, {pool.headroom_gpus} kept as headroom; "
        f"{result.first_day} to {result.last_day} ({pool.timezone}), "
        f"step {result.step.total_seconds() / 60:g} min"
    ))
    console.print(
        f"idle: {result.total_idle_gpu_hours:,.0f} GPU-hours in all, "
        f"{result.daily['idle_gpu_hours'].mean():,.0f} per day on average "
        f"({result.daily['mean_free'].mean():.1f} GPUs free on average)\n"
    )

    services = Table(title="Services (replicas)", title_justify="left")
    for col in ("service", "GPUs/replica", "min", "max", "mean", "night mean", "day mean"):
        services.add_column(col, justify="right" if col != "service" else "left")
    for row in result.services.itertuples():
        services.add_row(row.service, str(row.gpus_per_replica), f"{row.min:.0f}",
                         f"{row.max:.0f}", f"{row.mean:.1f}", f"{row.night_mean:.1f}",
                         f"{row.day_mean:.1f}")
    console.print(services)

    day = Table(title="Typical day: mean free GPUs by local hour", title_justify="left")
    day.add_column("hour")
    for col in result.typical_day.columns:
        day.add_column(col, justify="right")
    for hour, row in result.typical_day.iterrows():
        day.add_row(f"{hour:02d}:00", *[f"{v:.1f}" for v in row])
    console.print(day)

    depth = Table(
        title=f"Nightly idle periods ({len(result.nights['night'].unique())} nights)",
        title_justify="left",
    )
    share_col = [c for c in result.depth.columns if c.startswith("share")][0]
    for col in ("GPUs idle", "median hours", "worst 10% hours", f"nights >= {result.min_hours:g} h"):
        depth.add_column(col, justify="right")
    for level, row in result.depth.iterrows():
        depth.add_row(str(level), f"{row['median_hours']:.1f}", f"{row['p10_hours']:.1f}",
                      f"{row[share_col]:.0%}")
    console.print(depth)
    if result.typical_night_gpus:
        console.print(
            f"On a typical night {result.typical_night_gpus} GPUs stay idle for at "
            f"least {result.min_hours:g} hours.", style="bold green"
        )
    else:
        console.print(f"No level of GPUs stays idle {result.min_hours:g} hours on a "
                      "typical night.", style="yellow")
    _print_job_sizes(result)


def _print_job_sizes(result) -> None:
    """Idle GPU-hours usable by 1-, 4-, 8-GPU and multi-node jobs on the pool's nodes."""
    from rich.table import Table

    from idlegpu.forecast.analysis import job_size_label, job_size_summary

    nodes = result.nodes
    if nodes is None:
        console.print("\nNo pool.nodes in the config: idle GPUs are counted for the pool as one "
                      "bin (describe the node shapes to see what 1-, 4-, 8-GPU and multi-node "
                      "jobs can really use).", style="dim")
        return
    deletion = " with pod-deletion-cost" if nodes.deletion_cost else ""
    table = Table(title=f"Idle GPU-hours by job size on {len(nodes.node_gpus)} nodes (services "
                  f"placed {nodes.strategy}{deletion})", title_justify="left")
    for col in ("job size", "pool view", "on nodes", "share"):
        table.add_column(col, justify="left" if col == "job size" else "right")
    for size, row in nodes.by_size.iterrows():
        share = row["share"]
        table.add_row(job_size_label(size, max(nodes.node_gpus)),
                      f"{row['pool_view_gpu_hours']:,.0f}", f"{row['on_nodes_gpu_hours']:,.0f}",
                      "-" if share != share else f"{share:.0%}")
    console.print(table)
    console.print(job_size_summary(nodes) + ".")


def _config_line(settings, path: Path | None) -> None:
    """Say on stderr (stdout stays machine-readable) which config a command read, or that it
    read none, and the time zone and holiday calendar in force."""
    import os

    from idlegpu.forecast.config import ENV_PREFIX, Settings

    if settings is None:
        _state["config"] = "no config"
        err_console.print(f"config: none (no --config, no ./{DEFAULT_CONFIG} here): defaults, "
                          "timezone UTC, no holidays", highlight=False, soft_wrap=True)
        return
    assert path is not None  # a config read comes with its path
    where = _state["config"] = str(Path(path).resolve())
    source = _config_source()
    if source == "environment" or (source is None
                                   and os.environ.get("IDLEGPU_CONFIG") == str(path)):
        where += " (from $IDLEGPU_CONFIG)"
    elif Path(path) == DEFAULT_CONFIG and source != "command line":
        where += f" (./{DEFAULT_CONFIG} of the current directory; --config picks another)"
    fields = tuple(f"{ENV_PREFIX}{name}".upper() for name in Settings.model_fields)
    env = sorted(k for k in os.environ if k.upper().startswith(fields))
    pool = settings.pool
    err_console.print(
        f"config: {where}{'; overridden by ' + ', '.join(env) if env else ''}; pool "
        f"{pool.name}, timezone {pool.timezone}, {pool.calendar.describe()}",
        highlight=False, soft_wrap=True)


def _config_source() -> str | None:
    """Where the running command's ``--config`` came from: "command line", "environment",
    "default", or None outside a command (or in one without the option)."""
    import importlib

    context = None
    # Typer 0.18+ carries its own copy of click, older ones use click's: ask whichever runs
    for module in ("typer._click.globals", "click.globals"):
        try:
            context = importlib.import_module(module).get_current_context(silent=True)
        except (ImportError, AttributeError):
            continue
        if context is not None:
            break
    if context is None or not any(p.name == "config" for p in context.command.params):
        return None
    source = context.get_parameter_source("config")
    name = getattr(source, "name", None)
    if name is None:
        return None
    return {"COMMANDLINE": "command line", "ENVIRONMENT": "environment"}.get(name, "default")


def _load_settings(config: Path):
    """The pool configuration of a command that needs one, announced on stderr."""
    from idlegpu.forecast.config import load_config

    settings = load_config(config)
    _config_line(settings, config)
    _state["timezone"] = settings.pool.timezone
    return settings


def _optional_config(config: Path | None):
    """The config if given, else ./idlegpu.yaml if present, else None (UTC, no holidays);
    announced on stderr either way."""
    path = config if config is not None else DEFAULT_CONFIG if DEFAULT_CONFIG.is_file() else None
    settings = _load_settings(path) if path is not None else None
    if settings is None:
        _config_line(None, None)
    return settings


def _check_services(frame, settings, *, required: bool = True):
    """Warn on stderr about series whose service the config does not describe; ``required``
    (commands that map series to the pool): refuse a history none of whose services the
    config describes, and drop the others (the pool view ignores them). Returns the frame."""
    from idlegpu.forecast.capacity import require_configured_services, service_coverage

    if settings is None:
        return frame
    where = _state.get("config", "the config")
    if required:
        coverage = require_configured_services(frame, settings, config=where)
    else:
        coverage = service_coverage(frame, settings)
    if not coverage.matched:
        err_console.print(_warning(
            f"none of the history's services "
            f"({', '.join(coverage.history_services[:8])}) is a service of {where} "
            f"({', '.join(settings.service_names)}): only its time zone and holidays apply"),
            highlight=False, soft_wrap=True)
    elif coverage.unknown:
        shown = ", ".join(coverage.unknown[:8]) + (
            f" and {len(coverage.unknown) - 8} more" if len(coverage.unknown) > 8 else "")
        what = "ignored" if required else "forecast without replica bounds"
        err_console.print(_warning(
            f"{len(coverage.unknown)} series of the history "
            f"belong{'s' if len(coverage.unknown) == 1 else ''} to no service of {where} "
            f"({what}): {shown}"), highlight=False, soft_wrap=True)
    if required and coverage.unknown:
        frame = frame[~frame["unique_id"].isin(list(coverage.unknown))]
    return frame


def _check(ok: bool, message: str, option: str) -> None:
    """A bad option value: one line, exit 2, before anything is read or fitted."""
    if not ok:
        raise typer.BadParameter(message, param_hint=option)


def _check_horizon(span, frame, text: str) -> None:
    """A horizon must hold at least one step of the history (checked before any fitting)."""
    from idlegpu.forecast.schema import infer_step

    step = infer_step(frame)
    minutes = f"{step.total_seconds() / 60:g}min"
    _check(span >= step, f"{text} is shorter than the history's step ({minutes}); use at "
           f"least {minutes}", "--horizon")


def _parse_quantiles(text: str) -> list[float]:
    from idlegpu.forecast.models import validate_quantiles

    try:
        return list(validate_quantiles([float(part) for part in text.split(",") if part.strip()]))
    except ValueError as exc:
        raise typer.BadParameter(f"{text!r}: {exc}", param_hint="--quantiles") from None


def _parse_horizon(text: str):
    from idlegpu.forecast.models import parse_horizon

    try:
        return parse_horizon(text)
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--horizon") from None


def _history_until(history: Path, now: str | None, metrics: list[str] | None,
                   from_last_sample: bool = False):
    """Read a history, keep the given metrics and cut it at ``now`` (replay of a past moment).
    A ``now`` past the newest sample's step is refused, unless ``from_last_sample``: then the
    forecast starts right after that sample, and a line on stderr says so."""
    import pandas as pd

    from idlegpu.forecast.errors import HistoryError
    from idlegpu.forecast.schema import infer_step
    from idlegpu.forecast.sources import read_history

    frame = read_history(history)
    if metrics:
        metric = frame["unique_id"].str.rpartition("/")[2]
        kept = frame[metric.isin(metrics)]
        if kept.empty:
            found = sorted(set(metric))
            raise HistoryError(
                f"{history}: no series of metric(s) {', '.join(metrics)}; "
                f"found: {', '.join(found)}"
            )
        frame = kept
    if now is not None:
        cut = pd.Timestamp(parse_time(now, name="--now"))
        frame = frame[frame["ds"] <= cut]
        if frame.empty:
            raise HistoryError(f"{history}: nothing at or before --now {now}")
        newest = frame["ds"].max()
        step = infer_step(frame)
        if cut >= newest + step:
            shown = newest.tz_convert(_state.get("timezone") or "UTC")
            if not from_last_sample:
                raise HistoryError(
                    f"--now {now} is past the end of {history}: its newest sample is "
                    f"{shown.isoformat()}; pass an earlier --now, or --from-last-sample "
                    "to forecast from right after that sample")
            err_console.print(
                f"--now {now} is past the newest sample ({shown.isoformat()}): "
                f"forecasting from right after it, {(shown + step).isoformat()} "
                "(--from-last-sample)", highlight=False, soft_wrap=True)
    return frame


def _fit_predict_with_progress(name, settings, history, horizon, quantiles):
    import pandas as pd
    from rich.progress import Progress

    from idlegpu.forecast.models import model_for

    groups = list(history.groupby("unique_id", sort=True, observed=True))
    frames = []
    with Progress(console=err_console, transient=True) as progress:
        task = progress.add_task(escape(plain(f"fitting {name}")), total=len(groups))
        for uid, group in groups:
            progress.update(task, description=f"fitting {name} on {uid}")
            frames.append(model_for(name, settings).fit(group).predict(horizon, quantiles))
            progress.advance(task)
    return pd.concat(frames, ignore_index=True)


ModelOption = Annotated[
    str, typer.Option("--model", "-m",
                      help="auto | curve | seasonal_naive | prophet | statsmodels | gbm")
]


def _print_served(forecast, title: str = "What forecasts each series") -> None:
    """``auto``'s choice per series (in the order of lead time) and its backtest skill against
    the better seasonal naive; nothing for models that do not choose."""
    from rich.table import Table

    from idlegpu.forecast.models import served_summary

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
NowOption = Annotated[
    Optional[str],
    typer.Option(help="Pretend it is this time: use only history up to it (audits, demos)."),
]
FromLastSampleOption = Annotated[
    bool,
    typer.Option("--from-last-sample", help="With a --now past the history's newest sample: "
                 "forecast from right after that sample instead of refusing."),
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
    from idlegpu.forecast.models import MODEL_NAMES

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
        from idlegpu.forecast.tables import write_csv
        write_csv(result, out, tz=settings.pool.timezone if settings else None, decimals=4)
    console.print(
        f"wrote {len(result):,} rows ({result['unique_id'].nunique()} series x {horizon} "
        f"ahead) to {out}"
    )
    _print_served(result)
    if plot is not None:
        from idlegpu.forecast import plots

        tz = settings.pool.timezone if settings else "UTC"
        plots.forecast_chart(frame, result, plot, tz=tz, quantiles=qs)
        console.print(f"chart: {plot}")


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
    granularity: Annotated[int, typer.Option(help="Window sizes in multiples of this many GPUs.")] = 4,
    min_hours: Annotated[float, typer.Option(help="Shortest window worth listing, in hours.")] = 1.0,
    out: Annotated[Path, typer.Option(help="Directory for windows.csv and the chart.")] = Path(
        "out/windows"
    ),
) -> None:
    """The coming idle windows: when, how many GPUs, for how long, with what confidence."""
    from rich.table import Table

    from idlegpu.forecast import plots
    from idlegpu.forecast.capacity import (
        FREE,
        forecast_pool_usage,
        idle_windows,
        pool_usage,
        windows_frame,
    )
    from idlegpu.forecast.models import MODEL_NAMES
    from idlegpu.forecast.scenarios import forecast_levels, pool_forecast_usage
    from idlegpu.forecast.schema import REPLICAS, metric_rows

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
    from idlegpu.forecast.tables import write_csv
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
    from functools import partial

    import pandas as pd
    from rich.progress import Progress
    from rich.table import Table

    from idlegpu.forecast.backtest import (
        CALIBRATED,
        backtest,
        daily_cutoffs,
        score,
        series_calibration,
        window_quality,
    )
    from idlegpu.forecast.models import MODEL_NAMES, model_for

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
    from idlegpu.forecast.tables import write_csv
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
        from idlegpu.forecast.backtest import CUTOFF

        auto = run.forecasts[run.forecasts["model"] == "auto"]
        _print_served(auto[auto[CUTOFF] == auto[CUTOFF].max()],
                      "What auto chose at the last cutoff")


@app.command(short_help="Compare admission policies on a history and a job trace.")
def simulate(
    history: HistoryOption,
    jobs: Annotated[Path, typer.Option(help="Job trace (YAML), e.g. data/sample/jobs.yaml.")],
    config: ConfigOption = DEFAULT_CONFIG,
    runs: Annotated[Optional[Path], typer.Option(
        help="Past runs for runtime estimates, e.g. data/sample/runs.csv.")] = None,
    policies: Annotated[str, typer.Option(help="Comma-separated policies.")] = (
        "night,reactive,forecast,oracle,clairvoyant"
    ),
    days: Annotated[
        Optional[int], typer.Option(help="Simulate only this many days from the start.")
    ] = None,
    warmup_days: Annotated[
        int, typer.Option(help="History kept before the start for the first forecast.")
    ] = 14,
    out: Annotated[Path, typer.Option(help="Directory for the CSVs and the chart.")] = Path(
        "out/simulation"
    ),
    placement: Annotated[str, typer.Option(
        help="pool: GPUs counted for the pool as one bin; spread or binpack: on the nodes of "
        "pool.nodes, the services' replicas placed as the kube-scheduler's LeastAllocated "
        "(default) or MostAllocated scoring would, jobs only where a node has room.")] = "pool",
    sweep: Annotated[Optional[str], typer.Option(
        help="Also run the forecast policy at each of these admission confidences (e.g. "
        "0.5,0.7,0.8,0.9,0.95) and draw the frontier of useful GPU-hours against service "
        "delay and lost work beside the other policies (frontier.csv, frontier.png).")] = None,
    saves_on_stop: Annotated[bool, typer.Option(
        "--saves-on-stop", help="Model workloads that save their progress when told to stop "
        "(SIGTERM, in the grace period). Default: a planned stop keeps only what the "
        "periodic checkpoints saved, as a blind SIGTERM does.")] = False,
    checkpoint_notice: Annotated[str, typer.Option(
        help="Planned stops of units that checkpoint come with this much notice (the "
        "cooperative checkpoint, e.g. 10m): the unit saves, answers and leaves, losing "
        "nothing. 0: blind SIGTERMs.")] = "0",
    notice_answer: Annotated[str, typer.Option(
        help="How long after a notice a unit has saved and answered (e.g. 2m).")] = "2m",
    unanswered_share: Annotated[float, typer.Option(
        help="The share of units (0-1) that never answer a notice: stopped blind at its "
        "deadline.")] = 0.0,
    workers: Annotated[Optional[int], typer.Option(
        help="Policies simulated at once, each in its own process (the results are the same "
        "as one by one). Default: the CPUs this process may use.")] = None,
) -> None:
    """Replay the pool history and a job trace through the admission policy, for each of
    night (fixed 20:00-08:00), reactive, forecast (ours), oracle (ours on the actual future) and
    clairvoyant (the reference: the actual future, and every unit stops without loss)."""
    import pandas as pd
    from rich.progress import Progress
    from rich.table import Table

    from idlegpu.forecast import plots
    from idlegpu.forecast.sources import read_history
    from idlegpu.forecast.tables import write_csv
    from idlegpu.scheduler.reports import useful
    from idlegpu.scheduler.simulate import (
        PLACEMENTS,
        POLICIES,
        delay_events,
        lost_work,
        simulate_policies,
        trace_jobs,
    )
    from idlegpu.scheduler.specs import load_trace

    names = [p.strip() for p in policies.split(",") if p.strip()]
    unknown = [p for p in names if p not in POLICIES]
    if unknown:
        raise typer.BadParameter(f"unknown policy {', '.join(unknown)}; choose from "
                                 f"{', '.join(POLICIES)}", param_hint="--policies")
    confidences = _confidences(sweep) if sweep is not None else []
    _check(days is None or days >= 1, "use at least 1 day", "--days")
    _check(warmup_days >= 0, "use 0 or more days", "--warmup-days")
    _check(workers is None or workers >= 1, "use 1 or more processes", "--workers")
    _check(0.0 <= unanswered_share <= 1.0, "use a share from 0 to 1", "--unanswered-share")
    notice_options = {
        "checkpoint_notice_s": _duration_s(checkpoint_notice, "--checkpoint-notice", "10m"),
        "notice_answer_s": _duration_s(notice_answer, "--notice-answer", "2m"),
        "unanswered_share": unanswered_share,
    }
    _check(placement in PLACEMENTS, f"choose from {', '.join(PLACEMENTS)}", "--placement")
    settings = _load_settings(config)
    _check(placement == "pool" or bool(settings.pool.nodes),
           "the config has no pool.nodes (node shapes, e.g. [{gpus: 8, count: 11}]); add them "
           "or use --placement pool", "--placement")
    frame = _check_services(read_history(history), settings)
    entries = load_trace(jobs, settings.admission)
    estimator = _planning_estimate(settings, runs)
    sim_jobs = trace_jobs(entries, estimator.seconds)
    _say_runtime_model(estimator)
    first, last = frame["ds"].min(), frame["ds"].max()
    start = max(first + pd.Timedelta(days=warmup_days), min(j.submit_at for j in sim_jobs))
    start = pd.Timestamp(start).ceil("h")
    end = last if days is None else min(last, start + pd.Timedelta(days=days))
    if end <= start:
        raise typer.BadParameter("nothing to simulate: the history ends before the trace starts")
    rows, cumulative, losses, delays = {}, {}, [], []
    out.mkdir(parents=True, exist_ok=True)
    if workers is None:
        workers = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (
            os.cpu_count() or 1)
    with Progress(console=err_console, transient=True) as progress:
        tasks = {}
        for name in names:
            if name == "forecast":
                tasks[name, "refreshes"] = progress.add_task("forecast: refitting each evening",
                                                             total=None)
            tasks[name, "steps"] = progress.add_task(escape(plain(f"simulating {name}")),
                                                     total=None)

        def advance(name: str, what: str, done: int, total: int) -> None:
            task = tasks.get((name, what))
            if task is not None:
                progress.update(task, completed=done, total=total)

        results = simulate_policies(
            frame, settings, sim_jobs, names, start=start.to_pydatetime(),
            end=end.to_pydatetime(), workers=workers, on_progress=advance,
            placement=placement, saves_on_stop=saves_on_stop, **notice_options)
    for name, result in results.items():
        rows[name] = result.metrics
        write_csv(result.runs, out / f"runs_{name}.csv", tz=settings.pool.timezone,
                  decimals=None)  # read back by `idlegpu report`: every digit
        losses.append(lost_work(result.runs, settings.pool.timezone).assign(policy=name))
        delays.append(result.delays.assign(policy=name))
        kept = useful(result.runs)
        ends = pd.to_datetime(result.runs["end"], utc=True).dt.tz_convert(
            settings.pool.timezone).dt.tz_localize(None)
        cumulative[name] = pd.Series(kept, index=ends).groupby(level=0).sum().cumsum()
    table = pd.DataFrame(rows).T
    table.index.name = "policy"
    write_csv(table, out / "policies.csv", index=True)
    curves = pd.concat(cumulative, axis=1, sort=True).ffill().fillna(0)
    chart = plots.policy_chart(
        table, curves, out / "policies.png",
        title=f"{settings.pool.name}: {len(sim_jobs)} job units, "
        f"{start:%Y-%m-%d} to {end:%Y-%m-%d}",
    )
    where = "" if placement == "pool" else f", services placed {placement} on pool.nodes"
    view = Table(title=f"Policies over {(end - start).days} days, {len(entries)} requests "
                 f"({len(sim_jobs)} units){where}", title_justify="left")
    view.add_column("metric")
    for name in table.index:
        view.add_column(name, justify="right")
    for col in table.columns:
        view.add_row(col, *[f"{v:,.3g}" if abs(v) < 100 else f"{v:,.0f}" for v in table[col]])
    console.print(view)
    lost = pd.concat(losses, ignore_index=True)
    lost = lost[["policy", *[c for c in lost.columns if c != "policy"]]]
    write_csv(lost, out / "lost.csv")
    waited = pd.concat(delays, ignore_index=True)[["policy", "time", "gpus_short",
                                                   "service_rise_gpus"]]
    write_csv(waited, out / "delays.csv", tz=settings.pool.timezone)
    step_s = int(frame["ds"].drop_duplicates().sort_values().diff().median().total_seconds())
    headroom = settings.pool.headroom_gpus
    for name in names:
        events = delay_events(waited[waited["policy"] == name], step_s, headroom)
        if len(events):
            jumps = events[events["above_headroom"]]
            console.print(
                f"{name}: the service waited {events['gpu_minutes'].sum():,.0f} GPU-min in "
                f"{len(events)} events; {len(jumps)} of them ({jumps['gpu_minutes'].sum():,.0f} "
                f"GPU-min) began with the service rising more than the headroom "
                f"({headroom} GPUs) within one step", highlight=False, markup=False)
    for name in names:
        causes = lost[(lost["policy"] == name) & (lost["by"] == "cause")]
        if len(causes):
            console.print(f"{name} lost " + ", ".join(
                f"{r.lost_gpu_hours:,.0f} GPU-h to {r.value} ({r.stops} stops)"
                for r in causes.sort_values("lost_gpu_hours", ascending=False).itertuples()),
                highlight=False, markup=False)
    console.print(f"tables: {out / 'policies.csv'}, runs_<policy>.csv, lost.csv (lost work by "
                  f"cause, overrun, checkpointing and admission hour), delays.csv (each step "
                  f"the service waited for GPUs units held); chart: {chart}")
    if confidences:
        _frontier(frame, settings, sim_jobs, confidences, rows, out, start=start, end=end,
                  placement=placement, saves_on_stop=saves_on_stop, **notice_options)


def _confidences(text: str) -> list[float]:
    """``--sweep``'s comma-separated confidences, each a valid ``admission.confidence``."""
    values = []
    for part in (p.strip() for p in text[:1000].split(",")):
        if not part:
            continue
        try:
            value = float(part)
        except ValueError:
            raise typer.BadParameter(f"{part[:40]!r} is not a number; give confidences such as "
                                     "0.5,0.7,0.8,0.9,0.95", param_hint="--sweep") from None
        _check(0.5 <= value < 1.0, f"{value:g} is not from 0.5 up to (not including) 1, as "
               "admission.confidence (the quantile of the free-GPU forecast admission plans "
               "on)", "--sweep")
        values.append(value)
    _check(bool(values) and len(values) <= 20, "give 1 to 20 confidences, e.g. "
           "0.5,0.7,0.8,0.9,0.95", "--sweep")
    return sorted(set(values))


def _duration_s(text: str, option: str, example: str) -> float:
    """A duration option's seconds (0 and up to a day), or a clear error naming the option."""
    from idlegpu.scheduler.specs import SpecError, parse_duration

    if text.strip() == "0":
        return 0.0
    try:
        seconds = parse_duration(text)
    except (SpecError, ValueError) as exc:
        raise typer.BadParameter(f"{text[:40]!r}: {exc}; use a duration such as {example}, "
                                 "or 0", param_hint=option) from None
    _check(0 <= seconds <= 86400, f"{text[:40]!r}: use a duration from 0 to 24h", option)
    return float(seconds)


def _frontier(frame, settings, sim_jobs, confidences, rows, out: Path, *, start, end,
              placement: str, saves_on_stop: bool = False, **options) -> None:
    """``simulate --sweep``: the forecast policy at each confidence beside the policies just
    run (and any not run yet), as a table, frontier.csv and frontier.png."""
    import pandas as pd
    from rich.progress import Progress
    from rich.table import Table

    from idlegpu.forecast import plots
    from idlegpu.forecast.tables import write_csv
    from idlegpu.scheduler.simulate import sweep as sweep_policies

    references = {name: metrics for name, metrics in rows.items() if name != "forecast"}
    with Progress(console=err_console, transient=True) as progress:
        task = progress.add_task(f"sweeping {len(confidences)} confidences", total=None)
        frontier = sweep_policies(
            frame, settings, sim_jobs, confidences, start=start.to_pydatetime(),
            end=end.to_pydatetime(), references=references, placement=placement,
            saves_on_stop=saves_on_stop, **options,
            on_point=lambda n, total: progress.update(task, completed=n, total=total))
    write_csv(frontier, out / "frontier.csv")
    chart = plots.frontier_chart(
        frontier, out / "frontier.png",
        title=f"{settings.pool.name}: the forecast policy at each confidence, "
        f"{start:%Y-%m-%d} to {end:%Y-%m-%d}")
    view = Table(title="Frontier: useful GPU-hours against lost work and service delay",
                 title_justify="left")
    for column in ("policy", "confidence", "useful GPU-h", "lost GPU-h", "delay GPU-min",
                   "finished"):
        view.add_column(column, justify="left" if column == "policy" else "right")
    for row in frontier.itertuples():
        view.add_row(row.policy, "" if pd.isna(row.confidence) else f"{row.confidence:g}",
                     f"{row.useful_gpu_hours:,.0f}", f"{row.lost_gpu_hours:,.0f}",
                     f"{row.service_delay_gpu_minutes:,.0f}", f"{row.jobs_finished:,.0f}")
    console.print(view)
    console.print(f"frontier: {out / 'frontier.csv'}; chart: {chart}")


def _planning_estimate(settings, runs: Path | None = None):
    """The runtime estimator the admitter plans units with (past runs of the same family at
    the configured quantile, a model on parameters, the user's estimate times the safety
    factor, else a 4-hour guess): ``.seconds(unit)``; ``_say_runtime_model`` after use."""
    from idlegpu.scheduler.runtime import RuntimeEstimator, load_runs

    return RuntimeEstimator.from_config(load_runs(runs) if runs else None, settings.admission)


def _say_runtime_model(estimator) -> None:
    """Warn on stderr when the estimates went without their model for want of an extra."""
    note = estimator.missing_model_note()
    if note:
        err_console.print(_warning(note))


@app.command(short_help="Tonight's plan: windows, which jobs start when, and why others wait.")
def plan(
    history: Annotated[Optional[Path], typer.Option(
        "--history", "-H", help="History file with columns unique_id, ds, y (.parquet, "
        ".csv[.gz]); not with --server.")] = None,
    config: ConfigOption = DEFAULT_CONFIG,
    jobs: Annotated[Optional[Path], typer.Option(
        help="Take the queue from a job trace: requests submitted in the --queue-days before "
        "now (demos on the sample).")] = None,
    store: Annotated[Optional[str], typer.Option(
        "--store", help="Take the queue from this job store (default when --jobs is not given: "
        "store.url of the config).")] = None,
    runs: Annotated[Optional[Path], typer.Option(
        help="Past runs for runtime estimates, e.g. data/sample/runs.csv.")] = None,
    now: NowOption = None,
    from_last_sample: FromLastSampleOption = False,
    horizon: Annotated[str, typer.Option(help="How far ahead to plan.")] = "24h",
    queue_days: Annotated[float, typer.Option(help="With --jobs: days of submissions.")] = 7.0,
    out: Annotated[Path, typer.Option(help="Directory for plan.csv, windows.csv and the chart.")] = Path(
        "out/plan"
    ),
    server: ServerOption = None,
    token_file: TokenFileOption = None,
    output: OutputOption = "table",
) -> None:
    """Forecast the night, then dry-run the admission policy over it: the idle windows, which
    queued jobs start when on how many GPUs, when each finishes or checkpoints and stops, and
    why the rest wait. With --server, the job API's plan (its history, queue and clock).
    With -o csv or json, stdout is the plan's rows (plan.csv's) and nothing else."""
    import pandas as pd

    from idlegpu.forecast.errors import HistoryError
    from idlegpu.forecast.schema import infer_step
    from idlegpu.scheduler.output import emit
    from idlegpu.scheduler.plan import store_queue, tonight
    from idlegpu.scheduler.refresh import Refresher

    _check(queue_days > 0, "use a number of days above 0", "--queue-days")
    _check(output in FORMATS, f"use one of {', '.join(FORMATS)}", "--output")
    span = _parse_horizon(horizon)
    if server:
        from idlegpu.scheduler.cli_remote import remote_plan

        _check(history is None and jobs is None and store is None and runs is None
               and now is None, "the server plans from its own history, queue and clock; "
               "drop --history, --jobs, --store, --runs and --now", "--server")
        return remote_plan(markup_console, markup_err_console, server, token_file,
                           span.total_seconds() / 3600)
    if history is None:
        raise typer.BadParameter("give the pool's history (or --server URL for the job "
                                 "API's plan)", param_hint="--history")
    settings = _load_settings(config)
    tz = settings.pool.timezone
    frame = _history_until(history, now, ["replicas"], from_last_sample)
    _check_horizon(span, frame, horizon)
    frame = _check_services(frame, settings)
    moment = frame["ds"].max() + infer_step(frame)  # right after the newest sample
    if now is not None:  # past the newest sample only with --from-last-sample: from after it
        at = pd.Timestamp(parse_time(now, name="--now"))
        moment = min(moment, at) if from_last_sample else at
    past = frame[frame["ds"] < moment]
    if past.empty:
        raise HistoryError(f"{history}: no history before {moment}")
    confidence = settings.admission.confidence
    with console.status("forecasting the pool..."):
        # the daemon's refresh: services whose forecasts under-covered lately are planned wider
        refreshed = Refresher(settings, horizon=span).refresh(past, moment.to_pydatetime())
    profile = refreshed.profile
    for line in refreshed.warnings():
        err_console.print(_warning(line))
    estimator = _planning_estimate(settings, runs)
    estimate = estimator.seconds
    start = profile.start
    if jobs is not None:
        from idlegpu.scheduler.simulate import trace_jobs
        from idlegpu.scheduler.specs import load_trace

        entries = [e for e in load_trace(jobs, settings.admission)
                   if start - pd.Timedelta(days=queue_days) <= e.submit_at <= start]
        units = trace_jobs(entries, estimate)
        queue = [u.as_waiting() for u in units if not u.depends_on]
        running, usage = [], {}
        blocked = [u for u in units if u.depends_on]
        source = f"{jobs} ({len(entries)} requests submitted in the {queue_days:g} days before)"
    else:
        from idlegpu.scheduler.adapters.store import JobStore

        # what already runs holds its GPUs, and fair share counts what teams used lately
        later: list = []
        with JobStore(_store_url(settings, store)) as job_store:
            queue, running, usage = store_queue(job_store, settings, estimate, start)
            if not queue and not running:  # say why the plan is empty
                from idlegpu.scheduler.types import JobState

                later = [u for u in job_store.find_units(states=(JobState.QUEUED,))
                         if u.submitted_at > start]
        blocked = []
        from idlegpu.forecast.redact import redact

        source = redact(_store_url(settings, store))  # a PostgreSQL URL carries its password
    _say_runtime_model(estimator)
    planned = tonight(settings, refreshed, queue, running=running, team_usage=usage,
                      horizon=span, start=start)
    result, table, free = planned.plan, planned.windows, refreshed.free

    out.mkdir(parents=True, exist_ok=True)
    from idlegpu.forecast.tables import write_csv
    write_csv(table, out / "windows.csv", tz=tz, decimals=3)
    rows = pd.DataFrame(
        [r.__dict__ for r in result.runs]
        + [{"job_id": job.id, "team": job.team, "kind": job.kind, "gpus": job.gpus,
            "start": None, "end": None, "outcome": "waits", "reason": reason}
           for job, reason in result.waiting]
        + [{"job_id": unit.id, "team": unit.team, "kind": unit.kind, "gpus": unit.gpus,
            "start": None, "end": None, "outcome": "waits",
            "reason": "waits for its previous pipeline step"} for unit in blocked],
        columns=["job_id", "team", "kind", "gpus", "start", "end", "outcome", "reason"])
    write_csv(rows, out / "plan.csv", tz=tz)
    local = pd.Timestamp(start).tz_convert(tz)
    if output in ("csv", "json"):  # the rows of plan.csv on stdout, for scripts
        data = [{k: (None if pd.isna(v) else v) for k, v in row.items()}
                for row in rows.to_dict("records")]
        emit(console, data, [Column(c, c) for c in rows.columns], output, tz=tz)
        _free_gpu_chart(settings, frame, moment, span, confidence, free, table, out, tz,
                        refreshed.likely)
        return
    console.print(Text.assemble((f"Plan from {local:%a %Y-%m-%d %H:%M} ({tz})", "bold"),
                                f", free GPUs promised with {confidence:.0%} confidence; "
                                f"queue: {plain(source)}"))
    if not table.empty:
        console.print(f"largest idle window: {_largest_window(table)}")
    median = planned.median_windows
    if median is not None and not median.empty:
        console.print(f"units that checkpoint plan on the median: {_largest_window(median)} "
                      "in the median forecast")
    _print_served(refreshed.forecast, "What forecasts each service")
    starts = [{"job": r.job_id, "team": r.team, "kind": r.kind, "gpus": r.gpus,
               "from": pd.Timestamp(r.start).tz_convert(tz).strftime("%a %H:%M"),
               "until": pd.Timestamp(r.end).tz_convert(tz).strftime("%a %H:%M"),
               "then": r.outcome} for r in result.runs]
    emit(console, starts, PLAN_START_COLUMNS, output, title="Jobs that start")
    if result.waiting or blocked:
        waits = [{"job": job.id, "gpus": job.gpus, "why": reason}
                 for job, reason in result.waiting]
        waits += [{"job": unit.id, "gpus": unit.gpus,
                   "why": "waits for its previous pipeline step"} for unit in blocked]
        emit(console, waits, PLAN_WAIT_COLUMNS, output, title="Jobs that wait, and why")
    if jobs is None and not queue and not running:
        if later:
            from idlegpu.forecast.tables import iso_time

            first = min(u.submitted_at for u in later)
            console.print(f"The queue was empty at {iso_time(local)}: the store's "
                          f"{len(later):,} queued unit(s) were all submitted later (the first "
                          f"at {iso_time(first, tz)}); pass a later --now to plan with them",
                          highlight=False)
        else:
            console.print(f"The queue at {plain(source)} is empty: queue requests with "
                          "`idlegpu submit`, or pass --jobs to plan a job trace",
                          highlight=False)
    harvest = sum(r.gpus * (r.end - r.start).total_seconds() / 3600 for r in result.runs)
    console.print(Text.assemble(
        (f"{len(result.runs)} job unit(s) start, {harvest:,.0f} GPU-hours planned;",
         "bold green"),
        f" {len(result.waiting) + len(blocked)} wait. "
        f"Files: {plain(out / 'plan.csv')}, {plain(out / 'windows.csv')}, "
        f"{plain(out / 'free_gpus.png')}"))
    _free_gpu_chart(settings, frame, moment, span, confidence, free, table, out, tz,
                    refreshed.likely)


def _largest_window(windows) -> str:
    """The window of most GPU-hours of a ``windows_frame``, as ``plan`` says it."""
    best = windows.loc[(windows["hours"] * windows["gpus"]).idxmax()]
    return (f"{best['gpus']} GPUs from {best['start']:%a %H:%M} to {best['end']:%a %H:%M} "
            f"({best['hours']:.1f} h)")


def _free_gpu_chart(settings, frame, moment, span, confidence, free, table, out, tz,
                    likely=None) -> None:
    from idlegpu.forecast import plots
    from idlegpu.forecast.capacity import FREE, pool_usage

    actual = pool_usage(frame[frame["ds"] < moment], settings)[FREE]
    curves = {}  # the promise last: the chart shades it
    if likely is not None:
        curves["median (units that checkpoint plan on it)"] = likely.reindex(free.index)
    curves[f"free with {confidence:.0%} confidence"] = free
    plots.free_gpu_chart(
        actual[actual.index > actual.index.max() - 2 * span],
        curves, table, out / "free_gpus.png", tz=tz,
        capacity=settings.pool.lendable_gpus,
        title=f"{settings.pool.name}: free GPUs and tonight's windows",
    )


@app.command(short_help="The admission daemon (or one pass with --once).")
def run(
    config: ConfigOption = DEFAULT_CONFIG,
    once: Annotated[bool, typer.Option("--once", help="One reconcile pass, then exit.")] = False,
    now: NowOption = None,
    history: Annotated[Optional[Path], typer.Option(
        "--history", "-H", help="Replay: signals and forecast from this recorded history "
        "instead of Prometheus (audits, demos).")] = None,
    dry_run: Annotated[bool, typer.Option(
        "--dry-run", help="Print the Job manifests instead of applying them.")] = False,
    store: StoreOption = None,
    runs: Annotated[Optional[Path], typer.Option(
        help="Past runs for runtime estimates, e.g. data/sample/runs.csv.")] = None,
    kubeconfig: Annotated[Optional[str], typer.Option(help="Kubeconfig file.")] = None,
    context: Annotated[Optional[str], typer.Option(help="Kubeconfig context.")] = None,
    speed: Annotated[float, typer.Option(
        "--speed", min=0.001, max=100000.0,
        help="Replay only (--history and --now, without --once): seconds of replayed time "
        "per real second, e.g. 60 runs an evening in minutes.")] = 1.0,
) -> None:
    """Admit research Jobs onto the pool's idle GPUs and stop them before the service needs
    the GPUs back: reconcile every minute, live backstop every 15 s, forecast every evening,
    last month's report on the 1st. --once runs a single pass; with --now and --history it
    replays a past moment against recorded history (without --once, the daemon itself runs
    from that moment on, --speed times faster than real time)."""
    from rich.table import Table

    from idlegpu.forecast.redact import redact
    from idlegpu.scheduler.adapters.store import JobStore
    from idlegpu.scheduler.controller import Controller
    from idlegpu.scheduler.daemon import Daemon, ForecastProvider, write_last_month_report
    from idlegpu.scheduler.policy import policy_settings

    settings = _load_settings(config)
    if now is not None and not once and history is None:
        raise typer.BadParameter("--now replays recorded history: use it with --once, or with "
                                 "--history to replay the daemon from that moment",
                                 param_hint="--now")
    if speed != 1.0 and (once or now is None or history is None):
        raise typer.BadParameter("--speed paces a replayed daemon: use it with --history and "
                                 "--now, without --once", param_hint="--speed")
    moment = _now(now)
    frame = None
    if history is not None:
        from idlegpu.forecast.sources import read_history

        frame = read_history(history)
    job_store = JobStore(_store_url(settings, store))
    cluster = _cluster(settings, dry_run=dry_run, kubeconfig=kubeconfig, context=context,
                       instance=_instance(settings, job_store))
    signals = _signal_source(settings, frame)
    forecast = ForecastProvider(settings, frame)
    estimator = _planning_estimate(settings, runs)
    controller = Controller(job_store, cluster, signals, forecast, estimator.seconds,
                            policy_settings(settings.admission, settings.pool.headroom_gpus,
                                            settings.pool.total_gpus),
                            fair_share_days=settings.admission.fair_share_days,
                            pending_timeout_s=settings.cluster.pending_timeout_seconds,
                            stop_timeout_s=_stop_timeout(settings),
                            max_unscheduled_attempts=settings.cluster.max_unscheduled_attempts,
                            gang_timeout_s=settings.cluster.gang_timeout_seconds,
                            recheck=_admission_recheck(settings),
                            dry_run=dry_run,
                            runtime_quantile=settings.admission.runtime_quantile,
                            checkpoint_notice_s=settings.admission.checkpoint_notice_seconds)
    try:
        if once:
            # --dry-run: the manifests alone on stdout (kubectl apply -f -), the rest on stderr
            out = err_console if dry_run else console
            with out.status("forecasting and deciding..."):
                forecast.refresh(moment)
                report = controller.reconcile_once(moment)
            local = moment.astimezone(settings.pool.tz)
            table = Table(title=f"One pass at {local:%a %Y-%m-%d %H:%M} "
                          f"({settings.pool.timezone})", title_justify="left")
            for col in ("decision", "unit", "GPUs", "why"):
                table.add_column(col, justify="right" if col == "GPUs" else "left")
            for d in report.plan.decisions:
                table.add_row(d.action.value, plain(d.job_id), str(d.gpus), plain(d.reason))
            out.print(table)
            for error in report.errors:
                err_console.print(_warning(str(error)))
            _say_runtime_model(estimator)
            from idlegpu.scheduler.service.operations import paused_reason

            paused = paused_reason(job_store.admission(), settings.pool.tz)
            if paused:  # nothing was admitted for that, whatever the table says
                err_console.print(_warning(f"{paused}; `idlegpu admission resume` resumes"))
            if dry_run:
                sys.stdout.write(manifest_stream(getattr(cluster, "last_manifests", [])))
                sys.stdout.flush()
            out.print(
                f"{len(report.created)} Job(s) {'would be ' if dry_run else ''}created, "
                f"{len(report.stopped)} stopped, {len(report.recreated)} recreated after a "
                f"restart; store: {redact(_store_url(settings, store))}"
            )
            return
        from idlegpu.scheduler.clock import ReplayClock, WallClock

        # a replay's clock runs --speed times faster, and so does every period of the daemon
        clock = ReplayClock(moment, speed) if now is not None else WallClock()
        daemon = Daemon(
            controller,
            reconcile_seconds=settings.daemon.reconcile_seconds,
            backstop_seconds=settings.daemon.backstop_seconds,
            refresh_forecast=forecast.refresh,
            refresh_hour=settings.daemon.forecast_refresh_hour,
            monthly_report=lambda at: write_last_month_report(settings, job_store, at),
            timezone=settings.pool.timezone,
            clock=clock,
            leader=_leader_elector(settings, kubeconfig, context),
            retention_days=settings.store.retention_days,
        )
        import logging

        # one plain line per event on stderr, for the cluster's log collector
        logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                            format="%(asctime)s %(levelname)s %(name)s: %(message)s")
        from idlegpu.forecast.redact import RedactingFilter

        for handler in logging.getLogger().handlers:  # urllib3's retries, the API client...
            handler.addFilter(RedactingFilter())
        logging.getLogger("apscheduler").setLevel(logging.WARNING)  # a line per job run is noise
        port = settings.daemon.metrics_port
        replay = (f"; replaying from {moment.astimezone(settings.pool.tz):%Y-%m-%d %H:%M} at "
                  f"{speed:g}x" if now is not None else "")
        if daemon.leader is not None:
            replay += (f"; leader election on lease {daemon.leader.describe()} as "
                       f"{daemon.leader.identity}")
        logging.getLogger("idlegpu.daemon").info(
            "starting on pool %s, store %s, %s%s; SIGTERM stops it gracefully",
            settings.pool.name, _store_url(settings, store),
            f"metrics on :{port}" if port else "no metrics endpoint", replay)
        daemon.run(metrics_port=settings.daemon.metrics_port)
    finally:
        job_store.close()


def _instance(settings, job_store) -> str:
    """The identity on this daemon's Jobs: configured, or the pool name and the store's id
    (replicas share a store, so they share it; a second store in the namespace does not)."""
    from idlegpu.scheduler.adapters.kubernetes import label_value

    return settings.cluster.instance or label_value(
        f"{settings.pool.name}-{job_store.store_id()}")


def _admission_recheck(settings):
    """The daemon's own admission rules on each stored unit, right before its Job is made:
    whatever config the submitter ran with, nothing gets past the daemon's."""
    from idlegpu.scheduler.specs import recheck_unit

    def recheck(row) -> None:
        recheck_unit(row.spec, row.team, settings.admission)

    return recheck


def _stop_timeout(settings) -> float | None:
    """How long a stop may take before its unit is released anyway: the grace period the Job
    gets (checkpointing), plus 10 minutes, unless configured."""
    configured = settings.cluster.stop_timeout_seconds
    return float(configured) if configured else settings.admission.grace_seconds + 600.0


def _leader_elector(settings, kubeconfig: str | None, context: str | None):
    """The Lease elector of ``daemon.leader_election``, or None when it is off."""
    election = settings.daemon.leader_election
    if not election.enabled:
        return None
    import os

    from idlegpu.scheduler.adapters.lease import LeaderElector

    c = settings.cluster
    namespace = election.namespace or os.environ.get("POD_NAMESPACE") or c.namespace
    return LeaderElector.from_config(
        kubeconfig or c.kubeconfig, context or c.context, c.in_cluster,
        namespace=namespace, name=election.lease_name,
        identity=election.identity, lease_duration_s=election.lease_duration_seconds,
        renew_deadline_s=election.renew_deadline_seconds,
        retry_period_s=election.retry_period_seconds)


# A plain scalar that some YAML reader takes for something else than a string: YAML 1.1
# (PyYAML; go-yaml v2, which kubectl's sigs.k8s.io/yaml uses) or YAML 1.2 (core schema).
# Matched case-insensitively against the whole string; broader than any one schema on purpose.
_NOT_PLAIN = re.compile(r"""(?ix)
    ~ | null | true | false | yes | no | on | off | y | n | <<? | = | \s*
  | [-+]? \.? (?: inf (?:inity)? | nan )                               # .inf, -.Inf, .NaN
  | [-+]? (?: 0 [box] [0-9a-f_]+                                       # 0x1F, 0o17, 0b101
            | [0-9][0-9_]* (?: \.[0-9_]* )? (?: e [-+]? [0-9_]+ )?      # 17, 017, 1_000, 2e-05
            | \.[0-9_]+ (?: e [-+]? [0-9_]+ )? )                         # .5, .5e3
  | [-+]? [0-9][0-9_]* (?: :[0-5]?[0-9] )+ (?: \.[0-9_]* )?           # 1:30 (base 60, YAML 1.1)
  | [0-9]{4} - [0-9]{1,2} - [0-9]{1,2} (?: [Tt\s] .* )?                # 2026-01-28[T20:00:00Z]
""")


def yaml_needs_quotes(text: str) -> bool:
    """True when ``text`` written as a plain YAML scalar would not read back as this string
    in a YAML 1.1 or YAML 1.2 reader (a number, bool, null, timestamp, merge key...)."""
    return _NOT_PLAIN.fullmatch(text) is not None


def manifest_stream(manifests) -> str:
    """The manifests as one multi-document YAML stream (``---`` before each) that kubectl
    reads back exactly: every string a YAML 1.1 or 1.2 reader would take for a number, bool,
    null or timestamp is single-quoted, no anchors or aliases."""
    import yaml

    class Dumper(yaml.SafeDumper):
        def ignore_aliases(self, data) -> bool:
            return True

    def text(dumper, data: str):
        style = "'" if yaml_needs_quotes(data) else None
        if any(ch in data for ch in "\x85\u2028\u2029"):
            # YAML line breaks: PyYAML writes them raw inside single quotes, where a reader
            # folds them into a space; double quotes escape them (\N, \L, \P)
            style = '"'
        return dumper.represent_scalar("tag:yaml.org,2002:str", data, style=style)

    Dumper.add_representer(str, text)
    return yaml.dump_all(list(manifests), Dumper=Dumper, sort_keys=False, explicit_start=True,
                         allow_unicode=True, width=1 << 20) if manifests else ""


def _cluster(settings, *, dry_run: bool, kubeconfig: str | None, context: str | None,
             instance: str | None = None):
    from idlegpu.scheduler.adapters.kubernetes import KubernetesCluster

    c = settings.cluster
    options = {
        "instance": instance,
        "namespace": c.namespace, "node_selector": dict(c.node_selector),
        "tolerations": list(c.tolerations), "affinity": dict(c.affinity),
        "priority_class": c.priority_class,
        "active_deadline_seconds": c.active_deadline_seconds,
        "ttl_seconds_after_finished": c.ttl_seconds_after_finished,
        "backoff_limit": c.backoff_limit, "service_account": c.service_account,
        "run_as_user": c.run_as_user,
        "job_api_url": c.job_api_url, "token_audience": c.token_audience,
        "token_expiration_seconds": c.token_expiration_seconds,
        "grace_seconds": settings.admission.grace_seconds, "dry_run": dry_run,
    }
    if dry_run and kubeconfig is None and c.kubeconfig is None and not c.in_cluster:
        return KubernetesCluster(None, **options)
    return KubernetesCluster.from_config(kubeconfig or c.kubeconfig, context or c.context,
                                         c.in_cluster, **options)


def _signal_source(settings, frame):
    if frame is not None:
        from idlegpu.scheduler.replay import HistorySignals

        return HistorySignals(frame, settings)
    from idlegpu.scheduler.adapters.vllm import PrometheusSignals

    return PrometheusSignals(settings)


StoreOption = Annotated[
    Optional[str],
    typer.Option("--store", help="Job store URL (default: store.url of the config, else "
                 "sqlite:///idlegpu.db; IDLEGPU_STORE__URL overrides).")
]
ServerOption = Annotated[
    Optional[str],
    typer.Option("--server", envvar="IDLEGPU_SERVER", help="The job API (`idlegpu serve`) to "
                 "use instead of the store, e.g. http://idlegpu-api:8080; the token comes from "
                 "IDLEGPU_TOKEN, --token-file or the current kubeconfig context.")
]
TokenFileOption = Annotated[
    Optional[Path],
    typer.Option("--token-file", envvar="IDLEGPU_TOKEN_FILE",
                 help="A file holding the API token (with --server).")
]
OptionalConfig = Annotated[
    Optional[Path],
    typer.Option("--config", "-c", help="Pool configuration (default: ./idlegpu.yaml if present).",
                 envvar="IDLEGPU_CONFIG"),
]


def _store_url(settings, store: str | None) -> str:
    from idlegpu.forecast.config import StoreConfig

    return store or (settings.store.url if settings is not None else StoreConfig().url)


def _now(now: str | None) -> datetime:
    return parse_time(now, name="--now") if now else datetime.now(timezone.utc)


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
    if server:
        from idlegpu.scheduler.cli_remote import remote_submit

        _check(now is None and store is None, "--server decides the time and the store; drop "
               "--now and --store", "--server")
        return remote_submit(markup_console, markup_err_console, server, token_file, file,
                             idempotency_key)
    from idlegpu.scheduler.adapters.store import JobStore
    from idlegpu.scheduler.service import submissions
    from idlegpu.scheduler.service.identity import cli_identity
    from idlegpu.scheduler.specs import load_request

    settings = _optional_config(config)
    request = load_request(file, settings.admission if settings is not None else None,
                           nodes=settings.pool.nodes if settings is not None else ())
    when = _now(now)
    with JobStore(_store_url(settings, store)) as job_store:
        done = submissions.submit(job_store, settings, cli_identity(request.team), request, when,
                                  idempotency_key=idempotency_key)
    request_id, units = done.request_id, done.units
    if not done.created:
        console.print(f"{request.name} was already submitted as {request_id} "
                      "(same --idempotency-key); nothing queued")
        return
    steps = len({u.step_index for u in units})
    console.print(
        f"queued {request.name} ({request.team}, {request.kind}) as {request_id}: "
        f"{len(units)} unit(s) in {steps} step(s), up to {max(u.gpus for u in units)} GPUs each; "
        f"`idlegpu queue` shows them, `idlegpu cancel {request_id}` withdraws them"
    )


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
    _check(output in FORMATS, f"use one of {', '.join(FORMATS)}", "--output")
    if server:
        from idlegpu.scheduler.cli_remote import remote_queue

        _check(scope in ("mine", "team", "all"), "use mine, team or all", "--scope")
        settings = _optional_config(config)
        tz = settings.pool.tz if settings is not None else timezone.utc
        return remote_queue(markup_console, markup_err_console, server, token_file, scope,
                            all_units, tz, output)
    from idlegpu.forecast.config import AdmissionConfig
    from idlegpu.scheduler.adapters.store import JobStore
    from idlegpu.scheduler.output import emit
    from idlegpu.scheduler.runtime import RuntimeEstimator, load_runs
    from idlegpu.scheduler.specs import format_duration

    settings = _optional_config(config)
    admission = settings.admission if settings is not None else AdmissionConfig()
    tz = settings.pool.tz if settings is not None else timezone.utc
    estimator = RuntimeEstimator.from_config(load_runs(runs) if runs else None, admission)
    with JobStore(_store_url(settings, store)) as job_store:
        rows = job_store.queue(include_terminal=all_units)
        notices = {n.unit_id: n for n in job_store.open_notices()}
        notice_counts = job_store.notice_counts()
    if not rows:
        console.print("the queue is empty" + ("" if all_units else " (--all shows ended units)"))
        return
    listed = []
    for row in rows:
        estimate = estimator.estimate(row.spec)
        state = row.state.value
        if row.cancel_requested_at is not None and row.state.holds_gpus():
            state += " (stopping)"
        elif row.state.is_terminal() and row.reason:
            state += f": {row.reason}"
        notice = notices.get(row.id)
        if notice is not None and row.state.holds_gpus():
            state += (f" (checkpoint notice until "
                      f"{notice.deadline.astimezone(tz):%H:%M:%S})")
        listed.append({
            "unit": row.id, "request": row.request_id, "team": row.team,
            "step": f"{row.step}[{row.member}]" if row.member else row.step, "gpus": row.gpus,
            "state": state, "tries": f"{row.attempts}/{row.preemptions}",
            "attempts": row.attempts, "preemptions": row.preemptions,
            "done": format_duration(row.work_done_s) if row.work_done_s else "",
            "done_s": row.work_done_s,
            "estimate": f"{format_duration(estimate.seconds)} ({estimate.source})",
            "estimate_s": estimate.seconds, "estimate_source": estimate.source,
            "submitted": row.submitted_at,
            "notice_deadline": notice.deadline if notice is not None else None})
    emit(console, listed, QUEUE_COLUMNS if output in ("table", "wide") else QUEUE_DATA,
         output, title=f"job queue ({len(rows)} unit(s))", tz=tz)
    if output not in ("table", "wide"):
        return
    counts: dict[str, int] = {}
    for row in rows:
        counts[row.state.value] = counts.get(row.state.value, 0) + 1
    console.print(", ".join(f"{n} {s}" for s, n in counts.items())
                  + "; tries = admissions/preemptions; estimate source: history, model, user, "
                    "default (a guess)")
    if notice_counts["sent"]:
        console.print(
            f"checkpoint notices: {notice_counts['sent']} sent, {notice_counts['answered']} "
            f"answered in time, {notice_counts['missed']} missed (stopped at the deadline), "
            f"{notice_counts['cut']} cut short by the service, {notice_counts['open']} under "
            "way")


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
    if server:
        from idlegpu.scheduler.cli_remote import remote_cancel

        _check(now is None and store is None, "--server decides the time and the store; drop "
               "--now and --store", "--server")
        return remote_cancel(markup_console, markup_err_console, server, token_file, job_id,
                             reason)
    from idlegpu.scheduler.adapters.store import JobStore
    from idlegpu.scheduler.service import submissions
    from idlegpu.scheduler.service.identity import cli_identity

    settings = _optional_config(config)
    with JobStore(_store_url(settings, store)) as job_store:
        result = submissions.cancel(job_store, cli_identity(), job_id, _now(now), reason)
    if result.cancelled:
        console.print(f"cancelled {len(result.cancelled)} queued unit(s): "
                      + plain(", ".join(result.cancelled)), highlight=False, soft_wrap=True)
    if result.to_stop:
        console.print(f"{len(result.to_stop)} unit(s) hold GPUs and will be stopped by the "
                      "admission daemon: " + plain(", ".join(result.to_stop)), highlight=False,
                      soft_wrap=True)
    if not result.cancelled and not result.to_stop:
        console.print(f"nothing to cancel: every unit of {plain(job_id)} has already ended",
                      highlight=False)


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
    from idlegpu.forecast.sources import write_history
    from idlegpu.forecast.sources.prometheus import fetch_history

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


@app.command(short_help="Monthly report: useful GPU-hours, GPU equivalents, savings.")
def report(
    month: Annotated[str, typer.Option(help="Month of the report, YYYY-MM (local time).")],
    months: Annotated[
        int, typer.Option(help="Months shown, ending with --month (trend, cumulative savings).")
    ] = 1,
    out: Annotated[Path, typer.Option(help="Directory for the report files.")] = Path("out/reports"),
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
    from idlegpu.forecast.config import ReportConfig
    from idlegpu.scheduler.reports import (
        build_report,
        idle_by_day,
        job_size_idle,
        read_runs,
        runs_from_store,
        write_report,
    )

    if runs is not None and store is not None:
        raise typer.BadParameter("give --runs or --store, not both", param_hint="--runs")
    settings = _optional_config(config)
    defaults = settings.report if settings is not None else ReportConfig()
    tz = settings.pool.timezone if settings is not None else "UTC"
    if runs is None:
        from idlegpu.scheduler.adapters.store import JobStore
        from idlegpu.scheduler.reports import Month, notices_from_store

        with JobStore(_store_url(settings, store)) as job_store:
            table = runs_from_store(job_store, _now(None))
            notices = notices_from_store(job_store, Month.parse(month), tz)
    else:
        table, notices = read_runs(runs), None
    idle = check = sizes = None
    if history is not None:
        if settings is None:
            raise typer.BadParameter("--history needs the pool configuration (--config)",
                                     param_hint="--history")
        from idlegpu.forecast.sources import read_history

        frame = read_history(history)
        idle = idle_by_day(frame, settings)
        sizes = job_size_idle(frame, settings, month)
        from rich.progress import Progress

        from idlegpu.scheduler.reports import Month, forecast_check

        # the daemon's nightly refresh replayed over the month (widening included): one refit
        # per evening gives the pooled accuracy and the per-service coverage
        with Progress(console=err_console, transient=True) as progress:
            task = progress.add_task(escape(plain(f"replaying the nightly forecasts of {month}")),
                                     total=None)
            check = forecast_check(
                frame, settings, Month.parse(month),
                on_step=lambda n, total: progress.update(task, completed=n, total=total))
    result = build_report(
        table, month, months=months, tz=tz,
        price=defaults.price_per_gpu_hour if price is None else price,
        currency=(defaults.currency if currency is None else currency),
        idle_daily=idle, pool=settings.pool.name if settings is not None else "GPU pool",
        forecast=check, job_sizes=sizes, notices=notices,
    )
    files = write_report(result, out)
    from idlegpu.scheduler.reports import format_gpus, format_hours, format_money, format_share

    row = result.row
    console.print(
        f"{row.month}: {format_hours(row.useful_gpu_hours)} useful GPU-hours = "
        f"{format_gpus(row.gpus_12h)} GPUs (12 h) / {format_gpus(row.gpus_24h)} GPUs (24 h); "
        f"savings {format_money(row.savings, row.currency)} "
        f"(cumulative {format_money(row.cumulative_savings, row.currency)})",
        highlight=False,
    )
    if check is not None:
        verdicts = ", ".join(
            f"{r.service} {format_share(r.coverage)} {r.verdict}"
            + (f" (widened {r.days_widened} evening{'s' if r.days_widened != 1 else ''})"
               if r.days_widened else "")
            for r in check.services.itertuples())
        console.print(f"q{check.confidence:g} coverage per service: {verdicts}",
                      highlight=False, markup=False)
    console.print(f"wrote {', '.join(p.name for p in files)} to {out}/", highlight=False)


admission_app = typer.Typer(help="Pause or resume admission for the whole pool (operators).",
                            no_args_is_help=True, rich_markup_mode=None)
app.add_typer(admission_app, name="admission",
              short_help="Pause or resume admission for the pool; its state.")


def _admission(action: str, config: Path | None, store: str | None, server: str | None,
               token_file: Path | None, reason: str | None = None) -> None:
    """`idlegpu admission ACTION`: on the store of the config (or --store), or through the
    job API (--server); both audited, both idempotent."""
    from idlegpu.scheduler.cli_remote import print_admission, remote_admission

    if server:
        _check(store is None, "--server decides the store; drop --store", "--server")
        return remote_admission(markup_console, markup_err_console, server, token_file,
                                action, reason)
    from idlegpu.forecast.redact import redact
    from idlegpu.scheduler.adapters.store import JobStore
    from idlegpu.scheduler.service import operations
    from idlegpu.scheduler.service.identity import cli_identity
    from idlegpu.scheduler.service.operations import paused_reason

    settings = _optional_config(config)
    tz = settings.pool.tz if settings is not None else timezone.utc
    url = _store_url(settings, store)
    when = _now(None)
    with JobStore(url) as job_store:
        if action == "pause":
            change = operations.pause(job_store, cli_identity(), reason, when, tz)
        elif action == "resume":
            change = operations.resume(job_store, cli_identity(), when)
        else:
            change = None
        state = change.state if change else job_store.admission()
    message = None
    if change is not None and not change.changed:
        message = (f"admission was already paused by {state.by}; nothing changed"
                   if state.paused else "admission was not paused; nothing changed")
    print_admission(markup_console, state.paused,
                    paused_reason(state, tz) or "admission is open", action,
                    change.changed if change else True, message, redact(url))


@admission_app.command("status")
def admission_status(config: OptionalConfig = None, store: StoreOption = None,
                     server: ServerOption = None, token_file: TokenFileOption = None) -> None:
    """Whether admission is paused: by whom, since when and why."""
    _admission("status", config, store, server, token_file)


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
    _admission("pause", config, store, server, token_file, reason)


@admission_app.command("resume")
def admission_resume(config: OptionalConfig = None, store: StoreOption = None,
                     server: ServerOption = None, token_file: TokenFileOption = None) -> None:
    """Resume admission for the pool (audited; resuming what runs changes nothing)."""
    _admission("resume", config, store, server, token_file)


import idlegpu.scheduler.cli_api  # noqa: E402, F401  (serve, token: the job API)

EXTRAS = {"sqlalchemy": "daemon", "apscheduler": "daemon", "prometheus_client": "daemon",
          "kubernetes": "daemon", "fastapi": "server",
          "uvicorn": "server", "jinja2": "server", "starlette": "server",
          "prophet": "models", "statsmodels": "models", "sklearn": "models"}
"""The optional packages, by the extra of pyproject.toml that brings each."""


def main(argv: list[str] | None = None) -> None:
    """Console entry point: user errors print one line and exit 2 (tracebacks with --debug)."""
    args = sys.argv[1:] if argv is None else argv
    try:
        code = app(args=args, prog_name="idlegpu", standalone_mode=False)
    except (IdlegpuError, typer.BadParameter) as exc:  # a bad option value is one line too
        if "--debug" in args:
            raise
        from idlegpu.forecast.redact import redact

        message = exc.format_message() if isinstance(exc, typer.BadParameter) else exc
        # a message may quote what the user wrote: plain text, never markup, no credentials
        err_console.print(Text.assemble(("error:", "bold red"), " ", plain(redact(message))),
                          highlight=False, soft_wrap=True)
        raise SystemExit(2) from None
    except ModuleNotFoundError as exc:  # an optional part that this install does not have
        extra = EXTRAS.get((exc.name or "").split(".")[0])
        if extra is None or "--debug" in args:
            raise
        err_console.print(Text.assemble(
            ("error:", "bold red"), f" this needs the '{exc.name}' package, which comes with "
            f"the {extra} extra: pip install 'idlegpu[{extra}]'"), highlight=False,
            soft_wrap=True)
        raise SystemExit(2) from None
    except typer.TyperException as exc:  # other usage errors (an unknown option...): as click
        if not hasattr(exc, "show"):
            raise
        exc.show()
        raise SystemExit(exc.exit_code) from None
    except typer.Abort:
        err_console.print("Aborted!")
        raise SystemExit(1) from None
    if isinstance(code, int) and code:  # typer.Exit(code), Ctrl-C (130)
        raise SystemExit(code)


if __name__ == "__main__":
    main()
