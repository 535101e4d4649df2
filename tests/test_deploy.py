"""deploy/: every manifest validates against the Kubernetes schemas, and the RBAC is minimal."""

import json
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

DEPLOY = Path(__file__).resolve().parents[1] / "deploy"
MANIFESTS = sorted(p for p in DEPLOY.glob("*.yaml")
                   if p.name not in ("kustomization.yaml", "idlegpu.yaml"))


@pytest.mark.parametrize("path", MANIFESTS, ids=lambda p: p.name)
def test_manifest_is_valid_for_kubernetes(path):
    for doc in yaml.safe_load_all(path.read_text()):
        kubernetes_validate.validate(doc, "1.30", strict=True)


def test_bad_manifests_are_caught():
    deployment = yaml.safe_load((DEPLOY / "deployment.yaml").read_text())
    deployment["spec"]["replicas"] = "one"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, "1.30", strict=True)


def test_kustomization_lists_every_manifest():
    kustomization = yaml.safe_load((DEPLOY / "kustomization.yaml").read_text())
    assert sorted(kustomization["resources"]) == sorted(p.name for p in MANIFESTS)


def test_kustomize_reads_only_files_inside_deploy():
    # kustomize's load restrictor refuses anything outside the kustomization's directory
    kustomization = yaml.safe_load((DEPLOY / "kustomization.yaml").read_text())
    files = [f.split("=", 1)[-1] for gen in kustomization["configMapGenerator"]
             for f in gen["files"]]
    for name in [*kustomization["resources"], *files]:
        path = (DEPLOY / name).resolve()
        assert path.is_file() and path.parent == DEPLOY, name


def test_the_deployed_config_is_the_sample_pool_run_in_cluster():
    from forecast.config import load_config

    deployed = load_config(DEPLOY / "idlegpu.yaml")
    sample = load_config(DEPLOY.parent / "idlegpu.yaml")
    assert deployed.cluster.in_cluster
    deployment = yaml.safe_load((DEPLOY / "deployment.yaml").read_text())
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    assert deployed.store.url == f"sqlite:///{mounts['store']}/idlegpu.db"  # on the PVC
    assert deployed.daemon.reports_dir.startswith(mounts["store"])
    assert container["args"] == ["run", "--config", f"{mounts['config']}/idlegpu.yaml"]
    # the two copies describe the same pool; only where things are differs
    where = {"prometheus": {"url"}, "store": {"url"}, "cluster": {"in_cluster"},
             "daemon": {"reports_dir"}}
    assert deployed.model_dump(exclude=where) == sample.model_dump(exclude=where)


def test_role_grants_only_what_the_daemon_uses():
    role = yaml.safe_load((DEPLOY / "role.yaml").read_text())
    grants = {(g, r): set(rule["verbs"]) for rule in role["rules"]
              for g in rule["apiGroups"] for r in rule["resources"]}
    assert grants == {
        ("batch", "jobs"): {"get", "list", "create", "patch", "delete"},
    }
    assert role["kind"] == "Role"  # namespaced, never a ClusterRole


def test_best_effort_priority_class_never_preempts():
    pc = yaml.safe_load((DEPLOY / "priorityclass.yaml").read_text())
    assert pc["value"] < 0 and pc["preemptionPolicy"] == "Never"


def test_one_daemon_replica_recreated_never_two():
    deployment = yaml.safe_load((DEPLOY / "deployment.yaml").read_text())
    assert deployment["spec"]["replicas"] == 1
    assert deployment["spec"]["strategy"]["type"] == "Recreate"


def test_grafana_dashboard_uses_the_daemon_metrics():
    dashboard = json.loads((DEPLOY / "grafana-dashboard.json").read_text())
    exprs = " ".join(t["expr"] for p in dashboard["panels"] for t in p["targets"])
    for metric in ("idlegpu_running_gpus", "idlegpu_harvested_gpu_seconds_total",
                   "idlegpu_preemptions_total", "idlegpu_forecast_age_seconds",
                   "idlegpu_signal_age_seconds"):
        assert metric in exprs
