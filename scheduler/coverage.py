"""Does the forecast keep its promise? Realised coverage per service, and when to widen.

Pure: no I/O, no clock; the caller passes the moment ``now``.

Every forecast refresh promises, per service, a replica curve at the planning quantile ``q``
(the admission confidence, 0.9): the service's replicas stay at or below it with probability
``q``. ``score`` takes the promises of the forecasts in use over the last ``window`` (each from
the moment it was made until the next one replaced it) and the replicas that really ran, and
gives per service the realised coverage: the share of steps at or below the promise, averaged
per hour. A service whose coverage is below ``q`` by more than chance, a one-sided binomial
test at 95 % on the hours scored (one sample per hour: the steps of an hour are far from
independent), over the last day (a launch) or over the whole window (a slow drift), is planned
with the wider quantile ``widened`` (q0.98) until it recovers: until a day is covered at ``q``
again. A launch widens its service at the refresh that evening; an ordinary day, or a few bad
hours, does not. The promise scored is the one at ``q`` (not the wider quantile planned), so
recovery means the forecast itself is back on target.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from functools import lru_cache

import numpy as np
import pandas as pd

from idlegpu.forecast.models.base import quantile_column
from idlegpu.forecast.schema import DS, REPLICAS, UNIQUE_ID, Y, series_id

WINDOW = timedelta(days=7)
RECENT = timedelta(days=1)
WIDENED = 0.98
MIN_HOURS = 12  # fewer hours scored: no verdict
SIGNIFICANCE = 0.05  # one-sided


@dataclass(frozen=True)
class Promise:
    """What one forecast refresh promised: per service, the ``quantile`` replicas per step
    (a Series on a UTC index), from ``made_at`` on."""

    made_at: datetime
    quantile: float
    replicas: Mapping[str, pd.Series] = field(default_factory=dict)


@dataclass(frozen=True)
class ServiceCoverage:
    """How a service's promises fared over the window, and the quantile to plan it with."""

    service: str
    target: float  # the quantile promised
    hours: int  # hours scored
    coverage: float  # share of steps at or below the promise (mean of the hours), NaN: none
    bound: float  # coverage below this is below the target by more than chance (NaN: none)
    last_day: float  # coverage over the last day (NaN: no sample)
    last_day_bound: float  # the last day's coverage below this is more than chance
    widened: bool
    quantile: float  # the quantile to plan the service with: ``target``, or the wider one

    def describe(self) -> str:
        if self.hours == 0:
            return f"{self.service}: no promise to score yet"
        text = (f"{self.service}: its q{self.target:g} forecasts covered {self.last_day:.0%} "
                f"of the last day and {self.coverage:.0%} of the last {self.hours} h (less "
                f"than {self.last_day_bound:.0%} and {self.bound:.0%} is worse than chance)")
        if self.widened:
            text += f"; planned with q{self.quantile:g} until it recovers"
        return text


def binomial_cdf(k: int, n: int, p: float) -> float:
    """P(X <= k) for X ~ Binomial(n, p)."""
    if k < 0:
        return 0.0
    if k >= n or p <= 0.0:
        return 1.0
    if p >= 1.0:
        return 0.0
    return _cdf(n, p)[k]


@lru_cache(maxsize=256)
def _cdf(n: int, p: float) -> tuple[float, ...]:
    """P(X <= k) for k = 0..n, X ~ Binomial(n, p) (0 < p < 1), from the log pmf."""
    logs = [math.lgamma(n + 1) - math.lgamma(i + 1) - math.lgamma(n - i + 1)
            + i * math.log(p) + (n - i) * math.log1p(-p) for i in range(n + 1)]
    top = max(logs)
    pmf = [math.exp(v - top) for v in logs]
    total = sum(pmf)
    out, acc = [], 0.0
    for v in pmf:
        acc += v
        out.append(min(1.0, acc / total))
    return tuple(out)


@lru_cache(maxsize=256)
def coverage_bound(n: int, p: float, significance: float = SIGNIFICANCE) -> float:
    """The lowest share of ``n`` samples covered that is still consistent with a coverage of
    ``p`` at the one-sided ``significance``: the smallest ``k / n`` with P(X <= k) >=
    ``significance``. Fewer covered is below ``p`` by more than chance."""
    for k in range(n + 1):
        if binomial_cdf(k, n, p) >= significance:
            return k / n
    return 1.0


def in_use(promises: Iterable[Promise], start: datetime, end: datetime) -> dict[str, pd.Series]:
    """Per service, what the forecasts in use promised from ``start`` to ``end``: each
    promise from its ``made_at`` until the next one was made."""
    ordered = sorted(promises, key=lambda p: p.made_at)
    parts: dict[str, list[pd.Series]] = {}
    for i, promise in enumerate(ordered):
        lo = max(pd.Timestamp(promise.made_at), pd.Timestamp(start))
        hi = pd.Timestamp(ordered[i + 1].made_at) if i + 1 < len(ordered) else pd.Timestamp(end)
        hi = min(hi, pd.Timestamp(end))
        if lo >= hi:
            continue
        aware = lo.tz is not None and hi.tz is not None
        # as UTC datetime64, the values of a tz-aware index
        bounds = np.array([t.tz_convert("UTC").tz_localize(None).to_datetime64()
                           for t in (lo, hi)]) if aware else None
        for service, curve in promise.replicas.items():
            index = curve.index
            if (bounds is not None and isinstance(index, pd.DatetimeIndex)
                    and index.tz is not None and index.is_monotonic_increasing):
                # a forecast's curve: by bisection
                first, stop = np.searchsorted(index.tz_convert(None).to_numpy(), bounds,
                                              side="left")
                part = curve.iloc[first:stop]
            else:
                part = curve[(curve.index >= lo) & (curve.index < hi)]
            if len(part):
                parts.setdefault(service, []).append(part)
    return {s: pd.concat(p).sort_index() for s, p in parts.items()}


