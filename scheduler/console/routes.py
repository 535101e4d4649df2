"""The console's routes (see the package); ``add_console(app, ...)`` registers them."""

from __future__ import annotations

import json
import logging
import secrets
import threading
import time
from collections.abc import Callable
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, quote, urlencode

import pandas as pd
import yaml
from fastapi import FastAPI, Request
from fastapi.responses import HTMLResponse, JSONResponse, RedirectResponse, Response
from jinja2 import Environment, PackageLoader, select_autoescape
from starlette.concurrency import run_in_threadpool
from starlette.staticfiles import StaticFiles

from idlegpu.scheduler.service.errors import ServiceError
from idlegpu.scheduler.service.identity import Authenticates, Identity, token_sha256
from idlegpu.scheduler.web.headers import CSP
from idlegpu.scheduler.console.pages import Pages, notice_text
from idlegpu.scheduler.console.session import COOKIE, CSRF_HEADER, Session, Sessions
from idlegpu.scheduler.service import submissions
from idlegpu.scheduler.service.errors import Failure, failure

log = logging.getLogger("idlegpu.console")

HERE = Path(__file__).resolve().parent
STATIC = "/console/static"
LOGIN_CSRF = "idlegpu_login_csrf"
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
EXAMPLES = HERE.parents[1] / "examples" / "jobs"
"""The example requests in a checkout; an install has them as data files (pyproject.toml)."""
INSTALLED_EXAMPLES = "share/idlegpu/examples/jobs/"


def _examples() -> dict[str, str]:
    """The example requests by file name: the checkout's ``examples/jobs``, else those the
    installed distribution holds (``<prefix>/share/idlegpu/examples/jobs``)."""
    if EXAMPLES.is_dir():
        return {p.name: p.read_text(encoding="utf-8") for p in sorted(EXAMPLES.glob("*.yaml"))}
    from importlib import metadata

    try:
        files = metadata.distribution("idlegpu").files or []
    except metadata.PackageNotFoundError:
        return {}
    found = {}
    for file in files:
        path = file.as_posix()
        if INSTALLED_EXAMPLES in path and path.endswith(".yaml"):
            located = Path(file.locate())
            if located.is_file():
                found[located.name] = located.read_text(encoding="utf-8")
    return dict(sorted(found.items()))


class _Stash:
    """A value kept for ``ttl`` seconds per key (the pool's history, re-read every minute)."""

    def __init__(self, ttl: float) -> None:
        self.ttl = ttl
        self.lock = threading.Lock()
        self.entry: tuple[Any, float, Any] | None = None

        self.making = threading.Lock()  # one caller computes, the others wait for it

    def _fresh(self, key: Any) -> Any:
        with self.lock:
            if self.entry and self.entry[0] == key and time.monotonic() - self.entry[1] < self.ttl:
                return self.entry
        return None

    def get(self, key: Any, make: Callable[[], Any]) -> Any:
        entry = self._fresh(key)
        if entry is not None:
            return entry[2]
        with self.making:
            entry = self._fresh(key)
            if entry is not None:
                return entry[2]
            value = make()
            with self.lock:
                self.entry = (key, time.monotonic(), value)
            return value

    def clear(self) -> None:
        with self.lock:
            self.entry = None


