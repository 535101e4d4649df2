"""A text cell of a CSV that cannot run as a spreadsheet formula (``idlegpu.forecast.tables``
has the whole convention): apart from the tables, without pandas, for the command's own quick
tables (``idlegpu.scheduler.output``), which ``idlegpu --help`` loads."""

from __future__ import annotations

FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")


def safe_text(value: object) -> object:
    """A text cell that cannot run as a spreadsheet formula."""
    if isinstance(value, str) and value.startswith(FORMULA_STARTS):
        return "'" + value
    return value
