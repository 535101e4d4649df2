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
"""

from __future__ import annotations

import base64
import html
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import date, datetime
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from idlegpu.forecast.errors import PermanentError
from idlegpu.forecast.models import CACHED_MODELS
from idlegpu.forecast.tables import write_csv

RUN_COLUMNS = (
    "job_id", "team", "kind", "gpus", "start", "end", "outcome", "gpu_hours", "lost_gpu_hours",
)
OUTCOMES = ("finished", "preempted", "stopped", "running", "failed", "cancelled")
SUMMARY_COLUMNS = (
    "month", "days", "useful_gpu_hours", "lost_gpu_hours", "preemptions", "planned_stops",
    "jobs_run", "jobs_finished", "gpus_12h", "gpus_24h", "mom_change", "savings", "cumulative_savings",
    "idle_gpu_hours", "idle_share_used", "currency",
)
ZERO_DECIMAL_CURRENCIES = frozenset(
    {"BIF", "CLP", "DJF", "GNF", "ISK", "JPY", "KMF", "KRW", "PYG", "RWF", "UGX", "UYI", "VND",
     "VUV", "XAF", "XOF", "XPF"}
)
_TOLERANCE = 1e-6


class ReportError(PermanentError):
    """The runs cannot make a report (bad rows, nothing in the month, ...)."""


# --------------------------------------------------------------------------- formatting


def currency_decimals(currency: str) -> int:
    return 0 if currency.upper() in ZERO_DECIMAL_CURRENCIES else 2


def format_money(amount: float, currency: str) -> str:
    """``KRW 75,000,000``, ``USD 1,234.56``: ISO code, space, amount at its minor unit."""
    if amount is None or not math.isfinite(amount):
        return "n/a"
    decimals = currency_decimals(currency)
    text = f"{abs(amount):,.{decimals}f}"
    sign = "-" if round(amount, decimals) < 0 else ""
    return f"{sign}{currency.upper()} {text}"


def format_hours(value: float) -> str:
    return "n/a" if value is None or not math.isfinite(value) else f"{value:,.1f}"


format_gpus = format_hours
"""GPU counts are written like hours: one decimal, thousands separators."""


def format_change(value: float) -> str:
    return "n/a" if value is None or not math.isfinite(value) else f"{value:+.1%}"


def format_share(value: float) -> str:
    return "n/a" if value is None or not math.isfinite(value) else f"{value:.1%}"


# --------------------------------------------------------------------------- months


@dataclass(frozen=True, order=True)
class Month:
    year: int
    month: int

    @classmethod
    def parse(cls, text: str) -> Month:
        try:
            parsed = datetime.strptime(text.strip(), "%Y-%m")
        except ValueError:
            raise ReportError(f"month {text!r} is not YYYY-MM (e.g. 2026-01)") from None
        return cls(parsed.year, parsed.month)

    @property
    def label(self) -> str:
        return f"{self.year:04d}-{self.month:02d}"

    @property
    def days(self) -> int:
        return pd.Period(self.label, freq="M").days_in_month

    def shift(self, months: int) -> Month:
        index = self.year * 12 + self.month - 1 + months
        return Month(index // 12, index % 12 + 1)

    def start(self, tz: str) -> pd.Timestamp:
        """Local midnight of the first day, as a UTC timestamp."""
        return pd.Timestamp(self.year, self.month, 1).tz_localize(tz).tz_convert("UTC")

    def end(self, tz: str) -> pd.Timestamp:
        return self.shift(1).start(tz)

    def day_edges(self, tz: str) -> pd.DatetimeIndex:
        """Local midnights from the first day to the first of the next month, in UTC."""
        first = pd.Timestamp(self.year, self.month, 1)
        local = pd.date_range(first, periods=self.days + 1, freq="D").tz_localize(tz)
        return local.tz_convert("UTC")


def month_range(month: str | Month, months: int = 1) -> list[Month]:
    """The ``months`` months ending with ``month`` (oldest first)."""
    last = month if isinstance(month, Month) else Month.parse(month)
    if months < 1:
        raise ReportError(f"--months must be at least 1 (got {months})")
    return [last.shift(k) for k in range(1 - months, 1)]


def gpu_equivalent(gpu_hours: float, days: int, hours_per_day: float) -> float:
    """GPUs that, lent ``hours_per_day`` every day of a ``days``-day month, give ``gpu_hours``."""
    return gpu_hours / (hours_per_day * days)


# --------------------------------------------------------------------------- runs in


def read_runs(path: str | Path) -> pd.DataFrame:
    """Read and validate a run table (CSV, or Parquet by extension)."""
    path = Path(path)
    if not path.is_file():
        raise ReportError(f"runs file {path} not found; `idlegpu simulate` writes runs_<policy>.csv")
    try:
        if path.suffix == ".parquet":
            frame = pd.read_parquet(path)
        else:
            frame = pd.read_csv(path, dtype=str, keep_default_na=False)
    except Exception as exc:  # pandas raises many types for unreadable files
        raise ReportError(f"{path}: cannot read the runs file: {exc}") from exc
    return validate_runs(frame, source=str(path), csv=path.suffix != ".parquet")


def validate_runs(frame: pd.DataFrame, *, source: str = "runs", csv: bool = False) -> pd.DataFrame:
    """The run table with typed columns (UTC times, int GPUs, float hours), or a ``ReportError``
    naming the first bad row (its CSV line when ``csv``) and field."""
    missing = [c for c in RUN_COLUMNS if c not in frame.columns]
    if missing:
        raise ReportError(
            f"{source}: missing column(s) {', '.join(missing)}; a runs file has the columns "
            f"{', '.join(RUN_COLUMNS)} (as `idlegpu simulate` writes them)"
        )
    frame = frame.reset_index(drop=True)

    def where(i: int) -> str:
        return f"{source} line {i + 2}" if csv else f"{source} row {i}"

    def check(bad: pd.Series, column: str, message: Callable[[int], str]) -> None:
        """Fail on the first row flagged ``bad``; ``message(i)`` says what is wrong with row i."""
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            what, count = message(i), int(bad.sum())
            more = f" (and {count - 1} more bad row(s))" if count > 1 else ""
            raise ReportError(f"{where(i)}: {column} {what}{more}")

    def text(column: str) -> pd.Series:
        values = frame[column].astype("string").str.strip()
        check(values.isna() | (values == ""), column, lambda i: "is empty")
        return values.astype(str)

    def number(column: str) -> pd.Series:
        raw = frame[column]
        values = pd.to_numeric(raw, errors="coerce")
        check(values.isna() | ~np.isfinite(values.astype(float)), column,
              lambda i: f"{raw.iloc[i]!r} is not a number")
        return values.astype(float)

    def moment(column: str) -> pd.Series:
        raw = frame[column]
        if pd.api.types.is_datetime64_any_dtype(raw):
            values = raw.dt.tz_localize("UTC") if raw.dt.tz is None else raw.dt.tz_convert("UTC")
        else:
            values = pd.Series(
                [_parse_instant(v) for v in raw], index=frame.index, dtype="datetime64[ns, UTC]"
            )
        check(values.isna(), column, lambda i: f"{raw.iloc[i]!r} is not an ISO 8601 time "
              "(e.g. 2026-01-31T22:00:00+09:00)")
        return values

    def hours(column: str) -> pd.Series:
        values = number(column)
        check(values < 0, column, lambda i: f"must not be negative (got {values.iloc[i]:g})")
        return values

    out = pd.DataFrame({c: text(c) for c in ("job_id", "team", "kind")})
    gpus = number("gpus")
    check((gpus <= 0) | (gpus != gpus.round()), "gpus",
          lambda i: f"must be a positive whole number (got {frame['gpus'].iloc[i]})")
    out["gpus"] = gpus.astype(int)
    out["start"] = moment("start")
    out["end"] = moment("end")
    check(out["end"] < out["start"], "end",
          lambda i: f"{frame['end'].iloc[i]} is before start {frame['start'].iloc[i]}")
    outcome = text("outcome").str.lower()
    check(~outcome.isin(OUTCOMES), "outcome",
          lambda i: f"{outcome.iloc[i]!r} is unknown; use one of {', '.join(OUTCOMES)}")
    out["outcome"] = outcome
    for column in ("gpu_hours", "lost_gpu_hours"):
        out[column] = hours(column)
    check(out["lost_gpu_hours"] > out["gpu_hours"] * (1 + _TOLERANCE) + _TOLERANCE,
          "lost_gpu_hours", lambda i: f"({out['lost_gpu_hours'].iloc[i]:g}) is above gpu_hours "
          f"({out['gpu_hours'].iloc[i]:g})")
    return out


def _parse_instant(value: Any) -> pd.Timestamp | None:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return None
    try:
        stamp = pd.Timestamp(str(value).strip().replace("Z", "+00:00"))
    except (ValueError, TypeError):
        return None
    if stamp is pd.NaT:
        return None
    return stamp.tz_localize("UTC") if stamp.tzinfo is None else stamp.tz_convert("UTC")


_STORE_OUTCOMES = {
    "succeeded": "finished", "preempted": "preempted", "requeued": "stopped",
    "failed": "failed", "cancelled": "cancelled",
}


def held_and_lost(outcome: str | None, held: float, lost: float | None) -> tuple[float, float]:
    """One attempt's held and lost GPU-time (in the unit given) as every figure counts them:
    a failed attempt loses all it held; any other loses what the store recorded (nothing when
    it recorded none), never more than it held. Its useful GPU-time is held minus lost
    (``useful``); the daemon's harvested counter and ``runs_from_store`` both count this way."""
    lost = held if outcome == "failed" else (lost or 0.0)
    return held, min(lost, held)


