"""The job model on a REAL control plane (kube-apiserver, controller-manager, scheduler 1.36;
tests/kube_control_plane.py) with a simulated GPU node playing the kubelet (tests/node_sim.py):
a request using every volume kind and both kinds of Secret/ConfigMap reference goes through
validation, expansion, the daemon's recheck and ``KubernetesCluster.apply``; the Job the server
stored, and the pod its Job controller made, the scheduler placed and the "kubelet" received,
carry every volume, mount, reference and the ephemeral-storage request. The namespace enforces
the ``restricted`` Pod Security Standard, so the pod also passes the API server's own check.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Iterator
from datetime import UTC, datetime

import kubernetes
import pytest

from idlegpu.scheduler.adapters.kubernetes import KubernetesCluster
from idlegpu.scheduler.config import AdmissionConfig
from idlegpu.scheduler.specs import expand_units, recheck_unit, validate_request

NOW = datetime(2026, 1, 28, 11, 0, tzinfo=UTC)
ADMISSION = AdmissionConfig(team_volumes={
    "nlp": {"persistent_volume_claims": ["ckpt-nlp"], "secrets": ["wandb", "hf-token"],
            "config_maps": ["recipes"]},
    "*": {"persistent_volume_claims": ["datasets"], "config_maps": ["nccl-tuning"]},
})
REQUEST = {
    "name": "sft-real", "team": "nlp", "kind": "sft",
    "image": "registry.example.com/research/trl-sft:2.1.0", "gpus": 2, "cpu": 8,
    "memory": "64Gi", "command": ["python", "sft.py"],
    "checkpoint": {"interval": "30m", "resume_args": ["--resume", "/ckpt/latest"]},
    "env": {"NCCL_DEBUG": "WARN",
            "WANDB_API_KEY": {"value_from": {"secret": "wandb", "key": "api-key"}},
            "RECIPE": {"value_from": {"config_map": "recipes", "key": "default"}}},
    "env_from": [{"config_map": "nccl-tuning"}, {"secret": "wandb", "prefix": "WANDB_"}],
    "volumes": [
        {"name": "ckpt", "mount_path": "/ckpt", "persistent_volume_claim": "ckpt-nlp",
         "sub_path": "{name}/{step}/{member}"},
        {"name": "data", "mount_path": "/data", "persistent_volume_claim": "datasets",
         "read_only": True},
        {"name": "dshm", "mount_path": "/dev/shm",
         "empty_dir": {"medium": "Memory", "size_limit": "8Gi"}},
        {"name": "scratch", "mount_path": "/scratch", "empty_dir": {"size_limit": "10Gi"}},
        {"name": "recipes", "mount_path": "/etc/recipes", "config_map": "recipes"},
        {"name": "hf-token", "mount_path": "/var/run/secrets/hf", "secret": "hf-token"},
    ],
    "ephemeral_storage": {"request": "20Gi", "limit": "50Gi"},
}


@pytest.fixture
def restricted_namespace(kube_control_plane) -> Iterator[str]:
    """A namespace that enforces the ``restricted`` Pod Security Standard."""
    name = kube_control_plane.create_namespace(
        f"jobmodel-{secrets.token_hex(3)}",
        labels={"pod-security.kubernetes.io/enforce": "restricted",
                "pod-security.kubernetes.io/enforce-version": "latest"})
    try:
        yield name
    finally:
        kube_control_plane.delete_namespace(name)


@pytest.fixture
def volumes_and_secrets(kube_control_plane, restricted_namespace) -> Iterator[str]:
    """The claims (each pre-bound to a PersistentVolume), Secrets and ConfigMaps the request
    names, created first as an operator would."""
    ns = restricted_namespace
    pvs = []
    with kube_control_plane.api_client() as api:
        core = kubernetes.client.CoreV1Api(api)
        for claim in ("ckpt-nlp", "datasets"):
            pv = f"{ns}-{claim}"
            core.create_persistent_volume({
                "apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": pv},
                "spec": {"capacity": {"storage": "10Gi"}, "accessModes": ["ReadWriteOnce"],
                         "storageClassName": "", "persistentVolumeReclaimPolicy": "Retain",
                         "claimRef": {"namespace": ns, "name": claim},
                         "hostPath": {"path": f"/tmp/{pv}"}}})
            pvs.append(pv)
            core.create_namespaced_persistent_volume_claim(ns, {
                "apiVersion": "v1", "kind": "PersistentVolumeClaim",
                "metadata": {"name": claim},
                "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": "",
                         "volumeName": pv, "resources": {"requests": {"storage": "10Gi"}}}})
        for name, data in (("wandb", {"api-key": "not-a-real-key"}),
                           ("hf-token", {"token": "hf_not_real"})):
            core.create_namespaced_secret(ns, {"apiVersion": "v1", "kind": "Secret",
                                               "metadata": {"name": name}, "stringData": data})
        for name, data in (("recipes", {"default": "ko-instruct"}),
                           ("nccl-tuning", {"NCCL_IB_DISABLE": "1"})):
            core.create_namespaced_config_map(ns, {"apiVersion": "v1", "kind": "ConfigMap",
                                                   "metadata": {"name": name}, "data": data})
    try:
        yield ns
    finally:
        with kube_control_plane.api_client() as api:
            core = kubernetes.client.CoreV1Api(api)
            for pv in pvs:
                core.delete_persistent_volume(pv)


def _pod_of(core: kubernetes.client.CoreV1Api, ns: str, job: str, timeout: float = 60) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        pods = core.list_namespaced_pod(
            ns, label_selector=f"batch.kubernetes.io/job-name={job}").to_dict()["items"]
        if pods:
            return kubernetes.client.ApiClient().sanitize_for_serialization(
                core.read_namespaced_pod(pods[0]["metadata"]["name"], ns))
        time.sleep(0.2)
    events = core.list_namespaced_event(ns).to_dict()["items"]
    raise AssertionError(f"no pod for Job {ns}/{job}: "
                         + "; ".join(str(e.get("message")) for e in events[-5:]))


def test_a_job_with_every_volume_kind_and_secret_reference_runs_on_a_real_server(
        kube_control_plane, volumes_and_secrets, node_sim) -> None:
    ns = volumes_and_secrets
    labels = {"pool": ns[-20:]}
    sim = node_sim(1, gpus=4, labels=labels, cpu="32", memory="256Gi")
    request = validate_request(REQUEST, ADMISSION)
    (unit,) = expand_units(request)
    recheck_unit(unit, request.team, ADMISSION)  # what the daemon does before creating it

    cluster = KubernetesCluster(kube_control_plane.api_client(), namespace=ns,
                                node_selector=labels, priority_class=None, backoff_s=0.2)
    name = cluster.apply("sft-real-0-0", 1, unit, team=request.team, stop_by=None, now=NOW)

    with kube_control_plane.api_client() as api:
        batch = kubernetes.client.BatchV1Api(api)
        core = kubernetes.client.CoreV1Api(api)
        job = api.sanitize_for_serialization(batch.read_namespaced_job(name, ns))
        pod = _pod_of(core, ns, name)

    # the Job as the server stored it (with its defaults filled in)
    for spec in (job["spec"]["template"]["spec"], pod["spec"]):
        volumes = {v["name"]: v for v in spec["volumes"]}
        assert volumes["ckpt"]["persistentVolumeClaim"] == {"claimName": "ckpt-nlp"}
        assert volumes["data"]["persistentVolumeClaim"] == {"claimName": "datasets",
                                                             "readOnly": True}
        assert volumes["dshm"]["emptyDir"] == {"medium": "Memory", "sizeLimit": "8Gi"}
        assert volumes["scratch"]["emptyDir"] == {"sizeLimit": "10Gi"}
        assert volumes["recipes"]["configMap"]["name"] == "recipes"
        assert volumes["hf-token"]["secret"]["secretName"] == "hf-token"
        assert not any("hostPath" in v for v in spec["volumes"])
        (container,) = [c for c in spec["containers"] if c["name"] == "job"]
        mounts = {m["name"]: m for m in container["volumeMounts"]}
        assert mounts["ckpt"]["mountPath"] == "/ckpt"
        assert mounts["ckpt"]["subPath"] == "sft-real/main/0"
        assert mounts["data"]["readOnly"] is True and mounts["recipes"]["readOnly"] is True
        assert mounts["hf-token"]["readOnly"] is True
        assert mounts["dshm"]["mountPath"] == "/dev/shm"
        assert container["envFrom"] == [
            {"configMapRef": {"name": "nccl-tuning"}},
            {"secretRef": {"name": "wandb"}, "prefix": "WANDB_"}]
        env = {e["name"]: e for e in container["env"]}
        assert env["WANDB_API_KEY"]["valueFrom"] == {
            "secretKeyRef": {"name": "wandb", "key": "api-key"}}
        assert env["RECIPE"]["valueFrom"] == {
            "configMapKeyRef": {"name": "recipes", "key": "default"}}
        assert env["NCCL_DEBUG"]["value"] == "WARN"
        assert not any(k.startswith("NVIDIA_") for k in env)
        resources = container["resources"]
        assert resources["limits"]["ephemeral-storage"] == "50Gi"
        assert resources["requests"]["ephemeral-storage"] == "20Gi"
        assert resources["limits"]["nvidia.com/gpu"] == "2"
    # the secret's value is nowhere in what idlegpu sent
    assert "not-a-real-key" not in str(job)

    # the scheduler placed it (claims bound, 20Gi of the node's disk reserved) and the
    # "kubelet" received every volume and reference
    seen = sim.wait_pod(ns, pod["metadata"]["name"], "running", timeout=60)
    assert seen.node in sim.node_names
    assert {v["name"] for v in seen.volumes} >= {
        "ckpt", "data", "dshm", "scratch", "recipes", "hf-token"}
    assert {m["name"] for m in seen.volume_mounts["job"]} >= {
        "ckpt", "data", "dshm", "scratch", "recipes", "hf-token"}
    assert seen.env["job"]["WANDB_API_KEY"] == {
        "valueFrom": {"secretKeyRef": {"name": "wandb", "key": "api-key"}}}
    assert [e.get("configMapRef", e.get("secretRef"))["name"] for e in seen.env_from["job"]] == [
        "nccl-tuning", "wandb"]


def test_the_restricted_namespace_refuses_what_idlegpu_never_sends(
        kube_control_plane, restricted_namespace) -> None:
    """The server-side guard the pod above passed is real: a hostPath pod is refused there."""
    with kube_control_plane.api_client() as api:
        core = kubernetes.client.CoreV1Api(api)
        with pytest.raises(kubernetes.client.exceptions.ApiException) as info:
            core.create_namespaced_pod(restricted_namespace, {
                "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "host"},
                "spec": {"containers": [{"name": "c", "image": "x:1"}],
                         "volumes": [{"name": "h", "hostPath": {"path": "/"}}]}})
    assert info.value.status == 403 and "hostPath" in str(info.value.body)
