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

from idlegpu.scheduler.adapters.store import UnknownJobError
from idlegpu.scheduler.console.pages import Pages, notice_text
from idlegpu.scheduler.service import submissions
from idlegpu.scheduler.types import EventKind


def add_pages(pages: Pages) -> None:
    app = pages.app
    settings = pages.settings
    store = pages.store
    reads = pages.reads
    now = pages.now
    render = pages.render
    signed_in = pages.signed_in
    act = pages.act
    local = pages.local
    estimator = pages.estimator

    # -- detail -------------------------------------------------------------------------------

    def unit_detail(unit_id: str) -> dict[str, Any]:

        row = store.unit(unit_id)
        request_row = store.request(row.request_id)
        attempts = store.attempts(unit_id)
        events = store.events(unit_id=unit_id)
        job_name: Callable[[str, int], str] | None
        try:
            from idlegpu.scheduler.adapters.kubernetes import job_name
        except ImportError:  # pragma: no cover - the kubernetes client is a dependency
            job_name = None
        timeline = []
        for a in attempts:
            name = job_name(row.id, a.number) if job_name else None
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
        outcomes = {"answered": "answered in time: stopped at the acknowledgement",
                    "missed": "not answered: stopped at the deadline",
                    "cut": "cut short: the service needed the GPUs at once",
                    "ended": "ended: the attempt ended first"}
        progress = None
        for report in store.workload_reports(unit_id):
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
                    f"attempt {number}: notice {outcomes.get(n['outcome'], n['outcome'])}")})
        timeline.sort(key=lambda t: t["at"])
        plan = None if row.state.is_terminal() else reads.unit_plan(row.id)
        current = (job_name(row.id, row.attempts) if job_name and row.attempts
                   and row.state.holds_gpus() else None)
        return {"unit": row, "request_row": request_row, "timeline": timeline, "plan": plan,
                "siblings": store.request_units(row.request_id), "job_name": current,
                "namespace": settings.cluster.namespace,
                "raw": yaml.safe_dump(request_row.raw, sort_keys=False, allow_unicode=True),
                "estimate": estimator.estimate(row.spec), "progress": progress}

    @app.get("/units/{unit_id}", include_in_schema=False)
    async def unit_page(unit_id: str, request: Request) -> Response:
        got = await signed_in(request)
        if isinstance(got, Response):
            return got
        session, who, _ = got

        try:
            detail = await run_in_threadpool(unit_detail, unit_id)
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

    async def cancel_form(request: Request, kind: str, target: str) -> Response:
        got = await signed_in(request, post=True)
        if isinstance(got, Response):
            return got
        session, who, fields = got
        reason = fields.get("reason", "").strip()
        result, said = await act(lambda: submissions.cancel(
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
