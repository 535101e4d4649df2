"""The admission policy: which research jobs start, which stop, and why. Pure: no I/O, no clock.

``decide(now, profile, running, queue, signals, team_usage, settings) -> Plan``

1. **Safety first.** Live signals that are stale or missing block every admission (never admit
   blind); signals missing for longer than configured preempt everything. Queue or KV-cache
   pressure, or replicas the autoscaler wants but cannot place, preempt just enough GPUs.
2. **Proactive preemption.** Running jobs are checked against the forecast over the next grace
   period: where the free-GPU profile falls below what they hold, enough of them are told to
   checkpoint and stop now, so the GPUs are back before the service ramps up. Jobs whose planned
   window has ended are stopped too. A job that cannot checkpoint loses all it has done
   whenever it stops, so it is stopped only for what the service needs now (the profile's
   present step, which the live pool sets) or for a live need, never for a shortfall the
   forecast only expects: it may finish first, and it gives its GPUs back within a step.
3. **Victims** lose the least: lowest priority first, then the least unsaved work plus a
   restart cost per GPU (GPU-seconds since the last checkpoint, plus ``restart_cost_s`` per
   GPU), then the fewest victims; and no more victims than the need requires. An elastic job
   (``min_gpus`` below its GPUs) may instead be **shrunk**: it checkpoints and restarts on
   exactly the GPUs the need leaves it (any whole number down to ``min_gpus``), which costs
   its unsaved work plus the restart of the GPUs it keeps; chosen when that is the cheaper
   cover (``Action.SHRINK``, ``Decision.gpus`` the GPUs it keeps).
4. **Admission** walks the queue by priority, then team fair share (fewest GPU-hours used
   lately), then age. A job starts now if its GPUs stay free, against the profile minus what is
   already running, for its runtime plus the grace period (a checkpointable job: for at least a
   worthwhile segment, stopping before the window closes). The first job that cannot start gets
   a reservation at its earliest fitting time; later jobs backfill only around it (EASY
   backfilling), so small jobs never starve a big one. An elastic job whose full size does
   not fit now starts on the most GPUs that do (at least its ``min_gpus``), its runtime
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
Same inputs, same decisions: every ordering has a total tie-break on the job id.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, cast

import numpy as np

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
    from idlegpu.forecast.config import AdmissionConfig

MAX_RESERVATION_ATTEMPTS = 8


def _hours(seconds: float) -> str:
    return f"{seconds / 3600:.1f} h"


def _steps(seconds: float, step_s: int) -> int:
    return max(1, math.ceil(seconds / step_s))


def _notice_steps(seconds: float, step_s: int) -> int:
    return math.ceil(seconds / step_s) if seconds > 0 else 0


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
    ordered = sorted(
        queue,
        key=lambda j: (-j.priority, team_usage.get(j.team, 0.0), j.submitted_at, j.id),
    )
    gate = _gate(now, profile, view, live, settings)
    if gate:
        decisions.extend(Decision(Action.DEFER, j.id, j.gpus, gate) for j in ordered)
        return Plan(tuple(decisions))
    decisions.extend(_admissions(now, profile, running, ordered, signals, view, gives_back,
                                 settings, nodes))
    return Plan(tuple(decisions))


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
        for job in by_id:
            victims[job.id] = (
                f"live signals {what}: stopping every job to keep the service safe", False,
                "signals")
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
    deficit = float(np.max(short, initial=0.0))  # net of the jobs already stopping
    need = max(live.need - stopping, math.ceil(deficit))
    spared: dict[str, str] = {}
    if settings.runtimes_known and live.need == 0 and deficit > 0:
        # a job that ends before the GPUs are needed frees nothing by being stopped
        first = int(np.flatnonzero(short > 0)[0])
        spared = {j.id: "" for j in running if view.ends[j.id] - i0 <= first}
    if need <= 0:
        return
    reason = live.reason or (
        f"the forecast needs {math.ceil(deficit)} of their GPUs for the service within "
        f"{_hours(settings.grace_s + notice_steps * step)}"
    )
    exclude = {**victims, **spared}
    whole: list[RunningJob] = []
    cover = _cover_sparing_whole_units(running, need, 0.0 if live.blind else short[0],
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
                nodes: NodeView | None) -> list[Decision]:
    """The queue in order, each unit admitted where it fits now, the first that cannot
    reserved where it fits first (EASY backfilling), the rest deferred with why."""
    step, i0, n_steps, used = view.step, view.i0, view.n_steps, view.used
    values = view.free[:n_steps] - used[:n_steps]
    if signals.idle_gpus is not None:
        idle_now = max(0.0, signals.idle_gpus - settings.headroom_gpus)
        cap_end = min(n_steps, i0 + _steps(settings.live_cap_s, step))
        values[i0:cap_end] = np.minimum(values[i0:cap_end], idle_now)
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
    return decisions


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
    later = np.flatnonzero(short[first - i0 :] > 0)
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
            return bool((short_likely[first - i0 : max(first, until) - i0] > 0).any())

        qualify = [j for j in qualify if likely_before_checkpoint(j)]
    need = math.ceil(float(short[at - i0]))
    for job, keep in _cover(qualify, need, now, {}, restart_cost_s=settings.restart_cost_s):
        if keep:
            keeps[job.id] = keep
        out[job.id] = ((f"the forecast needs {need} of their GPUs for the service from "
                        f"{profile.time_at(at):%H:%M} UTC, before its next checkpoint: it "
                        "stops now, just after one, losing nothing"), True, "forecast")
    return out, keeps


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
    ahead = np.arange(len(free) - i0) * float(step_s)
    out = free.copy()
    out[i0:] = free[i0:] + gap * np.exp2(-ahead / half_life_s)
    return out


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
    stops are then cheaper); any whole number of GPUs from ``min_gpus`` up is a size it
    accepts. Only checkpointable jobs shrink (a shrink is a checkpoint and a restart).
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
            for freed in range(1, min(job.gpus - job.min_gpus, need) + 1):
                cost = (_shrink_cost(job, job.gpus - freed, now, restart_cost_s, planned)
                        + penalty(job, freed) + per_victim)
                with_f = np.full(need + 1, np.inf)
                with_f[freed:] = best[: need + 1 - freed] + cost  # never beyond the need
                better = with_f < new
                new[better] = with_f[better]
                took[i, better] = freed
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
            back = min(extra, job.gpus - keep)
            chosen[n] = (job, keep + back)
            extra -= back
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
    beyond the profile's present step, which the live pool sets; 0 with no live signals,
    whose absence stops everything on its own clock): it loses all it has done whenever it
    stops, so a shortfall the forecast only expects does not stop it. It runs on, may finish
    first, and if the service does come for its GPUs it is stopped then, at once (it has
    nothing to save, so its GPUs come back within a step)."""
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
    segment_s = min(runtime_s, _min_segment_s(job, settings))
    stop = min(n_steps, start + _steps(segment_s + settings.grace_s, step))
    if stop <= start:
        return 0
    others = used[start:stop] - np.where(np.arange(start, stop) < ends[job.id], job.gpus, 0)
    left = free[start:stop] - others
    if np.isnan(left).any():
        return 0
    keep = min(job.gpus - 1, int(np.floor(left.min())))
    return keep if keep >= job.min_gpus else 0


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
    if run >= _steps(min(runtime, _min_segment_s(job, settings)) + settings.grace_s, step):
        return True, profile.time_at(release + run) - timedelta(seconds=settings.grace_s)
    return False, None


