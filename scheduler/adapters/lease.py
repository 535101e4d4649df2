"""Leader election on a ``coordination.k8s.io/v1`` Lease, for daemon replicas: one leads.

    elector = LeaderElector.from_config(namespace="idlegpu", name="idlegpu",
                                        identity="idlegpu-7c9f-x2", kubeconfig=None)
    elector.start()                  # a background thread: acquire, then renew
    if elector.is_leader(): ...      # act only while this is true
    elector.stop(release=True)       # on SIGTERM: hand the lease over at once

The semantics are client-go's ``tools/leaderelection`` (the record is the Lease's spec):

* ``holderIdentity``, ``leaseDurationSeconds``, ``acquireTime``, ``renewTime`` and
  ``leaseTransitions``. A new holder sets ``acquireTime`` and adds one to ``leaseTransitions``;
  a renewal keeps both and moves ``renewTime``.
* A candidate takes over only once the record has not changed for the record's
  ``leaseDurationSeconds``, timed on the candidate's OWN monotonic clock from when it last saw
  the record change. The servers' and the holder's timestamps are never compared with this
  clock, so clock skew between machines does not matter (only a difference in clock rate
  does, which ``renew_deadline < lease_duration`` absorbs).
* Every write carries the ``resourceVersion`` it read (optimistic concurrency): of candidates
  racing for an expired lease, one update lands and the others get 409 Conflict, which means
  someone else won.
* The leader renews every ``retry_period``; when no renewal has succeeded for
  ``renew_deadline`` it steps down (``is_leader()`` turns false at that moment even if the
  renewing thread is stuck), before any candidate may take over (``lease_duration``).
* Release (shutdown): the holder clears ``holderIdentity`` and sets ``leaseDurationSeconds``
  to 1, so a candidate acquires at its next try instead of waiting out the lease.

This module and ``idlegpu.scheduler.adapters.kubernetes`` are the only ones importing
``kubernetes``.
"""

from __future__ import annotations

import json
import logging
import os
import random
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import kubernetes
import urllib3
from kubernetes.client.exceptions import ApiException

from idlegpu.scheduler.adapters.kubernetes import load_client_configuration

log = logging.getLogger(__name__)

JITTER = 1.2  # acquire retries wait retry_period * (1 + random() * JITTER), as client-go's


def default_identity() -> str:
    """``$POD_NAME`` (the Downward API) or ``<hostname>-<pid>``: unique per replica."""
    return os.environ.get("POD_NAME") or f"{socket.gethostname()}-{os.getpid()}"


@dataclass(frozen=True)
class LeaseRecord:
    """The election state a Lease's spec holds."""

    holder: str | None
    duration_s: int | None
    acquire_time: str | None
    renew_time: str | None
    transitions: int

    @classmethod
    def from_spec(cls, spec: dict[str, Any] | None) -> LeaseRecord:
        spec = spec or {}
        return cls(spec.get("holderIdentity") or None, spec.get("leaseDurationSeconds"),
                   spec.get("acquireTime"), spec.get("renewTime"),
                   int(spec.get("leaseTransitions") or 0))

    def spec(self) -> dict[str, Any]:
        return {"holderIdentity": self.holder, "leaseDurationSeconds": self.duration_s,
                "acquireTime": self.acquire_time, "renewTime": self.renew_time,
                "leaseTransitions": self.transitions}


def _body(response: Any) -> dict[str, Any]:
    """The JSON of a raw (``_preload_content=False``) response: the Lease as the server wrote
    it, timestamps as their exact strings."""
    return json.loads(response.data)


