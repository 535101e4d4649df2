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
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from forecast.errors import PermanentError

RUN_COLUMNS = (
    "job_id", "team", "kind", "gpus", "start", "end", "outcome", "gpu_hours", "lost_gpu_hours",
)
OUTCOMES = ("finished", "preempted", "stopped", "running", "failed", "cancelled")
SUMMARY_COLUMNS = (
    "month", "days", "useful_gpu_hours", "lost_gpu_hours", "preemptions", "jobs_run",
    "jobs_finished", "gpus_12h", "gpus_24h", "mom_change", "savings", "cumulative_savings",
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


def runs_from_store(store: Any, now: datetime) -> pd.DataFrame:
    """The run table of a ``JobStore``: one row per attempt (admission to end; an open
    attempt runs until ``now``). A failed attempt's GPU-hours all count as lost."""
    rows = []
    for unit in store.queue(include_terminal=True):
        for att in store.attempts(unit.id):
            end = att.ended_at or now
            held_h = (att.gpu_seconds if att.gpu_seconds is not None
                      else att.gpus * (end - att.admitted_at).total_seconds()) / 3600
            outcome = ("running" if att.ended_at is None
                       else _STORE_OUTCOMES.get(str(att.outcome), "stopped"))
            lost_h = held_h if outcome == "failed" else (att.lost_gpu_seconds or 0.0) / 3600
            rows.append({
                "job_id": unit.id, "team": unit.team, "kind": unit.kind, "gpus": att.gpus,
                "start": att.admitted_at, "end": end, "outcome": outcome,
                "gpu_hours": held_h, "lost_gpu_hours": min(lost_h, held_h),
            })
    return validate_runs(pd.DataFrame(rows, columns=list(RUN_COLUMNS)), source="store")


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
    from forecast.capacity import daily_idle_gpu_hours, pool_usage

    daily = daily_idle_gpu_hours(pool_usage(history, settings), settings.pool.timezone)
    return daily["idle_gpu_hours"]


def idle_by_month(idle_daily: pd.Series) -> pd.Series:
    """Idle GPU-hours per month label (``YYYY-MM``) from ``idle_by_day``."""
    if idle_daily.empty:
        return pd.Series(dtype=float)
    labels = pd.DatetimeIndex(idle_daily.index).strftime("%Y-%m")
    return idle_daily.groupby(labels).sum()


# --------------------------------------------------------------------------- the report


def forecast_accuracy(
    history: pd.DataFrame, settings: Any, month: str | Month, *, confidence: float = 0.9,
    cutoff_hour: int = 18, on_step: Any = None,
) -> dict[str, float]:
    """How well the nightly forecasts of ``month`` did: the ``auto`` model refitted each day at
    ``cutoff_hour`` (local) on the history before it, scored on the following 24 hours of every
    service's replicas. Returns the MAE of the median, the pinball loss and coverage of the
    ``confidence`` quantile, and idle-window precision and recall in GPU-hours."""
    from forecast.backtest import backtest, score, window_quality
    from forecast.models import model_for
    from forecast.schema import DS, REPLICAS, metric_rows

    m = Month.parse(month) if isinstance(month, str) else month
    tz = settings.pool.timezone
    replicas = metric_rows(history, REPLICAS)
    last = replicas[DS].max() - pd.Timedelta(hours=24)
    days = pd.date_range(m.start(tz), m.end(tz), freq="D", inclusive="left")
    cutoffs = [d + pd.Timedelta(hours=cutoff_hour) for d in days]
    cutoffs = [c.tz_convert("UTC") for c in cutoffs
               if c.tz_convert("UTC") <= last and c - pd.Timedelta(days=7) > replicas[DS].min()]
    if not cutoffs:
        raise ReportError(f"the history does not cover {m.label} for a forecast accuracy check")
    qs = sorted({0.5, confidence})
    run = backtest(replicas, {"auto": lambda: model_for("auto", settings)}, cutoffs=cutoffs,
                   horizon=pd.Timedelta(hours=24), quantiles=qs, on_step=on_step)
    scores = score(run.forecasts, qs).loc["auto"]
    windows = window_quality(run.forecasts, replicas, settings, confidence).loc["auto"]
    return {
        "cutoffs": float(len(cutoffs)),
        "confidence": confidence,
        "mae": float(scores["mae"]),
        "pinball": float(scores[f"pinball_{confidence:g}"]),
        "coverage": float(scores[f"coverage_{confidence:g}"]),
        "precision": float(windows["precision"]),
        "recall": float(windows["recall"]),
    }


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
) -> Report:
    """Compute everything a report shows for the ``months`` months ending with ``month``."""
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
        idle_daily=idle_daily, commands=list(commands), accuracy=accuracy,
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
        f"preemptions lost {format_hours(r.lost_gpu_hours)} GPU-hours."),
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


