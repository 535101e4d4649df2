"""The Kubernetes adapter: its pure parts (names, labels, manifests, pod security, the real
schema), and what only a fake API server can produce on demand (tests/fake_kube.py, over real
HTTP with the official ``kubernetes`` client in between): 5xx and dropped connections, timeouts,
a lost response, a server going away, statuses a 1.36 server never writes, counting requests.
Each such test names its fault ("fake API server: ...").

Everything a real server does by itself (create and adopt, 422, stop, delete, observe, label
selectors and instances, RBAC 403, 401, kubeconfigs) runs against the real control plane in
tests/test_kube_adapter_real.py."""

from __future__ import annotations

import logging
import re
from collections.abc import Iterator
from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest
from fake_kube import FakeKube

from idlegpu.forecast.errors import PermanentError, TemporaryError
from idlegpu.scheduler.adapters.kubernetes import (
    ClusterUnavailableError,
    KubernetesCluster,
    UnsafeManifestError,
    check_pod_security,
    job_name,
    label_value,
)
from idlegpu.scheduler.ports import Cluster, JobPhase, StopKind
from idlegpu.scheduler.types import EnvFromSource, EnvKeyRef, UnitSpec, UnitVolume

NS = "research"
NOW = datetime(2026, 3, 2, 9, 0, tzinfo=UTC)
STOP_BY = NOW + timedelta(hours=5)
HOUR = timedelta(hours=1)
NODE_SELECTOR = {"pool": "inference-gpu"}
TOLERATIONS = [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
DNS_1123 = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


def make_spec(**kw: object) -> UnitSpec:
    base = UnitSpec(
        step="train", step_index=0, member=0, image="registry.example/llm/train:1.2",
        command=("python", "-m", "train"), args=("--epochs", "3"),
        env=(("WANDB_MODE", "offline"),), parameters=(), gpus=2, cpu=8.0, memory="64Gi",
        runtime_estimate_s=7200.0, checkpointable=True, checkpoint_interval_s=900.0,
        resume_args=("--resume", "/ckpt/last"), priority=0, deadline=None,
        max_preemptions=None, output="s3://bucket/out", depends_on=())
    return replace(base, **kw)


def full_spec(**kw: object) -> UnitSpec:
    """A unit using every volume kind, both kinds of secret reference and ephemeral storage."""
    values: dict[str, object] = {
        "volumes": (
            UnitVolume("ckpt", "persistent_volume_claim", "/ckpt", "ckpt-nlp",
                       sub_path="sft/train/0"),
            UnitVolume("data", "persistent_volume_claim", "/data", "datasets", read_only=True),
            UnitVolume("dshm", "empty_dir", "/dev/shm", medium="Memory", size_limit="16Gi"),
            UnitVolume("scratch", "empty_dir", "/scratch", size_limit="100Gi"),
            UnitVolume("tmp", "empty_dir", "/tmp"),
            UnitVolume("recipes", "config_map", "/etc/recipes", "sft-recipes", read_only=True),
            UnitVolume("hf-token", "secret", "/var/run/secrets/hf", "hf-token", read_only=True),
        ),
        "env_from": (EnvFromSource("config_map", "nccl-tuning"),
                     EnvFromSource("secret", "s3-creds", prefix="AWS_", optional=True)),
        "env_refs": (EnvKeyRef("WANDB_API_KEY", "secret", "wandb", "api-key"),
                     EnvKeyRef("RECIPE", "config_map", "sft-recipes", "default", optional=True)),
        "ephemeral_storage_request": "50Gi", "ephemeral_storage_limit": "200Gi"}
    values.update(kw)
    return make_spec(**values)


@pytest.fixture
def kube() -> Iterator[FakeKube]:
    with FakeKube() as fake:
        yield fake


def cluster_for(kube: FakeKube | None, **kw: object) -> KubernetesCluster:
    args: dict[str, object] = {"namespace": NS, "node_selector": NODE_SELECTOR,
                               "tolerations": TOLERATIONS, "backoff_s": 0.0,
                               "request_timeout_s": 5.0}
    args.update(kw)
    return KubernetesCluster(kube.api_client() if kube else None, **args)  # type: ignore[arg-type]


@pytest.fixture
def cluster(kube: FakeKube) -> KubernetesCluster:
    return cluster_for(kube)


def manifest(cluster: KubernetesCluster, attempt: int = 1, **kw: object) -> dict:
    return cluster.manifest("req7-0-1", attempt, make_spec(**kw), "nlp", STOP_BY, NOW)


# --- names and manifests (pure) -----------------------------------------------------------


def test_implements_the_cluster_protocol(cluster: KubernetesCluster) -> None:
    port: Cluster = cluster
    assert port.job_name("req7-0-1", 1) == "idlegpu-req7-0-1-a1"


def test_names_are_deterministic_dns_labels_and_distinct() -> None:
    assert job_name("req7-0-1", 3) == job_name("req7-0-1", 3) == "idlegpu-req7-0-1-a3"
    long = "x" * 200 + "-0-0"
    weird = ["Req_7/0:1", "req.7.0.1", "REQ-7-0-1", long, long[:-1] + "1", "---", "é"]
    names = [job_name(u, 12) for u in weird]
    for name in names:
        assert len(name) <= 63 and DNS_1123.match(name), name
        assert name.endswith("-a12")
    assert len(set(names)) == len(names)
    # ids that sanitize alike still get distinct names (the hash of the exact id)
    assert job_name("a_b-0-0", 1) != job_name("a.b-0-0", 1)
    with pytest.raises(ValueError):
        job_name("u", 0)


def test_label_values_are_valid_and_distinct() -> None:
    valid = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
    values = ["nlp", "team/a", "x" * 80, "x" * 79 + "y", "-lead", "trail."]
    labels = [label_value(v) for v in values]
    assert labels[0] == "nlp"
    for label in labels:
        assert len(label) <= 63 and valid.match(label), label
    assert len(set(labels)) == len(labels)


def test_manifest_times_are_utc_whatever_zone_the_clock_is_in(cluster: KubernetesCluster
                                                              ) -> None:
    # the newcomer's friction: a replay's --now in +09:00 wrote created-at "+09:00" beside
    # stop-by "Z"; every time we write is RFC 3339 UTC, as the API server's own fields are
    from zoneinfo import ZoneInfo

    seoul = ZoneInfo("Asia/Seoul")
    m = cluster.manifest("req7-0-1", 1, make_spec(), "nlp", STOP_BY.astimezone(seoul),
                         NOW.astimezone(seoul))
    annotations = m["metadata"]["annotations"]
    assert annotations["idlegpu.io/created-at"] == "2026-03-02T09:00:00Z"
    assert annotations["idlegpu.io/stop-by"] == "2026-03-02T14:00:00Z"


def test_manifest_golden(cluster: KubernetesCluster) -> None:
    m = manifest(cluster)
    assert m["apiVersion"] == "batch/v1" and m["kind"] == "Job"
    meta = m["metadata"]
    assert meta["name"] == "idlegpu-req7-0-1-a1" and meta["namespace"] == NS
    assert meta["labels"] == {
        "app.kubernetes.io/managed-by": "idlegpu", "idlegpu.io/unit": "req7-0-1",
        "idlegpu.io/team": "nlp", "idlegpu.io/attempt": "1"}
    assert meta["annotations"]["idlegpu.io/stop-by"] == "2026-03-02T14:00:00Z"
    assert meta["annotations"]["idlegpu.io/created-at"] == "2026-03-02T09:00:00Z"
    assert meta["annotations"]["idlegpu.io/unit-id"] == "req7-0-1"
    spec = m["spec"]
    assert spec["backoffLimit"] == 0
    # the safety net of the planned stop: 5 h to stop_by, plus the 600 s grace period
    assert spec["activeDeadlineSeconds"] == 5 * 3600 + 600
    assert spec["podFailurePolicy"]["rules"][0] == {
        "action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]}
    assert spec["podFailurePolicy"]["rules"][1]["action"] == "FailJob"
    assert spec["template"]["metadata"]["labels"] == meta["labels"]
    pod = spec["template"]["spec"]
    assert pod["restartPolicy"] == "Never"
    assert pod["priorityClassName"] == "idlegpu-best-effort"
    assert pod["terminationGracePeriodSeconds"] == 600
    assert pod["nodeSelector"] == NODE_SELECTOR and pod["tolerations"] == TOLERATIONS
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert not any(pod.get(k) for k in ("hostNetwork", "hostPID", "hostIPC", "volumes"))
    (container,) = pod["containers"]
    assert container["image"] == "registry.example/llm/train:1.2"
    assert container["command"] == ["python", "-m", "train"]
    assert container["args"] == ["--epochs", "3"]
    resources = {"nvidia.com/gpu": "2", "cpu": "8", "memory": "64Gi"}
    assert container["resources"] == {"limits": resources, "requests": resources}
    ctx = container["securityContext"]
    assert ctx["allowPrivilegeEscalation"] is False and ctx["privileged"] is False
    assert ctx["runAsNonRoot"] is True and ctx["capabilities"] == {"drop": ["ALL"]}
    env = {e["name"]: e["value"] for e in container["env"]}
    assert env["WANDB_MODE"] == "offline" and env["IDLEGPU_ATTEMPT"] == "1"
    assert env["IDLEGPU_OUTPUT"] == "s3://bucket/out"
    assert "IDLEGPU_RESUME" not in env  # first attempt: nothing to resume
    # pure: same inputs, same manifest
    assert manifest(cluster) == m


def test_manifest_grace_resume_and_options(kube: FakeKube) -> None:
    cluster = cluster_for(kube, active_deadline_seconds=86400, backoff_limit=2,
                          priority_class=None, grace_seconds=900, run_as_user=1000,
                          ttl_seconds_after_finished=3600)
    resumed = manifest(cluster, attempt=3)
    env = {e["name"]: e["value"] for e in resumed["spec"]["template"]["spec"]["containers"][0]
           ["env"]}
    assert env["IDLEGPU_RESUME"] == "--resume /ckpt/last"
    assert resumed["metadata"]["name"].endswith("-a3")
    assert resumed["spec"]["activeDeadlineSeconds"] == 5 * 3600 + 900  # below the 1-day cap
    assert resumed["spec"]["backoffLimit"] == 2
    assert resumed["spec"]["ttlSecondsAfterFinished"] == 3600
    assert resumed["spec"]["template"]["spec"]["securityContext"]["runAsUser"] == 1000
    pod = resumed["spec"]["template"]["spec"]
    assert "priorityClassName" not in pod
    assert pod["terminationGracePeriodSeconds"] == 900

    plain = manifest(cluster, attempt=3, checkpointable=False, cpu=1.5, gpus=0)
    pod = plain["spec"]["template"]["spec"]
    assert pod["terminationGracePeriodSeconds"] == 30
    env = {e["name"] for e in pod["containers"][0]["env"]}
    assert "IDLEGPU_RESUME" not in env
    assert pod["containers"][0]["resources"]["limits"] == {"cpu": "1500m", "memory": "64Gi"}
    with pytest.raises(UnsafeManifestError, match="runAsUser=0"):
        manifest(cluster_for(kube, run_as_user=0))
    no_stop = cluster.manifest("u-0-0", 1, make_spec(), "nlp", None, NOW)
    assert "idlegpu.io/stop-by" not in no_stop["metadata"]["annotations"]
    assert no_stop["spec"]["activeDeadlineSeconds"] == 86400  # the cap alone
    assert "activeDeadlineSeconds" not in cluster_for(kube).manifest(
        "u-0-0", 1, make_spec(), "nlp", None, NOW)["spec"]  # no cap, no planned stop
    affinity = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchExpressions": [
            {"key": "nvidia.com/gpu.product", "operator": "In", "values": ["H100"]}]}]}}}
    pod = manifest(cluster_for(kube, affinity=affinity))["spec"]["template"]["spec"]
    assert pod["affinity"] == affinity


