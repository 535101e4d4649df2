"""deploy/: every manifest validates against the Kubernetes schemas, the RBAC is minimal, every
pod is hardened, and the deployed config describes the sample pool. (tests/test_deploy_real.py
applies the same manifests to a real API server.)"""

import json
import os
import re
from pathlib import Path
from urllib.parse import urlsplit

import kubernetes_validate
import pytest
import yaml

DEPLOY = Path(__file__).resolve().parents[1] / "deploy"
MANIFESTS = sorted(p for p in DEPLOY.glob("*.yaml")
                   if p.name not in ("kustomization.yaml", "idlegpu.yaml"))
K8S_VERSION = "1.36"
SYSTEM, JOBS = "idlegpu-system", "idlegpu-jobs"
PSA_LEVELS = ("enforce", "audit", "warn")


def docs(kind: str | None = None) -> list[dict]:
    found = [d for p in MANIFESTS for d in yaml.safe_load_all(p.read_text()) if d]
    return [d for d in found if kind is None or d["kind"] == kind]


def one(kind: str, name: str) -> dict:
    (found,) = [d for d in docs(kind) if d["metadata"]["name"] == name]
    return found


def pod_templates() -> dict[str, dict]:
    return {f"{d['kind']}/{d['metadata']['name']}": d["spec"]["template"]
            for d in docs() if d["kind"] in ("Deployment", "StatefulSet", "DaemonSet", "Job")}


def daemon_container() -> dict:
    (container,) = one("Deployment", "idlegpu")["spec"]["template"]["spec"]["containers"]
    return container


@pytest.mark.parametrize("path", MANIFESTS, ids=lambda p: p.name)
def test_manifest_is_valid_for_kubernetes(path):
    for doc in yaml.safe_load_all(path.read_text()):
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)


def test_bad_manifests_are_caught():
    deployment = one("Deployment", "idlegpu")
    deployment["spec"]["replicas"] = "one"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, K8S_VERSION, strict=True)


def test_kustomization_lists_every_manifest():
    kustomization = yaml.safe_load((DEPLOY / "kustomization.yaml").read_text())
    assert sorted(kustomization["resources"]) == sorted(p.name for p in MANIFESTS)
    # two namespaces: a kustomize-wide `namespace:` would move everything into one
    assert "namespace" not in kustomization


def test_kustomize_reads_only_files_inside_deploy():
    # kustomize's load restrictor refuses anything outside the kustomization's directory
    kustomization = yaml.safe_load((DEPLOY / "kustomization.yaml").read_text())
    files = [f.split("=", 1)[-1] for gen in kustomization["configMapGenerator"]
             for f in gen["files"]]
    for name in [*kustomization["resources"], *files]:
        path = (DEPLOY / name).resolve()
        assert path.is_file() and path.parent == DEPLOY, name


def test_every_namespaced_object_names_one_of_the_two_namespaces():
    kustomization = yaml.safe_load((DEPLOY / "kustomization.yaml").read_text())
    cluster_scoped = {"Namespace", "PriorityClass", "ClusterRole", "ClusterRoleBinding"}
    for doc in docs():
        where = doc["metadata"].get("namespace")
        assert (where is None) == (doc["kind"] in cluster_scoped), doc["metadata"]["name"]
        assert where in (None, SYSTEM, JOBS)
    (config_map,) = kustomization["configMapGenerator"]
    assert config_map["namespace"] == SYSTEM  # next to the Deployment that mounts it


def test_both_namespaces_enforce_the_restricted_pod_security_standard():
    namespaces = {d["metadata"]["name"]: d["metadata"]["labels"] for d in docs("Namespace")}
    assert set(namespaces) == {SYSTEM, JOBS}
    for labels in namespaces.values():
        for level in PSA_LEVELS:
            assert labels[f"pod-security.kubernetes.io/{level}"] == "restricted"


