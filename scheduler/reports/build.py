"""The report: everything it shows, computed for the months ending with the report month."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import pandas as pd

from idlegpu.scheduler.reports.accounting import (
    _breakdown,
    _month_runs,
    daily_usage,
    month_figures,
    monthly_summary,
)
from idlegpu.scheduler.reports.accuracy import ForecastCheck
from idlegpu.scheduler.reports.errors import ReportError
from idlegpu.scheduler.reports.idle import JobSizeIdle, idle_by_month
from idlegpu.scheduler.reports.months import Month, month_range
from idlegpu.scheduler.reports.runs import _TOLERANCE


@dataclass(frozen=True)
class Report:
    month: Month
    months: list[Month]
    tz: str
    pool: str
    price: float
    currency: str
    summary: pd.DataFrame
    teams: pd.DataFrame
    kinds: pd.DataFrame
    daily: pd.DataFrame
    idle_daily: pd.Series | None = None
    commands: list[str] = field(default_factory=list)
    accuracy: dict[str, float] | None = None
    """Forecast accuracy of the report month (see ``forecast_accuracy``), when computed."""
    forecast: ForecastCheck | None = None
    """Per service: coverage, verdict and widened evenings of the month (``forecast_check``)."""
    job_sizes: JobSizeIdle | None = None
    """Idle capacity of the month by job size on the nodes (``job_size_idle``), when known."""
    notices: dict[str, float] | None = None
    """The month's checkpoint notices (``notices_from_store``), when read from a store."""

    @property
    def row(self) -> pd.Series:
        return self.summary.iloc[-1]


def build_report(
    runs: pd.DataFrame,
    month: str | Month,
    *,
    months: int = 1,
    tz: str = "Asia/Seoul",
    price: float = 3000.0,
    currency: str = "KRW",
    idle_daily: pd.Series | None = None,
    pool: str = "GPU pool",
    commands: Sequence[str] = (),
    accuracy: dict[str, float] | None = None,
    forecast: ForecastCheck | None = None,
    job_sizes: JobSizeIdle | None = None,
    notices: dict[str, float] | None = None,
) -> Report:
    """Compute everything a report shows for the ``months`` months ending with ``month``
    (``forecast``: the forecast check of the month, ``forecast_check``; its pooled figures
    are the ``accuracy`` unless given)."""
    if price < 0 or not math.isfinite(price):
        raise ReportError(f"the price per GPU-hour must be a number >= 0 (got {price})")
    currency = currency.strip()
    if len(currency) != 3 or not currency.isalpha() or not currency.isupper():
        raise ReportError(f"currency {currency!r} is not an ISO 4217 code (3 uppercase letters, "
                          "e.g. KRW or USD)")
    span = month_range(month, months)
    last = span[-1]
    figures = month_figures(runs, last, tz)
    if figures["attempts"] == 0:
        covered = ("the runs are empty" if runs.empty else
                   f"the runs cover {runs['start'].min().tz_convert(tz):%Y-%m-%d} to "
                   f"{runs['end'].max().tz_convert(tz):%Y-%m-%d}")
        hint = "nothing to report" if runs.empty else "pick a --month inside them"
        raise ReportError(f"no runs in {last.label} ({tz}): {covered}; {hint}")
    if figures["useful_gpu_hours"] <= _TOLERANCE:
        raise ReportError(
            f"no useful GPU-hours in {last.label} ({tz}): all {figures['attempts']} attempt(s) "
            f"failed or lost their work ({figures['failed_attempts']} failed or cancelled, "
            f"{figures['preemptions']} preempted, {figures['lost_gpu_hours']:,.1f} GPU-hours lost)"
        )
    idle = idle_by_month(idle_daily) if idle_daily is not None else None
    summary = monthly_summary(runs, span, tz, price=price, currency=currency, idle=idle,
                              computed={last: figures})
    last_runs = _month_runs(runs, last, tz)
    return Report(
        month=last, months=span, tz=tz, pool=pool, price=price, currency=currency,
        summary=summary,
        teams=_breakdown(last_runs, "team", price=price),
        kinds=_breakdown(last_runs, "kind", price=price),
        daily=daily_usage(runs, span, tz),
        idle_daily=idle_daily, commands=list(commands),
        accuracy=accuracy if accuracy is not None or forecast is None else forecast.accuracy,
        forecast=forecast, job_sizes=job_sizes, notices=notices,
    )