def test_manifest_carries_volumes_secret_references_and_ephemeral_storage(
        cluster: KubernetesCluster) -> None:
    m = cluster.manifest("req7-0-1", 1, full_spec(), "nlp", STOP_BY, NOW)
    pod = m["spec"]["template"]["spec"]
    assert pod["volumes"] == [
        {"name": "ckpt", "persistentVolumeClaim": {"claimName": "ckpt-nlp"}},
        {"name": "data", "persistentVolumeClaim": {"claimName": "datasets", "readOnly": True}},
        {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "16Gi"}},
        {"name": "scratch", "emptyDir": {"sizeLimit": "100Gi"}},
        {"name": "tmp", "emptyDir": {}},
        {"name": "recipes", "configMap": {"name": "sft-recipes"}},
        {"name": "hf-token", "secret": {"secretName": "hf-token"}},
    ]
    (container,) = pod["containers"]
    assert container["volumeMounts"] == [
        {"name": "ckpt", "mountPath": "/ckpt", "subPath": "sft/train/0"},
        {"name": "data", "mountPath": "/data", "readOnly": True},
        {"name": "dshm", "mountPath": "/dev/shm"},
        {"name": "scratch", "mountPath": "/scratch"},
        {"name": "tmp", "mountPath": "/tmp"},
        {"name": "recipes", "mountPath": "/etc/recipes", "readOnly": True},
        {"name": "hf-token", "mountPath": "/var/run/secrets/hf", "readOnly": True},
    ]
    assert container["envFrom"] == [
        {"configMapRef": {"name": "nccl-tuning"}},
        {"secretRef": {"name": "s3-creds", "optional": True}, "prefix": "AWS_"},
    ]
    refs = [e for e in container["env"] if "valueFrom" in e]
    assert refs == [
        {"name": "WANDB_API_KEY", "valueFrom": {"secretKeyRef": {"name": "wandb",
                                                                 "key": "api-key"}}},
        {"name": "RECIPE", "valueFrom": {"configMapKeyRef": {"name": "sft-recipes",
                                                             "key": "default",
                                                             "optional": True}}},
    ]
    names = [e["name"] for e in container["env"]]
    assert len(names) == len(set(names)) and "IDLEGPU_ATTEMPT" in names
    resources = container["resources"]
    assert resources["limits"]["ephemeral-storage"] == "200Gi"
    assert resources["requests"]["ephemeral-storage"] == "50Gi"
    assert resources["limits"]["nvidia.com/gpu"] == "2"
    check_pod_security(m)
    # a secret volume is read-only even when the stored unit says otherwise
    loose = full_spec(volumes=(UnitVolume("tok", "secret", "/tok", "hf-token"),))
    mounts = cluster.manifest("u-0-0", 1, loose, "nlp", None, NOW)["spec"]["template"]["spec"][
        "containers"][0]["volumeMounts"]
    assert mounts == [{"name": "tok", "mountPath": "/tok", "readOnly": True}]


