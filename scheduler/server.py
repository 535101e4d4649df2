"""``idlegpu serve``'s application: the job API (``/v1``, its OpenAPI document and docs) and
the web console side by side on one FastAPI app, under the same bounded bodies and security
headers (``idlegpu.scheduler.web``). Neither front door imports the other: both call
``idlegpu.scheduler.service``; this module only puts them together."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime

from fastapi import FastAPI

from idlegpu.scheduler.adapters.store import JobStore
from idlegpu.scheduler.api import add_api
from idlegpu.scheduler.api.answers import API_VERSION
from idlegpu.scheduler.api.auth import Reviewer
from idlegpu.scheduler.api.checkpoints import PodDirectory
from idlegpu.scheduler.api.docs import add_docs
from idlegpu.scheduler.api.forecasts import Forecasts
from idlegpu.scheduler.api.schema import ERROR_RESPONSES, install_openapi
from idlegpu.scheduler.clock import Clock
from idlegpu.scheduler.config import Settings
from idlegpu.scheduler.console import add_console
from idlegpu.scheduler.web.bodies import BoundedBodies
from idlegpu.scheduler.web.headers import SecurityHeaders


def create_server(settings: Settings, store: JobStore, *,
                  clock: Clock | Callable[[], datetime] | None = None,
                  reviewer: Reviewer | None = None,
                  forecasts: Forecasts | None = None,
                  pods: PodDirectory | None = None) -> FastAPI:
    """The job API and the console over ``store`` with ``settings``: ``clock`` stamps
    ``submitted_at`` and judges token expiry and sessions (default: the wall clock);
    ``reviewer`` answers Kubernetes TokenReviews (default, when ``api.token_review.enabled``:
    one built from ``api.token_review``); ``forecasts``: the forecast the plan, windows and
    forecast routes read (default: the daemon's, from Prometheus through the config, made at
    the first call that needs it); ``pods`` says which unit a research pod runs (default,
    with TokenReview on: the API server's pods)."""
    app = FastAPI(
        title="idlegpu job API", version=API_VERSION,
        description="Submit, list and cancel research jobs on the idle GPUs of the pool.",
        docs_url=None, redoc_url=None,  # our own pages and assets (scheduler/api/docs.py)
        responses=ERROR_RESPONSES,  # every error in the one shape (scheduler/api/schema.py)
    )
    install_openapi(app)
    add_docs(app, title="idlegpu job API", enabled=settings.api.docs)
    # every body, on every route, read under its route's limit (scheduler/web/bodies.py)
    app.add_middleware(BoundedBodies, max_body_bytes=settings.api.max_body_bytes)
    # nosniff everywhere, a CSP on every HTML answer (scheduler/web/headers.py)
    app.add_middleware(SecurityHeaders)
    api = add_api(app, settings, store, clock=clock, reviewer=reviewer, forecasts=forecasts,
                  pods=pods)
    add_console(app, settings, store, api.authenticator, api.reads, api.clock.now)
    return app
