"""The console's queue page (``/queue``): units with their estimated start or the reason they
wait, by scope, sorted, a page at a time."""

from __future__ import annotations

import time
from typing import Any
from urllib.parse import urlencode

import pandas as pd
from fastapi import Request
from fastapi.responses import Response
from starlette.concurrency import run_in_threadpool

from idlegpu.scheduler.service.identity import Identity
from idlegpu.scheduler.console.pages import (
    FORECAST_STALE_S,
    PAGE_ROWS,
    QUEUE_LIMIT,
    SORTS,
    Pages,
)
from idlegpu.scheduler.types import JobState


def add_pages(pages: Pages) -> None:
    app = pages.app
    store = pages.store
    render = pages.render
    signed_in = pages.signed_in
    local = pages.local
    hours = pages.hours
    plan_json = pages.plan_json
    estimates = pages.estimates

    # -- queue ------------------------------------------------------------------------------

    def queue_rows(who: Identity, scope: str) -> tuple[list[dict[str, Any]], dict[str, Any]]:

        live = tuple(s for s in JobState if not s.is_terminal())
        rows = store.find_units(states=live, team=who.team if scope == "team" else None,
                                principal=who.principal if scope == "mine" else None,
                                limit=QUEUE_LIMIT)
        meta: dict[str, Any] = {"error": None, "made_at": None}
        planned: dict[str, dict[str, Any]] = {}
        try:
            plan = plan_json()
            planned = {u["id"]: u for u in plan["units"]}
            meta["made_at"] = local(plan["made_at"], seconds=True)
            meta["stale"] = plan["forecast_age_s"] > FORECAST_STALE_S
        except Exception as exc:  # noqa: BLE001 - the queue without estimates, and why
            meta["error"] = str(exc)
        out = []
        estimate_of = estimates()
        for row in rows:
            plan_unit = planned.get(row.id)
            estimate = estimate_of(row.spec)
            start = plan_unit["start_at"] if plan_unit else None
            if row.state.holds_gpus():
                reason = "running" if row.state is JobState.RUNNING else "admitted, starting"
                start = row.started_at or row.admitted_at
            else:
                reason = plan_unit["reason"] if plan_unit else "not in tonight's plan"
            out.append({
                "id": row.id, "request_id": row.request_id, "name": row.request_name,
                "team": row.team, "state": row.state.value, "gpus": row.gpus,
                "runtime": hours(estimate.seconds), "runtime_s": estimate.seconds,
                "runtime_source": estimate.source, "start": start,
                "start_text": local(start) if start is not None else "not tonight",
                "stop_by": plan_unit["stop_by"] if plan_unit else None,
                "reason": reason, "submitted": row.submitted_at,
                "cancellable": who.may_cancel(row.team)})
        return out, meta

    def external_rows(who: Identity, scope: str) -> list[dict[str, Any]]:
        """Kueue's Workloads and users' own Jobs, as the daemon's last pass saw them (nobody
        here submitted them: "mine" has none; a team sees its own)."""
        if scope == "mine":
            return []
        return [{"id": u.id, "origin": "Kueue Workload" if u.origin == "kueue" else "Job",
                 "team": u.team, "state": u.state, "gpus": u.gpus,
                 "start_text": local(u.start_at) if u.start_at is not None else "",
                 "reason": u.reason}
                for u in store.external_units()[:QUEUE_LIMIT]
                if u.state != "ended" and (scope == "all" or u.team == who.team)]

    @app.get("/queue", include_in_schema=False)
    async def queue_page(request: Request, scope: str = "team", sort: str = "start",
                         q: str = "", state: str = "", page: int = 1) -> Response:
        got = await signed_in(request)
        if isinstance(got, Response):
            return got
        session, who, _ = got
        scope = scope if scope in ("mine", "team", "all") else "team"
        sort = sort if sort in SORTS else "start"
        started = time.perf_counter()
        units, meta = await run_in_threadpool(queue_rows, who, scope)
        external = await run_in_threadpool(external_rows, who, scope)
        states = sorted({u["state"] for u in units})
        if state:
            units = [u for u in units if u["state"] == state]
        if q.strip():
            needle = q.strip().lower()
            units = [u for u in units if needle in u["id"].lower() or needle in
                     u["name"].lower() or needle in u["team"].lower()
                     or needle in u["reason"].lower()]
        far = pd.Timestamp.max.tz_localize("UTC")
        keys = {"start": lambda u: (pd.Timestamp(u["start"]) if u["start"] else far, u["id"]),
                "submitted": lambda u: (u["submitted"], u["id"]),
                "gpus": lambda u: (-u["gpus"], u["id"]), "state": lambda u: (u["state"], u["id"]),
                "team": lambda u: (u["team"], u["id"]), "id": lambda u: u["id"]}
        units.sort(key=keys[sort])
        total = len(units)
        pages = max(1, -(-total // PAGE_ROWS))
        number = min(max(1, page), pages)
        first = (number - 1) * PAGE_ROWS
        query = {"scope": scope, "sort": sort, "q": q, "state": state}
        link = lambda n: "/queue?" + urlencode({**query, "page": n})
        response = render("queue.html", request, who, session,
                          units=units[first:first + PAGE_ROWS], external=external,
                          scope=scope, sort=sort, q=q,
                          state=state, states=states, meta=meta, total=total,
                          first=first + 1 if total else 0,
                          last=min(total, first + PAGE_ROWS), page=number, pages=pages,
                          prev=link(number - 1) if number > 1 else None,
                          next=link(number + 1) if number < pages else None)
        response.headers["Server-Timing"] = f"queue;dur={(time.perf_counter() - started) * 1000:.1f}"
        return response
