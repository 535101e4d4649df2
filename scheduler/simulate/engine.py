"""One policy's run of the simulator: ``simulate()`` and its step loop (``_Simulation``); the
package's docstring describes the model and the policies."""

from __future__ import annotations

import zlib
from collections.abc import Callable, Sequence
from dataclasses import replace
from datetime import datetime, timedelta

import numpy as np
import pandas as pd

from idlegpu.scheduler.config import Settings
from idlegpu.scheduler.policy import decide, policy_settings
from idlegpu.scheduler.reports import useful as useful_of
from idlegpu.scheduler.simulate.choices import (
    _CLAIRVOYANT_NOW,
    _CLAIRVOYANT_PLANS,
    CLAIRVOYANT,
    PLACEMENTS,
    POLICIES,
    POOL,
)
from idlegpu.scheduler.simulate.jobs import (
    SimJob,
    _begin_attempt,
    _checkpoint,
    _end_notice,
    _ends_by,
    _evict,
    _Job,
    _rate,
    _running,
    _stop,
    _waiting,
    _working_s,
)
from idlegpu.scheduler.simulate.nodes import _Nodes
from idlegpu.scheduler.simulate.profiles import (
    HORIZON,
    REFRESH_HOUR,
    _latest,
    forecast_profiles_for,
)
from idlegpu.scheduler.simulate.results import (
    EVICTION,
    RUN_COLUMNS,
    SimResult,
    _delay_table,
    _Run,
)
from idlegpu.scheduler.simulate.timeline import (
    _physical_limit,
    _PoolTimeline,
    _steps_until_morning,
)
from idlegpu.scheduler.types import (
    Action,
    Decision,
    FreeProfile,
    Overruns,
    PolicySettings,
    ServingSignals,
    WaitingJob,
)