def test_the_deployed_config_is_the_sample_pool_run_in_cluster(monkeypatch):
    from idlegpu.forecast.settings_base import ENV_PREFIX
    from idlegpu.scheduler.config import load_config

    for name in [n for n in os.environ if n.startswith(ENV_PREFIX)]:
        monkeypatch.delenv(name)
    deployed = load_config(DEPLOY / "idlegpu.yaml")
    sample = load_config(DEPLOY.parent / "idlegpu.yaml")
    assert deployed.cluster.in_cluster
    assert deployed.cluster.namespace == JOBS  # where the Role lets the daemon create Jobs
    container = daemon_container()
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    assert container["args"] == ["run", "--config", f"{mounts['config']}/idlegpu.yaml"]
    assert deployed.daemon.reports_dir.startswith(mounts["reports"])
    assert deployed.daemon.metrics_port == container["ports"][0]["containerPort"]

    # the store: PostgreSQL at the Service of deploy/postgres.yaml; the file names it without a
    # password, the URL with one comes from the Secret through the environment and wins
    store = urlsplit(deployed.store.url)
    assert store.scheme == "postgresql+psycopg" and store.password is None
    service = one("Service", "idlegpu-postgres")
    assert store.hostname == f"{service['metadata']['name']}.{SYSTEM}.svc"
    assert store.port == service["spec"]["ports"][0]["port"]
    env = {e["name"]: e for e in container["env"]}
    assert env["IDLEGPU_STORE__URL"]["valueFrom"]["secretKeyRef"] == {
        "name": "idlegpu-store", "key": "url"}
    secret_url = deployed.store.url.replace("idlegpu@", "idlegpu:s3cret@")
    monkeypatch.setenv("IDLEGPU_STORE__URL", secret_url)
    assert load_config(DEPLOY / "idlegpu.yaml").store.url == secret_url

    # as many replicas as the Deployment runs, only one acting: the Lease decides
    assert one("Deployment", "idlegpu")["spec"]["replicas"] == 2
    assert deployed.daemon.leader_election.enabled
    # the two copies describe the same pool; only where things are (and how many daemons)
    # differs
    where = {"prometheus": {"url"}, "store": {"url"},
             "cluster": {"in_cluster", "job_api_url"},
             "daemon": {"reports_dir", "leader_election"}, "api": True}
    monkeypatch.delenv("IDLEGPU_STORE__URL")
    assert deployed.model_dump(exclude=where) == sample.model_dump(exclude=where)


def test_secrets_reach_the_daemon_only_through_the_environment():
    from idlegpu.forecast.config import PrometheusConfig

    env = {e["name"]: e for e in daemon_container()["env"]}
    assert "bearer_token" in PrometheusConfig.model_fields  # IDLEGPU_PROMETHEUS__BEARER_TOKEN
    assert env["IDLEGPU_PROMETHEUS__BEARER_TOKEN"]["valueFrom"]["secretKeyRef"] == {
        "name": "idlegpu-prometheus", "key": "token", "optional": True}
    assert env["POD_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
    assert not docs("Secret")  # credentials are never committed
    text = (DEPLOY / "idlegpu.yaml").read_text()
    assert "bearer_token:" not in text.replace("# bearer_token:", "")


def grants(role: dict) -> dict[tuple[str, str], set[str]]:
    return {(g, r): set(rule["verbs"]) for rule in role["rules"]
            for g in rule["apiGroups"] for r in rule["resources"]}


def test_roles_grant_only_what_the_daemon_uses():
    roles = {(d["metadata"]["namespace"], d["metadata"]["name"]): d for d in docs("Role")}
    assert set(roles) == {(JOBS, "idlegpu"), (SYSTEM, "idlegpu-leader-election"),
                          (JOBS, "idlegpu-api-pods")}
    assert grants(roles[JOBS, "idlegpu"]) == {
        ("batch", "jobs"): {"get", "list", "create", "patch", "delete"},
        # patch: the checkpoint notice's annotation on the pods of a unit it will stop
        ("", "pods"): {"get", "list", "patch"},
        # the DisruptionTarget condition on the pods of a Job it stops, before the suspend
        ("", "pods/status"): {"patch"},
        # a multi-node gang's headless Service (rendezvous), created with its Job, deleted
        # with it; never read, never changed
        ("", "services"): {"create", "delete"},
    }
    assert grants(roles[SYSTEM, "idlegpu-leader-election"]) == {
        ("coordination.k8s.io", "leases"): {"get", "create", "update"},
    }
    # cluster-wide: the job API's TokenReviews (below) and the daemon's read-only node view
    assert {d["metadata"]["name"] for d in docs("ClusterRole")} == {
        "idlegpu-api-tokenreview", "idlegpu-node-view"}
    assert {d["metadata"]["name"] for d in docs("ClusterRoleBinding")} == {
        "idlegpu-api-tokenreview", "idlegpu-node-view"}


def test_the_node_view_is_read_only_nodes_and_pod_lists():
    role = one("ClusterRole", "idlegpu-node-view")
    assert grants(role) == {("", "nodes"): {"get", "list"}, ("", "pods"): {"list"}}
    binding = one("ClusterRoleBinding", "idlegpu-node-view")
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io",
                                  "kind": "ClusterRole", "name": "idlegpu-node-view"}
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "idlegpu",
                                    "namespace": SYSTEM}]


