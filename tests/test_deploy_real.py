"""deploy/ applied to a REAL Kubernetes control plane (``kube_control_plane``: etcd,
kube-apiserver, kube-controller-manager and kube-scheduler; no kubelet, so no pod ever runs).

What only a real API server can say: the rendered kustomization is accepted as written (strict
field validation, no Pod Security warning), the daemon's ServiceAccount may do exactly what the
daemon needs (RBAC asked with impersonation and with a real token of that account), the
``restricted`` Pod Security Standard admits the Job the daemon builds and the pods of the
Deployment and the StatefulSet, and refuses a privileged pod.
"""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml

DEPLOY = Path(__file__).resolve().parents[1] / "deploy"
SYSTEM, JOBS = "idlegpu-system", "idlegpu-jobs"
ACCOUNT = "idlegpu"
DAEMON = f"system:serviceaccount:{SYSTEM}:{ACCOUNT}"
API_ACCOUNT = "idlegpu-api"
JOB_API = f"system:serviceaccount:{SYSTEM}:{API_ACCOUNT}"
# same groups as the daemon's account (system:serviceaccounts[:idlegpu-system]), no binding
STRANGER = f"system:serviceaccount:{SYSTEM}:someone-else"
FIELD_MANAGER = "idlegpu-deploy-test"
NOW = datetime(2026, 3, 2, 21, 0, tzinfo=UTC)


@dataclass
class Deployed:
    docs: list[dict[str, Any]]
    """The objects of ``kubectl kustomize deploy``, as rendered."""
    warnings: str
    """What the API server said on stderr while they were applied (e.g. PodSecurity)."""

    def find(self, kind: str, name: str) -> dict[str, Any]:
        (found,) = [d for d in self.docs
                    if d["kind"] == kind and d["metadata"]["name"] == name]
        return found


def _wait_for(what: str, ready: Any, timeout: float = 20.0) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        result = ready()
        if result:
            return result
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(0.2)


def _get(kube: Any, *args: str) -> dict[str, Any] | None:
    proc = kube.kubectl("get", *args, "-o", "json", check=False)
    return json.loads(proc.stdout) if proc.returncode == 0 else None


def _wait_unless_terminating(kube: Any, namespace: str, timeout_s: float = 120) -> None:
    """Return once ``namespace`` is not being deleted: the real namespace controller refuses
    new content in a terminating namespace until it is gone."""
    deadline = time.monotonic() + timeout_s
    while (found := _get(kube, "namespace", namespace)) is not None \
            and found.get("status", {}).get("phase") == "Terminating":
        if time.monotonic() > deadline:
            pytest.fail(f"namespace {namespace} still terminating after {timeout_s:g} s")
        time.sleep(0.5)


@pytest.fixture(scope="module")
def deployed(kube_control_plane: Any) -> Iterator[Deployed]:
    kube = kube_control_plane
    rendered = kube.kubectl("kustomize", str(DEPLOY)).stdout
    docs = [d for d in yaml.safe_load_all(rendered) if d]
    # the control plane is shared by the session, and with work stealing a worker can set
    # this fixture up again after tearing it down (its namespaces deleted without waiting):
    # wait for them to be gone, as nothing can be created in a terminating namespace
    for doc in docs:
        if doc["kind"] == "Namespace":
            _wait_unless_terminating(kube, doc["metadata"]["name"])
    cluster_scoped = [d for d in docs if "namespace" not in d["metadata"]]
    created = [d for d in cluster_scoped
               if _get(kube, d["kind"].lower(), d["metadata"]["name"]) is None]

    def apply(objects: list[dict[str, Any]]) -> str:
        proc = kube.kubectl("apply", "--server-side", f"--field-manager={FIELD_MANAGER}",
                            "-f", "-", input=yaml.safe_dump_all(objects))
        return proc.stderr

    # the Namespaces first: nothing can be stored in (or dry-run against) a missing namespace
    warnings = apply([d for d in docs if d["kind"] == "Namespace"])
    warnings += apply([d for d in docs if d["kind"] != "Namespace"])
    yield Deployed(docs, warnings)
    # the control plane is shared by the session: leave nothing of ours behind
    for doc in created:
        kube.kubectl("delete", doc["kind"].lower(), doc["metadata"]["name"], "--wait=false",
                     check=False)


# --- the manifests, as the server took them ------------------------------------------------


def test_the_server_takes_every_manifest_without_a_warning(deployed, kube_control_plane):
    # a pod template breaking `restricted` would show here: PodSecurity warns on workloads
    assert deployed.warnings.strip() == ""
    for doc in deployed.docs:
        meta = doc["metadata"]
        where = ["-n", meta["namespace"]] if "namespace" in meta else []
        stored = _get(kube_control_plane, doc["kind"].lower(), meta["name"], *where)
        assert stored is not None, f"{doc['kind']}/{meta['name']} was not stored"
        labels = stored["metadata"].get("labels", {})
        assert meta.get("labels", {}).items() <= labels.items(), meta["name"]


