"""A node simulator that plays the kubelet for a real control plane (``tests/kube_control_plane``).

    sim = NodeSimulator(cp.kubeconfig, nodes=2, gpus=4).start()   # Nodes Ready, schedulable
    ... create Jobs; the scheduler binds their pods to sim.node_names ...
    sim.wait_pod(ns, pod_name, "running")      # -> SimPod (env, volumes, timings, exit code)
    sim.kill_node(sim.node_names[0])           # stops heartbeating and handling its pods
    sim.stop(delete_nodes=True)

It runs in two background threads of the test process: one watches the pods bound to its nodes
(``spec.nodeName``), the other acts on them at the right times and heartbeats (Node
``status.conditions`` and the node's Lease in ``kube-node-lease``). Every status write goes
through the ``pods/status`` and ``nodes/status`` subresources, as the kubelet's do.

A pod's life, as a kubelet and a well-behaved workload would live it:

* seen bound to a node: ``Pending`` with its containers waiting (``ContainerCreating``) and
  ``status.startTime``; after the start delay, ``Running`` with every condition True
  (``PodReadyToStartContainers``, ``Initialized``, ``ContainersReady``, ``Ready``) and
  ``containerStatuses[].state.running.startedAt``, ``ready: true``;
* its run time elapses: the containers exit with the pod's exit code (default 0): phase
  ``Succeeded`` (or ``Failed`` for a non-zero code); the pod stays, as a kubelet leaves it;
* it gets a ``deletionTimestamp`` (deleted through the API, e.g. by the Job controller): SIGTERM.
  The workload exits 143 after its shutdown time, or is killed (137) when that time exceeds the
  grace period (``metadata.deletionGracePeriodSeconds``, else
  ``spec.terminationGracePeriodSeconds``, else 30 s). A pod deleted before its containers started
  ends with 137 ``ContainerStatusUnknown``, as the kubelet's status manager reports it. Then the
  phase is set (``Failed``; ``Succeeded`` only for exit 0) with ``containerStatuses[].state
  .terminated``, and, ``delete_delay`` seconds later (the kubelet's status sync, then its pod
  worker's final delete: 0 s to a few seconds on a real node), the pod is deleted with
  ``gracePeriodSeconds=0`` (uid precondition). The Job controller judges a pod it still sees
  terminal against the Job's ``podFailurePolicy``: the longer the delay, the surer it does.
  Like a real kubelet, the simulator never adds a ``DisruptionTarget`` condition, and its status
  writes (strategic merge patches keyed by condition type) keep the conditions others set.

Per-pod behaviour: the simulator's defaults, overridden by these pod annotations (put them on a
Job's pod template):

* ``sim.idlegpu.io/start-delay-seconds``: from being seen bound to Running (default ``start_delay``)
* ``sim.idlegpu.io/run-seconds``: how long it runs before exiting on its own; ``inf`` or
  ``never`` = until deleted (default ``run_seconds``, None = until deleted)
* ``sim.idlegpu.io/exit-code``: the exit code when the run time elapses (default ``exit_code``, 0)
* ``sim.idlegpu.io/shutdown-seconds``: SIGTERM to exit 143 (default ``shutdown_seconds``)
* ``sim.idlegpu.io/delete-delay-seconds``: the terminal status to the final delete (default
  ``delete_delay``: one number, or one per node in order; ``exit_code`` likewise)

``kill_node(name)``: that node stops heartbeating (the node-lifecycle controller marks it
``Unknown`` after its grace period) and its pods are no longer handled: deleted ones stay stuck
Terminating. ``pods()`` / ``pod()`` / ``running_pods()`` give ``SimPod`` snapshots with each
container's env and the pod's volumes as they reached the "kubelet", and ``values``: the
environment as the container would see it, downward-API ``fieldRef``s resolved as the kubelet
resolves them (``metadata.name``, ``namespace``, ``uid``, ``labels['k']``,
``annotations['k']``, ``spec.nodeName``, ``spec.serviceAccountName``, ``status.hostIP``) and
``$(VAR)`` references expanded; e.g. the ``JOB_COMPLETION_INDEX`` the Job controller gives every
pod of an Indexed Job (several pods of one Job are just several pods here: each is bound by
the real kube-scheduler and played on its own).

**Volumes and real workloads** (``volume_root``, ``workload``): with a ``volume_root``, each pod
that starts gets a folder there with its ``downwardAPI`` volumes written as the kubelet
projects them (one file per item, the field's value, written atomically; rewritten whenever
the pod changes, where a kubelet takes up to its sync period, about a minute) and its
projected ``serviceAccountToken`` sources as real tokens from the TokenRequest API, bound to
the pod (``boundObjectRef``: its name and uid) with the source's audience and lifetime.
``SimPod.mounts`` maps each mount path to its folder. ``workload(record) -> argv | None`` runs
a pod's workload as a local process instead of a timer: its environment is the container's
(``values``), paths under a mount path pointing into that mount's folder, its output in
``SimPod.log``; its exit code is the pod's; a deletion sends it SIGTERM and, past the grace
period, SIGKILL (exit 143 / 137 as a container runtime reports them).
"""

from __future__ import annotations

import contextlib
import copy
import itertools
import json
import logging
import queue
import secrets
import signal
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Self
from urllib.parse import quote, urlencode

import urllib3

log = logging.getLogger("node_sim")

ANNOTATION_PREFIX = "sim.idlegpu.io/"
START_DELAY_SECONDS = ANNOTATION_PREFIX + "start-delay-seconds"
RUN_SECONDS = ANNOTATION_PREFIX + "run-seconds"
EXIT_CODE = ANNOTATION_PREFIX + "exit-code"
SHUTDOWN_SECONDS = ANNOTATION_PREFIX + "shutdown-seconds"
DELETE_DELAY_SECONDS = ANNOTATION_PREFIX + "delete-delay-seconds"

