"""End to end in accelerated time: the real controller and Kubernetes adapter (through the
official client) against the stateful fake API server, with a SQLite store.

Traffic rises in the live signals -> within one backstop pass the job that loses the least
work is suspended -> the unit goes back to the queue with its checkpointed work -> traffic
falls -> it resumes as attempt 2 with a resume hint.
"""

from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np
import pytest
import yaml
from fake_kube import FakeKube

from scheduler.adapters.kubernetes import KubernetesCluster
from scheduler.adapters.store import JobStore
from scheduler.controller import Controller
from scheduler.specs import expand_units, validate_request
from scheduler.types import FreeProfile, JobState, PolicySettings, ServingSignals

T0 = datetime(2026, 1, 28, 11, 0, tzinfo=UTC)  # 20:00 in Seoul
NS = "idlegpu-jobs"


def request(name, checkpoint):
    data = {
        "name": name, "team": "research", "kind": "training" if checkpoint else "eval",
        "image": "registry.example.com/research/train:1.0", "command": ["python", "run.py"],
        "gpus": 8, "runtime_estimate": "6h", "output": "s3://runs/{name}",
    }
    if checkpoint:
        data["checkpoint"] = {"interval": "30m", "resume_args": ["--resume", "{output}/ckpt"]}
    return data


class Signals:
    def __init__(self):
        self.short = 0
        self.idle = None  # GPUs nobody holds, when the test says

    def read(self, now, *, job_gpus=0):
        return ServingSignals(observed_at=now, gpus_short=self.short, idle_gpus=self.idle)


@pytest.fixture
def world(tmp_path):
    with FakeKube() as kube:
        store = JobStore(f"sqlite:///{tmp_path / 'jobs.db'}")
        for name, ckpt in (("train", True), ("evaluate", False)):
            req = validate_request(request(name, ckpt))
            store.submit(req.name, req.team, req.kind, request(name, ckpt),
                         expand_units(req), T0 - timedelta(hours=1))
        cluster = KubernetesCluster(kube.api_client(), namespace=NS, node_selector={},
                                    tolerations=[], retries=2, sleep=lambda s: None)
        signals = Signals()
        profile = FreeProfile(T0, 300, np.full(12 * 24, 16.0), 0.9, T0)
        controller = Controller(store, cluster, signals, lambda now: profile,
                                lambda spec: spec.runtime_estimate_s, PolicySettings())
        yield kube, store, cluster, signals, controller
        store.close()


def running(kube, name, at):
    kube.set_status(name, {"active": 1, "ready": 1,
                           "startTime": at.isoformat().replace("+00:00", "Z")})


