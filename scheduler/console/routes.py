"""The console's routes (see the package); ``add_console(app, ...)`` registers them."""

from __future__ import annotations

import logging
import secrets
import threading
import time
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, quote

import pandas as pd
from fastapi import FastAPI, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from jinja2 import Environment, PackageLoader, select_autoescape
from starlette.concurrency import run_in_threadpool
from starlette.staticfiles import StaticFiles

from idlegpu.scheduler.service.errors import ServiceError
from idlegpu.scheduler.service.identity import Authenticates, Identity, token_sha256
from idlegpu.scheduler.web.headers import CSP
from idlegpu.scheduler.console import (
    jobs_pages,
    operators,
    pool_pages,
    queue_pages,
    report_pages,
    submit_pages,
)
from idlegpu.scheduler.console.pages import PLAN_TTL_S, Pages
from idlegpu.scheduler.console.session import COOKIE, CSRF_HEADER, Session, Sessions
from idlegpu.scheduler.runtime import RuntimeEstimator
from idlegpu.scheduler.service.errors import Failure, failure

log = logging.getLogger("idlegpu.console")

HERE = Path(__file__).resolve().parent
STATIC = "/console/static"
LOGIN_CSRF = "idlegpu_login_csrf"
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
    env, local, hours, zone_label = _templates(settings, now)
    history_stash = _Stash(60.0)
    plan_stash = _Stash(PLAN_TTL_S)

    def plan_json() -> dict[str, Any]:
        """Tonight's plan over 24 h (``Reads.plan_json``), shared for ``PLAN_TTL_S``."""
        return plan_stash.get(pd.Timestamp(now()).floor("min"), lambda: reads.plan_json(24.0))

    estimator = RuntimeEstimator.from_config(None, settings.admission)
    doors = _Doors(settings, store, authenticator, sessions, now)
    app.state.console_caller = doors.console_caller

    def render(name: str, request: Request, who: Identity | None, session: Session | None,
             status: int = 200, **context: Any) -> HTMLResponse:
        html = env.get_template(name).render(
            who=who, csrf=session.csrf if session else "", static=STATIC, zone=zone_label,
            may_change=bool(who and who.may_change()), path=request.url.path, **context)
        return HTMLResponse(html, status_code=status, headers=_headers())

    async def signed_in(request: Request, *, post: bool = False):
        """``(session, identity, form)``, or a response: the login redirect, or a 403 for a
        POST without the session's CSRF token."""
        found = await run_in_threadpool(doors.from_session, request)
        if found is None:
            if post:
                return Response("not logged in", status_code=403, headers=_headers())
            return _to_login(request)
        session, who = found
        fields: dict[str, str] = {}
        if post:
            fields = await _form(request)
            if not sessions.csrf_ok(session, fields.get("csrf")):
                return HTMLResponse(env.get_template("error.html").render(
                    who=who, csrf=session.csrf, static=STATIC, zone=zone_label, path="",
                    may_change=who.may_change(), status=403,
                    message="This form's CSRF token is missing or wrong; reload the page "
                            "and try again."), status_code=403, headers=_headers())
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

    app.mount(STATIC, StaticFiles(directory=HERE / "static"), name="console-static")
    pages = Pages(app=app, settings=settings, store=store, reads=reads, now=now, env=env,
                  render=render, signed_in=signed_in, act=act,
                  from_session=doors.from_session, local=local, hours=hours, headers=_headers,
                  plan_json=plan_json, zone=zone_label, estimates=_estimates_of(estimator),
                  estimator=estimator, history_stash=history_stash, plan_stash=plan_stash,
                  examples=_examples())
    _add_login(pages, doors)
    app.state.console_plan_cache = plan_stash
    for group in (pool_pages, queue_pages, jobs_pages, submit_pages, operators,
                  report_pages):
        group.add_pages(pages)


def _templates(settings, now: Callable[[], datetime]
               ) -> tuple[Environment, Callable[..., str], Callable[[float | None], str], str]:
    """The pages' templates with their filters, the filters that show times (local to the
    pool) and durations, and the label of the pool's zone."""
    tz = settings.pool.tz
    env = Environment(loader=PackageLoader("idlegpu.scheduler.console", "templates"),
                      autoescape=select_autoescape(["html"]), trim_blocks=True,
                      lstrip_blocks=True)

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
    zone = pd.Timestamp(now()).tz_convert(tz).strftime("%Z, UTC%z")
    return env, local, hours, f"{settings.pool.timezone} ({zone})"


def _estimates_of(estimator: RuntimeEstimator) -> Callable[[], Callable[[Any], Any]]:
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

    return estimates


def _headers() -> dict[str, str]:
    return {"Content-Security-Policy": CSP, "X-Content-Type-Options": "nosniff",
            "Referrer-Policy": "same-origin", "Cache-Control": "no-store"}


async def _form(request: Request) -> dict[str, str]:
    body = await request.body()  # bounded by BoundedBodies (scheduler/web/bodies.py)
    fields = parse_qs(body.decode("utf-8", "replace"), keep_blank_values=True)
    return {k: v[0] for k, v in fields.items()}