GPU = "nvidia.com/gpu"
NODE_LEASE_NAMESPACE = "kube-node-lease"
FIELD_MANAGER = "idlegpu-node-sim"
SIGTERM_EXIT, SIGKILL_EXIT = 143, 137
PROCESS_POLL_SECONDS = 0.2
DEFAULT_GRACE_SECONDS = 30


class KubeHTTPError(RuntimeError):
    def __init__(self, method: str, path: str, status: int, body: str) -> None:
        super().__init__(f"{method} {path}: HTTP {status}: {body[:500]}")
        self.status = status
        self.body = body


class _Relist(Exception):
    """The watch must start again from a fresh list (e.g. 410 Gone)."""


class _Kube:
    """Minimal JSON-over-HTTPS client built from a kubeconfig (certificates or token)."""

    def __init__(self, kubeconfig: str) -> None:
        from kubernetes import client, config

        cfg = client.Configuration()
        config.load_kube_config(config_file=kubeconfig, client_configuration=cfg)
        self.host = cfg.host.rstrip("/")
        self.headers = {"Accept": "application/json", "User-Agent": FIELD_MANAGER}
        token = cfg.get_api_key_with_prefix("authorization")
        if token:
            self.headers["Authorization"] = token
        self.pool = urllib3.PoolManager(
            num_pools=2,
            maxsize=4,
            cert_reqs="CERT_REQUIRED" if cfg.verify_ssl else "CERT_NONE",
            ca_certs=cfg.ssl_ca_cert,
            cert_file=cfg.cert_file,
            key_file=cfg.key_file,
            retries=False,
        )

    def _url(self, path: str, query: dict[str, str] | None) -> str:
        return self.host + path + (f"?{urlencode(query)}" if query else "")

    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        content_type: str = "application/json",
        query: dict[str, str] | None = None,
        timeout: float = 10,
    ) -> Any:
        headers = dict(self.headers)
        data = None
        if body is not None:
            headers["Content-Type"] = content_type
            data = json.dumps(body).encode()
        resp = self.pool.request(
            method, self._url(path, query), body=data, headers=headers,
            timeout=urllib3.Timeout(connect=5, read=timeout),
        )
        text = resp.data.decode(errors="replace")
        if resp.status >= 400:
            raise KubeHTTPError(method, path, resp.status, text)
        return json.loads(text) if text else None

    def stream(self, path: str, query: dict[str, str], read_timeout: float) -> Any:
        resp = self.pool.request(
            "GET", self._url(path, query), headers=self.headers, preload_content=False,
            timeout=urllib3.Timeout(connect=5, read=read_timeout),
        )
        if resp.status >= 400:
            body = resp.data.decode(errors="replace")
            resp.release_conn()
            raise KubeHTTPError("GET", path, resp.status, body)
        return resp

    def close(self) -> None:
        self.pool.clear()


def _json_lines(resp: Any) -> Iterator[dict[str, Any]]:
    buf = b""
    for chunk in resp.stream(65536):
        buf += chunk
        while b"\n" in buf:
            line, buf = buf.split(b"\n", 1)
            if line.strip():
                yield json.loads(line)


def _now() -> datetime:
    return datetime.now(UTC)


def _ts(dt: datetime) -> str:
    return dt.strftime("%Y-%m-%dT%H:%M:%SZ")


def _micro(dt: datetime) -> str:
    return dt.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


@dataclass
class SimPod:
    """What the simulator knows of one pod (snapshots are copies)."""

    namespace: str
    name: str
    uid: str
    node: str
    containers: list[str]
    # container -> variable -> its value (str), or {"valueFrom": ...} for a reference
    env: dict[str, dict[str, Any]]
    env_from: dict[str, list[dict[str, Any]]]
    # container -> variable -> the value the container sees (fieldRefs resolved, $(VAR)
    # expanded); references to Secrets and ConfigMaps are left out
    values: dict[str, dict[str, str]]
    volumes: list[dict[str, Any]]  # spec.volumes as the server returned them
    volume_mounts: dict[str, list[dict[str, Any]]]  # container -> its volumeMounts
    annotations: dict[str, str]
    start_delay: float
    run_seconds: float | None
    exit_code_on_completion: int
    shutdown_seconds: float
    delete_delay: float = 0.0  # the terminal status written -> the final delete
    state: str = "pending"  # pending -> running -> exited
    seen_at: datetime = field(default_factory=_now)
    started_at: datetime | None = None  # containers running
    deletion_seen_at: datetime | None = None  # SIGTERM
    grace_seconds: int | None = None
    exit_code: int | None = None
    reason: str | None = None  # Completed, Error, ContainerStatusUnknown
    finished_at: datetime | None = None
    phase: str | None = None  # the terminal phase the simulator set
    deleted: bool = False  # the simulator sent DELETE gracePeriodSeconds=0
    gone: bool = False  # the object is no longer on the server
    # the pod as the server last showed it (for a gone pod: as its DELETED event carried it)
    last_object: dict[str, Any] = field(default_factory=dict, repr=False)
    mounts: dict[str, str] = field(default_factory=dict)  # mount path -> local folder
    log: str | None = None  # the local workload's output (stdout and stderr)
    # private bookkeeping (monotonic seconds)
    _seen: float = field(default=0.0, repr=False)
    _started: float = field(default=0.0, repr=False)
    _end_due: float | None = field(default=None, repr=False)
    _end: tuple[int, str] | None = field(default=None, repr=False)
    _delete_due: float | None = field(default=None, repr=False)
    _pending_sent: bool = field(default=False, repr=False)
    _start_time: str | None = field(default=None, repr=False)  # status.startTime
    _retry_at: float = field(default=0.0, repr=False)

    @property
    def key(self) -> tuple[str, str]:
        return self.namespace, self.name


