"""Many simulations of one trace: the policies side by side in worker processes
(``simulate_policies``), the forecast policy's confidence frontier (``sweep``)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import pandas as pd

from idlegpu.forecast.schema import REPLICAS, UNIQUE_ID, metric_rows
from idlegpu.scheduler.config import Settings
from idlegpu.scheduler.refresh import Refresher
from idlegpu.scheduler.simulate.choices import CLAIRVOYANT, POLICIES
from idlegpu.scheduler.simulate.engine import simulate
from idlegpu.scheduler.simulate.fits import (
    FitRequest,
    MadeForecasts,
    Outcome,
    fit_in_worker,
    fit_plan,
    groups_of,
    made_in_workers,
    merged,
    per_series,
    report_progress_to,
)
from idlegpu.scheduler.simulate.jobs import SimJob
from idlegpu.scheduler.simulate.profiles import FORECAST_MODEL as FIT_MODEL
from idlegpu.scheduler.simulate.profiles import (
    HORIZON,
    REFRESH_HOUR,
    forecast_profiles_for,
    refresh_moments,
)
from idlegpu.scheduler.simulate.results import SimResult
from idlegpu.scheduler.simulate.timeline import simulated_steps
from idlegpu.scheduler.types import FreeProfile

# the policies' relative cost (the forecast policy refits every evening; the clairvoyant
# plays three plans): the costliest start first, so the others fill the other workers
_COST = {"forecast": 6.0, CLAIRVOYANT: 3.0}
_progress_queue = None  # a worker's channel for its progress (set by ``_worker_started``)


def simulate_policies(
    history: pd.DataFrame,
    settings: Settings,
    jobs: Sequence[SimJob],
    policies: Sequence[str],
    *,
    start: datetime,
    end: datetime,
    workers: int = 1,
    on_progress: Callable[[str, str, int, int], None] | None = None,
    on_profiles: Callable[[dict[datetime, FreeProfile]], None] | None = None,
    **options,
) -> dict[str, SimResult]:
    """``simulate`` of each of ``policies`` on the same inputs, by policy in ``policies``
    order: in ``workers`` processes at once (the runs are independent and each is
    deterministic, so the results are the same as one after another), the costliest first.
    The forecast policy's evening refits, most of its time, are made by all the workers at
    first, a group of services each, its profiles then here while the workers go on with
    the other policies (``_ForecastsAhead``: the same profiles).
    ``on_progress(policy, what, done, total)``: ``what`` is ``"steps"`` or ``"refreshes"``
    (the forecast policy's evening refits), called in this process. ``on_profiles``: called
    here with the forecast policy's profiles, unless they were given (to keep them: the
    ``--forecast-cache``)."""
    policies = list(dict.fromkeys(policies))
    for name in policies:
        if name not in POLICIES:
            raise ValueError(f"unknown policy {name!r}; choose from {', '.join(POLICIES)}")
    # the forecast's refits go to as many workers as there are services to split them by
    useful = max(len(policies), _services_in(history) if "forecast" in policies else 1)
    workers = max(1, min(int(workers), useful))
    ahead = _ForecastsAhead.of(history, settings, policies, start, end, workers, options)
    if (ahead is None and on_profiles is not None and "forecast" in policies
            and "forecast_profiles" not in options):
        # no refits ahead: the forecast's profiles made here first, for the caller to keep
        profiles = forecast_profiles_for(
            history, settings, simulated_steps(history, settings, start, end),
            int(options.get("refresh_hour", REFRESH_HOUR)), options.get("horizon", HORIZON),
            cache=options.get("forecast_cache"),
            on_refresh=None if on_progress is None else (
                lambda k, n: on_progress("forecast", "refreshes", k, n)))
        on_profiles(profiles)
        options = {**options, "forecast_profiles": profiles}
    if workers == 1:
        out = {}
        for name in policies:
            hooks: dict[str, Any] = {}
            if on_progress is not None:
                hooks = {"on_step": lambda k, n, name=name: on_progress(name, "steps", k + 1, n),
                         "on_refresh": lambda k, n, name=name: on_progress(
                             name, "refreshes", k, n)}
            out[name] = simulate(history, settings, jobs, name, start=start,
                                           end=end, **hooks, **options)
        return out
    import multiprocessing
    import queue as queues
    from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait

    # forkserver: workers forked from a clean process that has imported the simulator once
    # (never from this one, whose threads, e.g. a progress bar's, a fork would copy mid-act)
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload([__name__])
    channel = context.Queue()
    order = sorted(policies, key=lambda n: (-_COST.get(n, 1.0), policies.index(n)))
    results: dict[str, SimResult] = {}

    def tell(report: tuple) -> None:
        if len(report) == 2:  # a group of the forecast's refits: (group, refits done)
            assert ahead is not None
            report = ahead.fitted(*report)
        if on_progress is not None:
            on_progress(*report)

    def drain() -> None:
        while True:
            try:
                tell(channel.get_nowait())
            except queues.Empty:
                return

    with ProcessPoolExecutor(workers, mp_context=context, initializer=_worker_started,
                             initargs=(channel,)) as pool:
        refits: dict[Future, int] = {} if ahead is None else {
            pool.submit(fit_in_worker, group, settings, FIT_MODEL, ahead.plan, n): n
            for n, group in enumerate(ahead.groups)}
        pending: dict[Future, str] = {
            pool.submit(_simulate_one, history, settings, jobs, name, start, end, options): name
            for name in order if ahead is None or name != "forecast"}
        while pending or refits:
            done, _ = wait([*pending, *refits], timeout=0.2, return_when=FIRST_COMPLETED)
            drain()
            for future in done:
                if future in refits:
                    assert ahead is not None
                    ahead.outcomes[refits.pop(future)] = future.result()
                    if not refits:  # every group made: the evenings' profiles, here
                        profiles = ahead.profiles(history, settings, tell, drain)
                        if on_profiles is not None:
                            on_profiles(profiles)
                        pending[pool.submit(_simulate_one, history, settings, jobs, "forecast",
                                            start, end, {**options,
                                                         "forecast_profiles": profiles})] = (
                            "forecast")
                else:
                    results[pending.pop(future)] = future.result()
    drain()
    channel.close()
    return {name: results[name] for name in policies}


def _services_in(history: pd.DataFrame) -> int:
    """How many replica series ``history`` has (what the forecast's refits split by)."""
    return int(metric_rows(history, REPLICAS)[UNIQUE_ID].nunique())


@dataclass(frozen=True)
class _Planned:
    """The forecast policy's refits over a simulation: its steps, the replicas the refits read,
    its refresh hour, horizon and refreshes, and the plan of the refits."""

    index: pd.DatetimeIndex
    replicas: pd.DataFrame
    refresh_hour: int
    horizon: timedelta
    refreshes: int
    plan: list[FitRequest]

    @classmethod
    def of(cls, history: pd.DataFrame, points: list[Settings], start: datetime,
           end: datetime, options: dict[str, Any]) -> _Planned:
        """The refits the forecast policy makes at each of ``points`` (one plan)."""
        refresh_hour = int(options.get("refresh_hour", REFRESH_HOUR))
        horizon = options.get("horizon", HORIZON)
        index = simulated_steps(history, points[0], start, end)
        replicas = metric_rows(history, REPLICAS)
        moments = refresh_moments(index, points[0], refresh_hour)
        plan = merged([fit_plan(replicas, point, Refresher(
            point, horizon=horizon, model=FIT_MODEL, refresh_hour=refresh_hour), moments)
            for point in points])
        return cls(index, replicas, refresh_hour, horizon, len(moments), plan)


class _ForecastsAhead:
    """The forecast policy's refits made in the workers beside the other policies, a group of
    services each (``idlegpu.scheduler.simulate.fits``), then its profiles made here from them:
    the same profiles as its own run makes, in a fraction of its time."""

    def __init__(self, index: pd.DatetimeIndex, plan: list[FitRequest],
                 groups: list[pd.DataFrame], refresh_hour: int, horizon: timedelta,
                 refreshes: int):
        self.index = index
        self.plan = plan
        self.groups = groups
        self.refresh_hour = refresh_hour
        self.horizon = horizon
        self.outcomes: dict[int, list[Outcome]] = {}
        self.done = [0] * len(groups)
        self.total = len(plan) + refreshes  # the refits, then the evenings' pool arithmetic

    @classmethod
    def of(cls, history: pd.DataFrame, settings: Settings, policies: Sequence[str],
           start: datetime, end: datetime, workers: int, options: dict[str, Any]
           ) -> _ForecastsAhead | None:
        """The refits to make ahead, or None where the forecast policy makes its own: not
        among ``policies``, given its profiles or a cache of refits to reuse, or one worker."""
        if ("forecast" not in policies or workers < 2 or "forecast_profiles" in options
                or options.get("forecast_cache") is not None or not per_series(FIT_MODEL)):
            return None
        planned = _Planned.of(history, [settings], start, end, options)
        return cls(planned.index, planned.plan, groups_of(planned.replicas, workers),
                   planned.refresh_hour, planned.horizon, planned.refreshes)

    def fitted(self, group: int, done: int) -> tuple[str, str, int, int]:
        """The progress report of the refits, ``done`` of them in ``group``."""
        self.done[group] = done
        return ("forecast", "refreshes", sum(self.done) // len(self.groups), self.total)

    def profiles(self, history: pd.DataFrame, settings: Settings,
                 tell: Callable[[tuple], None], drain: Callable[[], None]
                 ) -> dict[datetime, FreeProfile]:
        """The evenings' profiles from the groups' refits; ``tell`` a progress report, and
        ``drain`` the workers' reports between the evenings."""
        made = MadeForecasts(self.plan, [self.outcomes[n] for n in range(len(self.groups))],
                             FIT_MODEL, settings)

        def refreshed(done: int, total: int) -> None:
            tell(("forecast", "refreshes", len(self.plan) + done, len(self.plan) + total))
            drain()  # the other policies' progress, while this process makes the profiles

        return forecast_profiles_for(history, settings, self.index, self.refresh_hour,
                                     self.horizon, forecasts=made, on_refresh=refreshed)


def _worker_started(channel) -> None:
    global _progress_queue
    _progress_queue = channel
    report_progress_to(channel)  # the forecast's refits report on it too


def _simulate_one(history, settings, jobs, name: str, start, end, options) -> SimResult:
    """One policy's run in a worker: its progress goes back at most every percent."""
    said: dict[str, int] = {}

    def tell(what: str, done: int, total: int) -> None:
        mark = done * 100 // max(1, total)
        if _progress_queue is not None and (said.get(what) != mark or done == total):
            said[what] = mark
            _progress_queue.put((name, what, done, total))

    return simulate(history, settings, jobs, name, start=start, end=end,
                              on_step=lambda k, n: tell("steps", k + 1, n),
                              on_refresh=lambda k, n: tell("refreshes", k, n), **options)


SWEEP_CONFIDENCES = (0.5, 0.7, 0.8, 0.9, 0.95)
FRONTIER_METRICS = ("useful_gpu_hours", "work_gpu_hours", "lost_gpu_hours",
                    "service_delay_gpu_minutes", "jobs_finished", "mean_queue_wait_hours")


def sweep(
    history: pd.DataFrame,
    settings: Settings,
    jobs: Sequence[SimJob],
    confidences: Sequence[float] = SWEEP_CONFIDENCES,
    *,
    start: datetime,
    end: datetime,
    references: dict[str, dict[str, float]] | None = None,
    on_point: Callable[[int, int], None] | None = None,
    workers: int = 1,
    **options,
) -> pd.DataFrame:
    """The frontier an operator picks from: the ``forecast`` policy at each admission
    ``confidence`` (the quantile of the free-GPU forecast it plans on), one row each, beside
    the other policies, which have no such knob (``references``: their metrics by policy, as
    ``simulate`` returned them; each runs here when not given). Columns: ``policy``,
    ``confidence`` (NaN for the references) and ``FRONTIER_METRICS``. A higher confidence
    promises fewer GPUs: less harvest, less lost work, less service delay; where the curve
    bends is the point to run at.

    The refits do not depend on the confidence (only the levels each forecasts at do): they
    are made once, for every point (in ``workers`` processes, a group of services each), and
    each point's refreshes read them back; the points and references then run ``workers`` at
    once. The same frontier as refitting at each point."""
    if not confidences:
        raise ValueError("give at least one confidence to sweep")
    bad = [c for c in confidences if not 0.5 <= c < 1.0]
    if bad:
        raise ValueError(f"a confidence is from 0.5 up to (not including) 1, as "
                         f"admission.confidence, not {bad[0]}")
    levels = sorted(set(confidences))
    at: dict[float, Settings] = {}
    for confidence in levels:
        admission = settings.admission.model_copy(update={"confidence": confidence})
        at[confidence] = settings.model_copy(update={"admission": admission})
    names = [] if references is not None else [p for p in POLICIES if p != "forecast"]
    total = len(levels) + len(names)
    made = None
    if "forecast_profiles" not in options and options.get("forecast_cache") is None:
        made = _refits_for(history, list(at.values()), start, end, workers, options)
    calls: list[tuple[Callable[..., Any], tuple]] = [
        (_forecast_point, (history, at[c], jobs, start, end, made, options)) for c in levels]
    calls += [(_reference_point, (history, settings, jobs, name, start, end, options))
              for name in names]
    metrics = _run_all(calls, workers, on_point, total)
    rows = [{"policy": "forecast", "confidence": c, **{k: m[k] for k in FRONTIER_METRICS}}
            for c, m in zip(levels, metrics)]
    references = dict(references or {})
    references.update(zip(names, metrics[len(levels):]))
    for name, figures in references.items():
        if name != "forecast":
            rows.append({"policy": name, "confidence": float("nan"),
                         **{k: figures[k] for k in FRONTIER_METRICS}})
    return pd.DataFrame(rows, columns=["policy", "confidence", *FRONTIER_METRICS])


def _refits_for(history: pd.DataFrame, points: list[Settings], start: datetime,
                end: datetime, workers: int, options: dict[str, Any]) -> MadeForecasts:
    """The refits the forecast policy makes at every one of ``points``, made once."""
    planned = _Planned.of(history, points, start, end, options)
    return made_in_workers(planned.replicas, points[0], planned.plan, FIT_MODEL, workers)


def _forecast_point(history, settings, jobs, start, end, made, options) -> dict[str, float]:
    """The forecast policy at ``settings``' confidence, on refits made ahead (``made``) or
    its own (with the ``forecast_cache`` of ``options``)."""
    point = dict(options)
    if made is not None:
        index = simulated_steps(history, settings, start, end)
        point["forecast_profiles"] = forecast_profiles_for(
            history, settings, index, int(options.get("refresh_hour", REFRESH_HOUR)),
            options.get("horizon", HORIZON), forecasts=made)
    return simulate(history, settings, jobs, "forecast", start=start, end=end,
                    **point).metrics


def _reference_point(history, settings, jobs, name, start, end, options) -> dict[str, float]:
    return simulate(history, settings, jobs, name, start=start, end=end, **options).metrics


def _run_all(calls: list[tuple[Callable[..., Any], tuple]], workers: int,
             on_done: Callable[[int, int], None] | None, total: int) -> list[Any]:
    """Each call's result, in order: here one after another, or in ``workers`` processes
    (forkserver, as ``simulate_policies`` starts them) the first ones first.
    ``on_done(done, total)`` as each ends."""
    if workers <= 1 or len(calls) <= 1:
        out = []
        for n, (call, args) in enumerate(calls):
            out.append(call(*args))
            if on_done:
                on_done(n + 1, total)
        return out
    import multiprocessing
    from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait

    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload([__name__])
    results: dict[int, Any] = {}
    with ProcessPoolExecutor(min(workers, len(calls)), mp_context=context) as pool:
        pending = {pool.submit(call, *args): n for n, (call, args) in enumerate(calls)}
        while pending:
            done, _ = wait(pending, return_when=FIRST_COMPLETED)
            for future in done:
                results[pending.pop(future)] = future.result()
                if on_done:
                    on_done(len(results), total)
    return [results[n] for n in range(len(calls))]
