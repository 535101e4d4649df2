"""The run table in: one validated row per attempt, from a file (``read_runs``), a frame
(``validate_runs``) or the job store (``runs_from_store``), and the month's checkpoint notices
from the store's log."""

from __future__ import annotations

import math
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from idlegpu.scheduler.reports.errors import ReportError
from idlegpu.scheduler.reports.months import Month
from idlegpu.scheduler.types import EventKind

RUN_COLUMNS = (
    "job_id", "team", "kind", "gpus", "start", "end", "outcome", "gpu_hours", "lost_gpu_hours",
)
OUTCOMES = ("finished", "preempted", "stopped", "running", "failed", "cancelled")
_TOLERANCE = 1e-6


def read_runs(path: str | Path) -> pd.DataFrame:
    """Read and validate a run table (CSV, or Parquet by extension)."""
    path = Path(path)
    if not path.is_file():
        raise ReportError(f"runs file {path} not found; `idlegpu simulate` writes "
                          "runs_<policy>.csv")
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
    rows += _external_runs(store, now)
    return validate_runs(pd.DataFrame(rows, columns=list(RUN_COLUMNS)), source="store")


EXTERNAL_KINDS = {"kueue": "kueue-workload", "job": "kubernetes-job"}
"""The run table's ``kind`` of units outside the store."""


def _external_runs(store: Any, now: datetime) -> list[dict[str, Any]]:
    """One run per hold of a Kueue Workload or a user's Job. idlegpu sees none of their
    checkpoints, so a hold that was stopped counts as lost whole (as the policy plans them);
    one that disappeared from the listing between two passes counts as finished: it held
    its GPUs to the end as far as anyone can tell."""
    holds = getattr(store, "external_holds", None)
    if holds is None:
        return []
    rows = []
    for hold in holds():
        end = hold.ended_at or now
        held_s = hold.gpus * max(0.0, (end - hold.started_at).total_seconds())
        outcome = ("running" if hold.ended_at is None else
                   "preempted" if hold.outcome == "stopped" else "finished")
        lost_s = held_s if outcome == "preempted" else 0.0
        rows.append({
            "job_id": hold.unit_id, "team": hold.team,
            "kind": EXTERNAL_KINDS.get(hold.origin, hold.origin), "gpus": hold.gpus,
            "start": hold.started_at, "end": end, "outcome": outcome,
            "gpu_hours": held_s / 3600, "lost_gpu_hours": lost_s / 3600})
    return rows


def notices_from_store(store: Any, month: Month, tz: str) -> dict[str, float]:
    """The month's checkpoint notices from the store's log (``NOTICE`` events, by when they
    ended): sent, ``answered`` in time, ``missed`` (stopped at the deadline), ``cut`` (the
    service needed the GPUs first), ``ended`` (the attempt ended first), and
    ``saved_gpu_hours``: what the answered ones kept that a blind stop would have lost (the
    work since their last periodic checkpoint)."""
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
