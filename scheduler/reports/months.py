"""The reported months: local to the pool's time zone, with their UTC edges."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

import pandas as pd

from idlegpu.scheduler.reports.errors import ReportError


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