def _micro_time(when: datetime) -> str:
    """A ``MicroTime`` as the API server writes it: RFC 3339, microseconds, UTC."""
    return when.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class LeaderElector:
    def __init__(
        self,
        api_client: Any,
        *,
        namespace: str,
        name: str,
        identity: str | None = None,
        lease_duration_s: float = 15.0,
        renew_deadline_s: float = 10.0,
        retry_period_s: float = 2.0,
        on_started_leading: Callable[[], None] | None = None,
        on_stopped_leading: Callable[[], None] | None = None,
        monotonic: Callable[[], float] = time.monotonic,
        wall: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        if not lease_duration_s > renew_deadline_s:
            raise ValueError("lease_duration_s must be greater than renew_deadline_s")
        if not renew_deadline_s > JITTER * retry_period_s:
            raise ValueError(f"renew_deadline_s must be greater than {JITTER} x retry_period_s")
        if retry_period_s <= 0:
            raise ValueError("retry_period_s must be positive")
        self.api = kubernetes.client.CoordinationV1Api(api_client)
        self.namespace = namespace
        self.name = name
        self.identity = identity or default_identity()
        self.lease_duration_s = lease_duration_s
        self.renew_deadline_s = renew_deadline_s
        self.retry_period_s = retry_period_s
        self.on_started_leading = on_started_leading
        self.on_stopped_leading = on_stopped_leading
        self._monotonic = monotonic
        self._wall = wall
        # what this candidate last saw, and when (on its own monotonic clock) it changed
        self.observed: LeaseRecord | None = None
        self.observed_at: float | None = None
        self._resource_version: str | None = None
        self._renewed_at: float | None = None  # last successful acquire/renew, if leading
        self._leading = False
        self._io = threading.Lock()  # one attempt (or the release) at a time
        self._state = threading.Lock()  # never held across a request
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.last_attempt_at: float | None = None

    @classmethod
    def from_config(cls, kubeconfig: str | None = None, context: str | None = None,
                    in_cluster: bool = False, **kw: Any) -> LeaderElector:
        """Build from a kubeconfig file and context, or the pod's service account (as
        ``KubernetesCluster.from_config``)."""
        return cls(kubernetes.client.ApiClient(
            load_client_configuration(kubeconfig, context, in_cluster)), **kw)

    # ------------------------------------------------------------------ state
    @property
    def holder(self) -> str | None:
        """The holder in the last record seen (None: none seen, or released)."""
        return self.observed.holder if self.observed else None

    def is_leader(self) -> bool:
        """True while this candidate holds the lease and renewed it within the renew
        deadline (checked on every call: a stuck renewal makes it false in time)."""
        with self._state:  # never waits for a request under way
            renewed = self._renewed_at if self._leading else None
        return renewed is not None and self._monotonic() - renewed < self.renew_deadline_s

    def describe(self) -> str:
        return f"{self.namespace}/{self.name}"

    # ------------------------------------------------------------------ one step
    def try_acquire_or_renew(self) -> bool:
        """One attempt: read the Lease (create it if missing), then take or renew it when
        allowed; True when this candidate holds it afterwards."""
        with self._io:
            # the lease is ours from (at most) the moment the write was sent: timing the
            # renew deadline from before the request keeps the leader on the safe side
            sent = self.last_attempt_at = self._monotonic()
            ok = self._try()
            if ok:
                with self._state:
                    self._renewed_at = sent
            return ok

    def _timeout(self) -> float:
        return max(0.5, min(self.retry_period_s, self.renew_deadline_s / 2))

    def _try(self) -> bool:
        stamp = _micro_time(self._wall())
        try:
            lease = _body(self.api.read_namespaced_lease(
                self.name, self.namespace, _request_timeout=self._timeout(),
                _preload_content=False))
        except ApiException as exc:
            if exc.status != 404:
                log.warning("reading lease %s failed: %s %s", self.describe(), exc.status,
                            exc.reason)
                return False
            return self._create(stamp)
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            log.warning("reading lease %s failed: %s", self.describe(), exc)
            return False
        now = self._monotonic()  # when we saw it (after the read), on our own clock
        record = LeaseRecord.from_spec(lease.get("spec"))
        if record != self.observed:
            self.observed, self.observed_at = record, now
        self._resource_version = lease["metadata"]["resourceVersion"]
        mine = record.holder == self.identity
        duration = record.duration_s if record.duration_s is not None else \
            self.lease_duration_s
        assert self.observed_at is not None  # set with self.observed, just above at the latest
        if record.holder and not mine and now < self.observed_at + duration:
            return False  # held by another, and not yet expired on OUR clock
        if mine:
            new = LeaseRecord(self.identity, int(self.lease_duration_s), record.acquire_time,
                              stamp, record.transitions)
        else:
            new = LeaseRecord(self.identity, int(self.lease_duration_s), stamp, stamp,
                              record.transitions + 1)
        if not self._replace(new):
            return False
        if not mine:
            log.info("%s acquired lease %s (transition %d, from %s)", self.identity,
                     self.describe(), new.transitions, record.holder or "nobody")
        return True

    def _create(self, stamp: str) -> bool:
        record = LeaseRecord(self.identity, int(self.lease_duration_s), stamp, stamp, 0)
        body = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                "metadata": {"name": self.name, "namespace": self.namespace},
                "spec": record.spec()}
        try:
            created = _body(self.api.create_namespaced_lease(
                self.namespace,
                body,  # type: ignore[arg-type]  # validate_call takes the plain dict too
                _request_timeout=self._timeout(), _preload_content=False))
        except ApiException as exc:
            if exc.status != 409:  # 409: another candidate created it first
                log.warning("creating lease %s failed: %s %s", self.describe(), exc.status,
                            exc.reason)
            return False
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            log.warning("creating lease %s failed: %s", self.describe(), exc)
            return False
        self._seen_written(record, created)
        log.info("%s acquired lease %s (created)", self.identity, self.describe())
        return True

    def _replace(self, record: LeaseRecord) -> bool:
        """Write ``record`` over the version read; False on 409 (someone else wrote first)."""
        body = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                "metadata": {"name": self.name, "namespace": self.namespace,
                             "resourceVersion": self._resource_version},
                "spec": record.spec()}
        try:
            written = _body(self.api.replace_namespaced_lease(
                self.name, self.namespace,
                body,  # type: ignore[arg-type]  # validate_call takes the plain dict too
                _request_timeout=self._timeout(), _preload_content=False))
        except ApiException as exc:
            if exc.status == 409:
                log.info("lease %s: another candidate wrote first (409)", self.describe())
            else:
                log.warning("updating lease %s failed: %s %s", self.describe(), exc.status,
                            exc.reason)
            return False
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            log.warning("updating lease %s failed: %s", self.describe(), exc)
            return False
        self._seen_written(record, written)
        return True

    def _seen_written(self, record: LeaseRecord, lease: dict[str, Any]) -> None:
        self.observed = LeaseRecord.from_spec(lease.get("spec"))
        self.observed_at = self._monotonic()
        self._resource_version = lease["metadata"]["resourceVersion"]

    def release(self) -> bool:
        """Give the lease up if this candidate holds it: holder cleared, duration 1 s, so
        another takes over at its next try. True when released (or not held)."""
        with self._io:
            was = self._leading
            self._set_leading(False)
            if self.observed is None or self.observed.holder != self.identity:
                return True
            stamp = _micro_time(self._wall())
            record = LeaseRecord(None, 1, stamp, stamp, self.observed.transitions)
            ok = self._replace(record)
            if ok:
                log.info("%s released lease %s", self.identity, self.describe())
            elif was:
                log.warning("%s could not release lease %s; it expires by itself",
                            self.identity, self.describe())
            return ok

    # ------------------------------------------------------------------ the loop
    def _set_leading(self, leading: bool) -> None:
        with self._state:
            changed = leading != self._leading
            self._leading = leading
            if not leading:
                self._renewed_at = None
        if changed:
            callback = self.on_started_leading if leading else self.on_stopped_leading
            if callback is not None:
                try:
                    callback()
                except Exception:  # a callback never kills the election loop
                    log.exception("leader election callback failed")

    def run_once(self) -> bool:
        """One step of the loop: acquire or renew, step down past the renew deadline;
        returns whether this candidate leads now."""
        ok = self.try_acquire_or_renew()
        if ok:
            self._set_leading(True)
        elif self._leading and not self.is_leader():
            log.warning("%s could not renew lease %s within %gs: stepping down",
                        self.identity, self.describe(), self.renew_deadline_s)
            self._set_leading(False)
        return self.is_leader()

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                leading = self.run_once()
            except Exception:  # never let the thread die silently
                log.exception("leader election step failed")
                leading = self.is_leader()
            # the leader renews every retry period; candidates retry with jitter, so that
            # racing candidates spread out
            wait = self.retry_period_s if leading else \
                self.retry_period_s * (1 + random.random() * JITTER)
            self._stop.wait(wait)

    def start(self) -> LeaderElector:
        if self._thread is None:
            self._stop.clear()
            self._thread = threading.Thread(target=self._loop, daemon=True,
                                            name=f"lease-{self.name}")
            self._thread.start()
        return self

    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def stop(self, *, release: bool = True) -> None:
        """Stop the loop; with ``release``, hand the lease over at once."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.renew_deadline_s + 5)
            self._thread = None
        if release:
            self.release()
        else:
            self._set_leading(False)