def _written_in(written: Any, stored: Any, where: str = "") -> list[str]:
    """Where ``stored`` lost or changed something of ``written`` (defaults added are fine)."""
    if isinstance(written, dict):
        if not isinstance(stored, dict):
            return [f"{where}: {stored!r}"]
        return [p for key, value in written.items()
                for p in (_written_in(value, stored[key], f"{where}.{key}") if key in stored
                          else [f"{where}.{key}: dropped"])]
    if isinstance(written, list):
        if not isinstance(stored, list) or len(stored) != len(written):
            return [f"{where}: {stored!r}"]
        return [p for i, (w, s) in enumerate(zip(written, stored, strict=True))
                for p in _written_in(w, s, f"{where}[{i}]")]
    return [] if written == stored else [f"{where}: wrote {written!r}, stored {stored!r}"]


def test_network_policies_are_stored_exactly_as_written(deployed, kube_control_plane):
    written = {(d["metadata"]["namespace"], d["metadata"]["name"]): d["spec"]
               for d in deployed.docs if d["kind"] == "NetworkPolicy"}
    stored = {}
    for namespace in (SYSTEM, JOBS):
        listing = _get(kube_control_plane, "networkpolicies", "-n", namespace)
        stored |= {(namespace, p["metadata"]["name"]): p["spec"] for p in listing["items"]}
    # every field spelled out (protocols, policyTypes): the server has nothing to default
    assert stored == written


@pytest.mark.parametrize("kind,name", [("Deployment", "idlegpu"),
                                       ("StatefulSet", "idlegpu-postgres"),
                                       ("Service", "idlegpu-metrics"),
                                       ("PodDisruptionBudget", "idlegpu"),
                                       ("Deployment", "idlegpu-api"),
                                       ("Service", "idlegpu-api"),
                                       ("PodDisruptionBudget", "idlegpu-api")])
def test_workloads_are_stored_as_written(deployed, kube_control_plane, kind, name):
    written = deployed.find(kind, name)
    stored = _get(kube_control_plane, kind.lower(), name, "-n", SYSTEM)
    assert _written_in(written["spec"], stored["spec"]) == []


def test_restricted_admits_the_pods_of_the_daemon_and_of_postgres(deployed, kube_control_plane):
    # the controllers create them (no kubelet: they stay Pending); a pod PodSecurity refused
    # would never appear, only a FailedCreate event
    def pods(name: str, replicas: int) -> list[dict[str, Any]] | None:
        listing = _get(kube_control_plane, "pods", "-n", SYSTEM, "-l",
                       f"app.kubernetes.io/name={name}")
        return listing["items"] if len(listing["items"]) == replicas else None

    for name, replicas in (("idlegpu", 2), ("idlegpu-postgres", 1), ("idlegpu-api", 2)):
        for pod in _wait_for(f"{replicas} pod(s) {name}", lambda n=name, r=replicas: pods(n, r)):
            spec = pod["spec"]
            mounted_token = any(v.get("projected") and v["name"].startswith("kube-api-access")
                                for v in spec.get("volumes", []))
            assert mounted_token is (name in ("idlegpu", "idlegpu-api")), pod["metadata"]["name"]
            if name == "idlegpu":
                assert spec["serviceAccountName"] == ACCOUNT
            if name == "idlegpu-api":
                assert spec["serviceAccountName"] == API_ACCOUNT


# --- what the daemon's ServiceAccount may do ----------------------------------------------

