"""What the commands read and check before they work: the pool's config (announced on stderr,
with the time zone and holidays in force), the history cut at ``--now``, horizons, the runtime
estimator and the job store's URL. Apart from ``common``, which ``idlegpu --help`` loads: these
import pandas and pydantic, and only a command that runs loads them."""

from __future__ import annotations

import importlib
import os
from pathlib import Path

import pandas as pd
import typer

from idlegpu.forecast.capacity import require_configured_services, service_coverage
from idlegpu.forecast.errors import HistoryError
from idlegpu.forecast.models import parse_horizon
from idlegpu.forecast.schema import infer_step
from idlegpu.forecast.settings_base import ENV_PREFIX
from idlegpu.forecast.sources import read_history
from idlegpu.scheduler.cli.common import (
    DEFAULT_CONFIG,
    _check,
    _state,
    _warning,
    err_console,
    parse_time,
)
from idlegpu.scheduler.config import Settings, StoreConfig, load_config
from idlegpu.scheduler.runtime import RuntimeEstimator, load_runs


def _config_line(settings, path: Path | None) -> None:
    """Say on stderr (stdout stays machine-readable) which config a command read, or that it
    read none, and the time zone and holiday calendar in force."""
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


def _check_horizon(span, frame, text: str) -> None:
    """A horizon must hold at least one step of the history (checked before any fitting)."""
    step = infer_step(frame)
    minutes = f"{step.total_seconds() / 60:g}min"
    _check(span >= step, f"{text} is shorter than the history's step ({minutes}); use at "
           f"least {minutes}", "--horizon")


def _parse_horizon(text: str):
    try:
        return parse_horizon(text)
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--horizon") from None


def _history_until(history: Path, now: str | None, metrics: list[str] | None,
                   from_last_sample: bool = False):
    """Read a history, keep the given metrics and cut it at ``now`` (replay of a past moment).
    A ``now`` past the newest sample's step is refused, unless ``from_last_sample``: then the
    forecast starts right after that sample, and a line on stderr says so."""

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


def _planning_estimate(settings, runs: Path | None = None):
    """The runtime estimator the admitter plans units with (past runs of the same family at
    the configured quantile, a model on parameters, the user's estimate times the safety
    factor, else a 4-hour guess): ``.seconds(unit)``; ``_say_runtime_model`` after use."""
    return RuntimeEstimator.from_config(load_runs(runs) if runs else None, settings.admission)


def _say_runtime_model(estimator) -> None:
    """Warn on stderr when the estimates went without their model for want of an extra."""
    note = estimator.missing_model_note()
    if note:
        err_console.print(_warning(note))


def _store_url(settings, store: str | None) -> str:
    return store or (settings.store.url if settings is not None else StoreConfig().url)
