"""The job API's read routes on the forecast and the reports: tonight's plan (``GET
/v1/plan``), the idle windows (``/v1/windows``), the forecast as data (``/v1/forecast``), the
monthly reports (``/v1/reports``) and the plan of one unit (for ``GET /v1/units/{id}``).

The plan is ``idlegpu.scheduler.plan.tonight`` over the server's forecast (``Forecasts``, cached per
clock hour) and the store's queue: the same computation as ``idlegpu plan``. Every answer on
the forecast carries ``made_at`` (when the forecast was made, the server's clock) and
``forecast_age_s``; times are ISO 8601 with their offset, in the pool's time zone.
"""

import math
import re
import threading
import time
from collections.abc import Callable, Sequence
from datetime import datetime, timedelta
from pathlib import Path
from typing import Annotated, Any, cast

import pandas as pd
from fastapi import Depends, FastAPI, Query
from fastapi.responses import PlainTextResponse
from starlette.concurrency import run_in_threadpool

from idlegpu.forecast.capacity import FREE, forecast_pool_usage, idle_windows, windows_frame
from idlegpu.scheduler.adapters.store import StoreError, StoreUnavailableError
from idlegpu.scheduler.api.auth import ApiError, Identity
from idlegpu.scheduler.api.forecasts import Forecasts, ForecastUnavailable, ServerForecast
from idlegpu.scheduler.api.schema import Month
from idlegpu.scheduler.plan import store_queue, tonight
from idlegpu.scheduler.runtime import RuntimeEstimator
from idlegpu.scheduler.service.operations import paused_reason
from idlegpu.scheduler.types import JobState, WaitingJob

MONTH = re.compile(r"^[0-9]{4}-(0[1-9]|1[0-2])$")
REPORT_TYPES = {"md": ("report-{m}.md", "text/markdown; charset=utf-8"),
                "html": ("report-{m}.html", "text/html; charset=utf-8"),
                "csv": ("summary.csv", "text/csv; charset=utf-8")}
WAITS_FOR_STEP = "waits for its previous pipeline step"
PREVIEW_REUSE_S = 15.0
"""A request's previews (``POST /v1/requests/validate``, as it is typed) share the store's
queue read this long; the plan itself is made for each."""
MAX_HOURS = 48.0


def _num(value: Any) -> float | int | None:
    if value is None:
        return None
    value = float(value)
    if math.isnan(value):
        return None
    return int(value) if value.is_integer() else round(value, 3)


