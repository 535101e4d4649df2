"""What ``idlegpu report`` does (its signature: ``idlegpu.scheduler.cli.reports``): the monthly
report of the harvested GPUs, from a run table or the job store's attempts."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.markup import escape

from idlegpu.forecast.sources import read_history
from idlegpu.scheduler.cli.common import (
    _now,
    console,
    err_console,
)
from idlegpu.scheduler.cli.inputs import (
    _optional_config,
    _store_url,
)
from idlegpu.scheduler.config import ReportConfig
from idlegpu.scheduler.output import plain
from idlegpu.scheduler.reports import (
    Month,
    build_report,
    forecast_check,
    format_gpus,
    format_hours,
    format_money,
    format_share,
    idle_by_day,
    job_size_idle,
    notices_from_store,
    read_runs,
    runs_from_store,
    write_report,
)


def report(*, month: str, months: int, out: Path, runs: Path | None, store: str | None,
           history: Path | None, config: Path | None, price: float | None,
           currency: str | None) -> None:
    """``idlegpu report``."""
    from rich.progress import Progress

    if runs is not None and store is not None:
        raise typer.BadParameter("give --runs or --store, not both", param_hint="--runs")
    settings = _optional_config(config)
    defaults = settings.report if settings is not None else ReportConfig()
    tz = settings.pool.timezone if settings is not None else "UTC"
    if runs is None:
        from idlegpu.scheduler.adapters.store import JobStore

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
        frame = read_history(history)
        idle = idle_by_day(frame, settings)
        sizes = job_size_idle(frame, settings, month)
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
