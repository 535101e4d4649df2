"""The error of the monthly reports."""

from __future__ import annotations

from idlegpu.forecast.errors import PermanentError


class ReportError(PermanentError):
    """The runs cannot make a report (bad rows, nothing in the month, ...)."""
