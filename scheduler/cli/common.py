"""What every command of ``idlegpu`` shares: the root Typer ``app`` (its commands listed in
``registry``, each module loaded when its command runs or shows its help), the consoles, the
common options (the commands' signature modules use them: this module stays light), the
command's state (the pool's time zone once it read its config), time parsing, ``_now``, the
option check and ``main()`` with its error handling. It imports only what starts fast (no
numpy, pandas, pydantic or extras): ``idlegpu --help`` and a bad option answer at once; what
the commands read (config, history) is ``inputs``."""

from __future__ import annotations

import sys
from datetime import datetime, timezone
from pathlib import Path
from typing import Annotated, Optional, TypedDict

import typer
from rich.console import Console
from rich.text import Text

from idlegpu.forecast.errors import IdlegpuError
from idlegpu.forecast.redact import redact
from idlegpu.scheduler.cli.registry import LazyGroup
from idlegpu.scheduler.output import plain

# the root: its commands' modules load when a command runs (idlegpu.scheduler.cli.registry)
app = typer.Typer(
    cls=LazyGroup,
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


def _check(ok: bool, message: str, option: str) -> None:
    """A bad option value: one line, exit 2, before anything is read or fitted."""
    if not ok:
        raise typer.BadParameter(message, param_hint=option)


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