def _markdown_table(headers: list[str], rows: list[list[str]]) -> str:
    align = ["---"] + ["---:"] * (len(headers) - 1)
    lines = ["| " + " | ".join(headers) + " |", "| " + " | ".join(align) + " |"]
    lines += ["| " + " | ".join(cell.replace("|", "\\|") for cell in row) + " |" for row in rows]
    return "\n".join(lines)


def _html_table(headers: list[str], rows: list[list[str]]) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in headers)
    body = "".join(
        "<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in row) + "</tr>" for row in rows
    )
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _sections(report: Report, charts: dict[str, Path]):
    """(title, kind, payload) in order; kind is text, table or chart."""
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
        a = report.accuracy
        yield ("h2", f"Forecast accuracy, {label}")
        yield ("table", (
            ["daily forecasts", "MAE (replicas)", f"pinball q{a['confidence']:g}",
             f"coverage q{a['confidence']:g}", "windows: precision", "windows: recall"],
            [[f"{a['cutoffs']:.0f}", f"{a['mae']:.3f}", f"{a['pinball']:.3f}",
              format_share(a["coverage"]), format_share(a["precision"]),
              format_share(a["recall"])]],
        ))
        yield ("text", (
            f"Each day at 18:00 the forecaster was refitted on the history before it and scored "
            f"on the next 24 hours of every service's replicas. Precision: of the GPU-hours it "
            f"promised free with {a['confidence']:.0%} confidence, the share that really were; "
            "recall: of the GPU-hours really free, the share it promised."))
    yield ("h2", f"By team, {label}")
    yield ("table", _breakdown_rows(report.teams, "team", report.currency))
    yield ("h2", f"By kind of job, {label}")
    yield ("table", _breakdown_rows(report.kinds, "kind", report.currency))
    yield ("h2", "Charts")
    for title, path in charts.items():
        yield ("chart", (title, path))


def render_markdown(report: Report, charts: dict[str, Path]) -> str:
    parts = []
    for kind, payload in _sections(report, charts):
        if kind == "h1":
            parts.append(f"# {payload}")
        elif kind == "h2":
            parts.append(f"## {payload}")
        elif kind == "code":
            parts.append("```sh\n" + payload + "\n```")
        elif kind == "list":
            parts.append("\n".join(f"- {line}" for line in payload))
        elif kind == "table":
            parts.append(_markdown_table(*payload))
        elif kind == "text":
            parts.append(payload)
        elif kind == "chart":
            title, path = payload
            parts.append(f"### {title}\n\n![{title}]({path.name})")
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
        if kind in ("h1", "h2"):
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
    report.summary.to_csv(path, index=False, float_format="%.6f")
    return path


def write_report(report: Report, out: Path, *, dpi: int = 100) -> list[Path]:
    """Write ``report-YYYY-MM.md``, ``report-YYYY-MM.html``, ``summary.csv`` and the charts
    into ``out``; returns the paths written."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    charts = write_charts(report, out, dpi=dpi)
    label = report.month.label
    md = out / f"report-{label}.md"
    md.write_text(render_markdown(report, charts), encoding="utf-8")
    page = out / f"report-{label}.html"
    page.write_text(render_html(report, charts), encoding="utf-8")
    summary = write_summary_csv(report, out / "summary.csv")
    return [md, page, summary, *charts.values()]


# --------------------------------------------------------------------------- charts


def write_charts(report: Report, out: Path, *, dpi: int = 100) -> dict[str, Path]:
    """The four PNG charts (matplotlib Figure API), by title."""
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
        ax.bar(days.index, days[team], bottom=bottom, width=0.85, label=team,
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
    return charts
