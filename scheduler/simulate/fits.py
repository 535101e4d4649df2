"""The forecast policy's nightly refits, made ahead in worker processes, a group of services
each.

Almost all of a long simulation's time is its evening refits, and a refit of one service's
replicas reads nothing of the others' (``SeriesForecaster.fit`` fits each series on its own,
``predict`` forecasts each from its own state). So the refits the ``Refresher`` will ask for
(``fit_plan``: the backfill's evenings and every refresh, in order) are made per group of
services in separate processes (``fit_group``), each group with the same chained caches as
one process would keep, and the refresh then reads them back (``MadeForecasts``) instead of
fitting: the same frames, in the same order, so the same profiles as fitting in place.

What a refit cannot know ahead is its quantiles: a refresh plans a service that under-covered
at the wider quantile, which depends on the forecasts before it. Each refresh is forecast at
both sets of levels, with no service widened and with the wider quantile; the refresh takes
the one it asks for.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import pandas as pd

from idlegpu.forecast.models import CACHED_MODELS, model_for
from idlegpu.forecast.models.base import SeriesForecaster
from idlegpu.forecast.scenarios import forecast_levels
from idlegpu.forecast.schema import DS, UNIQUE_ID
from idlegpu.scheduler.config import Settings
from idlegpu.scheduler.refresh import Refresher
from idlegpu.scheduler.replay import _forecast_lag

BACKFILL, REFRESH = "backfill", "refresh"  # the chains of refits, each with a cache of its own


@dataclass(frozen=True)
class FitRequest:
    """One refit: on the replicas before ``moment`` (``rows`` of them), forecast ``horizon``
    ahead at each of ``levels`` (tuples of quantiles); ``chain``: which cache of growing
    prefixes it reuses."""

    chain: str
    moment: datetime
    horizon: pd.Timedelta
    levels: tuple[tuple[float, ...], ...]
    rows: int


def fit_plan(replicas: pd.DataFrame, settings: Settings, refresher: Refresher,
             moments: list[datetime]) -> list[FitRequest]:
    """The refits ``refresher`` makes refreshing at each of ``moments`` in turn: the
    backfill's evenings before the first (it has no promises yet), then each refresh."""
    confidence = settings.admission.confidence
    plain = tuple(forecast_levels(settings, confidence, []))
    wide = tuple(forecast_levels(settings, confidence, [refresher.widened]))
    plan = []

    def request(chain: str, moment: datetime, levels: tuple[tuple[float, ...], ...]
                ) -> FitRequest:
        past = replicas[replicas[DS] < pd.Timestamp(moment)]
        lag, _ = _forecast_lag(past, settings)
        return FitRequest(chain, moment, pd.Timedelta(refresher.horizon) + lag, levels,
                          len(past))

    if moments and not refresher.promises:
        for moment in refresher.backfill_moments(replicas, moments[0]):
            plan.append(request(BACKFILL, moment, (plain,)))
    for moment in moments:
        plan.append(request(REFRESH, moment, tuple(dict.fromkeys((plain, wide)))))
    return plan


def merged(plans: list[list[FitRequest]]) -> list[FitRequest]:
    """One plan of the refits of several (the forecast policy at several confidences: the
    same refits, forecast at each one's levels), in order."""
    out: dict[tuple[str, datetime, pd.Timedelta, int], tuple[tuple[float, ...], ...]] = {}
    for plan in plans:
        for request in plan:
            key = (request.chain, request.moment, request.horizon, request.rows)
            out[key] = tuple(dict.fromkeys((*out.get(key, ()), *request.levels)))
    return [FitRequest(chain, moment, horizon, levels, rows)
            for (chain, moment, horizon, rows), levels in out.items()]


Outcome = dict[tuple[float, ...], pd.DataFrame | None] | BaseException
"""One refit of one group: its forecast per set of levels (None: none of its series had a
sample yet), or the error the fit raised."""


def fit_group(replicas: pd.DataFrame, settings: Settings, model: str,
              plan: list[FitRequest],
              on_fit: Callable[[int, int], None] | None = None) -> list[Outcome]:
    """Every refit of ``plan``, in order, on ``replicas`` (one group's series): what each
    refit of all the series would give for these. ``on_fit(done, total)`` after each."""
    caches: dict[str, dict] = {BACKFILL: {}, REFRESH: {}}
    out: list[Outcome] = []
    for n, request in enumerate(plan):
        past = replicas[replicas[DS] < pd.Timestamp(request.moment)]
        if past.empty:
            out.append(dict.fromkeys(request.levels))
        else:
            options = {"cache": caches[request.chain]} if model in CACHED_MODELS else {}
            try:
                fitted = model_for(model, settings, **options).fit(past)
                out.append({levels: fitted.predict(request.horizon, list(levels))
                            for levels in request.levels})
            except Exception as error:  # noqa: BLE001 - raised where the refresh asks for it
                out.append(error)
        if on_fit is not None:
            on_fit(n + 1, len(plan))
    return out


