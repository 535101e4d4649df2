"""Where the inference services' replicas sit on the pool's nodes, step by step, and what the
GPUs they leave free are good for. Pure: no I/O, no clock (steps are passed in).

The pool view (``idlegpu.forecast.capacity``) counts GPUs for the pool as a whole; a research pod is
placed on one node or not at all, so 16 free GPUs scattered 2 per node carry no 8-GPU job.
This module models the two Kubernetes controllers that decide where the free GPUs are:

**Scale-up: the kube-scheduler** (``pkg/scheduler/framework/plugins/noderesources``). The
``NodeResourcesFit`` filter keeps the nodes whose allocatable ``nvidia.com/gpu`` minus what the
pods bound there (and the pods nominated there) request holds the replica; its score then
picks one with the configured ``scoringStrategy``: ``LeastAllocated`` (the default: the node
left with the largest free share, which spreads replicas; ``spread`` here) or
``MostAllocated`` (the fullest node that still fits, which packs them; ``binpack``). Modelled:
the score on the GPU resource alone (the default strategy scores ``cpu`` and ``memory``; for
vLLM pods whose CPU and memory requests grow with their GPUs the ranking is the same, and an
operator who bin-packs GPUs names ``nvidia.com/gpu`` in ``resources``). Not modelled: the
other score plugins (``NodeResourcesBalancedAllocation``, ``ImageLocality``, the default
``PodTopologySpread`` constraints, which are ``ScheduleAnyway``), the 0-100 integer rounding
of scores, and ``selectHost``'s random choice among equal scores: ties go to the first node.

**Preemption** (``DefaultPreemption`` PostFilter): a replica no node holds evicts
lower-priority pods (our Jobs run under a negative PriorityClass) on one node and waits,
nominated there (``status.nominatedNodeName``; its GPUs are counted as requested on that node
meanwhile), for their graceful termination. The node is picked as ``pickOneNodeForPreemption``
does when every victim has the same priority: the fewest victims; then (our tie-break) the
fewest GPUs evicted, then the first node. Victims are taken in the order the caller gives
(the simulator's: lowest idlegpu priority, newest first); GPUs already on their way back
(jobs in their grace period) are counted before any new victim. A replica that fits nowhere
even with every job gone stays pending (``unplaced``): no policy could have given it room.

**Scale-down: the ReplicaSet controller** (``pkg/controller/replicaset`` ``getPodsToDelete``,
ranked by ``getPodsRankedByRelatedPodsOnSameNode`` and sorted by
``pkg/controller.ActivePodsWithRanks.Less``): deleted first are 1. unassigned (pending)
replicas, then (every bound replica is Running and Ready here, so rules 2-3 tie, and
``pod-deletion-cost`` (4) is not set) 5. replicas on a node with more replicas of the same
service ("doubled up"; the ranks are counted once, before the deletions), 6. the more recently
ready, compared in log2 buckets of their age (``LogarithmicScaleDown``, on by default since
1.22), equal buckets in pseudo-random UID order (a fixed hash of the replica's serial here).
Not modelled: restart counts (7), rollouts (several ReplicaSets of one Deployment).
``deletion_cost=True`` models an operator's lever on rule 4: each replica annotated with
``controller.kubernetes.io/pod-deletion-cost`` = the GPUs the services request on its node
(times the node count, plus the node's ordinal, so equally used nodes are emptied one after
the other rather than a replica from each), so scale-downs empty the least-used nodes first:
what keeps bin-packed nodes packed at night.

The state carries over from step to step: replicas never move (no descheduler), and a scale-up
lands where the GPUs are free then, which after a night of scale-downs and jobs is not where
the last one left.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from idlegpu.forecast.capacity import FREE
from idlegpu.forecast.config import Settings

SPREAD = "spread"
BINPACK = "binpack"
STRATEGIES = (SPREAD, BINPACK)
PENDING = -1
_NS = 1e9


@dataclass
class _Replica:
    node: int  # PENDING while no node holds it
    ready_s: float  # when it was bound (ready), seconds on the caller's clock
    serial: int

    @property
    def uid(self) -> int:
        # the UID order of equal log2 buckets: fixed, but not the creation order
        return (self.serial * 2654435761) % 2**32


@dataclass(frozen=True)
class Preemption:
    """A pending replica's eviction: the first ``victims`` of the node's victim list go."""

    node: int
    victims: int
    service: int


class ServicePlacement:
    """The services' replicas on the nodes, carried from step to step (see the module
    docstring). ``node_gpus``: allocatable GPUs of each node; ``gpus_per_replica``: of each
    service, in the order ``scale`` takes the targets."""

    def __init__(self, node_gpus: Sequence[int], gpus_per_replica: Sequence[int],
                 strategy: str = SPREAD, *, deletion_cost: bool = False) -> None:
        if strategy not in STRATEGIES:
            raise ValueError(f"unknown placement {strategy!r}; choose from "
                             f"{', '.join(STRATEGIES)}")
        self.capacity = np.asarray(node_gpus, dtype=np.int64)
        self.per_replica = [int(g) for g in gpus_per_replica]
        self.strategy = strategy
        self.deletion_cost = deletion_cost
        self.replicas: list[list[_Replica]] = [[] for _ in self.per_replica]
        self.service_gpus = np.zeros(len(self.capacity), dtype=np.int64)
        """GPUs the bound replicas request on each node."""
        self.nominated = np.zeros(len(self.capacity), dtype=np.int64)
        """GPUs of pending replicas waiting on each node for their victims to go."""
        self.unplaced_gpus = 0
        """GPUs of pending replicas no node could hold even with every job gone."""
        self._serial = 0

    def pending_gpus(self) -> int:
        return sum(g for g, reps in zip(self.per_replica, self.replicas)
                   for r in reps if r.node == PENDING)

    def per_node(self, service: int) -> np.ndarray:
        """Bound replicas of ``service`` on each node."""
        out = np.zeros(len(self.capacity), dtype=np.int64)
        for r in self.replicas[service]:
            if r.node != PENDING:
                out[r.node] += 1
        return out

    def scale(
        self,
        now_s: float,
        targets: Sequence[int],
        held: np.ndarray | None = None,
        releasing: np.ndarray | None = None,
        victims: Sequence[Sequence[int]] | None = None,
    ) -> list[Preemption]:
        """Bring every service to ``targets`` replicas at ``now_s``: scale-downs first (they
        free room), then the pending and new replicas are bound or nominated, in service
        order. ``held``: GPUs jobs hold on each node (requested: no replica lands there);
        ``releasing``: of those, GPUs already in their grace period (coming back); ``victims``:
        per node, the GPUs of each job that may still be evicted there, in eviction order.
        Returns the evictions the nominated replicas need this step."""
        n = len(self.capacity)
        held = np.zeros(n, dtype=np.int64) if held is None else np.asarray(held, dtype=np.int64)
        releasing = (np.zeros(n, dtype=np.int64) if releasing is None
                     else np.asarray(releasing, dtype=np.int64))
        victims = victims if victims is not None else [()] * n
        for s, target in enumerate(targets):
            excess = len(self.replicas[s]) - int(target)
            if excess > 0:
                self._scale_down(s, excess, now_s)
        # nominations are made afresh: a replica waiting for its victims finds them releasing
        self.nominated[:] = 0
        self.unplaced_gpus = 0
        staying = held - releasing  # job GPUs that stay unless evicted
        taken = [0] * n  # victims already asked for, per node, this step
        out: list[Preemption] = []
        for s, target in enumerate(targets):
            g = self.per_replica[s]
            for _ in range(int(target) - len(self.replicas[s])):
                self._serial += 1
                self.replicas[s].append(_Replica(PENDING, math.nan, self._serial))
            for replica in self.replicas[s]:
                if replica.node != PENDING:
                    continue
                room = self.capacity - self.service_gpus - self.nominated - held
                node = self.score(room, g)
                if node is not None:
                    replica.node, replica.ready_s = node, now_s
                    self.service_gpus[node] += g
                    continue
                eviction = self._preempt(g, staying, taken, victims)
                if eviction is None:
                    self.unplaced_gpus += g
                    continue
                node, count, freed = eviction
                self.nominated[node] += g
                staying[node] -= freed
                taken[node] += count
                if count:
                    out.append(Preemption(node, count, s))
        return out

    def score(self, room: np.ndarray, gpus: int) -> int | None:
        """The node the kube-scheduler binds a pod of ``gpus`` GPUs to, given each node's free
        GPUs ``room`` (``NodeResourcesFit`` with this placement's strategy); None: none fits."""
        fits = np.flatnonzero(room >= gpus)
        if not len(fits):
            return None
        left = (room[fits] - gpus) / self.capacity[fits]  # free share after placing it
        # LeastAllocated: the most left free; MostAllocated: the least; ties: the first node
        pick = np.argmax(left) if self.strategy == SPREAD else np.argmin(left)
        return int(fits[pick])

    def _preempt(self, gpus: int, staying: np.ndarray, taken: list[int],
                 victims: Sequence[Sequence[int]]) -> tuple[int, int, int] | None:
        """The node a replica evicts on: (node, victims, GPUs they free), or None."""
        best, key = None, None
        for node in range(len(self.capacity)):
            # what the node will have once the releasing jobs are gone
            room = int(self.capacity[node] - self.service_gpus[node] - self.nominated[node]
                       - staying[node])
            count = freed = 0
            queue = list(victims[node])[taken[node]:]
            while room + freed < gpus and count < len(queue):
                freed += int(queue[count])
                count += 1
            if room + freed < gpus:
                continue
            k = (count, freed, node)
            if key is None or k < key:
                best, key = (node, count, freed), k
        return best

    def _scale_down(self, service: int, excess: int, now_s: float) -> None:
        replicas = self.replicas[service]
        on_node = self.per_node(service)
        n = len(self.capacity)
        cost = (self.service_gpus * n + np.arange(n) if self.deletion_cost
                else np.zeros(n, dtype=np.int64))

        def rank(r: _Replica) -> tuple:
            if r.node == PENDING:
                return (0, 0, -r.serial, 0, 0)
            age_ns = (now_s - r.ready_s) * _NS
            bucket = int(math.log2(age_ns)) if age_ns > 0 else -1
            return (1, int(cost[r.node]), -int(on_node[r.node]), bucket, r.uid)

        doomed = sorted(replicas, key=rank)[:excess]
        for r in doomed:
            if r.node != PENDING:
                self.service_gpus[r.node] -= self.per_replica[service]
        gone = {id(r) for r in doomed}
        self.replicas[service] = [r for r in replicas if id(r) not in gone]


def place_services(
    node_gpus: Sequence[int],
    gpus_per_replica: Sequence[int],
    replicas: np.ndarray,
    step_s: float,
    strategy: str = SPREAD,
    *,
    deletion_cost: bool = False,
) -> np.ndarray:
    """GPUs the services' replicas hold on each node at every step (steps x nodes), for
    ``replicas`` (steps x services; NaN: unknown, the placement stays as it was) with no
    jobs in the way. A replica that fits on no node is not counted (it is pending)."""
    placement = ServicePlacement(node_gpus, gpus_per_replica, strategy,
                                 deletion_cost=deletion_cost)
    out = np.zeros((len(replicas), len(node_gpus)), dtype=np.int64)
    last: tuple[int, ...] | None = None
    for k, row in enumerate(np.asarray(replicas, dtype=float)):
        if not np.isnan(row).any():
            target = tuple(int(round(v)) for v in row)
            # a step like the last one changes nothing (the common case): no re-placement,
            # unless a replica is still pending and might fit now
            if target != last or placement.unplaced_gpus:
                placement.scale(k * step_s, target)
                last = target
        out[k] = placement.service_gpus
    return out


def usable_gpus(free: np.ndarray, node_gpus: Sequence[int], size: int,
                cap: np.ndarray | None = None) -> np.ndarray:
    """Per step, the GPUs jobs of ``size`` GPUs could use at once: whole jobs of ``size`` on
    each node (``free``: steps x nodes free GPUs), at most ``cap`` (the pool's lendable free
    GPUs: the headroom stays free) rounded down to whole jobs."""
    if size > max(node_gpus):
        return np.zeros(len(free))
    usable = (np.floor_divide(free, size) * size).sum(axis=1).astype(float)
    if cap is not None:
        usable = np.minimum(usable, np.floor(np.maximum(cap, 0.0) / size) * size)
    return usable


def whole_free_nodes(free: np.ndarray, node_gpus: Sequence[int]) -> np.ndarray:
    """Per step, how many nodes have every GPU free (what multi-node jobs are placed on)."""
    return (np.asarray(free) >= np.asarray(node_gpus)[None, :]).sum(axis=1)


JOB_SIZES = (1, 4, 8)
MULTI_NODE = "multi-node"


@dataclass(frozen=True)
class NodeIdle:
    """The idle GPUs of a history on the pool's nodes (``node_idle``)."""

    strategy: str
    deletion_cost: bool
    node_gpus: tuple[int, ...]
    free: pd.DataFrame
    """Free GPUs of each node (columns ``node-<i>``) at every step; NaN where unknown."""
    whole_nodes: pd.Series
    """Nodes with every GPU free, per step; NaN where unknown."""
    pool_view: pd.DataFrame
    """Per step and job size (columns ``1``, ``4``, ``8`` up to the largest node, and
    ``multi-node``): the idle GPUs jobs of that size could use if the pool were one bin."""
    on_nodes: pd.DataFrame
    """The same, on the nodes: what they can really use."""

    @property
    def by_size(self) -> pd.DataFrame:
        """Per job size: ``pool_view_gpu_hours``, ``on_nodes_gpu_hours`` and ``share``."""
        return self.between()

    def between(self, start: pd.Timestamp | None = None,
                end: pd.Timestamp | None = None) -> pd.DataFrame:
        """``by_size`` over ``[start, end)`` only."""
        index = self.on_nodes.index
        keep = np.ones(len(index), dtype=bool)
        if start is not None:
            keep &= index >= start
        if end is not None:
            keep &= index < end
        hours = (index[1] - index[0]).total_seconds() / 3600 if len(index) > 1 else 0.0
        out = pd.DataFrame({
            "pool_view_gpu_hours": self.pool_view[keep].sum() * hours,
            "on_nodes_gpu_hours": self.on_nodes[keep].sum() * hours,
        })
        out.index.name = "job_gpus"
        out["share"] = out["on_nodes_gpu_hours"] / out["pool_view_gpu_hours"].where(
            out["pool_view_gpu_hours"] > 0)
        return out


def node_idle(usage: pd.DataFrame, settings: Settings, strategy: str | None = None, *,
              deletion_cost: bool = False, sizes: Sequence[int] = JOB_SIZES) -> NodeIdle | None:
    """Where the idle GPUs of ``usage`` (``idlegpu.forecast.capacity.pool_usage``) are on the nodes
    of ``pool.nodes`` with the services placed by ``strategy`` (default: ``pool.placement``), and
    the idle GPUs usable by jobs of each size: a job of ``g`` GPUs takes ``g`` on one node (at most
    what the pool's headroom leaves, in whole jobs); a ``multi-node`` job takes whole free nodes,
    two or more. Unknown steps (a gap) count nothing. None when the pool has no node shapes."""
    if not settings.pool.nodes:
        return None
    strategy = strategy or settings.pool.placement
    node_gpus = [shape.gpus for shape in settings.pool.nodes for _ in range(shape.count)]
    replicas = np.column_stack([usage[s.name].to_numpy(dtype=float) / s.gpus_per_replica
                                for s in settings.services])
    step_s = (usage.index[1] - usage.index[0]).total_seconds()
    held = place_services(node_gpus, [s.gpus_per_replica for s in settings.services], replicas,
                          step_s, strategy, deletion_cost=deletion_cost)
    cap = usage[FREE].to_numpy(dtype=float)
    known = ~np.isnan(cap)
    cap = np.nan_to_num(cap)
    free = np.asarray(node_gpus)[None, :] - held
    pool_view: dict[int | str, np.ndarray] = {}
    on_nodes: dict[int | str, np.ndarray] = {}
    for size in (g for g in sizes if g <= max(node_gpus)):
        pool_view[size] = np.floor(cap / size) * size
        on_nodes[size] = usable_gpus(free, node_gpus, size, cap=cap)
    whole = whole_free_nodes(free, node_gpus)
    whole_gpus = ((free >= np.asarray(node_gpus)[None, :]) * np.asarray(node_gpus)).sum(axis=1)
    largest = max(node_gpus)
    pool_whole = np.floor(cap / largest)
    pool_view[MULTI_NODE] = np.where(pool_whole >= 2, pool_whole * largest, 0.0)
    on_nodes[MULTI_NODE] = np.where(np.minimum(whole, pool_whole) >= 2,
                                    np.minimum(whole_gpus, pool_whole * largest), 0.0)

    def frame(columns: dict) -> pd.DataFrame:
        out = pd.DataFrame(columns, index=usage.index, dtype=float)
        out[~known] = np.nan
        return out

    names = [f"node-{i}" for i in range(len(node_gpus))]
    return NodeIdle(
        strategy, deletion_cost, tuple(node_gpus),
        frame(dict(zip(names, free.T))),
        pd.Series(np.where(known, whole, np.nan), index=usage.index, name="whole_free_nodes"),
        frame(pool_view), frame(on_nodes),
    )


__all__ = ["BINPACK", "JOB_SIZES", "MULTI_NODE", "SPREAD", "STRATEGIES", "NodeIdle",
           "Preemption", "ServicePlacement", "node_idle", "place_services", "usable_gpus",
           "whole_free_nodes"]