def add_console(app: FastAPI, settings, store, authenticator: Authenticates, reads,
                now: Callable[[], datetime]) -> None:
    """The console's routes on ``app`` (and ``app.state.console_caller``, through which the
    ``/v1`` routes accept the console's session cookie)."""
    secret = getattr(settings.api, "session_secret", None)
    # a logout ends the session on every replica; sessions age on the server's clock
    sessions = Sessions(secret, store=store, now=lambda: now().timestamp())
    app.state.console_sessions = sessions
    tz = settings.pool.tz
    env = Environment(loader=PackageLoader("idlegpu.scheduler.console", "templates"),
                      autoescape=select_autoescape(["html"]), trim_blocks=True,
                      lstrip_blocks=True)
    examples = _examples()
    history_stash = _Stash(60.0)
    plan_stash = _Stash(PLAN_TTL_S)

    def plan_json() -> dict[str, Any]:
        """Tonight's plan over 24 h (``Reads.plan_json``), shared for ``PLAN_TTL_S``."""
        return plan_stash.get(pd.Timestamp(now()).floor("min"), lambda: reads.plan_json(24.0))
    from idlegpu.scheduler.runtime import RuntimeEstimator

    estimator = RuntimeEstimator.from_config(None, settings.admission)

    def estimates() -> Callable[[Any], Any]:
        """``estimator.estimate``, remembered per family and user estimate where the family
        has no past runs (then nothing else about the unit matters); one table per render."""
        runs: dict[str, int] = {}
        known: dict[tuple[str, float | None], Any] = {}

        def estimate(spec) -> Any:
            family = spec.family
            if family not in runs:
                runs[family] = len(estimator.runs(family))
            if runs[family]:
                return estimator.estimate(spec)
            key = (family, spec.runtime_estimate_s)
            if key not in known:
                known[key] = estimator.estimate(spec)
            return known[key]

        return estimate

    def local(when: datetime | str | None, *, seconds: bool = False) -> str:
        if when is None:
            return "—"
        stamp = pd.Timestamp(when).tz_convert(tz)
        return stamp.strftime("%a %d %b %H:%M:%S %Z" if seconds else "%a %d %b %H:%M %Z")

    def hours(seconds: float | None) -> str:
        if seconds is None:
            return "—"
        if seconds < 3600:
            return f"{seconds / 60:.0f} min"
        return f"{seconds / 3600:.1f} h"

    def short_error(message: str, field: str | None) -> str:
        """An API error without the ``request: <field>: `` the page already shows."""
        message = message.removeprefix("request: ")
        return message.removeprefix(f"{field}: ") if field else message

    env.filters["short_error"] = short_error
    env.filters["local"] = local
    env.filters["hours"] = hours
    zone_label = f"{settings.pool.timezone} ({pd.Timestamp(now()).tz_convert(tz).strftime('%Z, UTC%z')})"

    # -- identity -------------------------------------------------------------------------

    def secure(request: Request) -> bool:
        if request.url.scheme == "https":
            return True
        address = request.client.host if request.client else None
        return (authenticator.trusted_proxy(address)
                and request.headers.get("x-forwarded-proto", "").lower() == "https")

    def from_session(request: Request) -> tuple[Session, Identity] | None:
        session = sessions.read(request.cookies.get(COOKIE))
        if session is None:
            return None
        team, role = session.team, session.role
        if session.token_sha256:  # a token session: the token must still be good
            row = store.api_token_by_hash(session.token_sha256)
            if (row is None or row.revoked_at is not None
                    or (row.expires_at is not None and now() >= row.expires_at)):
                return None
            team, role = row.team, row.role
        address = request.client.host if request.client else None
        return session, Identity(user=session.user, auth=session.auth, team=team, role=role,
                                 groups=session.groups, address=address)

    def console_caller(request: Request) -> Identity | None:
        """For the /v1 routes: the identity of a console session cookie, when the call has
        no credentials of its own; a change without the session's X-CSRF-Token is refused."""
        if "authorization" in request.headers or COOKIE not in request.cookies:
            return None
        if settings.api.proxy.user_header.lower() in request.headers:
            return None
        found = from_session(request)
        if found is None:
            return None
        session, who = found
        if request.method not in ("GET", "HEAD", "OPTIONS") and not sessions.csrf_ok(
                session, request.headers.get(CSRF_HEADER)):
            raise ServiceError(403, "the console's CSRF token is missing or wrong (send the "
                                "session's token as X-CSRF-Token)")
        return who

    app.state.console_caller = console_caller

    def set_session(response: Response, request: Request, who: Identity,
                    token: str | None) -> None:
        _, cookie = sessions.issue(user=who.user, auth=who.auth, team=who.team, role=who.role,
                                   token_sha256=token_sha256(token) if token else None,
                                   groups=who.groups)
        response.set_cookie(COOKIE, cookie, max_age=int(sessions.hours * 3600), path="/",
                            httponly=True, samesite="strict", secure=secure(request))

    def safe_next(target: str | None) -> str:
        if not target or not target.startswith("/") or target.startswith("//") or "\\" in target:
            return "/"
        return target

    def to_login(request: Request) -> RedirectResponse:
        target = request.url.path + (f"?{request.url.query}" if request.url.query else "")
        return RedirectResponse(f"/login?next={quote(target, safe='')}", status_code=303)

    def proxy_login(request: Request) -> Identity | None:
        address = request.client.host if request.client else None
        header = settings.api.proxy.user_header.lower()
        if header not in request.headers or not authenticator.trusted_proxy(address):
            return None
        return authenticator.authenticate(request.headers, address, now())

    def render(name: str, request: Request, who: Identity | None, session: Session | None,
             status: int = 200, **context: Any) -> HTMLResponse:
        html = env.get_template(name).render(
            who=who, csrf=session.csrf if session else "", static=STATIC, zone=zone_label,
            may_change=bool(who and who.may_change()), path=request.url.path, **context)
        return HTMLResponse(html, status_code=status, headers=headers())

    def headers() -> dict[str, str]:
        return {"Content-Security-Policy": CSP, "X-Content-Type-Options": "nosniff",
                "Referrer-Policy": "same-origin", "Cache-Control": "no-store"}

    async def form(request: Request) -> dict[str, str]:
        body = await request.body()  # bounded by BoundedBodies (scheduler/web/bodies.py)
        fields = parse_qs(body.decode("utf-8", "replace"), keep_blank_values=True)
        return {k: v[0] for k, v in fields.items()}

    async def signed_in(request: Request, *, post: bool = False):
        """``(session, identity, form)``, or a response: the login redirect, or a 403 for a
        POST without the session's CSRF token."""
        found = await run_in_threadpool(from_session, request)
        if found is None:
            if post:
                return Response("not logged in", status_code=403, headers=headers())
            return to_login(request)
        session, who = found
        fields: dict[str, str] = {}
        if post:
            fields = await form(request)
            if not sessions.csrf_ok(session, fields.get("csrf")):
                return HTMLResponse(env.get_template("error.html").render(
                    who=who, csrf=session.csrf, static=STATIC, zone=zone_label, path="",
                    may_change=who.may_change(), status=403,
                    message="This form's CSRF token is missing or wrong; reload the page "
                            "and try again."), status_code=403, headers=headers())
        return session, who, fields

    async def act(work: Callable[[], Any], *, changes: bool = True
                  ) -> tuple[Any, Failure | None]:
        """``work()``, a service call, off the event loop: its result, or what its refusal
        says (what the job API would answer: the same functions, the same rules and audit).
        A change drops the shared plan: the next page plans again."""
        try:
            result = await run_in_threadpool(work)
        except Exception as exc:
            said = failure(exc)
            if said is None:
                raise
            return None, said
        if changes:
            plan_stash.clear()
        return result, None

    # -- login / logout ---------------------------------------------------------------------

    app.mount(STATIC, StaticFiles(directory=HERE / "static"), name="console-static")

    @app.get("/login", include_in_schema=False)
    async def login_page(request: Request, next: str = "/") -> Response:
        target = safe_next(next)
        if await run_in_threadpool(from_session, request) is not None:
            return RedirectResponse(target, status_code=303)
        try:
            who = await run_in_threadpool(proxy_login, request)
        except ServiceError as exc:
            return login_form(request, target, exc.message, exc.status)
        if who is not None:  # the trusted authenticating proxy says who it is
            response = RedirectResponse(target, status_code=303)
            set_session(response, request, who, None)
            return response
        return login_form(request, target)

    def login_form(request: Request, target: str, error: str | None = None,
                   status: int = 200) -> HTMLResponse:
        nonce = sessions.login_nonce()
        response = render("login.html", request, None, None, status=status, next=target,
                        error=error, login_csrf=nonce)
        response.set_cookie(LOGIN_CSRF, nonce, max_age=3600, path="/login", httponly=True,
                            samesite="strict", secure=secure(request))
        return response

    @app.post("/login", include_in_schema=False)
    async def login(request: Request) -> Response:
        fields = await form(request)
        target = safe_next(fields.get("next"))
        cookie_nonce = request.cookies.get(LOGIN_CSRF)
        if (not sessions.login_nonce_ok(cookie_nonce)
                or not secrets.compare_digest(cookie_nonce or "", fields.get("csrf", ""))):
            return login_form(request, target, "The login form expired (its CSRF token is "
                                               "missing or wrong); try again.", 403)
        token = fields.get("token", "").strip()
        if not token:
            return login_form(request, target, "Paste your idlegpu token.", 401)
        address = request.client.host if request.client else None
        try:
            who = await run_in_threadpool(authenticator.authenticate,
                                          {"authorization": f"Bearer {token}"}, address, now())
        except ServiceError as exc:
            return login_form(request, target, exc.message, exc.status)
        response = RedirectResponse(target, status_code=303)
        set_session(response, request, who, token if who.auth == "token" else None)
        response.delete_cookie(LOGIN_CSRF, path="/login")
        log.info("console login: %s (%s, team %s, %s)", who.user, who.auth, who.team, who.role)
        return response

    @app.post("/logout", include_in_schema=False)
    async def logout(request: Request) -> Response:
        got = await signed_in(request, post=True)
        if isinstance(got, Response):
            return got
        session, _, _ = got
        sessions.end(session)
        response = RedirectResponse("/login", status_code=303)
        response.delete_cookie(COOKIE, path="/")
        return response

    # -- pool -------------------------------------------------------------------------------

    def history_frame(at: datetime) -> pd.DataFrame | None:
        forecasts = reads.forecasts
        start = at - timedelta(hours=48)
        frame = forecasts.frame
        if frame is None:
            try:
                if forecasts.fetch is not None:
                    frame = forecasts.fetch(start, at)
                else:
                    from idlegpu.forecast.sources.prometheus import fetch_history

                    frame = fetch_history(settings, start, at)
            except Exception as exc:  # noqa: BLE001 - the chart shows no history then
                log.warning("console: the pool's history could not be read: %s", exc)
                return None
        ds = frame["ds"]
        return frame[(ds >= pd.Timestamp(start)) & (ds <= pd.Timestamp(at))]

    def pool_history(at: datetime) -> dict[str, Any]:
        from idlegpu.forecast.capacity import FREE, pool_usage

        key = pd.Timestamp(at).floor("min")
        frame = history_stash.get(key, lambda: history_frame(at))
        if frame is None or frame.empty:
            return {"times": [], "free": [], "services": {}, "newest": None}
        usage = pool_usage(frame, settings)
        times = [int(t.value // 1_000_000) for t in usage.index]

        def values(series: pd.Series) -> list[float | None]:
            return [None if pd.isna(v) else round(float(v), 2) for v in series]

        services = {}
        for service in settings.services:
            cap = service.max_replicas * service.gpus_per_replica
            services[service.name] = {"held": values(usage[service.name]),
                                      "free": values((cap - usage[service.name]).clip(lower=0))}
        known = usage[FREE].dropna()
        return {"times": times, "free": values(usage[FREE]), "services": services,
                "newest": known.index[-1] if len(known) else None}

    def pool_json() -> dict[str, Any]:
        at = now().replace(microsecond=0)
        history = pool_history(at)
        newest = history.pop("newest")
        out: dict[str, Any] = {
            "now": int(pd.Timestamp(at).value // 1_000_000), "now_text": local(at),
            "timezone": settings.pool.timezone, "zone": zone_label,
            "zone_abbr": pd.Timestamp(at).tz_convert(tz).strftime("%Z"),
            "lendable_gpus": settings.pool.lendable_gpus,
            "confidence": settings.admission.confidence, "history": history,
            "signals_at": local(newest, seconds=True) if newest is not None else None,
            "signals_age_s": None if newest is None else round(
                (pd.Timestamp(at) - newest).total_seconds(), 1)}
        out["signals_stale"] = out["signals_age_s"] is None or out[
            "signals_age_s"] > SIGNALS_STALE_S
        try:
            forecast = reads.forecast_json(24.0)
            plan = plan_json()
        except Exception as exc:  # noqa: BLE001 - ForecastUnavailable and the like: say so
            out.update(forecast=None, windows=[], jobs=[], forecast_error=str(exc),
                       forecast_made_at=None, forecast_age_s=None, forecast_stale=True,
                       waiting=0, starting=0)
            return out
        ms = lambda t: int(pd.Timestamp(t).value // 1_000_000)
        out["forecast"] = {"times": [ms(t) for t in forecast["free"]["times"]],
                           "band": forecast["free"]["gpus"],
                           "median": forecast["free"]["median_gpus"]}
        out["forecast_made_at"] = local(forecast["made_at"], seconds=True)
        out["forecast_age_s"] = forecast["forecast_age_s"]
        out["forecast_stale"] = forecast["forecast_age_s"] > FORECAST_STALE_S
        out["windows"] = [{"start": ms(w["start"]), "end": ms(w["end"]), "gpus": w["gpus"],
                           "text": f"{w['gpus']} GPUs {local(w['start'])} – {local(w['end'])}"}
                          for w in plan["windows"]]
        jobs = [u for u in plan["units"] if u["state"] in ("planned", "running")]
        jobs.sort(key=lambda u: u["start_at"] or "")
        out["jobs"] = [{"id": u["id"], "team": u["team"], "gpus": u["gpus"],
                        "state": u["state"], "start": ms(u["start_at"]), "end": ms(u["end_at"]),
                        "stops": u["stop_by"] is not None,
                        "text": f"{u['id']} ({u['team']}, {u['gpus']} GPUs) "
                                f"{local(u['start_at'])} – {local(u['end_at'])}"
                                + (" · checkpoints and stops" if u["stop_by"] else "")}
                       for u in jobs]
        out["starting"], out["waiting"] = plan["starting"], plan["waiting"]
        return out

    @app.get("/", include_in_schema=False)
    async def pool_page(request: Request) -> Response:
        got = await signed_in(request)
        if isinstance(got, Response):
            return got
        session, who, _ = got
        return render("pool.html", request, who, session)

    @app.get("/console/pool.json", include_in_schema=False)
    async def pool_data(request: Request) -> Response:
        found = await run_in_threadpool(from_session, request)
        if found is None:
            return JSONResponse({"error": {"message": "not logged in", "field": None}},
                                status_code=401)
        return JSONResponse(await run_in_threadpool(pool_json),
                            headers={"Cache-Control": "no-store"})

    # -- queue ------------------------------------------------------------------------------

    def queue_rows(who: Identity, scope: str) -> tuple[list[dict[str, Any]], dict[str, Any]]:
        from idlegpu.scheduler.types import JobState

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
                          units=units[first:first + PAGE_ROWS], scope=scope, sort=sort, q=q,
                          state=state, states=states, meta=meta, total=total,
                          first=first + 1 if total else 0,
                          last=min(total, first + PAGE_ROWS), page=number, pages=pages,
                          prev=link(number - 1) if number > 1 else None,
                          next=link(number + 1) if number < pages else None)
        response.headers["Server-Timing"] = f"queue;dur={(time.perf_counter() - started) * 1000:.1f}"
        return response

    # -- detail -------------------------------------------------------------------------------

    def unit_detail(unit_id: str) -> dict[str, Any]:
        from idlegpu.scheduler.types import EventKind

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
        from idlegpu.scheduler.adapters.store import UnknownJobError

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
        from idlegpu.scheduler.adapters.store import UnknownJobError

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

    # -- submit -------------------------------------------------------------------------------

    @app.get("/submit", include_in_schema=False)
    async def submit_page(request: Request, example: str = "") -> Response:
        got = await signed_in(request)
        if isinstance(got, Response):
            return got
        session, who, _ = got
        if not who.may_change():
            return render("error.html", request, who, session, status=403,
                        message=f"role {who.role} may not submit requests: viewers read only")
        text = examples.get(example, "")
        return render("submit.html", request, who, session, examples=sorted(examples),
                    example=example, text=text, error=None, preview=None, **submit_page_data())

    @app.get("/console/examples/{name}", include_in_schema=False)
    async def example_text(name: str, request: Request) -> Response:
        if await run_in_threadpool(from_session, request) is None:
            return Response("not logged in", status_code=401)
        if name not in examples:
            return Response("no such example", status_code=404)
        return Response(examples[name], media_type="text/plain; charset=utf-8")

    @app.post("/submit", include_in_schema=False)
    async def submit(request: Request) -> Response:
        got = await signed_in(request, post=True)
        if isinstance(got, Response):
            return got
        session, who, fields = got
        text = fields.get("request", "")
        action = "validate" if fields.get("action") == "validate" else "submit"

        def work() -> Any:
            submissions.require_change(who, "submit requests")
            job = submissions.parse_body(submissions.YAML_TYPES[0], text.encode("utf-8"),
                                         settings)
            if action == "validate":
                return submissions.validate(settings, who, job, reads.preview)
            return submissions.submit(store, settings, who, job, now())

        result, said = await act(work, changes=action == "submit")
        if action == "submit" and said is None:
            return RedirectResponse(f"/requests/{quote(result.request_id, safe='')}"
                                    "?notice=submitted", status_code=303)
        error = (None if said is None else
                 {"message": said.message, "field": said.field, **said.extra})
        return render("submit.html", request, who, session, status=200 if error is None else 422,
                    examples=sorted(examples), example="", text=text, error=error,
                    preview=None if error else result, **submit_page_data())

    def submit_page_data() -> dict[str, Any]:
        """What submit.js needs: the upload's bound (the API's body limit) and the zone's
        abbreviation per UTC offset over the next two days (to show a time as the server's
        ``local`` does, ``Thu 29 Jan 02:10 KST``)."""
        at = pd.Timestamp(now()).tz_convert(tz)
        zones = {}
        for hour in range(49):
            moment = at + pd.Timedelta(hours=hour)
            offset = moment.strftime("%z")
            zones[f"{offset[:3]}:{offset[3:]}"] = moment.strftime("%Z")
        return {"max_bytes": settings.api.max_body_bytes,
                "zones": json.dumps(zones, separators=(",", ":"))}

    app.state.console_pool_json = pool_json
    app.state.console_plan_cache = plan_stash

    from idlegpu.scheduler.console import operators, report_pages

    pages = Pages(app=app, settings=settings, store=store, reads=reads, now=now, env=env,
                  render=render, signed_in=signed_in, act=act,
                  from_session=from_session, local=local, hours=hours, headers=headers,
                  plan_json=plan_json, zone=zone_label)
    operators.add_pages(pages)
    report_pages.add_pages(pages)
