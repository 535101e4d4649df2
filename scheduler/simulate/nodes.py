"""The simulated nodes of a run with ``placement`` ``spread`` or ``binpack``: the services'
replicas placed as the kube-scheduler places them, and the GPUs the jobs hold on each node."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from datetime import datetime
from typing import cast

import numpy as np

from idlegpu.scheduler.config import Settings
from idlegpu.forecast.nodes import ServicePlacement
from idlegpu.scheduler.simulate.jobs import SimJob, _Job
from idlegpu.scheduler.types import NodeView


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