def _cheaper_than(job: RunningJob, whole: Sequence[RunningJob], now: datetime) -> str:
    """The end of a shrink's reason: the whole stops it spares."""
    if [j.id for j in whole] == [job.id]:
        return "cheaper than stopping it"
    unsaved = sum(j.unsaved_work_s(now) * j.gpus for j in whole) / 3600
    names = ", ".join(j.id for j in whole) or "nothing"
    return f"cheaper than stopping {names} ({unsaved:.1f} GPU-h unsaved)"


class _Availability:
    """GPUs still available per step from now, with run lengths cached per job size (a long
    queue has few distinct sizes, and the array changes only when a job is placed). ``whole``:
    the same for units that cannot checkpoint (the forecast without the live correction's
    promise of more; ``values`` itself when there is none)."""

    def __init__(self, values: np.ndarray, i0: int, whole: np.ndarray | None = None) -> None:
        self.values = values
        self.whole = values if whole is None else whole
        self.i0 = i0
        self._runs: dict[tuple[int, bool], int] = {}

    def array(self, whole: bool) -> np.ndarray:
        return self.whole if whole else self.values

    def now(self) -> float:
        return float(self.values[self.i0])

    def run_from_now(self, gpus: int, whole: bool = False) -> int:
        key = (gpus, whole and self.whole is not self.values)
        if key not in self._runs:
            self._runs[key] = _run_length(self.array(key[1]), self.i0, gpus)
        return self._runs[key]

    def take(self, start: int, stop: int, gpus: int) -> None:
        self.values[start:stop] -= gpus
        if self.whole is not self.values:
            self.whole[start:stop] -= gpus
        self._runs.clear()


