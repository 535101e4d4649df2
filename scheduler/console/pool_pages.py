"""The console's pool page (``/``): tonight's free GPUs, the last two days and the forecast, and
its data (``/console/pool.json``)."""

from __future__ import annotations

import logging
from datetime import datetime, timedelta
from typing import Any

import pandas as pd
from fastapi import Request
from fastapi.responses import JSONResponse, Response
from starlette.concurrency import run_in_threadpool

from idlegpu.forecast.capacity import FREE, pool_usage
from idlegpu.forecast.sources.prometheus import fetch_history
from idlegpu.scheduler.console.pages import FORECAST_STALE_S, SIGNALS_STALE_S, Pages

log = logging.getLogger("idlegpu.console")


def add_pages(pages: Pages) -> None:
    app = pages.app
    settings = pages.settings
    reads = pages.reads
    now = pages.now
    tz = pages.settings.pool.tz
    render = pages.render
    signed_in = pages.signed_in
    local = pages.local
    plan_json = pages.plan_json
    from_session = pages.from_session
    zone_label = pages.zone
    history_stash = pages.history_stash

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

                    frame = fetch_history(settings, start, at)
            except Exception as exc:  # noqa: BLE001 - the chart shows no history then
                log.warning("console: the pool's history could not be read: %s", exc)
                return None
        ds = frame["ds"]
        return frame[(ds >= pd.Timestamp(start)) & (ds <= pd.Timestamp(at))]

    def pool_history(at: datetime) -> dict[str, Any]:

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

    app.state.console_pool_json = pool_json
