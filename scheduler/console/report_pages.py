"""The reports' pages (``/reports``): the monthly reports and the forecast's accuracy.

``/reports`` lists the months with a report under ``daemon.reports_dir`` (``Reads.reports``)
and sums up the forecast's accuracy over the last evenings; ``/reports/{month}`` shows one
report as ``idlegpu report`` wrote it: its headline figures from its ``summary.csv``, then its
Markdown read back block by block (headings, tables, notes, charts), so every number on the
page is the report's own text, autoescaped like everything else (the report's HTML is never
embedded). Its files (the charts, the Markdown, HTML and CSVs) are served by
``/reports/{month}/files/{name}``, only by a name its directory lists (``Reads.report_path``).

``/reports/accuracy?days=N`` (28 by default) is the daemon's nightly refresh replayed on the
last N evenings whose next 24 hours are over (``idlegpu.scheduler.reports.forecast_check_days``, the
machinery of the monthly report's forecast check) on the server's history (``Forecasts``: the
replayed file, or Prometheus): per service and pooled, the coverage of the promised quantile
against the configured confidence, the idle windows' precision and recall, and each evening's
coverage per service. A refit per evening takes seconds, so it is computed off the request
threads, one window at a time, and kept until the next evening is over; until then the page
says how far it got and reloads itself.
"""

from __future__ import annotations

import html
import logging
import math
import os
import re
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import date, datetime, timedelta
from pathlib import Path
from typing import Any

import pandas as pd
from fastapi import Request
from fastapi.responses import FileResponse, Response
from starlette.concurrency import run_in_threadpool

from idlegpu.forecast.calendar import local_hour
from idlegpu.forecast.errors import IdlegpuError, TemporaryError
from idlegpu.forecast.sources.prometheus import fetch_history
from idlegpu.scheduler.console.pages import Pages
from idlegpu.scheduler.daemon import ForecastProvider
from idlegpu.scheduler.reports import (
    forecast_check_days,
    format_change,
    format_gpus,
    format_hours,
    format_money,
    format_share,
)
from idlegpu.scheduler.service.errors import ServiceError

log = logging.getLogger("idlegpu.console")

ACCURACY_DAYS = 28
"""The evenings the accuracy is computed over by default (the last four weeks)."""
RELOAD_S = 5
"""While the accuracy is being computed its pages reload themselves this often."""
RETRY_S = 60.0
"""An accuracy that failed for a passing reason (Prometheus down) is tried again after this;
one that cannot be made (a history too short) is kept for the day like a result."""
MEDIA = {".png": "image/png", ".md": "text/markdown; charset=utf-8",
         ".html": "text/html; charset=utf-8", ".csv": "text/csv; charset=utf-8"}
INLINE = frozenset({".png"})
"""Shown in the page (the charts); every other file of a report is a download."""


# --------------------------------------------------------------------------- the report


def unescape(text: str) -> str:
    """Markdown text as ``idlegpu.scheduler.reports.markdown_text`` escaped it, read back
    literally."""
    out, i = [], 0
    while i < len(text):
        if text[i] == "\\" and i + 1 < len(text):
            out.append(text[i + 1])
            i += 2
        else:
            out.append(text[i])
            i += 1
    return html.unescape("".join(out))


def table_cells(line: str) -> list[str]:
    """The cells of a Markdown table row (``| a | b\\|c |``), unescaped."""
    cells, cell, i = [], [], 0
    body = line.strip()
    body = body.removeprefix("|")
    while i < len(body):
        char = body[i]
        if char == "\\" and i + 1 < len(body):
            cell.append(body[i:i + 2])
            i += 2
            continue
        if char == "|":
            cells.append("".join(cell))
            cell = []
        else:
            cell.append(char)
        i += 1
    if "".join(cell).strip():
        cells.append("".join(cell))
    return [unescape(c.strip()) for c in cells]


def bold_parts(line: str) -> list[tuple[str, bool]]:
    """A list line of the report (bold marked ``**``) as ``(text, bold)`` parts."""
    return [(part, k % 2 == 1) for k, part in enumerate(line.split("**")) if part]


