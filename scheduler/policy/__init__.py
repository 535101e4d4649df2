"""The admission policy: which research jobs start, which stop, and why. Pure: no I/O, no clock.

``decide(now, profile, running, queue, signals, team_usage, settings) -> Plan``

1. **Safety first.** Live signals that are stale or missing block every admission (never admit
   blind); signals missing for longer than configured preempt everything. Queue or KV-cache
   pressure, or replicas the autoscaler wants but cannot place, preempt just enough GPUs.
2. **Proactive preemption.** Running jobs are checked against the forecast over the next grace
   period: where the free-GPU profile falls below what they hold, enough of them are told to
   checkpoint and stop now, so the GPUs are back before the service ramps up. Jobs whose planned
   window has ended are stopped too. A job that cannot checkpoint loses all it has done
   whenever it stops, so it is stopped only when the service needs its GPUs: a live need
   (the backstop), or the live pool short of what the units hold beyond the headroom (the
   headroom is there for the stops that take a grace period; such a unit gives its GPUs back
   within a step), never for a shortfall the forecast only expects: it may finish first.
3. **Victims** lose the least: lowest priority first, then the least unsaved work plus a
   restart cost per GPU (GPU-seconds since the last checkpoint, plus ``restart_cost_s`` per
   GPU), then the fewest victims; and no more victims than the need requires. An elastic job
   (``min_gpus`` below its GPUs) may instead be **shrunk**: it checkpoints and restarts on
   the GPUs the need leaves it (down to ``min_gpus``, by whole ``gpus_step``: with a step
   above 1 it may free up to a step beyond the need), which costs
   its unsaved work plus the restart of the GPUs it keeps; chosen when that is the cheaper
   cover (``Action.SHRINK``, ``Decision.gpus`` the GPUs it keeps).
4. **Admission** walks the queue by priority, then team fair share (fewest GPU-hours used
   lately), then age. A job starts now if its GPUs stay free, against the profile minus what is
   already running, for its runtime plus the grace period (a checkpointable job: for at least a
   worthwhile segment, stopping before the window closes). The first job that cannot start gets
   a reservation at its earliest fitting time; later jobs backfill only around it (EASY
   backfilling), so small jobs never starve a big one. An elastic job whose full size does
   not fit now starts on the most GPUs that do (at least its ``min_gpus``, a multiple of its
   ``gpus_step``), its runtime
   scaled linearly (``runtime_s * gpus / granted``).
   **Two curves.** Where the profile carries the pool's median free GPUs beside the promise
   (``FreeProfile.likely``, from the refresh's scenarios) and ``checkpointable_on_likely`` is
   on (the default), units that checkpoint are admitted, given their windows, backfilled and
   stopped for the forecast on the median, and units that cannot on the promise: a shortfall
   the median did not expect costs a checkpointing unit at most the work since its last
   checkpoint (the backstop still stops it when the service needs its GPUs), while it costs
   a unit that cannot checkpoint everything. Both curves follow the live pool (``nowcast``),
   each from its own value for now.
5. **Nodes.** With a node view (``nodes``: the pool's nodes and what their pods request now), a
   unit starts now only if one node has the GPUs free (and the CPU and memory its pod asks,
   when known): a pod is never split over nodes, and the kube-scheduler would leave one that
   fits nowhere pending. Of the nodes that fit, the one with the fewest free GPUs is counted on
   (**best fit**; then the fewest free CPUs, then the name), so whole nodes stay free for big
   units; what it takes is taken from that node for the rest of the pass, so two admissions
   never count on the same GPUs. A unit no node holds is deferred with the figures ("needs 8
   GPUs on one node; 16 GPUs free but at most 2 on any node (8 nodes)") and gets no
   reservation (the forecast is of the pool, it cannot say when a node frees up). The
   forecast still decides for how long. ``nodes=None``: the pool as one bin (as before).
6. **Multi-node (gang) units** (``WaitingJob.nodes`` = N > 1, ``gpus`` = N x G, ``cpu`` and
   ``memory`` per pod) start all N pods or none. Without a node view they are counted by
   their N x G GPUs like any unit. With one, a gang starts now only on N *distinct* usable
   nodes that each have G GPUs free (and the pod's CPU and memory); of the nodes that do, the
   N with the fewest free GPUs are counted on (best fit; then the fewest free CPUs, then the
   name), and G GPUs (and the pod's CPU and memory) are taken from each for the rest of the
   pass. ``Decision.nodes`` names them in pod order (index 0 first), ``Decision.node`` is the
   first; a one-pod admission has ``nodes == (node,)``. Never a partial placement: too few
   such nodes defers the whole gang with the figures ("needs 4 whole 8-GPU nodes; 3 free now
   (2 free GPUs on each of 5 others)", or "needs 2 nodes with 4 GPUs free each; ...") and no
   reservation, as in 5. Gangs are never elastic (the spec refuses ``min_gpus`` with
   ``nodes``). The simulator's node-aware mode relies on exactly this contract, e.g. the
   sample trace's 24-32 GPU units on 8-GPU nodes are gangs of 3-4 whole nodes.
7. **Growth** (``policy.growth``). After the admissions, an elastic unit running on fewer
   GPUs than it asks that has just checkpointed is stopped (planned, cause ``grow``) to go
   back to the queue and restart on more, where at least one more of its steps is free now
   and stays free on the promise for ``grow_window_s`` and the extra work outweighs the
   restart; it takes only what the queue left, and with a node view only where its larger
   pod fits a node (its own, its GPUs counted back, or another).
Same inputs, same decisions: every ordering has a total tie-break on the job id.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from functools import lru_cache
from typing import TYPE_CHECKING

import numpy as np

from idlegpu.scheduler.policy.growth import _growths
from idlegpu.scheduler.policy.placement import (
    _Availability,
    _NodeRoom,
    _place,
    _reserve_nodes,
)
from idlegpu.scheduler.policy.preemption import (
    _after_shrink,
    _cheaper_than,
    _cover as _cover,  # re-exported: tests read the cover's costs
    _cover_sparing_whole_units,
    _keep_after_window,
    _shrink_cost as _shrink_cost,
    _stop_cost as _stop_cost,
    _stops_after_checkpoint,
    _victims,
)
from idlegpu.scheduler.policy.steps import (
    MAX_RESERVATION_ATTEMPTS,
    SHORT_BY_A_GPU,
    _forecast_need,
    _hours,
    _notice_s,
    _notice_steps,
    _steps,
)
from idlegpu.scheduler.types import (
    Action,
    Decision,
    FreeProfile,
    NodeView,
    Plan,
    PolicySettings,
    RunningJob,
    ServingSignals,
    WaitingJob,
)

if TYPE_CHECKING:
    from idlegpu.scheduler.config import AdmissionConfig


def decide(
    now: datetime,
    profile: FreeProfile,
    running: Sequence[RunningJob],
    queue: Sequence[WaitingJob],
    signals: ServingSignals,
    team_usage: Mapping[str, float],
    settings: PolicySettings,
    nodes: NodeView | None = None,
) -> Plan:
    """One pass of the policy, in phases as a scheduler reads: what the running units hold
    and what the pool offers (``_pool_view``), what the live signals say (``_live``), which
    units stop or shrink (``_preemptions``, then ``_release``: when each gives its GPUs back),
    whether anything may start (``_gate``), and the admissions with one reservation
    (``_admissions``)."""
    view = _pool_view(now, profile, running, signals, settings)
    live = _live(now, signals, settings)
    victims, shrinks, fallback = _preemptions(now, profile, running, view, live, settings)
    decisions, gives_back = _release(now, profile, running, view, victims, shrinks, fallback,
                                     settings)
    gate = _gate(now, profile, view, live, settings)
    # a unit whose window closes takes its place in the queue as if stopped: where the pass
    # would admit it again on the same GPUs, it runs on (RENEW) instead of a stop and a
    # restart (its grace period, a reload and a warm-up lost, and the GPUs idle meanwhile)
    renewing = {} if gate or nodes is not None else {
        d.job_id: d for d in decisions if d.action is Action.PREEMPT and d.cause == "window"}
    ordered = sorted(
        [*queue, *(_as_waiting(j) for j in running if j.id in renewing)],
        key=lambda j: (-j.priority, team_usage.get(j.team, 0.0), j.submitted_at, j.id),
    )
    if gate:
        decisions.extend(Decision(Action.DEFER, j.id, j.gpus, gate) for j in ordered)
        return Plan(tuple(decisions))
    admitted, capacity, room = _admissions(now, profile, running, ordered, signals, view,
                                           gives_back, settings, nodes, renewing)
    renewed = {d.job_id for d in admitted if d.action is Action.RENEW}
    decisions = [d for d in decisions if d.job_id not in renewed]
    decisions.extend(admitted)
    decisions.extend(_growths(now, running, {d.job_id for d in decisions}, capacity, room,
                              view.step, settings))
    return Plan(tuple(decisions))


def _as_waiting(job: RunningJob) -> WaitingJob:
    """A running unit whose window closes as the queue would hold it once stopped: its work
    left, on the GPUs it holds (no smaller restart: that is a shrink's), in the queue's
    order by its start (it was submitted before it)."""
    return WaitingJob(
        id=job.id, team=job.team, gpus=job.gpus, runtime_s=max(0.0, job.remaining_s),
        checkpointable=job.checkpointable, priority=job.priority, submitted_at=job.started_at,
        kind=job.kind, min_gpus=job.gpus, cpu=job.cpu, memory=job.memory,
        checkpoint_interval_s=job.checkpoint_interval_s)


@dataclass
class _PoolView:
    """What the pass plans on: the profile's steps from ``i0`` (now), the GPUs the running
    units hold over them (``used``, changed as units stop) until their ends (``ends``), the
    free GPUs (``free``: with the live correction; checkpointable units' median where they
    plan on it), the whole units' (``whole_free``), the median (``likely``) and the holes."""

    step: int
    n_steps: int
    i0: int
    grace_steps: int
    used: np.ndarray
    ends: dict[str, int]
    free: np.ndarray
    whole_free: np.ndarray
    likely: np.ndarray | None
    hole: np.ndarray
    holes: bool


def _pool_view(now: datetime, profile: FreeProfile, running: Sequence[RunningJob],
               signals: ServingSignals, settings: PolicySettings) -> _PoolView:
    step = profile.step_s
    n_steps = len(profile.free)
    i0 = max(0, profile.index_at(now))
    grace_steps = _steps(settings.grace_s, step) if settings.grace_s > 0 else 0
    # GPUs held by running jobs over the profile's steps, until they finish or must stop
    used = np.zeros(n_steps + 1)
    ends: dict[str, int] = {}
    for job in running:
        end = now + timedelta(seconds=max(0.0, job.remaining_s))
        if job.stop_by is not None:
            end = min(end, job.stop_by)
        last = min(n_steps, max(i0 + 1, math.ceil((end - profile.start).total_seconds() / step)))
        ends[job.id] = last
        used[i0:last] += job.gpus
    forecast = np.asarray(profile.free, dtype=float)
    free = forecast
    likely = None
    if (profile.likely is not None and len(profile.likely) == n_steps
            and (settings.early_stop_only_if_likely or settings.checkpointable_on_likely)):
        likely = np.asarray(profile.likely, dtype=float)
    if settings.pool_gpus and signals.service_gpus is not None and signals.age_s(now) is not None:
        # free for jobs now, held by them or not (a job stopping still gives its GPUs back)
        live_free = settings.pool_gpus - settings.headroom_gpus - signals.service_gpus
        free = nowcast(free, i0, live_free, step, settings.nowcast_half_life_s)
        if likely is not None:
            # the median follows the pool as it is now too, from its own value for now
            # (a pool busier than the median but quieter than the promise pulls it down),
            # and never promises less than the promise
            likely = np.fmax(nowcast(likely, i0, live_free, step, settings.nowcast_half_life_s),
                             free)
    # a unit that cannot checkpoint stakes all its work on its window: the live correction
    # may warn it off the hours ahead (a pool busier than forecast), never lure it into them
    # (a quieter one: the quiet is what the forecast doubts, and it would lose everything)
    whole_free = free if free is forecast else np.concatenate(
        [free[: i0 + 1], np.minimum(free[i0 + 1 :], forecast[i0 + 1 :])])
    if likely is not None and settings.checkpointable_on_likely:
        # checkpointable units are planned, stopped and backfilled on the median (a
        # shortfall costs them at most a checkpoint interval); whole units on the promise
        free = likely
    free = np.concatenate([free, [0.0]])  # beyond the forecast nothing is promised
    whole_free = np.concatenate([whole_free, [0.0]])
    # a hole (NaN: no replica history behind that stretch of the forecast) is a blind
    # stretch: nothing is admitted into it, and nothing is stopped for it (it is no demand)
    hole = np.isnan(free)
    return _PoolView(step, n_steps, i0, grace_steps, used, ends, free, whole_free, likely, hole,
                     bool(hole.any()))


@dataclass(frozen=True)
class _Live:
    """What the live signals say: their age, whether they are too old to trust (``blind``),
    how long they have been missing, whether every unit must stop for that (``give_up``),
    and the GPUs the service needs now with why."""

    age: float | None
    blind: bool
    missing_for: float | None
    give_up: bool
    need: int
    reason: str


def _live(now: datetime, signals: ServingSignals, settings: PolicySettings) -> _Live:
    age = signals.age_s(now)
    blind = age is None or age > settings.max_signal_age_s
    missing_for = signals.missing_for_s(now)
    give_up = settings.missing_signals_preempt_after_s is not None and (
        missing_for is None or missing_for > settings.missing_signals_preempt_after_s
    )
    live_need, live_reason = 0, ""
    if not blind:
        if signals.gpus_short > 0:
            live_need = signals.gpus_short
            live_reason = f"the services want {signals.gpus_short} GPUs they cannot get"
        else:
            # pressure asks for one more replica; idle GPUs serve it before any job must go
            spare = settings.pressure_gpus - (signals.idle_gpus or 0)
            if signals.kv_cache_usage >= settings.kv_cache_pressure and spare > 0:
                live_need = spare
                live_reason = (
                    f"KV-cache usage {signals.kv_cache_usage:.0%} is at the pressure mark"
                )
            elif signals.requests_waiting_per_replica >= settings.waiting_pressure and spare > 0:
                live_need = spare
                live_reason = (
                    f"{signals.requests_waiting_per_replica:.1f} requests wait per replica"
                )
    return _Live(age, blind, missing_for, give_up, live_need, live_reason)


_Victims = dict[str, tuple[str, bool, str]]  # id -> (reason, planned, cause)


def _preemptions(now: datetime, profile: FreeProfile, running: Sequence[RunningJob],
                 view: _PoolView, live: _Live, settings: PolicySettings
                 ) -> tuple[_Victims, dict[str, int], dict[str, str]]:
    """The units that stop (``victims``), those of them that shrink instead (``shrinks``: the
    GPUs each keeps) and the reason of a whole stop should a shrink not fit (``fallback``):
    every unit when the signals are lost for good; else those told of a stop while the
    signals are missing, those whose window closes, the cover of what the service needs
    within the grace period, and the stops timed just after a checkpoint."""
    by_id = sorted(running, key=lambda j: j.id)
    victims: _Victims = {}
    shrinks: dict[str, int] = {}  # id -> GPUs it keeps (victims that shrink, not stop)
    fallback: dict[str, str] = {}  # id -> the reason of a whole stop, should a shrink not fit
    missing_for = live.missing_for
    if live.give_up:
        what = "never read" if missing_for is None else f"missing for {missing_for / 60:.0f} min"
        spare_whole = settings.whole_units_through_outages
        which = "every job that can checkpoint" if spare_whole else "every job"
        for job in by_id:
            if spare_whole and not job.checkpointable:
                continue  # its stop loses all; the cluster's preemption still guards the service
            victims[job.id] = (f"live signals {what}: stopping {which} to keep the service safe",
                               False, "signals")
        return victims, shrinks, fallback
    after = settings.missing_signals_preempt_after_s
    if missing_for is not None and after is not None:
        # every job stops once the signals have been missing ``after`` seconds: a unit
        # that gets a notice is told that much earlier, so it has saved by then, but not
        # before they have been missing half of it (a reading or two lost is no reason)
        for job in by_id:
            lead = min(_notice_s(job), after / 2)
            if lead > 0 and missing_for > after - lead:
                victims[job.id] = (
                    f"live signals missing for {missing_for / 60:.0f} min: checkpoint "
                    f"now, every job stops at {after / 60:.0f} min", True, "signals")
    _window_stops(now, by_id, view, victims, shrinks, fallback, settings)
    _cover_the_service(now, running, view, live, victims, shrinks, fallback, settings)
    if not live.blind and live.need == 0 and settings.stop_after_checkpoint:
        timed, keeps = _stops_after_checkpoint(
            now, profile, running, victims, view.free, view.used, view.ends, view.i0,
            view.n_steps, view.grace_steps, settings,
            view.likely if settings.early_stop_only_if_likely else None)
        held_by = {j.id: j.gpus for j in running}
        for job_id, keep in keeps.items():
            shrinks[job_id] = keep
            fallback[job_id] = timed[job_id][0]
            timed[job_id] = (f"shrink {job_id} from {held_by[job_id]} to {keep} GPUs: "
                             + timed[job_id][0], *timed[job_id][1:])
        victims.update(timed)
    return victims, shrinks, fallback


def _window_stops(now: datetime, by_id: Sequence[RunningJob], view: _PoolView,
                  victims: _Victims, shrinks: dict[str, int], fallback: dict[str, str],
                  settings: PolicySettings) -> None:
    """The units whose window closes by the next pass stop (or shrink to what stays free)."""
    for job in by_id:
        if job.id in victims:
            continue
        # its stop_by is its window's end less the grace period: stopped at the last pass
        # before it (passes are a step apart), it is gone by the window's end; a unit
        # that gets a notice is told that much earlier, and works on until it answers
        notice = timedelta(seconds=_notice_s(job))
        if job.stop_by is not None and job.stop_by - notice <= now + timedelta(
                seconds=view.step):
            due = (job.next_checkpoint(now) if job.checkpointable
                   and settings.stop_after_checkpoint else None)
            if due is not None and now < due <= job.stop_by:
                # its checkpoint comes by its stop_by: it stops just after it, not a
                # pass before it (which would lose all it did since the last one)
                continue
            keep = _keep_after_window(job, now, view.free, view.used, view.ends, view.i0,
                                      view.n_steps, view.grace_steps, settings, view.step)
            if keep:
                shrinks[job.id] = keep
                text = (f"shrink {job.id} from {job.gpus} to {keep} GPUs: its window closes "
                        f"for {job.gpus}, {keep} stay free; checkpoint and restart as planned")
                victims[job.id] = (text, True, "window")
                fallback[job.id] = "its window closes: checkpoint and stop as planned"
            else:
                victims[job.id] = ("its window closes: checkpoint and stop as planned", True,
                                   "window")


def _cover_the_service(now: datetime, running: Sequence[RunningJob], view: _PoolView,
                       live: _Live, victims: _Victims, shrinks: dict[str, int],
                       fallback: dict[str, str], settings: PolicySettings) -> None:
    """The cheapest units to stop (or shrink) for what the service needs, now (the live
    signals) or within the grace period (the forecast), net of those already stopping."""
    step, i0, n_steps = view.step, view.i0, view.n_steps
    stopping = sum(j.gpus - shrinks.get(j.id, 0) for j in running if j.id in victims)
    # within the grace period nobody is trusted to finish on time: a job may overrun its
    # estimate, and stopping it later would make the service wait (unless the runtimes
    # are known, as the simulator's oracle knows them)
    # (units told of a stop ahead of it are told as far ahead as their notice)
    notice_steps = _notice_steps(max((_notice_s(j) for j in running), default=0.0), step)
    stop = min(n_steps, i0 + view.grace_steps + notice_steps + 1)
    window = view.free[i0:stop]
    if settings.runtimes_known:
        held = np.zeros(len(window))
        for job in running:
            if job.id not in victims:
                held[: max(0, view.ends[job.id] - i0)] += job.gpus
    else:
        held = np.full(len(window), float(sum(j.gpus for j in running) - stopping))
    short = held - window
    short[np.isnan(window)] = 0.0  # a hole is no demand
    deficit = _forecast_need(float(np.max(short, initial=0.0)))  # net of those stopping
    need = max(live.need - stopping, deficit)
    spared: dict[str, str] = {}
    if settings.runtimes_known and live.need == 0 and deficit > 0:
        # a job that ends before the GPUs are needed frees nothing by being stopped
        first = int(np.flatnonzero(short >= SHORT_BY_A_GPU)[0])  # the first GPU short
        spared = {j.id: "" for j in running if view.ends[j.id] - i0 <= first}
    if need <= 0:
        return
    reason = live.reason or (
        f"the forecast needs {deficit} of their GPUs for the service within "
        f"{_hours(settings.grace_s + notice_steps * step)}"
    )
    exclude = {**victims, **spared}
    whole: list[RunningJob] = []
    # a unit that cannot checkpoint gives its GPUs back within a step: the headroom, there
    # for the stops that take a grace period, is not its to keep free
    into = settings.headroom_gpus if settings.whole_units_into_headroom else 0
    cover = _cover_sparing_whole_units(running, need, 0.0 if live.blind else short[0] - into,
                                       live.need, now, exclude, settings.restart_cost_s)
    if any(keep for _, keep in cover):
        # say what the shrink saves: the cover of whole stops it beats
        whole = _victims(running, need, now, exclude, restart_cost_s=settings.restart_cost_s,
                         planned=live.need == 0)
    for job, keep in cover:
        if keep:
            shrinks[job.id] = keep
            fallback[job.id] = reason
            text = (f"shrink {job.id} from {job.gpus} to {keep} GPUs: {reason}; "
                    + _cheaper_than(job, whole, now))
        else:
            text = reason
        victims[job.id] = (text, live.need == 0, "forecast" if live.need == 0 else "live")


def _release(now: datetime, profile: FreeProfile, running: Sequence[RunningJob],
             view: _PoolView, victims: _Victims, shrinks: dict[str, int],
             fallback: dict[str, str], settings: PolicySettings
             ) -> tuple[list[Decision], dict[str, list[tuple[int, int]]]]:
    """The stops and shrinks as decisions, and when each running unit gives its GPUs back
    (steps and GPUs: at its end, or at its stop), with ``view.used`` brought up to date."""
    step, i0, n_steps, used, ends = view.step, view.i0, view.n_steps, view.used, view.ends
    decisions: list[Decision] = []
    gives_back: dict[str, list[tuple[int, int]]] = {j.id: [(ends[j.id], j.gpus)] for j in running}
    for job in sorted(running, key=lambda j: j.id):
        if job.id not in victims:
            continue
        reason, planned, cause = victims[job.id]
        # a checkpointing job gives its GPUs back once the grace period has passed; one
        # that cannot checkpoint has nothing to save and is stopped at once
        # (a unit given notice: at the latest when it never answers, its notice and then
        # its grace period later)
        release = min(n_steps, i0 + (view.grace_steps + (_notice_steps(_notice_s(job), step)
                                                         if planned else 0)
                                     if job.checkpointable else 1))
        keep = shrinks.get(job.id, 0)
        if keep:
            fits, stop_by = _after_shrink(job, keep, profile, view.free, used, ends[job.id],
                                          release, n_steps, settings)
            if fits:
                decisions.append(Decision(Action.SHRINK, job.id, keep, reason,
                                          stop_by=stop_by, planned=planned, cause=cause))
                # it holds every GPU through the grace period, then `keep` until it ends
                # (its work left takes longer on fewer GPUs) or its new window closes
                end = stop_by or now + timedelta(
                    seconds=settings.grace_s + max(0.0, job.remaining_s) * job.gpus / keep)
                last = min(n_steps, math.ceil((end - profile.start).total_seconds() / step))
                used[release : ends[job.id]] -= job.gpus
                used[release : max(release, last)] += keep
                gives_back[job.id] = [(release, job.gpus - keep), (max(release, last), keep)]
                continue
            # no worthwhile time on fewer GPUs: stopped whole after all
            reason = fallback.get(job.id, reason)
        decisions.append(Decision(Action.PREEMPT, job.id, job.gpus, reason, planned=planned,
                                  cause=cause))
        used[release : ends[job.id]] -= job.gpus
        gives_back[job.id] = [(release, job.gpus)]
    return decisions, gives_back


def _gate(now: datetime, profile: FreeProfile, view: _PoolView, live: _Live,
          settings: PolicySettings) -> str:
    """Why nothing may start this pass ("" when admission is open)."""
    if live.blind:
        if live.age is not None:
            gate = (f"live signals are {live.age:.0f} s old (limit "
                    f"{settings.max_signal_age_s:.0f} s)")
        elif live.missing_for is not None:
            gate = f"live signals missing for {live.missing_for:.0f} s"
        else:
            gate = "live signals were never read"
        return gate + "; not admitting blind"
    if (now - profile.made_at).total_seconds() > settings.max_forecast_age_s:
        return f"the forecast is {_hours((now - profile.made_at).total_seconds())} old; refresh it"
    if view.i0 >= view.n_steps or profile.index_at(now) < 0:
        return "the forecast does not cover now"
    if view.holes and view.hole[view.i0]:
        return "the forecast has a hole now (no replica history behind it); not admitting blind"
    if live.need > 0:
        return f"the service is under pressure ({live.reason})"
    return ""


def _admissions(now: datetime, profile: FreeProfile, running: Sequence[RunningJob],
                ordered: Sequence[WaitingJob], signals: ServingSignals, view: _PoolView,
                gives_back: Mapping[str, list[tuple[int, int]]], settings: PolicySettings,
                nodes: NodeView | None, renewing: Mapping[str, Decision]
                ) -> tuple[list[Decision], _Availability, _NodeRoom | None]:
    """The queue in order, each unit admitted where it fits now, the first that cannot
    reserved where it fits first (EASY backfilling), the rest deferred with why; the units in
    ``renewing`` (their window closes: stopped by this pass) in it too, renewed where they
    would be admitted again. Also what they leave of the pool and of the nodes (for
    ``_growths``)."""
    step, i0, n_steps, used = view.step, view.i0, view.n_steps, view.used
    values = view.free[:n_steps] - used[:n_steps]
    if signals.idle_gpus is not None:
        idle_now = max(0.0, signals.idle_gpus - settings.headroom_gpus)
        cap_end = min(n_steps, i0 + _steps(settings.live_cap_s, step))
        cap = np.full(max(0, cap_end - i0), idle_now)
        for job_id, stop in renewing.items():
            # what a window's stop gives back is idle once its grace period is over
            cap[max(0, gives_back[job_id][0][0] - i0):] += stop.gpus
        values[i0:cap_end] = np.minimum(values[i0:cap_end], cap)
    if view.holes:
        values[view.hole[:n_steps]] = 0.0  # no admission into a hole, nor a reservation across it
    # whole_free is never above free (and NaN where it is): the same caps and holes, lower
    whole_values = values if view.whole_free is view.free else np.fmin(
        values, view.whole_free[:n_steps] - used[:n_steps])
    avail = _Availability(values, i0, whole=whole_values)
    room = None if nodes is None else _NodeRoom(nodes, [
        (node, at, gpus // len(job.nodes), job.cpu if gpus == job.gpus else 0.0,
         job.memory if gpus == job.gpus else 0)
        for job in running if job.nodes for at, gpus in gives_back[job.id] for node in job.nodes])
    decisions: list[Decision] = []
    reserved = False
    attempts = 0  # reservation attempts; bounded so a long queue stays cheap
    too_big: dict[tuple[int, int], str] = {}  # one reason text per (size, GPUs free now)
    for unit in ordered:
        if unit.id in renewing:
            renewal = _renewal(unit, renewing[unit.id], gives_back[unit.id][0][0], now,
                               profile, avail, settings)
            if renewal is not None:
                decisions.append(renewal)
            continue
        try_reserve = not reserved and attempts < MAX_RESERVATION_ATTEMPTS
        assert unit.min_gpus is not None  # WaitingJob.__post_init__ always sets it
        if not try_reserve and unit.min_gpus > avail.now():
            # the common case deep in a long queue: bigger than what is left now (as
            # _place's first check says, without its call)
            key = (unit.gpus, max(0, int(avail.now())))
            if key not in too_big:
                too_big[key] = f"needs {key[0]} GPUs; {key[1]} free now"
            decisions.append(Decision(Action.DEFER, unit.id, unit.gpus, too_big[key]))
            continue
        decision = _place(unit, now, profile, avail, settings, reserve=try_reserve, nodes=room)
        by_nodes = decision.action is Action.DEFER and decision.node == ""
        if by_nodes:  # refused by the nodes: whole nodes are reserved for it where they free up
            # only _place with a node view (room) refuses by the nodes
            assert room is not None
            decision = replace(decision, node=None)
            if try_reserve:
                attempts += 1
                nodes_held = _reserve_nodes(unit, profile, avail, room, settings,
                                            decision.reason)
                if nodes_held is not None:
                    decision, reserved = nodes_held, True
        elif decision.action is Action.DEFER and try_reserve:
            attempts += 1
            # the pool's GPUs are held for it from then, not nodes: holding the nodes free by
            # then too cost the sample's node pool 1.3 % of its harvest and no gang finished
            # sooner (bench/node_placement_bench.py); if the nodes refuse it then, they are
            # reserved for it then
            reserved = decision.start_at is not None
        decisions.append(decision)
    return decisions, avail, room


def _renewal(unit: WaitingJob, stop: Decision, release: int, now: datetime,
             profile: FreeProfile, avail: _Availability, settings: PolicySettings
             ) -> Decision | None:
    """RENEW for a unit whose window closes (``stop``: its stop) if it would be admitted
    again now on the GPUs it holds (until ``release``, the step its stop gives them back,
    they are its own), else None: it stops."""
    i0 = avail.i0
    avail.lend(i0, release, unit.gpus)
    admitted = _place(unit, now, profile, avail, settings, reserve=False)
    if admitted.action is not Action.ADMIT:
        avail.take(i0, release, unit.gpus)
        return None
    return Decision(Action.RENEW, unit.id, unit.gpus,
                    f"its window closes, and {admitted.reason}: it runs on, not stopped and "
                    f"restarted", stop_by=admitted.stop_by)


def nowcast(free: np.ndarray, i0: int, live_free: float, step_s: int,
            half_life_s: float) -> np.ndarray:
    """``free`` (a free-GPU forecast from a past refresh) corrected by the pool as it is now:
    the gap between ``live_free`` (GPUs free for jobs now: idle, or held by jobs, less the
    headroom) and the promise for now (step ``i0``) is added to every later step, halving
    every ``half_life_s`` ahead. The forecast was made up to a day ago; its errors persist for
    hours (a quiet evening stays quiet, a busy one busy), so the promise is moved toward what
    is seen now, and back to the forecast further ahead. A hole (NaN) stays a hole; the past
    steps (before ``i0``) are left as they were."""
    if half_life_s <= 0 or not 0 <= i0 < len(free) or not math.isfinite(free[i0]):
        return free
    gap = live_free - free[i0]
    out = free.copy()
    out[i0:] = free[i0:] + gap * _decay(len(free) - i0, step_s, half_life_s)
    return out


def _decay(steps: int, step_s: int, half_life_s: float) -> np.ndarray:
    """``2 ** -(ahead / half_life_s)`` for the first ``steps`` steps ahead: each step's value
    does not depend on how many are asked, so one curve of a power of two steps serves every
    pass (decide() runs every step; the nowcast is of every remaining step of the profile)."""
    return _decay_curve(1 << max(0, steps - 1).bit_length(), step_s, half_life_s)[:steps]


@lru_cache(maxsize=32)
def _decay_curve(steps: int, step_s: int, half_life_s: float) -> np.ndarray:
    ahead = np.arange(steps) * float(step_s)
    curve = np.exp2(-ahead / half_life_s)
    curve.flags.writeable = False  # shared by every call
    return curve


def policy_settings(admission: AdmissionConfig, headroom_gpus: int = 0,
                    pool_gpus: int = 0) -> PolicySettings:
    """PolicySettings from the ``admission`` section of idlegpu.yaml (an AdmissionConfig), the
    pool's headroom and its size (``pool.total_gpus``)."""
    return PolicySettings(
        headroom_gpus=headroom_gpus,
        pool_gpus=pool_gpus,
        grace_s=float(admission.grace_seconds),
        min_segment_s=float(admission.min_segment_seconds),
        kv_cache_pressure=admission.kv_cache_pressure,
        waiting_pressure=admission.waiting_pressure,
        max_signal_age_s=float(admission.max_signal_age_seconds),
        whole_units_through_outages=not admission.missing_signals_stop_whole_units,
        missing_signals_preempt_after_s=(
            None if admission.missing_signals_preempt_after_seconds is None
            else float(admission.missing_signals_preempt_after_seconds)
        ),
        max_forecast_age_s=float(admission.max_forecast_age_seconds),
        restart_cost_s=float(admission.restart_cost_seconds),
        nowcast_half_life_s=float(admission.nowcast_half_life_seconds),
        node_reservation_s=float(admission.node_reservation_seconds),
        grow_window_s=float(admission.grow_window_seconds),
    )

__all__ = ["MAX_RESERVATION_ATTEMPTS", "decide", "nowcast", "policy_settings"]
