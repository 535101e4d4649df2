"""The console's pages of one unit and one request, and their cancel forms (through
``service.submissions.cancel``)."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Any
from urllib.parse import quote

import yaml
from fastapi import Request
from fastapi.responses import RedirectResponse, Response
from starlette.concurrency import run_in_threadpool

from idlegpu.scheduler.adapters.kubernetes import job_name
from idlegpu.scheduler.adapters.store import UnknownJobError
from idlegpu.scheduler.console.pages import Pages, notice_text
from idlegpu.scheduler.service import submissions
from idlegpu.scheduler.types import EventKind


def add_pages(pages: Pages) -> None:
    _add_detail_pages(pages)
    _add_cancel_forms(pages)


def _unit_detail(pages: Pages, unit_id: str) -> dict[str, Any]:
    """What the unit page shows: the unit, its request, its plan and its timeline."""
    store = pages.store
    row = store.unit(unit_id)
    request_row = store.request(row.request_id)
    timeline = _attempts_timeline(row.id, store.attempts(unit_id),
                                  store.events(unit_id=unit_id), job_name)
    notices, progress = _notices_timeline(store.workload_reports(unit_id), pages.local)
    timeline += notices
    timeline.sort(key=lambda t: t["at"])
    plan = None if row.state.is_terminal() else pages.reads.unit_plan(row.id)
    current = (job_name(row.id, row.attempts) if row.attempts
               and row.state.holds_gpus() else None)
    return {"unit": row, "request_row": request_row, "timeline": timeline, "plan": plan,
            "siblings": store.request_units(row.request_id), "job_name": current,
            "namespace": pages.settings.cluster.namespace,
            "raw": yaml.safe_dump(request_row.raw, sort_keys=False, allow_unicode=True),
            "estimate": pages.estimator.estimate(row.spec), "progress": progress}


def _attempts_timeline(unit_id: str, attempts, events,
                       job_name: Callable[[str, int], str] | None) -> list[dict[str, Any]]:
    """A unit's attempts (admitted, started, planned stop, ended) and its checkpoints and
    preemptions, as timeline entries."""
    timeline = []
    for a in attempts:
        name = job_name(unit_id, a.number) if job_name else None
        timeline.append({"at": a.admitted_at, "what": f"attempt {a.number} admitted "
                         f"({a.gpus} GPUs" + (f", window {a.window_label}" if a.window_label
                                              else "") + ")", "job": name})
        if a.started_at:
            timeline.append({"at": a.started_at, "what": f"attempt {a.number} started"})
        if a.stop_by:
            timeline.append({"at": a.stop_by, "what": f"attempt {a.number} planned stop"})
        if a.ended_at:
            outcome = a.outcome.value if a.outcome else "ended"
            lost = (f", {a.lost_gpu_seconds / 3600:.1f} GPU-h lost"
                    if a.lost_gpu_seconds else "")
            useful = f", {a.gpu_seconds / 3600:.1f} GPU-h" if a.gpu_seconds else ""
            timeline.append({"at": a.ended_at, "what": f"attempt {a.number} {outcome}"
                             f"{useful}{lost}"})
    for e in events:
        if e.kind in (EventKind.CHECKPOINTED, EventKind.PREEMPTED):
            detail = ", ".join(f"{k}: {v}" for k, v in sorted(e.detail.items())
                               if isinstance(v, (str, int, float)))
            timeline.append({"at": e.at, "what": e.kind.value + (f" ({detail})"
                                                                  if detail else "")})
    return timeline


NOTICE_OUTCOMES = {"answered": "answered in time: stopped at the acknowledgement",
                   "missed": "not answered: stopped at the deadline",
                   "cut": "cut short: the service needed the GPUs at once",
                   "ended": "ended: the attempt ended first"}


def _notices_timeline(reports, local: Callable[..., str]
                      ) -> tuple[list[dict[str, Any]], dict[str, Any] | None]:
    """The checkpoint notices of a unit's workload reports as timeline entries, and the
    newest progress it reported (None: none)."""
    timeline: list[dict[str, Any]] = []
    progress = None
    for report in reports:
        n, number = report["notice"], report["attempt"]
        if progress is None and report["progress"]:
            progress = {"attempt": number, **report["progress"]}
        if n is None:
            continue
        timeline.append({"at": datetime.fromisoformat(n["sent_at"]), "what": (
            f"attempt {number}: checkpoint notice, deadline "
            f"{local(n['deadline'], seconds=True)}: {n['reason']}")})
        if n["answered_at"]:
            timeline.append({"at": datetime.fromisoformat(n["answered_at"]), "what": (
                f"attempt {number}: notice answered, saved step {n['step']}"
                + (f" at {n['path']}" if n["path"] else ""))})
        if n["outcome"]:
            timeline.append({"at": datetime.fromisoformat(n["closed_at"]), "what": (
                f"attempt {number}: notice "
                f"{NOTICE_OUTCOMES.get(n['outcome'], n['outcome'])}")})
    return timeline, progress


def _add_detail_pages(pages: Pages) -> None:
    """The pages of one unit and of one request."""
    app, store, render, signed_in = pages.app, pages.store, pages.render, pages.signed_in

    @app.get("/units/{unit_id}", include_in_schema=False)
    async def unit_page(unit_id: str, request: Request) -> Response:
        got = await signed_in(request)
        if isinstance(got, Response):
            return got
        session, who, _ = got

        try:
            detail = await run_in_threadpool(_unit_detail, pages, unit_id)
        except UnknownJobError as exc:
            return render("error.html", request, who, session, status=404, message=str(exc))
        return render("unit.html", request, who, session, **detail,
                    may_cancel=who.may_cancel(detail["unit"].team)
                    and not detail["unit"].state.is_terminal(),
                    notice=notice_text(request.query_params))

    @app.get("/requests/{request_id}", include_in_schema=False)
    async def request_page(request_id: str, request: Request) -> Response:
        got = await signed_in(request)
        if isinstance(got, Response):
            return got
        session, who, _ = got

        try:
            row = await run_in_threadpool(store.request, request_id)
            units = await run_in_threadpool(store.request_units, request_id)
        except UnknownJobError as exc:
            return render("error.html", request, who, session, status=404, message=str(exc))
        live = any(not u.state.is_terminal() for u in units)
        return render("request.html", request, who, session, request_row=row, units=units,
                    raw=yaml.safe_dump(row.raw, sort_keys=False, allow_unicode=True),
                    may_cancel=who.may_cancel(row.team) and live,
                    notice=notice_text(request.query_params))


def _add_cancel_forms(pages: Pages) -> None:
    """The cancel forms of a unit and of a request (``service.submissions.cancel``)."""
    app, store, now, render = pages.app, pages.store, pages.now, pages.render

    async def cancel_form(request: Request, kind: str, target: str) -> Response:
        got = await pages.signed_in(request, post=True)
        if isinstance(got, Response):
            return got
        session, who, fields = got
        reason = fields.get("reason", "").strip()
        result, said = await pages.act(lambda: submissions.cancel(
            store, who, target, now(), reason or None, kind=kind.removesuffix("s")))
        if said is not None:
            return render("error.html", request, who, session, status=said.status,
                          message=said.message)
        done = len(result.cancelled) + len(result.to_stop)
        return RedirectResponse(f"/{kind}/{quote(target, safe='')}?notice=cancelled&n={done}",
                                status_code=303)

    @app.post("/units/{unit_id}/cancel", include_in_schema=False)
    async def cancel_unit(unit_id: str, request: Request) -> Response:
        return await cancel_form(request, "units", unit_id)

    @app.post("/requests/{request_id}/cancel", include_in_schema=False)
    async def cancel_request(request_id: str, request: Request) -> Response:
        return await cancel_form(request, "requests", request_id)