def _field(pod: dict[str, Any], path: str) -> str | None:
    """A downward-API ``fieldPath`` of ``pod`` as the kubelet resolves it (None: not one of
    those the simulator knows)."""
    meta, spec = pod.get("metadata") or {}, pod.get("spec") or {}
    for key in ("labels", "annotations"):
        prefix = f"metadata.{key}['"
        if path.startswith(prefix) and path.endswith("']"):
            return str((meta.get(key) or {}).get(path[len(prefix):-2], ""))
    simple = {"metadata.name": meta.get("name"), "metadata.namespace": meta.get("namespace"),
              "metadata.uid": meta.get("uid"), "spec.nodeName": spec.get("nodeName"),
              "spec.serviceAccountName": spec.get("serviceAccountName")}
    return None if simple.get(path) is None else str(simple[path])


def _values_of(container: dict[str, Any], pod: dict[str, Any], host_ip: str) -> dict[str, str]:
    """The container's environment as it would see it (the kubelet's rules: in order, each
    ``$(VAR)`` expanded from those before it, ``$$`` an escaped ``$``)."""
    import re

    seen: dict[str, str] = {}

    def expand(text: str) -> str:
        return re.sub(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)",
                      lambda m: "$" if m.group(0) == "$$" else seen.get(m.group(1), m.group(0)),
                      text)

    for var in container.get("env") or []:
        ref = (var.get("valueFrom") or {}).get("fieldRef")
        if "valueFrom" not in var:
            seen[var["name"]] = expand(var.get("value", ""))
        elif ref is not None:
            path = ref.get("fieldPath", "")
            value = host_ip if path == "status.hostIP" else _field(pod, path)
            if value is not None:
                seen[var["name"]] = value
    return seen


def _write_atomically(path: Path, text: str) -> None:
    """As the kubelet's atomic writer does: a reader sees the old file or the new, whole."""
    partial = path.with_name(f".{path.name}.tmp")
    partial.write_text(text)
    partial.replace(path)


def _per_node(value: Any, names: list[str], what: str) -> dict[str, Any]:
    """One value for every node, or one per node in the order of ``names``."""
    if isinstance(value, (int, float)):
        return dict.fromkeys(names, value)
    values = list(value)
    if len(values) != len(names):
        raise ValueError(f"{what}: one value, or one per node ({len(names)})")
    return dict(zip(names, values, strict=True))