HEADING = re.compile(r"^(#{1,6}) (.*)$")
IMAGE = re.compile(r"^!\[(.*)\]\(([^()\s]+)\)$")


def report_blocks(text: str) -> list[dict[str, Any]]:
    """The blocks of a report's Markdown (``idlegpu.scheduler.reports.render_markdown``) in order:
    ``heading`` (level, text), ``list`` (lines of ``bold_parts``), ``table`` (caption: the
    heading above it, shown unless the table is right under it; head, rows), ``text``,
    ``code`` and ``chart`` (title, file: a ``### title`` and its image)."""
    blocks: list[dict[str, Any]] = []
    lines = text.splitlines()
    caption = ""
    i = 0
    while i < len(lines):
        line = lines[i]
        if not line.strip():
            i += 1
        elif line.startswith("```"):
            end = i + 1
            while end < len(lines) and not lines[end].startswith("```"):
                end += 1
            blocks.append({"kind": "code", "text": "\n".join(lines[i + 1:end])})
            i = end + 1
        elif heading := HEADING.match(line):
            level, words = heading.groups()
            caption = unescape(words)
            blocks.append({"kind": "heading", "level": len(level), "text": caption})
            i += 1
        elif line.startswith("- "):
            items = []
            while i < len(lines) and lines[i].startswith("- "):
                items.append(bold_parts(lines[i][2:]))
                i += 1
            blocks.append({"kind": "list", "lines": items})
        elif line.startswith("|"):
            rows = []
            while i < len(lines) and lines[i].startswith("|"):
                rows.append(table_cells(lines[i]))
                i += 1
            body = [r for r in rows[1:] if not all(set(c) <= set("-:") for c in r)]
            under = bool(blocks) and blocks[-1]["kind"] == "heading"  # the heading says it
            blocks.append({"kind": "table", "caption": caption, "head": rows[0], "rows": body,
                           "caption_shown": not under})
        elif image := IMAGE.match(line):
            title, name = image.groups()
            title = unescape(title)
            if blocks and blocks[-1]["kind"] == "heading" and blocks[-1]["text"] == title:
                blocks.pop()
            blocks.append({"kind": "chart", "title": title, "file": Path(name).name})
            i += 1
        else:
            words = []
            while i < len(lines) and lines[i].strip() and not (
                    HEADING.match(lines[i]) or lines[i].startswith(("- ", "|", "```"))
                    or IMAGE.match(lines[i])):
                words.append(lines[i])
                i += 1
            blocks.append({"kind": "text", "text": unescape(" ".join(words))})
    return blocks


def headline(summary: Path, month: str) -> list[dict[str, str]]:
    """The month's figures from the report's ``summary.csv``, written as the report writes
    them (``idlegpu.scheduler.reports`` format_*); empty without the file or the month in it."""
    if not summary.is_file():
        return []
    frame = pd.read_csv(summary, dtype={"month": str})
    rows = frame[frame["month"] == month]
    if rows.empty:
        return []
    r = rows.iloc[-1]
    cur = str(r["currency"]).lstrip("'")
    figures = [
        ("useful_gpu_hours", "useful GPU-hours", format_hours(float(r["useful_gpu_hours"]))),
        ("gpus_12h", "GPUs, lent 12 h a day", format_gpus(float(r["gpus_12h"]))),
        ("gpus_24h", "GPUs, around the clock", format_gpus(float(r["gpus_24h"]))),
        ("savings", "savings", format_money(float(r["savings"]), cur)),
        ("cumulative_savings", "cumulative savings", format_money(
            float(r["cumulative_savings"]), cur)),
        ("mom_change", "vs the month before", format_change(float(r["mom_change"]))),
        ("jobs_run", "jobs run", f"{int(r['jobs_run']):,}"),
        ("jobs_finished", "jobs finished", f"{int(r['jobs_finished']):,}"),
        ("lost_gpu_hours", "GPU-hours lost", format_hours(float(r["lost_gpu_hours"]))),
        ("preemptions", "preemptions", f"{int(r['preemptions']):,}"),
    ]
    if math.isfinite(float(r["idle_share_used"])):
        figures.append(("idle_share_used", "of the idle GPU-hours used",
                        format_share(float(r["idle_share_used"]))))
    return [{"field": f, "label": label, "value": value} for f, label, value in figures]


