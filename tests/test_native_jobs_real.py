"""Users' own suspended Jobs (``idlegpu.io/queue``) on the REAL control plane, with the node
simulator as the kubelet: the daemon admits one by unsuspending it (its pod runs on the pool's
nodes), stops it when the service needs the GPUs (suspended, its pod gone), and resumes it
when they are free again; a Job with a privileged container, or with an image off the allowed
registries, is refused with the field on the Job and in an Event; a Job of a namespace the
operator did not allow is never touched, whoever labels it."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from kube_harness import pool, priority_classes  # noqa: F401 (fixtures)
from polling import wait_for

from idlegpu.scheduler.adapters.kubernetes.native import NativeJobs
from idlegpu.scheduler.controller.native import NativeAdmission
from idlegpu.scheduler.native_jobs import ADMITTED_ANNOTATION, REFUSED_ANNOTATION

pytestmark = pytest.mark.slow  # pods really run and stop on simulated nodes
QUEUE = "test-pool"
REGISTRY = "registry.example.com/"


def _wait(what: str, probe: Callable[[], Any], timeout: float = 60.0) -> Any:
    return wait_for(what, probe, timeout)


def _job(name: str, *, gpus: int = 4, image: str = REGISTRY + "research/train:1.2",
         privileged: bool = False, queue: str = QUEUE) -> dict[str, Any]:
    security: dict[str, Any] = {"allowPrivilegeEscalation": False,
                                "capabilities": {"drop": ["ALL"]}}
    if privileged:
        # (`privileged: true` itself this control plane refuses: --allow-privileged=false)
        security = {"capabilities": {"add": ["SYS_ADMIN"]}, "runAsUser": 0}
    return {
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"name": name, "labels": {"idlegpu.io/queue": queue},
                     "annotations": {"idlegpu.io/runtime-estimate": "2h"}},
        "spec": {"suspend": True, "backoffLimit": 0, "template": {"spec": {
            "restartPolicy": "Never", "terminationGracePeriodSeconds": 5,
            "securityContext": {"runAsNonRoot": True, "runAsUser": 1000},
            "tolerations": [{"operator": "Exists"}],
            "containers": [{"name": "main", "image": image, "securityContext": security,
                            "resources": {"requests": {"cpu": "1", "memory": "1Gi"},
                                          "limits": {"nvidia.com/gpu": str(gpus)}}}]}}}}


def test_users_suspended_jobs_are_admitted_stopped_resumed_and_refused(
        pool, kube_control_plane) -> None:  # noqa: F811 (the fixture)
    kube = kube_control_plane
    daemon, _sim = pool(nodes=1, gpus=8)
    namespace = daemon.namespace
    elsewhere = kube.create_namespace(f"not-allowed-{namespace[-6:]}")
    source = NativeJobs(kube.api_client(), namespaces=[namespace], queue=QUEUE,
                        allowed_registries=[REGISTRY], max_gpus=64, pool_gpus=8,
                        node_selector=daemon.cluster.node_selector, grace_seconds=5,
                        backoff_s=0.2, watch=True)  # as the daemon keeps them: by a watch
    listings: list[bool] = []  # each call of the Jobs' list: a watch or not
    real_list = source.batch.list_namespaced_job

    def counted(ns: str, **kw: Any) -> Any:
        listings.append(bool(kw.get("watch")))
        return real_list(ns, **kw)

    source.batch.list_namespaced_job = counted  # type: ignore[method-assign]
    daemon.controller.external = [NativeAdmission(source, lambda job: job.runtime_s or 3600.0)]
    daemon.free = np.full(576, 8.0)

    def create(obj: dict[str, Any], ns: str = namespace) -> None:
        kube.kubectl("apply", "--server-side", "-n", ns, "-f", "-", input=json.dumps(obj))

    def job(name: str, ns: str = namespace) -> dict[str, Any]:
        return json.loads(kube.kubectl("get", "job", name, "-n", ns, "-o", "json").stdout)

    def pods(name: str) -> list[dict[str, Any]]:
        return json.loads(kube.kubectl("get", "pods", "-n", namespace, "-l",
                                       f"job-name={name}", "-o", "json").stdout)["items"]

    create(_job("train"))
    create(_job("privileged", privileged=True))
    create(_job("off-registry", image="docker.io/someone/miner:1"))
    create(_job("elsewhere"), elsewhere)

    daemon.until(lambda r: job("train")["spec"]["suspend"] is False,
                          what="the queued Job unsuspended")
    admitted = job("train")
    assert ADMITTED_ANNOTATION in admitted["metadata"]["annotations"]
    # the pool's nodeSelector went onto the pod template at the first admission
    assert admitted["spec"]["template"]["spec"]["nodeSelector"] == daemon.cluster.node_selector
    _wait("its pod running", lambda: any(p["status"].get("phase") == "Running"
                                         for p in pods("train")))

    # refused, with the field on the Job and in a Warning Event; never unsuspended
    refused = {name: job(name)["metadata"]["annotations"].get(REFUSED_ANNOTATION, "")
               for name in ("privileged", "off-registry")}
    for field in ("spec.template.spec.containers[0].securityContext.capabilities.add",
                  "spec.template.spec.containers[0].securityContext.runAsUser=0"):
        assert field in refused["privileged"], refused
    assert "spec.template.spec.containers[0].image" in refused["off-registry"]
    assert "allowed registry" in refused["off-registry"]
    events = json.loads(kube.kubectl("get", "events", "-n", namespace, "-o", "json").stdout)
    reasons = {(e["involvedObject"]["name"], e["reason"]) for e in events["items"]}
    assert {("privileged", "IdlegpuRefused"), ("off-registry", "IdlegpuRefused")} <= reasons
    assert all(job(name)["spec"]["suspend"] is True for name in ("privileged", "off-registry"))
    first_refusals = {u for r in daemon.reports for u, _ in r.refused}
    assert first_refusals == {f"job/{namespace}/privileged", f"job/{namespace}/off-registry"}
    # a namespace that was not allowed: untouched, labelled or not
    other = job("elsewhere", elsewhere)
    assert other["spec"]["suspend"] is True
    assert not set(other["metadata"].get("annotations") or {}) & {
        ADMITTED_ANNOTATION, REFUSED_ANNOTATION}

    # the service needs the GPUs: the backstop suspends it, its pod goes
    daemon.signals.gpus_short = 4
    stopped = daemon.controller.backstop_once(daemon.now())
    assert f"job/{namespace}/train" in stopped.stopped, stopped
    _wait("the Job suspended and its pod gone",
          lambda: job("train")["spec"]["suspend"] is True and not [
              p for p in pods("train") if p["status"].get("phase") in ("Pending", "Running")])
    assert job("train")["metadata"]["annotations"].get("idlegpu.io/stop-kind") == "preempt"
    # still needed: it waits, never restarted meanwhile
    daemon.reconcile()
    assert job("train")["spec"]["suspend"] is True
    # the GPUs are free again: resumed (the same Job), its pod runs again
    daemon.signals.gpus_short = 0
    daemon.until(lambda r: job("train")["spec"]["suspend"] is False, what="the Job resumed")
    _wait("its pod running again", lambda: any(p["status"].get("phase") == "Running"
                                               for p in pods("train")))
    # every pass but the first read the watch's copy: the Jobs were listed once or twice (the
    # first pass's own listing, the watch's), never again
    assert listings.count(False) <= 2 and listings.count(True) >= 1, listings
    assert source.watched[namespace].problem == ""
    source.close()
    kube.delete_namespace(elsewhere)
