"""The Kubernetes adapter (``KubernetesCluster``) against the REAL control plane (kube-apiserver,
controller-manager, scheduler 1.36), with simulated GPU nodes playing the kubelet where pods
must run (tests/node_sim.py): create and adopt, stop, delete, observe, ownership, and the
server's own refusals (422 Status, RBAC 403, 401).

The daemon's clock here is 2026-03-02 09:00 while the server's says today: every time observed
must come back on the daemon's clock. What a real server cannot be made to do on demand (5xx,
timeouts, lost responses, statuses of older servers) stays on the fake in test_kubernetes.py.

What the adapter sent (query parameters, patch bodies) is read from a record kept on its
client's side (``kube_harness.record_requests``); the answers are the real server's.
"""

from __future__ import annotations

import contextlib
import json
import secrets
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import kube_harness
import kubernetes
import pytest
from kube_harness import record_requests
from kubernetes.client.exceptions import ApiException

from idlegpu.forecast.errors import PermanentError
from idlegpu.scheduler.adapters.kubernetes import (
    ClusterPermissionError,
    ClusterRejectedError,
    JobConflictError,
    KubernetesCluster,
)
from idlegpu.scheduler.ports import JobPhase, StopKind
from idlegpu.scheduler.types import UnitSpec

priority_classes = kube_harness.priority_classes  # the Jobs' best-effort PriorityClass (fixture)

NOW = datetime(2026, 3, 2, 9, 0, tzinfo=UTC)  # the daemon's clock
STOP_BY = NOW + timedelta(hours=5)
HOUR = timedelta(hours=1)
TOLERATIONS = [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
NOWHERE = {"idlegpu.test/pool": "nowhere"}  # no node has it: the pods wait unscheduled
SIM = "sim.idlegpu.io/"  # per-pod behaviour of the simulated kubelet (tests/node_sim.py)


def make_spec(**kw: object) -> UnitSpec:
    base = UnitSpec(
        step="train", step_index=0, member=0, image="registry.example/llm/train:1.2",
        command=("python", "-m", "train"), args=("--epochs", "3"),
        env=(("WANDB_MODE", "offline"),), parameters=(), gpus=2, cpu=1.0, memory="1Gi",
        runtime_estimate_s=7200.0, checkpointable=True, checkpoint_interval_s=900.0,
        resume_args=("--resume", "/ckpt/last"), priority=0, deadline=None,
        max_preemptions=None, output="s3://bucket/out", depends_on=())
    return replace(base, **kw)


class Server:
    """The test's namespace on the real server: an admin view (``job``, ``batch``, ``core``)
    and ``cluster(...)`` adapters sharing one recorded client (``sent``)."""

    def __init__(self, plane: Any, namespace: str) -> None:
        self.plane = plane
        self.ns = namespace
        self.admin = plane.api_client()
        self.batch = kubernetes.client.BatchV1Api(self.admin)
        self.core = kubernetes.client.CoreV1Api(self.admin)
        self.client = plane.api_client()
        self.sent = record_requests(self.client)

    def cluster(self, node_selector: dict[str, str] | None = None,
                **kw: object) -> KubernetesCluster:
        args: dict[str, object] = {"namespace": self.ns, "node_selector": node_selector or NOWHERE,
                                   "tolerations": TOLERATIONS, "backoff_s": 0.0,
                                   "request_timeout_s": 10.0}
        args.update(kw)
        return KubernetesCluster(self.client, **args)  # type: ignore[arg-type]

    def job(self, name: str, namespace: str | None = None) -> dict[str, Any] | None:
        try:
            response = self.batch.read_namespaced_job(name, namespace or self.ns,
                                                      _preload_content=False)
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise
        return json.loads(response.data)

    def jobs(self) -> list[str]:
        return sorted(j.metadata.name for j in self.batch.list_namespaced_job(self.ns).items)

    def pod_of(self, job: str) -> dict[str, Any]:
        response = self.core.list_namespaced_pod(
            self.ns, label_selector=f"batch.kubernetes.io/job-name={job}", _preload_content=False)
        (pod,) = json.loads(response.data)["items"]
        return pod

    def count(self, method: str) -> int:
        return sum(1 for r in self.sent if r.method == method)

    def close(self) -> None:
        self.client.close()
        self.admin.close()


@pytest.fixture
def server(kube_control_plane, kube_namespace, priority_classes) -> Iterator[Server]:
    s = Server(kube_control_plane, kube_namespace)
    yield s
    s.close()


@pytest.fixture
def gpu_node(node_sim) -> tuple[Any, dict[str, str]]:
    """One simulated node with 8 GPUs, its label (the Jobs' nodeSelector)."""
    labels = {"idlegpu.test/pool": secrets.token_hex(4)}
    return node_sim(1, 8, labels=labels, start_delay=0.3, shutdown_seconds=1.0), labels


@contextlib.contextmanager
def pods_behaving(cluster: KubernetesCluster, **behaviour: object) -> Iterator[None]:
    """Jobs applied meanwhile get the simulated kubelet's per-pod annotations (``run_seconds=
    0.5`` -> ``sim.idlegpu.io/run-seconds: "0.5"``) on their pod template."""
    original = cluster.manifest

    def manifest(*args: Any, **kwargs: Any) -> dict[str, Any]:
        m = original(*args, **kwargs)
        m["spec"]["template"]["metadata"].setdefault("annotations", {}).update(
            {SIM + key.replace("_", "-"): str(value) for key, value in behaviour.items()})
        return m

    cluster.manifest = manifest  # type: ignore[method-assign]
    try:
        yield
    finally:
        del cluster.manifest


def wait_for(check: Callable[[], Any], *, timeout: float = 30, what: str = "",
             show: Callable[[], Any] | None = None) -> Any:
    """Poll ``check()`` until truthy; return it. ``show()``: what to say when it times out."""
    deadline = time.monotonic() + timeout
    while True:
        result = check()
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what or check}"
                                 + (f": {show()}" if show else ""))
        time.sleep(0.2)


