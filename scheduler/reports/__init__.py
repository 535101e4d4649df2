"""Monthly usage reports: what the harvested GPUs gave the research teams, and what it saved.

Pure computations first (a validated run table in, frames out), rendering at the edge
(``write_report``: Markdown, self-contained HTML, ``summary.csv`` and PNG charts).

**Input**: one row per attempt, the columns of ``SimResult.runs`` (``idlegpu simulate`` writes
them as ``runs_<policy>.csv``): ``job_id, team, kind, gpus, start, end, outcome, gpu_hours,
lost_gpu_hours``; times ISO 8601 (naive = UTC). ``runs_from_store`` builds the same table from
the job store's attempts.

**Definitions** (months and days are those of the pool's time zone, ``pool.timezone``):

- *useful GPU-hours* of an attempt: ``gpu_hours - lost_gpu_hours``, spread evenly over
  ``[start, end)`` and split at local month (and day) boundaries by time: an attempt from
  Jan 31 22:00 to Feb 1 04:00 gives 2/6 of its useful GPU-hours to January. *Held* GPU-hours
  (``gpu_hours``) are split the same way;
- *lost GPU-hours* (work thrown away when an attempt was preempted or stopped before its
  checkpoint) and *preemptions* (attempts with outcome ``preempted``) belong to the month in
  which the attempt ended (an attempt ending exactly at local midnight of the 1st ended in
  the month before);
- *jobs run*: distinct ``job_id`` with an attempt overlapping the month; *jobs finished*:
  distinct ``job_id`` with a ``finished`` attempt ending in the month;
- *GPU equivalents*: useful GPU-hours / (12 x days in month) on the 12-hour basis (GPUs lent
  for a 12-hour night every day), / (24 x days) on the 24-hour basis: 40,920 GPU-hours in a
  31-day month are 110 GPUs (12 h) or 55 GPUs (24 h);
- *month-over-month change*: useful GPU-hours relative to the month before (0.1 = +10 %;
  empty when the month before had none);
- *savings*: useful GPU-hours x price per GPU-hour; *cumulative savings* add up the reported
  months from the first one;
- *idle GPU-hours*: the pool's free GPUs (``pool_usage`` FREE: capacity minus headroom minus
  the services) summed over the month; *share used*: held GPU-hours / idle GPU-hours.
- *forecast accuracy* (``forecast_check``, with a history): the daemon's nightly forecast
  refresh replayed over the month (``idlegpu.scheduler.refresh.Refresher``, widening included), each
  evening's forecast scored on its next 24 hours: pooled, and per service the coverage of the
  admission quantile [strict y < q, plain y <= q], its verdict (``idlegpu.forecast.backtest``:
  calibrated when strict <= q <= plain), pinball, MAE, the evenings the refresh planned it
  with the wider quantile and the GPU-hours that held back.

**Money** is written with its ISO 4217 code, a space and the amount with thousands separators
and the currency's minor-unit decimals: ``KRW 75,000,000`` (0 decimals: KRW, JPY, ...),
``USD 1,234.56`` (2 decimals otherwise).

**Layout**: ``errors`` (``ReportError``), ``formatting`` (money, hours, shares), ``months``
(``Month``), ``runs`` (the run table in: files, frames, the job store), ``accounting`` (the
figures above per month, team, kind and day), ``idle`` (the pool's idle GPU-hours, by job size
on the nodes), ``accuracy`` (``forecast_check``), ``build`` (``Report``, ``build_report``),
``sections`` (what the report says, in order), ``rendering`` (Markdown, HTML, CSV, files) and
``charts`` (PNG). Everything is imported from here.
"""

from __future__ import annotations

from idlegpu.scheduler.reports.accounting import (
    SUMMARY_COLUMNS,
    breakdown,
    daily_usage,
    gpu_equivalent,
    month_figures,
    monthly_summary,
    split_by_edges,
    useful,
)
from idlegpu.scheduler.reports.accuracy import (
    DAILY_COVERAGE_COLUMNS,
    SERVICE_COVERAGE_COLUMNS,
    ForecastCheck,
    forecast_accuracy,
    forecast_check,
    forecast_check_days,
)
from idlegpu.scheduler.reports.build import Report, build_report
from idlegpu.scheduler.reports.charts import COVERAGE_CHART, write_charts
from idlegpu.scheduler.reports.errors import ReportError
from idlegpu.scheduler.reports.formatting import (
    ZERO_DECIMAL_CURRENCIES,
    currency_decimals,
    format_change,
    format_gpus,
    format_hours,
    format_money,
    format_share,
)
from idlegpu.scheduler.reports.idle import JobSizeIdle, idle_by_day, idle_by_month, job_size_idle
from idlegpu.scheduler.reports.months import Month, month_range
from idlegpu.scheduler.reports.rendering import (
    markdown_text,
    render_html,
    render_markdown,
    write_coverage_csv,
    write_report,
    write_summary_csv,
)
from idlegpu.scheduler.reports.runs import (
    OUTCOMES,
    RUN_COLUMNS,
    held_and_lost,
    notices_from_store,
    read_runs,
    runs_from_store,
    validate_runs,
)

__all__ = [
    "COVERAGE_CHART", "DAILY_COVERAGE_COLUMNS", "ForecastCheck", "JobSizeIdle", "Month", "OUTCOMES",
    "RUN_COLUMNS", "Report", "ReportError", "SERVICE_COVERAGE_COLUMNS", "SUMMARY_COLUMNS",
    "ZERO_DECIMAL_CURRENCIES", "breakdown", "build_report", "currency_decimals", "daily_usage",
    "forecast_accuracy", "forecast_check", "forecast_check_days", "format_change", "format_gpus",
    "format_hours", "format_money", "format_share", "gpu_equivalent", "held_and_lost",
    "idle_by_day", "idle_by_month", "job_size_idle", "markdown_text", "month_figures",
    "month_range", "monthly_summary", "notices_from_store", "read_runs", "render_html",
    "render_markdown", "runs_from_store", "split_by_edges", "useful", "validate_runs",
    "write_charts", "write_coverage_csv", "write_report", "write_summary_csv",
]
