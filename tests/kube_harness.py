"""Shared pieces of the tests that drive the real ``Controller`` + ``KubernetesCluster`` + SQLite
``JobStore`` on the REAL control plane with simulated GPU nodes (tests/conftest.py's
``kube_control_plane``, ``kube_namespace``, ``node_sim``):

* ``Harness``: one daemon (controller + adapter + store) on a replayed clock that runs at real
  speed from ``REPLAY_START`` (the server's clock says today), passed pass by pass;
* fixtures ``priority_classes`` (the best-effort class of deploy/ and a serving class) and
  ``pool`` (GPU nodes of the test only, their label the Jobs' nodeSelector, and a daemon);
  import them into a test module to use them;
* ``request`` / ``submit``: a request in the store, its unit id back;
* ``record_requests``: what a ``kubernetes`` client sent, recorded on the client's side (the
  server is real; this only shows what the adapter asked for, e.g. its query parameters).
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlsplit

import kubernetes
import numpy as np
import pytest
from kubernetes.client.exceptions import ApiException

from idlegpu.scheduler.adapters.kubernetes import KubernetesCluster
from idlegpu.scheduler.adapters.store import JobStore
from idlegpu.scheduler.controller import Controller, PassReport
from idlegpu.scheduler.specs import expand_units, validate_request
from idlegpu.scheduler.types import FreeProfile, PolicySettings, ServingSignals

REPLAY_START = datetime(2026, 1, 28, 11, 0, tzinfo=UTC)  # 20:00 in Seoul
GRACE_S = 20  # terminationGracePeriodSeconds of checkpointing jobs here


class ScriptedSignals:
    def __init__(self) -> None:
        self.gpus_short = 0
        self.idle_gpus = 16

    def read(self, now: datetime, *, job_gpus: int = 0) -> ServingSignals:
        return ServingSignals(observed_at=now, kv_cache_usage=0.3, idle_gpus=self.idle_gpus,
                              gpus_short=self.gpus_short)


class Harness:
    """One daemon (controller + adapter + store) against the real server, on a replayed clock
    that runs at real speed from ``REPLAY_START`` (``speed``: that many replayed seconds per
    real one). ``api_client``: the daemon's credentials (default: the control plane's
    admin); ``cluster_options``: more of ``KubernetesCluster``'s."""

    def __init__(self, plane, namespace: str, store: JobStore, node_labels: dict[str, str], *,
                 instance: str = "pool-a", api_client: Any = None,
                 cluster_options: dict[str, Any] | None = None, speed: float = 1.0,
                 **controller_options: object) -> None:
        self.store = store
        self.cluster = KubernetesCluster(
            api_client or plane.api_client(), namespace=namespace, node_selector=node_labels,
            grace_seconds=GRACE_S, non_checkpoint_grace_seconds=5, backoff_s=0.2,
            instance=instance, **(cluster_options or {}))
        self.speed = speed
        self.batch = kubernetes.client.BatchV1Api(plane.api_client())
        self.namespace = namespace
        self.signals = ScriptedSignals()
        self.free = np.full(12 * 24, 16.0)
        self._origin = time.monotonic()
        options = {"pending_timeout_s": 900.0, "stop_timeout_s": 1200.0}
        options.update(controller_options)
        self.controller = Controller(store, self.cluster, self.signals, self.forecast,
                                     lambda spec: spec.runtime_estimate_s, PolicySettings(
                                         grace_s=GRACE_S, min_segment_s=60), **options)

    def now(self) -> datetime:
        return REPLAY_START + timedelta(seconds=(time.monotonic() - self._origin) * self.speed)

    def forecast(self, now: datetime) -> FreeProfile:
        return FreeProfile(REPLAY_START, 300, self.free, 0.9, REPLAY_START)

    def restarted(self, **controller_options: object) -> Harness:
        """The same daemon after a restart: a new process, same store, same identity."""
        twin = object.__new__(Harness)
        twin.__dict__.update(self.__dict__)
        twin.controller = Controller(self.store, self.cluster, self.signals, self.forecast,
                                     lambda spec: spec.runtime_estimate_s,
                                     self.controller.settings, **controller_options)
        return twin

    def reconcile(self) -> PassReport:
        return self.controller.reconcile_once(self.now())

    def until(self, done: Callable[[PassReport], bool], *, timeout: float = 60,
              what: str = "") -> PassReport:
        """Reconcile every half second until ``done(report)``; every report is kept."""
        deadline = time.monotonic() + timeout
        self.reports: list[PassReport] = []
        while True:
            report = self.reconcile()
            self.reports.append(report)
            if done(report):
                return report
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out waiting for {what}: last pass {report}")
            time.sleep(0.5)

    def job(self, name: str) -> dict | None:
        try:
            return self.batch.read_namespaced_job(name, self.namespace).to_dict()
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise


def request(name: str, **overrides: object) -> dict:
    data = {
        "name": name, "team": "nlp", "kind": "training",
        "image": "registry.example.com/research/train:1.0", "command": ["python", "train.py"],
        "gpus": 2, "runtime_estimate": "2h", "output": "s3://runs/{name}",
        # the simulated workload checkpoints on SIGTERM before it exits, and says so
        "checkpoint": {"enabled": True, "interval": "10m", "resume_args": ["--resume"],
                       "saves_on_stop": True},
    }
    data.update(overrides)
    return data


