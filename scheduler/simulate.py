"""Replay a pool history and a job trace through ``decide()`` to measure admission policies.

The simulated cluster follows the real pool's service usage step by step (the replica counts
of the history) and the service always wins: when it needs GPUs that jobs hold, those jobs are
evicted and get their grace period, and the service waits for it (counted as service delay).
Jobs progress while they run; a checkpointable job saves its progress every checkpoint
interval and when it is stopped as planned at the end of its window; an unplanned preemption
loses what was not saved, and a job that cannot checkpoint loses everything (it has nothing to
save, so it gets no grace period: its GPUs come back at once).

Policies, all driven by the same ``decide()``:

* ``night``: the fixed 20:00-08:00 local window of the original operator: whatever is free when
  a job is considered is assumed free until 08:00;
* ``reactive``: start whenever GPUs are free now, assuming they stay free; the live backstop
  preempts when the service needs them;
* ``forecast``: ours: the free-GPU profile of the ``auto`` forecaster at the configured
  confidence, refreshed every evening from the history before that moment only;
* ``oracle``: ours with perfect knowledge: the actual future replicas in place of the
  forecast, and every unit's true runtime in place of its estimate. It plans as ``forecast``
  does (a unit starts only where it fits), so it is no upper bound: admitting more and
  stopping often can harvest more;
* ``clairvoyant``: the reference that bounds them: it knows the true replicas and runtimes and
  **checkpoints at will**: any unit, stopped at any step, saves all it has done in its grace
  period. Its own plan reads the true future as the oracle does, sees every unit as one that
  checkpoints (any window of a step worth using), and stops the units in the service's way a
  grace period before the service needs their GPUs, so it loses nothing and never delays the
  service. It plays the best of three plans by the work done: that one, reactive's admissions
  with its stops, and the oracle's (it may follow either), so it is never below the oracle.
  ``work_gpu_hours`` is the work done and kept; useful GPU-hours (held minus lost, the
  report's definition) count a planned stop's grace period as held, so where a trace runs dry
  a policy that stops more often can be credited more useful, never more work, and
  ``physical_limit_gpu_hours`` bounds the work.

**Gaps** in the replica history (a metrics outage) are treated as the daemon treats missing
live signals: no signals, so no admission, and every job stops once they have been missing for
``missing_signals_preempt_after``; the oracle's future has holes there (nothing is admitted
into them). Gap hours never count as idle (``unobserved_hours`` reports them); through a gap the
simulated cluster assumes the service stays where it was last seen.

**Elastic jobs** (``min_gpus`` below ``gpus``) may be admitted on fewer GPUs and shrunk
while they run: a shrink is a stop and a restart (the work since the last periodic checkpoint
is lost, as at any stop, unless ``saves_on_stop``), holds its GPUs through the grace
period, then runs on at the smaller size. A job on ``n`` of its ``gpus`` GPUs does
``n / gpus`` seconds of work per second (linear scaling), so useful and lost GPU-hours are
counted in GPU-seconds whatever the size (``shrinks`` counts the shrinks).

**Overruns**: a unit running past its estimate is given the remaining work of
``Overruns.remaining_s`` (learnt online from the units that finished so far), not one step.

**Placement** (``placement``): ``pool`` (the default) counts GPUs for the pool as one bin, as
above. ``spread`` and ``binpack`` put the cluster on the nodes of ``pool.nodes``: the
services' replicas are placed step by step by ``idlegpu.forecast.nodes.ServicePlacement`` (the
kube-scheduler's ``LeastAllocated`` or ``MostAllocated`` scoring for scale-ups, the ReplicaSet
controller's ranking for scale-downs; the state carries over, replicas never move), every
policy gets a ``NodeView`` of the simulated nodes each step and ``decide(..., nodes=view)``
places units on the nodes really free, and a unit bigger than the largest node that splits
into whole nodes is a multi-node (gang) unit of that many pods. Every unit's pods are pinned
to the nodes ``decide()`` counted on (``Decision.nodes``, as the daemon's Jobs are), so the
whole nodes it reserves for a gang stay free for it. A scale-up lands where jobs
are not; where no node has room, the replica evicts jobs on one node (kube-scheduler
preemption) and waits for their grace period, nominated there: its GPUs count as service
delay, as a pool-level shortfall does. A replica no node could hold even without jobs is not
delay (``service_unplaced_gpu_hours``). Evicting one pod of a multi-node unit stops the
whole unit.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any, cast

import numpy as np
import pandas as pd

from idlegpu.forecast.calendar import wall_clock
from idlegpu.forecast.capacity import FREE, IN_USE, pool_usage
from idlegpu.forecast.models import CACHED_MODELS
from idlegpu.forecast.nodes import STRATEGIES, ServicePlacement
from idlegpu.forecast.schema import DS, KV_CACHE_USAGE, REPLICAS, UNIQUE_ID, Y, metric_rows
from idlegpu.scheduler.config import Settings
from idlegpu.scheduler.policy import decide, policy_settings
from idlegpu.scheduler.refresh import Refresher, same_forecasts
from idlegpu.scheduler.replay import WAITING_PER_REPLICA, serving_pressure
from idlegpu.scheduler.types import (
    NIGHT_HOURS,
    Action,
    FreeProfile,
    NodeView,
    Overruns,
    PolicySettings,
    RunningJob,
    ServingSignals,
    WaitingJob,
)

POLICIES = ("night", "reactive", "forecast", "oracle", "clairvoyant")
CLAIRVOYANT = "clairvoyant"
# the clairvoyant's own plans (beside the oracle's): on the true future, and on the present
_CLAIRVOYANT_NOW = "clairvoyant on the present"
_CLAIRVOYANT_PLANS = ("clairvoyant on the future", _CLAIRVOYANT_NOW)
POOL = "pool"
PLACEMENTS = (POOL, *STRATEGIES)
EVICTION = "eviction"  # a stop's cause: the service took GPUs that jobs held
CAUSE_NAMES = {
    "window": "planned stop: window closed",
    # the free-GPU profile falls short within the grace period: the forecast's for the
    # forecast policy, the GPUs free now for reactive and night
    "forecast": "planned stop: profile falls short",
    "live": "backstop preemption",
    "signals": "live signals missing",
    EVICTION: "scheduler eviction",
}


@dataclass(frozen=True)
class SimJob:
    """One job unit of a trace, with the truth the policy does not know (``work_s``)."""

    id: str
    team: str
    kind: str
    gpus: int
    submit_at: datetime
    work_s: float
    """Seconds of work it really needs."""
    estimate_s: float
    """What the admitter plans with (runtime estimate at the configured quantile)."""
    checkpointable: bool
    checkpoint_interval_s: float = 1800.0
    priority: int = 0
    deadline: datetime | None = None
    max_preemptions: int | None = None
    depends_on: tuple[str, ...] = ()
    min_gpus: int | None = None
    """Elastic: the fewest GPUs it can run on (None: ``gpus`` only); on fewer GPUs its work
    goes proportionally slower."""
    nodes: int = 1
    """Pods of a multi-node (gang) unit, one per whole node (set by a simulation on nodes)."""
    saves_on_stop: bool = False
    """It saves all it did when told to stop (``checkpoint.saves_on_stop``): a planned stop
    loses it nothing."""

    def as_waiting(self, *, runtime_s: float | None = None, preemptions: int = 0) -> WaitingJob:
        """What the policy sees of it in the queue (by default: never started)."""
        return WaitingJob(
            id=self.id, team=self.team, gpus=self.gpus,
            runtime_s=self.estimate_s if runtime_s is None else runtime_s,
            checkpointable=self.checkpointable, priority=self.priority,
            submitted_at=self.submit_at, deadline=self.deadline, preemptions=preemptions,
            max_preemptions=self.max_preemptions, kind=self.kind, min_gpus=self.min_gpus,
            checkpoint_interval_s=self.checkpoint_interval_s if self.checkpointable else None,
            **({"nodes": self.nodes} if self.nodes != 1 else {}),
        )


@dataclass
class _Job:
    spec: SimJob
    saved_s: float = 0.0
    progress_s: float = 0.0  # work since the last checkpoint of the current attempt
    # (work is counted in seconds at the full size: on n of g GPUs, n / g per second)
    gpus: int = 0  # what the current (or last) attempt holds
    resume_gpus: int | None = None  # a shrink under way: restarts on these after its grace
    resume_stop_by: datetime | None = None  # ... and must stop by then (None: runs on)
    running: bool = False
    releasing_until: datetime | None = None
    started_at: datetime | None = None
    last_checkpoint_at: datetime | None = None
    stop_by: datetime | None = None
    first_start: datetime | None = None
    finished_at: datetime | None = None
    preemptions: int = 0
    lost_s: float = 0.0
    where: dict[int, int] = field(default_factory=dict)
    """On nodes: the GPUs the current (or last) attempt holds on each node (by index)."""
    notice_until: datetime | None = None
    """A planned stop with notice under way: it works on until then (its answer, or the
    deadline when it never answers), then leaves (``_end_notice``)."""
    notice_answers: bool = False
    notice_close: tuple[str, bool] | None = None  # the stop's (cause, overran), closed later
    queued_view: tuple[tuple[float, int, int], WaitingJob] | None = None
    """The last ``as_waiting`` of it, with the (saved work, preemptions) it was made for: the
    replay asks every step, and it changes only when those do."""


@dataclass(frozen=True)
class SimResult:
    policy: str
    metrics: dict[str, float]
    runs: pd.DataFrame  # one row per attempt
    delays: pd.DataFrame = field(default_factory=lambda: _delay_table([]))
    """One row per step the service waited for GPUs research units held: when, how many
    GPUs it waited for (their sum times the step is ``service_delay_gpu_minutes``) and how
    many GPUs more the service used than one step before (``delay_events`` groups them)."""


def _delay_table(delays: list[tuple[datetime, float, float]]) -> pd.DataFrame:
    return pd.DataFrame({"time": pd.to_datetime([d[0] for d in delays], utc=True),
                         "gpus_short": np.array([d[1] for d in delays], dtype=float),
                         "service_rise_gpus": np.array([d[2] for d in delays], dtype=float)})


def delay_events(delays: pd.DataFrame, step_s: int, headroom_gpus: float) -> pd.DataFrame:
    """A simulation's service delay (``SimResult.delays``) as events: each run of
    consecutive steps the service waited, from its first step, with its GPU-minutes, the
    service's rise over the step that opened it and whether that rise was above the pool's
    headroom. A rise above the headroom within one step meets whatever GPUs research holds:
    only GPUs left idle beyond the headroom, or a forecast of that very step, absorb it."""
    columns = ["start", "steps", "gpu_minutes", "opening_rise_gpus", "above_headroom"]
    if delays.empty:
        return pd.DataFrame(columns=columns)
    times = pd.to_datetime(delays["time"], utc=True)
    new = times.diff() != pd.Timedelta(seconds=step_s)
    event = new.cumsum()
    grouped = delays.assign(event=event.to_numpy()).groupby("event", sort=True)
    out = pd.DataFrame({
        "start": grouped["time"].first().to_numpy(),
        "steps": grouped.size().to_numpy(),
        "gpu_minutes": (grouped["gpus_short"].sum() * step_s / 60).to_numpy(),
        "opening_rise_gpus": grouped["service_rise_gpus"].first().to_numpy(),
    })
    out["above_headroom"] = out["opening_rise_gpus"] > headroom_gpus
    return out[columns]


@dataclass
class _Run:
    rows: list[dict] = field(default_factory=list)

    def close(self, job: _Job, end: datetime, outcome: str, lost_s: float, *,
              cause: str = "", overran: bool = False, notice: str = "",
              notice_saved_s: float = 0.0) -> None:
        start = job.started_at
        assert start is not None
        hours = (end - start).total_seconds() / 3600
        self.rows.append(
            {
                "job_id": job.spec.id, "team": job.spec.team, "kind": job.spec.kind,
                "gpus": job.gpus, "start": start, "end": end, "outcome": outcome,
                "gpu_hours": job.gpus * hours,
                "lost_gpu_hours": job.spec.gpus * lost_s / 3600,  # full-size work seconds
                # a stop's cause (STOP_CAUSES, or "eviction": the service took the GPUs),
                # whether the unit had run past its planned runtime, and whether it saves
                "cause": cause, "overran": overran,
                "checkpointable": job.spec.checkpointable,
                # a planned stop told ahead: answered, missed (stopped at the deadline) or cut
                # (the service first), and what the answer saved that a blind stop loses
                "notice": notice,
                "notice_saved_gpu_hours": job.spec.gpus * notice_saved_s / 3600,
                # on nodes: where its pods ran (NodeView.of_shapes names)
                **({"nodes": ",".join(f"node-{i}" for i in sorted(job.where))}
                   if job.where else {}),
            }
        )


class _PoolTimeline:
    """The actual pool, step by step: service GPUs, free GPUs and live signals."""

    def __init__(self, history: pd.DataFrame, settings: Settings, start: datetime, end: datetime):
        usage = pool_usage(history, settings)  # NaN wherever a service's replicas are unknown
        self.step = usage.index[1] - usage.index[0]
        self.index = usage.index[(usage.index >= start) & (usage.index < end)]
        if len(self.index) < 2:
            raise ValueError("the simulation period is not covered by the history")
        here = usage.loc[self.index]
        self.observed = here[IN_USE].notna().to_numpy()
        # the cluster itself goes on through a gap: the service as it was last seen
        self.service_gpus = usage[IN_USE].ffill().bfill().loc[self.index].to_numpy()
        self.free_now = here[FREE].to_numpy()  # NaN in a gap
        self.free_all = usage[FREE].to_numpy()  # for the oracle: the actual future, with holes
        self.offset = int(usage.index.get_loc(self.index[0]))
        wide = history.pivot(index=DS, columns=UNIQUE_ID, values=Y).reindex(usage.index).ffill()
        pressure = serving_pressure(wide, settings).loc[self.index]
        self.kv = pressure[KV_CACHE_USAGE].to_numpy()
        self.waiting = pressure[WAITING_PER_REPLICA].to_numpy()
        self.step_s = int(self.step.total_seconds())
        self.free_gpu_hours = float(np.nansum(self.free_now) * self.step_s / 3600)
        self.unobserved_hours = float((~self.observed).sum() * self.step_s / 3600)
        self.lendable = float(settings.pool.lendable_gpus)
        # the replicas each service runs (as last seen through a gap), for placing them
        self.replicas = np.column_stack([
            (usage[s.name] / s.gpus_per_replica).ffill().bfill().loc[self.index].to_numpy()
            for s in settings.services
        ]).round().astype(np.int64)


def simulate(
    history: pd.DataFrame,
    settings: Settings,
    jobs: Sequence[SimJob],
    policy: str,
    *,
    start: datetime,
    end: datetime,
    horizon: timedelta = timedelta(hours=48),
    refresh_hour: int = 17,
    policy_config: PolicySettings | None = None,
    forecast_profiles: dict[datetime, FreeProfile] | None = None,
    on_refresh: Callable[[int, int], None] | None = None,
    on_step: Callable[[int, int], None] | None = None,
    placement: str = POOL,
    deletion_cost: bool = False,
    forecast_cache: dict | None = None,
    saves_on_stop: bool = False,
    checkpoint_notice_s: float = 0.0,
    notice_answer_s: float = 120.0,
    unanswered_share: float = 0.0,
) -> SimResult:
    """Run one policy over ``[start, end)``; see the module docstring. ``placement``: ``pool``,
    ``spread`` or ``binpack`` (on ``pool.nodes``; ``deletion_cost``: the scale-downs empty the
    least-used nodes first, see ``idlegpu.forecast.nodes``). ``forecast_cache``: shared by
    runs on the same history (the forecaster's backtest replays do not depend on the
    confidence, so a sweep over it refits them once). ``saves_on_stop``: model workloads that
    save their progress when told to stop (SIGTERM) in the grace period; by default, as for
    a blind SIGTERM, a planned stop keeps only what the periodic checkpoints saved (each
    job's own ``SimJob.saves_on_stop`` counts either way). ``checkpoint_notice_s``: planned
    stops of checkpointing units come with that much notice (the cooperative checkpoint; 0:
    blind SIGTERMs): the unit works on, saves and answers ``notice_answer_s`` after the
    notice, losing nothing, and its GPUs are back at once; a share ``unanswered_share`` of
    the units (picked by their id) never answers, and is stopped blind at the deadline. The
    policy decides their planned stops a notice earlier; the service cuts a notice short when
    it needs the GPUs now (a blind stop then)."""
    if not 0.0 <= unanswered_share <= 1.0:
        raise ValueError(f"unanswered_share must be between 0 and 1, got {unanswered_share}")
    if checkpoint_notice_s < 0 or notice_answer_s < 0:
        raise ValueError("checkpoint_notice_s and notice_answer_s must not be negative")
    if saves_on_stop:
        jobs = [replace(j, saves_on_stop=True) if j.checkpointable else j for j in jobs]
    if policy not in POLICIES and policy not in _CLAIRVOYANT_PLANS:
        raise ValueError(f"unknown policy {policy!r}; choose from {', '.join(POLICIES)}")
    if policy == CLAIRVOYANT:
        # the clairvoyant may play its own plan, reactive's admissions with its own stops
        # (which lose nothing and never delay the service), or the oracle's (it knows all the
        # oracle knows): it does the most work of the three, so it is never below the oracle
        # and, in practice, not below reactive either
        names = (*_CLAIRVOYANT_PLANS, "oracle")

        def part(offset: int) -> Callable[[int, int], None] | None:
            return None if on_step is None else (
                lambda k, n: on_step(offset * n + k, len(names) * n))

        plans = [simulate(history, settings, jobs, name, start=start, end=end, horizon=horizon,
                          refresh_hour=refresh_hour, policy_config=policy_config,
                          on_step=part(n), placement=placement, deletion_cost=deletion_cost)
                 for n, name in enumerate(names)]
        best = max(plans, key=lambda r: r.metrics["work_gpu_hours"])
        return SimResult(CLAIRVOYANT, best.metrics, best.runs, best.delays)
    if placement not in PLACEMENTS:
        raise ValueError(f"unknown placement {placement!r}; choose from {', '.join(PLACEMENTS)}")
    on_nodes = placement != POOL
    if on_nodes and not settings.pool.nodes:
        raise ValueError(f"placement {placement!r} needs the pool's node shapes: set pool.nodes "
                         "in the config, e.g. [{gpus: 8, count: 11}]")
    config = policy_config or policy_settings(settings.admission, settings.pool.headroom_gpus,
                                              settings.pool.total_gpus)
    present = policy == _CLAIRVOYANT_NOW  # the clairvoyant's stops on reactive's admissions
    clairvoyant = policy in _CLAIRVOYANT_PLANS
    oracle = policy == "oracle" or clairvoyant  # they know the true runtimes
    if oracle:
        # it knows the future: no need to cap new jobs at what is idle now for an hour
        # (beyond the present step, where GPUs still held in a grace period count), and it
        # knows when each running job ends
        config = replace(config, live_cap_s=0.0, runtimes_known=True)
    if policy != "forecast":
        # the live correction is of a forecast; the others plan on the present or the truth
        config = replace(config, nowcast_half_life_s=0.0)
    pool = _PoolTimeline(history, settings, start, end)
    step_s, total = pool.step_s, settings.pool.total_gpus
    if clairvoyant:
        # every unit may stop at any step without loss: any window of a step is worth using
        config = replace(config, min_segment_s=float(step_s))
    cluster = _Nodes(settings, placement, deletion_cost) if on_nodes else None
    if cluster is not None:
        jobs = [cluster.split(j) for j in jobs]
    capacity = settings.pool.lendable_gpus
    horizon_steps = int(horizon.total_seconds() // step_s)
    until_morning = (_steps_until_morning(pool.index, settings.pool.timezone, step_s)
                     if policy == "night" else None)
    unplaced_gpu_min = 0.0
    unbound = 0  # admissions whose pod no node could bind (on nodes)
    state = {j.id: _Job(j) for j in sorted(jobs, key=lambda j: (j.submit_at, j.id))}
    pending = list(state.values())  # in submission order
    runs = _Run()
    usage_log: list[tuple[datetime, str, float]] = []
    delay_gpu_min = 0.0
    delays: list[tuple[datetime, float, float]] = []
    profile: FreeProfile | None = None
    planned_stops = 0
    shrinks = 0
    notices = notices_answered = 0
    notice_saved_gpu_h = 0.0

    def notice_of(job: _Job) -> tuple[float, bool] | None:
        """The notice a planned stop of ``job`` comes with: (seconds it works on, answers)."""
        if (checkpoint_notice_s <= 0 or clairvoyant or not job.spec.checkpointable
                or job.spec.saves_on_stop):
            return None
        answers = zlib.crc32(job.spec.id.encode()) % 10_000 >= unanswered_share * 10_000
        if answers and notice_answer_s <= checkpoint_notice_s:
            return notice_answer_s, True
        return checkpoint_notice_s, False
    grace = timedelta(seconds=config.grace_s)
    grace_steps = int(np.ceil(config.grace_s / step_s))
    overruns = Overruns(quantile=settings.admission.runtime_quantile)  # learnt as units finish
    last_seen: datetime | None = None  # the newest step with live signals
    if policy == "forecast" and forecast_profiles is None:
        forecast_profiles = forecast_profiles_for(history, settings, pool.index, refresh_hour,
                                                  horizon, on_refresh=on_refresh,
                                                  cache=forecast_cache)

    arrivals = iter(pending)
    upcoming = next(arrivals, None)
    live: list[_Job] = []  # arrived and not finished
    for k, now in enumerate(pool.index):
        now = now.to_pydatetime()
        while upcoming is not None and upcoming.spec.submit_at <= now:
            live.append(upcoming)
            upcoming = next(arrivals, None)
        # 1. progress, checkpoints, completions, releases
        finished = False
        for job in live:
            if not job.running:
                continue
            if job.releasing_until is None or job.notice_until is not None:
                worked = step_s if job.notice_until is None else min(step_s, max(
                    0.0, (job.notice_until - now).total_seconds() + step_s))
                job.progress_s += worked * _rate(job)
                if job.saved_s + job.progress_s >= job.spec.work_s:
                    job.saved_s, job.progress_s = job.spec.work_s, 0.0
                    job.running, job.finished_at = False, now
                    finished = True
                    if job.notice_until is not None:  # it finished before it had to stop
                        job.notice_until = job.notice_close = job.releasing_until = None
                        job.resume_gpus = None
                    if job.spec.estimate_s > 0:
                        overruns = overruns.with_ratio(job.spec.work_s / job.spec.estimate_s)
                    runs.close(job, now, "finished", 0.0)
                    usage_log.append((now, job.spec.team, job.gpus
                                      * (now - job.started_at).total_seconds() / 3600))
                elif job.spec.checkpointable and job.last_checkpoint_at is not None and (
                    now - job.last_checkpoint_at
                ).total_seconds() >= job.spec.checkpoint_interval_s:
                    job.saved_s += job.progress_s
                    job.progress_s = 0.0
                    job.last_checkpoint_at = now
                if job.notice_until is not None and now >= job.notice_until:
                    notices_answered += job.notice_answers
                    notice_saved_gpu_h += (job.progress_s * job.spec.gpus / 3600
                                           if job.notice_answers else 0.0)
                    _end_notice(job, runs)
            if (job.running and job.releasing_until is not None and job.notice_until is None
                    and now >= job.releasing_until):
                job.running, job.releasing_until = False, None
                if job.resume_gpus is not None:  # a shrink: it restarts on fewer GPUs
                    if job.where:  # on the node it ran on
                        job.where = {next(iter(job.where)): job.resume_gpus}
                    job.running, job.gpus, job.resume_gpus = True, job.resume_gpus, None
                    job.started_at = job.last_checkpoint_at = now
                    job.stop_by, job.progress_s = job.resume_stop_by, 0.0
        if finished:
            live = [j for j in live if j.finished_at is None]
        # 2. the service takes what it needs; evictions if jobs are in the way
        held = releasing = 0
        for job in live:
            if job.running:
                held += job.gpus
                if job.releasing_until is not None:
                    releasing += job.gpus - (job.resume_gpus or 0)
        service = pool.service_gpus[k]
        rise = float(service - pool.service_gpus[k - 1]) if k else 0.0
        if clairvoyant and cluster is None:
            # it sees the service's need a grace period ahead: the units in its way save all
            # they have done and leave, their GPUs back just as the service needs them
            ahead = float(pool.service_gpus[k : k + grace_steps + 1].max())
            need = ahead + held - total - releasing
            if need > 0:
                until = now + grace
                for victim in _evict([j for j in live if j.running and not _ends_by(
                        j, now, until, step_s)], need):
                    _stop(victim, now, grace, planned=True, runs=runs, cause=EVICTION,
                          at_will=True)
                    releasing += victim.gpus
        if cluster is None:
            # the service waits only for GPUs jobs hold: a service above the whole pool is
            # short of more, which no policy could have given it
            short = min(float(held), max(0.0, service + held - total))
            if short > 0:
                # the service needs GPUs now: notices under way are cut short (blind stops)
                for job in live:
                    if job.running and job.notice_until is not None:
                        job.notice_until, job.notice_answers = now, False
                        job.releasing_until = now + grace
                        _end_notice(job, runs, cut=True)
                delay_gpu_min += short * step_s / 60
                delays.append((now, short, rise))
                for victim in _evict(live, short - releasing):
                    _stop(victim, now, grace, planned=False, runs=runs, cause=EVICTION)
                    releasing += victim.gpus  # on their way back: not short any more
            idle = total - service - held
        else:
            # the replicas land where jobs are not, or evict the jobs of one node and wait
            for victim in cluster.scale(k * step_s, pool.replicas[k], live):
                # (the clairvoyant's evicted GPUs come back at the next step: the replica
                # placement nominates them for this one)
                _stop(victim, now, grace, planned=clairvoyant, runs=runs, cause=EVICTION,
                      at_will=clairvoyant)
            waiting = float(cluster.placement.nominated.sum())
            delay_gpu_min += waiting * step_s / 60
            if waiting > 0:
                delays.append((now, waiting, rise))
            unplaced_gpu_min += cluster.placement.unplaced_gpus * step_s / 60
            coming = sum(j.gpus - (j.resume_gpus or 0) for j in live
                         if j.running and j.releasing_until is not None)
            short, releasing = waiting, coming
            idle = cluster.room(live).sum()
        if pool.observed[k]:
            last_seen = now
            signals = ServingSignals(
                observed_at=now,
                requests_waiting_per_replica=float(pool.waiting[k]),
                kv_cache_usage=float(pool.kv[k]),
                gpus_short=int(max(0.0, short - releasing)),
                idle_gpus=int(max(0.0, idle)),
                service_gpus=int(round(service)),
            )
        else:  # a gap: as the daemon sees it, the signals are missing since the last reading
            signals = ServingSignals(observed_at=None, missing_since=last_seen)
        # 3. what the policy sees
        queue = _waiting(live, state, step_s, overruns, oracle=oracle, at_will=clairvoyant)
        running = [_running(j, step_s, overruns, oracle=oracle, at_will=clairvoyant,
                            notice_s=checkpoint_notice_s)
                   for j in live if j.running and j.releasing_until is None]
        if not queue and not running:
            if on_step:
                on_step(k, len(pool.index))
            continue
        if policy == "forecast":
            profile = _latest(forecast_profiles, now) or profile
        elif oracle and not present:
            i = pool.offset + k
            profile = FreeProfile(start=now, step_s=step_s,
                                  free=pool.free_all[i : i + horizon_steps],
                                  confidence=1.0, made_at=now)
        else:
            free_now = max(0.0, capacity - service)
            steps = horizon_steps
            if until_morning is not None:
                steps = int(until_morning[k])
            profile = FreeProfile(start=now, step_s=step_s,
                                  free=np.full(max(steps, 1), free_now if steps else 0.0),
                                  confidence=0.0, made_at=now)
        if profile is None:
            continue
        window_start = now - timedelta(days=settings.admission.fair_share_days)
        while usage_log and usage_log[0][0] < window_start:
            usage_log.pop(0)
        team_usage: dict[str, float] = {}
        for _, team, hours in usage_log:
            team_usage[team] = team_usage.get(team, 0.0) + hours
        if cluster is None:
            plan = decide(now, profile, running, queue, signals, team_usage, config)
        else:
            plan = decide(now, profile, running, queue, signals, team_usage, config,
                          nodes=cluster.view(live, now))
        for d in plan.decisions:
            job = state[d.job_id]
            notice = (notice_of(job) if d.planned
                      and d.action in (Action.PREEMPT, Action.SHRINK) else None)
            notices += notice is not None
            if d.action is Action.PREEMPT:
                planned_stops += d.planned
                _stop(job, now, grace, planned=d.planned, runs=runs, cause=d.cause,
                      at_will=clairvoyant, notice=notice)
            elif d.action is Action.SHRINK:
                shrinks += 1
                _stop(job, now, grace, planned=d.planned, runs=runs, shrink_to=d.gpus,
                      cause=d.cause, at_will=clairvoyant, notice=notice)
                job.resume_stop_by = d.stop_by
            elif d.action is Action.ADMIT:
                if cluster is not None:
                    where = cluster.where(d, live)
                    if where is None:  # its pod would stay pending: it waits in the queue
                        unbound += 1
                        continue
                    job.where = where
                job.gpus = d.gpus
                job.running, job.started_at, job.last_checkpoint_at = True, now, now
                job.stop_by, job.progress_s = d.stop_by, 0.0
                job.first_start = job.first_start or now
        if on_step:
            on_step(k, len(pool.index))

    end_time = pool.index[-1].to_pydatetime()
    for job in state.values():
        if job.running and job.releasing_until is None:
            runs.close(job, end_time, "running", 0.0)
    frame = pd.DataFrame(runs.rows, columns=["job_id", "team", "kind", "gpus", "start", "end",
                                             "outcome", "gpu_hours", "lost_gpu_hours",
                                             "cause", "overran", "checkpointable",
                                             "notice", "notice_saved_gpu_hours",
                                             *(["nodes"] if cluster is not None else [])])
    # one definition of each figure, the report's, from the run table the report reads
    # (idlegpu.scheduler.reports.useful): a report on runs_<policy>.csv gives the same numbers
    from idlegpu.scheduler.reports import useful as useful_of

    useful = float(useful_of(frame).sum()) if len(frame) else 0.0
    lost = float(frame["lost_gpu_hours"].sum()) if len(frame) else 0.0
    lost_checkpointing = (float(frame.loc[frame["checkpointable"].astype(bool),
                                          "lost_gpu_hours"].sum()) if len(frame) else 0.0)
    waits = [(j.first_start - j.spec.submit_at).total_seconds() / 3600
             for j in state.values() if j.first_start is not None]
    # the work done and kept, whatever the GPU-hours held for it: finished, saved at a
    # checkpoint, or running at the end (a grace period spent checkpointing is no work)
    work = sum((j.saved_s + (j.progress_s if j.running and j.releasing_until is None else 0.0))
               * j.spec.gpus for j in state.values()) / 3600
    metrics = {
        "useful_gpu_hours": useful,
        "work_gpu_hours": work,
        "lost_gpu_hours": lost,
        "lost_checkpointing_gpu_hours": lost_checkpointing,  # of units that checkpoint
        "preemptions": float(sum(j.preemptions for j in state.values())),
        "planned_stops": float(planned_stops),
        "shrinks": float(shrinks),
        # planned stops told ahead (``checkpoint_notice_s``), those answered in time, and
        # the work the answers saved that a blind stop would have lost
        "notices": float(notices),
        "notices_answered": float(notices_answered),
        "notice_saved_gpu_hours": notice_saved_gpu_h,
        "service_delay_gpu_minutes": delay_gpu_min,
        "jobs_finished": float(sum(j.finished_at is not None for j in state.values())),
        # the units it could run: submitted by the end of the span (a backlog from before
        # its start included; the trace's later units not)
        "jobs": float(sum(j.spec.submit_at <= end_time for j in state.values())),
        "mean_queue_wait_hours": float(np.mean(waits)) if waits else float("nan"),
        "idle_gpu_hours": pool.free_gpu_hours,
        "idle_share_used": useful / pool.free_gpu_hours if pool.free_gpu_hours else float("nan"),
        "unobserved_hours": pool.unobserved_hours,
        "physical_limit_gpu_hours": _physical_limit(pool, jobs, config),
    }
    if cluster is not None:
        metrics["service_unplaced_gpu_hours"] = unplaced_gpu_min / 60
        metrics["admissions_unbound"] = float(unbound)
        # a gang starves where single-node units keep taking the nodes it needs: its wait
        # counts up to the end of the span when it never started
        gangs = [j for j in state.values() if j.spec.nodes > 1 and j.spec.submit_at <= end_time]
        metrics["gangs"] = float(len(gangs))
        metrics["gangs_finished"] = float(sum(j.finished_at is not None for j in gangs))
        metrics["gang_queue_wait_hours"] = float(np.mean([
            ((j.first_start or end_time) - j.spec.submit_at).total_seconds() / 3600
            for j in gangs])) if gangs else float("nan")
    return SimResult(policy, metrics, frame, _delay_table(delays))


class _Nodes:
    """The simulated nodes: the services' replicas (``ServicePlacement``) and the GPUs the
    jobs hold on each node."""

    def __init__(self, settings: Settings, strategy: str, deletion_cost: bool) -> None:
        base = NodeView.of_shapes(settings.pool.nodes)
        self.base = base.nodes
        self.index = {node.name: i for i, node in enumerate(self.base)}
        self.capacity = np.array([node.gpus for node in self.base], dtype=np.int64)
        # (an int64 array is what ServicePlacement makes of its node_gpus: it keeps this one)
        self.placement = ServicePlacement(cast("Sequence[int]", self.capacity),
                                          [s.gpus_per_replica for s in settings.services],
                                          strategy, deletion_cost=deletion_cost)
        self.largest = int(self.capacity.max())
        self._last: tuple[int, ...] | None = None
        self._requested: tuple[int, ...] | None = None
        self._view_nodes = self.base

    def split(self, job: SimJob) -> SimJob:
        """A unit bigger than the largest node that splits into whole nodes: one pod a node."""
        if job.gpus > self.largest and job.gpus % self.largest == 0 and job.nodes == 1:
            return replace(job, nodes=job.gpus // self.largest, min_gpus=None)
        return job

    def held(self, live: Sequence[_Job]) -> tuple[np.ndarray, np.ndarray]:
        """GPUs jobs hold on each node, and of those the ones in a grace period."""
        held = np.zeros(len(self.capacity), dtype=np.int64)
        releasing = np.zeros(len(self.capacity), dtype=np.int64)
        for job in live:
            if not job.running:
                continue
            for node, gpus in job.where.items():
                held[node] += gpus
                if job.releasing_until is not None:
                    kept = job.resume_gpus or 0 if len(job.where) == 1 else 0
                    releasing[node] += gpus - kept
        return held, releasing

    def room(self, live: Sequence[_Job]) -> np.ndarray:
        held, _ = self.held(live)
        p = self.placement
        return np.maximum(0, self.capacity - p.service_gpus - p.nominated - held)

    def scale(self, now_s: float, targets: np.ndarray, live: Sequence[_Job]) -> list[_Job]:
        """Place the services' replicas for this step; returns the jobs they evict."""
        target = tuple(int(t) for t in targets)
        p = self.placement
        if target == self._last and not p.nominated.any() and not p.unplaced_gpus:
            return []  # nothing changes (the common case)
        self._last = target
        held, releasing = self.held(live)
        # victims as the kube-scheduler would take them: lowest priority, newest first
        # (a running job has started: started_at is set)
        order = sorted((j for j in live if j.running and j.releasing_until is None),
                       key=lambda j: (j.spec.priority,
                                      -(cast(datetime, j.started_at).timestamp()), j.spec.id))
        on_node: list[list[_Job]] = [[] for _ in self.capacity]
        for job in order:
            for node in job.where:
                on_node[node].append(job)
        victims = [[j.where[node] for j in jobs] for node, jobs in enumerate(on_node)]
        evicted: dict[str, _Job] = {}
        for eviction in p.scale(now_s, target, held, releasing, victims):
            for job in on_node[eviction.node][:eviction.victims]:
                evicted.setdefault(job.spec.id, job)
        return list(evicted.values())

    def view(self, live: Sequence[_Job], now: datetime) -> NodeView:
        held, _ = self.held(live)
        requested = tuple(int(g) for g in
                          self.placement.service_gpus + self.placement.nominated + held)
        if requested != self._requested:  # most steps change nothing on the nodes
            self._requested = requested
            self._view_nodes = tuple(replace(node, gpus_requested=requested[i])
                                     for i, node in enumerate(self.base))
        return NodeView(self._view_nodes, observed_at=now)

    def where(self, decision, live: Sequence[_Job]) -> dict[int, int] | None:
        """The GPUs an admission takes on each node: its pods (a gang's GPUs split evenly) on
        the nodes ``decide()`` named, as the Job pins them. None: a node has not the room
        any more, so its pod would stay pending."""
        names = tuple(getattr(decision, "nodes", ()) or ()) or (decision.node,)
        if None in names:
            raise ValueError(f"decide() admitted {decision.job_id} on nodes without naming "
                             "the node")
        room = self.room(live)
        per_pod = decision.gpus // len(names)
        if any(room[self.index[name]] < per_pod for name in names):
            return None
        out: dict[int, int] = {}
        for name in names:
            out[self.index[name]] = out.get(self.index[name], 0) + per_pod
        return out


def _stop(job: _Job, now: datetime, grace: timedelta, *, planned: bool, runs: _Run,
          cause: str, shrink_to: int | None = None, at_will: bool = False,
          notice: tuple[float, bool] | None = None) -> None:
    """Start the grace period of a running job. A checkpointing job keeps what its periodic
    checkpoints saved and loses what it did since the last one: a stop's SIGTERM is no
    checkpoint (``SimJob.saves_on_stop``: workloads that save when told to stop, in the grace
    period, lose nothing at a planned stop). ``shrink_to``: a shrink, not a stop: after its
    grace period the job runs on with these GPUs (not a preemption either way). ``cause``:
    what stopped it (the run table's). ``at_will``: the clairvoyant's stop: any unit saves all
    it has done in its grace period. ``notice``: a planned stop told ahead, (seconds the unit
    works on, whether it answers): it saves and leaves at its answer, losing nothing, or is
    stopped blind when it never answers (``_end_notice`` closes it)."""
    overran = job.saved_s + job.progress_s > job.spec.estimate_s > 0
    if notice is not None and planned and job.spec.checkpointable and not at_will:
        works_s, answers = notice
        job.notice_until = now + timedelta(seconds=works_s)
        job.notice_answers = answers
        # an answer means it has saved: its pods exit at the SIGTERM that follows at once;
        # one that never answers is stopped at the deadline and gets its grace period
        job.releasing_until = job.notice_until + (timedelta(0) if answers else grace)
        job.notice_close = (cause, overran)
        job.stop_by = None
        job.resume_gpus = shrink_to
        return
    if at_will or (planned and job.spec.checkpointable and job.spec.saves_on_stop):
        job.saved_s += job.progress_s
        lost = 0.0
    else:
        lost = job.progress_s if job.spec.checkpointable else job.saved_s + job.progress_s
        if not job.spec.checkpointable:
            job.saved_s = 0.0
        job.preemptions += not planned and shrink_to is None
    job.lost_s += lost
    job.progress_s = 0.0
    # only a checkpointing job uses the grace period; the others are stopped at once
    job.releasing_until = now + (grace if job.spec.checkpointable or at_will
                                 else timedelta(0))
    job.stop_by = None
    job.resume_gpus = shrink_to
    outcome = "stopped" if planned or shrink_to is not None else "preempted"
    runs.close(job, job.releasing_until, outcome, lost, cause=cause, overran=overran)


def _end_notice(job: _Job, runs: _Run, *, cut: bool = False) -> None:
    """A planned stop's notice is over: answered, the unit has saved all it did; otherwise
    (no answer by the deadline, or the service cut it short: ``cut``) only its periodic
    checkpoints count, as at a blind stop."""
    outcome = "cut" if cut else "answered" if job.notice_answers else "missed"
    saved = job.progress_s if job.notice_answers else 0.0
    lost = 0.0 if job.notice_answers else job.progress_s
    job.saved_s += 0.0 if lost else job.progress_s
    job.lost_s += lost
    job.progress_s = 0.0
    cause, overran = job.notice_close or ("", False)
    job.notice_until = job.notice_close = None
    # a notice under way always has its release set with it (``_stop``, a cut)
    assert job.releasing_until is not None
    runs.close(job, job.releasing_until, "stopped", lost, cause=cause, overran=overran,
               notice=outcome, notice_saved_s=saved)


def _ends_by(job: _Job, now: datetime, when: datetime, step_s: int) -> bool:
    """Whether a running job finishes its true work by ``when`` (what the clairvoyant knows)."""
    left_s = (job.spec.work_s - job.saved_s - job.progress_s) / _rate(job)
    return now + timedelta(seconds=step_s * np.ceil(left_s / step_s)) <= when


def _evict(jobs, need: float) -> list[_Job]:
    """What the kube-scheduler evicts for the service: lowest priority, newest first."""
    if need <= 0:
        return []
    candidates = sorted(
        (j for j in jobs if j.running and j.releasing_until is None),
        key=lambda j: (j.spec.priority, -(j.started_at.timestamp()), j.spec.id),
    )
    chosen, freed = [], 0
    for job in candidates:
        if freed >= need:
            break
        chosen.append(job)
        freed += job.gpus
    return chosen


def _waiting(live: list[_Job], state: dict[str, _Job], step_s: int, overruns: Overruns, *,
             oracle: bool = False, at_will: bool = False) -> list[WaitingJob]:
    """What the policy sees of the queue (``at_will``: every unit as one that checkpoints,
    without a preemption limit: the clairvoyant's)."""
    out = []
    for job in live:
        spec = job.spec
        if job.running:
            continue
        if any(state[d].finished_at is None for d in spec.depends_on if d in state):
            continue
        # past its estimate, what it has left depends on what the others overran
        learnt = len(overruns.ratios) if job.saved_s >= spec.estimate_s and not oracle else 0
        key = (job.saved_s, job.preemptions, learnt)
        if job.queued_view is None or job.queued_view[0] != key:
            left = (spec.work_s - job.saved_s if oracle
                    else overruns.remaining_s(spec.estimate_s, job.saved_s))
            view = spec.as_waiting(runtime_s=max(step_s, left), preemptions=job.preemptions)
            if at_will:
                # (it saves at will: no interval bounds its segments)
                view = replace(view, checkpointable=True, max_preemptions=None,
                               checkpoint_interval_s=None)
            job.queued_view = (key, view)
        out.append(job.queued_view[1])
    return out


def _rate(job: _Job) -> float:
    """Seconds of (full-size) work per second at its current size: linear scaling."""
    return job.gpus / job.spec.gpus if job.spec.gpus and job.gpus else 1.0


def _running(job: _Job, step_s: int, overruns: Overruns, *, oracle: bool = False,
             at_will: bool = False, notice_s: float = 0.0) -> RunningJob:
    spec = job.spec
    done = job.saved_s + job.progress_s
    left = spec.work_s - done if oracle else overruns.remaining_s(spec.estimate_s, done)
    left /= _rate(job)  # on fewer GPUs the work left takes longer
    assert job.started_at is not None  # only running jobs are asked (set when admitted)
    return RunningJob(
        id=spec.id, team=spec.team, gpus=job.gpus, priority=spec.priority,
        started_at=job.started_at, checkpointable=spec.checkpointable or at_will,
        remaining_s=max(step_s, left),
        last_checkpoint_at=job.last_checkpoint_at, stop_by=job.stop_by, kind=spec.kind,
        min_gpus=spec.min_gpus, nodes=tuple(f"node-{i}" for i in sorted(job.where)),
        checkpoint_interval_s=(spec.checkpoint_interval_s
                               if spec.checkpointable and not at_will else None),
        saves_on_stop=spec.checkpointable and spec.saves_on_stop,
        notice_s=(notice_s if spec.checkpointable and not spec.saves_on_stop and not at_will
                  else 0.0),
    )


def _physical_limit(pool: _PoolTimeline, jobs: Sequence[SimJob], config: PolicySettings) -> float:
    """GPU-hours the job trace could use at all: each step's idle GPUs (the lendable GPUs the
    service leaves) filled from the work submitted by then and not yet done, ignoring GPU
    counts, dependencies, windows and restarts, so no policy harvests more. Of a gap, only
    what jobs may still hold before the missing signals stop them (the first
    ``missing_signals_preempt_after`` plus the grace period) counts."""
    step_s = pool.step_s
    usable = np.nan_to_num(pool.free_now, nan=0.0)
    after = config.missing_signals_preempt_after_s
    reach = float("inf") if after is None else after + config.grace_s + step_s
    seen = None
    for k in range(len(usable)):
        if pool.observed[k]:
            seen = k
        elif seen is not None and (k - seen) * step_s <= reach:
            usable[k] = max(0.0, pool.lendable - pool.service_gpus[k])
    arrivals = np.zeros(len(usable))
    for job in jobs:
        at = int(pool.index.searchsorted(pd.Timestamp(job.submit_at)))
        if at < len(usable):
            arrivals[at] += job.gpus * job.work_s / 3600
    backlog = used = 0.0
    hours = step_s / 3600
    for k in range(len(usable)):
        backlog += arrivals[k]
        take = min(usable[k] * hours, backlog)
        backlog -= take
        used += take
    return used


def _steps_until_morning(index: pd.DatetimeIndex, tz: str, step_s: int) -> np.ndarray:
    """Per step of ``index``: whole steps left until the night ends (0 by day)."""
    local = index.tz_convert(tz)
    start_h, end_h = NIGHT_HOURS
    evening = local.hour >= start_h
    wall = wall_clock(index, tz)
    morning = (wall.normalize() + pd.Timedelta(hours=end_h)
               + pd.to_timedelta(evening.astype(int), unit="D"))
    # by the wall clock, then back to real time: the night of a DST change is an hour shorter
    # or longer (end_h is never a time the change skips or repeats)
    morning = morning.tz_localize(tz, ambiguous=np.zeros(len(morning), dtype=bool),
                                  nonexistent="shift_forward")
    steps = ((morning - local).total_seconds() // step_s).astype(int)
    return np.where(evening | (local.hour < end_h), steps, 0)


def _latest(profiles: dict[datetime, FreeProfile] | None, now: datetime) -> FreeProfile | None:
    if not profiles:
        return None
    made = [t for t in profiles if t <= now]
    return profiles[max(made)] if made else None


def forecast_profiles_for(history: pd.DataFrame, settings: Settings, index: pd.DatetimeIndex,
                          refresh_hour: int, horizon: timedelta, **options
                          ) -> dict[datetime, FreeProfile]:
    """The free-GPU profiles the ``forecast`` policy sees: one per evening (and one at the
    start), each fitted only on the history before it, by the daemon's refresh
    (``idlegpu.scheduler.refresh``: a service whose forecasts in use covered less than promised over
    the last week is planned with a wider quantile). ``options``: ``model``, ``on_refresh``
    and ``cache``, as ``pool_profiles_for`` takes them."""
    return pool_profiles_for(history, settings, (), index, refresh_hour, horizon,
                             **options)[0]


def pool_profiles_for(
    history: pd.DataFrame,
    settings: Settings,
    pools: Sequence[Settings],
    index: pd.DatetimeIndex,
    refresh_hour: int,
    horizon: timedelta,
    *,
    model: str = "auto",
    on_refresh: Callable[[int, int], None] | None = None,
    cache: dict | None = None,
) -> list[dict[datetime, FreeProfile]]:
    """``forecast_profiles_for`` of ``settings``, then of each of ``pools`` (the same pool
    but for its size and headroom, ``refresh.same_forecasts``) from the same refits: a what-if
    on the pool's size costs the pool arithmetic of each evening, not a refit."""
    for n, pool in enumerate(pools):
        if not same_forecasts(settings, pool):
            raise ValueError(f"pools[{n}] changes more than the pool's size and headroom; "
                             "forecast it with forecast_profiles_for")
    # the nightly refits only read replicas: filter the history once, not at every refit
    replicas = metric_rows(history, REPLICAS)
    local = index.tz_convert(settings.pool.timezone)
    refresh = sorted({index[0], *index[(local.hour == refresh_hour) & (local.minute == 0)]})
    # the refits see growing prefixes of one history: reuse their work
    cache = {} if cache is None else cache
    options: dict[str, Any] = {"cache": cache} if model in CACHED_MODELS else {}
    refresher = Refresher(settings, horizon=horizon, model=model, refresh_hour=refresh_hour,
                          **options)
    profiles: list[dict[datetime, FreeProfile]] = [{} for _ in range(1 + len(pools))]
    for n, at in enumerate(refresh):
        made = refresher.refresh(replicas, at.to_pydatetime())
        theirs = refresher.profiles_for(made, replicas, pools) if pools else []
        for mine, profile in zip(profiles, [made.profile, *theirs], strict=True):
            mine[at.to_pydatetime()] = profile
        if on_refresh:
            on_refresh(n + 1, len(refresh))
    return profiles


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
            out[name] = simulate(history, settings, jobs, name, start=start, end=end,
                                 **hooks, **options)
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
            references[name] = simulate(history, settings, jobs, name, start=start, end=end,
                                        **options).metrics
            if on_point:
                on_point(len(levels) + n + 1, total)
    for name, metrics in references.items():
        if name != "forecast":
            rows.append({"policy": name, "confidence": float("nan"),
                         **{k: metrics[k] for k in FRONTIER_METRICS}})
    return pd.DataFrame(rows, columns=["policy", "confidence", *FRONTIER_METRICS])


def lost_work(runs: pd.DataFrame, timezone: str) -> pd.DataFrame:
    """Where a policy lost its work: the lost GPU-hours and the stops that lost any, by cause
    (``CAUSE_NAMES``), by whether the unit had run past its planned runtime (``overran``), by
    whether it checkpoints, and by the local hour its attempt was admitted. One row per
    (``by``, ``value``), with ``share`` of all the lost GPU-hours."""
    columns = ["by", "value", "stops", "lost_gpu_hours", "share"]
    if runs.empty:
        return pd.DataFrame(columns=columns)
    lost = runs[runs["lost_gpu_hours"] > 0]
    total = float(lost["lost_gpu_hours"].sum())
    hour = pd.to_datetime(lost["start"], utc=True).dt.tz_convert(timezone).dt.hour
    views = {
        "cause": lost["cause"].map(lambda c: CAUSE_NAMES.get(c, c or "other")),
        "overran": lost["overran"].map({True: "past its planned runtime",
                                        False: "within its planned runtime"}),
        "checkpointable": lost["checkpointable"].map({True: "checkpointable",
                                                      False: "not checkpointable"}),
        "admission_hour": hour.map(lambda h: f"{h:02d}:00"),
    }
    rows = []
    for by, keys in views.items():
        grouped = lost.groupby(keys.to_numpy())["lost_gpu_hours"].agg(["count", "sum"])
        for value, row in grouped.sort_index().iterrows():
            rows.append({"by": by, "value": value, "stops": int(row["count"]),
                         "lost_gpu_hours": float(row["sum"]),
                         "share": float(row["sum"]) / total if total else float("nan")})
    return pd.DataFrame(rows, columns=columns)


def trace_jobs(entries, estimate: Callable[[object], float]) -> list[SimJob]:
    """Simulation jobs from a job trace (``specs.TraceEntry``): one per unit, ids
    ``<entry>-<name>-<step>-<member>``, ``estimate(unit)`` the seconds the admitter plans with."""
    jobs = []
    for n, entry in enumerate(entries):
        request = entry.request
        prefix = f"{n:04d}-{request.name}"
        for unit in entry.units():
            jobs.append(
                SimJob(
                    id=f"{prefix}-{unit.step_index}-{unit.member}",
                    team=request.team,
                    kind=unit.kind,
                    gpus=unit.gpus,
                    submit_at=entry.submit_at,
                    work_s=entry.actual_runtime_s(unit.step, unit.member),
                    estimate_s=float(estimate(unit)),
                    checkpointable=unit.checkpointable,
                    checkpoint_interval_s=unit.checkpoint_interval_s or 1800.0,
                    priority=unit.priority,
                    deadline=unit.deadline,
                    max_preemptions=unit.max_preemptions,
                    depends_on=tuple(f"{prefix}-{s}-{m}" for s, m in unit.depends_on),
                    min_gpus=unit.min_gpus,
                    saves_on_stop=unit.checkpointable and unit.saves_on_stop,
                )
            )
    return jobs


__all__ = ["CAUSE_NAMES", "PLACEMENTS", "POLICIES", "SWEEP_CONFIDENCES", "SimJob", "SimResult",
           "delay_events", "forecast_profiles_for", "lost_work", "pool_profiles_for", "simulate",
           "simulate_policies", "sweep",
           "trace_jobs"]
