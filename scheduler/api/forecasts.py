"""The job API's forecast: the daemon's refresh (``idlegpu.scheduler.daemon.ForecastProvider``, the
one ``idlegpu run`` uses), cached so that reading the plan, the windows or the forecast twice
does not refit twice.

The history is the daemon's: Prometheus through the config, or a recorded history file
(``idlegpu serve --history FILE``) replayed at the server's clock, as ``idlegpu run --once
--history --now`` does. A refresh is kept for the clock hour it was made in (UTC; the
daemon itself refits nightly, so an hour is well inside its cadence) and refit at the first
call of the next hour. Every answer carries ``made_at`` and the forecast's age.

A history that cannot be read, or whose newest sample before the server's clock is older
than ``stale_after`` (Prometheus stopped scraping, the replayed file ended), is a
``ForecastUnavailable``: the API answers 503 with ``Retry-After``, never a plan from stale
history. A failure is remembered for ``RETRY_AFTER_S`` (real time), so callers in that time
get the same 503 at once instead of each waiting for the source's retries.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from idlegpu.forecast.errors import IdlegpuError
from idlegpu.forecast.redact import redact
from idlegpu.forecast.schema import DS, REPLICAS, metric_rows
from idlegpu.forecast.sources.prometheus import fetch_history
from idlegpu.scheduler.daemon import ForecastProvider
from idlegpu.scheduler.service.errors import FORECAST_RETRY_AFTER_S, ForecastUnavailable
from idlegpu.scheduler.types import FreeProfile

if TYPE_CHECKING:
    from idlegpu.scheduler.refresh import Refresh

log = logging.getLogger("idlegpu.api")

STALE_AFTER = timedelta(minutes=30)
# also how long a failure is remembered before the source is asked again
RETRY_AFTER_S = FORECAST_RETRY_AFTER_S


@dataclass(frozen=True)
class ServerForecast:
    """One cached refresh: the ``Refresh``, the profile the daemon plans on (night-only
    applied), the hour it is kept for and the newest history sample it was fitted on."""

    refresh: Refresh
    profile: FreeProfile
    key: datetime
    history_until: datetime

    @property
    def made_at(self) -> datetime:
        return self.refresh.made_at

    def age_s(self, now: datetime) -> float:
        return max(0.0, (now - self.made_at).total_seconds())


class Forecasts:
    """The server's forecast at ``now`` (``get``), refit at most once per clock hour.

    ``frame``: a recorded history to replay (None: Prometheus, from the config);
    ``fetch``: reads the history from ``start`` to ``end`` (default: Prometheus);
    ``refreshes`` counts the refits, and every callable in ``on_refresh`` is called with the
    new ``ServerForecast`` (tests, metrics)."""

    def __init__(self, settings, frame: pd.DataFrame | None = None, *,
                 stale_after: timedelta = STALE_AFTER,
                 fetch: Callable[[datetime, datetime], pd.DataFrame] | None = None) -> None:
        self.settings = settings
        self.frame = frame
        self.stale_after = stale_after
        self.fetch = fetch
        self.provider = ForecastProvider(settings, frame)
        self.lock = threading.Lock()
        self.current: ServerForecast | None = None
        self.refreshes = 0
        self.on_refresh: list[Callable[[ServerForecast], None]] = []
        self.failed: tuple[float, ForecastUnavailable] | None = None  # (monotonic, why)
        self._times = None if frame is None else _sample_times(frame)

    def describe(self) -> str:
        return ("Prometheus at " + redact(self.settings.prometheus.url) if self.frame is None
                else "a recorded history (replayed at the server's clock)")

    def get(self, now: datetime) -> ServerForecast:
        key = pd.Timestamp(now).tz_convert("UTC").floor("h").to_pydatetime()
        with self.lock:  # concurrent first calls of an hour refit once
            current = self.current
            if current is not None and current.key == key and current.made_at <= now:
                return current
            if self.failed is not None and time.monotonic() - self.failed[0] < RETRY_AFTER_S:
                raise ForecastUnavailable(str(self.failed[1]))
            try:
                made = self._refresh(now, key)
            except ForecastUnavailable as exc:
                self.failed = (time.monotonic(), exc)
                raise
            self.failed = None
            self.current = made
            self.refreshes += 1
        for hook in list(self.on_refresh):
            hook(made)
        return made

    def _refresh(self, now: datetime, key: datetime) -> ServerForecast:
        frame = self.frame
        if frame is None:
            start = now - self.provider.HISTORY
            try:
                if self.fetch is not None:
                    frame = self.fetch(start, now)
                else:
                    frame = fetch_history(self.settings, start, now)
            except Exception as exc:  # noqa: BLE001  (any failure of the source: a clear 503)
                log.error("forecast: the history could not be read: %s", exc)
                raise ForecastUnavailable(
                    f"the pool's history could not be read from {self.describe()}: "
                    f"{_one_line(exc)}; no plan is made without it") from None
            times: np.ndarray | None = _sample_times(frame)
        else:
            times = self._times
        newest = _newest_before(times, now)
        if newest is None:
            raise ForecastUnavailable(f"the history has no sample before the server's clock "
                                      f"({now.isoformat()}); no plan is made without it")
        lag = now - newest
        if lag > self.stale_after:
            raise ForecastUnavailable(
                f"the history's newest sample before the server's clock ({now.isoformat()}) "
                f"is from {newest.isoformat()}, {lag.total_seconds() / 60:.0f} min old (more "
                f"than {self.stale_after.total_seconds() / 60:.0f}); no plan is made from "
                "stale history")
        self.provider.frame = frame  # the daemon's refresh, on what was just read
        try:
            refresh = self.provider.refresh(now)
        except IdlegpuError as exc:
            log.error("forecast: the refresh failed: %s", exc)
            raise ForecastUnavailable(f"the forecast could not be made: {_one_line(exc)}"
                                      ) from None
        finally:
            if self.frame is None:
                self.provider.frame = None  # not kept: the next refresh reads again
        profile = self.provider.profile
        assert profile is not None  # the refresh above made it
        return ServerForecast(refresh, profile, key, newest)


def _sample_times(frame: pd.DataFrame) -> np.ndarray:
    replicas = metric_rows(frame, REPLICAS)
    stamps = pd.to_datetime(replicas[DS], utc=True).dt.tz_localize(None)
    return np.unique(stamps.to_numpy(dtype="datetime64[ns]"))


def _newest_before(times: np.ndarray | None, now: datetime) -> datetime | None:
    if times is None or not len(times):
        return None
    at = pd.Timestamp(now).tz_convert("UTC").tz_localize(None).to_datetime64()
    i = int(np.searchsorted(times, at, side="left"))
    if i == 0:
        return None
    return pd.Timestamp(times[i - 1]).tz_localize("UTC").to_pydatetime()


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split())[:500] or exc.__class__.__name__


__all__ = ["STALE_AFTER", "ForecastUnavailable", "Forecasts", "ServerForecast"]
