"""The policy's preemption: which running units stop or shrink for the service, at the least
cost in lost work and restarts, and when a planned stop is timed just after a checkpoint."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from typing import cast

import numpy as np

from idlegpu.scheduler.policy.steps import (
    SHORT_BY_A_GPU,
    _forecast_need,
    _min_segment_s,
    _steps,
)
from idlegpu.scheduler.types import (
    FreeProfile,
    PolicySettings,
    RunningJob,
    fitting_size,
    smaller_sizes,
)


def _stops_after_checkpoint(
    now: datetime, profile: FreeProfile, running: Sequence[RunningJob],
    victims: Mapping[str, tuple[str, bool, str]], free: np.ndarray, used: np.ndarray,
    ends: Mapping[str, int], i0: int, n_steps: int, grace_steps: int, settings: PolicySettings,
    likely: np.ndarray | None = None,
) -> tuple[dict[str, tuple[str, bool, str]], dict[str, int]]:
    """Planned stops timed just after a checkpoint: a stop's SIGTERM saves nothing, so a
    checkpointable unit that must go before its next checkpoint (its window closes, or the
    forecast needs its GPUs, a grace period before then) loses all it does from its last
    one. One that has just checkpointed (since the last pass) and will not checkpoint again
    in time is stopped now instead: it loses nothing, and its GPUs are back early. The
    forecast's need is the first shortfall beyond the grace period (the usual rule covers
    the grace period itself) of the GPUs the other units hold until their estimated ends;
    of the units that qualify, the cover that loses least (``_cover``: an elastic one may be
    shrunk instead) is stopped. Units that cannot checkpoint, whose interval is unknown, or
    that save on stop (a stop at the last moment loses them nothing), are left to the usual
    rules. With ``likely`` (the median free GPUs, corrected as ``free``) a unit is stopped
    early only if the median also falls short before its next checkpoint (and the grace
    period): otherwise the shortfall is more likely not to come, the unit runs on, and the
    usual rule still stops it in time if it does. Returns the stops and, of those, the
    shrinks (GPUs kept)."""
    step = profile.step_s
    pass_s = timedelta(seconds=step)
    fresh = [j for j in sorted(running, key=lambda j: j.id)
             if j.id not in victims and j.checkpointable and not j.saves_on_stop
             and j.next_checkpoint(now) is not None and now - j.last_checkpoint(now) < pass_s]
    out: dict[str, tuple[str, bool, str]] = {}
    keeps: dict[str, int] = {}
    if not fresh:
        return out, keeps
    grace = timedelta(seconds=settings.grace_s)
    # (every unit of fresh has a next checkpoint: next_checkpoint(now) is never None below)
    for job in fresh:
        if job.stop_by is not None and now < job.stop_by < cast(datetime,
                                                                job.next_checkpoint(now)):
            # an elastic unit keeps what stays free after its window, as at the window's end
            keep = _keep_after_window(job, now, free, used, ends, i0, n_steps, grace_steps,
                                      settings, step)
            if keep:
                keeps[job.id] = keep
            out[job.id] = ((f"its window closes at {job.stop_by + grace:%H:%M} UTC, before its "
                            "next checkpoint: it stops now, just after one, losing nothing"),
                           True, "window")
    fresh = [j for j in fresh if j.id not in out]
    if not fresh:
        return out, keeps
    # how far a stop now can beat the next checkpoint: up to the latest of them, plus grace
    latest = max(cast(datetime, j.next_checkpoint(now)) for j in fresh)
    stop = min(n_steps, profile.index_at(latest) + grace_steps + 1)
    first = i0 + grace_steps + 1
    if stop <= first:
        return out, keeps
    held = np.zeros(stop - i0)
    for job in running:
        if job.id not in victims and job.id not in out:
            held[: max(0, ends[job.id] - i0)] += job.gpus
    short = held - free[i0:stop]
    short[np.isnan(short)] = 0.0  # a hole is no demand
    later = np.flatnonzero(short[first - i0 :] >= SHORT_BY_A_GPU)
    if not later.size:
        return out, keeps
    at = first + int(later[0])  # the step the service needs the GPUs from
    leave_by = profile.time_at(at) - grace
    qualify = [j for j in fresh
               if cast(datetime, j.next_checkpoint(now)) > leave_by and ends[j.id] > at]
    if likely is not None:
        short_likely = held - likely[i0:stop]
        short_likely[np.isnan(short_likely)] = 0.0

        def likely_before_checkpoint(job: RunningJob) -> bool:
            until = min(stop, profile.index_at(cast(datetime, job.next_checkpoint(now)))
                        + grace_steps + 1)
            return bool((short_likely[first - i0 : max(first, until) - i0] >= SHORT_BY_A_GPU).any())

        qualify = [j for j in qualify if likely_before_checkpoint(j)]
    need = _forecast_need(float(short[at - i0]))
    for job, keep in _cover(qualify, need, now, {}, restart_cost_s=settings.restart_cost_s):
        if keep:
            keeps[job.id] = keep
        out[job.id] = ((f"the forecast needs {need} of their GPUs for the service from "
                        f"{profile.time_at(at):%H:%M} UTC, before its next checkpoint: it "
                        "stops now, just after one, losing nothing"), True, "forecast")
    return out, keeps


def _victims(
    running: Sequence[RunningJob], need: int, now: datetime, exclude: Mapping[str, object],
    *, restart_cost_s: float = 600.0, planned: bool = False,
) -> list[RunningJob]:
    """The victims covering ``need`` GPUs that lose the least: from the lowest priorities that
    can cover it, the set whose unsaved work plus a restart cost per GPU
    (``(unsaved_work_s + restart_cost_s) * gpus``) is least, then the fewest victims. A 4-GPU
    need stops a 4-GPU job rather than a 32-GPU one just past its checkpoint: the big one's
    restart alone costs more. Exact (a min-cost cover over the GPUs needed). Whole stops
    only; ``_cover`` also shrinks elastic jobs."""
    return [job for job, _ in _cover(running, need, now, exclude, restart_cost_s=restart_cost_s,
                                     shrink=False, planned=planned)]


def _stop_cost(job: RunningJob, now: datetime, restart_cost_s: float, planned: bool = False
               ) -> float:
    """GPU-seconds a stop loses: the unsaved work of every GPU, and every GPU's restart."""
    return (job.unsaved_work_s(now, planned=planned) + restart_cost_s) * job.gpus