def make_hint(reads: Any, month: str) -> str:
    out = reads.reports_dir / month
    return (f"idlegpu report --month {month} --months 3 --store <store URL> "
            f"--history <pool history> --out {out}")


# --------------------------------------------------------------------------- accuracy


@dataclass
class Accuracy:
    """The accuracy over the evenings ``first`` to ``last``: progress, then the check (a
    ``idlegpu.scheduler.reports.ForecastCheck``) or why there is none."""

    first: date
    last: date
    days: int
    done: int = 0
    total: int = 0
    check: Any = None
    error: str | None = None
    queued_at: float = field(default_factory=time.monotonic)
    seconds: float | None = None
    finished_at: datetime | None = None
    retry_at: float | None = None
    """When a passing failure may be tried again (``time.monotonic``)."""

    @property
    def ready(self) -> bool:
        return self.check is not None or self.error is not None


class AccuracyChecks:
    """The forecast's accuracy over the last evenings, by window length: computed by one
    worker thread (one window at a time, at a lower CPU priority than the requests) and kept
    until the next evening's 24 hours are over; ``get(days)`` never waits for it."""

    def __init__(self, settings: Any, history: Callable[[datetime, datetime], pd.DataFrame],
                 now: Callable[[], datetime]) -> None:
        self.settings = settings
        self.history = history
        self.now = now
        self.lock = threading.Lock()
        self.results: dict[tuple[date, int], Accuracy] = {}
        self.waiting: deque[tuple[date, int]] = deque()
        self.worker: threading.Thread | None = None

    def window(self, days: int, now: datetime) -> tuple[date, date]:
        """The last ``days`` local evenings whose forecast's next 24 hours are over."""
        tz = self.settings.pool.timezone
        hour = self.settings.daemon.forecast_refresh_hour
        at = pd.Timestamp(now).tz_convert(tz)
        last = at.date()
        while local_hour(last, hour, tz) + timedelta(hours=24) > at:
            last -= timedelta(days=1)
        return last - timedelta(days=days - 1), last

    def get(self, days: int) -> Accuracy:
        first, last = self.window(days, self.now())
        key = (last, days)
        with self.lock:
            for old in [k for k in self.results if k[0] != last]:  # an evening later: anew
                del self.results[old]
            state = self.results.get(key)
            if state is None or (state.retry_at is not None
                                 and time.monotonic() >= state.retry_at):
                state = self.results[key] = Accuracy(first, last, days)
                self.waiting.append(key)
            if self.worker is None and self.waiting:
                self.worker = threading.Thread(target=self._work, daemon=True,
                                               name="idlegpu-accuracy")
                self.worker.start()
            return state

    def ahead(self, state: Accuracy) -> int:
        """How many windows are computed before this one."""
        with self.lock:
            keys = list(self.waiting)
            key = (state.last, state.days)
            return keys.index(key) if key in keys else 0

    def _work(self) -> None:
        try:  # a refit per evening: the requests' threads come first
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 10)
        except (AttributeError, OSError):  # pragma: no cover - not Linux
            pass
        while True:
            with self.lock:
                if not self.waiting:
                    self.worker = None  # the next get() starts another
                    return
                key = self.waiting[0]
                state = self.results.get(key)
            if state is not None:
                self._compute(state)
            with self.lock:
                if self.waiting and self.waiting[0] == key:
                    self.waiting.popleft()

    def _compute(self, state: Accuracy) -> None:
        started = time.monotonic()
        now = self.now()

        def step(done: int, total: int) -> None:
            state.total, state.done = total, done

        try:
            tz = self.settings.pool.timezone
            hour = self.settings.daemon.forecast_refresh_hour
            first_at = local_hour(state.first, hour, tz)
            frame = self.history(first_at - ForecastProvider.HISTORY, now)
            state.check = forecast_check_days(frame, self.settings, state.first, state.last,
                                              on_step=step)
        except IdlegpuError as exc:
            state.error = str(exc)
            if isinstance(exc, TemporaryError):
                state.retry_at = time.monotonic() + RETRY_S
        except Exception as exc:  # the page says why, the log has the trace
            log.exception("console: the forecast's accuracy could not be computed")
            state.error = f"the forecast's accuracy could not be computed: {exc}"
            state.retry_at = time.monotonic() + RETRY_S
        state.seconds = time.monotonic() - started
        state.finished_at = now


