"""The console's submit page (``/submit``): a request typed or loaded from an example,
validated (a dry run) or submitted through ``service.submissions``."""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import quote

import pandas as pd
from fastapi import Request
from fastapi.responses import RedirectResponse, Response
from starlette.concurrency import run_in_threadpool

from idlegpu.scheduler.console.pages import Pages
from idlegpu.scheduler.service import submissions


def add_pages(pages: Pages) -> None:
    app = pages.app
    settings = pages.settings
    store = pages.store
    reads = pages.reads
    now = pages.now
    tz = pages.settings.pool.tz
    render = pages.render
    signed_in = pages.signed_in
    act = pages.act
    from_session = pages.from_session
    examples = pages.examples

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