class _NodeRoom:
    """What each usable node of a ``NodeView`` has free, taken from as the pass admits units
    (best fit, see the module docstring), when the GPUs held on it come back (``gives_back``:
    ``(node, step, GPUs)`` of the running units, and of each admission of the pass), and the
    nodes reserved for a unit the nodes refuse now (``reserve``): from the reservation's step
    on they are its, so only what gives them back by then may take them meanwhile."""

    def __init__(self, view: NodeView,
                 gives_back: Sequence[tuple[str, int, int, float | None, int | None]] = (),
                 ) -> None:
        usable = sorted((n for n in view.nodes if n.usable), key=lambda n: n.name)
        self.names = [n.name for n in usable]
        at = {name: i for i, name in enumerate(self.names)}
        # (step, GPUs, CPUs, memory) each node gets back (a shrink keeps its pod's CPU)
        self.back: list[list[tuple[int, int, float, int]]] = [[] for _ in usable]
        for node, step, gpus, cpu, memory in gives_back:
            if node in at:  # a cordoned node's GPUs come back to no one
                self.back[at[node]].append((step, gpus, cpu or 0.0, memory or 0))
        self.reserved: frozenset[int] = frozenset()
        self.reserved_from = 0
        self.gpus = [n.free_gpus for n in usable]
        self.cpu = [n.free_cpu if n.cpu > 0 else math.inf for n in usable]
        self.memory = [n.free_memory if n.memory > 0 else math.inf for n in usable]
        self.total = [n.gpus for n in usable]
        self.cordoned = len(view.nodes) - len(usable)
        self._max = max(self.gpus, default=0)
        # answers by request shape until something is taken: a long queue asks the same few
        # shapes again and again (scanning 125 nodes for each of 10,000 units was most of
        # decide()'s time)
        # (the first item of a key says what its answer is: "gang" list[int] | None, "one"
        # int | None, "why" str)
        self._answers: dict[tuple[object, ...], object] = {}

    def _closed(self, until: int | None) -> frozenset[int]:
        """The reserved nodes a unit holding its GPUs until step ``until`` may not take."""
        return self.reserved if until is None or until > self.reserved_from else frozenset()

    def fit_gang(self, count: int, gpus: int, cpu: float | None,
                 memory: int | None, until: int | None = None) -> list[int] | None:
        """Indices of ``count`` distinct nodes that each hold ``gpus`` GPUs, ``cpu`` cores
        and ``memory`` bytes (and are not reserved past ``until``): those with the fewest
        free GPUs (then the fewest free CPUs, then the name), in that order. None: fewer
        than ``count`` nodes hold it."""
        if gpus > self._max:
            return None
        closed = self._closed(until)
        key = ("gang", count, gpus, cpu, memory, bool(closed))
        if key not in self._answers:
            self._answers[key] = self._fit_gang(count, gpus, cpu, memory, closed)
        return cast("list[int] | None", self._answers[key])

    def _fit_gang(self, count: int, gpus: int, cpu: float | None,
                  memory: int | None, closed: frozenset[int]) -> list[int] | None:
        fits = [i for i, free in enumerate(self.gpus) if free >= gpus and i not in closed and (
            cpu is None or self.cpu[i] >= cpu) and (memory is None or self.memory[i] >= memory)]
        if len(fits) < count:
            return None
        fits.sort(key=lambda i: (self.gpus[i], self.cpu[i], i))
        return fits[:count]

    def fit(self, gpus: int, cpu: float | None, memory: int | None,
            until: int | None = None) -> int | None:
        """Index of the node with the fewest free GPUs that still holds ``gpus`` GPUs, ``cpu``
        cores and ``memory`` bytes (None: unknown, not checked), and is not reserved past
        ``until``; ties: the fewest free CPUs, then the name. None: no node holds it."""
        if gpus > self._max:
            return None
        closed = self._closed(until)
        shape = ("one", gpus, cpu, memory, bool(closed))
        if shape not in self._answers:
            self._answers[shape] = self._fit(gpus, cpu, memory, closed)
        return cast("int | None", self._answers[shape])

    def _fit(self, gpus: int, cpu: float | None, memory: int | None,
             closed: frozenset[int]) -> int | None:
        best, key = None, None
        for i, free in enumerate(self.gpus):
            if free < gpus or i in closed or (cpu is not None and self.cpu[i] < cpu) or (
                    memory is not None and self.memory[i] < memory):
                continue
            k = (free, self.cpu[i])
            if key is None or k < key:
                best, key = i, k
        return best

    def take(self, i: int, gpus: int, cpu: float | None, memory: int | None, *,
             until: int | None = None) -> None:
        """``gpus`` GPUs (and the pod's CPU and memory) of node ``i``, given back at step
        ``until`` (None: not within the forecast)."""
        self.gpus[i] -= gpus
        self.cpu[i] -= cpu or 0.0
        self.memory[i] -= memory or 0
        if until is not None:
            self.back[i].append((until, gpus, cpu or 0.0, memory or 0))
        self._max = max(self.gpus, default=0)
        self._answers.clear()

    def frees_up(self, gpus: int, cpu: float | None, memory: int | None,
                 start: int) -> list[float]:
        """For each node, the first step from ``start`` at which it has ``gpus`` GPUs (and
        ``cpu`` cores and ``memory`` bytes) free, as the units on it give theirs back (the
        service's replicas on it assumed to stay: the forecast is of the pool, not of a node);
        inf: not within the forecast."""
        cpu, memory = cpu or 0.0, memory or 0
        out = []
        for i in range(len(self.names)):
            free, free_cpu, free_memory = self.gpus[i], self.cpu[i], self.memory[i]
            at = math.inf
            for step, back, back_cpu, back_memory in [(start, 0, 0.0, 0), *sorted(self.back[i])]:
                free, free_cpu, free_memory = free + back, free_cpu + back_cpu, (
                    free_memory + back_memory)
                if free >= gpus and free_cpu >= cpu and free_memory >= memory:
                    at = float(max(start, step))
                    break
            out.append(at)
        return out

    def first_free(self, job: WaitingJob, start: int) -> tuple[list[int], int] | None:
        """The ``job.nodes`` nodes (by index, in name order) that first have a pod of ``job``
        free (``frees_up``; then the fewest free GPUs now, then the name), and the step from
        which all of them do. None: they do not within the forecast."""
        per_pod = job.gpus_per_node if job.nodes > 1 else job.gpus
        ready = self.frees_up(per_pod, job.cpu, job.memory, start)
        order = sorted(range(len(ready)), key=lambda i: (ready[i], self.gpus[i], i))[:job.nodes]
        if len(order) < job.nodes or not math.isfinite(ready[order[-1]]):
            return None
        return sorted(order), int(ready[order[-1]])

    def reserve(self, indices: Sequence[int], start: int) -> None:
        self.reserved, self.reserved_from = frozenset(indices), start
        self._answers.clear()

    def why_gang(self, job: WaitingJob) -> str:
        """Why fewer than ``job.nodes`` nodes hold a pod of the gang ``job``, in figures."""
        count, gpus = job.nodes, job.gpus_per_node
        whole = bool(self.names) and all(
            self.total[i] == gpus for i in range(len(self.names)))
        ask = f"{count} whole {gpus}-GPU nodes" if whole else (
            f"{count} nodes with {gpus} GPUs free each")
        roomy = [i for i, free in enumerate(self.gpus) if free >= gpus]
        fits = [i for i in roomy if (job.cpu is None or self.cpu[i] >= job.cpu) and (
            job.memory is None or self.memory[i] >= job.memory)]
        others = [self.gpus[i] for i in range(len(self.names)) if i not in set(roomy)]
        if not others:
            rest = ""
        elif min(others) == max(others):
            rest = (f"{others[0]} free GPUs on {'each of ' if len(others) > 1 else ''}"
                    f"{len(others)} other{'s' if len(others) > 1 else ''}")
        else:
            rest = f"{min(others)} to {max(others)} free GPUs on each of {len(others)} others"
        if self.cordoned:
            rest += (", " if rest else "") + f"{self.cordoned} more not ready or cordoned"
        text = f"needs {ask}; {len(fits)} {'free' if whole else 'have them'} now"
        if len(fits) < len(roomy):
            asks = [f"{job.cpu:g} CPUs"] if job.cpu is not None else []
            asks += [f"{_gib(job.memory)} memory"] if job.memory is not None else []
            text += (f" ({len(roomy)} have {gpus} GPUs free, {len(roomy) - len(fits)} of them "
                     f"without {' and '.join(asks)} beside them" + (f"; {rest})" if rest else ")"))
        elif rest:
            text += f" ({rest})"
        return text

    def why(self, job: WaitingJob) -> str:
        """Why no node holds ``job`` (at its smallest size), in figures."""
        shape = ("why", job.nodes, job.min_gpus, job.cpu, job.memory)
        if shape not in self._answers:
            self._answers[shape] = (self.why_gang(job) if job.nodes > 1
                                    else self._why_one(job))
        return cast(str, self._answers[shape])

    def _why_one(self, job: WaitingJob) -> str:
        gpus = job.min_gpus
        assert gpus is not None  # WaitingJob.__post_init__ always sets it
        nodes = len(self.names)
        where = f"{nodes} node{'s' if nodes != 1 else ''}" + (
            f", {self.cordoned} more not ready or cordoned" if self.cordoned else "")
        total, most = sum(self.gpus), self._max
        if not self.names:
            return (f"needs {gpus} GPUs on one node; no node of the pool is ready and "
                    f"schedulable ({where})")
        if most < gpus:
            return (f"needs {gpus} GPUs on one node; {total} GPUs free but at most {most} on "
                    f"any node ({where})")
        roomy = [i for i, free in enumerate(self.gpus) if free >= gpus]
        asks, most_free = [], []
        if job.cpu is not None:
            asks.append(f"{job.cpu:g} CPUs")
            most_free.append(f"{max(self.cpu[i] for i in roomy):g} CPUs")
        if job.memory is not None:
            asks.append(f"{_gib(job.memory)} memory")
            most_free.append(f"{_gib(max(self.memory[i] for i in roomy))} memory")
        return (f"needs {', '.join([f'{gpus} GPUs', *asks])} on one node; {len(roomy)} of "
                f"{where} have {gpus} GPUs free, none with {' and '.join(asks)} beside them "
                f"(most free: {', '.join(most_free)})")