def test_a_unit_without_new_fields_renders_as_before(cluster: KubernetesCluster) -> None:
    container = manifest(cluster)["spec"]["template"]["spec"]["containers"][0]
    assert not {"volumeMounts", "envFrom"} & set(container)
    assert "ephemeral-storage" not in container["resources"]["limits"]
    assert all("valueFrom" not in e for e in container["env"])


@pytest.mark.parametrize("volume", [
    UnitVolume("h", "host_path", "/host", "/"),
    UnitVolume("n", "nfs", "/nfs", "server:/export"),
])
def test_a_stored_unit_with_a_forbidden_volume_never_becomes_a_manifest(
        cluster: KubernetesCluster, volume: UnitVolume) -> None:
    with pytest.raises(UnsafeManifestError, match="pod security"):
        cluster.manifest("u-0-0", 1, make_spec(volumes=(volume,)), "nlp", None, NOW)


@pytest.mark.parametrize("mutate", [
    lambda pod: pod.__setitem__("hostNetwork", True),
    lambda pod: pod.__setitem__("hostPID", True),
    lambda pod: pod.__setitem__("hostIPC", True),
    lambda pod: pod.__setitem__("volumes", [{"name": "h", "hostPath": {"path": "/"}}]),
    lambda pod: pod["containers"][0]["securityContext"].__setitem__("privileged", True),
    lambda pod: pod["containers"][0]["securityContext"].__setitem__(
        "allowPrivilegeEscalation", True),
    lambda pod: pod["containers"][0]["securityContext"]["capabilities"].__setitem__(
        "add", ["SYS_ADMIN"]),
    lambda pod: pod["securityContext"].__setitem__("runAsNonRoot", False),
    lambda pod: pod.setdefault("initContainers", []).append(
        {"name": "i", "image": "x", "securityContext": {"privileged": True}}),
    lambda pod: pod.__setitem__("volumes", [{"name": "n", "nfs": {"server": "s", "path": "/"}}]),
    lambda pod: pod.__setitem__("volumes", [{"name": "c", "csi": {"driver": "x"}}]),
    lambda pod: pod["containers"][0]["env"].append({"name": "NVIDIA_VISIBLE_DEVICES",
                                                    "value": "all"}),
    lambda pod: pod["containers"][0].__setitem__(
        "envFrom", [{"prefix": "NVIDIA_", "configMapRef": {"name": "x"}}]),
    lambda pod: pod["containers"][0].__setitem__(
        "volumeMounts", [{"name": "x", "mountPath": "/x", "mountPropagation": "Bidirectional"}]),
])
def test_security_check_rejects_privileged_manifests(cluster: KubernetesCluster,
                                                     mutate: object) -> None:
    m = manifest(cluster)
    check_pod_security(m)  # ours passes
    mutate(m["spec"]["template"]["spec"])  # type: ignore[operator]
    with pytest.raises(UnsafeManifestError, match="pod security") as err:
        check_pod_security(m)
    assert isinstance(err.value, PermanentError)


