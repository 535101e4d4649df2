"""``/docs`` (Swagger UI) and ``/redoc`` (ReDoc) served from this server's own copies of their
scripts (the ``fastapi-offline`` package ships them), never from a public CDN, under a policy
that allows scripts from this origin only; ``api.docs: false`` switches both off (the OpenAPI
document at ``/openapi.json`` stays). The pages start their viewers from a script file of ours:
no inline script, so no ``'unsafe-inline'`` for scripts. ReDoc and Swagger UI style their
elements at run time, hence ``style-src 'unsafe-inline'`` on these two pages only, and ReDoc
searches in a web worker it makes from a blob."""

from __future__ import annotations

from html import escape
from pathlib import Path

from fastapi import FastAPI
from fastapi.responses import HTMLResponse
from fastapi.staticfiles import StaticFiles

ASSETS = "/docs-static"
OWN = "/docs-static/own"
CSP = ("default-src 'none'; script-src 'self'; style-src 'self' 'unsafe-inline'; "
       "img-src 'self' data:; font-src 'self'; connect-src 'self'; worker-src blob:; "
       "frame-ancestors 'none'; base-uri 'none'; form-action 'none'")

_PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>{title}</title>
<meta name="viewport" content="width=device-width, initial-scale=1">
{css}<link rel="icon" href="{assets}/favicon.png"></head>
<body data-openapi="{openapi}"><div id="{root}"></div>
<script src="{assets}/{viewer}"></script><script src="{own}/{start}"></script></body></html>
"""


def add_docs(app: FastAPI, *, title: str, enabled: bool = True) -> None:
    """Register ``/docs`` and ``/redoc`` on ``app`` (built with ``docs_url=None,
    redoc_url=None``) with their assets; nothing when not ``enabled``."""
    if not enabled:
        return
    import fastapi_offline

    # resolved: the development install links this file from a tree of symlinks, and
    # StaticFiles serves only files whose real path lies inside its directory
    app.mount(ASSETS + "/own", StaticFiles(directory=Path(__file__).resolve().parent / "static"),
              name="docs-own")
    app.mount(ASSETS, StaticFiles(directory=Path(fastapi_offline.__file__).parent / "static"),
              name="docs-assets")
    openapi = escape(app.openapi_url or "/openapi.json")

    def page(viewer: str, start: str, root: str, css: str = "") -> HTMLResponse:
        html = _PAGE.format(title=escape(title), css=css, assets=ASSETS, own=OWN,
                            openapi=openapi, root=root, viewer=viewer, start=start)
        return HTMLResponse(html, headers={"Content-Security-Policy": CSP,
                                           "Cache-Control": "no-cache"})

    @app.get("/docs", include_in_schema=False)
    async def swagger() -> HTMLResponse:
        css = f'<link rel="stylesheet" href="{ASSETS}/swagger-ui.css">\n'
        return page("swagger-ui-bundle.js", "swagger-start.js", "swagger-ui", css)

    @app.get("/redoc", include_in_schema=False)
    async def redoc() -> HTMLResponse:
        return page("redoc.standalone.js", "redoc-start.js", "redoc")