class MadeForecasts:
    """The refits of ``plan`` made by groups of services (``fit_group``'s outcomes, the groups
    in ``unique_id`` order), read back as ``replay.MadeForecasts``: the forecast of all the
    groups at the moment and levels asked for. One not made ahead (a refresh the plan did not
    foresee, or on more or fewer replica samples than the plan's) is fitted here, from
    scratch."""

    def __init__(self, plan: list[FitRequest], outcomes: list[list[Outcome]], model: str,
                 settings: Settings):
        self.model = model
        self.settings = settings
        self.made: dict[tuple[datetime, pd.Timedelta, int], list[Outcome]] = {}
        for n, request in enumerate(plan):
            self.made[request.moment, request.horizon, request.rows] = [
                group[n] for group in outcomes]
        self.unforeseen = 0  # refits asked for that were not made ahead

    def __call__(self, past: pd.DataFrame, now: datetime, horizon: pd.Timedelta,
                 levels: list[float]) -> pd.DataFrame:
        groups = self.made.get((now, pd.Timedelta(horizon), len(past)))
        key = tuple(levels)
        if groups is not None and all(isinstance(g, BaseException) or key in g
                                      for g in groups):
            frames = []
            for group in groups:
                if isinstance(group, BaseException):
                    # the first group's error is the one fitting them all in order raises
                    raise group
                if group[key] is not None:
                    frames.append(group[key])
            if frames:
                return pd.concat(frames, ignore_index=True)
        self.unforeseen += 1
        return model_for(self.model, self.settings).fit(past).predict(horizon, levels)


def made_in_workers(replicas: pd.DataFrame, settings: Settings, plan: list[FitRequest],
                    model: str, workers: int,
                    on_fit: Callable[[int, int], None] | None = None) -> MadeForecasts:
    """The refits of ``plan`` made in up to ``workers`` processes, a group of series each
    (one group: here). ``on_fit(done, total)``: the refits done, all groups together."""
    groups = groups_of(replicas, workers)
    if len(groups) == 1:
        return MadeForecasts(plan, [fit_group(groups[0], settings, model, plan, on_fit)],
                             model, settings)
    import multiprocessing
    import queue as queues
    from concurrent.futures import ProcessPoolExecutor, wait

    # as ``simulate_policies`` starts its workers: from a clean server process, never
    # forked from this one (whose threads, a progress bar's, a fork would copy mid-act)
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload([__name__])
    channel = context.Queue()
    done = [0] * len(groups)
    with ProcessPoolExecutor(len(groups), mp_context=context, initializer=report_progress_to,
                             initargs=(channel,)) as pool:
        futures = [pool.submit(fit_in_worker, group, settings, model, plan, n)
                   for n, group in enumerate(groups)]
        pending = set(futures)
        while pending:
            _, pending = wait(pending, timeout=0.2)
            while True:
                try:
                    group, count = channel.get_nowait()
                except queues.Empty:
                    break
                done[group] = count
                if on_fit is not None:
                    on_fit(sum(done) // len(groups), len(plan))
        outcomes = [future.result() for future in futures]
    channel.close()
    return MadeForecasts(plan, outcomes, model, settings)


_progress_queue: Any = None  # a worker's channel for its progress (``report_progress_to``)


def report_progress_to(channel: Any) -> None:
    """A worker's initializer: ``fit_in_worker`` reports its progress on ``channel``."""
    global _progress_queue
    _progress_queue = channel


def fit_in_worker(replicas: pd.DataFrame, settings: Settings, model: str,
                  plan: list[FitRequest], group: int) -> list[Outcome]:
    """``fit_group`` in a worker process: its refits done go back as ``(group, done)``, at
    most every percent, on the channel the worker was started with (if any)."""
    said = [-1]

    def tell(done: int, total: int) -> None:
        mark = done * 100 // max(1, total)
        if _progress_queue is not None and (mark != said[0] or done == total):
            said[0] = mark
            _progress_queue.put((group, done))

    return fit_group(replicas, settings, model, plan, tell)


def groups_of(replicas: pd.DataFrame, count: int) -> list[pd.DataFrame]:
    """``replicas`` split into up to ``count`` groups of whole series, consecutive in
    ``unique_id`` order and of about as many series each."""
    uids = [uid for uid, _ in replicas.groupby(UNIQUE_ID, sort=True, observed=True)]
    count = max(1, min(count, len(uids)))
    size, extra = divmod(len(uids), count)
    groups, at = [], 0
    for n in range(count):
        take = uids[at: at + size + (1 if n < extra else 0)]
        at += len(take)
        groups.append(replicas[replicas[UNIQUE_ID].isin(take)])
    return groups


def per_series(model: str) -> bool:
    """Whether ``model`` fits each series on its own (so its refits split by series)."""
    return isinstance(model_for(model, None), SeriesForecaster)


__all__ = ["FitRequest", "MadeForecasts", "fit_group", "fit_in_worker", "fit_plan", "groups_of",
           "made_in_workers", "merged", "per_series", "report_progress_to"]