MAY = [  # (verb, resource, namespace)
    *[(verb, "jobs.batch", JOBS) for verb in ("get", "list", "create", "patch", "delete")],
    ("get", "pods", JOBS), ("list", "pods", JOBS), ("patch", "pods/status", JOBS),
    # the checkpoint notice: an annotation on the pods of a unit it will stop
    ("patch", "pods", JOBS),
    *[(verb, "leases.coordination.k8s.io", SYSTEM) for verb in ("get", "create", "update")],
    # the node view (ClusterRole idlegpu-node-view): nodes, and the pods bound to them
    ("get", "nodes", "default"), ("list", "nodes", "default"),
    ("list", "pods", "default"), ("list", "pods", SYSTEM),
]
MAY_NOT = [
    ("create", "jobs.batch", "default"), ("create", "jobs.batch", SYSTEM),
    ("update", "jobs.batch", JOBS), ("watch", "jobs.batch", JOBS),
    ("delete", "pods", JOBS), ("create", "pods", JOBS), ("update", "pods", JOBS),
    ("patch", "pods", SYSTEM), ("patch", "pods", "default"),
    ("create", "pods/eviction", JOBS), ("create", "pods/exec", JOBS), ("get", "pods/log", JOBS),
    ("update", "jobs.batch/status", JOBS), ("update", "pods/status", JOBS),
    ("patch", "pods/status", SYSTEM), ("patch", "pods/status", "default"),
    ("get", "pods", SYSTEM),
    ("get", "secrets", SYSTEM), ("list", "secrets", SYSTEM), ("get", "secrets", JOBS),
    ("list", "secrets", JOBS), ("get", "configmaps", JOBS),
    ("update", "leases.coordination.k8s.io", JOBS),
    ("update", "leases.coordination.k8s.io", "kube-system"),
    ("delete", "leases.coordination.k8s.io", SYSTEM),
    ("create", "rolebindings.rbac.authorization.k8s.io", JOBS),
    ("update", "networkpolicies.networking.k8s.io", JOBS),
    ("create", "serviceaccounts/token", SYSTEM),
    ("watch", "nodes", "default"), ("patch", "nodes", "default"),
    ("update", "nodes/status", "default"), ("delete", "nodes", "default"),
    ("get", "pods", "default"), ("watch", "pods", "default"), ("delete", "pods", "default"),
]


def _can_i(kube: Any, who: str, verb: str, resource: str, namespace: str) -> bool:
    resource, _, subresource = resource.partition("/")  # kubectl would read it as TYPE/NAME
    more = [f"--subresource={subresource}"] if subresource else []
    proc = kube.kubectl("auth", "can-i", verb, resource, *more, "-n", namespace,
                        f"--as={who}", check=False)
    answer = proc.stdout.strip()
    assert answer in ("yes", "no"), proc.stderr
    return answer == "yes"


@pytest.mark.usefixtures("deployed")
def test_the_daemon_may_do_what_it_needs_and_nothing_else(kube_control_plane):
    kube = kube_control_plane
    got = {(verb, resource, ns): _can_i(kube, DAEMON, verb, resource, ns)
           for verb, resource, ns in [*MAY, *MAY_NOT]}
    assert got == {**dict.fromkeys(MAY, True), **dict.fromkeys(MAY_NOT, False)}
    # the binding names the account of idlegpu-system, not a namesake where the Jobs run
    assert not _can_i(kube, f"system:serviceaccount:{JOBS}:{ACCOUNT}", "create", "jobs.batch",
                      JOBS)
    proc = kube.kubectl("auth", "can-i", "list", "jobs.batch", "--all-namespaces",
                        f"--as={DAEMON}", check=False)
    assert proc.stdout.strip() == "no"


def _rules(kube: Any, who: str, namespace: str) -> set[tuple[str, str, str, str]]:
    """Every (group, resource, verb, name) ``who`` may use in ``namespace``, as the API server's
    authorizer lists them (SelfSubjectRulesReview, impersonated)."""
    from kubernetes import client

    with kube.api_client() as api:
        api.set_default_header("Impersonate-User", who)
        review = client.AuthorizationV1Api(api).create_self_subject_rules_review(
            {"apiVersion": "authorization.k8s.io/v1", "kind": "SelfSubjectRulesReview",
             "spec": {"namespace": namespace}})
    assert not review.status.incomplete, review.status.evaluation_error
    return {(group, resource, verb, name)
            for rule in review.status.resource_rules for group in rule.api_groups or [""]
            for resource in rule.resources for verb in rule.verbs
            for name in rule.resource_names or ["*"]}


@pytest.mark.usefixtures("deployed")
def test_the_daemon_holds_exactly_its_roles(kube_control_plane):
    # beyond what every service account of idlegpu-system gets (discovery, self reviews)
    kube = kube_control_plane
    extra = {ns: _rules(kube, DAEMON, ns) - _rules(kube, STRANGER, ns)
             for ns in (JOBS, SYSTEM, "default")}
    # everywhere (ClusterRole idlegpu-node-view): read nodes, list the pods bound to them
    node_view = {("", "nodes", "get", "*"), ("", "nodes", "list", "*"), ("", "pods", "list", "*")}
    assert extra == {
        JOBS: {*{("batch", "jobs", verb, "*")
                 for verb in ("get", "list", "create", "patch", "delete")},
               ("", "pods", "get", "*"), ("", "pods", "patch", "*"),
               ("", "pods/status", "patch", "*"), *node_view,
               # a gang's headless Service, created with its Job and deleted with it
               ("", "services", "create", "*"), ("", "services", "delete", "*")},
        SYSTEM: {*{("coordination.k8s.io", "leases", verb, "*")
                   for verb in ("get", "create", "update")}, *node_view},
        "default": node_view,
    }