def observed(cluster: KubernetesCluster) -> dict[str, Any]:
    return {job.unit_id: job for job in cluster.observe()}


def server_time(text: str) -> datetime:
    return datetime.fromisoformat(text)


# --- apply ----------------------------------------------------------------------------------


def test_apply_creates_then_adopts_without_duplicates(server: Server) -> None:
    cluster = server.cluster()
    name = cluster.apply("req7-0-1", 1, make_spec(), team="nlp", stop_by=STOP_BY, now=NOW)
    assert name == "idlegpu-req7-0-1-a1"
    job = server.job(name)
    assert job["metadata"]["uid"] and job["metadata"]["resourceVersion"]
    assert job["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"][
        "nvidia.com/gpu"] == "2"
    before = len(server.sent)
    again = cluster.apply("req7-0-1", 1, make_spec(), team="nlp", stop_by=STOP_BY,
                          now=NOW + timedelta(minutes=1))
    assert again == name
    # the server said 409 AlreadyExists; the adapter read the Job and found it its own
    assert [(r.method, r.path.rsplit("/", 1)[-1]) for r in server.sent[before:]] == [
        ("POST", "jobs"), ("GET", name)]
    assert server.jobs() == [name]
    adopted = server.job(name)
    assert adopted["metadata"]["uid"] == job["metadata"]["uid"]
    assert adopted["metadata"]["annotations"]["idlegpu.io/created-at"] == "2026-03-02T09:00:00Z"
    # a new attempt is a new Job
    cluster.apply("req7-0-1", 2, make_spec(), team="nlp", stop_by=None, now=NOW)
    assert server.jobs() == [name, "idlegpu-req7-0-1-a2"]


def test_apply_refuses_to_adopt_a_foreign_job(server: Server) -> None:
    server.batch.create_namespaced_job(server.ns, {
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"name": "idlegpu-req7-0-1-a1", "labels": {"app": "other"}},
        "spec": {"suspend": True, "template": {"spec": {"restartPolicy": "Never", "containers": [
            {"name": "etl", "image": "busybox", "command": ["true"]}]}}}})
    with pytest.raises(JobConflictError, match="already exists and is not unit req7-0-1"):
        server.cluster().apply("req7-0-1", 1, make_spec(), team="nlp", stop_by=None, now=NOW)
    foreign = server.job("idlegpu-req7-0-1-a1")
    assert foreign["metadata"]["labels"] == {"app": "other"}  # left alone
    assert foreign["spec"]["template"]["spec"]["containers"][0]["name"] == "etl"


def test_invalid_manifest_names_the_field(server: Server) -> None:
    sleeps: list[float] = []
    cluster = server.cluster(sleep=sleeps.append)
    with pytest.raises(ClusterRejectedError) as err:
        cluster.apply("req7-0-1", 1, make_spec(image=""), team="nlp", stop_by=None, now=NOW)
    # the real server's 422 Status names the field in its causes
    assert err.value.status == 422
    assert err.value.fields == ("spec.template.spec.containers[0].image",)
    message = str(err.value)
    assert "spec.template.spec.containers[0].image" in message and "\n" not in message
    assert "Required value" in message
    assert isinstance(err.value, PermanentError)
    assert server.count("POST") == 1 and sleeps == []  # not retried
    assert server.jobs() == []


# --- stop -----------------------------------------------------------------------------------


