"""What a console page module needs from ``add_console``: ``Pages``, handed to each module's
``add_pages(pages)`` so that every page renders, authenticates and calls the API one way."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from fastapi import FastAPI
from jinja2 import Environment

FORECAST_STALE_S = 2 * 3600.0
"""A forecast older than this is shown red (the server refits every clock hour)."""
SIGNALS_STALE_S = 15 * 60.0
"""Live signals (the newest pool sample) older than this are shown red."""
PLAN_TTL_S = 30.0
"""The console's pages share one plan for this long (the plan of 10,000 queued units takes the
API tens of seconds); a submit or cancel from the console drops it at once."""
SORTS = ("start", "submitted", "gpus", "state", "team", "id")
QUEUE_LIMIT = 20_000
PAGE_ROWS = 500
"""Units per queue page (a browser takes seconds to lay out 10,000 rows)."""

NOTICES = {
    "submitted": "submitted",
    "cancelled": "cancelled {n} unit(s)",
    "paused": "admission paused",
    "already-paused": "admission was already paused; nothing changed",
    "resumed": "admission resumed",
    "not-paused": "admission was not paused; nothing changed",
}
"""The status banners a redirect may ask for (``?notice=CODE``): a page shows only these, never
text from the address, which anyone can write into a link."""


def notice_text(query: Any) -> str | None:
    """The banner of ``?notice=CODE`` (``&n=COUNT`` for a count), or None for anything else."""
    text = NOTICES.get(str(query.get("notice", ""))[:40])
    if text is None or "{n}" not in text:
        return text
    count = str(query.get("n", ""))
    return text.format(n=int(count)) if count.isdigit() and len(count) <= 7 else None


@dataclass(frozen=True)
class Pages:
    app: FastAPI
    settings: Any
    store: Any
    reads: Any
    now: Callable[[], datetime]
    env: Environment
    render: Callable[..., Any]
    """``render(template, request, who, session, status=200, **context)`` -> HTMLResponse."""
    signed_in: Callable[..., Awaitable[Any]]
    """``await signed_in(request, post=False)`` -> ``(session, identity, form)`` or a
    Response (the login redirect, or a 403 for a POST without the CSRF token)."""
    act: Callable[..., Awaitable[tuple[Any, Any]]]
    """``await act(work, changes=True)`` -> ``(result, None)`` of a service call
    (``idlegpu.scheduler.service``), or ``(None, Failure)``: what its refusal says."""
    from_session: Callable[[Any], Any]
    local: Callable[..., str]
    """A time as the pages show it: local to the pool, with the zone."""
    hours: Callable[[float | None], str]
    headers: Callable[[], dict[str, str]]
    plan_json: Callable[[], dict[str, Any]]
    zone: str
    estimates: Callable[[], Callable[[Any], Any]]
    """``estimates()`` -> a runtime estimate per unit spec, remembered for one render."""
    estimator: Any
    history_stash: Any
    """The pool's recent history, kept a minute (``routes._Stash``)."""
    plan_stash: Any
    """Tonight's plan, shared by the pages for ``routes.PLAN_TTL_S``; a change drops it."""
    examples: dict[str, str]
    """The example requests by file name."""
