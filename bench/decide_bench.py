"""Benchmark: one decide() call with 10,000 queued jobs on a 1,000-GPU pool.

    python bench/decide_bench.py [--jobs 10000] [--gpus 1000] [--repeat 21] [--node-gpus 8]

The profile covers 7 days at 5-minute steps (2,016 steps) with a daily curve of free GPUs; 200
jobs already run. The baseline measured in the same run is the cost of merely sorting the queue
by the policy's order (priority, fair share, age, id), the least any admitter must do.

With node placement (``decide(..., nodes=view)``): the pool as 125 nodes of 8 GPUs (1,000 /
``--node-gpus``), each with a random share held by service replicas (a night: about half
free, most of it in fragments); the units above one node (16, 32, 64 GPUs) are gangs of 2, 4
and 8 whole nodes, the rest single-node. Timed next to the pool-level decide() on the same
queue, in the same run.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np

import record  # bench/record.py: --record writes the output into docs/bench/
from idlegpu.scheduler.policy import decide
from idlegpu.scheduler.types import (
    FreeProfile,
    NodeState,
    NodeView,
    PolicySettings,
    RunningJob,
    ServingSignals,
    WaitingJob,
)

NOW = datetime(2026, 1, 28, 11, 0, tzinfo=UTC)


def scenario(n_jobs: int, gpus: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    steps = 7 * 288
    hours = (np.arange(steps) * 5 / 60) % 24
    night = (hours < 11) | (hours >= 23)  # UTC hours of a Seoul night
    free = np.where(night, 0.55 * gpus, 0.08 * gpus) + rng.normal(0, 0.01 * gpus, steps)
    profile = FreeProfile(NOW, 300, np.clip(np.round(free), 0, gpus), 0.9, NOW)
    sizes = rng.choice([1, 4, 8, 16, 32, 64], size=n_jobs, p=[0.1, 0.3, 0.25, 0.2, 0.1, 0.05])
    queue = [
        WaitingJob(
            id=f"job-{i:05d}", team=f"team-{i % 12}", gpus=int(sizes[i]),
            runtime_s=float(rng.uniform(0.5, 48) * 3600), checkpointable=bool(rng.random() < 0.5),
            priority=int(rng.integers(0, 4)),
            submitted_at=NOW - timedelta(minutes=float(rng.uniform(0, 20000))),
        )
        for i in range(n_jobs)
    ]
    running = [
        RunningJob(id=f"run-{i}", team=f"team-{i % 12}", gpus=1, priority=0,
                   started_at=NOW - timedelta(hours=1), checkpointable=True, remaining_s=7200)
        for i in range(200)
    ]
    usage = {f"team-{t}": float(rng.uniform(0, 500)) for t in range(12)}
    return profile, running, queue, usage


def node_scenario(queue, gpus: int, node_gpus: int, seed: int = 1):
    """``queue`` with its units above one node as gangs of whole nodes, and a node view of
    the pool: each node with a random number of GPUs held by service replicas."""
    rng = np.random.default_rng(seed)
    count = gpus // node_gpus
    held = rng.choice([0, 2, 4, 6, 8], size=count, p=[0.3, 0.15, 0.2, 0.2, 0.15])
    view = NodeView(tuple(
        NodeState(name=f"node-{i:03d}", gpus=node_gpus, cpu=96.0, memory=2**40,
                  gpus_requested=int(held[i]), cpu_requested=8.0 * int(held[i]))
        for i in range(count)))
    gangs = [replace(job, nodes=job.gpus // node_gpus, cpu=8.0 * node_gpus)
             if job.gpus > node_gpus else replace(job, cpu=8.0 * job.gpus) for job in queue]
    return gangs, view


def timed(fn, repeat: int) -> tuple[list[float], object]:
    times, result = [], None
    for _ in range(repeat):
        t = time.perf_counter()
        result = fn()
        times.append((time.perf_counter() - t) * 1000)
    return times, result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=10_000)
    parser.add_argument("--gpus", type=int, default=1_000)
    parser.add_argument("--repeat", type=int, default=21)
    parser.add_argument("--node-gpus", type=int, default=8)
    args = parser.parse_args()
    profile, running, queue, usage = scenario(args.jobs, args.gpus)
    signals = ServingSignals(observed_at=NOW, kv_cache_usage=0.4)
    settings = PolicySettings()
    decide_ms, sort_ms = [], []
    for _ in range(args.repeat):
        t = time.perf_counter()
        sorted(queue, key=lambda j: (-j.priority, usage.get(j.team, 0.0), j.submitted_at, j.id))
        sort_ms.append((time.perf_counter() - t) * 1000)
        t = time.perf_counter()
        plan = decide(NOW, profile, running, queue, signals, usage, settings)
        decide_ms.append((time.perf_counter() - t) * 1000)
    admitted = sum(d.action == "admit" for d in plan.decisions)
    d, s = statistics.median(decide_ms), statistics.median(sort_ms)
    print(f"decide(): {args.jobs:,} queued, {args.gpus:,} GPUs, {len(profile.free):,} steps: "
          f"median {d:.1f} ms (min {min(decide_ms):.1f}, max {max(decide_ms):.1f}); "
          f"{admitted} admitted")
    print(f"baseline, sorting the queue alone: median {s:.1f} ms; decide / sort = {d / s:.1f}x")

    gangs, view = node_scenario(queue, args.gpus, args.node_gpus)
    pool_ms, node_ms = [], []
    for _ in range(args.repeat):  # interleaved: a busy machine slows both alike
        pool_ms += timed(lambda: decide(NOW, profile, running, gangs, signals, usage,
                                        settings), 1)[0]
        times, plan = timed(lambda: decide(NOW, profile, running, gangs, signals, usage,
                                           settings, view), 1)
        node_ms += times
    admitted = [d for d in plan.decisions if d.action == "admit"]
    multi = sum(1 for d in admitted if len(d.nodes) > 1)
    n, p = statistics.median(node_ms), statistics.median(pool_ms)
    print(f"with node placement: {len(view.nodes)} nodes of {args.node_gpus} GPUs "
          f"({view.free_gpus} free, {sum(1 for x in view.nodes if x.free_gpus == args.node_gpus)}"
          f" whole), {sum(1 for j in gangs if j.nodes > 1):,} of the queued units multi-node: "
          f"median {n:.1f} ms (min {min(node_ms):.1f}, max {max(node_ms):.1f}); "
          f"{len(admitted)} admitted, {multi} of them gangs")
    print(f"the same queue counted as one bin: median {p:.1f} ms; nodes / one bin = {n / p:.2f}x")

    # the live correction on: a pool quieter than forecast, so units that cannot checkpoint
    # are admitted against the forecast alone and the others against the corrected promise
    # (two views of the availability, both taken from at every admission)
    live = replace(settings, pool_gpus=args.gpus, nowcast_half_life_s=6 * 3600.0)
    seen = replace(signals, service_gpus=int(args.gpus - profile.free[0] - 0.1 * args.gpus))
    plain_ms, live_ms = [], []
    for _ in range(args.repeat):
        plain_ms += timed(lambda: decide(NOW, profile, running, queue, signals, usage,
                                         settings), 1)[0]
        times, plan = timed(lambda: decide(NOW, profile, running, queue, seen, usage, live), 1)
        live_ms += times
    c, q = statistics.median(live_ms), statistics.median(plain_ms)
    print(f"with the live correction (two availability views): median {c:.1f} ms "
          f"(min {min(live_ms):.1f}); {sum(d.action == 'admit' for d in plan.decisions)} "
          f"admitted; / without it = {c / q:.2f}x")


if __name__ == "__main__":
    record.run("decide", main)