@pytest.fixture(scope="module")
def daemon_api(deployed: Deployed, kube_control_plane: Any) -> Iterator[Any]:
    """A ``kubernetes.client.ApiClient`` authenticated by a REAL token of the daemon's
    ServiceAccount (TokenRequest, as the kubelet would mount it), not by impersonation."""
    kube = kube_control_plane
    token = kube.kubectl("create", "token", ACCOUNT, "-n", SYSTEM, "--duration=10m").stdout
    with _client_with_token(kube, token.strip()) as api:
        yield api


def _client_with_token(kube: Any, token: str) -> Any:
    """A ``kubernetes.client.ApiClient`` that authenticates with ``token`` only."""
    import kubernetes

    config = json.loads(Path(kube.kubeconfig).read_text())
    (cluster,) = config["clusters"]
    configuration = kubernetes.client.Configuration()
    configuration.host = cluster["cluster"]["server"]
    configuration.ssl_ca_cert = cluster["cluster"]["certificate-authority"]
    configuration.api_key = {"authorization": f"Bearer {token}"}
    return kubernetes.client.ApiClient(configuration)


def _status(call: Any) -> int:
    from kubernetes.client.exceptions import ApiException

    try:
        call()
    except ApiException as exc:
        return exc.status
    return 200


def test_a_real_token_of_the_daemon_account(daemon_api):
    from kubernetes import client

    review = client.AuthenticationV1Api(daemon_api).create_self_subject_review(
        {"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"})
    assert review.status.user_info.username == DAEMON
    batch, core = client.BatchV1Api(daemon_api), client.CoreV1Api(daemon_api)
    job = _daemon_job()
    assert _status(lambda: batch.create_namespaced_job(JOBS, job, dry_run="All")) == 200
    assert _status(lambda: batch.create_namespaced_job("default", {
        **job, "metadata": {**job["metadata"], "namespace": "default"}}, dry_run="All")) == 403
    assert _status(lambda: batch.list_namespaced_job(JOBS)) == 200
    assert _status(lambda: core.list_namespaced_pod(JOBS)) == 200
    assert _status(lambda: core.delete_namespaced_pod("any", JOBS, dry_run="All")) == 403
    assert _status(lambda: core.list_namespaced_secret(SYSTEM)) == 403
    assert _status(lambda: core.read_namespaced_secret("idlegpu-store", SYSTEM)) == 403
    assert _status(lambda: core.list_namespaced_secret(JOBS)) == 403


def test_the_node_view_with_a_real_token(daemon_api):
    """The adapter's node view (nodes + the pods bound to them, cluster-wide) reads with the
    deployed ClusterRole alone; the same token may not change a node."""
    from kubernetes import client

    from idlegpu.scheduler.adapters.kubernetes import KubernetesCluster

    view = KubernetesCluster(daemon_api, namespace=JOBS, retries=0).nodes(NOW)
    assert view.observed_at == NOW  # a control plane without kubelets may have no node
    core = client.CoreV1Api(daemon_api)
    assert _status(lambda: core.list_pod_for_all_namespaces(limit=1)) == 200
    assert _status(lambda: core.list_node(limit=1)) == 200
    assert _status(lambda: core.delete_node("any", dry_run="All")) == 403
    assert _status(lambda: core.patch_node("any", {"spec": {"unschedulable": True}},
                                           dry_run="All")) == 403


def test_leader_election_with_a_real_token(daemon_api):
    from kubernetes import client

    leases = client.CoordinationV1Api(daemon_api)
    lease = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
             "metadata": {"name": "idlegpu-deploy-test"},
             "spec": {"holderIdentity": "idlegpu-0", "leaseDurationSeconds": 15}}
    assert _status(lambda: leases.create_namespaced_lease(SYSTEM, lease)) == 200
    stored = leases.read_namespaced_lease("idlegpu-deploy-test", SYSTEM)
    stored.spec.holder_identity = "idlegpu-1"  # the other replica takes over
    assert _status(lambda: leases.replace_namespaced_lease(
        "idlegpu-deploy-test", SYSTEM, stored)) == 200
    assert _status(lambda: leases.delete_namespaced_lease("idlegpu-deploy-test", SYSTEM)) == 403
    assert _status(lambda: leases.create_namespaced_lease(JOBS, lease)) == 403
    assert _status(lambda: leases.list_namespaced_lease(SYSTEM)) == 403


# --- what the job API's ServiceAccount may do ---------------------------------------------