def test_stop_records_its_kind_and_time_with_the_suspend(server: Server) -> None:
    cluster = server.cluster()
    name = cluster.apply("req7-0-1", 1, make_spec(), team="nlp", stop_by=None, now=NOW)
    rv = server.job(name)["metadata"]["resourceVersion"]
    before = len(server.sent)
    cluster.stop(name, reason="window closes at 14:00", kind=StopKind.PLANNED,
                 now=NOW + timedelta(hours=4))
    job = server.job(name)
    assert job["spec"]["suspend"] is True
    assert job["metadata"]["annotations"]["idlegpu.io/stop-reason"] == "window closes at 14:00"
    assert job["metadata"]["annotations"]["idlegpu.io/stop-kind"] == "planned"
    assert job["metadata"]["annotations"]["idlegpu.io/stopped-at"] == "2026-03-02T13:00:00Z"
    assert job["metadata"]["resourceVersion"] != rv
    # one merge patch, conditional on the resourceVersion just read (the Job controller
    # writing the status in between makes the server refuse it with 409: read again, resend)
    patches = [r for r in server.sent[before:] if r.method == "PATCH" and "/jobs/" in r.path]
    assert 1 <= len(patches) <= 3
    # its pending pod got DisruptionTarget first (pods/status), whatever ends it later
    marks = [r for r in server.sent[before:] if r.method == "PATCH" and r.path.endswith(
        "/status")]
    assert len(marks) == 1 and server.sent.index(marks[0]) < server.sent.index(patches[0])
    sent_after_first = server.count("PATCH")
    for patch in patches:
        assert patch.content_type == "application/merge-patch+json"
        precondition = patch.body["metadata"].pop("resourceVersion")
        assert isinstance(precondition, str) and precondition
        assert patch.body == {"metadata": {"annotations": {
            "idlegpu.io/stop-reason": "window closes at 14:00", "idlegpu.io/stop-kind": "planned",
            "idlegpu.io/stopped-at": "2026-03-02T13:00:00Z"}}, "spec": {"suspend": True}}
    # a second stop (the backstop, the other replica) does not rewrite what the stop meant
    cluster.stop(name, reason="live pressure", kind=StopKind.PREEMPT, now=NOW + 5 * HOUR)
    job = server.job(name)
    assert job["metadata"]["annotations"]["idlegpu.io/stop-kind"] == "planned"
    assert job["metadata"]["annotations"]["idlegpu.io/stopped-at"] == "2026-03-02T13:00:00Z"
    assert server.count("PATCH") == sent_after_first  # nothing sent
    (seen,) = cluster.observe()
    assert seen.stop_kind is StopKind.PLANNED and seen.stopped_at == NOW + timedelta(hours=4)


