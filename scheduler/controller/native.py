"""Users' own suspended Jobs in the controller's passes (``native_jobs``; an ``ExternalUnits``).

Each reconcile pass lists them; a new one that breaks the rules is refused (on the Job and as
an Event) and never queued; the others are offered to ``decide()``. An admission unsuspends
the Job, a stop (planned, or the backstop's) suspends it; its GPUs count as on their way back
until its pods are gone. The backstop pass reuses the last reading.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import replace
from datetime import datetime
from typing import Any, Protocol

from idlegpu.forecast.errors import IdlegpuError
from idlegpu.scheduler.controller.external import UnitsOfAPass, planned_seconds
from idlegpu.scheduler.controller.report import PassReport
from idlegpu.scheduler.native_jobs import NativeJob, native_units
from idlegpu.scheduler.ports import StopKind
from idlegpu.scheduler.types import Action, ExternalUnit, Plan, RunningJob, WaitingJob

log = logging.getLogger("idlegpu.controller")

JOB_PREFIX = "job/"


class NativeSource(Protocol):
    """What ``adapters/kubernetes/native.NativeJobs`` offers."""

    def read(self) -> Any: ...

    def refuse(self, job: NativeJob, reason: str) -> None: ...

    def resume(self, job: NativeJob, *, stop_by: datetime | None, now: datetime) -> bool: ...

    def suspend(self, job: NativeJob, *, reason: str, kind: StopKind, now: datetime
                ) -> None: ...


class NativeAdmission:
    """One NativeSource in the controller's passes (module docstring)."""

    origin = "job"

    def __init__(self, source: NativeSource, runtime: Callable[[NativeJob], float], *,
                 team_of: Mapping[str, str] | None = None, dry_run: bool = False) -> None:
        """``runtime(job)``: the seconds it is planned with (its own, else the model's)."""
        self.source = source
        self.runtime = runtime
        self.team_of = dict(team_of or {})
        self.dry_run = dry_run
        self.jobs: list[NativeJob] = []
        self._refused: dict[str, tuple[NativeJob, str]] = {}  # refused this pass
        self._runtimes: dict[str, float] = {}
        self._units = UnitsOfAPass()
        self._logged: set[str] = set()

    def read(self, report: PassReport) -> bool:
        try:
            reading = self.source.read()
        except IdlegpuError as exc:
            report.errors.append(f"native jobs: {exc}")
            return False
        refused = set()
        for job, reason in reading.to_refuse:
            refused.add(job.id)
            report.refused.append((job.id, reason))
            if self.dry_run:
                continue
            try:
                self.source.refuse(job, reason)
            except IdlegpuError as exc:
                report.errors.append(f"{job.id}: refusal not written: {exc}")
        for where, why in reading.unreadable:
            if where not in self._logged:
                self._logged.add(where)
                log.warning("Job %s cannot be queued: %s", where, why)
            report.errors.append(f"job/{where}: not a unit: {why}")
        self._refused = {job.id: (job, reason) for job, reason in reading.to_refuse}
        self.jobs = [j for j in reading.jobs if j.id not in refused]
        present = {j.id for j in self.jobs}
        self._runtimes = {k: v for k, v in self._runtimes.items() if k in present}
        return True

    def units(self, now: datetime) -> tuple[list[WaitingJob], list[RunningJob]]:
        jobs = self.jobs

        def compute() -> tuple[list[WaitingJob], list[RunningJob]]:
            runtimes = planned_seconds((j for j in jobs if not (j.finished or j.refused)),
                                       self._runtimes, self.runtime)
            return native_units(jobs, now, runtimes, self.team_of)

        return self._units.get(jobs, now, compute)

    def holding(self, stopping: Mapping[str, int]) -> int:
        return sum(j.gpus for j in self.jobs if not j.finished and (
            (j.ours and not j.suspended) or (j.id in stopping and j.active)))

    def settle(self, stopping: dict[str, int]) -> None:
        by_id = {j.id: j for j in self.jobs}
        for unit in [u for u in stopping if u.startswith(JOB_PREFIX)]:
            job = by_id.get(unit)
            if job is None or job.finished or (job.suspended and job.active == 0):
                del stopping[unit]

    def apply(self, plan: Plan, report: PassReport, stopping: dict[str, int]) -> None:
        by_id = {j.id: j for j in self.jobs}
        changed: dict[str, NativeJob] = {}
        for d in plan.decisions:
            job = by_id.get(d.job_id)
            if job is None:
                continue
            if d.action is Action.ADMIT and job.suspended and not job.ours:
                if self.dry_run:
                    report.created.append(job.id)
                    continue
                try:
                    if self.source.resume(job, stop_by=d.stop_by, now=report.now):
                        report.created.append(job.id)
                        # what the backstop reads until the next listing
                        changed[job.id] = replace(job, suspended=False, admitted_at=report.now)
                except IdlegpuError as exc:
                    report.errors.append(f"{job.id}: not admitted: {exc}")
            elif d.action is Action.PREEMPT and job.ours and not job.suspended:
                kind = StopKind.PLANNED if d.planned else StopKind.PREEMPT
                if self.dry_run:
                    report.stopped.append(job.id)
                    continue
                try:
                    self.source.suspend(job, reason=d.reason, kind=kind, now=report.now)
                except IdlegpuError as exc:
                    report.errors.append(f"{job.id}: stop not sent: {exc}")
                    continue
                stopping[job.id] = job.gpus
                report.stopped.append(job.id)
                changed[job.id] = replace(job, suspended=True, admitted_at=None,
                                          active=max(job.active, job.pods))
        if changed:
            self.jobs = [changed.get(j.id, j) for j in self.jobs]

    def activate(self, active: tuple[bool, str, str], report: PassReport) -> None:
        """Nothing to show: a user's Job simply stays suspended while idlegpu cannot decide."""

    def views(self, plan: Plan, stopping: Mapping[str, int]) -> list[ExternalUnit]:
        by_id = {d.job_id: d for d in plan.decisions}
        out = []
        for job, reason in self._refused.values():
            out.append(self._view(job, "refused", reason))
        for job in self.jobs:
            d = by_id.get(job.id)
            if job.finished:
                out.append(self._view(job, "ended", "finished"))
            elif job.refused:
                out.append(self._view(job, "refused", job.refused))
            elif job.id in stopping or (job.suspended and job.active):
                out.append(self._view(job, "stopping", d.reason if d else ""))
            elif job.ours and not job.suspended:
                out.append(self._view(job, "running", "", since=job.admitted_at,
                                      stop_by=d.stop_by if d else None))
            elif job.suspended:
                out.append(self._view(job, "waiting", d.reason if d else "",
                                      start_at=d.start_at if d else None))
        return out

    def _view(self, job: NativeJob, state: str, reason: str, **times: datetime | None
              ) -> ExternalUnit:
        return ExternalUnit(id=job.id, origin=self.origin, namespace=job.namespace,
                            name=job.name, team=self.team_of.get(job.namespace, job.namespace),
                            gpus=job.gpus, state=state, reason=reason, **times)