def _safe_next(target: str | None) -> str:
    if not target or not target.startswith("/") or target.startswith("//") or "\\" in target:
        return "/"
    return target


def _to_login(request: Request) -> RedirectResponse:
    target = request.url.path + (f"?{request.url.query}" if request.url.query else "")
    return RedirectResponse(f"/login?next={quote(target, safe='')}", status_code=303)


class _Doors:
    """Who calls the console: a session cookie's identity, or the trusted authenticating
    proxy's; the sessions they get."""

    def __init__(self, settings, store, authenticator: Authenticates, sessions: Sessions,
                 now: Callable[[], datetime]) -> None:
        self.settings, self.store, self.authenticator = settings, store, authenticator
        self.sessions, self.now = sessions, now

    def secure(self, request: Request) -> bool:
        if request.url.scheme == "https":
            return True
        address = request.client.host if request.client else None
        return (self.authenticator.trusted_proxy(address)
                and request.headers.get("x-forwarded-proto", "").lower() == "https")

    def from_session(self, request: Request) -> tuple[Session, Identity] | None:
        session = self.sessions.read(request.cookies.get(COOKIE))
        if session is None:
            return None
        team, role = session.team, session.role
        if session.token_sha256:  # a token session: the token must still be good
            row = self.store.api_token_by_hash(session.token_sha256)
            if (row is None or row.revoked_at is not None
                    or (row.expires_at is not None and self.now() >= row.expires_at)):
                return None
            team, role = row.team, row.role
        address = request.client.host if request.client else None
        return session, Identity(user=session.user, auth=session.auth, team=team, role=role,
                                 groups=session.groups, address=address)

    def console_caller(self, request: Request) -> Identity | None:
        """For the /v1 routes: the identity of a console session cookie, when the call has
        no credentials of its own; a change without the session's X-CSRF-Token is refused."""
        if "authorization" in request.headers or COOKIE not in request.cookies:
            return None
        if self.settings.api.proxy.user_header.lower() in request.headers:
            return None
        found = self.from_session(request)
        if found is None:
            return None
        session, who = found
        if request.method not in ("GET", "HEAD", "OPTIONS") and not self.sessions.csrf_ok(
                session, request.headers.get(CSRF_HEADER)):
            raise ServiceError(403, "the console's CSRF token is missing or wrong (send the "
                                "session's token as X-CSRF-Token)")
        return who

    def set_session(self, response: Response, request: Request, who: Identity,
                    token: str | None) -> None:
        sessions = self.sessions
        _, cookie = sessions.issue(user=who.user, auth=who.auth, team=who.team, role=who.role,
                                   token_sha256=token_sha256(token) if token else None,
                                   groups=who.groups)
        response.set_cookie(COOKIE, cookie, max_age=int(sessions.hours * 3600), path="/",
                            httponly=True, samesite="strict", secure=self.secure(request))

    def proxy_login(self, request: Request) -> Identity | None:
        address = request.client.host if request.client else None
        header = self.settings.api.proxy.user_header.lower()
        if header not in request.headers or not self.authenticator.trusted_proxy(address):
            return None
        return self.authenticator.authenticate(request.headers, address, self.now())


def _add_login(pages: Pages, doors: _Doors) -> None:
    """``/login`` (the token form, or the trusted proxy's identity) and ``/logout``."""
    app, sessions, authenticator, now = pages.app, doors.sessions, doors.authenticator, pages.now

    @app.get("/login", include_in_schema=False)
    async def login_page(request: Request, next: str = "/") -> Response:
        target = _safe_next(next)
        if await run_in_threadpool(doors.from_session, request) is not None:
            return RedirectResponse(target, status_code=303)
        try:
            who = await run_in_threadpool(doors.proxy_login, request)
        except ServiceError as exc:
            return login_form(request, target, exc.message, exc.status)
        if who is not None:  # the trusted authenticating proxy says who it is
            response = RedirectResponse(target, status_code=303)
            doors.set_session(response, request, who, None)
            return response
        return login_form(request, target)

    def login_form(request: Request, target: str, error: str | None = None,
                   status: int = 200) -> HTMLResponse:
        nonce = sessions.login_nonce()
        response = pages.render("login.html", request, None, None, status=status, next=target,
                                error=error, login_csrf=nonce)
        response.set_cookie(LOGIN_CSRF, nonce, max_age=3600, path="/login", httponly=True,
                            samesite="strict", secure=doors.secure(request))
        return response

    @app.post("/login", include_in_schema=False)
    async def login(request: Request) -> Response:
        fields = await _form(request)
        target = _safe_next(fields.get("next"))
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
        doors.set_session(response, request, who, token if who.auth == "token" else None)
        response.delete_cookie(LOGIN_CSRF, path="/login")
        log.info("console login: %s (%s, team %s, %s)", who.user, who.auth, who.team, who.role)
        return response

    @app.post("/logout", include_in_schema=False)
    async def logout(request: Request) -> Response:
        got = await pages.signed_in(request, post=True)
        if isinstance(got, Response):
            return got
        session, _, _ = got
        sessions.end(session)
        response = RedirectResponse("/login", status_code=303)
        response.delete_cookie(COOKIE, path="/")
        return response