def test_the_job_api_may_only_create_token_reviews():
    role = one("ClusterRole", "idlegpu-api-tokenreview")
    assert grants(role) == {("authentication.k8s.io", "tokenreviews"): {"create"}}
    binding = one("ClusterRoleBinding", "idlegpu-api-tokenreview")
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io",
                                  "kind": "ClusterRole", "name": "idlegpu-api-tokenreview"}
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "idlegpu-api",
                                    "namespace": SYSTEM}]
    account = one("ServiceAccount", "idlegpu-api")
    assert account["metadata"]["namespace"] == SYSTEM
    assert account["automountServiceAccountToken"] is False
    # one Role names the API's account: get on the research pods (which unit a pod-bound
    # token acknowledges for); no Jobs, Leases or Secrets
    bound = [b for b in docs("RoleBinding")
             if any(subject["name"] == "idlegpu-api" for subject in b["subjects"])]
    assert [(b["metadata"]["namespace"], b["roleRef"]["name"]) for b in bound] == [
        (JOBS, "idlegpu-api-pods")]
    assert grants(one("Role", "idlegpu-api-pods")) == {("", "pods"): {"get"}}


def test_role_bindings_bind_the_daemon_account_of_idlegpu_system():
    account = one("ServiceAccount", "idlegpu")
    assert account["metadata"]["namespace"] == SYSTEM
    assert account["automountServiceAccountToken"] is False  # only the daemon's pods opt in
    bindings = {d["metadata"]["namespace"]: d for d in docs("RoleBinding")}
    assert set(bindings) == {JOBS, SYSTEM}
    for namespace, binding in bindings.items():
        role = one("Role", binding["roleRef"]["name"])
        assert role["metadata"]["namespace"] == namespace and binding["roleRef"]["kind"] == "Role"
        assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "idlegpu",
                                        "namespace": SYSTEM}]
    deployment = one("Deployment", "idlegpu")
    assert deployment["metadata"]["namespace"] == SYSTEM
    assert deployment["spec"]["template"]["spec"]["serviceAccountName"] == "idlegpu"


def test_best_effort_priority_class_never_preempts():
    pc = one("PriorityClass", "idlegpu-best-effort")
    assert pc["value"] < 0 and pc["preemptionPolicy"] == "Never"
    assert pc["globalDefault"] is False


def test_two_daemon_replicas_never_both_down():
    deployment = one("Deployment", "idlegpu")
    assert deployment["spec"]["replicas"] == 2  # leader election on a Lease picks the active one
    assert deployment["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"] == 0
    pdb = one("PodDisruptionBudget", "idlegpu")
    assert pdb["spec"]["maxUnavailable"] == 1
    assert pdb["spec"]["selector"] == deployment["spec"]["selector"]