def runs_from_store(store: Any, now: datetime) -> pd.DataFrame:
    """The run table of a ``JobStore``: one row per attempt (admission to end; an open
    attempt runs until ``now``), held and lost GPU-hours as ``held_and_lost`` counts them."""
    rows = []
    for unit in store.queue(include_terminal=True):
        for att in store.attempts(unit.id):
            end = att.ended_at or now
            held_s = (att.gpu_seconds if att.gpu_seconds is not None
                      else att.gpus * (end - att.admitted_at).total_seconds())
            outcome = ("running" if att.ended_at is None
                       else _STORE_OUTCOMES.get(str(att.outcome), "stopped"))
            held_s, lost_s = held_and_lost(outcome, held_s, att.lost_gpu_seconds)
            rows.append({
                "job_id": unit.id, "team": unit.team, "kind": unit.kind, "gpus": att.gpus,
                "start": att.admitted_at, "end": end, "outcome": outcome,
                "gpu_hours": held_s / 3600, "lost_gpu_hours": lost_s / 3600,
            })
    return validate_runs(pd.DataFrame(rows, columns=list(RUN_COLUMNS)), source="store")


def notices_from_store(store: Any, month: Month, tz: str) -> dict[str, float]:
    """The month's checkpoint notices from the store's log (``NOTICE`` events, by when they
    ended): sent, ``answered`` in time, ``missed`` (stopped at the deadline), ``cut`` (the
    service needed the GPUs first), ``ended`` (the attempt ended first), and
    ``saved_gpu_hours``: what the answered ones kept that a blind stop would have lost (the
    work since their last periodic checkpoint)."""
    from idlegpu.scheduler.types import EventKind

    start, end = month.start(tz).to_pydatetime(), month.end(tz).to_pydatetime()
    figures = {"sent": 0.0, "answered": 0.0, "missed": 0.0, "cut": 0.0, "ended": 0.0,
               "saved_gpu_hours": 0.0}
    for event in store.events(start, end):
        if event.kind is not EventKind.NOTICE:
            continue
        outcome = str(event.detail.get("outcome", ""))
        figures["sent"] += 1
        if outcome in figures:
            figures[outcome] += 1
        saved = event.detail.get("saved_gpu_seconds")
        if isinstance(saved, (int, float)) and math.isfinite(saved) and saved > 0:
            figures["saved_gpu_hours"] += saved / 3600
    return figures


# --------------------------------------------------------------------------- computations


def split_by_edges(runs: pd.DataFrame, values: np.ndarray, edges: pd.DatetimeIndex) -> np.ndarray:
    """``values`` of each run spread evenly over its ``[start, end)`` and cut at ``edges``
    (UTC): an array runs x periods (``len(edges) - 1``). A run of zero length counts whole in
    the period ``(edge, next edge]`` holding its end. Parts outside the edges are dropped."""
    start = _ns(runs["start"])[:, None]
    end = _ns(runs["end"])[:, None]
    lo = edges.tz_convert("UTC").tz_localize(None).to_numpy().astype("datetime64[ns]")
    lo = lo.astype(np.int64)
    b0, b1 = lo[None, :-1], lo[None, 1:]
    duration = (end - start).astype(float)
    overlap = np.clip(np.minimum(end, b1) - np.maximum(start, b0), 0, None).astype(float)
    with np.errstate(invalid="ignore", divide="ignore"):
        share = np.where(duration > 0, overlap / np.where(duration > 0, duration, 1), 0.0)
    instant = (duration == 0) & (end > b0) & (end <= b1)
    share = np.where(instant, 1.0, share)
    return share * np.asarray(values, dtype=float)[:, None]


def _ns(times: pd.Series) -> np.ndarray:
    """UTC nanoseconds since the epoch, whatever the resolution of the column."""
    return times.dt.tz_convert("UTC").dt.tz_localize(None).to_numpy().astype(
        "datetime64[ns]").astype(np.int64)


def _in_period(times: pd.Series, start: pd.Timestamp, end: pd.Timestamp) -> pd.Series:
    """End times in ``(start, end]``: an attempt ending at midnight ended the day before."""
    return (times > start) & (times <= end)


def _overlaps(runs: pd.DataFrame, start: pd.Timestamp, end: pd.Timestamp) -> pd.Series:
    spans = (runs["start"] < end) & (runs["end"] > start)
    instant = (runs["start"] == runs["end"]) & _in_period(runs["end"], start, end)
    return spans | instant


def useful(runs: pd.DataFrame) -> np.ndarray:
    return (runs["gpu_hours"] - runs["lost_gpu_hours"]).to_numpy(dtype=float)


def _month_masks(
    runs: pd.DataFrame, month: Month, tz: str
) -> tuple[pd.DatetimeIndex, pd.Series, pd.Series]:
    """The month's ``[start, end]`` edges (UTC), the runs that ended in it and those that
    overlap it (see the module doc)."""
    start, end = month.start(tz), month.end(tz)
    edges = pd.DatetimeIndex([start, end])
    return edges, _in_period(runs["end"], start, end), _overlaps(runs, start, end)


def month_figures(runs: pd.DataFrame, month: Month, tz: str) -> dict[str, float]:
    """The month's figures before money: useful/held/lost GPU-hours, preemptions, jobs."""
    edges, ended, overlapping = _month_masks(runs, month, tz)
    return {
        "attempts": int(overlapping.sum()),
        "useful_gpu_hours": float(split_by_edges(runs, useful(runs), edges).sum()),
        "held_gpu_hours": float(split_by_edges(runs, runs["gpu_hours"].to_numpy(), edges).sum()),
        "lost_gpu_hours": float(runs.loc[ended, "lost_gpu_hours"].sum()),
        "preemptions": int((ended & (runs["outcome"] == "preempted")).sum()),
        "planned_stops": int((ended & (runs["outcome"] == "stopped")).sum()),
        "jobs_run": int(runs.loc[overlapping, "job_id"].nunique()),
        "jobs_finished": int(runs.loc[ended & (runs["outcome"] == "finished"), "job_id"].nunique()),
        "failed_attempts": int((overlapping & runs["outcome"].isin(["failed", "cancelled"])).sum()),
    }


