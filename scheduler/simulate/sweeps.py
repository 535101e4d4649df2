"""Many simulations of one trace: the policies side by side in worker processes
(``simulate_policies``), the forecast policy's confidence frontier (``sweep``)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any

import pandas as pd

from idlegpu.scheduler.config import Settings
from idlegpu.scheduler.simulate.choices import CLAIRVOYANT, POLICIES
from idlegpu.scheduler.simulate.engine import simulate
from idlegpu.scheduler.simulate.jobs import SimJob
from idlegpu.scheduler.simulate.results import SimResult

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
    **options,
) -> dict[str, SimResult]:
    """``simulate`` of each of ``policies`` on the same inputs, by policy in ``policies``
    order: in ``workers`` processes at once (the runs are independent and each is
    deterministic, so the results are the same as one after another), the costliest first.
    ``on_progress(policy, what, done, total)``: ``what`` is ``"steps"`` or ``"refreshes"``
    (the forecast policy's evening refits), called in this process."""
    policies = list(dict.fromkeys(policies))
    for name in policies:
        if name not in POLICIES:
            raise ValueError(f"unknown policy {name!r}; choose from {', '.join(POLICIES)}")
    workers = max(1, min(int(workers), len(policies)))
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
    from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait

    # forkserver: workers forked from a clean process that has imported the simulator once
    # (never from this one, whose threads, e.g. a progress bar's, a fork would copy mid-act)
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload([__name__])
    channel = context.Queue()
    order = sorted(policies, key=lambda n: (-_COST.get(n, 1.0), policies.index(n)))
    results: dict[str, SimResult] = {}
    with ProcessPoolExecutor(workers, mp_context=context, initializer=_worker_started,
                             initargs=(channel,)) as pool:
        pending = {pool.submit(_simulate_one, history, settings, jobs, name, start, end,
                               options): name for name in order}
        while pending:
            done, _ = wait(pending, timeout=0.2, return_when=FIRST_COMPLETED)
            while True:
                try:
                    report = channel.get_nowait()
                except queues.Empty:
                    break
                if on_progress is not None:
                    on_progress(*report)
            for future in done:
                results[pending.pop(future)] = future.result()
    channel.close()
    return {name: results[name] for name in policies}


def _worker_started(channel) -> None:
    global _progress_queue
    _progress_queue = channel


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
    **options,
) -> pd.DataFrame:
    """The frontier an operator picks from: the ``forecast`` policy at each admission
    ``confidence`` (the quantile of the free-GPU forecast it plans on), one row each, beside
    the other policies, which have no such knob (``references``: their metrics by policy, as
    ``simulate`` returned them; each runs here when not given). Columns: ``policy``,
    ``confidence`` (NaN for the references) and ``FRONTIER_METRICS``. A higher confidence
    promises fewer GPUs: less harvest, less lost work, less service delay; where the curve
    bends is the point to run at."""
    if not confidences:
        raise ValueError("give at least one confidence to sweep")
    bad = [c for c in confidences if not 0.5 <= c < 1.0]
    if bad:
        raise ValueError(f"a confidence is from 0.5 up to (not including) 1, as "
                         f"admission.confidence, not {bad[0]}")
    rows = []
    cache: dict = {}
    levels = sorted(set(confidences))
    names = [p for p in POLICIES if p != "forecast"]
    total = len(levels) + (0 if references is not None else len(names))
    for n, confidence in enumerate(levels):
        admission = settings.admission.model_copy(update={"confidence": confidence})
        at = settings.model_copy(update={"admission": admission})
        metrics = simulate(history, at, jobs, "forecast", start=start, end=end,
                                     forecast_cache=cache, **options).metrics
        rows.append({"policy": "forecast", "confidence": confidence,
                     **{k: metrics[k] for k in FRONTIER_METRICS}})
        if on_point:
            on_point(n + 1, total)
    if references is None:
        references = {}
        for n, name in enumerate(names):
            references[name] = simulate(history, settings, jobs, name, start=start,
                                                  end=end, **options).metrics
            if on_point:
                on_point(len(levels) + n + 1, total)
    for name, metrics in references.items():
        if name != "forecast":
            rows.append({"policy": name, "confidence": float("nan"),
                         **{k: metrics[k] for k in FRONTIER_METRICS}})
    return pd.DataFrame(rows, columns=["policy", "confidence", *FRONTIER_METRICS])