def test_a_stop_racing_another_stop_keeps_the_first(server: Server,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    cluster = server.cluster()
    name = cluster.apply("req7-0-1", 1, make_spec(), team="nlp", stop_by=None, now=NOW)
    other_client = server.plane.api_client()  # the other replica: its own process
    other_sent = record_requests(other_client)
    other_replica = KubernetesCluster(other_client, namespace=server.ns, backoff_s=0.0)
    read = cluster._get
    reads: list[str] = []

    def read_then_lose_the_race(job_name: str) -> dict | None:
        job = read(job_name)
        reads.append(job_name)
        if len(reads) == 1:  # the other replica stops it right after our first read
            other_replica.stop(job_name, reason="window closes", kind=StopKind.PLANNED, now=NOW)
        return job

    monkeypatch.setattr(cluster, "_get", read_then_lose_the_race)
    try:
        cluster.stop(name, reason="live pressure", kind=StopKind.PREEMPT, now=NOW + HOUR)
    finally:
        other_client.close()
    annotations = server.job(name)["metadata"]["annotations"]
    # ours carried the resourceVersion we read: the real server refused it (409), we read
    # the Job again and found it stopped
    assert annotations["idlegpu.io/stop-kind"] == "planned"
    assert annotations["idlegpu.io/stop-reason"] == "window closes"
    assert server.count("PATCH") == 1 and reads == [name, name]
    assert sum(r.method == "PATCH" for r in other_sent) >= 1


def test_stop_of_a_missing_job_is_fine(server: Server) -> None:
    server.cluster().stop("idlegpu-gone-a1", reason="preempt", kind=StopKind.PREEMPT, now=NOW)
    assert [(r.method, r.path.rsplit("/", 1)[-1]) for r in server.sent] == [
        ("GET", "idlegpu-gone-a1")]
    assert server.jobs() == []


def test_stop_of_a_finished_job_sends_nothing_and_a_refusal_is_raised(
        server: Server, gpu_node, nobody_may) -> None:
    _, labels = gpu_node
    cluster = server.cluster(labels)
    with pods_behaving(cluster, run_seconds=0.3):
        name = cluster.apply("req7-0-1", 1, make_spec(), team="nlp", stop_by=None, now=NOW)
    wait_for(lambda: observed(cluster)["req7-0-1"].phase is JobPhase.SUCCEEDED,
             what="the Job complete")
    cluster.stop(name, reason="late", kind=StopKind.PLANNED, now=NOW)
    assert server.count("PATCH") == 0  # it holds no GPUs
    assert "idlegpu.io/stop-kind" not in server.job(name)["metadata"]["annotations"]
    assert server.job(name)["spec"]["suspend"] is False
    # a running Job, and credentials that may read Jobs but not patch them
    running = cluster.apply("run-0-0", 1, make_spec(), team="nlp", stop_by=None, now=NOW)
    wait_for(lambda: observed(cluster)["run-0-0"].phase is JobPhase.RUNNING, what="running")
    restricted = nobody_may("get")
    with pytest.raises(ClusterPermissionError, match="denied 'patch'"):
        restricted.stop(running, reason="late", kind=StopKind.PLANNED, now=NOW)
    assert server.job(running)["spec"]["suspend"] is False


# --- delete ---------------------------------------------------------------------------------


def test_delete_removes_the_job_with_its_pods_and_a_missing_one_is_fine(
        server: Server, gpu_node) -> None:
    sim, labels = gpu_node
    cluster = server.cluster(labels)
    name = cluster.apply("req7-0-1", 1, make_spec(), team="nlp", stop_by=None, now=NOW)
    pod = sim.wait_for(lambda records: next((p for p in records if p.state == "running"), None),
                       what="the pod running")
    cluster.delete(name)
    assert server.job(name) is None
    (delete,) = [r for r in server.sent if r.method == "DELETE"]
    assert delete.query.get("propagationPolicy") == "Background"
    # not orphaned: the garbage collector deletes the running pod, the kubelet stops it
    gone = sim.wait_pod(server.ns, pod.name, "gone")
    assert gone.exit_code == 143 and gone.deletion_seen_at is not None
    cluster.delete(name)  # gone already: fine
    assert server.count("DELETE") == 2


# --- observe --------------------------------------------------------------------------------


def test_observe_maps_real_statuses_onto_the_daemons_clock(server: Server, gpu_node) -> None:
    sim, labels = gpu_node
    cluster = server.cluster(labels)
    cases = {  # unit -> (the pod's behaviour, gpus, the phase it settles in)
        "starting-0-0": ({"start_delay_seconds": 600}, 1, JobPhase.PENDING),
        "running-0-0": ({"start_delay_seconds": 1.5}, 2, JobPhase.RUNNING),
        "succeeded-0-0": ({"run_seconds": 0.5}, 1, JobPhase.SUCCEEDED),
        "failed-0-0": ({"run_seconds": 0.5, "exit_code": 1}, 3, JobPhase.FAILED),
        "suspended-0-0": ({}, 1, JobPhase.SUSPENDED),
    }
    names = {}
    for unit, (behaviour, gpus, _) in cases.items():
        with pods_behaving(cluster, **behaviour):
            names[unit] = cluster.apply(unit, 1, make_spec(gpus=gpus), team="nlp",
                                        stop_by=None, now=NOW)
    # suspended by someone else (no stop of ours written on it)
    server.batch.patch_namespaced_job(names["suspended-0-0"], server.ns,
                                      {"spec": {"suspend": True}})
    # no node has the GPUs' label it asks for: its pod waits, unscheduled
    names["unplaceable-0-0"] = server.cluster(NOWHERE).apply(
        "unplaceable-0-0", 1, make_spec(gpus=4), team="nlp", stop_by=None, now=NOW)
    cases["unplaceable-0-0"] = ({}, 4, JobPhase.PENDING)

    def settled() -> dict[str, Any] | None:
        seen = observed(cluster)
        ok = set(seen) == set(cases) and all(
            seen[u].phase is phase for u, (_, _, phase) in cases.items()) and all(
            seen[u].message == "pod not ready yet" for u in ("starting-0-0", "unplaceable-0-0")
        ) and any(p.name.startswith(names["starting-0-0"] + "-") for p in sim.pods())
        return seen if ok else None

    seen = wait_for(settled, what="every Job in its phase", show=lambda: {
        u: (j.phase.value, j.message) for u, j in observed(cluster).items()})
    for unit, (_, gpus, _) in cases.items():
        job = seen[unit]
        assert job.name == names[unit] and job.attempt == 1 and job.gpus == gpus, unit
        assert job.created_at == NOW  # our own clock, from the created-at annotation
    assert seen["starting-0-0"].started_at is None
    assert seen["unplaceable-0-0"].started_at is None
    # both pending: one on its node, its container being created; the other never placed
    (starting,) = [p for p in sim.pods() if p.name.startswith(names["starting-0-0"] + "-")]
    assert starting.state == "pending" and starting.node == sim.node_names[0]
    assert not [p for p in sim.pods() if p.name.startswith(names["unplaceable-0-0"] + "-")]
    assert "exit code 1" in seen["failed-0-0"].message
    assert seen["suspended-0-0"].message == "Job suspended"  # the Job controller's condition
    assert seen["suspended-0-0"].stop_kind is None

    # server times come back on the daemon's clock: shifted by (our creation - theirs)
    def shift(unit: str) -> timedelta:
        created = server.job(names[unit])["metadata"]["creationTimestamp"]
        return NOW - server_time(created)

    running = seen["running-0-0"]
    container = server.pod_of(names["running-0-0"])["status"]["containerStatuses"][0]
    began = server_time(container["state"]["running"]["startedAt"])
    assert running.started_at == began + shift("running-0-0")  # the container's start...
    assert NOW < running.started_at < NOW + timedelta(seconds=30)
    job_start = server_time(server.job(names["running-0-0"])["status"]["startTime"])
    assert running.started_at > job_start + shift("running-0-0")  # ...not the Job's
    done = seen["succeeded-0-0"]
    completed = server_time(server.job(names["succeeded-0-0"])["status"]["completionTime"])
    assert done.finished_at == completed + shift("succeeded-0-0")
    assert NOW <= done.started_at <= done.finished_at < NOW + timedelta(seconds=30)
    failed = seen["failed-0-0"]
    assert failed.finished_at is not None
    assert NOW <= failed.finished_at < NOW + timedelta(seconds=30)


def test_observe_reports_stopping_while_the_pod_terminates_then_suspended(
        server: Server, node_sim) -> None:
    labels = {"idlegpu.test/pool": secrets.token_hex(4)}
    sim = node_sim(1, 8, labels=labels, start_delay=0.3, shutdown_seconds=3.0)
    cluster = server.cluster(labels)
    name = cluster.apply("req7-0-1", 2, make_spec(), team="nlp", stop_by=None, now=NOW)
    wait_for(lambda: [j.phase for j in cluster.observe()] == [JobPhase.RUNNING], what="running")
    (pod,) = sim.running_pods()
    cluster.stop(name, reason="preempt", kind=StopKind.PREEMPT, now=NOW)
    # the pod checkpoints (SIGTERM to exit): it still holds its GPUs
    (job,) = cluster.observe()
    assert job.phase is JobPhase.STOPPING and not job.phase.is_over()
    assert job.message.startswith("stopping") and job.stop_kind is StopKind.PREEMPT
    job = wait_for(lambda: next((j for j in cluster.observe()
                                 if j.phase is not JobPhase.STOPPING), None),
                   what="the pod gone")
    assert sim.pod(server.ns, pod.name).exit_code == 143
    assert job.phase is JobPhase.SUSPENDED and job.phase.is_over() and job.attempt == 2
    assert job.stop_kind is StopKind.PREEMPT and job.message == "preempt"


def test_a_stop_marks_the_pods_disrupted_before_it_suspends_the_job(server: Server,
                                                                  gpu_node) -> None:
    sim, labels = gpu_node
    cluster = server.cluster(labels)
    name = cluster.apply("req7-0-1", 1, make_spec(), team="nlp", stop_by=None, now=NOW)
    wait_for(lambda: [j.phase for j in cluster.observe()] == [JobPhase.RUNNING], what="running")
    (running,) = sim.running_pods()
    before = len(server.sent)
    cluster.stop(name, reason="window closes", kind=StopKind.PLANNED, now=NOW)
    sent = [(r.method, r.path.rsplit("/", 2)[-2:], r.content_type)
            for r in server.sent[before:] if r.method != "GET" or "pods" in r.path]
    # list the Job's pods, mark each (one strategic merge on pods/status), suspend (a 409 from
    # the Job controller's status write means read, list and send again), list again
    marks = [i for i, r in enumerate(sent) if r[1] == [running.name, "status"]]
    suspends = [i for i, r in enumerate(sent) if r[0] == "PATCH" and r[1] == ["jobs", name]]
    assert len(marks) == 1 and sent[marks[0]][2] == "application/strategic-merge-patch+json"
    assert sent[0][0] == "GET" and marks[0] < suspends[0]
    assert sent[-1][0] == "GET" and suspends[-1] == len(sent) - 2  # nothing left unmarked
    pod = sim.wait_pod(server.ns, running.name, "exited")
    target = next(c for c in pod.last_object["status"]["conditions"]
                  if c["type"] == "DisruptionTarget")
    assert (target["status"], target["reason"]) == ("True", "StoppedByIdlegpu")
    assert target["message"] == "stopped by idlegpu (planned): window closes"
    # the server's time, not the daemon's (NOW is in March): the disruption controller would
    # reset a condition it takes for stale
    marked_at = server_time(target["lastTransitionTime"].replace("Z", "+00:00"))
    assert abs((marked_at - datetime.now(UTC)).total_seconds()) < 60
    assert pod.exit_code == 143 and pod.phase == "Failed"
    job = wait_for(lambda: next((j for j in cluster.observe()
                                 if j.phase is not JobPhase.STOPPING), None), what="stopped")
    assert job.phase is JobPhase.SUSPENDED
    conditions = {c["type"] for c in server.job(name)["status"]["conditions"]}
    assert conditions == {"Suspended"}


def test_a_stop_without_the_pods_status_grant_still_stops(server: Server, gpu_node,
                                                          caplog) -> None:
    """An older Role (jobs and pods, no pods/status): the stop goes ahead (the service needs
    the GPUs), with one warning naming the grant, and is still read as ours."""
    _sim, labels = gpu_node
    rbac = kubernetes.client.RbacAuthorizationV1Api(server.admin)
    rbac.create_namespaced_role(server.ns, {"metadata": {"name": "old-idlegpu"}, "rules": [
        {"apiGroups": ["batch"], "resources": ["jobs"],
         "verbs": ["get", "list", "create", "patch", "delete"]},
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list"]}]})
    rbac.create_namespaced_role_binding(server.ns, {
        "metadata": {"name": "old-idlegpu"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                    "name": "old-idlegpu"},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User",
                      "name": "nobody"}]})
    cluster = KubernetesCluster.from_config(server.plane.kubeconfig_for("nobody"),
                                            namespace=server.ns, node_selector=labels,
                                            tolerations=TOLERATIONS, backoff_s=0.0)
    wait_for(lambda: _may(cluster, "list", "pods"), what="the RoleBinding in force")
    name = cluster.apply("req7-0-1", 1, make_spec(), team="nlp", stop_by=None, now=NOW)
    wait_for(lambda: [j.phase for j in cluster.observe()] == [JobPhase.RUNNING], what="running")
    with caplog.at_level("WARNING"):
        cluster.stop(name, reason="r", kind=StopKind.PLANNED, now=NOW)
        cluster.stop(name, reason="r", kind=StopKind.PLANNED, now=NOW)
    warnings = [r.getMessage() for r in caplog.records if "cannot mark" in r.getMessage()]
    assert len(warnings) == 1 and "grant pods/status: patch" in warnings[0]
    assert server.job(name)["spec"]["suspend"] is True
    job = wait_for(lambda: next((j for j in cluster.observe()
                                 if j.phase.is_over()), None), what="stopped", timeout=40)
    assert job.stop_kind is StopKind.PLANNED  # ours, whatever the Job controller made of it


def _may(cluster: KubernetesCluster, verb: str, resource: str) -> bool:
    review = kubernetes.client.AuthorizationV1Api(cluster.api_client)
    return review.create_self_subject_access_review({"spec": {"resourceAttributes": {
        "namespace": cluster.namespace, "resource": resource, "verb": verb}}}).status.allowed


def test_a_planned_stop_enforced_by_the_deadline_is_a_stop_not_a_failure(
        server: Server, gpu_node) -> None:
    _, labels = gpu_node
    # the safety net fires after 3 s: the daemon was not there to stop them
    cluster = server.cluster(labels, active_deadline_seconds=3)
    planned = cluster.apply("win-0-0", 1, make_spec(), team="nlp", stop_by=STOP_BY, now=NOW)
    unplanned = cluster.apply("cap-0-0", 1, make_spec(), team="nlp", stop_by=None, now=NOW)
    assert server.job(planned)["spec"]["activeDeadlineSeconds"] == 3
    seen = wait_for(lambda: (s := observed(cluster)) and all(
        j.phase.is_over() for j in s.values()) and len(s) == 2 and s,
        what="both Jobs ended by their deadline")
    for name in (planned, unplanned):
        (failed,) = [c for c in server.job(name)["status"]["conditions"]
                     if c["type"] == "Failed"]
        assert failed["reason"] == "DeadlineExceeded"
    assert seen["win-0-0"].phase is JobPhase.DISRUPTED
    assert "planned stop (2026-03-02T14:00:00Z)" in seen["win-0-0"].message
    assert seen["cap-0-0"].phase is JobPhase.FAILED  # ran past the cap: a real failure


def test_a_renewal_moves_the_jobs_stop_and_its_deadline_on_the_real_server(
        server: Server) -> None:
    """A renewed window moves the Job's planned stop and its safety-net deadline by as much,
    in one write the real server takes on a live Job; again, nothing more; to its end, the
    cap (none here) and no stop."""
    cluster = server.cluster()
    name = cluster.apply("ren-0-0", 1, make_spec(), team="nlp", stop_by=STOP_BY, now=NOW)
    first = server.job(name)["spec"]["activeDeadlineSeconds"]
    assert first == 5 * 3600 + cluster.grace_seconds
    later = STOP_BY + 2 * HOUR
    for _ in range(2):  # a retry of the same renewal changes nothing more
        assert cluster.renew(name, stop_by=later)
        job = server.job(name)
        assert job["spec"]["activeDeadlineSeconds"] == first + 7200
        assert job["metadata"]["annotations"]["idlegpu.io/stop-by"] == "2026-03-02T16:00:00Z"
    assert cluster.renew(name, stop_by=None)
    job = server.job(name)
    assert "activeDeadlineSeconds" not in job["spec"]
    assert "idlegpu.io/stop-by" not in job["metadata"]["annotations"]
    capped = server.cluster(active_deadline_seconds=6 * 3600)
    other = capped.apply("ren-1-0", 1, make_spec(), team="nlp", stop_by=STOP_BY, now=NOW)
    assert capped.renew(other, stop_by=STOP_BY + 3 * HOUR)
    assert server.job(other)["spec"]["activeDeadlineSeconds"] == 6 * 3600  # the cap holds
    assert not cluster.renew("idlegpu-gone-a1", stop_by=later)  # a Job that is gone
    # a write between its read and its patch (as the Job controller's of a new Job's status):
    # the real server refuses the patch of the old version, and the renewal reads again
    read = cluster._get
    calls = []

    def read_then_written(job_name):
        job = read(job_name)
        if not calls:
            server.batch.patch_namespaced_job(job_name, server.ns,
                                              {"metadata": {"labels": {"touched": "yes"}}})
        calls.append(job_name)
        return job

    third = cluster.apply("ren-2-0", 1, make_spec(), team="nlp", stop_by=STOP_BY, now=NOW)
    cluster._get = read_then_written  # type: ignore[method-assign]
    assert cluster.renew(third, stop_by=later) and len(calls) == 2
    assert server.job(third)["spec"]["activeDeadlineSeconds"] == first + 7200


def test_the_job_controller_honours_a_deadline_a_renewal_moved(server: Server,
                                                                gpu_node) -> None:
    """On a live Job whose pod runs, the real Job controller ends it at its deadline; moved
    by a renewal, the same deadline no longer ends it."""
    _, labels = gpu_node
    cluster = server.cluster(labels)
    names = [cluster.apply(f"dl{i}-0-0", 1, make_spec(), team="nlp", stop_by=STOP_BY, now=NOW)
             for i in range(2)]
    wait_for(lambda: all(observed(cluster).get(f"dl{i}-0-0") and observed(cluster)[
        f"dl{i}-0-0"].phase is JobPhase.RUNNING for i in range(2)), what="both pods running")
    for name in names:  # a deadline a few seconds ahead of the Jobs' start, set by an admin
        server.batch.patch_namespaced_job(name, server.ns, {"spec": {"activeDeadlineSeconds": 8}})
    assert cluster.renew(names[1], stop_by=STOP_BY + HOUR)
    assert server.job(names[1])["spec"]["activeDeadlineSeconds"] == 8 + 3600
    wait_for(lambda: any(c["type"] == "Failed" for c in (server.job(names[0])["status"].get(
        "conditions") or [])), what="the deadline kept ending its Job")
    renewed = server.job(names[1])["status"]
    assert not any(c["type"] == "Failed" for c in renewed.get("conditions") or [])
    assert renewed.get("active") == 1


# --- ownership ------------------------------------------------------------------------------


def test_observe_honours_the_label_selector(server: Server) -> None:
    cluster = server.cluster()
    cluster.apply("req7-0-1", 1, make_spec(), team="nlp", stop_by=None, now=NOW)
    template = {"spec": {"restartPolicy": "Never", "containers": [
        {"name": "etl", "image": "busybox", "command": ["true"]}]}}
    server.batch.create_namespaced_job(server.ns, {
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"name": "someone-else", "labels": {"app": "etl"}},
        "spec": {"suspend": True, "template": template}})
    elsewhere = server.plane.create_namespace(f"elsewhere-{secrets.token_hex(3)}")
    try:
        server.batch.create_namespaced_job(elsewhere, {
            "apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "elsewhere", "labels": {
                "app.kubernetes.io/managed-by": "idlegpu", "idlegpu.io/unit": "x"}},
            "spec": {"suspend": True, "template": template}})
        before = len(server.sent)
        jobs = cluster.observe()
    finally:
        server.plane.delete_namespace(elsewhere)
    assert [j.name for j in jobs] == ["idlegpu-req7-0-1-a1"]
    listings = server.sent[before:]
    assert [(r.method, r.path) for r in listings] == [
        ("GET", f"/apis/batch/v1/namespaces/{server.ns}/jobs"),
        ("GET", f"/api/v1/namespaces/{server.ns}/pods")]
    assert {r.query["labelSelector"] for r in listings} == {"app.kubernetes.io/managed-by=idlegpu"}