@pytest.mark.usefixtures("deployed")
def test_the_job_api_may_create_token_reviews_and_read_research_pods_only(kube_control_plane):
    kube = kube_control_plane
    assert _can_i(kube, JOB_API, "create", "tokenreviews.authentication.k8s.io", "default")
    assert not _can_i(kube, DAEMON, "create", "tokenreviews.authentication.k8s.io", "default")
    assert not _can_i(kube, STRANGER, "create", "tokenreviews.authentication.k8s.io", "default")
    # which unit a pod-bound token speaks for (checkpoint acknowledgements)
    assert _can_i(kube, JOB_API, "get", "pods", JOBS)
    for verb, resource, namespace in [*(m for m in MAY if m != ("get", "pods", JOBS)),
                                      ("get", "secrets", SYSTEM), ("get", "pods", SYSTEM),
                                      ("create", "subjectaccessreviews.authorization.k8s.io",
                                       "default")]:
        assert not _can_i(kube, JOB_API, verb, resource, namespace), (verb, resource)
    extra = {ns: _rules(kube, JOB_API, ns) - _rules(kube, STRANGER, ns)
             for ns in (JOBS, SYSTEM, "default")}
    review = {("authentication.k8s.io", "tokenreviews", "create", "*")}
    assert extra == {JOBS: review | {("", "pods", "get", "*")}, SYSTEM: review,
                     "default": review}


def test_the_job_api_authenticates_researchers_with_its_deployed_rbac(
        deployed, kube_control_plane, kube_namespace, tmp_path):
    """A real job API whose TokenReviews run with a REAL token of idlegpu-api (as its pods
    get it): a researcher's ServiceAccount token maps to its team, a forged one is 401."""
    import kubernetes
    import requests
    from api_server import ApiServer, MovableClock, api_settings

    from idlegpu.scheduler.adapters.store import JobStore
    from idlegpu.scheduler.api.tokenreview import TokenReviewer
    from idlegpu.scheduler.server import create_server

    kube = kube_control_plane
    api_token = kube.kubectl("create", "token", API_ACCOUNT, "-n", SYSTEM,
                             "--duration=10m").stdout.strip()
    kube.kubectl("create", "serviceaccount", "researcher", "-n", kube_namespace)
    researcher = kube.kubectl("create", "token", "researcher", "-n", kube_namespace,
                              "--duration=10m").stdout.strip()
    config = json.loads(Path(kube.kubeconfig).read_text())
    (cluster,) = config["clusters"]
    configuration = kubernetes.client.Configuration()
    configuration.host = cluster["cluster"]["server"]
    configuration.ssl_ca_cert = cluster["cluster"]["certificate-authority"]
    configuration.api_key = {"authorization": f"Bearer {api_token}"}
    user = f"system:serviceaccount:{kube_namespace}:researcher"
    settings = api_settings(token_review={"enabled": True},
                            identities=[{"user": user, "team": "alignment"}])
    with kubernetes.client.ApiClient(configuration) as client, \
            JobStore(f"sqlite:///{tmp_path / 'api.db'}") as store:
        server = ApiServer(create_server(settings, store, clock=MovableClock(),
                                      reviewer=TokenReviewer(client))).start()
        try:
            who = requests.get(f"{server.url}/v1/whoami", timeout=30,
                               headers={"Authorization": f"Bearer {researcher}"})
            assert who.status_code == 200, who.text
            assert (who.json()["user"], who.json()["team"]) == (user, "alignment")
            forged = requests.get(f"{server.url}/v1/whoami", timeout=30,
                                  headers={"Authorization": "Bearer forged.token.here"})
            assert forged.status_code == 401
        finally:
            server.stop()


# --- Pod Security in idlegpu-jobs ---------------------------------------------------------


def _daemon_job() -> dict[str, Any]:
    """The Job the daemon builds for a unit, from the deployed config's cluster: section."""
    from idlegpu.scheduler.adapters.kubernetes import KubernetesCluster
    from idlegpu.scheduler.config import load_config
    from idlegpu.scheduler.types import UnitSpec

    settings = load_config(DEPLOY / "idlegpu.yaml")
    c = settings.cluster
    cluster = KubernetesCluster(
        None, namespace=c.namespace, node_selector=dict(c.node_selector),
        tolerations=list(c.tolerations), affinity=dict(c.affinity),
        priority_class=c.priority_class, active_deadline_seconds=c.active_deadline_seconds,
        ttl_seconds_after_finished=c.ttl_seconds_after_finished, backoff_limit=c.backoff_limit,
        service_account=c.service_account, run_as_user=c.run_as_user,
        grace_seconds=settings.admission.grace_seconds, instance="5f3c2a1b", dry_run=True,
        job_api_url=c.job_api_url, token_audience=c.token_audience)
    # a unit that answers checkpoint notices: its pods also mount the notice file and a
    # pod-bound token for the job API
    spec = UnitSpec(
        step="train", step_index=0, member=0, image="registry.example.com/llm/train:1.2",
        command=("python", "-m", "train"), args=("--epochs", "3"),
        env=(("WANDB_MODE", "offline"),), parameters=(), gpus=2, cpu=8.0, memory="64Gi",
        runtime_estimate_s=7200.0, checkpointable=True, checkpoint_interval_s=900.0,
        resume_args=("--resume", "/ckpt/last"), priority=0, deadline=None,
        max_preemptions=None, output="s3://bucket/out", depends_on=(), answers_notice=True)
    return cluster.manifest("req7-0-1", 1, spec, "nlp", NOW + timedelta(hours=5), NOW)