@pytest.mark.parametrize("name", sorted(pod_templates()))
def test_every_pod_is_hardened(name):
    spec = pod_templates()[name]["spec"]
    pod_ctx = spec["securityContext"]
    assert pod_ctx["runAsNonRoot"] is True and pod_ctx["runAsUser"] > 0
    assert pod_ctx["seccompProfile"] == {"type": "RuntimeDefault"}
    assert spec["enableServiceLinks"] is False
    # a token only where the Kubernetes API is used: the daemon, and the job API (TokenReview)
    assert spec["automountServiceAccountToken"] is (name in ("Deployment/idlegpu",
                                                             "Deployment/idlegpu-api"))
    for container in spec["containers"]:
        ctx = container["securityContext"]
        assert ctx["allowPrivilegeEscalation"] is False and ctx["privileged"] is False
        assert ctx["readOnlyRootFilesystem"] is True
        assert ctx["capabilities"] == {"drop": ["ALL"]}
        resources = container["resources"]
        assert set(resources["requests"]) == set(resources["limits"]) == {"cpu", "memory"}


def test_the_daemon_is_probed_on_healthz():
    container = daemon_container()
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert container[probe]["httpGet"] == {"path": "/healthz", "port": "metrics"}


def test_the_store_is_postgres_15_on_its_own_volume():
    postgres = one("StatefulSet", "idlegpu-postgres")
    assert postgres["metadata"]["namespace"] == SYSTEM
    (container,) = postgres["spec"]["template"]["spec"]["containers"]
    assert container["image"] == "postgres:15"
    (claim,) = postgres["spec"]["volumeClaimTemplates"]
    assert {"name": claim["metadata"]["name"], "mountPath": "/var/lib/postgresql/data"} in \
        container["volumeMounts"]
    env = {e["name"]: e for e in container["env"]}
    assert env["POSTGRES_PASSWORD"]["valueFrom"]["secretKeyRef"] == {
        "name": "idlegpu-store", "key": "password"}
    assert env["PGDATA"]["value"].startswith("/var/lib/postgresql/data/")
    assert postgres["spec"]["persistentVolumeClaimRetentionPolicy"]["whenDeleted"] == "Retain"
    service = one("Service", "idlegpu-postgres")
    assert postgres["spec"]["serviceName"] == service["metadata"]["name"]
    assert service["spec"]["selector"] == postgres["spec"]["selector"]["matchLabels"]


def policies(namespace: str) -> dict[str, dict]:
    return {d["metadata"]["name"]: d["spec"] for d in docs("NetworkPolicy")
            if d["metadata"]["namespace"] == namespace}


def selects(selector: dict, labels: dict) -> bool:
    assert set(selector) <= {"matchLabels"}, selector  # the tests read matchLabels only
    return all(labels.get(k) == v for k, v in selector.get("matchLabels", {}).items())


def test_idlegpu_system_admits_only_prometheus_and_the_daemon():
    system = policies(SYSTEM)
    assert system["default-deny-ingress"] == {"podSelector": {}, "policyTypes": ["Ingress"]}
    daemon = one("Deployment", "idlegpu")["spec"]["template"]["metadata"]["labels"]
    postgres = one("StatefulSet", "idlegpu-postgres")["spec"]["template"]["metadata"]["labels"]
    api = one("Deployment", "idlegpu-api")["spec"]["template"]["metadata"]["labels"]
    allowed = {}
    for spec in system.values():
        assert spec["policyTypes"] == ["Ingress"]
        for rule in spec.get("ingress", []):
            for target, labels in (("daemon", daemon), ("postgres", postgres), ("api", api)):
                if selects(spec["podSelector"], labels):
                    allowed.setdefault(target, []).append(rule)
    assert allowed == {
        "daemon": [{"from": [{"namespaceSelector": {"matchLabels": {
            "kubernetes.io/metadata.name": "monitoring"}}}],
            "ports": [{"protocol": "TCP", "port": 9464}]}],
        "postgres": [{"from": [{"podSelector": {"matchLabels": daemon}},
                               {"podSelector": {"matchLabels": api}}],
                      "ports": [{"protocol": "TCP", "port": 5432}]}],
        # the job API's port from anywhere: it authenticates every call itself
        "api": [{"ports": [{"protocol": "TCP", "port": 8080}]}],
    }


def inference_namespace() -> str:
    """The vLLM Deployments' namespace, as the deployed config's replicas query names it."""
    from idlegpu.scheduler.config import load_config

    query = load_config(DEPLOY / "idlegpu.yaml").query_templates["replicas"].query
    (namespace,) = re.findall(r'namespace="([^"]+)"', query)
    return namespace