def simulate(
    history: pd.DataFrame,
    settings: Settings,
    jobs: Sequence[SimJob],
    policy: str,
    *,
    start: datetime,
    end: datetime,
    horizon: timedelta = HORIZON,
    refresh_hour: int = REFRESH_HOUR,
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
    restart_cost_s: float | None = None,
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
    it needs the GPUs now (a blind stop then). ``restart_cost_s``: what a unit resuming from
    a checkpoint spends reloading it, holding its GPUs and doing no work (lost work, of cause
    ``restart``; None: the config's ``admission.restart_cost_seconds``, 0: free restarts)."""
    if not 0.0 <= unanswered_share <= 1.0:
        raise ValueError(f"unanswered_share must be between 0 and 1, got {unanswered_share}")
    if checkpoint_notice_s < 0 or notice_answer_s < 0:
        raise ValueError("checkpoint_notice_s and notice_answer_s must not be negative")
    if restart_cost_s is None:
        restart_cost_s = float(settings.admission.restart_cost_seconds)
    if restart_cost_s < 0:
        raise ValueError(f"restart_cost_s must not be negative, got {restart_cost_s}")
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

        # it resumes at will too: from the state it saved, without a reload
        plans = [simulate(history, settings, jobs, name, start=start, end=end, horizon=horizon,
                          refresh_hour=refresh_hour, policy_config=policy_config,
                          on_step=part(n), placement=placement, deletion_cost=deletion_cost,
                          restart_cost_s=0.0)
                 for n, name in enumerate(names)]
        best = max(plans, key=lambda r: r.metrics["work_gpu_hours"])
        return SimResult(CLAIRVOYANT, best.metrics, best.runs, best.delays)
    if placement not in PLACEMENTS:
        raise ValueError(f"unknown placement {placement!r}; choose from {', '.join(PLACEMENTS)}")
    if placement != POOL and not settings.pool.nodes:
        raise ValueError(f"placement {placement!r} needs the pool's node shapes: set pool.nodes "
                         "in the config, e.g. [{gpus: 8, count: 11}]")
    run = _Simulation(history, settings, jobs, policy, start=start, end=end, horizon=horizon,
                      policy_config=policy_config, placement=placement,
                      deletion_cost=deletion_cost, checkpoint_notice_s=checkpoint_notice_s,
                      notice_answer_s=notice_answer_s, unanswered_share=unanswered_share,
                      restart_cost_s=restart_cost_s)
    if policy == "forecast" and forecast_profiles is None:
        forecast_profiles = forecast_profiles_for(history, settings, run.pool.index,
                                                  refresh_hour, horizon,
                                                  on_refresh=on_refresh, cache=forecast_cache)
    run.forecast_profiles = forecast_profiles
    return run.result(run.steps(on_step))


class _Simulation:
    """One policy's run of ``simulate``: the simulated cluster and its counters, carried from
    step to step through the step's phases (``steps``). The phases read what they use of
    ``self`` into locals first: they run every step, the loops over the jobs in them for
    every job."""

    def __init__(self, history: pd.DataFrame, settings: Settings, jobs: Sequence[SimJob],
                 policy: str, *, start: datetime, end: datetime, horizon: timedelta,
                 policy_config: PolicySettings | None, placement: str, deletion_cost: bool,
                 checkpoint_notice_s: float, notice_answer_s: float,
                 unanswered_share: float, restart_cost_s: float) -> None:
        self.settings = settings
        self.policy = policy
        config = policy_config or policy_settings(settings.admission,
                                                  settings.pool.headroom_gpus,
                                                  settings.pool.total_gpus)
        # the clairvoyant's stops on reactive's admissions
        self.present = policy == _CLAIRVOYANT_NOW
        self.clairvoyant = policy in _CLAIRVOYANT_PLANS
        self.oracle = policy == "oracle" or self.clairvoyant  # they know the true runtimes
        if self.oracle:
            # it knows the future: no need to cap new jobs at what is idle now for an hour
            # (beyond the present step, where GPUs still held in a grace period count), and
            # it knows when each running job ends
            config = replace(config, live_cap_s=0.0, runtimes_known=True)
        if policy != "forecast":
            # the live correction is of a forecast; the others plan on the present or the truth
            config = replace(config, nowcast_half_life_s=0.0)
        if policy in ("night", "reactive"):
            # the baselines stay what they were defined as: every unit stopped as the
            # service eats into the headroom, and once the signals stay missing
            # and never stopped to grow (borrowing quota restarts nothing on its own)
            config = replace(config, whole_units_into_headroom=False,
                             whole_units_through_outages=False, grow_window_s=0.0)
        self.pool = pool = _PoolTimeline(history, settings, start, end)
        self.step_s = step_s = pool.step_s
        self.total = settings.pool.total_gpus
        if self.clairvoyant:
            # every unit may stop at any step without loss: any window of a step is worth using
            config = replace(config, min_segment_s=float(step_s))
        self.config = config
        self.cluster = _Nodes(settings, placement, deletion_cost) if placement != POOL else None
        if self.cluster is not None:
            jobs = [self.cluster.split(j) for j in jobs]
        self.jobs = jobs
        self.capacity = settings.pool.lendable_gpus
        self.horizon_steps = int(horizon.total_seconds() // step_s)
        self.until_morning = (_steps_until_morning(pool.index, settings.pool.timezone, step_s)
                              if policy == "night" else None)
        self.checkpoint_notice_s = checkpoint_notice_s
        self.notice_answer_s = notice_answer_s
        self.unanswered_share = unanswered_share
        self.restart_cost_s = restart_cost_s
        self.grace = timedelta(seconds=config.grace_s)
        self.grace_steps = int(np.ceil(config.grace_s / step_s))
        self.forecast_profiles: dict[datetime, FreeProfile] | None = None
        self.profile_times: list[datetime] | None = None  # forecast_profiles' times, in order
        self.state = {j.id: _Job(j) for j in sorted(jobs, key=lambda j: (j.submit_at, j.id))}
        self.live: list[_Job] = []  # arrived and not finished
        self.runs = _Run()
        self.usage_log: list[tuple[datetime, str, float]] = []
        self.usage_logged = False  # a unit finished since the sums below were made
        self.usage_sums: dict[str, float] | None = None  # _team_usage's, of usage_log
        self.delays: list[tuple[datetime, float, float]] = []
        self.overruns = Overruns(quantile=settings.admission.runtime_quantile)  # learnt online
        self.last_seen: datetime | None = None  # the newest step with live signals
        self.profile: FreeProfile | None = None
        self.delay_gpu_min = self.unplaced_gpu_min = 0.0
        self.unbound = 0  # admissions whose pod no node could bind (on nodes)
        self.planned_stops = self.shrinks = self.renewals = 0
        self.notices = self.notices_answered = 0
        self.notice_saved_gpu_h = 0.0

    def steps(self, on_step: Callable[[int, int], None] | None) -> datetime:
        """Every step of the span, in phases; returns the time of the last."""
        pool, cluster, state, step_s = self.pool, self.cluster, self.state, self.step_s
        oracle, at_will, notice_s = self.oracle, self.clairvoyant, self.checkpoint_notice_s
        steps = len(pool.index)
        arrivals = iter(state.values())  # in submission order
        upcoming = next(arrivals, None)
        for k, stamp in enumerate(pool.index):
            now = stamp.to_pydatetime()
            while upcoming is not None and upcoming.spec.submit_at <= now:
                self.live.append(upcoming)
                upcoming = next(arrivals, None)
            self._progress(now)
            service = pool.service_gpus[k]
            rise = float(service - pool.service_gpus[k - 1]) if k else 0.0
            if cluster is None:
                short, releasing, idle = self._serve_pool(k, now, service, rise)
            else:
                short, releasing, idle = self._serve_nodes(k, now, rise, cluster)
            signals = self._signals(k, now, service, short, releasing, idle)
            # what the policy sees
            live, overruns = self.live, self.overruns
            queue = _waiting(live, state, step_s, overruns, oracle=oracle, at_will=at_will,
                             restart_cost_s=self.restart_cost_s)
            running = [_running(j, now, step_s, overruns, oracle=oracle, at_will=at_will,
                                notice_s=notice_s)
                       for j in live if j.running and j.releasing_until is None]
            if not queue and not running:
                if on_step:
                    on_step(k, steps)
                continue
            profile = self._profile(k, now, service)
            if profile is None:
                continue
            if not running and cluster is None and self._nothing_fits(profile, queue):
                if on_step:
                    on_step(k, steps)
                continue  # decide() could only defer: the same as calling it
            usage = self._team_usage(now)
            if cluster is None:
                plan = decide(now, profile, running, queue, signals, usage, self.config)
            else:
                plan = decide(now, profile, running, queue, signals, usage, self.config,
                              nodes=cluster.view(live, now))
            self._apply(plan.decisions, now)
            if on_step:
                on_step(k, steps)
        return pool.index[-1].to_pydatetime()

    def _progress(self, now: datetime) -> None:
        """Progress, checkpoints, completions and the ends of grace periods and notices."""
        step_s, runs = self.step_s, self.runs
        since = now - timedelta(seconds=step_s)
        finished = False
        for job in self.live:
            if not job.running:
                continue
            if job.releasing_until is None or job.notice_until is not None:
                # the step up to now, or up to the end of its notice
                until = now if job.notice_until is None else max(since, min(now, job.notice_until))
                job.progress_s += _working_s(job, since, until) * _rate(job)
                if job.saved_s + job.progress_s >= job.spec.work_s:
                    # it ended within the step, when its work was done: the rest of the step
                    # its GPUs are idle, neither its useful time nor its loss
                    over_s = (job.saved_s + job.progress_s - job.spec.work_s) / _rate(job)
                    ended = max(since, until - timedelta(seconds=over_s))
                    job.saved_s, job.progress_s = job.spec.work_s, 0.0
                    job.running, job.finished_at = False, ended
                    finished = True
                    if job.notice_until is not None:  # it finished before it had to stop
                        job.notice_until = job.notice_close = job.releasing_until = None
                        job.resume_gpus = None
                    if job.spec.estimate_s > 0:
                        self.overruns = self.overruns.with_ratio(job.spec.work_s
                                                                 / job.spec.estimate_s)
                    runs.close(job, ended, "finished", 0.0)
                    assert job.started_at is not None  # it ran (set when admitted)
                    self.usage_log.append((now, job.spec.team, job.gpus
                                           * (ended - job.started_at).total_seconds() / 3600))
                    self.usage_logged = True
                elif job.spec.checkpointable:
                    _checkpoint(job, since, until)
                if job.notice_until is not None and now >= job.notice_until:
                    self.notices_answered += job.notice_answers
                    self.notice_saved_gpu_h += (job.progress_s * job.spec.gpus / 3600
                                                if job.notice_answers else 0.0)
                    _end_notice(job, runs)
            if (job.running and job.releasing_until is not None and job.notice_until is None
                    and now >= job.releasing_until):
                job.running, job.releasing_until = False, None
                if job.resume_gpus is not None:  # a shrink: it restarts on fewer GPUs
                    if job.where:  # on the node it ran on
                        job.where = {next(iter(job.where)): job.resume_gpus}
                    _begin_attempt(job, now, job.resume_gpus, job.resume_stop_by,
                                   self.restart_cost_s)
                    job.resume_gpus = None
        if finished:
            self.live = [j for j in self.live if j.finished_at is None]

    def _serve_pool(self, k: int, now: datetime, service: float,
                    rise: float) -> tuple[float, float, float]:
        """The service takes what it needs of the pool as one bin, evicting jobs in its way;
        returns the GPUs it is short of, those on their way back and those idle."""
        live, runs, grace, step_s = self.live, self.runs, self.grace, self.step_s
        total = self.total
        held = releasing = 0
        for job in live:
            if job.running:
                held += job.gpus
                if job.releasing_until is not None:
                    releasing += job.gpus - (job.resume_gpus or 0)
        if self.clairvoyant:
            # it sees the service's need a grace period ahead: the units in its way save all
            # they have done and leave, their GPUs back just as the service needs them
            ahead = float(self.pool.service_gpus[k : k + self.grace_steps + 1].max())
            need = ahead + held - total - releasing
            if need > 0:
                until = now + grace
                for victim in _evict([j for j in live if j.running and not _ends_by(
                        j, now, until, step_s)], need):
                    _stop(victim, now, grace, planned=True, runs=runs, cause=EVICTION,
                          at_will=True)
                    releasing += victim.gpus
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
            self.delay_gpu_min += short * step_s / 60
            self.delays.append((now, short, rise))
            for victim in _evict(live, short - releasing):
                _stop(victim, now, grace, planned=False, runs=runs, cause=EVICTION)
                releasing += victim.gpus  # on their way back: not short any more
        return short, releasing, total - service - held

    def _serve_nodes(self, k: int, now: datetime, rise: float,
                     cluster: _Nodes) -> tuple[float, float, float]:
        """The service's replicas land where jobs are not, or evict the jobs of one node and
        wait; returns what ``_serve_pool`` does."""
        live, step_s, clairvoyant = self.live, self.step_s, self.clairvoyant
        for victim in cluster.scale(k * step_s, self.pool.replicas[k], live):
            # (the clairvoyant's evicted GPUs come back at the next step: the replica
            # placement nominates them for this one)
            _stop(victim, now, self.grace, planned=clairvoyant, runs=self.runs,
                  cause=EVICTION, at_will=clairvoyant)
        waiting = float(cluster.placement.nominated.sum())
        self.delay_gpu_min += waiting * step_s / 60
        if waiting > 0:
            self.delays.append((now, waiting, rise))
        self.unplaced_gpu_min += cluster.placement.unplaced_gpus * step_s / 60
        coming = sum(j.gpus - (j.resume_gpus or 0) for j in live
                     if j.running and j.releasing_until is not None)
        return waiting, coming, cluster.room(live).sum()

    def _signals(self, k: int, now: datetime, service: float, short: float, releasing: float,
                 idle: float) -> ServingSignals:
        """The live signals the policy reads, as the daemon would."""
        pool = self.pool
        if not pool.observed[k]:
            # a gap: as the daemon sees it, the signals are missing since the last reading
            return ServingSignals(observed_at=None, missing_since=self.last_seen)
        self.last_seen = now
        return ServingSignals(
            observed_at=now,
            requests_waiting_per_replica=float(pool.waiting[k]),
            kv_cache_usage=float(pool.kv[k]),
            gpus_short=int(max(0.0, short - releasing)),
            idle_gpus=int(max(0.0, idle)),
            service_gpus=int(round(service)),
        )

    def _profile(self, k: int, now: datetime, service: float) -> FreeProfile | None:
        """The free-GPU profile the policy plans on: the newest forecast, the true future
        (the oracle's), or what is free now held until the horizon (or, for night, until the
        morning)."""
        step_s = self.step_s
        if self.policy == "forecast":
            if self.profile_times is None:  # set before the first step, fixed from then on
                self.profile_times = sorted(self.forecast_profiles or {})
            self.profile = (_latest(self.forecast_profiles, now, self.profile_times)
                            or self.profile)
        elif self.oracle and not self.present:
            i = self.pool.offset + k
            self.profile = FreeProfile(start=now, step_s=step_s,
                                       free=self.pool.free_all[i : i + self.horizon_steps],
                                       confidence=1.0, made_at=now)
        else:
            free_now = max(0.0, self.capacity - service)
            steps = self.horizon_steps
            if self.until_morning is not None:
                steps = int(self.until_morning[k])
            self.profile = FreeProfile(start=now, step_s=step_s,
                                       free=np.full(max(steps, 1), free_now if steps else 0.0),
                                       confidence=0.0, made_at=now)
        return self.profile

    def _nothing_fits(self, profile: FreeProfile, queue: Sequence[WaitingJob]) -> bool:
        """Whether no unit of ``queue`` can start on ``profile`` with nothing running: the
        profile is the plain one the simulator made (no live correction, no median, which
        may lift it) and holds fewer GPUs at every step than the smallest unit takes (the
        night policy's day). decide() then only defers, which changes nothing here."""
        if self.config.nowcast_half_life_s > 0 or profile.likely is not None or not queue:
            return False
        least = min(unit.min_gpus if unit.min_gpus is not None else unit.gpus
                    for unit in queue)
        # NaN (a hole) compares false: not skipped
        return least >= 1 and bool(np.max(profile.free) < least)

    def _team_usage(self, now: datetime) -> dict[str, float]:
        """GPU-hours of the units each team finished within the fair-share window."""
        usage_log = self.usage_log
        window_start = now - timedelta(days=self.settings.admission.fair_share_days)
        changed = self.usage_logged
        while usage_log and usage_log[0][0] < window_start:
            usage_log.pop(0)
            changed = True
        if changed or self.usage_sums is None:
            # summed again only when the log changed (a unit finished, or one left the
            # window): the same sums, in the same order, not every step
            team_usage: dict[str, float] = {}
            for _, team, hours in usage_log:
                team_usage[team] = team_usage.get(team, 0.0) + hours
            self.usage_sums, self.usage_logged = team_usage, False
        return dict(self.usage_sums)

    def _apply(self, decisions: Sequence[Decision], now: datetime) -> None:
        """Carry out the plan's decisions: stops, shrinks, renewals and admissions."""
        state, runs, grace, at_will = self.state, self.runs, self.grace, self.clairvoyant
        cluster = self.cluster
        for d in decisions:
            job = state[d.job_id]
            notice = (self._notice_of(job) if d.planned
                      and d.action in (Action.PREEMPT, Action.SHRINK) else None)
            self.notices += notice is not None
            if d.action is Action.PREEMPT:
                self.planned_stops += d.planned
                _stop(job, now, grace, planned=d.planned, runs=runs, cause=d.cause,
                      at_will=at_will, notice=notice)
            elif d.action is Action.SHRINK:
                self.shrinks += 1
                _stop(job, now, grace, planned=d.planned, runs=runs, shrink_to=d.gpus,
                      cause=d.cause, at_will=at_will, notice=notice)
                job.resume_stop_by = d.stop_by
            elif d.action is Action.RENEW:
                self.renewals += 1
                job.stop_by = d.stop_by
            elif d.action is Action.ADMIT:
                if cluster is not None:
                    where = cluster.where(d, self.live)
                    if where is None:  # its pod would stay pending: it waits in the queue
                        self.unbound += 1
                        continue
                    job.where = where
                _begin_attempt(job, now, d.gpus, d.stop_by, self.restart_cost_s)
                job.first_start = job.first_start or now

    def _notice_of(self, job: _Job) -> tuple[float, bool] | None:
        """The notice a planned stop of ``job`` comes with: (seconds it works on, answers)."""
        if (self.checkpoint_notice_s <= 0 or self.clairvoyant or not job.spec.checkpointable
                or job.spec.saves_on_stop):
            return None
        answers = (zlib.crc32(job.spec.id.encode()) % 10_000
                   >= self.unanswered_share * 10_000)
        if answers and self.notice_answer_s <= self.checkpoint_notice_s:
            return self.notice_answer_s, True
        return self.checkpoint_notice_s, False

    def result(self, end_time: datetime) -> SimResult:
        """The run table and the metrics, the span having ended at ``end_time``."""
        state = self.state
        for job in state.values():
            if job.running and job.releasing_until is None:
                self.runs.close(job, end_time, "running", 0.0)
        frame = pd.DataFrame(self.runs.rows, columns=[
            *RUN_COLUMNS, *(["nodes"] if self.cluster is not None else [])])
        # one definition of each figure, the report's, from the run table the report reads
        # (idlegpu.scheduler.reports.useful): a report on runs_<policy>.csv gives the same
        # numbers
        pool = self.pool
        useful = float(useful_of(frame).sum()) if len(frame) else 0.0
        lost = float(frame["lost_gpu_hours"].sum()) if len(frame) else 0.0
        reloads = float(frame["restart_gpu_hours"].sum()) if len(frame) else 0.0
        lost_checkpointing = (float(frame.loc[frame["checkpointable"].astype(bool),
                                              "lost_gpu_hours"].sum()) if len(frame) else 0.0)
        waits = [(j.first_start - j.spec.submit_at).total_seconds() / 3600
                 for j in state.values() if j.first_start is not None]
        # the work done and kept, whatever the GPU-hours held for it: finished, saved at a
        # checkpoint, or running at the end (a grace period spent checkpointing is no work)
        work = sum((j.saved_s + (j.progress_s if j.running and j.releasing_until is None
                                 else 0.0))
                   * j.spec.gpus for j in state.values()) / 3600
        metrics = {
            "useful_gpu_hours": useful,
            "work_gpu_hours": work,
            "lost_gpu_hours": lost,
            "lost_checkpointing_gpu_hours": lost_checkpointing,  # of units that checkpoint
            # of the lost: GPU-hours resumed attempts held reloading their checkpoints
            "restart_gpu_hours": reloads,
            "preemptions": float(sum(j.preemptions for j in state.values())),
            "planned_stops": float(self.planned_stops),
            "shrinks": float(self.shrinks),
            "renewals": float(self.renewals),
            # planned stops told ahead (``checkpoint_notice_s``), those answered in time, and
            # the work the answers saved that a blind stop would have lost
            "notices": float(self.notices),
            "notices_answered": float(self.notices_answered),
            "notice_saved_gpu_hours": self.notice_saved_gpu_h,
            "service_delay_gpu_minutes": self.delay_gpu_min,
            "jobs_finished": float(sum(j.finished_at is not None for j in state.values())),
            # the units it could run: submitted by the end of the span (a backlog from before
            # its start included; the trace's later units not)
            "jobs": float(sum(j.spec.submit_at <= end_time for j in state.values())),
            "mean_queue_wait_hours": float(np.mean(waits)) if waits else float("nan"),
            "idle_gpu_hours": pool.free_gpu_hours,
            "idle_share_used": (useful / pool.free_gpu_hours if pool.free_gpu_hours
                                else float("nan")),
            "unobserved_hours": pool.unobserved_hours,
            "physical_limit_gpu_hours": _physical_limit(pool, self.jobs, self.config),
        }
        if self.cluster is not None:
            metrics.update(self._node_metrics(end_time))
        return SimResult(self.policy, metrics, frame, _delay_table(self.delays))

    def _node_metrics(self, end_time: datetime) -> dict[str, float]:
        """On nodes: the service's replicas no node could hold, the admissions no node could
        bind, and the gangs. A gang starves where single-node units keep taking the nodes it
        needs: its wait counts up to the end of the span when it never started."""
        gangs = [j for j in self.state.values()
                 if j.spec.nodes > 1 and j.spec.submit_at <= end_time]
        return {
            "service_unplaced_gpu_hours": self.unplaced_gpu_min / 60,
            "admissions_unbound": float(self.unbound),
            "gangs": float(len(gangs)),
            "gangs_finished": float(sum(j.finished_at is not None for j in gangs)),
            "gang_queue_wait_hours": float(np.mean([
                ((j.first_start or end_time) - j.spec.submit_at).total_seconds() / 3600
                for j in gangs])) if gangs else float("nan"),
        }