def score(
    promises: Iterable[Promise],
    history: pd.DataFrame,
    now: datetime,
    services: Sequence[str],
    *,
    target: float,
    widened: float = WIDENED,
    window: timedelta = WINDOW,
    recent: timedelta = RECENT,
    significance: float = SIGNIFICANCE,
    min_hours: int = MIN_HOURS,
) -> dict[str, ServiceCoverage]:
    """Per service of ``services``: the realised coverage over the ``window`` before ``now``
    of the promises in use (``in_use``) against the replicas of ``history`` (tidy, series
    ``<service>/replicas``), and whether to plan it with ``widened`` (see the module)."""
    now_ts = pd.Timestamp(now)
    start = now_ts - pd.Timedelta(window)
    promised = in_use(promises, start.to_pydatetime(), now_ts.to_pydatetime())
    window_rows = history[(history[DS] >= start) & (history[DS] < now_ts)]
    by_series = {uid: rows for uid, rows in window_rows.groupby(UNIQUE_ID, observed=True)}
    out = {}
    for service in services:
        rows = by_series.get(series_id(service, REPLICAS))
        actual = (rows.set_index(DS)[Y].sort_index() if rows is not None
                  else pd.Series(dtype=float))
        hourly = _hourly_coverage(promised.get(service), actual)
        hours = len(hourly)
        coverage = float(hourly.mean()) if hours else float("nan")
        bound = coverage_bound(hours, target, significance) if hours else float("nan")
        last = hourly[hourly.index >= now_ts - pd.Timedelta(recent)] if hours else hourly
        last_day = float(last.mean()) if len(last) else float("nan")
        last_bound = coverage_bound(len(last), target, significance) if len(last) else math.nan
        # below by more than chance over the window or the last day, and not yet recovered
        low = (_below(coverage, hours, bound, min_hours)
               or _below(last_day, len(last), last_bound, min_hours))
        wide = bool(low and len(last) and last_day < target)
        out[service] = ServiceCoverage(service, target, hours, coverage, bound, last_day,
                                       last_bound, wide, widened if wide else target)
    return out


def _below(coverage: float, n: int, bound: float, min_hours: int) -> bool:
    """``n`` hours covered at ``coverage`` on average: fewer than ``bound`` allows?"""
    return n >= min_hours and math.floor(coverage * n + 1e-9) < round(bound * n)


def _hourly_coverage(promised: pd.Series | None, actual: pd.Series) -> pd.Series:
    """Per hour with a promise and an actual: the share of its steps at or below the promise."""
    if promised is None or promised.empty or actual.empty:
        return pd.Series(dtype=float)
    if promised.index.is_unique and actual.index.is_unique:
        # the inner join in numpy (each refresh scores a week of every service)
        at = promised.index.get_indexer(actual.index)
        both = at >= 0
        y = actual.to_numpy(dtype=float)[both]
        p = promised.to_numpy(dtype=float)[at[both]]
        kept = ~(np.isnan(y) | np.isnan(p))
        if not kept.any():
            return pd.Series(dtype=float)
        covered = (y[kept] <= p[kept] + 1e-9).astype(float)
        hour, hours = pd.factorize(actual.index[both][kept].floor("h"), sort=True)
        # a share of 0s and 1s: the sums are exact, so the same as the groupby's mean
        shares = np.bincount(hour, weights=covered) / np.bincount(hour)
        return pd.Series(shares, index=hours)
    joined = pd.concat({"p": promised, "y": actual}, axis=1, join="inner").dropna()
    if joined.empty:
        return pd.Series(dtype=float)
    covered = (joined["y"].to_numpy() <= joined["p"].to_numpy() + 1e-9).astype(float)
    hours = joined.index.floor("h")
    return pd.Series(covered, index=joined.index).groupby(hours).mean()


def planned_quantiles(coverage: Mapping[str, ServiceCoverage]) -> dict[str, float]:
    """The services planned with a wider quantile than the target, and that quantile."""
    return {s: c.quantile for s, c in coverage.items() if c.widened}


def promise_of(forecast: pd.DataFrame, made_at: datetime, services: Sequence[str],
               quantile: float) -> Promise:
    """The promise of a tidy replica forecast (``unique_id, ds, q...``) at ``quantile``."""
    column = quantile_column(quantile)
    curves = {}
    for service in services:
        rows = forecast[forecast[UNIQUE_ID] == series_id(service, REPLICAS)]
        if len(rows):
            curves[service] = pd.Series(rows[column].to_numpy(dtype=float),
                                        index=pd.DatetimeIndex(rows[DS]))
    return Promise(made_at, quantile, curves)


__all__ = [
    "WIDENED",
    "Promise",
    "ServiceCoverage",
    "binomial_cdf",
    "coverage_bound",
    "in_use",
    "planned_quantiles",
    "promise_of",
    "score",
]
