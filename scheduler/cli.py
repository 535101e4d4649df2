"""The ``idlegpu`` command: the only place that reads flags and prints for people."""

from __future__ import annotations

import sys
from datetime import datetime, timezone
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console

from forecast.errors import IdlegpuError

app = typer.Typer(
    name="idlegpu",
    help="Turn the idle GPUs of an LLM inference pool into research capacity.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
console = Console()
err_console = Console(stderr=True)

_state = {"debug": False}

ConfigOption = Annotated[
    Path,
    typer.Option("--config", "-c", help="Pool configuration (see idlegpu.yaml).", envvar="IDLEGPU_CONFIG"),
]


@app.callback()
def _root(
    debug: Annotated[bool, typer.Option("--debug", help="Show tracebacks of errors.")] = False,
) -> None:
    _state["debug"] = debug


def parse_time(value: str, *, name: str) -> datetime:
    """ISO 8601 date or time; naive values are UTC."""
    try:
        parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        raise typer.BadParameter(
            f"{value!r} is not an ISO 8601 time (e.g. 2025-10-01 or 2025-10-01T00:00:00Z)",
            param_hint=name,
        ) from None
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=timezone.utc)
    return parsed


@app.command()
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
    from forecast.config import load_config
    from forecast.sources import write_history
    from forecast.sources.prometheus import fetch_history

    settings = load_config(config)
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


def main(argv: list[str] | None = None) -> None:
    """Console entry point: user errors print one line and exit 2 (tracebacks with --debug)."""
    args = sys.argv[1:] if argv is None else argv
    try:
        app(args=args, prog_name="idlegpu")
    except IdlegpuError as exc:
        if "--debug" in args:
            raise
        err_console.print(f"[bold red]error:[/] {exc}", highlight=False, soft_wrap=True)
        raise SystemExit(2) from None


if __name__ == "__main__":
    main()