def history_of(reads: Any, settings: Any) -> Callable[[datetime, datetime], pd.DataFrame]:
    """The pool's history from ``start`` to ``end`` as the server's ``Forecasts`` reads it: its
    recorded history (up to ``end``: a replay never looks past the server's clock), its
    ``fetch``, or Prometheus."""

    def history(start: datetime, end: datetime) -> pd.DataFrame:
        forecasts = reads.forecasts
        frame = forecasts.frame
        if frame is None:
            if forecasts.fetch is not None:
                frame = forecasts.fetch(start, end)
            else:
                frame = fetch_history(settings, start, end)
        return frame[frame["ds"] <= pd.Timestamp(end)]

    return history


def accuracy_view(state: Accuracy, settings: Any, local: Callable[..., str]) -> dict[str, Any]:
    """What the accuracy part of a page shows: the pooled and per-service figures, each
    evening's coverage per service (a table and an SVG chart), written as the report writes
    them (``format_share``)."""
    tz = settings.pool.timezone
    hour = settings.daemon.forecast_refresh_hour
    evening = lambda d: local(pd.Timestamp(local_hour(d, hour, tz)))
    view: dict[str, Any] = {"state": state, "first": evening(state.first),
                            "last": evening(state.last), "days": state.days,
                            "confidence": settings.admission.confidence}
    check = state.check
    if check is None:
        return view
    a = check.accuracy
    share = lambda v: format_share(float(v)) if v is not None else "n/a"
    view["pooled"] = {
        "evenings": f"{a['cutoffs']:.0f}", "coverage": share(a["coverage"]),
        "strict": share(a["strict_coverage"]), "target": share(check.confidence),
        "precision": share(a["precision"]), "recall": share(a["recall"]),
        "mae": f"{a['mae']:.3f}", "pinball": f"{a['pinball']:.3f}",
        "promised": format_hours(a["promised_gpu_hours"])}
    view["services"] = [{
        "service": r.service, "forecasts": r.forecasts, "coverage": share(r.coverage),
        "strict": share(r.strict_coverage), "verdict": r.verdict or "n/a",
        "pinball": "n/a" if not math.isfinite(r.pinball) else f"{r.pinball:.3f}",
        "mae": "n/a" if not math.isfinite(r.mae) else f"{r.mae:.3f}",
        "widened": f"{r.days_widened} of {r.evenings}", "served_by": r.served_by or "n/a",
        "skill": "n/a" if not math.isfinite(r.skill) else f"{r.skill:+.0%}"}
        for r in check.services.itertuples()]
    view["short"] = int(a["cutoffs"]) < state.days
    daily = check.daily
    services = list(check.services["service"])
    dates = list(dict.fromkeys(daily["date"]))
    table = []
    for d in dates:
        rows = daily[daily["date"] == d].set_index("service")
        cells = []
        for s in services:
            row = rows.loc[s] if s in rows.index else None
            scored = row is not None and row["points"] > 0
            cells.append({"text": share(row["coverage"]) if scored and row is not None
                          else "not scored",
                          "widened": bool(row is not None and row["widened"])})
        table.append({"date": pd.Timestamp(d).strftime("%a %d %b"), "cells": cells})
    view["daily"] = {"services": services, "rows": table,
                     "chart": daily_chart(daily, services, dates, check.confidence)}
    return view