class Reads:
    """What the read routes compute, shared by them and ``GET /v1/units/{id}``."""

    def __init__(self, settings, store, now: Callable[[], datetime],
                 forecasts: Forecasts | None) -> None:
        self.settings = settings
        self.store = store
        self.now = now
        self._forecasts = forecasts
        self.tz = settings.pool.tz

        # the planner's estimates (idlegpu.scheduler.plan.planning_estimate), with their source
        self.estimator = RuntimeEstimator.from_config(None, settings.admission)
        self.estimate = lambda unit: self.estimator.estimate(unit).seconds
        self._queue_lock = threading.Lock()
        self._kept_queue: tuple[float, Any] | None = None

    @property
    def forecasts(self) -> Forecasts:
        if self._forecasts is None:  # the daemon's source: Prometheus through the config
            self._forecasts = Forecasts(self.settings)
        return self._forecasts

    def iso(self, when: datetime | pd.Timestamp | None) -> str | None:
        if when is None or (isinstance(when, float) and math.isnan(when)):
            return None
        return pd.Timestamp(when).tz_convert(self.tz).isoformat()

    def forecast(self, now: datetime) -> ServerForecast:
        return self.forecasts.get(now)

    def stamp(self, made: ServerForecast, now: datetime) -> dict[str, Any]:
        return {"now": self.iso(now), "made_at": self.iso(made.made_at),
                "forecast_age_s": round(made.age_s(now), 1),
                "history_until": self.iso(made.history_until),
                "confidence": self.settings.admission.confidence,
                "timezone": self.settings.pool.timezone,
                "widened": made.refresh.widened, "warnings": made.refresh.warnings()}

    def tonight(self, hours: float, extra: Sequence[Any] = (), *, reuse_s: float = 0.0):
        """``(now, forecast, plan)``: tonight's plan from the store's queue, and ``extra``
        units (``WaitingJob``) queued with it as if submitted now (a dry run: nothing is
        stored). ``reuse_s``: the store's queue read for an earlier call may serve for this
        long (the previews of a request typed on the console)."""

        now = self.now().replace(microsecond=0)  # a plan to the second
        made = self.forecast(now)
        queue, running, usage, blocked = self._queue(now, reuse_s)
        planned = tonight(self.settings, made.refresh, [*queue, *extra], running=running,
                          team_usage=usage, horizon=timedelta(hours=hours), start=now,
                          profile=made.profile, blocked=blocked)
        return now, made, planned

    def _queue(self, now: datetime, reuse_s: float):
        with self._queue_lock:
            kept = self._kept_queue
            if kept is not None and reuse_s > 0 and time.monotonic() - kept[0] < reuse_s:
                return kept[1]
            queue, running, usage = store_queue(self.store, self.settings, self.estimate, now)
            ready = {job.id for job in queue}
            blocked = [row for row in self.store.find_units(states=(JobState.QUEUED,))
                       if row.id not in ready and row.submitted_at <= now]
            self._kept_queue = (time.monotonic(), (queue, running, usage, blocked))
            return queue, running, usage, blocked

    def preview(self, units: Sequence[Any], team: str) -> dict[str, Any]:
        """What the plan says of a request's ``units`` (``UnitSpec``) were it submitted now,
        from the store's queue and tonight's plan (24 h) with them added (nothing is
        stored): per unit its runtime estimate (the planner's, with its source), its
        estimated start and stop, or the reason it would wait. Without a forecast, the
        estimates and why there is no plan."""

        now = self.now().replace(microsecond=0)
        estimates = [self.estimator.estimate(u) for u in units]
        ids = [f"(new) {u.step}#{u.member}" for u in units]
        extra = [WaitingJob(id=ids[k], team=team, gpus=u.gpus, runtime_s=estimates[k].seconds,
                            checkpointable=u.checkpointable, priority=u.priority,
                            submitted_at=now, deadline=u.deadline,
                            max_preemptions=u.max_preemptions, kind=u.kind,
                            min_gpus=u.min_gpus, gpus_step=u.gpus_step, nodes=u.nodes)
                 for k, u in enumerate(units) if u.step_index == 0]
        out: list[dict[str, Any]] = [
            {"id": ids[k], "runtime": {"seconds": round(e.seconds, 1), "source": e.source,
                                       "runs": e.n_runs, "note": e.note},
             "plan": {"state": "not planned", "start_at": None, "end_at": None,
                      "stop_by": None, "reason": None}}
            for k, e in enumerate(estimates)]

        try:
            _, made, planned = self.tonight(24.0, extra, reuse_s=PREVIEW_REUSE_S)
        except (ForecastUnavailable, StoreError, StoreUnavailableError) as exc:
            # the request is still checked: only its plan is missing, and why
            for unit in out:
                unit["plan"]["reason"] = f"no plan now: {exc}"
            return {"units": out, "made_at": None, "forecast_age_s": None}
        found = {u["id"]: u for u in self.plan_units(planned)}
        ends: dict[int, list[str | None]] = {}
        for k, unit in enumerate(units):
            if unit.step_index > 0:
                before = ends.get(unit.step_index - 1, [None])
                last = None if None in before else max(cast(list[str], before))
                out[k]["plan"].update(state="blocked", reason=WAITS_FOR_STEP + (
                    f" (planned to end by {pd.Timestamp(last).tz_convert(self.tz).strftime('%a %H:%M %Z')})"
                    if last else ""))
                ends.setdefault(unit.step_index, []).append(None)
                continue
            got = found[ids[k]]
            out[k]["plan"] = {key: got[key] for key in ("state", "start_at", "end_at",
                                                        "stop_by", "reason")}
            ends.setdefault(0, []).append(got["end_at"])
        return {"units": out, "made_at": self.iso(made.made_at),
                "forecast_age_s": round(made.age_s(now), 1)}

    def plan_units(self, planned) -> list[dict[str, Any]]:
        units = []
        # while an operator has paused admission the daemon starts nothing: every unit that
        # would start waits, with who paused it, since when and why
        paused = paused_reason(self.store.admission(), self.tz)
        for run in planned.plan.runs:
            if paused and run.reason != "already running":
                units.append({"id": run.job_id, "team": run.team, "kind": run.kind,
                              "gpus": run.gpus, "state": "waiting", "start_at": None,
                              "end_at": None, "stop_by": None, "outcome": None,
                              "reason": paused})
                continue
            units.append({
                "id": run.job_id, "team": run.team, "kind": run.kind, "gpus": run.gpus,
                "state": "running" if run.reason == "already running" else "planned",
                "start_at": self.iso(run.start), "end_at": self.iso(run.end),
                "stop_by": self.iso(run.end) if run.outcome == "checkpoints and stops"
                else None,
                "outcome": run.outcome, "reason": run.reason})
        for job, reason in planned.plan.waiting:
            units.append({"id": job.id, "team": job.team, "kind": job.kind, "gpus": job.gpus,
                          "state": "waiting", "start_at": None, "end_at": None,
                          "stop_by": None, "outcome": None, "reason": paused or reason})
        for row in planned.blocked:
            units.append({"id": row.id, "team": row.team, "kind": row.kind, "gpus": row.gpus,
                          "state": "blocked", "start_at": None, "end_at": None,
                          "stop_by": None, "outcome": None,
                          "reason": paused or WAITS_FOR_STEP})
        return units

    def windows_json(self, table: pd.DataFrame) -> list[dict[str, Any]]:
        return [{"start": self.iso(r.start), "end": self.iso(r.end), "gpus": int(r.gpus),
                 "hours": round(float(r.hours), 3), "gpu_hours": round(float(r.gpu_hours), 3),
                 "confidence": float(r.confidence), "open_end": bool(r.open_end)}
                for r in table.itertuples()]

    def plan_json(self, hours: float) -> dict[str, Any]:
        now, made, planned = self.tonight(hours)
        profile = made.profile
        end = now + timedelta(hours=hours)
        steps = []
        first = max(0, profile.index_at(now))
        for i in range(first, len(profile.free)):
            at = profile.time_at(i)
            if at >= end:
                break
            steps.append({"at": self.iso(at), "free_gpus": _num(profile.free[i])})
        units = self.plan_units(planned)
        return {**self.stamp(made, now), "start": self.iso(now), "hours": hours,
                "units": units,
                "starting": sum(1 for u in units if u["state"] == "planned"),
                "waiting": sum(1 for u in units if u["state"] in ("waiting", "blocked")),
                "profile": steps, "windows": self.windows_json(planned.windows)}

    def unit_plan(self, unit_id: str) -> dict[str, Any]:
        """``{start_at, stop_by, reason}`` of one unit in tonight's plan (24 h)."""
        try:
            now, made, planned = self.tonight(24.0)
        except ForecastUnavailable as exc:
            return {"start_at": None, "stop_by": None, "reason": f"no plan now: {exc}",
                    "made_at": None, "forecast_age_s": None}
        stamp = {"made_at": self.iso(made.made_at), "forecast_age_s": round(made.age_s(now), 1)}
        for unit in self.plan_units(planned):
            if unit["id"] == unit_id:
                return {"start_at": unit["start_at"], "stop_by": unit["stop_by"],
                        "reason": unit["reason"], **stamp}
        return {"start_at": None, "stop_by": None, "reason": "not in tonight's plan", **stamp}

    def free_window(self, made: ServerForecast, now: datetime, hours: float) -> pd.Series:
        free = made.refresh.free
        origin = pd.Timestamp(now).floor(f"{made.profile.step_s}s")
        return free[(free.index >= origin) & (free.index < pd.Timestamp(now)
                                               + pd.Timedelta(hours=hours))]

    def windows(self, hours: float, min_hours: float, granularity: int) -> dict[str, Any]:
        now = self.now().replace(microsecond=0)  # a plan to the second
        made = self.forecast(now)
        free = self.free_window(made, now, hours)
        found = (idle_windows(free, confidence=self.settings.admission.confidence,
                              granularity=granularity, min_hours=min_hours)
                 if len(free) >= 2 else [])
        return {**self.stamp(made, now), "hours": hours, "min_hours": min_hours,
                "granularity": granularity,
                "windows": self.windows_json(windows_frame(found, self.tz))}

    def forecast_json(self, hours: float) -> dict[str, Any]:
        now = self.now().replace(microsecond=0)  # a plan to the second
        made = self.forecast(now)
        refresh = made.refresh
        free = self.free_window(made, now, hours)
        median = forecast_pool_usage(refresh.forecast, self.settings, 0.5)[FREE]
        median = median.reindex(free.index)
        confidence = self.settings.admission.confidence
        widened = refresh.widened
        frame = refresh.forecast
        frame = frame[frame["ds"].isin(free.index)]
        services = {}
        for service in self.settings.services:
            rows = frame[frame["unique_id"] == f"{service.name}/replicas"].sort_values("ds")
            planned = widened.get(service.name, confidence)
            wanted = sorted({0.5, confidence, planned})
            services[service.name] = {
                "gpus_per_replica": service.gpus_per_replica,
                "planned_quantile": planned, "widened": service.name in widened,
                "times": [self.iso(t) for t in rows["ds"]],
                "replicas": {f"q{q:g}": [_num(v) for v in rows[f"q{q:g}"]] for q in wanted
                             if f"q{q:g}" in rows}}
        return {**self.stamp(made, now), "hours": hours, "step_s": made.profile.step_s,
                "services": services,
                "free": {"times": [self.iso(t) for t in free.index],
                         "gpus": [_num(v) for v in free],
                         "median_gpus": [_num(v) for v in median]}}

    # -- reports ------------------------------------------------------------------------

    @property
    def reports_dir(self) -> Path:
        return Path(self.settings.daemon.reports_dir)

    def reports(self) -> dict[str, Any]:
        root = self.reports_dir
        found = []
        if root.is_dir():
            for entry in sorted(root.iterdir(), reverse=True):
                if not (MONTH.fullmatch(entry.name) and entry.is_dir()):
                    continue
                formats = [f for f, (name, _) in REPORT_TYPES.items()
                           if (entry / name.format(m=entry.name)).is_file()]
                if formats:
                    md = entry / REPORT_TYPES["md"][0].format(m=entry.name)
                    written = (datetime.fromtimestamp(md.stat().st_mtime).astimezone(self.tz)
                               if md.is_file() else None)
                    found.append({"month": entry.name, "formats": formats,
                                  "written_at": written.isoformat() if written else None})
        return {"reports": found}

    def report_file(self, month: str, kind: str) -> tuple[Path, str]:
        check_month(month)
        name, media = REPORT_TYPES[kind]
        root = self.reports_dir.resolve()
        path = (root / month / name.format(m=month)).resolve()
        if not path.is_relative_to(root) or not path.is_file():
            raise ApiError(404, f"no {kind} report for {month}; GET /v1/reports lists them")
        return path, media

    def report_files(self, month: str) -> list[str]:
        """The names of the files of ``month``'s report directory (``reports_dir/YYYY-MM``:
        the report, its CSVs and charts), sorted; none when it has no directory."""
        check_month(month)
        folder = self.reports_dir / month
        if not folder.is_dir():
            return []
        return sorted(entry.name for entry in folder.iterdir() if entry.is_file())

    def report_path(self, month: str, name: str) -> Path:
        """One file of ``month``'s report directory, by a name ``report_files`` lists (so no
        other path: not ``../``, not a link out of the directory), or a 404."""
        root = self.reports_dir.resolve()
        path = (root / month / name).resolve() if name in self.report_files(month) else None
        if path is None or path.parent != root / month or not path.is_file():
            raise ApiError(404, f"no file {name[:80]!r} in the report of {month}; "
                                f"GET /v1/reports lists the reports")
        return path