def _gib(n: float) -> str:
    return f"{n / 2**30:.0f}Gi"


def _too_big(job: WaitingJob, free_now: float) -> Decision:
    return Decision(Action.DEFER, job.id, job.gpus,
                    f"needs {job.gpus} GPUs; {max(0, int(free_now))} free now")


def _place(
    job: WaitingJob,
    now: datetime,
    profile: FreeProfile,
    capacity: _Availability,
    settings: PolicySettings,
    *,
    reserve: bool,
    nodes: _NodeRoom | None = None,
) -> Decision:
    """Admit ``job`` now if it fits (taking its GPUs, and with ``nodes`` a node's), else defer
    it, reserving if asked (never when it is the nodes that refuse it)."""
    step = profile.step_s
    i0 = capacity.i0
    assert job.min_gpus is not None  # WaitingJob.__post_init__ always sets it
    if not reserve and job.min_gpus > capacity.now():
        return _too_big(job, capacity.now())
    if job.deadline is not None and now >= job.deadline:
        return Decision(Action.DEFER, job.id, job.gpus, "its deadline has passed")
    whole = _runs_whole(job)
    avail = capacity.array(whole)
    n = len(avail)
    need_steps, min_steps = _run_steps(job, job.runtime_s, whole, settings, step)
    # its full size first; an elastic job then on the most GPUs that fit now, its runtime
    # scaled linearly (the same work on fewer GPUs takes gpus / granted as long)
    no_node = False  # the pool had room for some size, but no node held it
    for gpus in range(job.gpus, job.min_gpus - 1, -1):
        if gpus > avail[i0]:
            continue
        node = None
        # a node reserved for another unit takes only what gives it back before then
        until = i0 + _steps(job.runtime_s * job.gpus / gpus + settings.grace_s, step)
        if nodes is not None and job.nodes > 1:  # a gang: N distinct nodes, or none
            gang = nodes.fit_gang(job.nodes, job.gpus_per_node, job.cpu, job.memory, until)
            if gang is None:
                no_node = True
                break
            admitted = _admit_now(job, gpus, whole, now, profile, capacity, settings)
            if admitted is None:
                break
            for i in gang:
                nodes.take(i, job.gpus_per_node, job.cpu, job.memory, until=admitted[1])
            names = tuple(nodes.names[i] for i in gang)
            return replace(admitted[0], node=names[0], nodes=names)
        if nodes is not None:
            node = nodes.fit(gpus, job.cpu, job.memory, until)
            if node is None:
                no_node = True
                continue
        admitted = _admit_now(job, gpus, whole, now, profile, capacity, settings)
        if admitted is not None:
            if node is None:
                return admitted[0]
            assert nodes is not None  # a node was fitted on them
            nodes.take(node, gpus, job.cpu, job.memory, until=admitted[1])
            return replace(admitted[0], node=nodes.names[node], nodes=(nodes.names[node],))
    if no_node:
        assert nodes is not None  # only set where the nodes were asked
        # "node" marks a refusal by the nodes: the caller reserves nothing for it
        return Decision(Action.DEFER, job.id, job.gpus, nodes.why(job), node="")
    if not reserve and job.gpus > capacity.now():
        return _too_big(job, capacity.now())
    what = "whole" if whole else "for a worthwhile segment"
    if reserve:
        start = _hold_earliest(capacity, avail, i0 + 1, job.gpus, need_steps, min_steps, whole)
        if start is not None:
            start_at = profile.time_at(start)
            return Decision(
                Action.DEFER, job.id, job.gpus,
                f"does not fit {what} now; {job.gpus} GPUs reserved for it from "
                f"{start_at:%Y-%m-%d %H:%M} UTC",
                start_at=start_at,
            )
    if job.gpus > avail[i0]:
        return _too_big(job, avail[i0])
    if i0 + min_steps > n:
        return Decision(Action.DEFER, job.id, job.gpus,
                        f"its {_hours(job.runtime_s)} run past the end of the forecast")
    return Decision(
        Action.DEFER, job.id, job.gpus,
        f"{job.gpus} GPUs do not stay free {what} ({_hours(job.runtime_s)} + grace)"
        + ("" if reserve else " without delaying the reserved job"),
    )