def _shrink_cost(job: RunningJob, keep: int, now: datetime, restart_cost_s: float,
                 planned: bool = False) -> float:
    """GPU-seconds a shrink to ``keep`` GPUs loses: the job checkpoints and restarts, so by
    the rule of a stop its unsaved work (all its GPUs), and the restart of the ``keep`` GPUs
    it restarts on (the freed ones do not come back)."""
    return job.unsaved_work_s(now, planned=planned) * job.gpus + restart_cost_s * keep


def _cover(
    running: Sequence[RunningJob], need: int, now: datetime, exclude: Mapping[str, object],
    *, restart_cost_s: float = 600.0, shrink: bool = True, planned: bool = False,
) -> list[tuple[RunningJob, int]]:
    """The least costly way to free ``need`` GPUs: ``(job, keep)`` pairs sorted by id,
    ``keep == 0`` a stop, ``keep > 0`` a shrink of an elastic job to ``keep`` GPUs.

    From the lowest priorities that can cover the need, the set of stops (cost
    ``_stop_cost``) and shrinks (``_shrink_cost``) of least cost, then the fewest victims;
    an exact min-cost cover over the GPUs needed (a knapsack where each job is stopped,
    shrunk by some GPUs, or spared). A shrink frees no more than the need still open (the
    job keeps every GPU it can: what stops free beyond the need goes back to it, unless whole
    stops are then cheaper); its sizes are the multiples of its ``gpus_step`` from
    ``min_gpus`` up (any whole number with a step of 1), so with a step a shrink may free up
    to a step beyond the need. Only checkpointable jobs shrink (a shrink is a checkpoint and
    a restart).
    ``planned``: the stops are planned (a unit that saves on stop loses no work to them)."""
    if need <= 0:
        return []
    candidates = sorted(
        (j for j in running if j.id not in exclude),
        key=lambda j: (j.priority, _stop_cost(j, now, restart_cost_s, planned), -j.gpus, j.id),
    )
    if sum(j.gpus for j in candidates) <= need:
        return [(j, 0) for j in sorted(candidates, key=lambda j: j.id)]
    # the lowest priorities that can cover the need; of them, only the highest is spared
    # where lower ones can do (its GPUs weigh more than any work of the others)
    pool: list[RunningJob] = []
    covered = 0
    for job in candidates:
        if covered >= need and job.priority != pool[-1].priority:
            break
        pool.append(job)
        covered += job.gpus
    top = pool[-1].priority
    mixed = top != pool[0].priority
    costs = [_stop_cost(j, now, restart_cost_s, planned) for j in pool]
    weight = sum(costs) + 1.0
    per_victim = 1e-6 * weight / (len(pool) + 1)  # ties: the fewest victims

    def penalty(job: RunningJob, freed: int) -> float:
        return weight * freed if mixed and job.priority == top else 0.0

    # best[x]: least cost freeing at least x GPUs (x up to need) with the jobs so far;
    # took[i, x]: what job i does in that cover (0 spared, -1 stopped, f > 0 shrunk by f)
    best = np.full(need + 1, np.inf)
    best[0] = 0.0
    took = np.zeros((len(pool), need + 1), dtype=np.int64)
    at = np.arange(need + 1)
    for i, job in enumerate(pool):
        new = best.copy()
        with_it = best[np.maximum(0, at - job.gpus)] + (costs[i] + penalty(job, job.gpus)
                                                        + per_victim)
        better = with_it < new
        new[better] = with_it[better]
        took[i, better] = -1
        if shrink and job.elastic:
            assert job.min_gpus is not None  # RunningJob.__post_init__ always sets it
            # its sizes below its own, freeing ever more: each covers what the next larger
            # size cannot (with a size step, up to a step beyond it), never more
            covered = 0
            for keep in smaller_sizes(job.gpus, job.min_gpus, job.gpus_step):
                freed = job.gpus - keep
                cost = (_shrink_cost(job, keep, now, restart_cost_s, planned)
                        + penalty(job, freed) + per_victim)
                with_f = np.full(need + 1, np.inf)
                with_f[covered + 1:] = best[np.maximum(0, at[covered + 1:] - freed)] + cost
                better = with_f < new
                new[better] = with_f[better]
                took[i, better] = freed
                covered = freed
                if covered >= need:
                    break
        best = new
    chosen: list[tuple[RunningJob, int]] = []
    x = need
    for i in range(len(pool) - 1, -1, -1):
        if x <= 0:
            break
        what = int(took[i, x])
        if what == -1:
            chosen.append((pool[i], 0))
            x = max(0, x - pool[i].gpus)
        elif what > 0:
            chosen.append((pool[i], pool[i].gpus - what))
            x -= what
    # what the stops free beyond the need goes back to the shrunk jobs (they keep more,
    # the need is met exactly); a shrink left with nothing to free is dropped
    extra = sum(job.gpus - keep for job, keep in chosen) - need
    for n, (job, keep) in sorted(enumerate(chosen), key=lambda c: c[1][0].id):
        if keep and extra > 0:
            assert job.min_gpus is not None  # RunningJob.__post_init__ always sets it
            more = fitting_size(job.gpus, job.min_gpus, job.gpus_step,
                                keep + min(extra, job.gpus - keep))
            chosen[n] = (job, more)
            extra -= more - keep
    chosen = [(job, keep) for job, keep in chosen if keep != job.gpus]
    if any(keep for _, keep in chosen):
        # giving GPUs back costs restarts: whole stops win if they are now the cheaper
        def price(cover: list[tuple[RunningJob, int]]) -> float:
            return sum((_shrink_cost(j, keep, now, restart_cost_s, planned) if keep
                        else _stop_cost(j, now, restart_cost_s, planned))
                       + penalty(j, j.gpus - keep) + per_victim for j, keep in cover)

        whole = _cover(running, need, now, exclude, restart_cost_s=restart_cost_s,
                       shrink=False, planned=planned)
        if price(whole) < price(chosen):
            return whole
    return sorted(chosen, key=lambda c: c[0].id)


