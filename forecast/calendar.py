"""The pool's holiday calendar: the public holidays of a country (and subdivision), plus the
operator's own dates (``pool.custom_holidays``). The ``holidays`` package works offline.

One ``HolidayCalendar`` (``PoolConfig.calendar``) answers every "is this day a holiday?" of the
code: the forecasters' day types (``auto``, ``gbm``), Prophet's holiday frame, the analysis
tables and charts.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta, tzinfo
from functools import lru_cache
from typing import Any
from zoneinfo import ZoneInfo


@lru_cache(maxsize=32)
def _holidays(country: str, years: tuple[int, ...], subdivision: str | None = None
              ) -> dict[date, str]:
    import holidays

    return dict(holidays.country_holidays(country, subdiv=subdivision, years=list(years)).items())


@dataclass(frozen=True)
class HolidayCalendar:
    """Public holidays of ``country`` (ISO 3166 code; None: none) in ``subdivision`` (e.g.
    ``CA`` of ``US``), plus ``custom`` (date, name) pairs that count as holidays too."""

    country: str | None = None
    subdivision: str | None = None
    custom: tuple[tuple[date, str], ...] = ()

    @classmethod
    def of(cls, value: HolidayCalendar | str | None) -> HolidayCalendar:
        """A calendar from a calendar, a country code (``"KR"``, ``"US-CA"``) or None."""
        if isinstance(value, HolidayCalendar):
            return value
        if not value:
            return cls()
        country, _, subdivision = str(value).upper().partition("-")
        return cls(country, subdivision or None)

    @property
    def empty(self) -> bool:
        """No day is a holiday (no country, no custom dates)."""
        return not self.country and not self.custom

    def names(self, days: Iterable[date]) -> dict[date, str]:
        """The holidays among ``days``: date -> name (a custom date's name follows a public
        holiday's on the same day)."""
        days = list(days)
        if not days or self.empty:
            return {}
        table: dict[date, str] = {}
        if self.country:
            years = tuple(range(min(days).year, max(days).year + 1))
            table.update(_holidays(self.country, years, self.subdivision))
        for day, name in self.custom:
            table[day] = f"{table[day]}; {name}" if day in table else name
        return {d: table[d] for d in days if d in table}

    def between(self, first: date, last: date) -> dict[date, str]:
        """Every holiday from ``first`` to ``last`` (inclusive), in date order."""
        span = (last - first).days
        return self.names(first + timedelta(days=k) for k in range(span + 1)) if span >= 0 else {}

    def describe(self) -> str:
        """E.g. ``holidays KR``, ``holidays US-CA + 2 custom dates``, ``no holidays``."""
        if self.empty:
            return "no holidays"
        n = len(self.custom)
        custom = f"{n} custom date{'s' if n != 1 else ''}"
        if not self.country:
            return f"holidays: {custom} only (no public holidays)"
        public = self.country + (f"-{self.subdivision}" if self.subdivision else "")
        return f"holidays {public}" + (f" + {custom}" if n else "")


def holiday_names(calendar: HolidayCalendar | str | None, days: Iterable[date]) -> dict[date, str]:
    """The holidays among ``days``: date -> name (``calendar``: see ``HolidayCalendar.of``)."""
    return HolidayCalendar.of(calendar).names(days)


WORKING_DAY, SATURDAY, SUNDAY_OR_HOLIDAY = 0, 1, 2
DAY_TYPE_NAMES = ("working day", "Saturday", "Sunday/holiday")


# Days and times of day are the wall clock's. A zone with daylight saving time has days of 23
# and 25 hours, so local midnight plus 17 hours is 16:00 or 18:00 on those days, and local
# midnights are not 24 hours apart: slots, day numbers and daily moments are counted on naive
# wall-clock times instead.
def local_hour(day: date, hour: int, tz: str) -> datetime:
    """``hour``:00 on the local ``day`` by the wall clock, in UTC: arithmetic on a datetime in
    a zone of ``zoneinfo`` is by the wall clock too (17:00 EST + 24 h is 17:00 EDT, 23 hours
    later), on one in UTC by real time. A time the change to summer time skips is read with
    the offset before it, as ``datetime`` does."""
    return datetime(day.year, day.month, day.day, hour, tzinfo=ZoneInfo(tz)).astimezone(UTC)


def wall_clock(index: Any, tz: str | tzinfo) -> Any:
    """An aware ``DatetimeIndex`` as naive local wall-clock times in ``tz``: whole days are 24
    hours apart, and a time of day is the same slot on every day."""
    return index.tz_convert(tz).tz_localize(None)


def wall_clock_lag(index, tz: str, lag, origin, step):
    """For each time of ``index``, the position on the grid ``origin + k * step`` of the same
    wall-clock time ``lag`` (whole days) earlier: a week before 17:00 is 17:00, 167 or 169
    hours back across a change of summer time. -1 where that is before ``origin`` or off the
    grid; a time the change skipped is read as the step after the gap, a time it repeated as
    the first of the two."""
    import numpy as np

    wall = wall_clock(index, tz) - lag
    source = wall.tz_localize(tz, ambiguous=np.ones(len(wall), dtype=bool),
                              nonexistent="shift_forward").tz_convert("UTC")
    offset = (source - origin.tz_convert("UTC")) / step
    exact = np.isclose(offset, np.round(offset)) & (offset >= 0)
    return np.where(exact, np.round(offset), -1).astype(np.int64)


def day_types(index, tz: str, calendar: HolidayCalendar | str | None):
    """Per timestamp: 0 working day, 1 Saturday, 2 Sunday or holiday of ``calendar`` (local
    calendar days)."""
    import numpy as np

    calendar = HolidayCalendar.of(calendar)
    local = index.tz_convert(tz)
    # local calendar days as datetime64[D]: cheaper than Python date objects
    days = local.tz_localize(None).to_numpy().astype("datetime64[D]")
    weekday = (days.astype(np.int64) + 3) % 7  # 1970-01-01 was a Thursday (3)
    kinds = np.where(weekday == 5, SATURDAY, np.where(weekday == 6, SUNDAY_OR_HOLIDAY, WORKING_DAY))
    if not calendar.empty and len(days):
        unique = np.unique(days)
        holidays = calendar.names(unique.astype(object))
        if holidays:
            marked = np.array(sorted(holidays), dtype="datetime64[D]")
            kinds = np.where(np.isin(days, marked), SUNDAY_OR_HOLIDAY, kinds)
    return kinds


DAY_KINDS = ("working day", "weekend", "holiday")


def hourly_by_day_kind(local, holidays):
    """Mean of a series on a local-time index by hour of day (rows 0..23) and day kind
    (columns, those present: working day, weekend, and public holiday for the dates in
    ``holidays``)."""
    import numpy as np
    import pandas as pd

    kind = np.where(local.index.day_of_week >= 5, "weekend", "working day").astype(object)
    if holidays:
        kind[pd.Index(local.index.date).isin(list(holidays))] = "holiday"
    table = local.groupby([local.index.hour, kind]).mean().unstack()
    table = table[[c for c in DAY_KINDS if c in table.columns]].reindex(range(24))
    table.index.name = "hour"
    return table