def monthly_summary(
    runs: pd.DataFrame,
    months: Sequence[Month],
    tz: str,
    *,
    price: float,
    currency: str,
    idle: pd.Series | None = None,
    computed: Mapping[Month, dict[str, float]] | None = None,
) -> pd.DataFrame:
    """One row per month (``SUMMARY_COLUMNS``). ``idle``: idle GPU-hours by month label;
    ``computed``: ``month_figures`` already computed, by month (the others are computed)."""
    known = computed or {}

    def figures_of(month: Month) -> dict[str, float]:
        return known[month] if month in known else month_figures(runs, month, tz)

    previous = figures_of(months[0].shift(-1))["useful_gpu_hours"]
    rows, cumulative = [], 0.0
    for month in months:
        figures = figures_of(month)
        hours = figures["useful_gpu_hours"]
        savings = hours * price
        cumulative += savings
        idle_h = float(idle.get(month.label, np.nan)) if idle is not None else np.nan
        rows.append({
            "month": month.label,
            "days": month.days,
            "useful_gpu_hours": hours,
            "lost_gpu_hours": figures["lost_gpu_hours"],
            "preemptions": figures["preemptions"],
            "planned_stops": figures["planned_stops"],
            "jobs_run": figures["jobs_run"],
            "jobs_finished": figures["jobs_finished"],
            "gpus_12h": gpu_equivalent(hours, month.days, 12),
            "gpus_24h": gpu_equivalent(hours, month.days, 24),
            "mom_change": hours / previous - 1 if previous > 0 else np.nan,
            "savings": savings,
            "cumulative_savings": cumulative,
            "idle_gpu_hours": idle_h,
            "idle_share_used": (figures["held_gpu_hours"] / idle_h
                                if idle_h and math.isfinite(idle_h) and idle_h > 0 else np.nan),
            "currency": currency,
        })
        previous = hours
    return pd.DataFrame(rows, columns=list(SUMMARY_COLUMNS))


def breakdown(runs: pd.DataFrame, month: Month, tz: str, by: str, *, price: float) -> pd.DataFrame:
    """The month per ``by`` (``team`` or ``kind``): jobs run and finished, useful and lost
    GPU-hours, preemptions, share of the useful GPU-hours and savings; sorted by useful."""
    return _breakdown(_month_runs(runs, month, tz), by, price=price)


def _month_runs(runs: pd.DataFrame, month: Month, tz: str) -> pd.DataFrame:
    """The runs that overlap or ended in the month, with their useful GPU-hours in it
    (``_useful``) and whether they ended in it (``_ended``) or overlap it (``_over``)."""
    edges, ended, overlapping = _month_masks(runs, month, tz)
    part = split_by_edges(runs, useful(runs), edges)[:, 0]
    frame = runs.assign(_useful=part, _ended=ended, _over=overlapping)
    return frame[overlapping | ended]


def _breakdown(frame: pd.DataFrame, by: str, *, price: float) -> pd.DataFrame:
    """``breakdown`` of the runs of a month as ``_month_runs`` gives them."""
    rows = []
    for key, group in frame.groupby(by, sort=True):
        rows.append({
            by: key,
            "jobs_run": group.loc[group["_over"], "job_id"].nunique(),
            "jobs_finished": group.loc[group["_ended"] & (group["outcome"] == "finished"),
                                       "job_id"].nunique(),
            "useful_gpu_hours": group["_useful"].sum(),
            "lost_gpu_hours": group.loc[group["_ended"], "lost_gpu_hours"].sum(),
            "preemptions": int((group["_ended"] & (group["outcome"] == "preempted")).sum()),
        })
    out = pd.DataFrame(rows, columns=[by, "jobs_run", "jobs_finished", "useful_gpu_hours",
                                      "lost_gpu_hours", "preemptions"])
    total = out["useful_gpu_hours"].sum()
    out["share"] = out["useful_gpu_hours"] / total if total > 0 else np.nan
    out["savings"] = out["useful_gpu_hours"] * price
    return out.sort_values(["useful_gpu_hours", by], ascending=[False, True]).reset_index(drop=True)


def daily_usage(runs: pd.DataFrame, months: Sequence[Month], tz: str) -> pd.DataFrame:
    """Useful GPU-hours per local day (index: dates) and team (columns), plus ``held``
    (all GPU-hours held by jobs, useful or not), for the days of ``months``."""
    edges = pd.DatetimeIndex(
        sorted({t for m in months for t in m.day_edges(tz)})
    )
    days = edges[:-1].tz_convert(tz).tz_localize(None).normalize()
    parts = split_by_edges(runs, useful(runs), edges)
    out = pd.DataFrame(index=pd.DatetimeIndex(days, name="date"))
    for team in sorted(runs["team"].unique()):
        mask = (runs["team"] == team).to_numpy()
        out[team] = parts[mask].sum(axis=0)
    out["held"] = split_by_edges(runs, runs["gpu_hours"].to_numpy(), edges).sum(axis=0)
    return out


def idle_by_day(history: pd.DataFrame, settings: Any) -> pd.Series:
    """Idle GPU-hours per local day of the pool (``pool_usage`` FREE summed)."""
    from idlegpu.forecast.capacity import daily_idle_gpu_hours, pool_usage

    daily = daily_idle_gpu_hours(pool_usage(history, settings), settings.pool.timezone)
    return daily["idle_gpu_hours"]


@dataclass(frozen=True)
class JobSizeIdle:
    """Idle capacity of the report month by job size on the pool's nodes (``job_size_idle``)."""

    by_size: pd.DataFrame | None
    """``idlegpu.forecast.nodes.NodeIdle.between`` of the month; None: the pool has no node
    shapes."""
    note: str
    """How it was counted (or why it was not)."""


def job_size_idle(history: pd.DataFrame, settings: Any, month: str | Month) -> JobSizeIdle:
    """The idle GPU-hours of ``month`` usable by 1-, 4-, 8-GPU and multi-node jobs on
    ``pool.nodes`` with the services placed by ``pool.placement`` (the placement replayed over
    the whole history, so the month starts where the replicas really sat)."""
    from idlegpu.forecast.capacity import pool_usage
    from idlegpu.forecast.nodes import node_idle

    month = Month.parse(month) if isinstance(month, str) else month
    nodes = node_idle(pool_usage(history, settings), settings)
    if nodes is None:
        return JobSizeIdle(None, "The pool has no node shapes (pool.nodes): idle GPUs are "
                                 "counted for the pool as one bin, whatever the jobs' sizes.")
    tz = settings.pool.timezone
    count, largest = len(nodes.node_gpus), max(nodes.node_gpus)
    return JobSizeIdle(
        nodes.between(month.start(tz), month.end(tz)),
        f"On the {count} nodes of pool.nodes with the services' replicas placed "
        f"{nodes.strategy} (pool.placement; the kube-scheduler's "
        f"{'LeastAllocated' if nodes.strategy == 'spread' else 'MostAllocated'} scoring): a "
        f"job's GPUs must be free on one node, a multi-node job takes 2 or more whole "
        f"{largest}-GPU nodes; the pool view counts every free GPU as one bin.",
    )