def daily_chart(daily: pd.DataFrame, services: list[str], dates: list[str],
                target: float) -> dict[str, Any]:
    """Each evening's coverage per service as SVG coordinates (a polyline per service, the
    target line, the axes), drawn by the template: no script."""
    width, height = 900, 260
    left, right, top, bottom = 44, 28, 12, 34
    scored = daily[daily["points"] > 0]["coverage"]
    low = min(0.5, math.floor((float(scored.min()) if len(scored) else 0.5) * 10) / 10)
    n = max(1, len(dates) - 1)
    x = lambda k: left + (width - left - right) * (k / n if len(dates) > 1 else 0.5)
    y = lambda v: top + (height - top - bottom) * (1 - (v - low) / (1 - low))
    lines = []
    for k, service in enumerate(services):
        rows = daily[daily["service"] == service].set_index("date")
        points = []
        for i, d in enumerate(dates):
            if d in rows.index and rows.loc[d, "points"] > 0:
                points.append({"x": round(x(i), 1), "y": round(y(float(rows.loc[d, "coverage"])), 1),
                               "title": f"{service} {d}: {float(rows.loc[d, 'coverage']):.1%}"})
        lines.append({"service": service, "cls": f"s{k % 5}", "points": points,
                      "path": " ".join(f"{p['x']},{p['y']}" for p in points)})
    step = 0.1 if 1 - low <= 0.5 + 1e-9 else 0.2
    ticks = [{"y": round(y(1 - step * j), 1), "text": f"{1 - step * j:.0%}"}
             for j in range(round((1 - low) / step) + 1)]
    every = max(1, math.ceil(len(dates) / 10))
    labels = [{"x": round(x(i), 1), "text": pd.Timestamp(d).strftime("%d %b")}
              for i, d in enumerate(dates) if i % every == 0]
    return {"width": width, "height": height, "left": left, "right": width - right,
            "top": top, "bottom": height - bottom, "target": round(y(target), 1),
            "target_text": f"target {target:.0%}", "lines": lines, "ticks": ticks,
            "labels": labels}


# --------------------------------------------------------------------------- the routes


def add_pages(pages: Pages) -> None:
    """Registers the reports' routes on ``pages.app``."""
    checks = AccuracyChecks(pages.settings, history_of(pages.reads, pages.settings), pages.now)
    pages.app.state.console_accuracy = checks
    _add_overview(pages, checks)
    _add_months(pages)


def _days_of(text: str | None) -> int:
    if text is None or text == "":
        return ACCURACY_DAYS
    if not text.isdigit() or not 1 <= int(text) <= ACCURACY_DAYS:
        raise ServiceError(422, f"days: {text[:20]!r} is not a number of evenings; use a "
                            f"whole number from 1 to {ACCURACY_DAYS}", field="days")
    return int(text)


def _add_overview(pages: Pages, checks: AccuracyChecks) -> None:
    """``/reports`` (the months' reports and the forecast's accuracy) and
    ``/reports/accuracy``."""
    app, reads, settings = pages.app, pages.reads, pages.settings

    def accuracy(days: int) -> dict[str, Any]:
        state = checks.get(days)
        view = accuracy_view(state, settings, pages.local)
        view["ahead"] = 0 if state.ready else checks.ahead(state)
        view["finished_at"] = (pages.local(state.finished_at, seconds=True)
                               if state.finished_at else None)
        view["query"] = "" if days == ACCURACY_DAYS else f"?days={days}"
        return view

    def listing() -> list[dict[str, Any]]:
        months = []
        for entry in reads.reports()["reports"]:
            month = entry["month"]
            files = reads.report_files(month)
            figures = {f["field"]: f["value"] for f in headline(
                reads.reports_dir / month / "summary.csv", month)}
            months.append({
                "month": month, "written": (pages.local(entry["written_at"])
                                            if entry["written_at"] else "—"),
                "useful": figures.get("useful_gpu_hours", "—"),
                "savings": figures.get("savings", "—"),
                "downloads": [n for n in files if Path(n).suffix in MEDIA
                              and Path(n).suffix not in INLINE]})
        return months

    def refresh_head(view: dict[str, Any]) -> int | None:
        return None if view["state"].ready else RELOAD_S

    async def signed_in_for(request: Request, days: str | None):
        """``(session, identity, window)`` of a page with an accuracy window, or a response:
        the login redirect, or the page of a ``days`` that is not a window."""
        got = await pages.signed_in(request)
        if isinstance(got, Response):
            return got
        session, who, _ = got
        try:
            return session, who, _days_of(days)
        except ServiceError as exc:
            return pages.render("error.html", request, who, session, status=exc.status,
                                message=exc.message)

    @app.get("/reports", include_in_schema=False)
    async def reports_page(request: Request, days: str | None = None) -> Response:
        got = await signed_in_for(request, days)
        if isinstance(got, Response):
            return got
        session, who, window = got
        months = await run_in_threadpool(listing)
        view = accuracy(window)
        return pages.render("reports.html", request, who, session, months=months,
                            accuracy=view, reload=refresh_head(view),
                            reports_dir=str(reads.reports_dir))

    @app.get("/reports/accuracy", include_in_schema=False)
    async def accuracy_page(request: Request, days: str | None = None) -> Response:
        got = await signed_in_for(request, days)
        if isinstance(got, Response):
            return got
        session, who, window = got
        view = accuracy(window)
        return pages.render("reports_accuracy.html", request, who, session, accuracy=view,
                            reload=refresh_head(view))