def test_research_pods_reach_neither_inference_nor_the_daemon():
    (spec,) = policies(JOBS).values()
    assert spec["podSelector"] == {} and spec["policyTypes"] == ["Egress"]
    dns, namespaces, job_api, internet = spec["egress"]
    # of idlegpu-system, the job API's port only (checkpoint acknowledgements)
    (api_peer,) = job_api["to"]
    assert api_peer == {"namespaceSelector": {"matchLabels": {
        "kubernetes.io/metadata.name": SYSTEM}}, "podSelector": {"matchLabels": {
            "app.kubernetes.io/name": "idlegpu-api"}}}
    assert job_api["ports"] == [{"protocol": "TCP", "port": 8080}]
    assert "to" not in dns and {p["port"] for p in dns["ports"]} == {53}
    (peer,) = namespaces["to"]
    assert "podSelector" not in peer  # all pods of the namespaces selected
    assert peer["namespaceSelector"] == {"matchExpressions": [{
        "key": "kubernetes.io/metadata.name", "operator": "NotIn",
        "values": [inference_namespace(), SYSTEM]}]}
    (block,) = internet["to"]
    assert block["ipBlock"]["cidr"] == "0.0.0.0/0"
    for private in ("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "169.254.0.0/16"):
        assert private in block["ipBlock"]["except"]
    assert "ports" not in namespaces and "ports" not in internet


def test_grafana_dashboard_uses_the_daemon_metrics():
    dashboard = json.loads((DEPLOY / "grafana-dashboard.json").read_text())
    exprs = " ".join(t["expr"] for p in dashboard["panels"] for t in p["targets"])
    for metric in ("idlegpu_running_gpus", "idlegpu_harvested_gpu_seconds_total",
                   "idlegpu_lost_gpu_seconds_total", "idlegpu_preemptions_total", "idlegpu_forecast_age_seconds",
                   "idlegpu_signal_age_seconds"):
        assert metric in exprs


def test_the_job_api_runs_two_replicas_on_the_daemons_store_and_config(monkeypatch):
    from idlegpu.forecast.settings_base import ENV_PREFIX
    from idlegpu.scheduler.config import load_config

    for name in [n for n in os.environ if n.startswith(ENV_PREFIX)]:
        monkeypatch.delenv(name)
    deployment = one("Deployment", "idlegpu-api")
    assert deployment["metadata"]["namespace"] == SYSTEM
    assert deployment["spec"]["replicas"] == 2
    assert deployment["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"] == 0
    spec = deployment["spec"]["template"]["spec"]
    assert spec["serviceAccountName"] == "idlegpu-api"
    (container,) = spec["containers"]
    daemon = daemon_container()
    env = {e["name"]: e for e in container["env"]}
    assert env["IDLEGPU_STORE__URL"] == {e["name"]: e for e in daemon["env"]}["IDLEGPU_STORE__URL"]
    assert "IDLEGPU_PROMETHEUS__BEARER_TOKEN" not in env  # the API never reads Prometheus
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    assert container["args"][:3] == ["serve", "--config", f"{mounts['config']}/idlegpu.yaml"]
    assert spec["volumes"][0] == one("Deployment", "idlegpu")["spec"]["template"]["spec"][
        "volumes"][0]  # the same ConfigMap as the daemon: the same admission rules
    port = container["ports"][0]["containerPort"]
    assert container["args"][3:] == ["--host", "0.0.0.0", "--port", str(port)]
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert container[probe]["httpGet"] == {"path": "/healthz", "port": "http"}
    service = one("Service", "idlegpu-api")
    assert service["spec"]["selector"] == deployment["spec"]["selector"]["matchLabels"]
    assert service["spec"]["ports"][0]["targetPort"] == "http"
    pdb = one("PodDisruptionBudget", "idlegpu-api")
    assert pdb["spec"]["selector"] == deployment["spec"]["selector"]
    deployed = load_config(DEPLOY / "idlegpu.yaml")
    assert deployed.api.token_review.enabled and deployed.api.token_review.in_cluster
    assert deployed.api.trusted_proxies == []  # no proxy headers trusted unless configured