def idle_by_month(idle_daily: pd.Series) -> pd.Series:
    """Idle GPU-hours per month label (``YYYY-MM``) from ``idle_by_day``."""
    if idle_daily.empty:
        return pd.Series(dtype=float)
    labels = pd.DatetimeIndex(idle_daily.index).strftime("%Y-%m")
    return idle_daily.groupby(labels).sum()


# --------------------------------------------------------------------------- the report


SERVICE_COVERAGE_COLUMNS = (
    "month", "service", "forecasts", "points", "quantile", "strict_coverage", "coverage",
    "verdict", "pinball", "mae", "evenings", "days_widened", "widened_on", "widened_quantile",
    "held_back_gpu_hours", "served_by", "skill",
)
DAILY_COVERAGE_COLUMNS = (
    "date", "made_at", "service", "points", "strict_coverage", "coverage", "widened",
    "planned_quantile", "tracked_last_day", "tracked_week", "held_back_gpu_hours",
)


@dataclass(frozen=True)
class ForecastCheck:
    """How the nightly forecasts of a month (or of any run of days) kept their promise,
    pooled and per service.

    ``accuracy``: the pooled figures (``forecast_accuracy``); ``services``: one row per
    service (``SERVICE_COVERAGE_COLUMNS``; its ``month`` is the ``label``); ``daily``: one row
    per nightly refresh and service (``DAILY_COVERAGE_COLUMNS``): the coverage of that
    evening's forecast over its next 24 hours, and whether that refresh planned the service
    wider. ``month`` is None for a check of days (``forecast_check_days``)."""

    month: Month | None
    confidence: float
    widened_quantile: float
    refresh_hour: int
    accuracy: dict[str, float]
    services: pd.DataFrame
    daily: pd.DataFrame
    held_back_gpu_hours: float
    """GPU-hours the pool's plan promised free less than the ``confidence`` forecast would
    have, over the 24 hours after each refresh that widened a service."""
    label: str = ""
    """What was checked: the month (``2026-01``) or the days (``2025-12-31 to 2026-01-27``)."""
    evenings: int = 0
    """The evenings asked for (a history too short for some of them scores fewer)."""

    @property
    def widened(self) -> pd.DataFrame:
        """The services widened at least once, most days first."""
        rows = self.services[self.services["days_widened"] > 0]
        return rows.sort_values(["days_widened", "service"], ascending=[False, True])


def forecast_check(
    history: pd.DataFrame, settings: Any, month: str | Month, *, confidence: float | None = None,
    model: str = "auto", on_step: Callable[[int, int], None] | None = None,
) -> ForecastCheck:
    """Replay the daemon's nightly forecast refresh over ``month`` and score it
    (``forecast_check_days`` over the local days of the month)."""
    m = Month.parse(month) if isinstance(month, str) else month
    tz = settings.pool.timezone
    days = [d.tz_convert(tz).normalize()
            for d in pd.date_range(m.start(tz), m.end(tz), freq="D", inclusive="left")]
    return _replay_check(history, settings, days, m.label, month=m, confidence=confidence,
                         model=model, on_step=on_step)


def forecast_check_days(
    history: pd.DataFrame, settings: Any, first: date, last: date, *,
    confidence: float | None = None, model: str = "auto",
    on_step: Callable[[int, int], None] | None = None,
) -> ForecastCheck:
    """Replay the daemon's nightly forecast refresh on the local days ``first`` to ``last``
    (dates, both included) and score it, as ``forecast_check`` does for a month.

    Each day at ``daemon.forecast_refresh_hour`` (with a week of history before it), the shared
    ``idlegpu.scheduler.refresh.Refresher`` (the daemon's and the simulator's refresh; its fits
    share a cache, as the simulator's do) scores the promises in use, widens the services that
    under-cover and forecasts from the history before that moment. Every forecast whose next 24
    hours are in the history is scored on them (``idlegpu.forecast.backtest``: ``score``,
    ``series_calibration``, ``window_quality``): pooled, per service over the days and per service
    and evening. ``confidence`` defaults to ``admission.confidence``; ``on_step(done, total)`` after
    each refresh."""
    if last < first:
        raise ReportError(f"the last day {last} is before the first {first}; give the days "
                          "oldest first")
    tz = settings.pool.timezone
    days = list(pd.date_range(pd.Timestamp(first), pd.Timestamp(last), freq="D").tz_localize(tz))
    return _replay_check(history, settings, days, f"{first} to {last}", month=None,
                         confidence=confidence, model=model, on_step=on_step)


