"""Benchmark: one steady-state reconcile pass of the daemon, against the policy alone.

    python bench/reconcile_bench.py [--queued 2000] [--running 200] [--repeat 15]

A SQLite job store holds ``--queued`` waiting units and ``--running`` running ones, whose Jobs
live in the fake Kubernetes API server (``tests/fake_kube.py``, real HTTP on loopback, through
the official client). Each pass lists the Jobs, follows every running unit, reads the signals,
calls ``decide()`` and applies nothing (the pool is full): the steady state of a busy night.
The baseline measured in the same run is ``decide()`` alone on the same queue and running set,
so the ratio is what reconciling the store and the cluster costs on top of the policy. The
backstop pass (signals and running jobs only) is timed too.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

import numpy as np
from fake_kube import FakeKube

from scheduler.adapters.kubernetes import KubernetesCluster
from scheduler.adapters.store import JobStore
from scheduler.controller import Controller
from scheduler.policy import decide
from scheduler.specs import expand_units, validate_request
from scheduler.types import FreeProfile, JobState, PolicySettings, ServingSignals

NOW = datetime(2026, 1, 28, 11, 0, tzinfo=UTC)
NS = "idlegpu-jobs"


class Signals:
    def read(self, now, *, job_gpus=0):
        return ServingSignals(observed_at=now, kv_cache_usage=0.4, idle_gpus=0)


def request(i: int) -> dict:
    return {
        "name": f"sweep-{i:05d}", "team": f"team-{i % 12}", "kind": "eval",
        "image": "registry.example.com/research/eval:1.0", "command": ["python", "eval.py"],
        "gpus": [1, 4, 8][i % 3], "runtime_estimate": f"{1 + i % 6}h",
        "priority": i % 3, "output": "s3://runs/{name}",
    }


def build(tmp: Path, kube: FakeKube, queued: int, running: int):
    store = JobStore(f"sqlite:///{tmp / 'jobs.db'}")
    for i in range(queued + running):
        data = request(i)
        req = validate_request(data)
        store.submit(req.name, req.team, req.kind, data, expand_units(req),
                     NOW - timedelta(minutes=queued + running - i))
    cluster = KubernetesCluster(kube.api_client(), namespace=NS, retries=0)
    held = 0
    for row in store.queue()[:running]:
        attempt = store.admit(row.id, NOW - timedelta(minutes=30))
        name = cluster.apply(row.id, attempt, row.spec, team=row.team, stop_by=None, now=NOW)
        kube.set_status(name, {"active": 1, "ready": 1, "startTime": "2026-01-28T10:30:00Z"})
        held += row.spec.gpus
    # the pool is exactly full: what runs fits, nothing more does
    profile = FreeProfile(NOW - timedelta(hours=1), 300, np.full(12 * 24 * 2, float(held)), 0.9,
                          NOW - timedelta(hours=1))
    controller = Controller(store, cluster, Signals(), lambda now: profile,
                            lambda spec: spec.runtime_estimate_s, PolicySettings())
    controller.reconcile_once(NOW)  # they start
    assert sum(r.state is JobState.RUNNING for r in store.queue()) == running
    return store, controller, profile


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--queued", type=int, default=2000)
    parser.add_argument("--running", type=int, default=200)
    parser.add_argument("--repeat", type=int, default=15)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp, FakeKube() as kube:
        t = time.perf_counter()
        store, controller, profile = build(Path(tmp), kube, args.queued, args.running)
        print(f"setup: {args.queued:,} queued + {args.running:,} running units, "
              f"{len(kube.jobs):,} Jobs, {time.perf_counter() - t:.1f} s")
        pass_ms, backstop_ms, decide_ms = [], [], []
        for k in range(args.repeat):
            now = NOW + timedelta(minutes=1 + k)
            t = time.perf_counter()
            report = controller.reconcile_once(now)
            pass_ms.append((time.perf_counter() - t) * 1000)
            assert not report.created and not report.stopped and not report.errors, report
            t = time.perf_counter()
            controller.backstop_once(now)
            backstop_ms.append((time.perf_counter() - t) * 1000)
            # the baseline: the policy alone, on inputs read once outside the timing
            running = controller.store.running(now, controller._estimate_row)
            waiting = controller.store.waiting(now, controller._estimate_row)
            usage = controller.store.team_gpu_hours(now, 7 * 86400)
            signals = ServingSignals(observed_at=now, kv_cache_usage=0.4, idle_gpus=0)
            t = time.perf_counter()
            decide(now, profile, running, waiting, signals, usage, PolicySettings())
            decide_ms.append((time.perf_counter() - t) * 1000)
        store.close()
    p, b, d = (statistics.median(x) for x in (pass_ms, backstop_ms, decide_ms))
    print(f"reconcile pass: median {p:.0f} ms (min {min(pass_ms):.0f}, max {max(pass_ms):.0f})")
    print(f"backstop pass:  median {b:.0f} ms (min {min(backstop_ms):.0f}, "
          f"max {max(backstop_ms):.0f})")
    print(f"baseline, decide() alone: median {d:.1f} ms; reconcile / decide = {p / d:.1f}x, "
          f"backstop / decide = {b / d:.1f}x")


if __name__ == "__main__":
    main()