def test_an_instance_sees_and_adopts_only_its_own_jobs(server: Server) -> None:
    ours, theirs = server.cluster(instance="pool-a-1234"), server.cluster(instance="b")
    mine = ours.apply("u-0-0", 1, make_spec(), team="nlp", stop_by=None, now=NOW)
    theirs.apply("v-0-0", 1, make_spec(), team="nlp", stop_by=None, now=NOW)
    assert server.job(mine)["metadata"]["labels"]["idlegpu.io/instance"] == "pool-a-1234"
    assert [j.unit_id for j in ours.observe()] == ["u-0-0"]
    assert [j.unit_id for j in theirs.observe()] == ["v-0-0"]
    assert server.sent[-2].query["labelSelector"].endswith(",idlegpu.io/instance=b")
    with pytest.raises(JobConflictError, match="this idlegpu instance"):
        theirs.apply("u-0-0", 1, make_spec(), team="nlp", stop_by=None, now=NOW)
    assert server.jobs() == [mine, "idlegpu-v-0-0-a1"]


# --- credentials ----------------------------------------------------------------------------


@pytest.fixture
def nobody_may(server: Server) -> Callable[..., KubernetesCluster]:
    """``nobody_may(*verbs) -> KubernetesCluster`` as the unprivileged user ``nobody``,
    granted only ``verbs`` on Jobs in the test's namespace (none: no right at all)."""
    sleeps: list[float] = []

    def grant(*verbs: str) -> KubernetesCluster:
        rbac = kubernetes.client.RbacAuthorizationV1Api(server.admin)
        cluster = KubernetesCluster.from_config(
            server.plane.kubeconfig_for("nobody"), namespace=server.ns, backoff_s=0.5,
            sleep=sleeps.append)
        cluster.sleeps = sleeps  # type: ignore[attr-defined]
        cluster.sent = record_requests(cluster.api_client)  # type: ignore[attr-defined]
        if verbs:
            name = "nobody-" + "-".join(verbs)
            rbac.create_namespaced_role(server.ns, {
                "metadata": {"name": name},
                "rules": [{"apiGroups": ["batch"], "resources": ["jobs"],
                           "verbs": list(verbs)}]})
            rbac.create_namespaced_role_binding(server.ns, {
                "metadata": {"name": name},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                            "name": name},
                "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User",
                              "name": "nobody"}]})
            review = kubernetes.client.AuthorizationV1Api(cluster.api_client)
            wait_for(lambda: review.create_self_subject_access_review({"spec": {
                "resourceAttributes": {"namespace": server.ns, "group": "batch",
                                       "resource": "jobs", "verb": verbs[0]}}}).status.allowed,
                     timeout=10, what="the RoleBinding in force")
        return cluster

    return grant


