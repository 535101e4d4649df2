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