def _reserve_nodes(job: WaitingJob, profile: FreeProfile, capacity: _Availability,
                   nodes: _NodeRoom, settings: PolicySettings, why: str) -> Decision | None:
    """A reservation for ``job``, which no node (or too few) holds now: the ``job.nodes``
    nodes that first have a pod's GPUs free as the units on them end (then the fewest free
    GPUs now, then the name), from the first step at which all of them do (within
    ``settings.node_reservation_s``) and the pool's forecast holds it for its runtime (a
    checkpointable unit: a worthwhile segment). Its GPUs
    are taken from the pool then, and the nodes from then on (``_NodeRoom.reserve``): the
    units behind it backfill only what ends before, so single-node units cannot keep taking
    the whole nodes it waits for. None: the nodes do not free up within the forecast (what the
    service's replicas hold on them is not forecast) or not soon enough, or the pool does not
    hold it then."""
    step = profile.step_s
    i0 = capacity.i0
    first = nodes.first_free(job, i0 + 1)
    if first is None or (first[1] - i0) * step > settings.node_reservation_s:
        return None
    chosen, ready = first
    whole = _runs_whole(job)
    need_steps, min_steps = _run_steps(job, job.runtime_s, whole, settings, step)
    start = _hold_earliest(capacity, capacity.array(whole), ready, job.gpus, need_steps,
                           min_steps, whole)
    if start is None:
        return None
    nodes.reserve(chosen, start)
    start_at = profile.time_at(start)
    names = ", ".join(nodes.names[i] for i in chosen)
    return Decision(
        Action.DEFER, job.id, job.gpus,
        f"{why}; node{'s' if len(chosen) > 1 else ''} {names} reserved for it from "
        f"{start_at:%Y-%m-%d %H:%M} UTC", start_at=start_at)


