"""Every change of every Job in a namespace, seen through a real watch, for tests that must fail
on a condition a Job had at any moment (``FailureTarget`` lasts from the Job controller's
judgement to ``Failed``, and a release pass may delete the Job before a test reads it again).

    with JobWatcher(api_client, namespace) as jobs:
        ... stop Jobs, wait for their release ...
    jobs.assert_never(("FailureTarget", "Failed"), names)   # names: the Jobs we stopped

The watch starts from the namespace's list (its resourceVersion), restarts from a fresh list on
410 Gone, and records (resourceVersion, Job name, its True conditions) for every event.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Self

import kubernetes
from kubernetes.client.exceptions import ApiException


@dataclass(frozen=True)
class JobEvent:
    kind: str  # ADDED, MODIFIED, DELETED
    name: str
    resource_version: str
    conditions: dict[str, str]  # type -> "reason: message" of each True condition
    suspend: bool


class JobWatcher:
    def __init__(self, api_client: Any, namespace: str) -> None:
        self.batch = kubernetes.client.BatchV1Api(api_client)
        self.namespace = namespace
        self.events: list[JobEvent] = []
        self.errors: list[str] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, name="job-watch", daemon=True)

    def __enter__(self) -> Self:
        self._thread.start()
        if not self._ready.wait(15):
            raise TimeoutError(f"the Job watch did not start: {self.errors[-3:]}")
        return self

    def __exit__(self, *exc: object) -> None:
        time.sleep(1.5)  # the watch's last events (the Job controller batches its syncs by 1 s)
        self._stop.set()
        self._thread.join(timeout=10)

    def _record(self, kind: str, job: Any) -> None:
        status = job.status
        conditions = {c.type: f"{c.reason}: {c.message}" for c in (status and status.conditions)
                      or [] if c.status == "True"}
        event = JobEvent(kind, job.metadata.name, job.metadata.resource_version, conditions,
                         bool(job.spec and job.spec.suspend))
        with self._lock:
            self.events.append(event)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                listed = self.batch.list_namespaced_job(self.namespace)
                for job in listed.items:
                    self._record("LISTED", job)
                version = listed.metadata.resource_version
                self._ready.set()
                watch = kubernetes.watch.Watch()
                for event in watch.stream(self.batch.list_namespaced_job, self.namespace,
                                          resource_version=version, timeout_seconds=5,
                                          allow_watch_bookmarks=False):
                    self._record(event["type"], event["object"])
                    if self._stop.is_set():
                        watch.stop()
                        break
            except ApiException as exc:
                if exc.status != 410:
                    self.errors.append(f"HTTP {exc.status}: {exc.reason}")
                    time.sleep(0.2)
            except Exception as exc:  # noqa: BLE001 - a broken stream: watch again
                self.errors.append(repr(exc))
                time.sleep(0.2)

    def of(self, name: str) -> list[JobEvent]:
        with self._lock:
            return [e for e in self.events if e.name == name]

    def assert_never(self, kinds: Iterable[str], names: Iterable[str]) -> None:
        """No event of any of ``names`` ever carried one of the condition types ``kinds``; and
        each was seen at all (a watch that saw nothing proves nothing)."""
        kinds = tuple(kinds)
        with self._lock:
            events = list(self.events)
        for name in names:
            mine = [e for e in events if e.name == name]
            assert mine, f"the watch never saw Job {name} (errors: {self.errors[-3:]})"
            bad = [(e.resource_version, kind, e.conditions[kind]) for e in mine
                   for kind in kinds if kind in e.conditions]
            assert not bad, f"Job {name} had {bad} (its events: {mine})"
