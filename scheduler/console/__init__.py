"""The web console, served by ``idlegpu serve`` at ``/`` on the job API's app.

Server-rendered pages (Jinja2) over what the API computes: tonight's pool (``/``), the queue
with each unit's estimated start and why it waits (``/queue``), a unit or request in detail
(``/units/{id}``, ``/requests/{id}``) and a submit page (``/submit``). Same identities as the
API (an idlegpu token typed at ``/login``, or the trusted authenticating proxy's headers), kept
in a signed session cookie (``idlegpu.scheduler.console.session``). Forms that change anything are
handed to the ``/v1`` routes in-process, so the console applies exactly the API's rules (who
may cancel, admission, team priority caps, audit). Every asset (CSS, the plain-JS SVG chart) is
served from ``/console/static``; the pages' Content-Security-Policy allows nothing else.
"""

from __future__ import annotations

from idlegpu.scheduler.console.routes import add_console

__all__ = ["add_console"]