def _admit_now(job: WaitingJob, gpus: int, whole: bool, now: datetime, profile: FreeProfile,
               capacity: _Availability, settings: PolicySettings) -> tuple[Decision, int] | None:
    """Admit ``job`` on ``gpus`` GPUs now if they stay free long enough (taking them): the
    admission and the step its GPUs come back."""
    step = profile.step_s
    i0 = capacity.i0
    runtime_s = job.runtime_s * job.gpus / gpus
    need_steps, min_steps = _run_steps(job, runtime_s, whole, settings, step)
    if i0 + min_steps > len(capacity.values):
        return None
    fewer = "" if gpus == job.gpus else (
        f"{gpus} of its {job.gpus} GPUs ({job.gpus} do not fit now; it may run on "
        f"{job.min_gpus}): "
    )
    run = capacity.run_from_now(gpus, whole)
    if run >= need_steps:
        capacity.take(i0, i0 + need_steps, gpus)
        return Decision(Action.ADMIT, job.id, gpus,
                        f"{fewer}{gpus} GPUs stay free for its {_hours(runtime_s)}"), i0 + need_steps
    if not whole and run >= min_steps:
        capacity.take(i0, i0 + run, gpus)
        stop_by = profile.time_at(i0 + run) - timedelta(seconds=settings.grace_s)
        return Decision(
            Action.ADMIT, job.id, gpus,
            f"{fewer}a {_hours((stop_by - now).total_seconds())} segment of its "
            f"{_hours(runtime_s)} fits; checkpoints and stops before the window closes",
            stop_by=stop_by,
        ), i0 + run
    return None


