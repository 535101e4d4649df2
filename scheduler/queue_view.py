"""The policy's view of the job store's queue: ``WaitingJob`` and ``RunningJob`` from the rows
the store returns, what ``decide()`` and the planner read.

Pure: no I/O and no clock. Every function takes the rows (``UnitRow`` or anything with the
same fields, see ``QueueRow``), ``now`` and the runtime estimates (unit id -> seconds of work
at full size) and returns the policy's inputs; the caller reads the rows (``store.ready_units``,
``store.holding``, ``store.finished_runs``) and makes the estimates. Here are the overrun
rule (``Overruns.remaining_s``) applied to a unit's progress, and the elastic arithmetic: a
unit on ``n`` of the ``gpus`` GPUs it asks for does ``n / gpus`` of its work per second and
runs on a resized spec (``attempt_spec``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime, timedelta
from typing import Protocol

from idlegpu.scheduler.specs import resize_unit
from idlegpu.scheduler.types import (
    JobState,
    Overruns,
    RunningJob,
    UnitSpec,
    WaitingJob,
    reload_s,
)


class QueueRow(Protocol):
    """What this module reads of a stored unit (the fields of the store's ``UnitRow``)."""

    @property
    def id(self) -> str: ...
    @property
    def team(self) -> str: ...
    @property
    def kind(self) -> str: ...
    @property
    def gpus(self) -> int: ...
    @property
    def priority(self) -> int: ...
    @property
    def checkpointable(self) -> bool: ...
    @property
    def state(self) -> JobState: ...
    @property
    def preemptions(self) -> int: ...
    @property
    def work_done_s(self) -> float: ...
    @property
    def last_checkpoint_at(self) -> datetime | None: ...
    @property
    def submitted_at(self) -> datetime: ...
    @property
    def updated_at(self) -> datetime: ...
    @property
    def admitted_at(self) -> datetime | None: ...
    @property
    def started_at(self) -> datetime | None: ...
    @property
    def stop_by(self) -> datetime | None: ...
    @property
    def spec(self) -> UnitSpec: ...


def _aware(value: datetime, name: str = "now") -> datetime:
    if not isinstance(value, datetime):
        raise TypeError(f"{name} must be a datetime, got {type(value).__name__}")
    if value.tzinfo is None or value.utcoffset() is None:
        raise ValueError(f"{name} ({value.isoformat()}) must be timezone-aware")
    return value


def work_rate(gpus: int | None, full: int) -> float:
    """Seconds of work per second of an attempt on ``gpus`` of a unit's ``full`` GPUs."""
    return gpus / full if gpus and full and gpus < full else 1.0


def checkpoint_interval(row: QueueRow) -> float | None:
    """Seconds between a checkpointable unit's periodic checkpoints (its spec's), else None."""
    interval = getattr(row.spec, "checkpoint_interval_s", None)
    return float(interval) if row.checkpointable and interval else None


def attempt_spec(row: QueueRow) -> UnitSpec:
    """What the unit's current attempt runs: its spec on the attempt's GPUs (an elastic unit
    on fewer GPUs: CPU, memory and ``IDLEGPU_GPUS`` scaled, ``specs.resize_unit``)."""
    if row.gpus == row.spec.gpus or not row.state.holds_gpus():
        return row.spec
    return resize_unit(row.spec, row.gpus)


def waiting_job(row: QueueRow, estimate_s: float, overruns: Overruns, *,
                restart_cost_s: float = 0.0) -> WaitingJob:
    """A QUEUED unit as the policy sees it: ``runtime_s`` is what ``overruns.remaining_s``
    leaves of ``estimate_s`` after the checkpointed progress of a checkpointable unit, plus,
    when it will resume from that progress, the ``restart_cost_s`` its reload takes."""
    total = float(estimate_s)
    runtime = overruns.remaining_s(total, row.work_done_s) if row.checkpointable else total
    reload = reload_s(row.checkpointable, row.work_done_s, restart_cost_s)
    runtime += reload
    return WaitingJob(
        id=row.id, team=row.team, gpus=row.gpus, runtime_s=runtime,
        checkpointable=row.checkpointable, priority=row.priority,
        submitted_at=row.submitted_at, deadline=row.spec.deadline,
        preemptions=row.preemptions, max_preemptions=row.spec.max_preemptions,
        kind=row.kind, min_gpus=row.spec.min_gpus,
        gpus_step=getattr(row.spec, "gpus_step", 1),
        checkpoint_interval_s=checkpoint_interval(row), reload_s=reload,
    )


def waiting_jobs(rows: Iterable[QueueRow], estimates: Mapping[str, float],
                 overruns: Overruns | None = None, *,
                 restart_cost_s: float = 0.0) -> list[WaitingJob]:
    """``waiting_job`` of each row (the store's ``ready_units``: QUEUED, submitted, every
    dependency done), in their order; ``estimates[row.id]``: its runtime estimate (default
    overruns: none known)."""
    overruns = overruns or Overruns()
    return [waiting_job(row, estimates[row.id], overruns, restart_cost_s=restart_cost_s)
            for row in rows]


def running_job(row: QueueRow, now: datetime, estimate_s: float, overruns: Overruns, *,
                notice_s: float = 0.0, restart_cost_s: float = 0.0) -> RunningJob:
    """A unit holding GPUs as the policy sees it at ``now``.

    ``started_at`` is the attempt's start (its admission until it started);
    ``remaining_s = overruns.remaining_s(estimate_s, work_done_s + (now - since))`` where
    ``since`` is the attempt's last checkpoint, else its start (the work of an elastic unit on
    fewer GPUs counted at its rate, and what remains stretched by it); a unit that answers
    checkpoint notices gets ``notice_s`` of notice. An attempt that resumed from a checkpoint
    first reloads it for ``restart_cost_s``: until its own first checkpoint, its periodic
    checkpoints count from the end of that reload (a stop during the reload loses no work),
    and what remains includes what is left of the reload."""
    began = row.started_at or row.admitted_at or row.updated_at
    checkpoint = row.last_checkpoint_at
    if checkpoint is not None and checkpoint < began:
        checkpoint = None  # from an earlier attempt: already in work_done_s
    reload = reload_s(row.checkpointable, row.work_done_s, restart_cost_s)
    if checkpoint is None and reload > 0:
        checkpoint = began + timedelta(seconds=reload)
    if row.state is JobState.ADMITTED:
        elapsed = 0.0
    else:
        elapsed = max(0.0, (now - (checkpoint or began)).total_seconds())
    rate = work_rate(row.gpus, row.spec.gpus)  # an elastic unit on fewer GPUs is slower
    remaining = overruns.remaining_s(float(estimate_s),
                                     row.work_done_s + elapsed * rate) / rate
    if checkpoint is not None and checkpoint > now:  # still reloading
        remaining += (checkpoint - now).total_seconds()
    return RunningJob(
        id=row.id, team=row.team, gpus=row.gpus, priority=row.priority,
        started_at=began, checkpointable=row.checkpointable, remaining_s=remaining,
        last_checkpoint_at=checkpoint, stop_by=row.stop_by, kind=row.kind,
        min_gpus=row.spec.min_gpus, gpus_step=getattr(row.spec, "gpus_step", 1),
        max_gpus=row.spec.gpus, deadline=row.spec.deadline,
        preemptions=row.preemptions, max_preemptions=row.spec.max_preemptions,
        checkpoint_interval_s=checkpoint_interval(row),
        saves_on_stop=row.checkpointable and bool(getattr(row.spec, "saves_on_stop",
                                                          False)),
        notice_s=notice_s if row.checkpointable and getattr(
            row.spec, "answers_notice", False) else 0.0,
    )


def running_jobs(rows: Iterable[QueueRow], now: datetime, estimates: Mapping[str, float],
                 overruns: Overruns | None = None, *,
                 notice_s: float = 0.0, restart_cost_s: float = 0.0) -> list[RunningJob]:
    """``running_job`` of each row (the store's ``holding``: ADMITTED or RUNNING, those marked
    for a cancel included), in their order; ``estimates[row.id]``: its runtime estimate
    (default overruns: none known, so as long again as the overrun so far, at least a quarter
    of the estimate, never "it ends now")."""
    _aware(now)
    overruns = overruns or Overruns()
    return [running_job(row, now, estimates[row.id], overruns, notice_s=notice_s,
                        restart_cost_s=restart_cost_s) for row in rows]


def overruns_of(runs: Iterable[tuple[float, float]], quantile: float = 0.9) -> Overruns:
    """The overruns of finished units from ``(work_s, estimate_s)`` of each (the store's
    ``finished_runs`` with their estimates): the ratios ``work_s / estimate_s`` of those with
    a positive estimate."""
    ratios = []
    for work_s, planned_s in runs:
        planned = float(planned_s)
        if planned > 0:
            ratios.append(work_s / planned)
    return Overruns.of(ratios, quantile)
