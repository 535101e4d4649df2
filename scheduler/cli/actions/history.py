"""What ``idlegpu sample``, ``export-openmetrics`` and ``analyze`` do (their signatures:
``idlegpu.scheduler.cli.history``): the pool's history, bundled, exported and analysed."""

from __future__ import annotations

from pathlib import Path

from rich.text import Text

from idlegpu.forecast.analysis import analyze_pool, job_size_label, job_size_summary
from idlegpu.forecast.sources import read_history, write_history
from idlegpu.forecast.sources.openmetrics import write_openmetrics
from idlegpu.forecast.synthetic import SAMPLE_POOL, generate_pool_history
from idlegpu.scheduler.cli.common import _check, console
from idlegpu.scheduler.cli.inputs import (
    _check_services,
    _load_settings,
)
from idlegpu.scheduler.output import plain

SAMPLE_HISTORY = "history.parquet"


def sample(*, out: Path, seed: int, openmetrics: Path | None) -> None:
    """``idlegpu sample``."""
    with console.status("generating the sample pool history..."):
        frame = generate_pool_history(SAMPLE_POOL, seed=seed)
        path = write_history(frame, out / SAMPLE_HISTORY)
    console.print(
        f"wrote {len(frame):,} samples of {frame['unique_id'].nunique()} series "
        f"({SAMPLE_POOL.start} to {SAMPLE_POOL.end}, {SAMPLE_POOL.timezone}) to {path}"
    )
    if openmetrics is not None:
        with console.status("writing OpenMetrics..."):
            write_openmetrics(frame, None, openmetrics)
        console.print(f"wrote OpenMetrics for promtool backfill to {openmetrics}")


def export_openmetrics(*, history: Path, out: Path) -> None:
    """``idlegpu export-openmetrics``."""
    frame = read_history(history)
    write_openmetrics(frame, None, out)
    console.print(f"wrote {len(frame):,} samples to {out}")


def analyze(*, history: Path, config: Path, out: Path, min_hours: float) -> None:
    """``idlegpu analyze``."""
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
    for col in ("GPUs idle", "median hours", "worst 10% hours",
                f"nights >= {result.min_hours:g} h"):
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
