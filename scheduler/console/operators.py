"""The operators' pages (``/operators``): the daemon's health, pausing admission, the audit log."""

from __future__ import annotations

from scheduler.console.pages import Pages


def add_pages(pages: Pages) -> None:
    """Registers the operators' routes on ``pages.app``."""
