"""``KueueChecks``: the ``AdmissionCheckSource`` port over Kueue's API (``kueue.x-k8s.io/v1beta1``).

    checks = KueueChecks.from_config(checks=["idlegpu-forecast"], node_selector={...})
    reading = checks.read()                  # our AdmissionChecks and their Workloads
    checks.set_active("idlegpu-forecast", (True, "Active", "..."))
    checks.write(update)                     # one Workload's entry of our check

idlegpu serves the AdmissionChecks named in ``cluster.kueue.admission_checks`` whose
``spec.controllerName`` is ``idlegpu.io/forecast`` (one naming another controller is never
served: it is somebody else's). ``read`` lists those AdmissionChecks and every Workload of the
cluster (500 a page) and keeps the ones that carry one of them in ``status.admissionChecks``:
Kueue copies a ClusterQueue's checks onto its Workloads, so a Workload of a ClusterQueue without
our check is never read as a unit and never written.

Writes are server-side applies under the field manager ``idlegpu.io/forecast`` of our fields
only: one entry of a Workload's ``status.admissionChecks`` (a list map keyed by the check's
name, so the entries of other checks stay with their controllers) and the ``Active`` condition
of an AdmissionCheck. They are forced: Kueue writes each entry's first ``Pending`` itself, and
the entry is ours to decide from then on. A ``Ready`` entry carries ``podSetUpdates``: the
pool's nodeSelector and tolerations, and the window's end as the pods' ``idlegpu.io/stop-by``
annotation, which Kueue puts on the pods when it admits the Workload.

With ``watch`` (the daemon) the Workloads come from a watch-fed copy
(``mirror.WatchedList``); the AdmissionChecks, a handful, are listed every pass, which is also
the pass's live call: an API server gone stops admission at once, copy or not.

The grants (deploy/optional/kueue-rbac.yaml): ``workloads`` of ``kueue.x-k8s.io``: get, list,
watch; ``admissionchecks``: get, list; ``workloads/status`` and ``admissionchecks/status``:
patch. Nothing else of Kueue's.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

import kubernetes

from idlegpu.scheduler.adapters.kubernetes.calls import ApiCaller, _server_time
from idlegpu.scheduler.adapters.kubernetes.credentials import load_client_configuration
from idlegpu.scheduler.adapters.kubernetes.mirror import WatchedList
from idlegpu.scheduler.adapters.kubernetes.names import _iso
from idlegpu.scheduler.admission_checks import (
    CHECK_CONTROLLER,
    READY,
    STOP_BY_ANNOTATION,
    CheckedWorkload,
    CheckUpdate,
    KueueReading,
    WorkloadError,
    active_apply,
    checked_workload,
    entry_apply,
)

log = logging.getLogger("idlegpu.scheduler.adapters.kubernetes.kueue")

GROUP, VERSION = "kueue.x-k8s.io", "v1beta1"
_APPLY_PATCH = "application/apply-patch+yaml"



class KueueChecks(ApiCaller):
    """The AdmissionChecks idlegpu serves and their Workloads (module docstring)."""

    grants = ("the ClusterRole of deploy/optional/kueue-rbac.yaml (workloads.kueue.x-k8s.io: "
              "get, list, watch; admissionchecks.kueue.x-k8s.io: get, list; workloads/status, "
              "admissionchecks/status: patch)")

    def __init__(
        self,
        api_client: kubernetes.client.ApiClient,
        *,
        checks: Sequence[str],
        node_selector: dict[str, str] | None = None,
        tolerations: list[dict[str, Any]] | None = None,
        retries: int = 3,
        backoff_s: float = 0.5,
        max_backoff_s: float = 30.0,
        request_timeout_s: float = 30.0,
        page: int = 500,
        max_objects: int = 50_000,
        watch: bool = False,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        """``max_objects``: the most Workloads (or AdmissionChecks) one listing reads; beyond
        it the listing fails (reported, nothing of Kueue admitted that pass) rather than
        hold the daemon's memory hostage to another team's flood of objects. ``watch``: keep
        the Workloads in a watch-fed copy (``mirror.WatchedList``, started by the first
        ``read``) rather than list them every pass; a pass without a copy to trust lists."""
        if not checks:
            raise ValueError("name at least one AdmissionCheck to serve")
        self.checks = tuple(dict.fromkeys(checks))
        self.api = kubernetes.client.CustomObjectsApi(api_client)
        self.node_selector = dict(node_selector or {})
        self.tolerations = [dict(t) for t in (tolerations or [])]
        self.retries = int(retries)
        self.backoff_s = backoff_s
        self.max_backoff_s = max_backoff_s
        self.request_timeout_s = request_timeout_s
        self.page = int(page)
        self.max_objects = int(max_objects)
        self._sleep = sleep
        self.namespace = None
        self._warned: set[str] = set()
        self.workloads = WatchedList(
            self, self._lister("workloads"), f"workloads.{GROUP}", page=self.page,
            most=self.max_objects, too_many=self._too_many("workloads")) if watch else None

    def close(self) -> None:
        """Stop the Workloads' watch (if any)."""
        if self.workloads is not None:
            self.workloads.stop()

    @classmethod
    def from_config(cls, kubeconfig: str | None = None, context: str | None = None,
                    in_cluster: bool = False, **kw: Any) -> KueueChecks:
        return cls(kubernetes.client.ApiClient(
            load_client_configuration(kubeconfig, context, in_cluster)), **kw)

    # --- reading -------------------------------------------------------------------------

    def read(self) -> KueueReading:
        """Our AdmissionChecks' ``Active`` conditions and the Workloads that carry them."""
        served, active, missing = self._served_checks()
        workloads: list[CheckedWorkload] = []
        refused: list[tuple[str, str]] = []
        if served:
            for obj in self._workload_objects():
                try:
                    w = checked_workload(obj, served)
                except WorkloadError as exc:
                    meta = obj.get("metadata") if isinstance(obj, dict) else None
                    meta = meta if isinstance(meta, dict) else {}
                    refused.append((f"kueue/{meta.get('namespace')}/{meta.get('name')}"[:300],
                                    str(exc)[:500]))
                    continue
                if w is not None:
                    workloads.append(w)
        return KueueReading(active=active, workloads=workloads, refused=refused,
                            missing=missing, served=served)

    def _served_checks(self) -> tuple[list[str], dict[str, tuple[bool, str, str]], list[str]]:
        served: list[str] = []
        active: dict[str, tuple[bool, str, str]] = {}
        missing: list[str] = []
        by_name = {(o.get("metadata") or {}).get("name"): o
                   for o in self._list("admissionchecks")}
        for name in self.checks:
            obj = by_name.get(name)
            if obj is None:
                missing.append(f"{name}: no such AdmissionCheck")
                continue
            controller = (obj.get("spec") or {}).get("controllerName")
            if controller != CHECK_CONTROLLER:
                missing.append(f"{name}: its controllerName is {str(controller)[:100]!r}, not "
                               f"{CHECK_CONTROLLER!r}: another controller's, left alone")
                continue
            served.append(name)
            for cond in (obj.get("status") or {}).get("conditions") or ():
                if isinstance(cond, dict) and cond.get("type") == "Active":
                    active[name] = (cond.get("status") == "True", str(cond.get("reason") or ""),
                                    str(cond.get("message") or ""))
        for problem in missing:
            if problem not in self._warned:
                self._warned.add(problem)
                log.warning("Kueue admission check %s", problem)
        return served, active, missing

    def _workload_objects(self) -> list[dict[str, Any]]:
        """The Workloads: the watch's copy where there is one to trust, else a listing."""
        if self.workloads is not None:
            self.workloads.start()
            copy = self.workloads.items()
            if copy is not None:
                return copy
        return self._list("workloads")

    def _lister(self, plural: str) -> Callable[..., Any]:
        def list_them(**kw: Any) -> Any:
            return self.api.list_cluster_custom_object(GROUP, VERSION, plural, **kw)
        return list_them

    def _too_many(self, plural: str) -> str:
        return (f"more than {self.max_objects:,} {plural}.{GROUP} in the cluster: not read "
                "(raise KueueChecks' max_objects if that many are expected)")

    def _list(self, plural: str) -> list[dict[str, Any]]:
        return self._list_all(self._lister(plural), f"{plural}.{GROUP}", page=self.page,
                              most=self.max_objects, too_many=self._too_many(plural))

    # --- writing -------------------------------------------------------------------------

    def set_active(self, check: str, active: tuple[bool, str, str]) -> None:
        """Write the AdmissionCheck's ``Active`` condition (the caller writes only changes)."""
        body = active_apply(check, active, _iso(_server_time(self._server_date)))
        self._call("patch", lambda **kw: self.api.patch_cluster_custom_object_status(
            GROUP, VERSION, "admissionchecks", check, body,
            field_manager=CHECK_CONTROLLER, force=True, _content_type=_APPLY_PATCH, **kw),
            f"admissionchecks.{GROUP}/status")

    def write(self, update: CheckUpdate) -> None:
        """Write one Workload's entry of our check (server-side apply, forced: module doc)."""
        since = update.since or _iso(_server_time(self._server_date))
        body = entry_apply(update, since, self.pod_set_updates(update))
        self._call("patch", lambda **kw: self.api.patch_namespaced_custom_object_status(
            GROUP, VERSION, update.namespace, "workloads", update.name, body,
            field_manager=CHECK_CONTROLLER, force=True, _content_type=_APPLY_PATCH, **kw),
            f"workloads.{GROUP}/status")

    def pod_set_updates(self, update: CheckUpdate) -> list[dict[str, Any]]:
        """What Kueue puts on a ``Ready`` Workload's pods, one entry per pod set."""
        if update.state != READY:
            return []
        extra: dict[str, Any] = {}
        if self.node_selector:
            extra["nodeSelector"] = dict(self.node_selector)
        if self.tolerations:
            extra["tolerations"] = [dict(t) for t in self.tolerations]
        if update.stop_by is not None:
            extra["annotations"] = {STOP_BY_ANNOTATION: _iso(update.stop_by)}
        if not extra:
            return []
        return [{"name": name, **extra} for name in update.pod_sets]