def _cover_sparing_whole_units(
    running: Sequence[RunningJob], need: int, short_now: float, live_need: int,
    now: datetime, exclude: Mapping[str, object], restart_cost_s: float,
) -> list[tuple[RunningJob, int]]:
    """``_cover`` of ``need`` GPUs, where a unit that cannot checkpoint is stopped only for
    a live need or for the GPUs the service needs now (``short_now``: what the jobs hold
    beyond the profile's present step, which the live pool sets, and beyond the headroom;
    0 with no live signals, whose absence stops everything on its own clock): it loses all
    it has done whenever it stops, so neither a shortfall the forecast only expects nor a
    service that has only eaten into the headroom stops it. It runs on, may finish first,
    and if the service does come for its GPUs it is stopped then, at once (it has nothing to
    save, so its GPUs come back within a step)."""
    if live_need > 0:
        return _cover(running, need, now, exclude, restart_cost_s=restart_cost_s)
    need_now = min(need, max(0, math.ceil(short_now)))
    cover = _cover(running, need_now, now, exclude, restart_cost_s=restart_cost_s, planned=True)
    rest = need - sum(job.gpus - keep for job, keep in cover)
    if rest > 0:
        taken = {**exclude, **{job.id: "" for job, _ in cover},
                 **{job.id: "" for job in running if not job.checkpointable}}
        cover = sorted(cover + _cover(running, rest, now, taken, restart_cost_s=restart_cost_s,
                                      planned=True), key=lambda c: c[0].id)
    return cover


