"""How the nightly forecasts of a month (or of any run of days) kept their promise: the
daemon's forecast refresh replayed over the days and scored, pooled and per service."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import date
from typing import Any

import numpy as np
import pandas as pd

from idlegpu.forecast.backtest import CUTOFF, HORIZON, score, series_calibration, window_quality
from idlegpu.forecast.calendar import local_hour
from idlegpu.forecast.capacity import FREE, forecast_pool_usage
from idlegpu.forecast.models import CACHED_MODELS, SERVED_BY, SKILL
from idlegpu.forecast.models.base import quantile_column
from idlegpu.forecast.schema import DS, REPLICAS, UNIQUE_ID, Y, metric_rows, series_id
from idlegpu.scheduler.refresh import Refresh, Refresher
from idlegpu.scheduler.reports.errors import ReportError
from idlegpu.scheduler.reports.months import Month


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


_DAY = pd.Timedelta(hours=24)


@dataclass(frozen=True)
class _Replay:
    """What every evening of a replayed forecast check shares (``_replay_check``)."""

    settings: Any
    """The pool's settings, at the confidence checked."""
    refresher: Refresher
    replicas: pd.DataFrame
    """The history's replica series."""
    actual: pd.DataFrame
    """What the forecasts are scored on: ``unique_id, ds, y`` of the replicas."""
    newest: pd.Timestamp
    """The newest step of the history."""
    services: list[str]
    per_replica: dict[str, int]
    """GPUs per replica, by service."""

    @property
    def confidence(self) -> float:
        return self.settings.admission.confidence

    @property
    def quantiles(self) -> list[float]:
        """The quantiles scored: the median and the confidence."""
        return sorted({0.5, self.confidence})


def _replay_check(
    history: pd.DataFrame, settings: Any, days: Sequence[pd.Timestamp], label: str, *,
    month: Month | None, confidence: float | None, model: str,
    on_step: Callable[[int, int], None] | None,
) -> ForecastCheck:
    """``forecast_check`` on the local midnights ``days`` (tz-aware), called ``label``."""
    settings = _at_confidence(settings, confidence)
    confidence = settings.admission.confidence
    replicas = metric_rows(history, REPLICAS)
    if replicas.empty:
        raise ReportError(f"the history has no replica series to check the forecasts of "
                          f"{label}")
    first, newest = replicas[DS].min(), replicas[DS].max()
    cache: dict = {}
    options: dict[str, Any] = {"cache": cache} if model in CACHED_MODELS else {}
    refresher = Refresher(settings, model=model, **options)
    hour = refresher.refresh_hour
    moments = _refresh_moments(days, hour, settings.pool.timezone, first, newest, label)
    replay = _Replay(
        settings=settings, refresher=refresher, replicas=replicas,
        actual=replicas[[UNIQUE_ID, DS, Y]], newest=newest,
        services=list(settings.service_names),
        per_replica={s.name: s.gpus_per_replica for s in settings.services},
    )
    parts, daily = [], []
    held_total = 0.0
    for n, at in enumerate(moments):
        scored, rows, held = _replay_evening(replay, at)
        if held is not None:
            held_total += held
        if scored is not None:
            parts.append(scored)
        daily.extend(rows)
        if on_step:
            on_step(n + 1, len(moments))
    if not parts:
        raise ReportError(f"the history ends {newest:%Y-%m-%d %H:%M} UTC: no forecast of "
                          f"{label} has its next 24 hours in it to score")
    frame = pd.concat(parts, ignore_index=True)
    accuracy = _pooled_accuracy(replay, frame, cutoffs=len(parts), hour=hour)
    daily_frame = pd.DataFrame(daily, columns=list(DAILY_COVERAGE_COLUMNS))
    rows = _service_rows(replay, frame, daily_frame, label)
    return ForecastCheck(
        month=month, confidence=confidence, widened_quantile=refresher.widened,
        refresh_hour=hour, accuracy=accuracy,
        services=pd.DataFrame(rows, columns=list(SERVICE_COVERAGE_COLUMNS)),
        daily=daily_frame, held_back_gpu_hours=held_total, label=label, evenings=len(days),
    )


def _at_confidence(settings: Any, confidence: float | None) -> Any:
    """``settings`` with ``admission.confidence`` set to ``confidence`` (None: as they are)."""
    if confidence is not None and confidence != settings.admission.confidence:
        admission = settings.admission.model_copy(update={"confidence": confidence})
        settings = settings.model_copy(update={"admission": admission})
    return settings


def _refresh_moments(
    days: Sequence[pd.Timestamp], hour: int, tz: str, first: pd.Timestamp,
    newest: pd.Timestamp, label: str,
) -> list[pd.Timestamp]:
    """The nightly refreshes (UTC) of the local ``days`` with a week of history before them
    in the history (``first`` to ``newest``), or a ``ReportError`` when none has its next day
    in it."""
    # by the wall clock, as the daemon refreshes: local midnight + 17 h is 16:00 or 18:00 on a
    # day that changes to or from daylight saving time
    moments = [pd.Timestamp(local_hour(d.date(), hour, tz)).tz_convert("UTC") for d in days]
    moments = [t for t in moments if t - pd.Timedelta(days=7) > first and t <= newest]
    if not any(t + _DAY <= newest + pd.Timedelta(hours=1) for t in moments):
        raise ReportError(f"the history ({first:%Y-%m-%d} to {newest:%Y-%m-%d}) does not cover "
                          f"{label} for a forecast accuracy check (a week before a refresh "
                          "and the day after it)")
    return moments