@pytest.mark.parametrize("verb", ["create", "list", "patch", "delete"])
def test_forbidden_names_the_missing_permission(server: Server, nobody_may, verb: str) -> None:
    name = "idlegpu-req7-0-1-a1"
    if verb == "patch":  # it may read the Job, not change it
        server.cluster().apply("req7-0-1", 1, make_spec(), team="nlp", stop_by=None, now=NOW)
        cluster = nobody_may("get")
    else:
        cluster = nobody_may()
    with pytest.raises(ClusterPermissionError) as err:
        if verb == "create":
            cluster.apply("req7-0-1", 1, make_spec(), team="nlp", stop_by=None, now=NOW)
        elif verb == "list":
            cluster.observe()
        elif verb == "delete":
            cluster.delete(name)
        else:
            cluster.stop(name, reason="r", kind=StopKind.PREEMPT, now=NOW)
    message = str(err.value)
    assert f"Kubernetes denied '{verb}' on jobs.batch in namespace {server.ns}" in message
    assert "Role" in message and "\n" not in message
    assert "jobs.batch: get, list, create, patch, delete; pods: get, list" in message
    # the real server's Status: who was refused what
    assert f'User "nobody" cannot {verb} resource "jobs"' in message
    assert isinstance(err.value, PermanentError)
    method = {"create": "POST", "list": "GET", "patch": "PATCH", "delete": "DELETE"}[verb]
    assert sum(r.method == method for r in cluster.sent) == 1  # never retried
    assert cluster.sleeps == []
    if verb == "patch":
        assert server.job(name)["spec"]["suspend"] is False


