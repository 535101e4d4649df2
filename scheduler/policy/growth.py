"""Stops to grow: an elastic unit admitted on fewer GPUs than it asks (the rest were not free
then) is stopped just after a checkpoint, to go back to the queue and be admitted again on the
most GPUs that fit, where more have come free and stay free long enough to outweigh the
restart. Pure: no I/O, no clock.

A data-parallel unit grows by whole replicas (``gpus_step``) and only by a restart: a
checkpoint, its pods stopped, a reload on more GPUs. So growing pays the stop's grace on the
GPUs it holds and the reload on every GPU it restarts on (``restart_cost_s``), and earns the
extra GPUs' work for as long as they stay free. The GPUs are read on the promise (the
forecast at the admission confidence, as a unit that cannot checkpoint reads them), not the
median its windows are planned on: a grown unit that must shrink again soon pays a second
restart for nothing, and on the real pools growing on the median lost twice the work for
little more harvest (docs/admission.md, "Growing elastic units").

The growth comes after the queue's admissions and reservations in a pass, so it takes only
GPUs no queued unit can use now; the unit itself then goes back into the queue in its order
(priority, fair share, age), and is admitted on what fits once its stop is over (``decide()``
admits an elastic unit on the most GPUs that fit). With a node view the larger pod must fit a
node too, as its admission will ask. The caller stops no unit to grow where it would admit
nothing (a paused admission: the controller passes ``grow_window_s = 0`` then).
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from datetime import datetime, timedelta

from idlegpu.scheduler.policy.placement import _Availability, _NodeRoom, _run_length
from idlegpu.scheduler.policy.steps import _hours
from idlegpu.scheduler.types import Action, Decision, PolicySettings, RunningJob, smaller_sizes

GROW = "grow"
"""The cause of a planned stop to grow (``Decision.cause``)."""


def _growths(now: datetime, running: Sequence[RunningJob], decided: Collection[str],
             capacity: _Availability, room: _NodeRoom | None, step_s: int,
             settings: PolicySettings) -> list[Decision]:
    """Planned stops of the elastic units that would restart on more GPUs (``GROW``), taking
    the extra GPUs from ``capacity`` (what the pass's admissions left) for as long as they
    are counted on, and with a node view (``room``) from the node the larger pod fits on.
    ``decided``: units this pass already stops, shrinks or renews. Highest priority first,
    then the longest running (it has waited longest for its GPUs)."""
    if settings.grow_window_s <= 0:
        return []
    out = []
    i0 = capacity.i0
    for job in sorted(running, key=lambda j: (-j.priority, j.started_at, j.id)):
        grown = _grown_size(job, now, decided, capacity, room, step_s, settings)
        if grown is None:
            continue
        size, steps, node = grown
        extra = size - job.gpus
        capacity.take(i0, i0 + steps, extra)
        if room is not None and node is not None:
            _take_node(job, size, room, node, i0 + steps)
        out.append(Decision(
            Action.PREEMPT, job.id, job.gpus,
            f"{extra} more GPUs stay free for {_hours(steps * step_s)}: stopped now ("
            + ("it saves when stopped" if job.keeps_work_when_planned
               else "just after its checkpoint")
            + f") to restart on {size} of its {job.max_gpus} GPUs", planned=True, cause=GROW))
    return out


def _grown_size(job: RunningJob, now: datetime, decided: Collection[str],
                capacity: _Availability, room: _NodeRoom | None, step_s: int,
                settings: PolicySettings) -> tuple[int, int, int | None] | None:
    """The most GPUs ``job`` would restart on, the steps the extra GPUs stay free and, with a
    node view, the node its larger pod fits on; or None: it stays as it is. Only a unit below
    the GPUs it asks, that checkpoints, has at least two stops left (one for the service), no
    deadline passed, is not reloading, and whose stop now loses at most a pass of work (it
    has just checkpointed, or it saves when stopped). The extra GPUs (a whole number of its
    steps) must be free now and stay free on the promise for ``grow_window_s``, with enough
    work left to use them that long, and their work must outweigh the restart: the stop's
    grace on what it holds and the reload on every GPU. With a node view, the larger pod must
    fit a node: its own node (what it holds there counted back) or another; a unit whose node
    is not known does not grow."""
    assert job.min_gpus is not None  # RunningJob.__post_init__ always sets it
    most = job.max_gpus or job.gpus
    if (job.id in decided or not job.checkpointable or most <= job.gpus
            or job.min_gpus >= most or (job.max_preemptions is not None
                                        and job.preemptions + 1 >= job.max_preemptions)
            or (job.deadline is not None and now >= job.deadline)):
        return None
    last = job.last_checkpoint(now)
    reloading = job.last_checkpoint_at is not None and job.last_checkpoint_at > now
    if reloading or now - job.started_at < timedelta(seconds=step_s):
        return None
    if not job.keeps_work_when_planned and (
            job.next_checkpoint(now) is None or last <= job.started_at
            or now - last >= timedelta(seconds=step_s)):
        return None  # not just after a checkpoint of this attempt: a stop would lose work
    window_s = settings.grow_window_s
    work_gpu_s = max(0.0, job.remaining_s) * job.gpus
    i0 = capacity.i0
    for size in (most, *smaller_sizes(most, job.gpus + job.gpus_step, job.gpus_step)):
        extra = size - job.gpus
        if extra > capacity.whole[i0]:
            continue
        steps = _run_length(capacity.whole, i0, extra)
        used_s = min(steps * step_s, work_gpu_s / size)
        cost_s = settings.restart_cost_s * size + settings.grace_s * job.gpus
        if used_s < window_s or extra * used_s <= cost_s:
            continue
        node = None if room is None else _node_for(job, size, room, i0 + steps)
        if room is None or node is not None:
            return size, steps, node
    return None


def _pod_of(job: RunningJob, size: int) -> tuple[float | None, int | None]:
    """The CPU and memory of ``job``'s pod on ``size`` GPUs: its requests scale with its GPUs
    (``specs.resize_unit``)."""
    cpu = None if job.cpu is None else job.cpu * size / job.gpus
    memory = None if job.memory is None else int(job.memory * size / job.gpus)
    return cpu, memory


def _node_for(job: RunningJob, size: int, room: _NodeRoom, until: int) -> int | None:
    """The node ``job``'s pod on ``size`` GPUs fits on until step ``until``: its own (what it
    holds there counted back, unless the node is reserved for another unit by then), else the
    best fit of the others (``_NodeRoom.fit``). None: no node, or its node is not known (a
    gang is never elastic: one pod)."""
    if len(job.nodes) != 1:
        return None
    cpu, memory = _pod_of(job, size)
    if job.nodes[0] in room.names:
        own = room.names.index(job.nodes[0])
        if (own not in room._closed(until) and room.gpus[own] + job.gpus >= size
                and (cpu is None or room.cpu[own] + (job.cpu or 0.0) >= cpu)
                and (memory is None or room.memory[own] + (job.memory or 0) >= memory)):
            return own
    return room.fit(size, cpu, memory, until)


def _take_node(job: RunningJob, size: int, room: _NodeRoom, node: int, until: int) -> None:
    """What the larger pod takes of ``node`` (``_node_for``'s) for the rest of the pass: the
    extra GPUs (and CPU and memory) on its own node, or the whole pod on another."""
    cpu, memory = _pod_of(job, size)
    if room.names[node] == job.nodes[0]:
        extra = size - job.gpus
        room.take(node, extra, None if cpu is None else cpu - (job.cpu or 0.0),
                  None if memory is None else memory - (job.memory or 0), until=until)
    else:
        room.take(node, size, cpu, memory, until=until)


__all__ = ["GROW"]