def _runs_whole(job: WaitingJob) -> bool:
    """Whether ``job`` must run its whole runtime at once: it cannot checkpoint, or has used
    up its preemptions."""
    return not job.checkpointable or (
        job.max_preemptions is not None and job.preemptions >= job.max_preemptions)


def _run_steps(job: WaitingJob, runtime_s: float, whole: bool, settings: PolicySettings,
               step: int) -> tuple[int, int]:
    """Steps ``job`` needs for ``runtime_s`` plus the grace period, and the fewest worth
    starting it for (the same when it runs whole; else a worthwhile segment)."""
    need_steps = _steps(runtime_s + settings.grace_s, step)
    if whole:
        return need_steps, need_steps
    return need_steps, _steps(min(runtime_s, _min_segment_s(job, settings)) + settings.grace_s,
                              step)


def _hold_earliest(capacity: _Availability, avail: np.ndarray, earliest: int, gpus: int,
                   need_steps: int, min_steps: int, whole: bool) -> int | None:
    """A reservation's GPUs: from the first step at or after ``earliest`` that opens
    ``min_steps`` with ``gpus`` available, taken for its run (whole: all ``need_steps``; else
    as long as they stay available, up to that). The step, or None: nothing opens."""
    start = _earliest_fit(avail, earliest, gpus, min_steps)
    if start is None:
        return None
    length = need_steps if whole else min(need_steps, _run_length(avail, start, gpus))
    capacity.take(start, start + length, gpus)
    return start


def _notice_s(job: RunningJob) -> float:
    """The notice a unit gets before a planned stop (only units that checkpoint get one)."""
    return job.notice_s if job.checkpointable and job.notice_s > 0 else 0.0


def _min_segment_s(job: WaitingJob | RunningJob, settings: PolicySettings) -> float:
    """The shortest segment worth starting for a checkpointable unit: ``min_segment_s``, and
    at least one checkpoint interval (a shorter one would save nothing: a stop's SIGTERM is
    no checkpoint)."""
    return max(settings.min_segment_s, job.checkpoint_interval_s or 0.0)


def _run_length(avail: np.ndarray, start: int, gpus: int) -> int:
    """Steps from ``start`` during which at least ``gpus`` GPUs stay available."""
    short = np.flatnonzero(avail[start:] < gpus)
    return int(short[0]) if short.size else len(avail) - start


def _earliest_fit(avail: np.ndarray, start: int, gpus: int, steps: int) -> int | None:
    """First step from ``start`` opening ``steps`` consecutive steps with ``gpus`` available."""
    if start + steps > len(avail):
        return None
    ok = np.concatenate([[0], np.cumsum(avail[start:] >= gpus)])
    full = np.flatnonzero(ok[steps:] - ok[:-steps] == steps)
    return int(full[0]) + start if full.size else None


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
        missing_signals_preempt_after_s=(
            None if admission.missing_signals_preempt_after_seconds is None
            else float(admission.missing_signals_preempt_after_seconds)
        ),
        max_forecast_age_s=float(admission.max_forecast_age_seconds),
        restart_cost_s=float(admission.restart_cost_seconds),
        nowcast_half_life_s=float(admission.nowcast_half_life_seconds),
        node_reservation_s=float(admission.node_reservation_seconds),
    )