def test_manifest_validates_against_the_real_schema(cluster: KubernetesCluster) -> None:
    kubernetes_validate = pytest.importorskip("kubernetes_validate")
    full = cluster.manifest("req7-0-1", 2, full_spec(), "nlp", STOP_BY, NOW)
    for m in (manifest(cluster), manifest(cluster, attempt=2, checkpointable=False, gpus=0),
              full):
        for version in ("1.30", "1.33", "1.36"):
            kubernetes_validate.validate(m, version, strict=True)


def test_the_sft_volumes_example_becomes_a_valid_job(cluster: KubernetesCluster) -> None:
    """The documented request, through validation and expansion, to a Job the 1.36 schema and
    the pod security check accept, with every volume and reference in place."""
    from pathlib import Path

    from idlegpu.scheduler.config import AdmissionConfig
    from idlegpu.scheduler.specs import expand_units, load_request, recheck_unit

    kubernetes_validate = pytest.importorskip("kubernetes_validate")
    admission = AdmissionConfig(team_volumes={
        "alignment": {"persistent_volume_claims": ["ckpt-alignment"],
                      "secrets": ["wandb", "hf-token"], "config_maps": ["sft-recipes"]},
        "*": {"persistent_volume_claims": ["datasets"], "config_maps": ["nccl-tuning"]}})
    path = Path(__file__).resolve().parents[1] / "examples" / "jobs" / "sft-volumes.yaml"
    request = load_request(path, admission)
    (unit,) = expand_units(request)
    recheck_unit(unit, request.team, admission)
    m = cluster.manifest("sft-0-0", 1, unit, request.team, None, NOW)
    kubernetes_validate.validate(m, "1.36", strict=True)
    pod = m["spec"]["template"]["spec"]
    assert {next(k for k in v if k != "name") for v in pod["volumes"]} == {
        "persistentVolumeClaim", "emptyDir", "configMap", "secret"}
    container = pod["containers"][0]
    assert container["envFrom"] == [{"configMapRef": {"name": "nccl-tuning"}}]
    assert {"name": "WANDB_API_KEY", "valueFrom": {"secretKeyRef": {
        "name": "wandb", "key": "api-key"}}} in container["env"]
    assert {"name": "ckpt", "mountPath": "/ckpt",
            "subPath": "sft-ko-instruct-v2/main/0"} in container["volumeMounts"]


