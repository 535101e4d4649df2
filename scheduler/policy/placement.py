"""The policy's placement: the GPUs the forecast leaves free over time (``_Availability``),
the nodes (``_NodeRoom``: whole nodes for gangs, reservations), and where a unit fits now or
first (``_place``, EASY backfilling's reservation)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace
from datetime import datetime, timedelta
from typing import cast

import numpy as np

from idlegpu.scheduler.policy.steps import _hours, _min_segment_s, _steps
from idlegpu.scheduler.types import (
    Action,
    Decision,
    FreeProfile,
    NodeView,
    PolicySettings,
    WaitingJob,
)


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

    def lend(self, start: int, stop: int, gpus: int) -> None:
        """``gpus`` more available over ``[start, stop)`` (``take`` gives them back)."""
        self.take(start, stop, -gpus)

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
    short = None if reserve else _window_too_short(job, step, capacity, settings, nodes)
    if short is not None:  # deep in a long queue, most units: it fits now, not for long enough
        return short
    whole = _runs_whole(job)
    avail = capacity.array(whole)
    n = len(avail)
    need_steps, min_steps = _run_steps(job, job.runtime_s, whole, settings, step)
    # its full size first; an elastic job then on the most GPUs that fit now, its runtime
    # scaled linearly (the same work on fewer GPUs takes gpus / granted as long)
    no_node = False  # the pool had room for some size, but no node held it
    for gpus in job.sizes:
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
    if reserve:
        what = "whole" if whole else "for a worthwhile segment"
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
    return _stays_short(job, whole, reserve)


def _stays_short(job: WaitingJob, whole: bool, reserve: bool) -> Decision:
    what = "whole" if whole else "for a worthwhile segment"
    return Decision(
        Action.DEFER, job.id, job.gpus,
        f"{job.gpus} GPUs do not stay free {what} ({_hours(job.runtime_s)} + grace)"
        + ("" if reserve else " without delaying the reserved job"),
    )


def _window_too_short(job: WaitingJob, step: int, capacity: _Availability,
                      settings: PolicySettings, nodes: _NodeRoom | None) -> Decision | None:
    """``_place``'s answer (not reserving) for a unit of one size that fits by its GPUs now
    but whose GPUs do not stay free long enough, found without trying each size (None: any
    other case). With ``nodes``, the nodes' refusal where they refuse it, as trying it
    gives it first."""
    if job.min_gpus != job.gpus:
        return None
    whole = _runs_whole(job)
    min_steps = _run_steps(job, job.runtime_s, whole, settings, step)[1]
    i0 = capacity.i0
    if (i0 + min_steps > len(capacity.values) or job.gpus > capacity.array(whole)[i0]
            or capacity.run_from_now(job.gpus, whole) >= min_steps):
        return None
    if nodes is not None:
        until = i0 + _steps(job.runtime_s + settings.grace_s, step)
        fits = (nodes.fit_gang(job.nodes, job.gpus_per_node, job.cpu, job.memory, until)
                if job.nodes > 1 else nodes.fit(job.gpus, job.cpu, job.memory, until))
        if fits is None:  # "node": a refusal by the nodes, as _place marks it
            return Decision(Action.DEFER, job.id, job.gpus, nodes.why(job), node="")
    return _stays_short(job, whole, reserve=False)


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
        f"{job.min_gpus}{f' in steps of {job.gpus_step}' if job.gpus_step > 1 else ''}): "
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
    segment_s = min(runtime_s, _min_segment_s(job, settings, job.reload_s))
    return need_steps, _steps(segment_s + settings.grace_s, step)


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
