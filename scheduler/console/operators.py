"""The operators' pages (``/operators``): the daemon's health, pausing admission, the audit log.

Operators only (anyone else gets a 403 page saying who may). What the page shows is what the
API answers: the daemon replicas' status and the store (``service.operations.daemon_status``,
what ``GET /v1/daemon`` answers; the daemon
writes its status into the store after every pass; the API server and the daemon share
nothing else), the admission state, and the audit log (``JobStore.audit_log``, newest first,
filtered by action, team and actor, ``AUDIT_PAGE`` entries a page). A pass older than three
reconcile periods is shown red: what the daemon's own ``/healthz`` calls unhealthy.

The pause form (a reason is required) and the resume button are CSRF-protected forms handed to
``service.operations.pause`` / ``resume``, the functions behind ``POST /v1/admission/pause`` /
``resume`` and ``idlegpu admission``, so their rules (operators only, the reason's bounds) and
their audit entry apply exactly as there.

While admission is paused the pool page shows who paused it, since when and why: the
``admission_paused()`` template global, registered here, gives that line (None while open).
"""

from __future__ import annotations

import json
from urllib.parse import urlencode

from fastapi import Request
from fastapi.responses import RedirectResponse, Response
from starlette.concurrency import run_in_threadpool

from idlegpu.scheduler.console.pages import Pages, notice_text
from idlegpu.scheduler.service import operations
from idlegpu.scheduler.service.identity import OPERATOR
from idlegpu.scheduler.service.operations import paused_reason

AUDIT_PAGE = 50
"""Audit entries per page."""
MAX_PAGE = 1_000_000
"""The last audit page a link may ask for (an offset the store's integers hold)."""
ACTIONS = ("submit", "cancel", "token.create", "token.revoke", "admission.pause",
           "admission.resume")
"""The audit log's actions, offered by the action filter."""
MAX_FILTER = 200


def age_text(seconds: float | None) -> str:
    """An age as the page shows it: ``40 s``, ``12 min``, ``3.5 h``, ``2.0 d``."""
    if seconds is None:
        return "—"
    if abs(seconds) < 120:
        return f"{seconds:.0f} s"
    if abs(seconds) < 7200:
        return f"{seconds / 60:.0f} min"
    if abs(seconds) < 172_800:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} d"


def add_pages(pages: Pages) -> None:
    """Registers the operators' routes on ``pages.app``."""
    app, store, tz = pages.app, pages.store, pages.settings.pool.tz
    pages.env.filters["age"] = age_text

    def admission_paused() -> str | None:
        """The pool page's banner while admission is paused (None while open)."""
        text = paused_reason(store.admission(), tz)
        return text[:1].upper() + text[1:] if text else None

    pages.env.globals["admission_paused"] = admission_paused

    def refuse(request: Request, who, session) -> Response:
        return pages.render(
            "error.html", request, who, session, status=403,
            message=f"The operators' page is for operators only; you are {who.user}, a "
                    f"{who.role} of team {who.team}. An operator's token (idlegpu token "
                    "create --role operator) or an identity mapped to role operator "
                    "(api.identities) may see it.")

    def audit_entries(action: str, team: str, actor: str, page: int) -> tuple[list, bool]:
        rows = store.audit_log(limit=AUDIT_PAGE + 1, offset=(page - 1) * AUDIT_PAGE,
                               action=action or None, team=team or None, actor=actor or None)
        more = len(rows) > AUDIT_PAGE  # oldest first: the extra one is the oldest
        rows = rows[1:] if more else rows
        entries = []
        for e in reversed(rows):  # newest first
            detail = {k: v for k, v in e.detail.items() if v not in (None, "", [], {})}
            entries.append({"id": e.id, "at": e.at, "actor": e.actor, "auth": e.auth,
                            "role": e.role, "team": e.team or "—", "action": e.action,
                            "target": e.target or "—", "address": e.address or "—",
                            "detail": json.dumps(detail, sort_keys=True, ensure_ascii=False,
                                                 default=str) if detail else ""})
        return entries, more

    async def operators_page(request: Request, session, who, *, status: int = 200,
                             error: str | None = None, reason: str = "") -> Response:
        query = request.query_params
        action = query.get("action", "")[:MAX_FILTER]
        team = query.get("team", "").strip()[:MAX_FILTER]
        actor = query.get("actor", "").strip()[:MAX_FILTER]
        try:  # a page past the end shows none; one past what an offset can hold, the last
            page = min(MAX_PAGE, max(1, int(query.get("page", "1")[:12])))
        except ValueError:
            page = 1
        daemon, said = await pages.act(
            lambda: operations.daemon_status(store, who, pages.now(), tz), changes=False)
        daemon_error = None if said is None else said.message
        entries, more = await run_in_threadpool(audit_entries, action, team, actor, page)
        admission = (daemon or {}).get("admission")
        if admission is None:
            state = await run_in_threadpool(store.admission)
            admission = {"paused": state.paused, "by": state.by, "reason": state.reason,
                         "since": state.since, "text": paused_reason(state, tz)}
        filters = {"action": action, "team": team, "actor": actor}
        link = lambda n: "/operators?" + urlencode({**{k: v for k, v in filters.items() if v},
                                                    "page": n}) + "#audit"
        return pages.render(
            "operators.html", request, who, session, status=status, daemon=daemon,
            daemon_error=daemon_error, admission=admission, entries=entries, actions=ACTIONS,
            action=action, team=team, actor=actor, page=page,
            prev=link(page - 1) if page > 1 else None, next=link(page + 1) if more else None,
            first=(page - 1) * AUDIT_PAGE + 1 if entries else 0,
            last=(page - 1) * AUDIT_PAGE + len(entries), error=error, reason=reason,
            notice=notice_text(query),
            signal_limit=pages.settings.admission.max_signal_age_seconds,
            forecast_limit=pages.settings.admission.max_forecast_age_seconds)

    @app.get("/operators", include_in_schema=False)
    async def operators(request: Request) -> Response:
        got = await pages.signed_in(request)
        if isinstance(got, Response):
            return got
        session, who, _ = got
        if who.role != OPERATOR:
            return refuse(request, who, session)
        return await operators_page(request, session, who)

    async def change(request: Request, action: str) -> Response:
        got = await pages.signed_in(request, post=True)
        if isinstance(got, Response):
            return got
        session, who, fields = got
        if who.role != OPERATOR:
            return refuse(request, who, session)
        reason = fields.get("reason", "")
        when = pages.now()
        change, said = await pages.act(
            (lambda: operations.pause(store, who, reason, when, tz)) if action == "pause"
            else (lambda: operations.resume(store, who, when)))
        if said is not None:
            return await operators_page(request, session, who, status=said.status,
                                        error=said.message, reason=reason[:1000])
        code = {("pause", True): "paused", ("pause", False): "already-paused",
                ("resume", True): "resumed", ("resume", False): "not-paused"}[
            action, change.changed]
        return RedirectResponse(f"/operators?notice={code}", status_code=303)

    @app.post("/operators/pause", include_in_schema=False)
    async def pause(request: Request) -> Response:
        return await change(request, "pause")

    @app.post("/operators/resume", include_in_schema=False)
    async def resume(request: Request) -> Response:
        return await change(request, "resume")