def _replay_check(
    history: pd.DataFrame, settings: Any, days: Sequence[pd.Timestamp], label: str, *,
    month: Month | None, confidence: float | None, model: str,
    on_step: Callable[[int, int], None] | None,
) -> ForecastCheck:
    """``forecast_check`` on the local midnights ``days`` (tz-aware), called ``label``."""
    from idlegpu.forecast.backtest import CUTOFF, HORIZON, score, series_calibration, window_quality
    from idlegpu.forecast.calendar import local_hour
    from idlegpu.forecast.capacity import FREE, forecast_pool_usage
    from idlegpu.forecast.models.base import quantile_column
    from idlegpu.forecast.schema import DS, REPLICAS, UNIQUE_ID, Y, metric_rows, series_id
    from idlegpu.scheduler.refresh import Refresher

    if confidence is not None and confidence != settings.admission.confidence:
        admission = settings.admission.model_copy(update={"confidence": confidence})
        settings = settings.model_copy(update={"admission": admission})
    confidence = settings.admission.confidence
    tz = settings.pool.timezone
    replicas = metric_rows(history, REPLICAS)
    if replicas.empty:
        raise ReportError(f"the history has no replica series to check the forecasts of "
                          f"{label}")
    first, newest = replicas[DS].min(), replicas[DS].max()
    day = pd.Timedelta(hours=24)
    cache: dict = {}
    options: dict[str, Any] = {"cache": cache} if model in CACHED_MODELS else {}
    refresher = Refresher(settings, model=model, **options)
    hour = refresher.refresh_hour
    # by the wall clock, as the daemon refreshes: local midnight + 17 h is 16:00 or 18:00 on a
    # day that changes to or from daylight saving time
    moments = [pd.Timestamp(local_hour(d.date(), hour, tz)).tz_convert("UTC") for d in days]
    moments = [t for t in moments if t - pd.Timedelta(days=7) > first and t <= newest]
    if not any(t + day <= newest + pd.Timedelta(hours=1) for t in moments):
        raise ReportError(f"the history ({first:%Y-%m-%d} to {newest:%Y-%m-%d}) does not cover "
                          f"{label} for a forecast accuracy check (a week before a refresh "
                          "and the day after it)")
    services = list(settings.service_names)
    per_replica = {s.name: s.gpus_per_replica for s in settings.services}
    actual = replicas[[UNIQUE_ID, DS, Y]]
    q = quantile_column(confidence)
    parts, daily = [], []
    held_total = 0.0
    for n, at in enumerate(moments):
        result = refresher.refresh(replicas, at.to_pydatetime())
        widened = result.widened
        part = result.forecast[(result.forecast[DS] >= at) & (result.forecast[DS] < at + day)]
        part = part.assign(**{CUTOFF: at, HORIZON: day})
        step_h = float(pd.Series(sorted(part[DS].unique())).diff().min()
                       / pd.Timedelta(hours=1)) if part[DS].nunique() > 1 else 0.0
        held: dict[str, float] = {}
        if widened:
            plain = forecast_pool_usage(part, settings, confidence)[FREE]
            planned = forecast_pool_usage(part, settings, confidence, widened)[FREE]
            held_total += float((plain - planned).clip(lower=0).sum() * step_h)
            for service, wide in widened.items():
                rows = part[part[UNIQUE_ID] == series_id(service, REPLICAS)]
                extra = (rows[quantile_column(wide)] - rows[q]).clip(lower=0).sum()
                held[service] = float(extra * per_replica[service] * step_h)
        observed = not part.empty and part[DS].max() <= newest  # its whole next day seen
        scored = part.merge(actual, on=[UNIQUE_ID, DS], how="left")
        if observed:
            parts.append(scored)
        calibration = (series_calibration(scored, [confidence]).set_index(UNIQUE_ID)
                       if observed else None)
        local = at.tz_convert(tz)
        for service in services:
            uid = series_id(service, REPLICAS)
            cal = (calibration.loc[uid] if calibration is not None and uid in calibration.index
                   else None)
            tracked = result.coverage.get(service)
            daily.append({
                "date": local.strftime("%Y-%m-%d"),
                "made_at": local.isoformat(),
                "service": service,
                "points": int(cal["points"]) if cal is not None else 0,
                "strict_coverage": (float(cal[f"strict_coverage_{confidence:g}"])
                                    if cal is not None else np.nan),
                "coverage": float(cal[f"coverage_{confidence:g}"]) if cal is not None else np.nan,
                "widened": service in widened,
                "planned_quantile": widened.get(service, confidence),
                "tracked_last_day": tracked.last_day if tracked is not None else np.nan,
                "tracked_week": tracked.coverage if tracked is not None else np.nan,
                "held_back_gpu_hours": held.get(service, 0.0),
            })
        if on_step:
            on_step(n + 1, len(moments))
    if not parts:
        raise ReportError(f"the history ends {newest:%Y-%m-%d %H:%M} UTC: no forecast of "
                          f"{label} has its next 24 hours in it to score")
    frame = pd.concat(parts, ignore_index=True)
    qs = sorted({0.5, confidence})
    pooled = score(frame, qs).iloc[0]
    windows = window_quality(frame, replicas, settings, confidence).iloc[0]
    accuracy = {
        "cutoffs": float(len(parts)),
        "confidence": confidence,
        "mae": float(pooled["mae"]),
        "pinball": float(pooled[f"pinball_{confidence:g}"]),
        "coverage": float(pooled[f"coverage_{confidence:g}"]),
        "strict_coverage": float(pooled[f"strict_coverage_{confidence:g}"]),
        "precision": float(windows["precision"]),
        "recall": float(windows["recall"]),
        "promised_gpu_hours": float(windows["promised_gpu_hours"]),
        "refresh_hour": float(hour),
    }
    daily_frame = pd.DataFrame(daily, columns=list(DAILY_COVERAGE_COLUMNS))
    calibration = series_calibration(frame, [confidence]).set_index(UNIQUE_ID)
    rows = []
    for service in services:
        uid = series_id(service, REPLICAS)
        mine = daily_frame[daily_frame["service"] == service]
        group = frame[frame[UNIQUE_ID] == uid]
        figures = score(group, qs).iloc[0] if group[Y].notna().any() else None
        cal = calibration.loc[uid] if uid in calibration.index else None
        wide = mine[mine["widened"]]
        rows.append({
            "month": label,
            "service": service,
            "forecasts": int((mine["points"] > 0).sum()),
            "points": int(cal["points"]) if cal is not None else 0,
            "quantile": confidence,
            "strict_coverage": (float(cal[f"strict_coverage_{confidence:g}"])
                                if cal is not None else np.nan),
            "coverage": float(cal[f"coverage_{confidence:g}"]) if cal is not None else np.nan,
            "verdict": str(cal[f"verdict_{confidence:g}"]) if cal is not None else "",
            "pinball": (float(figures[f"pinball_{confidence:g}"]) if figures is not None
                        else np.nan),
            "mae": float(figures["mae"]) if figures is not None else np.nan,
            "evenings": len(mine),
            "days_widened": len(wide),
            "widened_on": " ".join(wide["date"]),
            "widened_quantile": refresher.widened,
            "held_back_gpu_hours": float(wide["held_back_gpu_hours"].sum()),
            **_served(group),
        })
    return ForecastCheck(
        month=month, confidence=confidence, widened_quantile=refresher.widened,
        refresh_hour=hour, accuracy=accuracy,
        services=pd.DataFrame(rows, columns=list(SERVICE_COVERAGE_COLUMNS)),
        daily=daily_frame, held_back_gpu_hours=held_total, label=label, evenings=len(days),
    )


def _served(forecasts: pd.DataFrame) -> dict[str, Any]:
    """What served a service's forecasts over the checked days (``auto``'s choice the most
    steps, e.g. "curve (62 %)") and the mean backtest skill of its choices against the better
    seasonal naive; empty for a model that does not choose."""
    from idlegpu.forecast.models import SERVED_BY, SKILL

    if SERVED_BY not in forecasts or forecasts[SERVED_BY].isna().all():
        return {"served_by": "", "skill": np.nan}
    shares = forecasts[SERVED_BY].value_counts(normalize=True)
    return {"served_by": f"{shares.index[0]} ({shares.iloc[0]:.0%})",
            "skill": float(forecasts[SKILL].mean())}


def forecast_accuracy(
    history: pd.DataFrame, settings: Any, month: str | Month, *, confidence: float = 0.9,
    on_step: Callable[[int, int], None] | None = None,
) -> dict[str, float]:
    """How well the nightly forecasts of ``month`` did, pooled over every service's replicas
    (``forecast_check``'s ``accuracy``): the number of forecasts scored (``cutoffs``), the MAE
    of the median, the pinball loss, coverage and strict coverage of the ``confidence``
    quantile, and idle-window precision and recall in GPU-hours."""
    return forecast_check(history, settings, month, confidence=confidence,
                          on_step=on_step).accuracy


# --------------------------------------------------------------------------- the report


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


# --------------------------------------------------------------------------- rendering


def _summary_rows(report: Report) -> tuple[list[str], list[list[str]]]:
    cur = report.currency
    headers = ["month", "days", "useful GPU-hours", "GPUs (12 h)", "GPUs (24 h)",
               "change vs prev. month", "lost GPU-hours", "preemptions", "jobs run",
               "jobs finished", f"savings ({cur})", f"cumulative savings ({cur})",
               "idle GPU-hours", "share of idle used"]
    rows = [
        [r.month, str(r.days), format_hours(r.useful_gpu_hours), format_gpus(r.gpus_12h),
         format_gpus(r.gpus_24h), format_change(r.mom_change), format_hours(r.lost_gpu_hours),
         f"{r.preemptions:,}", f"{r.jobs_run:,}", f"{r.jobs_finished:,}",
         format_money(r.savings, cur), format_money(r.cumulative_savings, cur),
         format_hours(r.idle_gpu_hours), format_share(r.idle_share_used)]
        for r in report.summary.itertuples()
    ]
    return headers, rows


def _breakdown_rows(frame: pd.DataFrame, by: str, currency: str):
    headers = [by, "jobs run", "jobs finished", "useful GPU-hours", "share", "lost GPU-hours",
               "preemptions", f"savings ({currency})"]
    rows = [
        [str(getattr(r, by)), f"{r.jobs_run:,}", f"{r.jobs_finished:,}",
         format_hours(r.useful_gpu_hours), format_share(r.share), format_hours(r.lost_gpu_hours),
         f"{r.preemptions:,}", format_money(r.savings, currency)]
        for r in frame.itertuples()
    ]
    return headers, rows