def _pod_of(job: dict[str, Any], name: str) -> dict[str, Any]:
    template = job["spec"]["template"]
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": job["metadata"]["namespace"],
                         "labels": template["metadata"]["labels"]},
            "spec": template["spec"]}


def _create(kube: Any, obj: dict[str, Any], *args: str) -> subprocess.CompletedProcess[str]:
    return kube.kubectl("create", "-f", "-", *args, input=json.dumps(obj), check=False)


def test_restricted_admits_the_job_the_daemon_builds(deployed, daemon_api, kube_control_plane):
    from kubernetes import client

    kube = kube_control_plane
    job = _daemon_job()
    assert job["metadata"]["namespace"] == JOBS
    # PodSecurity enforces on pods and only warns on Jobs: ask for both
    for obj in (job, _pod_of(job, "idlegpu-restricted-probe")):
        proc = _create(kube, obj, "--dry-run=server")
        assert proc.returncode == 0, proc.stderr
        assert "Warning" not in proc.stderr, proc.stderr
    # and for real: the daemon creates it, the Job controller makes its pod (PodSecurity and
    # the Priority admission, which needs the PriorityClass of deploy/, both let it in)
    _wait_for(f"ServiceAccount {JOBS}/default", lambda: _get(kube, "sa", "default", "-n", JOBS))
    name = job["metadata"]["name"]
    client.BatchV1Api(daemon_api).create_namespaced_job(JOBS, job)
    try:
        (pod,) = _wait_for(f"the pod of Job {name}", lambda: _get(
            kube, "pods", "-n", JOBS, "-l", f"batch.kubernetes.io/job-name={name}")["items"])
        best_effort = deployed.find("PriorityClass", "idlegpu-best-effort")
        assert pod["spec"]["priority"] == best_effort["value"] < 0
        assert pod["spec"]["preemptionPolicy"] == "Never"
        # the stop's first step with the deployed Role (pods/status: patch): the pod marked
        from idlegpu.scheduler.adapters.kubernetes import KubernetesCluster
        cluster = KubernetesCluster(daemon_api, namespace=JOBS, retries=0)
        assert cluster.mark_disrupted(name, "stopped by idlegpu (planned): probe") == 1
        marked = _get(kube, "pod", pod["metadata"]["name"], "-n", JOBS)
        assert {(c["type"], c["status"], c.get("reason")) for c in marked["status"][
            "conditions"]} >= {("DisruptionTarget", "True", "StoppedByIdlegpu")}
        # a checkpoint notice with the deployed Role (pods: patch)
        assert {v["name"] for v in pod["spec"]["volumes"]} >= {"idlegpu-notice", "idlegpu-token"}
        deadline = NOW + timedelta(minutes=10)
        assert cluster.request_checkpoint(name, deadline=deadline, reason="probe", now=NOW) == 1
        noticed = _get(kube, "pod", pod["metadata"]["name"], "-n", JOBS)
        assert noticed["metadata"]["annotations"]["idlegpu.io/checkpoint-request"] == (
            deadline.isoformat().replace("+00:00", "Z"))
        # and the job API's deployed account tells which unit that pod runs (pods: get)
        from idlegpu.scheduler.api.auth import PodRef
        from idlegpu.scheduler.api.tokenreview import PodUnits
        api_token = kube.kubectl("create", "token", API_ACCOUNT, "-n", SYSTEM,
                                 "--duration=10m").stdout.strip()
        with _client_with_token(kube, api_token) as api_client:
            pods = PodUnits(api_client)
            ref = PodRef(JOBS, pod["metadata"]["name"], pod["metadata"]["uid"])
            assert pods.unit_of(ref) == ("req7-0-1", 1)
            # a pod of that name but another uid (a replaced pod) speaks for nobody
            assert PodUnits(api_client).unit_of(PodRef(JOBS, ref.name, "0000")) is None
    finally:
        client.BatchV1Api(daemon_api).delete_namespaced_job(
            name, JOBS, propagation_policy="Background")