def check_month(month: str) -> str:
    """``month`` if it is ``YYYY-MM``, else a 422 naming the field."""
    if not MONTH.fullmatch(month):
        raise ApiError(422, f"month: {month[:20]!r} is not a month; use YYYY-MM, e.g. "
                            "2026-01", field="month")
    return month


def add_read_routes(app: FastAPI, reads: Reads, caller: Callable[..., Identity],
                    prefix: str) -> None:
    Caller = Annotated[Identity, Depends(caller)]
    Hours = Annotated[float, Query(gt=0, le=MAX_HOURS, description="hours ahead (at most 48)")]

    @app.get(f"{prefix}/plan", summary="Tonight's plan: when each unit starts and stops, "
                                       "why the others wait, the free GPUs and the windows")
    async def get_plan(who: Caller, hours: Hours = 24.0) -> dict[str, Any]:
        return await run_in_threadpool(reads.plan_json, hours)

    @app.get(f"{prefix}/windows", summary="The idle windows: start, end, GPUs, confidence")
    async def get_windows(
        who: Caller, hours: Hours = 48.0,
        min_hours: Annotated[float, Query(gt=0, le=MAX_HOURS)] = 1.0,
        granularity: Annotated[int, Query(ge=1, le=10_000)] = 4,
    ) -> dict[str, Any]:
        return await run_in_threadpool(reads.windows, hours, min_hours, granularity)

    @app.get(f"{prefix}/forecast", summary="The forecast: replica quantiles per service and "
                                           "the pool's free GPUs per step")
    async def get_forecast(who: Caller, hours: Hours = 48.0) -> dict[str, Any]:
        return await run_in_threadpool(reads.forecast_json, hours)

    @app.get(f"{prefix}/reports", summary="The monthly reports (daemon.reports_dir)")
    def list_reports(who: Caller) -> dict[str, Any]:
        return reads.reports()

    @app.get(f"{prefix}/reports/{{month}}", summary="One monthly report: Markdown (default), "
                                                   "html or csv (summary.csv)",
             responses={200: {"content": {
                 "text/markdown": {"schema": {"type": "string"}},
                 "text/html": {"schema": {"type": "string"}},
                 "text/csv": {"schema": {"type": "string"}}}}})
    def get_report(month: Month, who: Caller,
                   format: Annotated[str, Query(pattern="^(md|html|csv)$")] = "md",
                   ) -> PlainTextResponse:
        path, media = reads.report_file(month, format)
        return PlainTextResponse(path.read_text(encoding="utf-8"), media_type=media)


__all__ = ["Reads", "add_read_routes", "paused_reason"]
