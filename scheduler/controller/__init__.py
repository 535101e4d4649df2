"""One pass of the admission loop: reconcile the store with the cluster, decide, apply.

``Controller.reconcile_once(now)`` is what the daemon runs every minute (and ``idlegpu run
--once``). Order matters for safety:

1. **Reconcile.** The cluster is the truth about Jobs, the store the truth about the queue.
   An ADMITTED unit whose Job is missing (the process died between recording the admission and
   creating the Job) gets its Job created again under the same deterministic name, so a crash
   never loses a job and never starts it twice. Jobs that ran, finished, failed or were
   stopped move their units on, with GPU-seconds in the event log.
2. **Read** the live signals and the current forecast (errors are "missing", never "no load").
3. **Decide** with the pure policy.
4. **Apply**: a stop is sent to the cluster (the unit is released when the cluster reports the
   Job stopped); an admission is recorded in the store first, then the Job is created. If the
   cluster is down, the unit stays ADMITTED and the next pass creates it.

**Shrinks** of elastic units: the Job is stopped like any other (planned: it checkpoints),
then ``shrink_to`` is recorded on the unit. When the cluster reports the Job stopped, one store
transition (``shrunk``) saves the progress, closes the attempt and opens the next one on fewer
GPUs, and the next attempt's Job is created under its own name (a new Job, not the old one
resized: each attempt keeps its name, GPUs and accounting, and a crash before the create is
the ADMITTED-without-Job case above). Its checkpoint and output are the unit's, so it resumes
where the last one stopped. A crash between the stop and the record sends the unit back to the
queue, as a planned stop, instead.

**Nodes.** When the cluster offers a node view (``KubernetesCluster.nodes()``), every
reconcile pass with units waiting reads it and ``decide`` admits a unit only where one node
holds it. An admission's pod is not bound to its node at once: until the view shows it bound
(or the attempt ends), what the admission counted on is added to that node (``_claims``), so
the next pass does not count on the same GPUs. A view that cannot be read admits nothing that
pass (never blind); one the service account may not read at all (403: an older RBAC without
the ClusterRole) is given up with a warning, and the pool counts as one bin as before.

**Gangs** (multi-node units, ``spec.nodes`` > 1): the admission's nodes (one per pod) are
claimed node by node until each pod is bound there, and the Job's pods are pinned to them.
All pods are placed together or the attempt is rolled back: a gang whose pods are not all
bound to a node ``gang_timeout_s`` after its Job was created (a node taken meanwhile, a pod no
node holds) is stopped (kind ``unscheduled``: its bound pods are deleted at once, so no GPU is held
by pods waiting for their siblings), and once its pods are gone the unit goes back to the
queue as an attempt that never ran (no preemption, no work lost) and the Job and its Service
are deleted. A planned stop suspends the whole Indexed Job (every pod gets SIGTERM and
checkpoints); the next attempt is a new gang with the resume arguments. A pod failing after
the gang ran fails the Job (any rank), which is a failed attempt as for any unit.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from datetime import datetime, timedelta
from typing import Literal, cast

import numpy as np

from idlegpu.forecast.errors import IdlegpuError, PermanentError
from idlegpu.scheduler.admission_checks import check_active
from idlegpu.scheduler.controller.external import ExternalUnits, is_external
from idlegpu.scheduler.controller.reconcile import Reconciler, pod_requests, unit_pods
from idlegpu.scheduler.controller.report import PassReport
from idlegpu.scheduler.policy import decide
from idlegpu.scheduler.ports import (
    Cluster,
    JobStore,
    NodeSource,
    SignalSource,
    StopKind,
)
from idlegpu.scheduler.queue_view import overruns_of, running_jobs, waiting_jobs
from idlegpu.scheduler.specs import resize_unit
from idlegpu.scheduler.types import (
    Action,
    Decision,
    FreeProfile,
    JobState,
    NodeView,
    NoticeOutcome,
    Overruns,
    Plan,
    PolicySettings,
    RunningJob,
    ServingSignals,
    WaitingJob,
)

__all__ = ["Controller", "PassReport"]

log = logging.getLogger("idlegpu.controller")


class Controller(Reconciler):
    """The passes of the admission loop over one store, cluster and signal source (the module
    docstring says how); the reconcile steps are ``Reconciler``'s."""

    def __init__(
        self,
        store: JobStore,
        cluster: Cluster,
        signals: SignalSource,
        forecast: Callable[[datetime], FreeProfile | None],
        estimate: Callable[[object], float],
        settings: PolicySettings,
        *,
        fair_share_days: float = 7.0,
        pending_timeout_s: float | None = 900.0,
        stop_timeout_s: float | None = 1200.0,
        max_unscheduled_attempts: int | None = 4,
        gang_timeout_s: float | None = 120.0,
        recheck: Callable[[object], None] | None = None,
        dry_run: bool = False,
        runtime_quantile: float = 0.9,
        checkpoint_notice_s: float = 0.0,
        external: Sequence[ExternalUnits] = (),
    ) -> None:
        """``pending_timeout_s``: an admitted Job whose pod no node has placed after this long
        is stopped and its unit requeued (None: wait forever). ``stop_timeout_s``: a stopped
        Job whose pods still have not ended this long after the stop (a dead node never
        confirms) is given up on: its unit is released and the Job deleted (None: wait for
        ever). ``max_unscheduled_attempts``: after this many attempts in a row that never ran,
        the last of them unplaceable, the unit fails with the reason instead of reserving
        GPUs again every ``pending_timeout_s``. ``recheck(row)``: the daemon's own admission
        rules, run on each stored unit right before its Job is created (raises
        ``IdlegpuError``: the unit fails with the reason). ``dry_run``: decide and show what
        would be applied, but change nothing: the store is only read and the cluster (itself
        in dry-run) only records manifests. ``runtime_quantile``: the quantile of finished
        units' overruns a unit past its estimate is planned to run on for (``Overruns``).
        ``gang_timeout_s``: a multi-node unit whose pods are not all running this long after
        its Job was created is rolled back and requeued (None: only the pending timeout).
        ``checkpoint_notice_s``: the notice units that answer notices get before a planned
        stop (0: blind stops for all). ``external``: units that live outside the store (Kueue's
        Workloads, users' own Jobs), offered to the same ``decide()`` (``controller/
        external.py``)."""
        self.store = store
        self.cluster = cluster
        self.signals = signals
        self.forecast = forecast
        self.estimate = estimate
        self.settings = settings
        self.fair_share_days = fair_share_days
        self.pending_timeout_s = pending_timeout_s
        self.stop_timeout_s = stop_timeout_s
        self.max_unscheduled_attempts = max_unscheduled_attempts
        self.gang_timeout_s = gang_timeout_s
        self.recheck = recheck
        self.dry_run = dry_run
        self.runtime_quantile = runtime_quantile
        self.checkpoint_notice_s = max(0.0, float(checkpoint_notice_s))
        self.external = list(external)
        # how long units overran their estimates: read from the store's finished units at the
        # first pass, again after a pass that saw units finish
        self._overruns: Overruns | None = None
        # units told to stop whose GPUs are not back yet: never counted twice against a need
        self._stopping: dict[str, int] = {}
        self._last_seen: datetime | None = None  # time of the newest good reading
        self._missing_since: datetime | None = None  # first failed read, before any success
        # the daemon runs reconcile and backstop passes in different threads, often at the
        # same instant; they share the state above, so one pass at a time (else a job is told
        # to stop twice, or a stop meant for one attempt reaches the next)
        self._pass_lock = threading.Lock()
        # the node view: read while the cluster offers it and the account may read it
        self._nodes_readable = callable(getattr(cluster, "nodes", None))
        # admissions whose pods are not all bound yet: unit -> (Job name, the nodes a pod each,
        # gpus, cpu, memory of one pod)
        self._claims: dict[str, tuple[str, tuple[str, ...], int, float, int]] = {}
        # what each stored unit's pod requests (cpu cores, memory bytes), from the rows read
        self._requests: dict[str, tuple[float | None, int | None]] = {}
        # stored units of more than one pod (multi-node): unit -> its pods
        self._gangs: dict[str, int] = {}

    def reconcile_once(self, now: datetime) -> PassReport:
        with self._pass_lock:
            return self._reconcile_pass(now)

    def backstop_once(self, now: datetime) -> PassReport:
        """The fast safety pass (every 10-15 s): live signals and the forecast against what
        runs; stops only, no admissions, no reconciling. It waits for a reconcile pass under
        way to finish."""
        with self._pass_lock:
            return self._backstop_pass(now)

    _admission_logged = None  # the admission state a pass last logged (once per change)
    _made_at: datetime | None = None  # when the forecast the last pass read was made

    def _reconcile_pass(self, now: datetime) -> PassReport:
        report = PassReport(now=now)
        seen = True
        if not self.dry_run:
            seen = self._reconcile(now, report)
        if report.finished:
            self._overruns = None
        # an operator's pause (`idlegpu admission pause`): no unit is admitted, while stops,
        # the backstop, reconciling and planned stops go on
        admission = self.store.admission()
        if admission != self._admission_logged:
            if admission.paused:
                since = cast(datetime, admission.since)  # a pause always has its since
                log.warning("admission paused by %s since %s: %s", admission.by,
                            since.isoformat(timespec="seconds"), admission.reason)
            elif self._admission_logged is not None:
                log.info("admission resumed by %s", admission.changed_by)
            self._admission_logged = admission
        # without a view of the cluster nothing is admitted (never blind); stops still go out
        overruns = self._overrun_model()
        admitting = seen and not admission.paused
        waiting = self._waiting(now, overruns) if admitting else []
        read_ok: list[ExternalUnits] = []
        for source in self.external:
            readable = source.read(report)
            source.settle(self._stopping)
            if readable:
                read_ok.append(source)
                if admitting:
                    waiting += source.units(now)[0]
        # a stop to grow is an admission of more GPUs: never while admission is paused or
        # blind, and on the nodes as any admission (policy.growth)
        holding = self.store.holding()  # read once: the policy's running units come from it
        growth = (admitting and self.settings.grow_window_s > 0
                  and any(row.gpus < row.spec.gpus for row in holding))
        nodes: NodeView | None = None
        if (waiting or growth) and self._nodes_readable:
            read = self._read_nodes(now, report)
            if read is False:  # unreadable this pass: admit nothing rather than blind
                waiting, growth = [], False
            elif read is not None:
                nodes = read
                waiting = [self._with_requests(job) for job in waiting]
        usage = self.store.team_gpu_hours(now, self.fair_share_days * 86400)
        report = self._decide_and_apply(now, report, waiting, usage, nodes, growth=growth,
                                        holding_rows=holding)
        if self.external:
            paused = (admission.reason or "no reason given") if admission.paused else ""
            active = self._can_decide(now, report, paused)
            for source in self.external:
                source.activate(active, report)
            self._record_external(now, report, read_ok)
        return report

    def _record_external(self, now: datetime, report: PassReport,
                         read_ok: list[ExternalUnits]) -> None:
        """What the queue views show of the external units read this pass, and when they
        hold GPUs (the report's accounting)."""
        if self.dry_run or not read_ok:
            return
        views = [v for source in read_ok for v in source.views(report.plan, self._stopping)]
        try:
            self.store.record_external(views, now, [s.origin for s in read_ok])
        except IdlegpuError as exc:
            report.errors.append(f"external units not recorded: {exc}")

    def _can_decide(self, now: datetime, report: PassReport, paused: str
                    ) -> tuple[bool, str, str]:
        """Whether idlegpu's admission checks are Active (``check_active``)."""
        signals = report.signals
        return check_active(
            forecast_age_s=(now - self._made_at).total_seconds() if self._made_at else None,
            max_forecast_age_s=self.settings.max_forecast_age_s,
            signals_age_s=((now - signals.observed_at).total_seconds()
                           if signals is not None and signals.observed_at else None),
            max_signal_age_s=self.settings.max_signal_age_s, paused_reason=paused)

    def _backstop_pass(self, now: datetime) -> PassReport:
        return self._decide_and_apply(now, PassReport(now=now), [], {})

    def notices_once(self, now: datetime) -> PassReport:
        """The quick pass while checkpoint notices are under way (every few seconds): stop
        the units that answered, and those past their deadline; nothing else. The service's
        need still cuts notices short in the backstop pass."""
        with self._pass_lock:
            report = PassReport(now=now)
            self._follow_notices(now, report, service_short=False)
            return report

    def _with_requests(self, job):
        cpu, memory = self._requests.get(job.id, (None, None))
        pods = self._gangs.get(job.id, 1)
        if cpu is None and memory is None and pods == 1:
            return job
        return replace(job, cpu=cpu, memory=memory, nodes=pods)

    def _read_nodes(self, now: datetime, report: PassReport
                    ) -> NodeView | None | Literal[False]:
        """The node view with the claims of admissions not bound yet; None: the account may
        not read nodes (given up, warned once); False: not readable this pass."""
        started = time.perf_counter()
        try:
            # only called while _nodes_readable: the cluster has a callable ``nodes``
            view = cast(NodeSource, self.cluster).nodes(now)
        except PermanentError as exc:  # 403: an older RBAC without the ClusterRole
            self._nodes_readable = False
            log.warning("cannot read the node view (%s): admission counts the pool as one bin; "
                        "grant nodes list and pods list cluster-wide (deploy/role.yaml)", exc)
            return None
        except IdlegpuError as exc:
            report.errors.append(f"nodes: {exc}")
            return False
        report.nodes_read_s = time.perf_counter() - started
        if view is None:  # the cluster has no node view to offer (a dry run without one)
            return None
        current = {self.cluster.job_name(row.id, row.attempts)
                   for row in self.store.holding()} if self._claims else set()
        for unit, (name, nodes, gpus, cpu, memory) in list(self._claims.items()):
            if name not in current:
                del self._claims[unit]
                continue
            # a gang's pods bind one by one: each node is claimed until its own pod is there
            # (a view without per-pod bindings: the first pod bound ends every claim)
            left = () if name in view.bound_jobs and not view.bound_at else tuple(
                node for node in nodes if (name, node) not in view.bound_at)
            if not left or (len(nodes) == 1 and name in view.bound_jobs):
                del self._claims[unit]
            elif left != nodes:
                self._claims[unit] = (name, left, gpus, cpu, memory)
        claims: dict[str, tuple[int, float, int]] = {}
        for _name, nodes, gpus, cpu, memory in self._claims.values():
            for node in nodes:
                g, c, m = claims.get(node, (0, 0.0, 0))
                claims[node] = (g + gpus, c + cpu, m + memory)
        view = view.claiming(claims)
        report.nodes = view
        return view

    def _decide_and_apply(self, now: datetime, report: PassReport, waiting, usage,
                          nodes: NodeView | None = None, *, growth: bool = False,
                          holding_rows: list | None = None) -> PassReport:
        """Decide and carry it out; ``growth``: units may be stopped to grow this pass;
        ``holding_rows``: the store's units holding GPUs, if this pass has read them."""
        holding = self._running(now, self._overrun_model(), holding_rows)
        job_gpus = sum(job.gpus for job in holding)
        for source in self.external:
            holding += source.units(now)[1]
            job_gpus += source.holding(self._stopping)
        signals = self._read_signals(now, report, job_gpus=job_gpus)
        if not self.dry_run:
            self._follow_notices(now, report, service_short=bool(signals.gpus_short))
        report.signals = self._net_of_stopping(signals)
        # the policy may still act on what runs, but not on what was already told to stop
        running = [job for job in holding if job.id not in self._stopping]
        if nodes is not None and running and (nodes.bound_at or self._claims):
            running = self._placed(running, nodes)
        settings = self.settings if growth else replace(self.settings, grow_window_s=0.0)
        report.plan = decide(now, self._profile(now, report), running, waiting,
                             report.signals, usage, settings, nodes)
        self._apply(now, report.plan, report)
        for source in self.external:
            source.apply(report.plan, report, self._stopping)
        return report

    def _placed(self, running: list[RunningJob], view: NodeView) -> list[RunningJob]:
        """``running`` with the nodes their pods are bound to (or claimed on, not bound yet)
        and each pod's CPU and memory: ``decide()`` counts what they give back there when
        they end, to reserve whole nodes for a unit the nodes refuse now."""
        names = {row.id: self.cluster.job_name(row.id, row.attempts)
                 for row in self.store.holding()}
        on: dict[str, set[str]] = {}
        for job_name, node in view.bound_at:
            on.setdefault(job_name, set()).add(node)
        for name, claimed, *_ in self._claims.values():
            on.setdefault(name, set()).update(claimed)
        out = []
        for job in running:
            where = on.get(names.get(job.id, ""), set())
            cpu, memory = self._requests.get(job.id, (None, None))
            out.append(replace(job, nodes=tuple(sorted(where)), cpu=cpu, memory=memory)
                       if where else job)
        return out

    # ------------------------------------------------------------------ steps
    def _net_of_stopping(self, signals: ServingSignals) -> ServingSignals:
        """The services' shortfall minus the GPUs already on their way back."""
        coming = sum(self._stopping.values())
        if signals.gpus_short and coming:
            return replace(signals, gpus_short=max(0, signals.gpus_short - coming))
        return signals

    def _estimate_row(self, row) -> float:
        """The runtime estimate of a stored unit; notes what its pods request (``_requests``,
        ``_gangs``) on the way."""
        self._requests[row.id] = pod_requests(row.spec)
        if unit_pods(row.spec) > 1:
            self._gangs[row.id] = unit_pods(row.spec)
        return float(self.estimate(row.spec))

    def _waiting(self, now: datetime, overruns: Overruns) -> list[WaitingJob]:
        """The policy's queue: the units admission may start now, with their estimates."""
        rows = self.store.ready_units(now)
        return waiting_jobs(rows, {row.id: self._estimate_row(row) for row in rows}, overruns,
                            restart_cost_s=self.settings.restart_cost_s)

    def _running(self, now: datetime, overruns: Overruns, rows: list | None = None
                 ) -> list[RunningJob]:
        """What holds GPUs, as the policy sees it at ``now`` (``rows``: the store's
        ``holding()``, read here when not given)."""
        rows = self.store.holding() if rows is None else rows
        return running_jobs(rows, now, {row.id: self._estimate_row(row) for row in rows},
                            overruns, notice_s=self.checkpoint_notice_s,
                            restart_cost_s=self.settings.restart_cost_s)

    def _overrun_model(self) -> Overruns:
        """Ratios of runtime to estimate of the units that finished last (cached)."""
        if self._overruns is None:
            self._overruns = overruns_of(
                ((work_s, self._estimate_row(row)) for row, work_s in self.store.finished_runs()),
                self.runtime_quantile)
        return self._overruns

    def _read_signals(self, now: datetime, report: PassReport, *,
                      job_gpus: int) -> ServingSignals:
        """The live signals, net of ``job_gpus`` (what our Jobs hold or are about to: the
        services cannot have them, so they are not idle; else a busy night would look idle
        and the shortfall look covered). When they cannot be read, nothing is admitted from
        that moment (never admit blind), and they count as missing since the newest good
        reading (or, with none since the start, the first failed read): every job is stopped
        once that is longer ago than ``missing_signals_preempt_after``. Never "no load"."""
        try:
            signals = self.signals.read(now, job_gpus=job_gpus)
        except IdlegpuError as exc:
            report.errors.append(f"signals: {exc}")
            signals = ServingSignals(observed_at=None)
        if signals.observed_at is not None:
            if self._last_seen is None or signals.observed_at > self._last_seen:
                self._last_seen = signals.observed_at
            return signals
        problem = getattr(self.signals, "last_problem", None)
        if problem:
            report.errors.append(f"signals missing: {problem}")
        if self._last_seen is None and self._missing_since is None:
            self._missing_since = now
        return ServingSignals(observed_at=None, missing_since=self._last_seen or
                              self._missing_since)

    def _profile(self, now: datetime, report: PassReport) -> FreeProfile:
        """The current forecast; without one, an empty profile a year old, which admits
        nothing (the policy's forecast-age gate) and offers no room to what runs."""
        try:
            profile = self.forecast(now)
        except IdlegpuError as exc:
            report.errors.append(f"forecast: {exc}")
            profile = None
        if profile is None:
            self._made_at = None
            return FreeProfile(now, 300, np.zeros(1), 0.0, now - timedelta(days=365))
        self._made_at = profile.made_at
        return profile

    def _apply(self, now: datetime, plan: Plan, report: PassReport) -> None:
        for decision in plan.decisions:
            if is_external(decision.job_id):  # its source carries it out (source.apply)
                continue
            if decision.action is Action.PREEMPT:
                row = self.store.unit(decision.job_id)
                if decision.planned and self._answers_notice(row):
                    self._notify(row, decision.reason, now, report)
                    continue
                name = self.cluster.job_name(row.id, row.attempts)
                kind = StopKind.PLANNED if decision.planned else StopKind.PREEMPT
                if self._stop(name, decision.reason, kind, now, report):
                    self._stopping[row.id] = row.gpus
            elif decision.action is Action.SHRINK:
                row = self.store.unit(decision.job_id)
                if decision.planned and self._answers_notice(row):
                    self._notify(row, decision.reason, now, report, shrink_to=decision.gpus,
                                 shrink_stop_by=decision.stop_by)
                    continue
                kind = StopKind.PLANNED if decision.planned else StopKind.PREEMPT
                self._stop_to_shrink(row, decision.gpus, decision.stop_by, decision.reason,
                                     kind, now, report)
            elif decision.action is Action.RENEW:
                self._renew(decision, now, report)
            elif decision.action is Action.ADMIT:
                self._admit(now, decision, report)

    def _renew(self, decision: Decision, now: datetime, report: PassReport) -> None:
        """The Job's stop (and its safety-net deadline) first, then the store: a Job renewed
        whose store still says the old stop is renewed again, to the same effect, next pass;
        a store renewed ahead of its Job would have the cluster end the Job early."""
        row = self.store.unit(decision.job_id)
        name = self.cluster.job_name(row.id, row.attempts)
        try:
            renewed = self.cluster.renew(name, stop_by=decision.stop_by)
            if renewed and not self.dry_run:
                self.store.renew(row.id, now, decision.stop_by)
        except IdlegpuError as exc:
            report.errors.append(f"{row.id}: not renewed ({exc})")

    def _stop_to_shrink(self, row, gpus: int, stop_by: datetime | None, reason: str,
                        kind: StopKind, now: datetime, report: PassReport) -> bool:
        """Stop the Job, then record what it restarts on (see the module docstring)."""
        name = self.cluster.job_name(row.id, row.attempts)
        if not self._stop(name, reason, kind, now, report):
            return False
        self._stopping[row.id] = row.gpus - gpus  # what comes back
        if self.dry_run:
            return True
        try:
            self.store.shrinking(row.id, now, gpus, stop_by=stop_by)
        except IdlegpuError as exc:  # e.g. it ended meanwhile: an ordinary stop then
            report.errors.append(f"{row.id}: stopped, shrink not recorded ({exc})")
            self._stopping[row.id] = row.gpus
        return True

    # ------------------------------------------------------------ checkpoint notices
    def _answers_notice(self, row) -> bool:
        """A planned stop of this unit comes with a checkpoint notice: notices are on, its
        workload answers them, and it runs (a unit not started yet has nothing to save)."""
        return (self.checkpoint_notice_s > 0 and row.checkpointable
                and row.state is JobState.RUNNING
                and bool(getattr(row.spec, "answers_notice", False)))

    def _notify(self, row, reason: str, now: datetime, report: PassReport, *,
                shrink_to: int | None = None, shrink_stop_by: datetime | None = None) -> None:
        """Tell the unit's pods to checkpoint by ``now + checkpoint_notice_s``: recorded
        first (a crash after it leaves a notice the next pass delivers and times), then the
        pods annotated. Its GPUs count as coming back, as a stop's do."""
        name = self.cluster.job_name(row.id, row.attempts)
        deadline = now + timedelta(seconds=self.checkpoint_notice_s)
        if self.dry_run:
            self.cluster.request_checkpoint(name, deadline=deadline, reason=reason, now=now)
            report.noticed.append(name)
            return
        try:
            notice = self.store.send_notice(row.id, now, deadline, reason, shrink_to=shrink_to,
                                            shrink_stop_by=shrink_stop_by)
        except IdlegpuError as exc:
            report.errors.append(f"{row.id}: checkpoint notice not recorded ({exc})")
            return
        self._stopping[row.id] = row.gpus - (notice.shrink_to or 0)
        if notice.sent_at == now:
            log.info("checkpoint notice to %s until %s: %s", name,
                     notice.deadline.isoformat(timespec="seconds"), reason)
            report.noticed.append(name)
        self._deliver(notice, name, now, report)

    def _deliver(self, notice, name: str, now: datetime, report: PassReport) -> None:
        try:
            pods = self.cluster.request_checkpoint(name, deadline=notice.deadline,
                                                   reason=notice.reason, now=now)
        except IdlegpuError as exc:
            report.errors.append(f"{name}: checkpoint notice not delivered yet ({exc})")
            return
        if pods:
            self.store.notice_delivered(notice.attempt_id, now)

    def _follow_notices(self, now: datetime, report: PassReport, *,
                        service_short: bool) -> None:
        """Each open notice ends in a stop: at its acknowledgement (nothing lost), at its
        deadline (a blind stop: what was done since the last checkpoint is lost), or at once
        when the service needs GPUs now (``service_short``: the backstop never waits for a
        notice). Until then its GPUs count as coming back, and an undelivered notice (the
        cluster was down) is delivered again."""
        try:
            notices = self.store.open_notices()
        except IdlegpuError as exc:
            report.errors.append(f"notices: {exc}")
            return
        for notice in notices:
            try:
                row = self.store.unit(notice.unit_id)
                self._follow_notice(notice, row, now, report, service_short=service_short)
            except IdlegpuError as exc:
                report.errors.append(f"{notice.unit_id}: notice ({exc})")

    def _follow_notice(self, notice, row, now: datetime, report: PassReport, *,
                       service_short: bool) -> None:
        if not row.state.holds_gpus() or row.current_attempt != notice.attempt_id:
            if self.store.close_notice(notice.attempt_id, now, NoticeOutcome.ENDED):
                report.notices_closed.append((row.id, NoticeOutcome.ENDED.value))
            return
        name = self.cluster.job_name(row.id, row.attempts)
        if service_short:
            outcome, kind = NoticeOutcome.CUT, StopKind.PREEMPT
            reason = "the service needs the GPUs now: checkpoint notice cut short"
        elif notice.acked_at is not None:
            outcome, kind = NoticeOutcome.ANSWERED, StopKind.PLANNED
            reason = (f"checkpointed at step {notice.ack_step} on notice; {notice.reason}")
        elif now >= notice.deadline:
            outcome, kind = NoticeOutcome.MISSED, StopKind.PLANNED
            reason = (f"no answer to the checkpoint notice by its deadline "
                      f"{notice.deadline.isoformat(timespec='seconds')}; {notice.reason}")
        else:
            self._stopping.setdefault(row.id, row.gpus - (notice.shrink_to or 0))
            if notice.delivered_at is None:
                self._deliver(notice, name, now, report)
            return
        if notice.shrink_to is not None and kind is StopKind.PLANNED:
            stopped = self._stop_to_shrink(row, notice.shrink_to, notice.shrink_stop_by,
                                           reason, kind, now, report)
        else:
            stopped = self._stop(name, reason, kind, now, report)
            if stopped:
                self._stopping[row.id] = row.gpus
        if stopped and self.store.close_notice(notice.attempt_id, now, outcome):
            report.notices_closed.append((row.id, outcome.value))

    def _admit(self, now: datetime, decision: Decision, report: PassReport) -> None:
        # the decision is recorded first: a crash after this line leaves an ADMITTED unit that
        # the next pass creates under the same name; never a Job the store does not know
        try:
            if self.dry_run:
                row = self.store.unit(decision.job_id)
                attempt = row.attempts + 1
            else:
                attempt = self.store.admit(decision.job_id, now, stop_by=decision.stop_by,
                                           gpus=decision.gpus)
                row = self.store.unit(decision.job_id)
        except IdlegpuError as exc:  # e.g. cancelled since the queue was read
            report.errors.append(f"{decision.job_id}: not admitted ({exc})")
            return
        if self.dry_run and decision.gpus < row.gpus:
            row = replace(row, spec=resize_unit(row.spec, decision.gpus))
        if decision.node:
            cpu, memory = pod_requests(row.attempt_spec)
            nodes = decision.nodes or (decision.node,)
            self._claims[row.id] = (self.cluster.job_name(row.id, attempt), tuple(nodes),
                                    decision.gpus // unit_pods(row.attempt_spec), cpu or 0.0,
                                    memory or 0)
        self._create(row, attempt, decision.stop_by, now, report)
