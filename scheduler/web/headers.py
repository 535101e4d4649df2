"""The headers every answer of ``idlegpu serve`` carries, set in one place (an ASGI middleware):
``X-Content-Type-Options: nosniff`` on every answer, and on every HTML answer a
Content-Security-Policy (the console's, unless the route set its own, e.g. the API docs'),
which also says ``frame-ancestors 'none'``, and ``Referrer-Policy: same-origin``. A route
that writes HTML (a report as HTML, an error page) cannot forget them."""

from __future__ import annotations

from idlegpu.scheduler.web.bodies import ASGIApp, Message, Receive, Scope, Send

CSP = ("default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
       "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'")
"""No inline script or style, nothing from another origin, never inside a frame."""


class SecurityHeaders:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers") or [])
                names = {key.lower() for key, _ in headers}
                extra = [(b"x-content-type-options", b"nosniff")]
                kind = next((v for k, v in headers if k.lower() == b"content-type"), b"")
                if kind.lower().startswith(b"text/html"):
                    extra += [(b"content-security-policy", CSP.encode()),
                              (b"referrer-policy", b"same-origin")]
                headers += [(k, v) for k, v in extra if k not in names]
                message = {**message, "headers": headers}
            await send(message)

        await self.app(scope, receive, with_headers)