def _unsafe(pod: dict[str, Any], *, privileged: bool) -> dict[str, Any]:
    """``pod`` as research code might want it: root, host network, extra capabilities, no
    seccomp, privilege escalation; ``privileged`` adds a privileged container."""
    pod = json.loads(json.dumps(pod))
    (container,) = pod["spec"]["containers"]
    container["securityContext"] = {"runAsUser": 0, "allowPrivilegeEscalation": True,
                                    "capabilities": {"add": ["NET_ADMIN", "SYS_PTRACE"]}}
    if privileged:
        container["securityContext"]["privileged"] = True
    pod["spec"]["securityContext"] = {}
    pod["spec"]["hostNetwork"] = True
    return pod


@pytest.mark.usefixtures("deployed")
def test_restricted_refuses_an_unsafe_pod_in_idlegpu_jobs(kube_control_plane):
    kube = kube_control_plane
    job = _daemon_job()
    pod = _unsafe(_pod_of(job, "idlegpu-unsafe-probe"), privileged=False)
    proc = _create(kube, pod, "--dry-run=server")
    assert proc.returncode != 0
    assert 'violates PodSecurity "restricted:latest"' in proc.stderr, proc.stderr
    for check in ("host namespaces", "allowPrivilegeEscalation != false",
                  "unrestricted capabilities", "runAsNonRoot != true", "runAsUser=0",
                  "seccompProfile"):
        assert check in proc.stderr, proc.stderr
    # the namespace's label refuses it, not the pod itself: where nothing is enforced the
    # same pod is accepted
    unlabelled = {**pod, "metadata": {**pod["metadata"], "namespace": "default"}}
    proc = _create(kube, unlabelled, "--dry-run=server")
    assert proc.returncode == 0, proc.stderr
    # a Job with such a template is only warned about (its pods are what is refused)
    bad_job = json.loads(json.dumps(job))
    bad_job["spec"]["template"]["spec"] = pod["spec"]
    proc = _create(kube, bad_job, "--dry-run=server")
    assert proc.returncode == 0 and "would violate PodSecurity" in proc.stderr, proc.stderr


@pytest.mark.usefixtures("deployed")
def test_a_privileged_pod_is_refused_in_idlegpu_jobs(kube_control_plane):
    pod = _unsafe(_pod_of(_daemon_job(), "idlegpu-privileged-probe"), privileged=True)
    proc = _create(kube_control_plane, pod, "--dry-run=server")
    assert proc.returncode != 0
    # PodSecurity says so where the API server allows privileged containers at all
    # (--allow-privileged=true, as kubeadm and managed clusters run it); without that flag the
    # server refuses them everywhere first, "disallowed by cluster policy"
    assert ('violates PodSecurity "restricted:latest"' in proc.stderr
            or "privileged: Forbidden: disallowed by cluster policy" in proc.stderr), proc.stderr


# --- the Kueue admission check's grants (deploy/optional/kueue-rbac.yaml) ---------------------------