def submit(store: JobStore, data: dict, at: datetime = REPLAY_START) -> str:
    req = validate_request(data)
    units = expand_units(req)
    store.submit(req.name, req.team, req.kind, data, units, at - timedelta(minutes=5))
    return next(row.id for row in store.queue() if row.request_name == req.name)


@pytest.fixture(scope="module")
def priority_classes(kube_control_plane) -> None:
    """The best-effort class of deploy/ and a serving class above it."""
    api = kubernetes.client.SchedulingV1Api(kube_control_plane.api_client())
    for name, value, policy in (("idlegpu-best-effort", -10, "Never"),
                                ("serving", 1000000, "PreemptLowerPriority")):
        try:
            api.create_priority_class({"apiVersion": "scheduling.k8s.io/v1",
                                       "kind": "PriorityClass", "metadata": {"name": name},
                                       "value": value, "preemptionPolicy": policy})
        except ApiException as exc:
            if exc.status != 409:
                raise


@pytest.fixture
def pool(kube_control_plane, kube_namespace, node_sim, priority_classes, tmp_path: Path
         ) -> Iterator[Callable[..., tuple[Harness, object]]]:
    """``start(nodes=1, gpus=4, **sim_options) -> (harness, simulator)``: GPU nodes of this
    test only (a label of theirs is the Jobs' nodeSelector) and a daemon on them."""
    stores: list[JobStore] = []

    def start(nodes: int = 1, gpus: int = 4, *, harness: dict | None = None,
              **sim_options: object) -> tuple[Harness, object]:
        labels = {"idlegpu.test/pool": secrets.token_hex(4)}
        sim = node_sim(nodes, gpus, labels=labels, **sim_options)
        store = JobStore(f"sqlite:///{tmp_path / f'jobs-{len(stores)}.db'}")
        stores.append(store)
        return Harness(kube_control_plane, kube_namespace, store, labels,
                       **(harness or {})), sim

    yield start
    for store in stores:
        store.close()


# --------------------------------------------------------------------------- client-side record


@dataclass(frozen=True)
class Sent:
    """One request a client sent: method, path, query (last value of each key), JSON body,
    content type."""

    method: str
    path: str
    query: dict[str, str]
    body: Any
    content_type: str | None


def record_requests(api_client: Any) -> list[Sent]:
    """Record every request ``api_client`` (a ``kubernetes.client.ApiClient``) sends from now
    on, in the list returned; the requests still go to the server unchanged."""
    sent: list[Sent] = []
    rest = api_client.rest_client
    original = rest.request

    def request(method, url, headers=None, body=None, post_params=None,
                _request_timeout=None):
        parts = urlsplit(url)
        content_type = next((v for k, v in (headers or {}).items()
                             if k.lower() == "content-type"), None)
        sent.append(Sent(method, parts.path, dict(parse_qsl(parts.query)), body, content_type))
        return original(method, url, headers=headers, body=body, post_params=post_params,
                        _request_timeout=_request_timeout)

    rest.request = request
    return sent


@pytest.fixture
def inference(kube_control_plane):
    """Stand-in inference replicas, in a namespace of their own (deleted with it after the
    test): ``place(node, gpus) -> name`` binds one to ``node``; ``remove(name)`` deletes it,
    ``gone(name)`` says whether it is gone, ``remove_and_wait(name)`` both."""
    core = kubernetes.client.CoreV1Api(kube_control_plane.api_client())
    namespace = f"inference-{secrets.token_hex(3)}"
    core.create_namespace({"metadata": {"name": namespace}})

    class Inference:
        ns = namespace

        def place(self, node: str, gpus: int) -> str:
            name = f"replica-{node}"
            core.create_namespaced_pod(namespace, {
                "metadata": {"name": name, "labels": {"app": "vllm"},
                             "annotations": {"sim.idlegpu.io/run-seconds": "never",
                                             "sim.idlegpu.io/shutdown-seconds": "0.2"}},
                "spec": {"nodeName": node, "priorityClassName": "serving",
                         "terminationGracePeriodSeconds": 5,
                         "containers": [{"name": "vllm", "image": "vllm/vllm-openai:v0.6",
                                         "resources": {
                                             "requests": {"cpu": "8", "memory": "64Gi",
                                                          "nvidia.com/gpu": str(gpus)},
                                             "limits": {"nvidia.com/gpu": str(gpus)}}}]}})
            return name

        def remove(self, name: str) -> None:
            core.delete_namespaced_pod(name, namespace)

        def gone(self, name: str) -> bool:
            try:
                core.read_namespaced_pod(name, namespace)
            except ApiException as exc:
                if exc.status == 404:
                    return True
                raise
            return False

        def remove_and_wait(self, name: str, timeout: float = 30) -> None:
            self.remove(name)
            deadline = time.monotonic() + timeout
            while not self.gone(name):
                assert time.monotonic() < deadline, f"replica {name} did not go"
                time.sleep(0.2)

    yield Inference()
    core.delete_namespace(namespace, grace_period_seconds=0)