def _headline(report: Report) -> list[str]:
    r = report.row
    cur = report.currency
    lines = [
        (f"**{format_hours(r.useful_gpu_hours)} useful GPU-hours** in {r.month} "
        f"({r.days} days): the equivalent of **{format_gpus(r.gpus_12h)} GPUs** lent 12 hours "
        f"a day, or {format_gpus(r.gpus_24h)} GPUs around the clock "
        f"({format_change(r.mom_change)} vs the month before)."),
        (f"**Savings {format_money(r.savings, cur)}** at {format_money(report.price, cur)} per "
        f"GPU-hour; {format_money(r.cumulative_savings, cur)} over "
        f"{report.months[0].label} to {report.months[-1].label}."),
        (f"{r.jobs_run:,} jobs ran and {r.jobs_finished:,} finished; {r.preemptions:,} "
        f"preemptions and {r.planned_stops:,} planned stops lost "
        f"{format_hours(r.lost_gpu_hours)} GPU-hours."),
    ]
    if math.isfinite(r.idle_gpu_hours):
        lines.append(f"The pool had {format_hours(r.idle_gpu_hours)} idle GPU-hours; jobs held "
                     f"{format_share(r.idle_share_used)} of them.")
    return lines


_DEFINITIONS = (
    "Months and days are local ({tz}). Useful GPU-hours = GPU-hours held minus GPU-hours lost "
    "(work thrown away when a job was preempted or stopped), split across day and month boundaries by time; lost "
    "GPU-hours and preemptions count in the month the attempt ended. GPUs (12 h) = useful "
    "GPU-hours / (12 x days); GPUs (24 h) = useful GPU-hours / (24 x days). Savings = useful "
    "GPU-hours x {price} per GPU-hour; cumulative savings add up the months of this report. "
    "Idle GPU-hours: free GPUs of the pool (capacity - headroom - services) summed over the "
    "month; share used = GPU-hours held by jobs / idle GPU-hours."
)


_MD_SPECIAL = str.maketrans({
    **{c: "\\" + c for c in "\\`*_[]|#$~"}, "<": "&lt;", ">": "&gt;", "&": "&amp;"})


def markdown_text(text: str) -> str:
    """``text`` as Markdown shows it literally: HTML and emphasis, link, code, table, math
    and strike-through characters escaped (a team or service called ``<script>``, ``a_b*c``
    or ``a$b^{$c`` stays that)."""
    return str(text).translate(_MD_SPECIAL)


def _markdown_table(headers: list[str], rows: list[list[str]]) -> str:
    align = ["---"] + ["---:"] * (len(headers) - 1)
    lines = ["| " + " | ".join(markdown_text(h) for h in headers) + " |",
             "| " + " | ".join(align) + " |"]
    lines += ["| " + " | ".join(markdown_text(cell) for cell in row) + " |" for row in rows]
    return "\n".join(lines)


def _html_table(headers: list[str], rows: list[list[str]]) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in headers)
    body = "".join(
        "<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in row) + "</tr>" for row in rows
    )
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _sections(report: Report, charts: dict[str, Path]):
    """(kind, payload) in order; kind is h1, h2, h3, code, list, text, table or chart. Text
    is plain (each renderer escapes it); list lines mark bold with ``**``."""
    label = report.month.label
    yield ("h1", f"{report.pool}: harvested GPUs, {label}")
    if report.commands:
        yield ("h2", "How this report was made")
        yield ("code", "\n".join(report.commands))
    yield ("h2", "Summary")
    yield ("list", _headline(report))
    yield ("table", _summary_rows(report))
    yield ("text", _DEFINITIONS.format(tz=report.tz,
                                        price=format_money(report.price, report.currency)))
    if report.accuracy is not None:
        yield from _forecast_sections(report, charts)
    if report.job_sizes is not None:
        yield from _job_size_section(report)
    if report.notices and report.notices.get("sent"):
        yield from _notice_section(report)
    yield ("h2", f"By team, {label}")
    yield ("table", _breakdown_rows(report.teams, "team", report.currency))
    yield ("h2", f"By kind of job, {label}")
    yield ("table", _breakdown_rows(report.kinds, "kind", report.currency))
    yield ("h2", "Charts")
    for title, path in charts.items():
        if title != COVERAGE_CHART:  # shown with the forecast accuracy
            yield ("chart", (title, path))


COVERAGE_CHART = "Realised coverage per service"


def _notice_section(report: Report):
    n = report.notices or {}
    sent = int(n.get("sent", 0))
    yield ("h2", f"Checkpoint notices, {report.month.label}")
    yield ("table", (["sent", "answered in time", "missed (stopped at the deadline)",
                      "cut short by the service", "ended first", "GPU-hours saved"],
                     [[f"{sent:,}", f"{int(n.get('answered', 0)):,}",
                       f"{int(n.get('missed', 0)):,}", f"{int(n.get('cut', 0)):,}",
                       f"{int(n.get('ended', 0)):,}",
                       format_hours(float(n.get("saved_gpu_hours", 0.0)))]]))
    yield ("text", "A planned stop of a unit that answers notices (checkpoint.notice) first "
                   "tells its pods to checkpoint; an answered notice stops it at its "
                   "acknowledgement, losing nothing. GPU-hours saved: the work since their "
                   "last periodic checkpoint, which a blind stop would have lost.")


def _job_size_section(report: Report):
    """Idle GPU-hours usable by jobs of each size on the nodes, next to the pool view."""
    from idlegpu.forecast.nodes import MULTI_NODE

    sizes = report.job_sizes
    assert sizes is not None  # _sections calls it only with job sizes
    yield ("h2", f"Idle capacity by job size, {report.month.label}")
    if sizes.by_size is not None:
        rows = []
        for size, row in sizes.by_size.iterrows():
            name = ("multi-node (whole nodes)" if size == MULTI_NODE
                    else f"{size} GPU" + ("s" if size != 1 else ""))
            rows.append([name, format_hours(row["pool_view_gpu_hours"]),
                         format_hours(row["on_nodes_gpu_hours"]), format_share(row["share"])])
        yield ("table", (["job size", "idle GPU-hours (pool view)", "usable on the nodes",
                          "share"], rows))
    yield ("text", sizes.note)


def _forecast_sections(report: Report, charts: dict[str, Path]):
    """The forecast accuracy of the month: pooled, then per service with the chart of the
    daily coverage and what the widened evenings meant for the GPUs lent."""
    label = report.month.label
    a = report.accuracy
    assert a is not None  # _sections calls it only with an accuracy
    c = a["confidence"]
    hour = int(a.get("refresh_hour", 18))
    strict = a.get("strict_coverage", math.nan)
    yield ("h2", f"Forecast accuracy, {label}")
    yield ("table", (
        ["daily forecasts", "MAE (replicas)", f"pinball q{c:g}",
         f"coverage q{c:g}: strict / plain", "windows: precision", "windows: recall"],
        [[f"{a['cutoffs']:.0f}", f"{a['mae']:.3f}", f"{a['pinball']:.3f}",
          (f"{format_share(strict)} / {format_share(a['coverage'])}" if math.isfinite(strict)
           else format_share(a["coverage"])),
          format_share(a["precision"]), format_share(a["recall"])]],
    ))
    yield ("text", (
        f"Each day at {hour:02d}:00 the forecaster was refitted on the history before it and "
        f"scored on the next 24 hours of every service's replicas. Precision: of the GPU-hours "
        f"it promised free with {c:.0%} confidence, the share that really were; recall: of the "
        "GPU-hours really free, the share it promised."))
    check = report.forecast
    if check is None:
        return
    wide = check.widened_quantile
    yield ("h3", f"Per service: does the q{c:g} forecast keep its promise?")
    rows = []
    for r in check.services.itertuples():
        days = _days(r.widened_on)
        rows.append([
            str(r.service), f"{r.forecasts:,}",
            f"{format_share(r.strict_coverage)} / {format_share(r.coverage)}",
            r.verdict or "n/a",
            "n/a" if not math.isfinite(r.pinball) else f"{r.pinball:.3f}",
            "n/a" if not math.isfinite(r.mae) else f"{r.mae:.3f}",
            f"{r.days_widened} of {r.evenings}", days,
            format_hours(r.held_back_gpu_hours),
            r.served_by or "n/a",
            "n/a" if not math.isfinite(r.skill) else f"{r.skill:+.0%}",
        ])
    yield ("table", (
        ["service", "forecasts", f"coverage q{c:g}: strict / plain", "verdict",
         f"pinball q{c:g}", "MAE (replicas)", "evenings widened", "widened on",
         "GPU-hours held back", "served by (most steps)", "skill vs seasonal naive"], rows))
    yield ("text", (
        f"Coverage: the share of steps strictly below (strict) and at or below (plain) the "
        f"q{c:g} forecast. Replica counts are whole numbers, so a forecast that keeps its "
        f"promise has a strict coverage of at most {c:g} and a plain one of at least {c:g}: "
        "calibrated (within 0.02). Under-covers: the service needed GPUs the forecast had "
        "promised free (jobs on them are preempted); over-covers: even strictly below more "
        "often than promised (GPUs held back that stayed free). Widened: at "
        f"that evening's refresh the forecasts in use had covered less than q{c:g} by more than "
        f"chance over the last day or week, so the service was planned with q{wide:g} until a "
        f"day was covered again (as the daemon does, replayed); GPU-hours held back: its "
        f"q{wide:g} minus q{c:g} replicas x GPUs per replica over those nights' 24 hours."))
    if COVERAGE_CHART in charts:
        yield ("chart", (COVERAGE_CHART, charts[COVERAGE_CHART]))
    yield ("text", _widened_words(report))


