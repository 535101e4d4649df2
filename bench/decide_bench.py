"""Benchmark: one decide() call with 10,000 queued jobs on a 1,000-GPU pool.

    python bench/decide_bench.py [--jobs 10000] [--gpus 1000] [--repeat 21]

The profile covers 7 days at 5-minute steps (2,016 steps) with a daily curve of free GPUs; 200
jobs already run. The baseline measured in the same run is the cost of merely sorting the queue
by the policy's order (priority, fair share, age, id), the least any admitter must do.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np

from scheduler.policy import decide
from scheduler.types import FreeProfile, PolicySettings, RunningJob, ServingSignals, WaitingJob

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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=10_000)
    parser.add_argument("--gpus", type=int, default=1_000)
    parser.add_argument("--repeat", type=int, default=21)
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


if __name__ == "__main__":
    main()
