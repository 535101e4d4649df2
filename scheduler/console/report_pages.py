"""The reports' pages (``/reports``): the monthly reports and the forecast's accuracy."""

from __future__ import annotations

from scheduler.console.pages import Pages


def add_pages(pages: Pages) -> None:
    """Registers the reports' routes on ``pages.app``."""