def _env_of(container: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for var in container.get("env") or []:
        if "valueFrom" in var:
            out[var["name"]] = {"valueFrom": var["valueFrom"]}
        else:
            out[var["name"]] = var.get("value", "")
    return out


class NodeSimulator:
    """Plays the kubelet of ``nodes`` simulated GPU nodes (see the module docstring)."""

    def __init__(
        self,
        kubeconfig: str,
        nodes: int | Sequence[str] = 1,
        *,
        gpus: int | Sequence[int] = 4,
        cpu: str = "32",
        memory: str = "256Gi",
        pods: int = 110,
        ephemeral_storage: str = "500Gi",
        labels: dict[str, str] | None = None,
        taints: list[dict[str, Any]] | None = None,
        name_prefix: str | None = None,
        start_delay: float = 0.2,
        run_seconds: float | None = None,
        exit_code: int | Sequence[int] = 0,
        shutdown_seconds: float = 1.0,
        delete_delay: float | Sequence[float] = 1.0,
        heartbeat_seconds: float = 2.0,
        lease_duration_seconds: int = 40,
        volume_root: str | None = None,
        workload: Callable[[SimPod], list[str] | None] | None = None,
    ) -> None:
        if isinstance(nodes, int):
            prefix = name_prefix or f"sim-{secrets.token_hex(3)}"
            names = [f"{prefix}-{i}" for i in range(nodes)]
        else:
            names = list(nodes)
        if not names:
            raise ValueError("a simulator needs at least one node")
        gpu_counts = [gpus] * len(names) if isinstance(gpus, int) else list(gpus)
        if len(gpu_counts) != len(names):
            raise ValueError("gpus: one count per node")
        self.kubeconfig = kubeconfig
        self.node_names: list[str] = names
        self.gpus = dict(zip(names, gpu_counts, strict=True))
        self.cpu, self.memory, self.max_pods = cpu, memory, pods
        self.ephemeral_storage = ephemeral_storage
        self.labels = labels or {}
        self.taints = taints or []
        self.start_delay = start_delay
        self.run_seconds = run_seconds
        self.exit_code = _per_node(exit_code, names, "exit_code")
        self.shutdown_seconds = shutdown_seconds
        self.delete_delay = _per_node(delete_delay, names, "delete_delay")
        self.heartbeat_seconds = heartbeat_seconds
        self.lease_duration_seconds = lease_duration_seconds
        self.volume_root = volume_root
        self.workload = workload

        self._kube: _Kube | None = None
        self._dead: set[str] = set()
        self._node_since: dict[str, str] = {}  # Ready lastTransitionTime per node
        self._cache: dict[str, dict[str, Any]] = {}  # uid -> latest pod object (worker only)
        self._records: dict[str, SimPod] = {}  # uid -> record (guarded by _cond)
        self._processes: dict[str, Any] = {}  # uid -> its local workload (subprocess.Popen)
        self._cond = threading.Condition()
        self._events: queue.Queue[tuple[str, Any]] = queue.Queue()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._watch_resp: Any = None
        self._ips = itertools.count(2)
        self.errors: list[str] = []  # API errors the worker met (it retries)

    # ---- public API ----------------------------------------------------------------------
    def start(self, *, wait_ready: bool = True, timeout: float = 30) -> Self:
        """Register the nodes (Ready, with their Leases) and start handling their pods; with
        ``wait_ready``, return once the node-lifecycle controller has lifted the
        ``node.kubernetes.io/not-ready`` taint, i.e. the scheduler can use them."""
        self._kube = _Kube(self.kubeconfig)
        for index, name in enumerate(self.node_names):
            self._register(name, index)
        self._threads = [
            threading.Thread(target=self._watch_loop, name="node-sim-watch", daemon=True),
            threading.Thread(target=self._work_loop, name="node-sim-worker", daemon=True),
        ]
        for thread in self._threads:
            thread.start()
        if wait_ready:
            self.wait_nodes_ready(timeout=timeout)
        return self

    def wait_nodes_ready(self, timeout: float = 30) -> None:
        assert self._kube is not None
        deadline = time.monotonic() + timeout
        pending = set(self.node_names)
        while pending:
            for name in sorted(pending):
                node = self._kube.request("GET", f"/api/v1/nodes/{name}")
                taints = node.get("spec", {}).get("taints") or []
                if not any(t.get("key") == "node.kubernetes.io/not-ready" for t in taints):
                    pending.discard(name)
            if pending and time.monotonic() > deadline:
                raise TimeoutError(f"nodes still tainted not-ready: {sorted(pending)}")
            if pending:
                time.sleep(0.1)

    def stop(self, *, delete_nodes: bool = False) -> None:
        """Stop both threads (and the local workloads); with ``delete_nodes``, delete the
        Nodes and their Leases."""
        self._stop.set()
        with self._cond:
            processes = list(self._processes.values())
        for process in processes:
            if process.poll() is None:
                process.kill()
                process.wait(timeout=10)
        self._events.put(("STOP", None))
        resp = self._watch_resp
        if resp is not None:
            with contextlib.suppress(Exception):  # it may be closing already
                getattr(resp, "shutdown", resp.close)()
        for thread in self._threads:
            thread.join(timeout=15)
        self._threads = []
        if self._kube is not None:
            if delete_nodes:
                for name in self.node_names:
                    lease = (f"/apis/coordination.k8s.io/v1/namespaces/{NODE_LEASE_NAMESPACE}"
                             f"/leases/{name}")
                    for path in (lease, f"/api/v1/nodes/{name}"):
                        try:
                            self._kube.request("DELETE", path)
                        except KubeHTTPError as exc:
                            if exc.status != 404:
                                raise
            self._kube.close()
            self._kube = None

    def __enter__(self) -> Self:
        if self._kube is None:
            self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop(delete_nodes=True)

    def kill_node(self, name: str) -> None:
        """From now on ``name`` sends no heartbeat and its pods are left as they are."""
        if name not in self.node_names:
            raise KeyError(name)
        with self._cond:
            self._dead.add(name)
        self._events.put(("WAKE", None))

    def pods(self) -> list[SimPod]:
        """Every pod the simulator has handled, in the order it first saw them (copies)."""
        with self._cond:
            return [copy.deepcopy(p) for p in self._records.values()]

    def pod(self, namespace: str, name: str) -> SimPod | None:
        """The newest pod of that name (a copy), or None."""
        with self._cond:
            found = [p for p in self._records.values() if p.key == (namespace, name)]
            return copy.deepcopy(found[-1]) if found else None

    def running_pods(self) -> list[SimPod]:
        return [p for p in self.pods() if p.state == "running"]

    def wait_for(
        self, predicate: Callable[[list[SimPod]], Any], *, timeout: float = 30, what: str = ""
    ) -> Any:
        """Wait until ``predicate(records)`` is truthy (re-checked on every change); return it."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                result = predicate(list(self._records.values()))
                if result:
                    return copy.deepcopy(result)
                left = deadline - time.monotonic()
                if left <= 0:
                    states = {f"{p.namespace}/{p.name}": p.state for p in self._records.values()}
                    raise TimeoutError(f"timed out waiting for {what or predicate}: {states}; "
                                       f"errors: {self.errors[-3:]}")
                self._cond.wait(min(left, 0.5))

    def wait_pod(
        self, namespace: str, name: str, state: str = "running", *, timeout: float = 30
    ) -> SimPod:
        """Wait until pod ``namespace/name`` reaches ``state``: running, exited or gone."""
        order = {"pending": 0, "running": 1, "exited": 2}

        def reached(records: list[SimPod]) -> SimPod | None:
            for p in reversed(records):
                if p.key == (namespace, name):
                    if state == "gone":
                        return p if p.gone else None
                    return p if order[p.state] >= order[state] else None
            return None

        return self.wait_for(reached, timeout=timeout, what=f"{namespace}/{name} {state}")

    # ---- nodes ---------------------------------------------------------------------------
    def _resources(self, name: str) -> dict[str, str]:
        return {
            "cpu": self.cpu,
            "memory": self.memory,
            "pods": str(self.max_pods),
            "ephemeral-storage": self.ephemeral_storage,
            GPU: str(self.gpus[name]),
        }

    def _node_ip(self, name: str) -> str:
        return f"10.201.{self.node_names.index(name)}.1"

    def _conditions(self, name: str, now: datetime) -> list[dict[str, Any]]:
        since = self._node_since[name]
        beat = _ts(now)
        conditions = [
            {"type": kind, "status": "False", "reason": f"KubeletHasNo{kind}",
             "message": f"kubelet has no {kind} (simulated)",
             "lastHeartbeatTime": beat, "lastTransitionTime": since}
            for kind in ("MemoryPressure", "DiskPressure", "PIDPressure")
        ]
        conditions.append({
            "type": "Ready", "status": "True", "reason": "KubeletReady",
            "message": "kubelet is posting ready status (simulated)",
            "lastHeartbeatTime": beat, "lastTransitionTime": since,
        })
        return conditions

    def _node_status(self, name: str, now: datetime) -> dict[str, Any]:
        resources = self._resources(name)
        return {
            "capacity": resources,
            "allocatable": resources,
            "conditions": self._conditions(name, now),
            "addresses": [
                {"type": "InternalIP", "address": self._node_ip(name)},
                {"type": "Hostname", "address": name},
            ],
            "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}},
            "nodeInfo": {
                "machineID": name, "systemUUID": name, "bootID": name,
                "kernelVersion": "6.1.0-sim", "osImage": "idlegpu node simulator",
                "containerRuntimeVersion": "sim://1.0", "kubeletVersion": "v1.36.0-sim",
                "kubeProxyVersion": "", "operatingSystem": "linux", "architecture": "amd64",
            },
        }

    def _register(self, name: str, index: int) -> None:
        assert self._kube is not None
        now = _now()
        self._node_since[name] = _ts(now)
        labels = {
            "kubernetes.io/hostname": name,
            "kubernetes.io/os": "linux",
            "kubernetes.io/arch": "amd64",
            "nvidia.com/gpu.present": "true",
            "nvidia.com/gpu.count": str(self.gpus[name]),
            ANNOTATION_PREFIX + "simulated": "true",
            **self.labels,
        }
        body = {
            "apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "labels": labels},
            "spec": {"taints": self.taints} if self.taints else {},
            "status": self._node_status(name, now),
        }
        try:
            node = self._kube.request("POST", "/api/v1/nodes", body)
        except KubeHTTPError as exc:
            if exc.status != 409:
                raise
            node = self._kube.request("GET", f"/api/v1/nodes/{name}")
        self._patch_node_status(name, self._node_status(name, now))
        lease = {
            "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
            "metadata": {
                "name": name, "namespace": NODE_LEASE_NAMESPACE,
                "ownerReferences": [{"apiVersion": "v1", "kind": "Node", "name": name,
                                     "uid": node["metadata"]["uid"]}],
            },
            "spec": {"holderIdentity": name,
                     "leaseDurationSeconds": self.lease_duration_seconds,
                     "renewTime": _micro(now)},
        }
        path = f"/apis/coordination.k8s.io/v1/namespaces/{NODE_LEASE_NAMESPACE}/leases"
        try:
            self._kube.request("POST", path, lease)
        except KubeHTTPError as exc:
            if exc.status != 409:
                raise
            self._renew_lease(name, now)

    def _patch_node_status(self, name: str, status: dict[str, Any]) -> None:
        assert self._kube is not None
        self._kube.request(
            "PATCH", f"/api/v1/nodes/{name}/status", {"status": status},
            content_type="application/strategic-merge-patch+json",
            query={"fieldManager": FIELD_MANAGER},
        )

    def _renew_lease(self, name: str, now: datetime) -> None:
        assert self._kube is not None
        self._kube.request(
            "PATCH",
            f"/apis/coordination.k8s.io/v1/namespaces/{NODE_LEASE_NAMESPACE}/leases/{name}",
            {"spec": {"holderIdentity": name, "renewTime": _micro(now),
                      "leaseDurationSeconds": self.lease_duration_seconds}},
            content_type="application/merge-patch+json",
            query={"fieldManager": FIELD_MANAGER},
        )

    def _heartbeat(self) -> None:
        now = _now()
        for name in self.node_names:
            if name in self._dead:
                continue
            try:
                self._renew_lease(name, now)
                self._patch_node_status(name, {
                    "conditions": self._conditions(name, now),
                    "capacity": self._resources(name),
                    "allocatable": self._resources(name),
                })
            except (KubeHTTPError, urllib3.exceptions.HTTPError) as exc:
                self._error(f"heartbeat {name}: {exc}")

    # ---- threads -------------------------------------------------------------------------
    def _watch_loop(self) -> None:
        assert self._kube is not None
        kube = self._kube
        selector = (f"spec.nodeName={self.node_names[0]}" if len(self.node_names) == 1
                    else "spec.nodeName!=")
        while not self._stop.is_set():
            try:
                listing = kube.request("GET", "/api/v1/pods", query={"fieldSelector": selector})
                version = listing["metadata"]["resourceVersion"]
                self._events.put(("SYNC", listing.get("items") or []))
                while not self._stop.is_set():
                    resp = kube.stream("/api/v1/pods", {
                        "fieldSelector": selector, "watch": "1", "resourceVersion": version,
                        "allowWatchBookmarks": "true", "timeoutSeconds": "30",
                    }, read_timeout=45)
                    self._watch_resp = resp
                    try:
                        if self._stop.is_set():  # stop() ran before the response was set
                            break
                        for event in _json_lines(resp):
                            kind, obj = event.get("type"), event.get("object") or {}
                            if kind == "ERROR":
                                raise _Relist(obj.get("message"))
                            version = obj.get("metadata", {}).get("resourceVersion", version)
                            if kind != "BOOKMARK":
                                self._events.put((kind, obj))
                    finally:
                        self._watch_resp = None
                        resp.release_conn()
            except _Relist:
                continue
            except Exception as exc:  # noqa: BLE001 - reconnect, unless stopping
                if self._stop.is_set():
                    break
                self._error(f"watch: {exc!r}")
                self._stop.wait(0.5)

    def _work_loop(self) -> None:
        next_beat = time.monotonic() + self.heartbeat_seconds
        next_due = next_beat
        while not self._stop.is_set():
            items = []
            try:
                items.append(self._events.get(timeout=max(0.0, min(next_due - time.monotonic(),
                                                                  1.0))))
                while True:
                    items.append(self._events.get_nowait())
            except queue.Empty:
                pass
            if self._stop.is_set():
                break
            for kind, obj in items:
                self._apply(kind, obj)
            now = time.monotonic()
            if now >= next_beat:
                self._heartbeat()
                next_beat = now + self.heartbeat_seconds
            next_due = next_beat
            for uid in list(self._cache):
                try:
                    due = self._reconcile(uid, time.monotonic())
                except Exception as exc:  # noqa: BLE001 - keep playing the other pods
                    self._error(f"pod {uid}: {exc!r}")
                    due = time.monotonic() + 0.5
                    record = self._records.get(uid)
                    if record is not None:
                        record._retry_at = due
                if due is not None:
                    next_due = min(next_due, due)

    def _error(self, message: str) -> None:
        log.warning("node simulator: %s", message)
        self.errors.append(message)

    # ---- pods ----------------------------------------------------------------------------
    def _apply(self, kind: str, obj: Any) -> None:
        if kind == "SYNC":
            fresh = {p["metadata"]["uid"]: p for p in obj if self._ours(p)}
            for uid in set(self._cache) - set(fresh):
                self._mark_gone(uid, None)
            self._cache = fresh
            for pod in fresh.values():
                self._remember(pod)
        elif kind in ("ADDED", "MODIFIED"):
            if self._ours(obj):
                self._cache[obj["metadata"]["uid"]] = obj
                self._remember(obj)
                record = self._records.get(obj["metadata"]["uid"])
                if record is not None and record.mounts:
                    self._write_downward(obj, record)
        elif kind == "DELETED":
            uid = obj.get("metadata", {}).get("uid")
            self._cache.pop(uid, None)
            self._mark_gone(uid, obj)

    def _remember(self, pod: dict[str, Any]) -> None:
        with self._cond:
            record = self._records.get(pod["metadata"]["uid"])
            if record is not None:
                record.last_object = pod

    def _ours(self, pod: dict[str, Any]) -> bool:
        return pod.get("spec", {}).get("nodeName") in self.gpus

    def _mark_gone(self, uid: str | None, last: dict[str, Any] | None) -> None:
        with self._cond:
            record = self._records.get(uid) if uid else None
            if record is not None and not record.gone:
                record.gone = True
                if last:
                    record.last_object = last
                self._cond.notify_all()

    def _new_record(self, pod: dict[str, Any]) -> SimPod:
        meta, spec = pod["metadata"], pod["spec"]
        annotations = meta.get("annotations") or {}
        containers = spec.get("containers") or []

        def number(key: str, default: float | None, *, infinite: bool = False) -> float | None:
            raw = annotations.get(key)
            if raw is None:
                return default
            text = raw.strip().lower()
            if infinite and text in ("inf", "infinity", "never", "forever", ""):
                return None
            try:
                return float(text)
            except ValueError:
                self._error(f"{meta['namespace']}/{meta['name']}: bad {key}={raw!r}")
                return default

        record = SimPod(
            namespace=meta["namespace"], name=meta["name"], uid=meta["uid"],
            node=spec["nodeName"],
            containers=[c["name"] for c in containers],
            env={c["name"]: _env_of(c) for c in containers},
            env_from={c["name"]: list(c.get("envFrom") or []) for c in containers},
            values={c["name"]: _values_of(c, pod, self._node_ip(spec["nodeName"]))
                    for c in containers},
            volumes=copy.deepcopy(spec.get("volumes") or []),
            volume_mounts={c["name"]: list(c.get("volumeMounts") or []) for c in containers},
            annotations=dict(annotations),
            start_delay=number(START_DELAY_SECONDS, self.start_delay) or 0.0,
            run_seconds=number(RUN_SECONDS, self.run_seconds, infinite=True),
            exit_code_on_completion=int(number(EXIT_CODE, self.exit_code[spec["nodeName"]])
                                        or 0),
            shutdown_seconds=number(SHUTDOWN_SECONDS, self.shutdown_seconds) or 0.0,
            delete_delay=number(DELETE_DELAY_SECONDS, self.delete_delay[spec["nodeName"]]) or 0.0,
            last_object=pod,
            _seen=time.monotonic(),
        )
        if pod.get("status", {}).get("phase") in ("Succeeded", "Failed"):
            record.state = "exited"  # finished before this simulator saw it
            record.phase = pod["status"]["phase"]
        return record

    def _reconcile(self, uid: str, now: float) -> float | None:
        """Act on one pod; return when it next needs attention (monotonic), or None."""
        pod = self._cache[uid]
        with self._cond:
            if pod["spec"]["nodeName"] in self._dead:
                return None
            record = self._records.get(uid)
            if record is None:
                record = self._records[uid] = self._new_record(pod)
                self._cond.notify_all()
        if now < record._retry_at:
            return record._retry_at
        meta = pod["metadata"]
        deleting = bool(meta.get("deletionTimestamp")) or record.deletion_seen_at is not None

        if record.state != "exited":
            if deleting:
                if record.deletion_seen_at is None:
                    grace = meta.get("deletionGracePeriodSeconds")
                    if grace is None:
                        grace = pod["spec"].get("terminationGracePeriodSeconds")
                    grace = DEFAULT_GRACE_SECONDS if grace is None else int(grace)
                    with self._cond:
                        record.deletion_seen_at = _now()
                        record.grace_seconds = grace
                        self._cond.notify_all()
                    if record.uid in self._processes and record.state == "running":
                        self._processes[record.uid].send_signal(signal.SIGTERM)
                        record._end_due = now + grace  # then SIGKILL
                        record._end = (SIGKILL_EXIT, "Error")
                    elif record.state != "running":
                        record._end_due, record._end = now, (SIGKILL_EXIT, "ContainerStatusUnknown")
                    elif record.shutdown_seconds <= grace:
                        record._end_due = now + record.shutdown_seconds
                        record._end = (SIGTERM_EXIT, "Error")
                    else:
                        record._end_due, record._end = now + grace, (SIGKILL_EXIT, "Error")
                assert record._end_due is not None and record._end is not None
                if record.uid in self._processes and record.state == "running":
                    code = self._processes[record.uid].poll()
                    if code is None and now < record._end_due:
                        return min(record._end_due, now + PROCESS_POLL_SECONDS)
                    if code is None:
                        self._processes[record.uid].kill()
                        code = self._processes[record.uid].wait(timeout=10)
                    code = 128 - code if code < 0 else code
                    record._end = (code, "Completed" if code == 0 else "Error")
                elif now < record._end_due:
                    return record._end_due
                self._finish(pod, record, *record._end)
            elif record.state == "pending":
                if not record._pending_sent and record.start_delay > 0:
                    self._patch_pod_status(pod, self._pending_status(pod, record))
                    record._pending_sent = True
                due = record._seen + record.start_delay
                if now < due:
                    return due
                if self.volume_root is not None and not record.mounts:
                    self._project_volumes(pod, record)
                argv = self.workload(record) if self.workload is not None else None
                self._patch_pod_status(pod, self._running_status(pod, record))
                with self._cond:
                    record.state, record._started = "running", now
                    self._cond.notify_all()
                if argv:
                    self._start_process(record, argv)
                    return now + PROCESS_POLL_SECONDS
                if record.run_seconds is None:
                    return None
                return now + record.run_seconds
            elif record.uid in self._processes:  # running: a real process
                code = self._processes[record.uid].poll()
                if code is None:
                    return now + PROCESS_POLL_SECONDS
                code = 128 - code if code < 0 else code
                self._finish(pod, record, code, "Completed" if code == 0 else "Error")
            else:  # running
                if record.run_seconds is None:
                    return None
                due = record._started + record.run_seconds
                if now < due:
                    return due
                code = record.exit_code_on_completion
                # a container that ends on its own with 137 was killed by the kernel's OOM
                # killer, as the kubelet reports it
                reason = {0: "Completed", SIGKILL_EXIT: "OOMKilled"}.get(code, "Error")
                self._finish(pod, record, code, reason)

        if deleting and not record.deleted:
            if record._delete_due is None:
                record._delete_due = time.monotonic() + record.delete_delay
            if time.monotonic() < record._delete_due:
                return record._delete_due
            assert self._kube is not None
            try:
                self._kube.request(
                    "DELETE", f"/api/v1/namespaces/{quote(record.namespace)}/pods/"
                    f"{quote(record.name)}",
                    {"apiVersion": "v1", "kind": "DeleteOptions", "gracePeriodSeconds": 0,
                     "preconditions": {"uid": uid}},
                )
            except KubeHTTPError as exc:
                if exc.status not in (404, 409):  # gone already / another pod of that name
                    raise
            with self._cond:
                record.deleted = True
                self._cond.notify_all()
        return None

    def _project_volumes(self, pod: dict[str, Any], record: SimPod) -> None:
        """The pod's downward-API and projected token volumes, as files in its folder."""
        assert self.volume_root is not None and self._kube is not None
        base = Path(self.volume_root) / record.uid
        mounts = {m["name"]: m["mountPath"] for c in pod["spec"].get("containers") or []
                  for m in c.get("volumeMounts") or []}
        meta, spec = pod["metadata"], pod["spec"]
        projected: dict[str, str] = {}  # all or nothing: a failed token request is retried
        for volume in spec.get("volumes") or []:
            name = volume["name"]
            if name not in mounts or not ({"downwardAPI", "projected"} & set(volume)):
                continue
            folder = base / name
            folder.mkdir(parents=True, exist_ok=True)
            for source in (volume.get("projected") or {}).get("sources") or []:
                token = source.get("serviceAccountToken")
                if token is None:
                    continue
                account = spec.get("serviceAccountName") or "default"
                answer = self._kube.request(
                    "POST", f"/api/v1/namespaces/{quote(meta['namespace'])}/serviceaccounts/"
                    f"{quote(account)}/token",
                    {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
                     "spec": {"audiences": [token["audience"]] if token.get("audience") else [],
                              "expirationSeconds": int(token.get("expirationSeconds", 3600)),
                              "boundObjectRef": {"apiVersion": "v1", "kind": "Pod",
                                                 "name": meta["name"], "uid": meta["uid"]}}})
                _write_atomically(folder / token["path"], answer["status"]["token"])
            projected[mounts[name]] = str(folder)
        record.mounts.update(projected)
        self._write_downward(pod, record)

    def _write_downward(self, pod: dict[str, Any], record: SimPod) -> None:
        if self.volume_root is None:
            return
        base = Path(self.volume_root) / record.uid
        for volume in pod["spec"].get("volumes") or []:
            folder = base / volume["name"]
            if "downwardAPI" not in volume or not folder.is_dir():
                continue
            for item in volume["downwardAPI"].get("items") or []:
                path = (item.get("fieldRef") or {}).get("fieldPath", "")
                _write_atomically(folder / item["path"], _field(pod, path) or "")

    def _start_process(self, record: SimPod, argv: list[str]) -> None:
        import os
        import subprocess

        values = dict(record.values.get(record.containers[0], {}))
        for key, value in values.items():
            for mount, folder in record.mounts.items():
                if value == mount or value.startswith(mount.rstrip("/") + "/"):
                    values[key] = folder + value[len(mount.rstrip("/")):]
        env = {k: v for k, v in os.environ.items() if k in ("PATH", "HOME", "LANG",
                                                              "SYSTEMROOT", "PYTHONPATH")}
        env.update(values)
        log_path = Path(self.volume_root or ".") / record.uid / "workload.log"
        log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(log_path, "wb") as out:
            process = subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT,
                                       stdin=subprocess.DEVNULL)
        with self._cond:
            self._processes[record.uid], record.log = process, str(log_path)
            self._cond.notify_all()

    def _patch_pod_status(self, pod: dict[str, Any], status: dict[str, Any]) -> None:
        assert self._kube is not None
        meta = pod["metadata"]
        try:
            self._kube.request(
                "PATCH",
                f"/api/v1/namespaces/{quote(meta['namespace'])}/pods/{quote(meta['name'])}/status",
                {"metadata": {"uid": meta["uid"]}, "status": status},
                content_type="application/strategic-merge-patch+json",
                query={"fieldManager": FIELD_MANAGER},
            )
        except KubeHTTPError as exc:
            if exc.status == 404:
                return  # deleted meanwhile; its DELETED event follows
            raise

    def _pod_ip(self, pod: dict[str, Any]) -> str:
        index = self.node_names.index(pod["spec"]["nodeName"])
        return f"10.202.{index}.{2 + next(self._ips) % 250}"

    @staticmethod
    def _condition(kind: str, status: bool, now: str, reason: str | None = None,
                   message: str | None = None) -> dict[str, Any]:
        # None removes a field in a strategic merge patch: no stale reason or message from
        # the condition's previous state
        return {"type": kind, "status": "True" if status else "False", "lastProbeTime": None,
                "lastTransitionTime": now, "reason": reason, "message": message}

    def _host(self, pod: dict[str, Any]) -> dict[str, Any]:
        ip = self._node_ip(pod["spec"]["nodeName"])
        return {"hostIP": ip, "hostIPs": [{"ip": ip}]}

    def _pending_status(self, pod: dict[str, Any], record: SimPod) -> dict[str, Any]:
        now = _ts(_now())
        record._start_time = now
        names = [c["name"] for c in pod["spec"].get("containers") or []]
        unready = f"containers with unready status: [{' '.join(names)}]"
        return {
            "phase": "Pending", **self._host(pod), "startTime": now,
            "conditions": [
                self._condition("PodReadyToStartContainers", False, now),
                self._condition("Initialized", True, now),
                self._condition("Ready", False, now, "ContainersNotReady", unready),
                self._condition("ContainersReady", False, now, "ContainersNotReady", unready),
            ],
            "containerStatuses": [
                {"name": c["name"], "image": c.get("image", ""), "imageID": "",
                 "ready": False, "started": False, "restartCount": 0,
                 "state": {"waiting": {"reason": "ContainerCreating"}}}
                for c in pod["spec"].get("containers") or []
            ],
        }

    def _running_status(self, pod: dict[str, Any], record: SimPod) -> dict[str, Any]:
        started = _now()
        with self._cond:
            record.started_at = started
        now = _ts(started)
        ip = self._pod_ip(pod)
        status: dict[str, Any] = {
            "phase": "Running", **self._host(pod), "podIP": ip, "podIPs": [{"ip": ip}],
            "conditions": [
                self._condition(kind, True, now)
                for kind in ("PodReadyToStartContainers", "Initialized", "ContainersReady",
                             "Ready")
            ],
            "containerStatuses": [
                self._container(c, record, running=True, started=now)
                for c in pod["spec"].get("containers") or []
            ],
        }
        if record._start_time is None:
            record._start_time = now
            status["startTime"] = now
        inits = pod["spec"].get("initContainers") or []
        if inits:
            status["initContainerStatuses"] = [
                self._container(c, record, running=c.get("restartPolicy") == "Always",
                                started=now, exit_code=0, reason="Completed")
                for c in inits
            ]
        return status

    def _container(
        self, container: dict[str, Any], record: SimPod, *, running: bool, started: str | None,
        exit_code: int | None = None, reason: str | None = None, finished: str | None = None,
    ) -> dict[str, Any]:
        image = container.get("image", "")
        status: dict[str, Any] = {
            "name": container["name"], "image": image,
            "imageID": f"{image}@sha256:{'0' * 64}" if started else "",
            "restartCount": 0, "ready": running, "started": running,
        }
        if started:
            status["containerID"] = f"sim://{record.uid}/{container['name']}"
        if running:
            status["state"] = {"running": {"startedAt": started}}
        else:
            terminated: dict[str, Any] = {"exitCode": exit_code, "reason": reason}
            if reason == "ContainerStatusUnknown":
                terminated["message"] = "The container could not be located when the pod was " \
                                        "terminated"
            if started:
                terminated["startedAt"] = started
                terminated["finishedAt"] = finished or _ts(_now())
                terminated["containerID"] = status["containerID"]
            status["state"] = {"terminated": terminated}
        return status

    def _finish(self, pod: dict[str, Any], record: SimPod, code: int, reason: str) -> None:
        """The containers exited with ``code``: write the terminal phase and statuses."""
        finished = _now()
        now = _ts(finished)
        started = _ts(record.started_at) if record.started_at else None
        phase = "Succeeded" if code == 0 else "Failed"
        unready = ("PodCompleted" if phase == "Succeeded" else "PodFailed", None)
        status: dict[str, Any] = {
            "phase": phase,
            "conditions": [
                self._condition("PodReadyToStartContainers", False, now),
                self._condition("Ready", False, now, *unready),
                self._condition("ContainersReady", False, now, *unready),
            ],
            "containerStatuses": [
                self._container(c, record, running=False, started=started, exit_code=code,
                                reason=reason, finished=now)
                for c in pod["spec"].get("containers") or []
            ],
        }
        self._patch_pod_status(pod, status)
        with self._cond:
            record.state, record.exit_code, record.reason = "exited", code, reason
            record.finished_at, record.phase = finished, phase
            self._cond.notify_all()
