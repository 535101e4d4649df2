"""The daemon's clocks, and the calendar checks it makes against them.

A clock answers ``now()`` and says how fast it runs against real time (``speed``: replayed
seconds per real second). ``WallClock`` is the real time; ``ReplayClock(start, speed)`` starts
at ``start`` when it is made and runs ``speed`` times faster, on the monotonic clock (a
replay never jumps when the system time is set). Every period the daemon keeps (its pass
intervals, the health window, the evening refresh, the monthly report) is a period of its
clock's time; the scheduler waits ``real_seconds(period)`` between runs.

The calendar functions below are pure: they are given ``now`` and read no clock.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Protocol, runtime_checkable
from zoneinfo import ZoneInfo


@runtime_checkable
class Clock(Protocol):
    speed: float

    def now(self) -> datetime: ...


class WallClock:
    """Real time (UTC)."""

    speed = 1.0

    def now(self) -> datetime:
        return datetime.now(UTC)

    def __call__(self) -> datetime:
        return self.now()


class ReplayClock:
    """Starts at ``start`` on creation and runs ``speed`` times faster than real time."""

    def __init__(self, start: datetime, speed: float = 1.0,
                 monotonic: Callable[[], float] = time.monotonic) -> None:
        if start.tzinfo is None:
            raise ValueError("a replay starts at an aware datetime")
        if not speed > 0:
            raise ValueError(f"speed must be positive, not {speed}")
        self.start = start
        self.speed = float(speed)
        self._monotonic = monotonic
        self._origin = monotonic()

    def now(self) -> datetime:
        return self.start + timedelta(seconds=(self._monotonic() - self._origin) * self.speed)

    def __call__(self) -> datetime:
        return self.now()


class FunctionClock:
    """A plain ``() -> datetime`` (a test's hand-moved time) as a clock of the given speed."""

    def __init__(self, fn: Callable[[], datetime], speed: float = 1.0) -> None:
        self._fn = fn
        self.speed = float(speed)

    def now(self) -> datetime:
        return self._fn()

    def __call__(self) -> datetime:
        return self._fn()


def as_clock(clock: Clock | Callable[[], datetime] | None) -> Clock:
    if clock is None:
        return WallClock()
    if isinstance(clock, Clock):
        return clock
    return FunctionClock(clock)


def real_seconds(clock: Clock, seconds: float) -> float:
    """How many real seconds ``seconds`` of the clock's time take."""
    return seconds / clock.speed


# --------------------------------------------------------------------------- calendar (pure)


def daily_boundary(now: datetime, tz: str, hour: int) -> datetime:
    """The latest ``hour``:00 local at or before ``now``."""
    local = now.astimezone(ZoneInfo(tz))
    boundary = local.replace(hour=hour, minute=0, second=0, microsecond=0)
    if boundary > local:
        boundary = (local - timedelta(days=1)).replace(hour=hour, minute=0, second=0,
                                                      microsecond=0)
    return boundary


def monthly_boundary(now: datetime, tz: str, hour: int, day: int = 1) -> datetime:
    """The latest ``hour``:00 local on a month's ``day`` at or before ``now``."""
    local = now.astimezone(ZoneInfo(tz))
    boundary = local.replace(day=day, hour=hour, minute=0, second=0, microsecond=0)
    if boundary > local:
        previous = local.replace(day=1) - timedelta(days=1)
        boundary = previous.replace(day=day, hour=hour, minute=0, second=0, microsecond=0)
    return boundary


def refresh_due(now: datetime, made: datetime | None, tz: str, hour: int) -> bool:
    """True when no forecast was made yet, or ``hour``:00 local passed since ``made``."""
    return made is None or made < daily_boundary(now, tz, hour)


def report_due(now: datetime, since: datetime, tz: str, hour: int, day: int = 1) -> bool:
    """True when ``hour``:00 local on a month's ``day`` passed after ``since`` (the last
    report, or when the daemon started)."""
    return since < monthly_boundary(now, tz, hour, day)
