"""What every command of ``idlegpu`` shares: the Typer ``app`` the groups register on, the
consoles, the common options, the pool's config and time zone as the command read them, the
history and option checks, the job store's URL, ``_now`` and ``main()`` with its error
handling. It imports at the top only what starts fast (no numpy, pandas, pydantic or extras):
``idlegpu --help`` and a bad option answer at once."""

from __future__ import annotations

import importlib
import os
import sys
from datetime import datetime, timezone
from pathlib import Path
from typing import Annotated, Optional, TypedDict

import typer
from rich.console import Console
from rich.text import Text

from idlegpu.forecast.errors import HistoryError, IdlegpuError
from idlegpu.forecast.redact import redact
from idlegpu.scheduler.output import plain

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
# for idlegpu.scheduler.cli.remote, which escapes what it prints itself
markup_console = Console()
markup_err_console = Console(stderr=True)


def _warning(text: str) -> Text:
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
OutputOption = Annotated[str, typer.Option(
    "--output", "-o", help="table (IDs never cut), wide (every column, unfitted), csv or json "
    "(times ISO 8601 with the offset).")]
NowOption = Annotated[
    Optional[str],
    typer.Option(help="Pretend it is this time: use only history up to it (audits, demos)."),
]
FromLastSampleOption = Annotated[
    bool,
    typer.Option("--from-last-sample", help="With a --now past the history's newest sample: "
                 "forecast from right after that sample instead of refusing."),
]
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


def _config_line(settings, path: Path | None) -> None:
    """Say on stderr (stdout stays machine-readable) which config a command read, or that it
    read none, and the time zone and holiday calendar in force."""
    from idlegpu.forecast.settings_base import ENV_PREFIX
    from idlegpu.scheduler.config import Settings

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
    from idlegpu.scheduler.config import load_config

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


def _store_url(settings, store: str | None) -> str:
    from idlegpu.scheduler.config import StoreConfig

    return store or (settings.store.url if settings is not None else StoreConfig().url)


def _now(now: str | None) -> datetime:
    return parse_time(now, name="--now") if now else datetime.now(timezone.utc)


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