# --- apply ----------------------------------------------------------------------------------


def test_apply_survives_a_lost_create_response(kube: FakeKube,
                                               cluster: KubernetesCluster) -> None:
    """fake API server: a create the server carries out whose answer never arrives."""
    kube.fail_next(1, "lost")  # created on the server, answer never arrives
    name = cluster.apply("req7-0-1", 1, make_spec(), team="nlp", stop_by=None, now=NOW)
    assert len(kube.jobs) == 1 and kube.count("POST") == 2  # retried, got 409, adopted
    assert kube.job(name, NS)["metadata"]["labels"]["idlegpu.io/unit"] == "req7-0-1"


def test_dry_run_makes_no_api_call(kube: FakeKube, caplog: pytest.LogCaptureFixture) -> None:
    """fake API server: counting requests on the server's side (a dry run sends none)."""
    cluster = cluster_for(kube, dry_run=True)
    with caplog.at_level(logging.INFO, logger="idlegpu.scheduler.adapters.kubernetes"):
        name = cluster.apply("req7-0-1", 1, make_spec(), team="nlp", stop_by=None, now=NOW)
        cluster.stop(name, reason="test", kind=StopKind.PREEMPT, now=NOW)
    assert name == "idlegpu-req7-0-1-a1"
    assert kube.requests == [] and kube.jobs == {}
    assert cluster.last_manifests[-1]["metadata"]["name"] == name
    assert cluster.dry_run_stops == [(name, "test")]
    assert "would create Job research/idlegpu-req7-0-1-a1" in caplog.text
    # no client at all is fine in dry-run mode
    offline = cluster_for(None, dry_run=True)
    assert offline.apply("u-0-0", 1, make_spec(), team="t", stop_by=None, now=NOW)
    assert offline.observe() == []
    with pytest.raises(ValueError):
        cluster_for(None)