def _keep_after_window(job: RunningJob, now: datetime, free: np.ndarray, used: np.ndarray,
                       ends: Mapping[str, int], i0: int, n_steps: int, grace_steps: int,
                       settings: PolicySettings, step: int) -> int:
    """GPUs an elastic job whose window closes can keep (0: none, it stops): the most, below
    its size and at least ``min_gpus``, that the profile leaves beside the other jobs for a
    worthwhile segment after its grace period (a hole: none)."""
    if not job.elastic:
        return 0
    assert job.min_gpus is not None  # RunningJob.__post_init__ always sets it
    start = min(n_steps, i0 + grace_steps)
    runtime_s = max(0.0, job.remaining_s) * job.gpus / job.min_gpus
    segment_s = min(runtime_s, _min_segment_s(job, settings, settings.restart_cost_s))
    stop = min(n_steps, start + _steps(segment_s + settings.grace_s, step))
    if stop <= start:
        return 0
    others = used[start:stop] - np.where(np.arange(start, stop) < ends[job.id], job.gpus, 0)
    left = free[start:stop] - others
    if np.isnan(left).any():
        return 0
    return job.shrunk_size(float(np.floor(left.min())))


def _after_shrink(job: RunningJob, keep: int, profile: FreeProfile, free: np.ndarray,
                  used: np.ndarray, end: int, release: int, n_steps: int,
                  settings: PolicySettings) -> tuple[bool, datetime | None]:
    """Whether ``job`` restarted on ``keep`` GPUs at ``release`` has a worthwhile run beside
    the other jobs (``used`` holds it until step ``end``), and when that run must stop (None:
    it finishes), exactly as an admission of a segment: the shrunk job checkpoints and stops
    before its new window closes rather than be in the way of the next ramp."""
    step = profile.step_s
    others = used[release:n_steps] - np.where(np.arange(release, n_steps) < end, job.gpus, 0)
    left = free[release:n_steps] - others
    short = np.flatnonzero(~(left >= keep))  # a hole (NaN) is no room
    run = int(short[0]) if short.size else n_steps - release
    runtime = max(0.0, job.remaining_s) * job.gpus / keep
    if run >= _steps(runtime + settings.grace_s, step):
        return True, None
    if run >= _steps(min(runtime, _min_segment_s(job, settings, settings.restart_cost_s))
                     + settings.grace_s, step):
        return True, profile.time_at(release + run) - timedelta(seconds=settings.grace_s)
    return False, None


def _cheaper_than(job: RunningJob, whole: Sequence[RunningJob], now: datetime) -> str:
    """The end of a shrink's reason: the whole stops it spares."""
    if [j.id for j in whole] == [job.id]:
        return "cheaper than stopping it"
    unsaved = sum(j.unsaved_work_s(now) * j.gpus for j in whole) / 3600
    names = ", ".join(j.id for j in whole) or "nothing"
    return f"cheaper than stopping {names} ({unsaved:.1f} GPU-h unsaved)"
