"""Kueue's Workloads in the controller's passes: the units that wait on idlegpu's AdmissionChecks.

Each reconcile pass reads them (``KueueAdmission.read``) and offers them to the same
``decide()`` as the stored units: a Workload with its quota reserved and our check ``Pending``
waits in the queue, one admitted with our check ``Ready`` holds its GPUs (so the live
signals, the backstop and the forecast see them as they see our own Jobs). The decisions come
back as check entries (``admission_checks.check_updates``): ``Ready`` admits, ``Pending``
says why it waits and when it should start, ``Retry`` evicts (Kueue suspends the Job and
requeues the Workload). The backstop pass reuses the last reading: it only stops, and a stop of
a Workload that ended meanwhile changes nothing.

While idlegpu cannot decide (no fresh forecast, no fresh live signals, admission paused), its
AdmissionChecks are not ``Active`` and Kueue keeps their ClusterQueues inactive: nothing is
admitted blind. Workloads it cannot read as units are reported, never written.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import replace
from datetime import datetime
from typing import Any

from idlegpu.forecast.errors import IdlegpuError
from idlegpu.scheduler.admission_checks import (
    READY,
    REJECTED,
    RETRY,
    CheckedWorkload,
    CheckUpdate,
    KueueReading,
    check_updates,
    policy_units,
)
from idlegpu.scheduler.controller.external import UnitsOfAPass, planned_seconds
from idlegpu.scheduler.controller.report import PassReport
from idlegpu.scheduler.ports import AdmissionCheckSource
from idlegpu.scheduler.types import Action, ExternalUnit, Plan, RunningJob, WaitingJob

log = logging.getLogger("idlegpu.controller")

KUEUE_PREFIX = "kueue/"


def _unit(update: CheckUpdate) -> str:
    return f"{KUEUE_PREFIX}{update.namespace}/{update.name}"


class KueueAdmission:
    """One AdmissionCheckSource in the controller's passes (module docstring)."""

    origin = "kueue"

    def __init__(self, source: AdmissionCheckSource,
                 runtime: Callable[[CheckedWorkload], float], *, pool_gpus: int, tz: Any,
                 team_of: Mapping[str, str] | None = None, dry_run: bool = False,
                 max_message_writes: int = 200) -> None:
        """``runtime(workload)``: the seconds it is planned with
        (``admission_checks.planned_runtime_s``). ``pool_gpus``: the pool's GPUs (bigger
        Workloads are rejected). ``tz``: the pool's time zone, for the messages.
        ``dry_run``: decide and report what would be written, write nothing.
        ``max_message_writes``: entries whose state stays and only the message moves (a wait's
        reason or estimated start) written at most this many a pass, after every change of
        state: one apply each, so 2,000 new Workloads are told why they wait over a few
        passes instead of holding one pass (and the backstop behind it) for a minute."""
        self.source = source
        self.runtime = runtime
        self.pool_gpus = pool_gpus
        self.tz = tz
        self.team_of = dict(team_of or {})
        self.dry_run = dry_run
        self.max_message_writes = max_message_writes
        self.reading: KueueReading | None = None
        self._runtimes: dict[str, float] = {}
        self._units = UnitsOfAPass()
        self._refused_logged: set[str] = set()

    def read(self, report: PassReport) -> bool:
        """Read Kueue; False (the error reported) when it cannot be read: nothing of it is
        admitted this pass, and what runs stays as last read."""
        try:
            reading = self.source.read()
        except IdlegpuError as exc:
            report.errors.append(f"kueue: {exc}")
            return False
        for unit, why in reading.refused:
            report.errors.append(f"{unit}: not a unit: {why}")
            if unit not in self._refused_logged:
                self._refused_logged.add(unit)
                log.warning("Kueue Workload %s cannot be planned: %s", unit, why)
        self.reading = reading
        present = {w.id for w in reading.workloads}
        self._runtimes = {k: v for k, v in self._runtimes.items() if k in present}
        return True

    def units(self, now: datetime) -> tuple[list[WaitingJob], list[RunningJob]]:
        """The Workloads as the policy's queue and running units (the last reading)."""
        reading = self.reading
        if reading is None:
            return [], []

        def compute() -> tuple[list[WaitingJob], list[RunningJob]]:
            runtimes = planned_seconds((w for w in reading.workloads if not w.finished),
                                       self._runtimes, self.runtime)
            return policy_units(reading.workloads, now, runtimes, self.team_of)

        return self._units.get(reading, now, compute)

    def holding(self, stopping: Mapping[str, int]) -> int:
        """GPUs admitted Workloads hold, those told to stop included (until they are gone)."""
        if self.reading is None:
            return 0
        return sum(w.gpus for w in self.reading.workloads
                   if w.admitted and not w.finished and (w.state == READY or w.id in stopping))

    def settle(self, stopping: dict[str, int]) -> None:
        """Forget the stops of Workloads no longer admitted: their GPUs are back."""
        if self.reading is None:
            return
        admitted = {w.id for w in self.reading.workloads if w.admitted and not w.finished}
        for unit in [u for u in stopping if u.startswith(KUEUE_PREFIX) and u not in admitted]:
            del stopping[unit]

    def apply(self, plan: Plan, report: PassReport, stopping: dict[str, int]) -> None:
        """Write the check entries the plan changes; a ``Retry`` is a stop under way."""
        if self.reading is None:
            return
        by_id = {w.id: w for w in self.reading.workloads}
        written: dict[str, CheckedWorkload] = {}
        updates = check_updates(self.reading.workloads, plan.decisions, self.pool_gpus,
                                self.tz)
        changes = [u for u in updates if u.state != by_id[_unit(u)].state]
        # while a check is not Active its message says why nothing is admitted; the waits'
        # reasons would only count the seconds since the signals went stale, pass by pass
        inactive = {c for c, (active, _, _) in self.reading.active.items() if not active}
        messages = [u for u in updates
                    if u.state == by_id[_unit(u)].state and u.check not in inactive]
        for update in changes + messages[: self.max_message_writes]:
            unit = _unit(update)
            if self.dry_run:
                report.checks_written.append((unit, update.state))
                log.info("dry run: would set Kueue Workload %s %s (%s)", unit, update.state,
                         update.message)
                continue
            try:
                self.source.write(update)
            except IdlegpuError as exc:
                report.errors.append(f"{unit}: check {update.state} not written: {exc}")
                continue
            report.checks_written.append((unit, update.state))
            written[unit] = replace(by_id[unit], state=update.state, message=update.message)
            if update.state == RETRY:
                stopping[unit] = by_id[unit].gpus
                report.stopped.append(unit)
            log.info("Kueue Workload %s: %s (%s)", unit, update.state, update.message)
        if written:
            self.reading = replace(self.reading, workloads=[
                written.get(w.id, w) for w in self.reading.workloads])

    def activate(self, active: tuple[bool, str, str], report: PassReport) -> None:
        """Our AdmissionChecks' ``Active`` condition, written where it changed."""
        if self.reading is None or self.dry_run:
            return
        for check in self.reading.served:
            if self.reading.active.get(check) == active:
                continue
            try:
                self.source.set_active(check, active)
            except IdlegpuError as exc:
                report.errors.append(f"admission check {check}: Active not written: {exc}")
                continue
            if active[0] != (self.reading.active.get(check) or (None,))[0]:
                log.info("admission check %s: Active=%s (%s)", check, active[0], active[2])
            self.reading = replace(self.reading, active={**self.reading.active, check: active})

    def views(self, plan: Plan, stopping: Mapping[str, int]) -> list[ExternalUnit]:
        if self.reading is None:
            return []
        by_id = {d.job_id: d for d in plan.decisions}
        out = []
        for w in self.reading.workloads:
            d = by_id.get(w.id)
            team = self.team_of.get(w.namespace, w.namespace)
            if w.finished:
                state, reason = "ended", "finished"
            elif w.state == REJECTED:
                state, reason = "refused", w.message
            elif w.id in stopping or w.state == RETRY:
                state, reason = "stopping", w.message
            elif w.state == READY:  # admitted by Kueue, or about to be (another check)
                state, reason = ("running" if w.admitted else "admitted"), w.message
            elif not w.quota_reserved:
                state, reason = "waiting", ("waits for Kueue's quota (its ClusterQueue has "
                                            "none free)")
            else:
                state, reason = "waiting", w.message or (d.reason if d else "")
            out.append(ExternalUnit(
                id=w.id, origin=self.origin, namespace=w.namespace, name=w.name, team=team,
                gpus=w.gpus, state=state, reason=reason,
                start_at=d.start_at if d is not None and state == "waiting" else None,
                stop_by=d.stop_by if d is not None and d.action is Action.ADMIT else None,
                since=w.admitted_at if state in ("running", "stopping") else None))
        return out