# --- delete ---------------------------------------------------------------------------------


def test_delete_is_retried_like_every_call(kube: FakeKube, cluster: KubernetesCluster) -> None:
    """fake API server: a 503 answering the delete."""
    name = cluster.apply("req7-0-1", 1, make_spec(), team="nlp", stop_by=None, now=NOW)
    cluster.stop(name, reason="preempt", kind=StopKind.PREEMPT, now=NOW)
    kube.fail_next(1, 503)  # retried like every call
    cluster.delete(name)
    with pytest.raises(KeyError):
        kube.job(name, NS)
    deletes = [r for r in kube.requests if r.method == "DELETE"]
    assert len(deletes) == 2
    assert all(d.query.get("propagationPolicy") == "Background" for d in deletes)


# --- observe --------------------------------------------------------------------------------


# fake API server: Job statuses the 1.36 server of the real tests never writes: no ``ready``
# count (servers before 1.24), and a Job failed for a pod evicted with DisruptionTarget (servers
# that count evictions against the backoff limit); what a real server writes is observed in
# tests/test_kube_adapter_real.py
STATUSES = {
    "old-cluster": ({"active": 1}, JobPhase.RUNNING),
    "disrupted": ({"failed": 1, "conditions": [
        {"type": "Failed", "status": "True", "reason": "BackoffLimitExceeded",
         "message": "pod evicted with DisruptionTarget"}]}, JobPhase.DISRUPTED),
}


def test_observe_maps_statuses_of_older_servers(kube: FakeKube,
                                                cluster: KubernetesCluster) -> None:
    """fake API server: statuses a 1.36 server never writes (see STATUSES)."""
    names = {}
    for i, (case, (status, _)) in enumerate(STATUSES.items()):
        names[case] = cluster.apply(f"{case}-0-0", 1, make_spec(gpus=i + 1), team="nlp",
                                    stop_by=None, now=NOW)
        kube.set_status(names[case], status)
    seen = {job.unit_id: job for job in cluster.observe()}
    assert set(seen) == {f"{case}-0-0" for case in STATUSES}
    for i, (case, (_, phase)) in enumerate(STATUSES.items()):
        job = seen[f"{case}-0-0"]
        assert job.phase is phase, case
        assert job.name == names[case] and job.attempt == 1 and job.gpus == i + 1
        assert job.created_at == NOW  # our own clock, from the created-at annotation
    assert "DisruptionTarget" in seen["disrupted-0-0"].message


