"""Benchmark: one steady-state reconcile pass of the daemon, on the fake and on a real API server.

    python bench/reconcile_bench.py [--queued 2000] [--running 200] [--repeat 15] [--fake-only]

A SQLite job store holds ``--queued`` waiting units and ``--running`` running ones. Their Jobs
live once in the fake Kubernetes API server (``tests/fake_kube.py``, real HTTP on loopback,
through the official client) and once on a REAL control plane (``tests/kube_control_plane.py``:
etcd, kube-apiserver, controller-manager, scheduler 1.36, with ``tests/node_sim.py`` playing
the kubelet of 16 nodes of 64 GPUs, so the pods really run). Each pass lists the Jobs and their
pods, follows every running unit, reads the signals, calls ``decide()`` and applies nothing
(the pool is full): the steady state of a busy night. Measured in the same run: ``decide()``
alone on the same queue and running set (the baseline), and the two servers against each
other. The backstop pass (signals and running jobs only) is timed too.
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

import kubernetes
import numpy as np
from fake_kube import FakeKube

import record  # bench/record.py: --record writes the output into docs/bench/
from idlegpu.scheduler.adapters.kubernetes import KubernetesCluster
from idlegpu.scheduler.adapters.store import JobStore
from idlegpu.scheduler.controller import Controller
from idlegpu.scheduler.policy import decide
from idlegpu.scheduler.specs import expand_units, validate_request
from idlegpu.scheduler.types import FreeProfile, JobState, PolicySettings, ServingSignals

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


def build(tmp: Path, cluster: KubernetesCluster, mark_running, queued: int, running: int):
    """The store and a controller whose ``running`` units' Jobs exist and run (``mark_running``
    makes them run on the server at hand and returns once they do)."""
    store = JobStore(f"sqlite:///{tmp / 'jobs.db'}")
    for i in range(queued + running):
        data = request(i)
        req = validate_request(data)
        store.submit(req.name, req.team, req.kind, data, expand_units(req),
                     NOW - timedelta(minutes=queued + running - i))
    held, names = 0, []
    for row in store.queue()[:running]:
        attempt = store.admit(row.id, NOW - timedelta(minutes=30))
        names.append(cluster.apply(row.id, attempt, row.spec, team=row.team, stop_by=None,
                                   now=NOW - timedelta(minutes=30)))
        held += row.spec.gpus
    mark_running(names)
    # the pool is exactly full: what runs fits, nothing more does
    profile = FreeProfile(NOW - timedelta(hours=1), 300, np.full(12 * 24 * 2, float(held)), 0.9,
                          NOW - timedelta(hours=1))
    controller = Controller(store, cluster, Signals(), lambda now: profile,
                            lambda spec: spec.runtime_estimate_s, PolicySettings())
    controller.reconcile_once(NOW)  # they start
    started = sum(r.state is JobState.RUNNING for r in store.queue())
    assert started == running, f"{started} of {running} units running"
    return store, controller, profile


def measure(label: str, store, controller, profile, repeat: int) -> dict[str, float]:
    pass_ms, backstop_ms, decide_ms = [], [], []
    for k in range(repeat):
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
    t = time.perf_counter()
    for _ in range(repeat):
        controller.cluster.observe()
    observe_ms = (time.perf_counter() - t) * 1000 / repeat
    p, b, d = (statistics.median(x) for x in (pass_ms, backstop_ms, decide_ms))
    print(f"{label}: reconcile median {p:.0f} ms (min {min(pass_ms):.0f}, max "
          f"{max(pass_ms):.0f}), backstop median {b:.0f} ms, decide() {d:.1f} ms, "
          f"observe {observe_ms:.0f} ms; reconcile / decide = {p / d:.1f}x")
    return {"reconcile": p, "backstop": b, "decide": d, "observe": observe_ms}


def run_fake(args) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as tmp, FakeKube() as kube:
        cluster = KubernetesCluster(kube.api_client(), namespace=NS, retries=0)

        def mark_running(names):
            for name in names:
                kube.set_status(name, {"active": 1, "ready": 1})

        t = time.perf_counter()
        store, controller, profile = build(Path(tmp), cluster, mark_running, args.queued,
                                           args.running)
        print(f"fake setup: {args.queued:,} queued + {args.running:,} running units, "
              f"{len(kube.jobs):,} Jobs, {time.perf_counter() - t:.1f} s")
        try:
            return measure("fake API server", store, controller, profile, args.repeat)
        finally:
            store.close()


def run_real(args) -> dict[str, float]:
    from kube_control_plane import ControlPlane
    from node_sim import NodeSimulator

    with tempfile.TemporaryDirectory() as tmp:
        t = time.perf_counter()
        with ControlPlane(Path(tmp) / "kube") as plane:
            plane.create_namespace(NS)
            scheduling = kubernetes.client.SchedulingV1Api(plane.api_client())
            scheduling.create_priority_class({
                "apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass",
                "metadata": {"name": "idlegpu-best-effort"}, "value": -10,
                "preemptionPolicy": "Never"})
            with NodeSimulator(plane.kubeconfig, 16, gpus=64, cpu="2000", memory="16Ti",
                               pods=250, start_delay=0.1) as sim:
                cluster = KubernetesCluster(plane.api_client(), namespace=NS, retries=0,
                                            request_timeout_s=60)

                def mark_running(names):
                    sim.wait_for(lambda pods: len([p for p in pods if p.state == "running"])
                                 >= len(names), timeout=600, what=f"{len(names)} pods running")

                store, controller, profile = build(Path(tmp), cluster, mark_running,
                                                   args.queued, args.running)
                print(f"real setup: {args.queued:,} queued + {args.running:,} running units, "
                      f"{len(sim.running_pods()):,} pods running on {len(sim.node_names)} "
                      f"simulated nodes, {time.perf_counter() - t:.1f} s")
                try:
                    return measure("real control plane", store, controller, profile,
                                   args.repeat)
                finally:
                    store.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--queued", type=int, default=2000)
    parser.add_argument("--running", type=int, default=200)
    parser.add_argument("--repeat", type=int, default=15)
    parser.add_argument("--fake-only", action="store_true",
                        help="skip the real control plane (no binaries at hand)")
    args = parser.parse_args()
    fake = run_fake(args)
    if args.fake_only:
        return
    real = run_real(args)
    print("\n| pass | fake | real control plane | real / fake |\n|---|---|---|---|")
    for key in ("reconcile", "backstop", "observe"):
        print(f"| {key} | {fake[key]:.0f} ms | {real[key]:.0f} ms | "
              f"{real[key] / fake[key]:.2f}x |")
    print(f"| decide() alone (baseline) | {fake['decide']:.1f} ms | {real['decide']:.1f} ms | "
          f"{real['decide'] / fake['decide']:.2f}x |")


if __name__ == "__main__":
    record.run("reconcile", main)
