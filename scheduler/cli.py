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
def sample(
    out: Annotated[Path, typer.Option(help="Directory for the sample files.")] = Path("data/sample"),
    seed: Annotated[int, typer.Option(help="Random seed of the generator.")] = 20251001,
    openmetrics: Annotated[
        Optional[Path],
        typer.Option(help="Also write the history as OpenMetrics text for promtool backfill."),
    ] = None,
) -> None:
    """Regenerate the bundled sample pool history (deterministic: same seed, same bytes)."""
    from forecast.sources import write_history
    from forecast.synthetic import SAMPLE_POOL, generate_pool_history

    with console.status("generating the sample pool history..."):
        frame = generate_pool_history(SAMPLE_POOL, seed=seed)
        path = write_history(frame, out / SAMPLE_HISTORY)
    console.print(
        f"wrote {len(frame):,} samples of {frame['unique_id'].nunique()} series "
        f"({SAMPLE_POOL.start} to {SAMPLE_POOL.end}, {SAMPLE_POOL.timezone}) to {path}"
    )
    if openmetrics is not None:
        from forecast.sources.openmetrics import write_openmetrics

        with console.status("writing OpenMetrics..."):
            write_openmetrics(frame, None, openmetrics)
        console.print(f"wrote OpenMetrics for promtool backfill to {openmetrics}")


@app.command("export-openmetrics")
def export_openmetrics(
    history: HistoryOption,
    out: Annotated[Path, typer.Option(help="OpenMetrics text file to write.")],
) -> None:
    """Write a history as OpenMetrics text, for `promtool tsdb create-blocks-from openmetrics`."""
    from forecast.sources import read_history
    from forecast.sources.openmetrics import write_openmetrics

    frame = read_history(history)
    write_openmetrics(frame, None, out)
    console.print(f"wrote {len(frame):,} samples to {out}")


@app.command()
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
    from forecast.analysis import analyze_pool
    from forecast.config import load_config
    from forecast.sources import read_history

    settings = load_config(config)
    frame = read_history(history)
    result = analyze_pool(frame, settings, min_hours=min_hours)
    files = result.write(out)
    _print_analysis(result)
    console.print(f"\n[bold]charts and tables[/] in {out}/: " + ", ".join(p.name for p in files))


def _print_analysis(result) -> None:
    from rich.table import Table

    s = result.settings
    pool = s.pool
    console.print(
        f"[bold]{pool.name}[/]: {pool.total_gpus} GPUs, {pool.headroom_gpus} kept as headroom; "
        f"{result.first_day} to {result.last_day} ({pool.timezone}), "
        f"step {result.step.total_seconds() / 60:g} min"
    )
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
            f"[bold green]On a typical night {result.typical_night_gpus} GPUs stay idle for at "
            f"least {result.min_hours:g} hours.[/]"
        )
    else:
        console.print(f"[yellow]No level of GPUs stays idle {result.min_hours:g} hours on a "
                      "typical night.[/]")


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
