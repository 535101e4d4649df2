"""Public holidays of the configured country (the ``holidays`` package works offline)."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import date
from functools import lru_cache


@lru_cache(maxsize=32)
def _holidays(country: str, years: tuple[int, ...]) -> dict[date, str]:
    import holidays

    return dict(holidays.country_holidays(country, years=list(years)).items())


def holiday_names(country: str, days: Iterable[date]) -> dict[date, str]:
    """The public holidays among ``days``: date -> name."""
    days = list(days)
    if not days:
        return {}
    years = tuple(range(min(days).year, max(days).year + 1))
    table = _holidays(country.upper(), years)
    return {d: table[d] for d in days if d in table}


WORKING_DAY, SATURDAY, SUNDAY_OR_HOLIDAY = 0, 1, 2
DAY_TYPE_NAMES = ("working day", "Saturday", "Sunday/holiday")


def day_types(index, tz: str, country: str | None):
    """Per timestamp: 0 working day, 1 Saturday, 2 Sunday or public holiday (local calendar)."""
    import numpy as np

    local = index.tz_convert(tz)
    # local calendar days as datetime64[D]: cheaper than Python date objects
    days = local.tz_localize(None).to_numpy().astype("datetime64[D]")
    weekday = (days.astype(np.int64) + 3) % 7  # 1970-01-01 was a Thursday (3)
    kinds = np.where(weekday == 5, SATURDAY, np.where(weekday == 6, SUNDAY_OR_HOLIDAY, WORKING_DAY))
    if country and len(days):
        unique = np.unique(days)
        holidays = holiday_names(country, unique.astype(object))
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