def test_from_config_reads_a_kubeconfig(server: Server) -> None:
    cluster = KubernetesCluster.from_config(server.plane.kubeconfig, context="admin",
                                            namespace=server.ns, backoff_s=0.0)
    assert cluster.observe() == []
    cluster.apply("u-0-0", 1, make_spec(), team="nlp", stop_by=None, now=NOW)
    assert server.jobs() == ["idlegpu-u-0-0-a1"]
    with pytest.raises(PermanentError, match="cannot load Kubernetes config"):
        KubernetesCluster.from_config(server.plane.kubeconfig, context="missing",
                                      namespace=server.ns)
    with pytest.raises(PermanentError, match="in-cluster"):
        KubernetesCluster.from_config(in_cluster=True, namespace=server.ns)


def test_unauthorized_says_credentials(server: Server) -> None:
    # a bearer token the server never issued: the real authenticator answers 401
    (cluster,) = json.loads(Path(server.plane.kubeconfig).read_text())["clusters"]
    configuration = kubernetes.client.Configuration()
    configuration.host = cluster["cluster"]["server"]
    configuration.ssl_ca_cert = cluster["cluster"]["certificate-authority"]
    configuration.api_key = {"authorization": f"Bearer {secrets.token_hex(16)}"}
    sleeps: list[float] = []
    with kubernetes.client.ApiClient(configuration) as client:
        adapter = KubernetesCluster(client, namespace=server.ns, backoff_s=0.5,
                                    sleep=sleeps.append)
        with pytest.raises(ClusterPermissionError,
                           match="rejected the credentials for 'list'") as err:
            adapter.observe()
    assert "HTTP 401" in str(err.value) and "\n" not in str(err.value)
    assert sleeps == []  # not retried
