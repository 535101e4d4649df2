"""One bounded reader for every request body of ``idlegpu serve`` (the job API and the console).

An ASGI middleware in front of every route: the route's limit (``body_limit``) is applied while
the body is read, chunked or not, before anything parses it. A declared ``Content-Length`` over
the limit is answered 413 at once, without reading a byte; a body that grows past the limit as
it arrives stops the read there (the route's ``request.body()``, ``request.form()`` or
``request.stream()`` raises ``BodyTooLarge``, answered 413). Either way the answer says
``Connection: close`` and the server closes the connection, so the rest is never read. At most
the limit plus one chunk (uvicorn hands 64 KiB at a time) of a body is ever held.

Nothing is read before the route asks for it, so a route that authenticates first (every /v1
route: the caller is a dependency, resolved before the handler reads) reads no body of a caller
it refuses. Limits: the submit routes (``POST /v1/requests``, ``/v1/requests/validate`` and the
console's ``/submit``) take ``api.max_body_bytes``; every other route, a login form, a cancel or
pause reason, a CSRF token, ``SMALL_BODY_BYTES``.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from idlegpu.scheduler.service.errors import ServiceError

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

SMALL_BODY_BYTES = 16 * 1024
"""Every route but the submit routes: a login form with a long Kubernetes token (a few kB), a
cancel or pause reason (500 characters), a CSRF token."""

SUBMIT_ROUTES = frozenset({("POST", "/v1/requests"), ("POST", "/v1/requests/validate"),
                           ("POST", "/submit")})
CLOSE = {"Connection": "close"}


class BodyTooLarge(ServiceError):
    """A body past its route's limit (413; the connection is closed after the answer)."""

    def __init__(self, limit: int, setting: str, size: int | None = None) -> None:
        what = f"is {size} bytes" if size is not None else "is"
        super().__init__(413, f"the request body {what} over the server's limit of {limit} "
                              f"bytes ({setting})", headers=dict(CLOSE))
        self.limit = limit


def body_limit(method: str, path: str, max_body_bytes: int) -> tuple[int, str]:
    """The most a body of ``method path`` may hold, and what sets it."""
    if (method.upper(), path.rstrip("/") or "/") in SUBMIT_ROUTES:
        return max_body_bytes, "api.max_body_bytes"
    return min(SMALL_BODY_BYTES, max_body_bytes), "this route's limit"


class BoundedBodies:
    """The ASGI middleware (see the module docstring); ``max_body_bytes``: ``api``'s."""

    def __init__(self, app: ASGIApp, *, max_body_bytes: int) -> None:
        self.app = app
        self.max_body_bytes = max_body_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit, setting = body_limit(scope["method"], scope["path"], self.max_body_bytes)
        declared = _header(scope, b"content-length")
        if declared is not None:
            if not declared.isdigit() or len(declared) > 18:
                await _answer(send, 400, "Content-Length: not a byte count")
                return
            if int(declared) > limit:
                await _answer(send, 413, str(BodyTooLarge(limit, setting, int(declared))))
                return
        seen = 0

        async def bounded() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body") or b"")
                if seen > limit:
                    raise BodyTooLarge(limit, setting)
            return message

        await self.app(scope, bounded, send)


def _header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope.get("headers") or ():
        if key.lower() == name:
            return value.decode("latin-1").strip()
    return None


async def _answer(send: Send, status: int, message: str) -> None:
    body = json.dumps({"error": {"message": message, "field": None}}).encode()
    await send({"type": "http.response.start", "status": status, "headers": [
        (b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
        (b"connection", b"close")]})
    await send({"type": "http.response.body", "body": body})