@pytest.mark.slow  # the real Kueue's CRDs (its manager starts with them: ~10 s)
def test_the_kueue_check_controller_works_with_its_grants_and_nothing_more(
        deployed, daemon_api, kueue, kube_control_plane):
    from idlegpu.scheduler.adapters.kubernetes import ClusterPermissionError
    from idlegpu.scheduler.adapters.kubernetes.kueue import KueueChecks
    from idlegpu.scheduler.admission_checks import CHECK_CONTROLLER, CheckUpdate

    kube = kube_control_plane
    namespace = kube.create_namespace(f"kueue-rbac-{int(time.time()) % 100000}")
    check = f"idlegpu-rbac-{namespace[-5:]}"
    kueue.apply({"apiVersion": "kueue.x-k8s.io/v1beta1", "kind": "AdmissionCheck",
                 "metadata": {"name": check}, "spec": {"controllerName": CHECK_CONTROLLER}})
    # a Workload carrying our check's entry, as Kueue writes it once its quota is reserved
    kueue.apply({"apiVersion": "kueue.x-k8s.io/v1beta1", "kind": "Workload",
                 "metadata": {"name": "eval", "namespace": namespace},
                 "spec": {"podSets": [{"name": "main", "count": 1, "template": {"spec": {
                     "restartPolicy": "Never", "containers": [{
                         "name": "main", "image": "registry.example.com/research/eval:1",
                         "resources": {"requests": {"nvidia.com/gpu": "2"}}}]}}}]}})
    kueue.apply({"apiVersion": "kueue.x-k8s.io/v1beta1", "kind": "Workload",
                 "metadata": {"name": "eval", "namespace": namespace},
                 "status": {"admissionChecks": [{
                     "name": check, "state": "Pending", "message": "",
                     "lastTransitionTime": "2026-12-06T00:00:00Z"}]}},
                manager="kueue-admission", subresource="status", force=True)
    checks = KueueChecks(daemon_api, checks=[check], backoff_s=0.1)
    # before the grants: a 403 that names them
    with pytest.raises(ClusterPermissionError, match="deploy/optional/kueue-rbac.yaml"):
        checks.read()
    kube.kubectl("apply", "--server-side", f"--field-manager={FIELD_MANAGER}", "-f",
                 str(DEPLOY / "optional" / "kueue-rbac.yaml"))
    try:
        reading = _wait_for("the grants in force", lambda: _reading(checks))
        assert reading.served == [check]
        (workload,) = [w for w in reading.workloads if w.namespace == namespace]
        assert workload.gpus == 2 and workload.state == "Pending"
        checks.set_active(check, (True, "Active", "the forecast and the signals are fresh"))
        checks.write(CheckUpdate(namespace, "eval", check, "Ready", "fits the forecast"))
        again = checks.read()
        assert again.active[check] == (True, "Active", "the forecast and the signals are fresh")
        assert [w.state for w in again.workloads if w.namespace == namespace] == ["Ready"]
        # and nothing more: no Workload spec, no delete, no ClusterQueue, no Job of Kueue's
        for verb, resource in [("patch", "workloads.kueue.x-k8s.io"),
                               ("delete", "workloads.kueue.x-k8s.io"),
                               ("update", "workloads.kueue.x-k8s.io/status"),
                               ("create", "admissionchecks.kueue.x-k8s.io"),
                               ("patch", "clusterqueues.kueue.x-k8s.io"),
                               ("list", "clusterqueues.kueue.x-k8s.io"),
                               ("patch", "jobs.batch")]:
            assert not _can_i(kube, DAEMON, verb, resource, namespace), (verb, resource)
        for verb, resource in [("list", "workloads.kueue.x-k8s.io"),
                               ("watch", "workloads.kueue.x-k8s.io"),
                               ("patch", "workloads.kueue.x-k8s.io/status")]:
            assert _can_i(kube, DAEMON, verb, resource, namespace), (verb, resource)
        assert not _can_i(kube, DAEMON, "watch", "admissionchecks.kueue.x-k8s.io", namespace)
        # the daemon's watch of the Workloads works with the grants (its copy is the listing)
        watched = KueueChecks(daemon_api, checks=[check], backoff_s=0.1, watch=True)
        try:
            watched.read()
            assert watched.workloads is not None and watched.workloads.wait_synced(10), (
                watched.workloads.problem)
            assert [w.state for w in watched.read().workloads
                    if w.namespace == namespace] == ["Ready"]
            assert watched.workloads.problem == ""
        finally:
            watched.close()
    finally:
        kube.kubectl("delete", "-f", str(DEPLOY / "optional" / "kueue-rbac.yaml"), "--wait=false",
                     check=False)
        kube.delete_namespace(namespace)


def _reading(checks: Any) -> Any:
    from idlegpu.scheduler.adapters.kubernetes import ClusterPermissionError

    try:
        return checks.read()
    except ClusterPermissionError:
        return None


@pytest.mark.usefixtures("deployed")
def test_the_grants_for_users_jobs_are_these_and_only_in_the_namespace_bound(
        kube_control_plane):
    kube = kube_control_plane
    if _get(kube, "namespace", "research") is None:
        kube.create_namespace("research")
    kube.kubectl("apply", "--server-side", f"--field-manager={FIELD_MANAGER}", "-f",
                 str(DEPLOY / "optional" / "native-jobs-rbac.yaml"))
    try:
        may = [("get", "jobs.batch"), ("list", "jobs.batch"), ("watch", "jobs.batch"),
               ("patch", "jobs.batch"),
               ("list", "pods"), ("patch", "pods/status"), ("create", "events")]
        may_not = [("create", "jobs.batch"), ("delete", "jobs.batch"), ("update", "jobs.batch"),
                   ("delete", "pods"), ("create", "pods"), ("get", "secrets"),
                   ("patch", "pods")]
        assert {g: _can_i(kube, DAEMON, *g, "research") for g in may + may_not} == {
            **dict.fromkeys(may, True), **dict.fromkeys(may_not, False)}
        # a namespace without the RoleBinding: nothing of it
        assert not _can_i(kube, DAEMON, "patch", "jobs.batch", "default")
    finally:
        kube.kubectl("delete", "-f", str(DEPLOY / "optional" / "native-jobs-rbac.yaml"), "--wait=false",
                     check=False)