def _add_months(pages: Pages) -> None:
    """A month's report (``/reports/{month}``) and its files (registered after
    ``/reports/accuracy``, which the month's path would take)."""
    app, reads, settings = pages.app, pages.reads, pages.settings

    def report(month: str) -> dict[str, Any]:
        files = reads.report_files(month)
        md = f"report-{month}.md"
        blocks = []
        if md in files:
            blocks = report_blocks(reads.report_path(month, md).read_text(encoding="utf-8"))
        title = next((b["text"] for b in blocks if b["kind"] == "heading"
                      and b["level"] == 1), f"Report {month}")
        blocks = [b for b in blocks if not (b["kind"] == "heading" and b["level"] == 1)]
        for b in blocks:
            if b["kind"] == "chart" and b["file"] not in files:
                b["missing"] = True
        written = None
        if md in files:
            stamp = reads.report_path(month, md).stat().st_mtime
            written = pages.local(datetime.fromtimestamp(stamp).astimezone(settings.pool.tz))
        return {"month": month, "files": files, "title": title, "blocks": blocks,
                "written": written,
                "figures": headline(reads.reports_dir / month / "summary.csv", month),
                "downloads": [n for n in files if Path(n).suffix in MEDIA
                              and Path(n).suffix not in INLINE],
                "hint": make_hint(reads, month), "folder": str(reads.reports_dir / month)}

    @app.get("/reports/{month}", include_in_schema=False)
    async def report_page(month: str, request: Request) -> Response:
        got = await pages.signed_in(request)
        if isinstance(got, Response):
            return got
        session, who, _ = got
        try:
            shown = await run_in_threadpool(report, month)
        except ServiceError as exc:
            return pages.render("error.html", request, who, session, status=exc.status,
                                message=exc.message)
        status = 200 if shown["files"] else 404
        return pages.render("reports_month.html", request, who, session, status=status,
                            **shown)

    @app.get("/reports/{month}/files/{name}", include_in_schema=False)
    async def report_file(month: str, name: str, request: Request) -> Response:
        got = await pages.signed_in(request)
        if isinstance(got, Response):
            return got
        try:
            path = await run_in_threadpool(reads.report_path, month, name)
        except ServiceError as exc:
            return Response(exc.message, status_code=exc.status, headers=pages.headers(),
                            media_type="text/plain; charset=utf-8")
        suffix = path.suffix.lower()
        if suffix not in MEDIA:
            return Response(f"{name} is not a file of a report (Markdown, HTML, CSV or PNG)",
                            status_code=404, headers=pages.headers(),
                            media_type="text/plain; charset=utf-8")
        headers = pages.headers()
        headers["Cache-Control"] = "private, max-age=300"
        return FileResponse(path, media_type=MEDIA[suffix], headers=headers,
                            filename=None if suffix in INLINE else path.name,
                            content_disposition_type="inline" if suffix in INLINE
                            else "attachment")
