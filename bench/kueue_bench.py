"""Benchmark: the admission-check controller's pass with 2,000 pending Kueue Workloads, against
the same queue as requests.

    python bench/kueue_bench.py [--workloads 2000] [--repeat 9]

A REAL control plane (``tests/kube_control_plane.py``) with Kueue's CRDs (``../shared/kueue``,
copied to ``.cache/kueue/crds`` by scripts/test.sh) holds ``--workloads`` Workloads in one
namespace, each with its quota reserved and idlegpu's check ``Pending``, as Kueue leaves them
(the Kueue manager itself is not started: it would admit or requeue them while we measure).
The pool is full (no GPU free in the forecast), so every pass defers every Workload: the
steady state of a busy evening. Measured in the same run:

* the first pass: check messages written ("waits: ..."), one apply each (at most 200 a
  pass), and the passes until every Workload has its message;
* the steady pass: the Workloads listed and parsed, ``decide()``, no write (nothing changed);
* the listing alone (``KueueChecks.read``);
* the daemon's steady pass and read with the watch (``KueueChecks(watch=True)``: the
  Workloads from a watch-fed copy, only the AdmissionChecks listed);
* the baseline: the same 2,000 units as stored requests (SQLite) in the daemon's own
  reconcile pass, on the same control plane (its Jobs listed: there are none).
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from zoneinfo import ZoneInfo

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

import kubernetes
import numpy as np

import record  # bench/record.py: --record writes the output into docs/bench/
from idlegpu.scheduler.adapters.kubernetes import KubernetesCluster
from idlegpu.scheduler.adapters.kubernetes.kueue import KueueChecks
from idlegpu.scheduler.adapters.store import JobStore
from idlegpu.scheduler.admission_checks import CHECK_CONTROLLER, planned_runtime_s
from idlegpu.scheduler.controller import Controller
from idlegpu.scheduler.controller.kueue import KueueAdmission
from idlegpu.scheduler.specs import expand_units, validate_request
from idlegpu.scheduler.types import FreeProfile, PolicySettings, ServingSignals

NOW = datetime.now(UTC).replace(microsecond=0)  # the Workloads' own times are the server's
NS, CHECK = "research", "idlegpu-forecast"
TEMPLATE = json.loads((ROOT / "tests" / "data" / "kueue" / "workload_pending.json").read_text())


class Signals:
    def read(self, now, *, job_gpus=0):
        return ServingSignals(observed_at=now, kv_cache_usage=0.4, idle_gpus=0)


def gpus_of(i: int) -> int:
    return [1, 4, 8][i % 3]


def runtime_of(i: int) -> int:
    return (1 + i % 6) * 3600


def workload(i: int) -> dict:
    obj = copy.deepcopy(TEMPLATE)
    obj["metadata"] = {"name": f"job-sweep-{i:05d}", "namespace": NS}
    spec = obj["spec"]
    spec["maximumExecutionTimeSeconds"] = runtime_of(i)
    spec["podSets"][0]["count"] = 1
    spec["podSets"][0]["template"]["spec"]["containers"][0]["resources"] = {
        "requests": {"nvidia.com/gpu": str(gpus_of(i))}}
    spec.pop("queueName", None)
    obj.pop("status", None)
    return obj


def status(i: int, stamp: str) -> dict:
    return {"apiVersion": "kueue.x-k8s.io/v1beta1", "kind": "Workload",
            "metadata": {"name": f"job-sweep-{i:05d}", "namespace": NS},
            "status": {
                "admission": {"clusterQueue": "research", "podSetAssignments": [
                    {"name": "main", "count": 1, "flavors": {"nvidia.com/gpu": "gpu-nodes"},
                     "resourceUsage": {"nvidia.com/gpu": str(gpus_of(i))}}]},
                "conditions": [{"type": "QuotaReserved", "status": "True",
                                "reason": "QuotaReserved", "message": "quota reserved",
                                "lastTransitionTime": stamp}],
                "admissionChecks": [{"name": CHECK, "state": "Pending", "message": "",
                                     "lastTransitionTime": stamp}]}}


def request(i: int) -> dict:
    return {"name": f"sweep-{i:05d}", "team": NS, "kind": "eval",
            "image": "registry.example.com/research/eval:1.0", "command": ["python", "eval.py"],
            "gpus": gpus_of(i), "runtime_estimate": f"{runtime_of(i) // 3600}h",
            "output": "s3://runs/{name}"}


def timed(fn, repeat: int) -> list[float]:
    out = []
    for _ in range(repeat):
        began = time.perf_counter()
        fn()
        out.append((time.perf_counter() - began) * 1000)
    return out


def main() -> None:
    from kube_control_plane import ControlPlane
    from kueue_manager import find_kueue

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workloads", type=int, default=2000)
    parser.add_argument("--repeat", type=int, default=9)
    args = parser.parse_args()
    _binary, crds = find_kueue()
    profile = FreeProfile(NOW, 300, np.zeros(12 * 48), 0.9, NOW)
    settings = PolicySettings(headroom_gpus=8, pool_gpus=512)
    with tempfile.TemporaryDirectory() as tmp, ControlPlane(Path(tmp) / "kube") as plane:
        began = time.perf_counter()
        plane.kubectl("apply", "--server-side", "-f", str(crds))
        for crd in ("workloads", "admissionchecks"):  # (`kubectl wait` fails while a new
            while not any(c["type"] == "Established" and c["status"] == "True"  # CRD has no
                          for c in json.loads(plane.kubectl(  # conditions yet)
                              "get", "crd", f"{crd}.kueue.x-k8s.io", "-o", "json").stdout)
                          .get("status", {}).get("conditions") or []):
                time.sleep(0.2)
        plane.create_namespace(NS)
        plane.create_namespace("idlegpu-jobs")
        api = kubernetes.client.CustomObjectsApi(plane.api_client())
        api.create_cluster_custom_object("kueue.x-k8s.io", "v1beta1", "admissionchecks", {
            "apiVersion": "kueue.x-k8s.io/v1beta1", "kind": "AdmissionCheck",
            "metadata": {"name": CHECK}, "spec": {"controllerName": CHECK_CONTROLLER}})
        stamp = NOW.isoformat().replace("+00:00", "Z")
        for i in range(args.workloads):
            api.create_namespaced_custom_object("kueue.x-k8s.io", "v1beta1", NS, "workloads",
                                                workload(i))
            api.patch_namespaced_custom_object_status(
                "kueue.x-k8s.io", "v1beta1", NS, "workloads", f"job-sweep-{i:05d}",
                status(i, stamp), field_manager="kueue-admission", force=True,
                _content_type="application/apply-patch+yaml")
        print(f"setup: {args.workloads:,} Workloads with their quota reserved and the check "
              f"Pending, {time.perf_counter() - began:.1f} s")

        source = KueueChecks(plane.api_client(), checks=[CHECK], request_timeout_s=120)
        cluster = KubernetesCluster(plane.api_client(), namespace="idlegpu-jobs")
        with JobStore(f"sqlite:///{Path(tmp) / 'empty.db'}") as empty, \
                JobStore(f"sqlite:///{Path(tmp) / 'requests.db'}") as store:
            kueue = KueueAdmission(source, lambda w: planned_runtime_s(w, lambda s: 3600.0),
                                   pool_gpus=512, tz=ZoneInfo("Asia/Seoul"))
            checks = Controller(empty, cluster, Signals(), lambda now: profile,
                                lambda spec: 3600.0, settings, external=[kueue])
            at = NOW + timedelta(minutes=1)
            began = time.perf_counter()
            first = checks.reconcile_once(at)
            first_ms = (time.perf_counter() - began) * 1000
            written, passes = len(first.checks_written), 1
            # the passes until every Workload has been told why it waits
            while checks.reconcile_once(at).checks_written:
                passes += 1
            telling_s = time.perf_counter() - began
            deferred = len(first.plan.decisions)
            for i in range(args.workloads):
                req = validate_request(request(i))
                store.submit(req.name, req.team, req.kind, request(i), expand_units(req),
                             NOW - timedelta(minutes=5))
            requests = Controller(store, cluster, Signals(), lambda now: profile,
                                  lambda spec: float(spec.runtime_estimate_s), settings)
            requests.reconcile_once(at)
            watched = KueueChecks(plane.api_client(), checks=[CHECK], request_timeout_s=120,
                                  watch=True)
            watching = Controller(empty, cluster, Signals(), lambda now: profile,
                                  lambda spec: 3600.0, settings, external=[KueueAdmission(
                                      watched, lambda w: planned_runtime_s(w, lambda s: 3600.0),
                                      pool_gpus=512, tz=ZoneInfo("Asia/Seoul"))])
            watching.reconcile_once(at)  # lists, and starts the watch
            assert watched.workloads is not None and watched.workloads.wait_synced(120)
            # interleaved, round by round: the machine's noise falls on every one
            steady_written: list[int] = []
            steady_ms, read_ms, baseline_ms, watch_ms, watch_read_ms = [], [], [], [], []
            for _ in range(args.repeat):
                began = time.perf_counter()
                steady_written.append(len(checks.reconcile_once(at).checks_written))
                steady_ms.append((time.perf_counter() - began) * 1000)
                read_ms += timed(source.read, 1)
                baseline_ms += timed(lambda: requests.reconcile_once(at), 1)
                began = time.perf_counter()
                steady_written.append(len(watching.reconcile_once(at).checks_written))
                watch_ms.append((time.perf_counter() - began) * 1000)
                watch_read_ms += timed(watched.read, 1)
            lists = watched.workloads.lists
            watched.close()
    med = statistics.median
    print(f"\nfirst pass: {first_ms:,.0f} ms ({written:,} check entries written, "
          f"{deferred:,} decisions); every Workload told why it waits after {passes} passes, "
          f"{telling_s:.1f} s")
    print(f"steady pass: median {med(steady_ms):,.0f} ms (min {min(steady_ms):,.0f}, "
          f"max {max(steady_ms):,.0f}), entries written per pass: {max(steady_written)}")
    print(f"listing and parsing alone (KueueChecks.read): median {med(read_ms):,.0f} ms")
    print(f"with the watch: steady pass median {med(watch_ms):,.0f} ms (min "
          f"{min(watch_ms):,.0f}, max {max(watch_ms):,.0f}), read median "
          f"{med(watch_read_ms):,.0f} ms; the Workloads listed {lists} time(s) in all")
    print(f"the same {args.workloads:,} units as requests (SQLite store): reconcile median "
          f"{med(baseline_ms):,.0f} ms (min {min(baseline_ms):,.0f}, max "
          f"{max(baseline_ms):,.0f})")
    print("\n| pass | median | x the same queue as requests |\n|---|---|---|")
    base = med(baseline_ms)
    for name, value in (("first (writes 200 entries)", first_ms),
                        ("steady (no write)", med(steady_ms)),
                        ("listing alone", med(read_ms)),
                        ("steady, with the watch (the daemon's)", med(watch_ms)),
                        ("read, with the watch", med(watch_read_ms)),
                        ("requests (baseline)", base)):
        print(f"| {name} | {value:,.0f} ms | {value / base:.2f}x |")


if __name__ == "__main__":
    record.run("kueue", main)