def test_a_stopped_job_that_ends_failed_is_a_stop_not_a_failure(
        kube: FakeKube, cluster: KubernetesCluster) -> None:
    """fake API server: a suspended Job marked Failed once its pod exited 143, which the 1.36
    server of the real tests never does (test_kube_lifecycle.py checks a planned stop never
    fails there)."""
    # servers that fail a suspended Job whose pod exited 143 (our FailJob rule matches, since
    # a pod deleted through the API gets no DisruptionTarget): still our stop
    name = cluster.apply("req7-0-1", 1, make_spec(), team="nlp", stop_by=None, now=NOW)
    cluster.stop(name, reason="window closes", kind=StopKind.PLANNED, now=NOW + HOUR)
    kube.set_status(name, {"failed": 1, "conditions": [
        {"type": "Failed", "status": "True", "reason": "PodFailurePolicy",
         "message": "Container job for pod x failed with exit code 143 matching FailJob rule",
         "lastTransitionTime": "2026-03-02T10:00:05Z"}]})
    (job,) = cluster.observe()
    assert job.phase is JobPhase.DISRUPTED and job.stop_kind is StopKind.PLANNED
    assert "stopped (planned)" in job.message and "143" in job.message


# --- errors and retries ---------------------------------------------------------------------


def test_transient_5xx_is_retried_without_duplicates(kube: FakeKube) -> None:
    """fake API server: 503s, a 500 and a connection dropped before an answer, on demand."""
    sleeps: list[float] = []
    cluster = cluster_for(kube, backoff_s=0.5, sleep=sleeps.append)
    kube.fail_next(2, 503)
    name = cluster.apply("req7-0-1", 1, make_spec(), team="nlp", stop_by=None, now=NOW)
    assert kube.count("POST") == 3 and list(kube.jobs) == [(NS, name)]
    assert sleeps == [0.5, 1.0]  # exponential backoff
    kube.fail_next(1, 500)
    kube.fail_next(1, "drop")
    assert len(cluster.observe()) == 1


def test_timeouts_are_retried(kube: FakeKube) -> None:
    """fake API server: a request left unanswered past the client's timeout."""
    kube.timeout_s = 1.0
    cluster = cluster_for(kube, request_timeout_s=0.2)
    kube.fail_next(1, "timeout")
    assert cluster.observe() == []
    assert kube.count("GET") == 3  # the Jobs twice (one timed out), then the pods


def test_persistent_5xx_raises_cluster_unavailable(kube: FakeKube) -> None:
    """fake API server: 502 to every request."""
    cluster = cluster_for(kube, retries=2)
    kube.fail_next(10, 502)
    with pytest.raises(ClusterUnavailableError) as err:
        cluster.observe()
    assert isinstance(err.value, TemporaryError)
    message = str(err.value)
    assert "\n" not in message
    assert "list jobs.batch in namespace research failed after 3 attempt(s)" in message
    assert "HTTP 502" in message
    assert kube.count() == 3


def test_unreachable_server_raises_cluster_unavailable(kube: FakeKube) -> None:
    """fake API server: a server that goes away (its port closed) after the client was made;
    the session's real control plane cannot be taken down for one test."""
    client = kube.api_client()
    kube.stop()
    cluster = KubernetesCluster(client, namespace=NS, retries=1, backoff_s=0.0,
                                request_timeout_s=1.0)
    with pytest.raises(ClusterUnavailableError, match="after 2 attempt") as err:
        cluster.stop("idlegpu-x-a1", reason="r", kind=StopKind.PREEMPT, now=NOW)
    assert "\n" not in str(err.value)


