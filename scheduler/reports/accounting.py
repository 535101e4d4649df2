"""The month's accounting: useful, held and lost GPU-hours (split at local day and month
boundaries by time), preemptions, jobs, GPU equivalents and savings, per month, team, kind
and day."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np
import pandas as pd

from idlegpu.scheduler.reports.months import Month

SUMMARY_COLUMNS = (
    "month", "days", "useful_gpu_hours", "lost_gpu_hours", "preemptions", "planned_stops",
    "jobs_run", "jobs_finished", "gpus_12h", "gpus_24h", "mom_change", "savings",
    "cumulative_savings", "idle_gpu_hours", "idle_share_used", "currency",
)


def gpu_equivalent(gpu_hours: float, days: int, hours_per_day: float) -> float:
    """GPUs that, lent ``hours_per_day`` every day of a ``days``-day month, give ``gpu_hours``."""
    return gpu_hours / (hours_per_day * days)


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