def test_traffic_rises_the_cheapest_job_stops_and_resumes_later(world):
    kube, store, cluster, signals, controller = world
    # 20:00: both start (16 GPUs free)
    report = controller.reconcile_once(T0)
    assert len(report.created) == 2
    names = {row.request_name: cluster.job_name(row.id, 1) for row in store.queue()}
    for name in names.values():
        running(kube, name, T0)
    controller.reconcile_once(T0 + timedelta(minutes=1))
    assert {row.state for row in store.queue()} == {JobState.RUNNING}
    # the training job checkpoints at 21:30; the evaluation cannot checkpoint
    train = next(row for row in store.queue() if row.request_name == "train")
    store.checkpointed(train.id, T0 + timedelta(minutes=90), 90 * 60)

    # 21:40: the service suddenly needs 8 GPUs; one backstop pass later a Job is suspended
    signals.short = 8
    report = controller.backstop_once(T0 + timedelta(minutes=100))
    assert report.stopped == [names["train"]]  # 10 min unsaved, not the eval's 100 min
    assert kube.job(names["train"], NS)["spec"]["suspend"] is True
    assert kube.job(names["evaluate"], NS)["spec"].get("suspend") is not True
    # 15 s later the service still waits (the grace period): those GPUs are on their way,
    # so nobody else is stopped for the same need
    report = controller.backstop_once(T0 + timedelta(minutes=100, seconds=15))
    assert report.stopped == []

    # the next pass sees the Job suspended and puts the unit back in the queue; the service
    # has taken those GPUs, none is idle
    signals.short, signals.idle = 0, 0
    report = controller.reconcile_once(T0 + timedelta(minutes=101))
    assert report.released == [train.id]
    row = store.unit(train.id)
    assert row.state is JobState.QUEUED and row.preemptions == 1
    assert row.work_done_s == 90 * 60  # the checkpointed work is kept
    # once recorded, the suspended Job is deleted (a suspended Job never expires by TTL), with
    # its pods: the API's default for a Job would orphan them
    assert report.deleted == [names["train"]]
    with pytest.raises(KeyError):
        kube.job(names["train"], NS)
    delete = [r for r in kube.requests if r.method == "DELETE"]
    assert len(delete) == 1 and delete[0].query.get("propagationPolicy") == "Background"

    # 22:30: traffic is back to normal: the unit resumes as attempt 2 with a resume hint
    signals.idle = 8
    report = controller.reconcile_once(T0 + timedelta(minutes=150))
    second = cluster.job_name(train.id, 2)
    assert report.created == [second]
    env = {e["name"]: e.get("value") for e in
           kube.job(second, NS)["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["IDLEGPU_RESUME"] == "--resume s3://runs/train/ckpt"
    assert kube.count("POST") == 3  # three Jobs created in all, never a duplicate
    # every call of the whole story is one the deployed Role grants, and nothing more is granted
    assert used_verbs(kube) == role_verbs() - {"get"}  # get only serves adopting on a 409


def used_verbs(kube):
    verbs = {("GET", False): "list", ("GET", True): "get", ("POST", False): "create",
             ("PATCH", True): "patch", ("DELETE", True): "delete"}
    return {verbs[(r.method, r.path.rstrip("/").split("/")[-1] != "jobs")]
            for r in kube.requests if "/jobs" in r.path}


def role_verbs():
    role = yaml.safe_load((Path(__file__).parents[1] / "deploy" / "role.yaml").read_text())
    (rule,) = role["rules"]
    assert rule["apiGroups"] == ["batch"] and rule["resources"] == ["jobs"]
    return set(rule["verbs"])


def test_an_api_outage_never_duplicates_nor_loses_a_job(world):
    kube, store, cluster, _, controller = world
    kube.fail_next(3, 503)  # the API is down when the pass starts: it cannot see the cluster
    report = controller.reconcile_once(T0)
    assert not report.created and any("cluster:" in e for e in report.errors)
    assert {row.state for row in store.queue()} == {JobState.QUEUED}  # nothing admitted blind
    report = controller.reconcile_once(T0 + timedelta(minutes=1))  # the API is back
    assert len(report.created) == 2
    controller.reconcile_once(T0 + timedelta(minutes=2))
    jobs = [j for j in cluster.observe()]
    assert len(jobs) == 2 and len({j.name for j in jobs}) == 2


def test_a_pod_evicted_by_the_kube_scheduler_sends_the_unit_back_to_the_queue(world):
    kube, store, cluster, signals, controller = world
    controller.reconcile_once(T0)
    names = {row.request_name: cluster.job_name(row.id, 1) for row in store.queue()}
    for name in names.values():
        running(kube, name, T0)
    controller.reconcile_once(T0 + timedelta(minutes=1))
    # a serving pod needed the GPUs: the kube-scheduler evicted the training pod (our negative
    # PriorityClass); podFailurePolicy ignores the DisruptionTarget, the Job made a new pod,
    # which waits for GPUs
    kube.set_status(names["train"], {"active": 1, "ready": 0,
                                     "startTime": T0.isoformat().replace("+00:00", "Z")})
    signals.idle = 0  # the service holds those GPUs now
    report = controller.reconcile_once(T0 + timedelta(minutes=30))
    assert report.stopped == [names["train"]]
    assert kube.job(names["train"], NS)["spec"]["suspend"] is True
    report = controller.reconcile_once(T0 + timedelta(minutes=31))
    train = next(row for row in store.queue() if row.request_name == "train")
    assert report.released == [train.id] and train.state is JobState.QUEUED
    assert train.preemptions == 1 and report.deleted == [names["train"]]
    evaluate = next(row for row in store.queue() if row.request_name == "evaluate")
    assert evaluate.state is JobState.RUNNING  # untouched


def test_a_job_no_node_can_place_goes_back_to_the_queue(world):
    kube, store, cluster, signals, controller = world
    controller.reconcile_once(T0)
    names = {row.request_name: cluster.job_name(row.id, 1) for row in store.queue()}
    running(kube, names["evaluate"], T0)  # placed; the training pod stays Pending
    report = controller.reconcile_once(T0 + timedelta(minutes=10))
    assert report.stopped == []  # within the 15 min it may still be placed
    signals.idle = 0  # and the pool is busy by now: nothing to admit again at once
    report = controller.reconcile_once(T0 + timedelta(minutes=16))
    assert report.stopped == [names["train"]]
    reason = kube.job(names["train"], NS)["metadata"]["annotations"]["idlegpu.io/stop-reason"]
    assert reason == "not scheduled within 15 min; back to the queue"
    report = controller.reconcile_once(T0 + timedelta(minutes=17))
    train = store.unit(report.released[0])
    assert train.request_name == "train" and train.state is JobState.QUEUED
    assert train.preemptions == 0  # it never ran: not a preemption
    assert report.deleted == [names["train"]]
    assert store.unit(next(r.id for r in store.queue() if r.request_name == "evaluate")
                      ).state is JobState.RUNNING


def test_a_job_the_cluster_refuses_fails_its_unit_instead_of_retrying_for_ever(world):
    kube, store, cluster, _, controller = world
    train = next(row for row in store.queue() if row.request_name == "train")
    name = cluster.job_name(train.id, 1)
    # someone else's Job already has the name of the unit's first attempt
    kube.add_job({"metadata": {"name": name, "labels": {"app": "other"}},
                  "spec": {"template": {"spec": {"containers": [
                      {"name": "x", "image": "x"}], "restartPolicy": "Never"}}}}, namespace=NS)
    report = controller.reconcile_once(T0)
    assert report.failed == [train.id] and len(report.created) == 1  # the other one starts
    failed = store.unit(train.id)
    assert failed.state is JobState.FAILED
    assert f"the cluster refused its Job: Job {NS}/{name} already exists" in failed.reason
    controller.reconcile_once(T0 + timedelta(minutes=1))
    assert kube.count("POST") == 2  # never tried again
    assert kube.job(name, NS)["metadata"]["labels"] == {"app": "other"}  # left alone