def _days(dates: str) -> str:
    """``2025-12-08 2025-12-09`` as ``Dec 8, 9`` (one month: the report's)."""
    days = [pd.Timestamp(d) for d in str(dates).split()]
    if not days:
        return "-"
    return f"{days[0]:%b} " + ", ".join(str(d.day) for d in days)


def _widened_words(report: Report) -> str:
    """Which services were widened, how many evenings, and what it meant for lent GPUs."""
    check, accuracy = report.forecast, report.accuracy
    # only called from _forecast_sections, past its checks of both
    assert check is not None and accuracy is not None
    c, wide, label = check.confidence, check.widened_quantile, report.month.label
    widened = check.widened
    if widened.empty:
        return (f"No service was widened in {label}: at every nightly refresh the forecasts "
                f"in use of every service had kept their q{c:g} promise within chance, so every "
                f"night was planned at q{c:g} and no GPUs were held back.")
    parts = []
    for r in widened.itertuples():
        parts.append(f"{r.service} on {r.days_widened} evening{'s' if r.days_widened != 1 else ''}"
                     f" ({_days(r.widened_on)}; {format_hours(r.held_back_gpu_hours)} GPU-hours "
                     "held back)")
    text = (f"Widened in {label}: {'; '.join(parts)}. Those nights the plan used the "
            f"service's q{wide:g} forecast instead of q{c:g}: ")
    promised = accuracy.get("promised_gpu_hours", math.nan)
    share = (f" ({format_share(check.held_back_gpu_hours / promised)} of the "
             f"{format_hours(promised)} GPU-hours the q{c:g} forecasts promised free over the "
             "month)" if math.isfinite(promised) and promised > 0 else "")
    text += (f"the pool lent up to {format_hours(check.held_back_gpu_hours)} GPU-hours fewer"
             f"{share}, in exchange for fewer jobs preempted while the forecast was below the "
             "service's traffic.")
    never = [s for s in check.services["service"] if s not in set(widened["service"])]
    if never:
        text += f" Never widened: {', '.join(never)}."
    return text


def render_markdown(report: Report, charts: dict[str, Path]) -> str:
    parts = []
    for kind, payload in _sections(report, charts):
        if kind == "h1":
            parts.append(f"# {markdown_text(payload)}")
        elif kind in ("h2", "h3"):
            parts.append(f"{'#' * int(kind[1])} {markdown_text(payload)}")
        elif kind == "code":
            parts.append("```sh\n" + payload + "\n```")
        elif kind == "list":
            parts.append("\n".join(f"- {line}" for line in payload))
        elif kind == "table":
            parts.append(_markdown_table(*payload))
        elif kind == "text":
            parts.append(markdown_text(payload))
        elif kind == "chart":
            title, path = payload
            text = markdown_text(title)
            parts.append(f"### {text}\n\n![{text}]({path.name})")
    return "\n\n".join(parts) + "\n"


_CSS = """
body{font-family:system-ui,-apple-system,"Segoe UI",sans-serif;max-width:1100px;margin:2em auto;
padding:0 1em;color:#222;line-height:1.45}
h1{font-size:1.6em;border-bottom:2px solid #4C72B0;padding-bottom:.2em}
h2{font-size:1.25em;margin-top:1.6em}
table{border-collapse:collapse;margin:.8em 0;font-size:.9em}
th,td{border:1px solid #ccc;padding:.3em .6em;text-align:right}
th:first-child,td:first-child{text-align:left}
th{background:#f0f3f8}
tr:nth-child(even) td{background:#fafafa}
img{max-width:100%;border:1px solid #eee}
pre{background:#f6f6f6;padding:.7em;overflow-x:auto}
p.note{color:#555;font-size:.9em}
"""


def render_html(report: Report, charts: dict[str, Path]) -> str:
    body = []
    for kind, payload in _sections(report, charts):
        if kind in ("h1", "h2", "h3"):
            body.append(f"<{kind}>{html.escape(payload)}</{kind}>")
        elif kind == "code":
            body.append(f"<pre><code>{html.escape(payload)}</code></pre>")
        elif kind == "list":
            items = "".join(f"<li>{_bold(html.escape(line))}</li>" for line in payload)
            body.append(f"<ul>{items}</ul>")
        elif kind == "table":
            body.append(_html_table(*payload))
        elif kind == "text":
            body.append(f'<p class="note">{html.escape(payload)}</p>')
        elif kind == "chart":
            title, path = payload
            data = base64.b64encode(path.read_bytes()).decode("ascii")
            body.append(f"<h3>{html.escape(title)}</h3>"
                        f'<img alt="{html.escape(title)}" src="data:image/png;base64,{data}">')
    title = html.escape(f"{report.pool}: harvested GPUs, {report.month.label}")
    return (f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"><title>{title}</title>'
            f"<style>{_CSS}</style></head><body>\n" + "\n".join(body) + "\n</body></html>\n")


def _bold(text: str) -> str:
    parts = text.split("**")
    return "".join(f"<strong>{p}</strong>" if k % 2 else p for k, p in enumerate(parts))