def _replay_evening(
    replay: _Replay, at: pd.Timestamp
) -> tuple[pd.DataFrame | None, list[dict[str, Any]], float | None]:
    """The nightly refresh at ``at`` (UTC), replayed: its forecast of the next 24 hours with
    the actual replicas (None unless the history holds all of those hours), one row per
    service (``DAILY_COVERAGE_COLUMNS``) and, when it widened a service, the GPU-hours the
    pool's plan held back (None otherwise)."""
    result = replay.refresher.refresh(replay.replicas, at.to_pydatetime())
    widened = result.widened
    part = result.forecast[(result.forecast[DS] >= at) & (result.forecast[DS] < at + _DAY)]
    part = part.assign(**{CUTOFF: at, HORIZON: _DAY})
    held_total: float | None = None
    held: dict[str, float] = {}
    if widened:
        held_total, held = _held_back(replay, part, widened)
    observed = not part.empty and part[DS].max() <= replay.newest  # its whole next day seen
    scored = part.merge(replay.actual, on=[UNIQUE_ID, DS], how="left")
    calibration = (series_calibration(scored, [replay.confidence]).set_index(UNIQUE_ID)
                   if observed else None)
    rows = _evening_rows(replay, at, result, widened, calibration, held)
    return (scored if observed else None), rows, held_total


def _held_back(
    replay: _Replay, part: pd.DataFrame, widened: dict[str, float]
) -> tuple[float, dict[str, float]]:
    """What planning the ``widened`` services wider held back over the 24 hours of the
    forecast ``part``: the pool's free GPU-hours, and each widened service's GPU-hours."""
    settings, confidence = replay.settings, replay.confidence
    q = quantile_column(confidence)
    step_h = float(pd.Series(sorted(part[DS].unique())).diff().min()
                   / pd.Timedelta(hours=1)) if part[DS].nunique() > 1 else 0.0
    plain = forecast_pool_usage(part, settings, confidence)[FREE]
    planned = forecast_pool_usage(part, settings, confidence, widened)[FREE]
    total = float((plain - planned).clip(lower=0).sum() * step_h)
    held: dict[str, float] = {}
    for service, wide in widened.items():
        rows = part[part[UNIQUE_ID] == series_id(service, REPLICAS)]
        extra = (rows[quantile_column(wide)] - rows[q]).clip(lower=0).sum()
        held[service] = float(extra * replay.per_replica[service] * step_h)
    return total, held


def _evening_rows(
    replay: _Replay, at: pd.Timestamp, result: Refresh, widened: dict[str, float],
    calibration: pd.DataFrame | None, held: dict[str, float],
) -> list[dict[str, Any]]:
    """The rows (``DAILY_COVERAGE_COLUMNS``) of the refresh at ``at``, one per service:
    the coverage of its forecast over the next 24 hours (``calibration``: None when unseen),
    whether it planned the service wider and what that held back."""
    confidence = replay.confidence
    local = at.tz_convert(replay.settings.pool.timezone)
    rows = []
    for service in replay.services:
        uid = series_id(service, REPLICAS)
        cal = (calibration.loc[uid] if calibration is not None and uid in calibration.index
               else None)
        tracked = result.coverage.get(service)
        rows.append({
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
    return rows


def _pooled_accuracy(
    replay: _Replay, frame: pd.DataFrame, *, cutoffs: int, hour: int
) -> dict[str, float]:
    """The pooled figures (``ForecastCheck.accuracy``) of the scored forecasts ``frame``."""
    confidence = replay.confidence
    pooled = score(frame, replay.quantiles).iloc[0]
    windows = window_quality(frame, replay.replicas, replay.settings, confidence).iloc[0]
    return {
        "cutoffs": float(cutoffs),
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


def _service_rows(
    replay: _Replay, frame: pd.DataFrame, daily: pd.DataFrame, label: str
) -> list[dict[str, Any]]:
    """One row per service (``SERVICE_COVERAGE_COLUMNS``) over the days: the scored forecasts
    ``frame`` and the ``daily`` rows of the evenings."""
    confidence = replay.confidence
    calibration = series_calibration(frame, [confidence]).set_index(UNIQUE_ID)
    rows = []
    for service in replay.services:
        uid = series_id(service, REPLICAS)
        mine = daily[daily["service"] == service]
        group = frame[frame[UNIQUE_ID] == uid]
        figures = score(group, replay.quantiles).iloc[0] if group[Y].notna().any() else None
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
            "widened_quantile": replay.refresher.widened,
            "held_back_gpu_hours": float(wide["held_back_gpu_hours"].sum()),
            **_served(group),
        })
    return rows


def _served(forecasts: pd.DataFrame) -> dict[str, Any]:
    """What served a service's forecasts over the checked days (``auto``'s choice the most
    steps, e.g. "curve (62 %)") and the mean backtest skill of its choices against the better
    seasonal naive; empty for a model that does not choose."""
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