def write_summary_csv(report: Report, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    write_csv(report.summary, path, decimals=6)
    return path


def write_report(report: Report, out: Path, *, dpi: int = 100) -> list[Path]:
    """Write ``report-YYYY-MM.md``, ``report-YYYY-MM.html``, ``summary.csv``, with a forecast
    check ``report-YYYY-MM_coverage.csv`` and ``report-YYYY-MM_coverage_daily.csv``, and the
    charts into ``out``; returns the paths written."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    charts = write_charts(report, out, dpi=dpi)
    label = report.month.label
    md = out / f"report-{label}.md"
    md.write_text(render_markdown(report, charts), encoding="utf-8")
    page = out / f"report-{label}.html"
    page.write_text(render_html(report, charts), encoding="utf-8")
    summary = write_summary_csv(report, out / "summary.csv")
    extra = write_coverage_csv(report, out) if report.forecast is not None else []
    return [md, page, summary, *extra, *charts.values()]


def write_coverage_csv(report: Report, out: Path) -> list[Path]:
    """The forecast check per service (``report-YYYY-MM_coverage.csv``,
    ``SERVICE_COVERAGE_COLUMNS``) and per evening and service
    (``report-YYYY-MM_coverage_daily.csv``, ``DAILY_COVERAGE_COLUMNS``)."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    label = report.month.label
    check = report.forecast
    assert check is not None  # write_report calls it only with a forecast check
    services = out / f"report-{label}_coverage.csv"
    write_csv(check.services, services, decimals=6)
    daily = out / f"report-{label}_coverage_daily.csv"
    write_csv(check.daily, daily, tz=report.tz, decimals=6)
    return [services, daily]


# --------------------------------------------------------------------------- charts


def write_charts(report: Report, out: Path, *, dpi: int = 100) -> dict[str, Path]:
    """The PNG charts (matplotlib Figure API), by title: four, and with a forecast check the
    daily coverage per service."""
    from matplotlib.figure import Figure

    label = report.month.label
    cur = report.currency
    charts: dict[str, Path] = {}

    def save(fig: Figure, name: str, title: str) -> None:
        path = out / f"{name}-{label}.png"
        fig.savefig(path, dpi=dpi, bbox_inches="tight", metadata={"Software": None})
        charts[title] = path

    # 1. daily useful GPU-hours of the report month, stacked by team
    dates = report.daily.index
    days = report.daily[(dates.year == report.month.year) & (dates.month == report.month.month)]
    teams = [c for c in days.columns if c != "held"]
    fig = Figure(figsize=(10, 3.8))
    ax = fig.add_subplot()
    bottom = np.zeros(len(days))
    colours = ["#4C72B0", "#55A868", "#C44E52", "#8172B2", "#CCB974", "#64B5CD", "#8C8C8C"]
    for k, team in enumerate(teams):
        ax.bar(days.index, days[team], bottom=bottom, width=0.85, label=_mpl_text(team),
               color=colours[k % len(colours)])
        bottom += days[team].to_numpy()
    ax.set_ylabel("useful GPU-hours per day")
    ax.set_title(f"Useful GPU-hours per day by team, {label} ({report.tz})")
    ax.legend(loc="upper left", fontsize=8, ncols=min(len(teams), 4) or 1)
    fig.autofmt_xdate()
    save(fig, "daily-teams", "Useful GPU-hours per day, by team")

    # 2. idle vs harvested per day (report month)
    fig = Figure(figsize=(10, 3.8))
    ax = fig.add_subplot()
    if report.idle_daily is not None:
        idle = report.idle_daily.reindex(days.index)
        ax.bar(days.index, idle, width=0.85, color="#D0D8E8", label="idle GPU-hours (pool)")
    ax.bar(days.index, days["held"], width=0.5, color="#4C72B0", label="held by jobs")
    ax.bar(days.index, days[teams].sum(axis=1), width=0.5, color="#55A868",
           label="useful (held minus lost)")
    ax.set_ylabel("GPU-hours per day")
    ax.set_title(f"Idle vs harvested GPU-hours per day, {label}")
    ax.legend(loc="upper left", fontsize=8)
    fig.autofmt_xdate()
    save(fig, "idle-vs-harvested", "Idle vs harvested GPU-hours per day")

    # 3. cumulative savings over the report's months, by day
    fig = Figure(figsize=(10, 3.8))
    ax = fig.add_subplot()
    cumulative = report.daily[teams].sum(axis=1).cumsum() * report.price
    ax.plot(cumulative.index, cumulative.to_numpy(), color="#55A868", linewidth=2)
    ax.fill_between(cumulative.index, cumulative.to_numpy(), color="#55A868", alpha=0.15)
    ax.set_ylabel(f"cumulative savings ({cur})")
    ax.yaxis.set_major_formatter(lambda v, _pos: format_money(v, cur))
    ax.set_title(f"Cumulative savings, {report.months[0].label} to {label}")
    ax.grid(alpha=0.3)
    fig.autofmt_xdate()
    save(fig, "cumulative-savings", "Cumulative savings")

    # 4. monthly bars: useful and lost GPU-hours, with the 12-hour GPU equivalent
    s = report.summary
    fig = Figure(figsize=(8, 3.8))
    ax = fig.add_subplot()
    x = np.arange(len(s))
    ax.bar(x, s["useful_gpu_hours"], width=0.6, color="#4C72B0", label="useful GPU-hours")
    ax.bar(x, s["lost_gpu_hours"], width=0.6, bottom=s["useful_gpu_hours"], color="#C44E52",
           label="lost (preempted or stopped)")
    for k, row in enumerate(s.itertuples()):
        ax.annotate(f"{row.gpus_12h:,.1f} GPUs (12 h)", (k, row.useful_gpu_hours + row.lost_gpu_hours),
                    ha="center", va="bottom", fontsize=8, xytext=(0, 3),
                    textcoords="offset points")
    ax.set_xticks(x, list(s["month"]))
    ax.set_ylabel("GPU-hours")
    ax.set_title("GPU-hours per month")
    ax.legend(loc="upper left", fontsize=8)
    save(fig, "monthly", "GPU-hours per month")

    # 5. with a forecast check: daily realised coverage per service, widened nights shaded
    if report.forecast is not None:
        save(_coverage_figure(report.forecast, report.tz), "coverage", COVERAGE_CHART)
    return charts


def _mpl_text(text: str) -> str:
    """``text`` as matplotlib draws it literally (``$`` would start mathtext)."""
    return str(text).replace("$", r"\$")


def _coverage_figure(check: ForecastCheck, tz: str):
    """One panel per service: the coverage [strict, plain] of each evening's forecast over
    the 24 hours it planned, the target, and the nights planned wider shaded."""
    from matplotlib.figure import Figure

    services = list(check.services["service"])
    fig = Figure(figsize=(10, 1.6 + 1.5 * len(services)), layout="constrained")
    axes = fig.subplots(len(services), 1, sharex=True, squeeze=False)[:, 0]
    day = pd.Timedelta(hours=24)
    for ax, service in zip(axes, services, strict=True):
        rows = check.daily[check.daily["service"] == service]
        made = pd.DatetimeIndex(pd.to_datetime(rows["made_at"], utc=True)).tz_convert(tz)
        made = made.tz_localize(None)
        middle = made + day / 2
        for start, wide in zip(made, rows["widened"], strict=True):
            if wide:
                ax.axvspan(start, start + day, color="#DD8452", alpha=0.3, lw=0,
                           label=f"planned with q{check.widened_quantile:g}")
        ax.plot(middle, rows["coverage"], marker="o", ms=3, color="#4C72B0",
                label=f"coverage (y <= q{check.confidence:g})")
        ax.plot(middle, rows["strict_coverage"], ls=":", color="#4C72B0", lw=1,
                label=f"strict (y < q{check.confidence:g})")
        ax.axhline(check.confidence, color="#C44E52", ls="--", lw=1,
                   label=f"target {check.confidence:g}")
        ax.set_ylim(0, 1.05)
        ax.set_ylabel("coverage")
        ax.set_title(_mpl_text(service), loc="left", fontsize=9)
        ax.grid(alpha=0.3)
    handles, labels = axes[0].get_legend_handles_labels()
    for other in axes[1:]:
        for h, label in zip(*other.get_legend_handles_labels(), strict=True):
            if label not in labels:
                handles.append(h)
                labels.append(label)
    unique = dict(zip(labels, handles, strict=True))
    fig.legend(unique.values(), unique.keys(), loc="outside lower center", fontsize=8,
               ncols=min(len(unique), 5))
    fig.suptitle(f"Realised coverage of each evening's q{check.confidence:g} forecast over "
                 f"the next 24 h, {check.label} ({tz})", fontsize=10)
    for label in axes[-1].get_xticklabels():
        label.set_rotation(30)
        label.set_ha("right")
    return fig
