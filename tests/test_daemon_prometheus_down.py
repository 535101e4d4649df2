"""Daemon-level fault: Prometheus goes down. No admission; the configured fail-safe applies.

Real parts, real wall clock: a REAL Prometheus server scraping a loopback exporter (vLLM
metrics plus kube-state-metrics-like replica gauges) every second, ``PrometheusSignals`` as the
signal source, ``KubernetesCluster`` over the official client against the REAL control plane
(kube-apiserver, controller-manager, scheduler) with two simulated 8-GPU nodes playing the
kubelet (tests/node_sim.py), a SQLite ``JobStore``, the real ``Controller`` and the ``Daemon``
under APScheduler (reconcile and backstop every second), its /metrics served over HTTP.

What the daemon did to the Jobs is read on the server: a watch keeps every version of every Job
of the namespace (``JobHistory``), so a stop is seen in the Job's own ``idlegpu.io/stop-*``
annotations and ``spec.suspend`` even once the daemon has deleted the Job after recording its
end. No request is counted.

Story (short settings: blind after 3 s, give up after 10 s):

1. Prometheus up: both units of a first request are admitted and run.
2. Prometheus stops. From the first failed read nothing is admitted, and the signals count as
   missing since the newest good reading: passes go on, each reporting the signals problem; no
   stop yet.
3. A second request is submitted: it stays QUEUED ("not admitting blind"), nothing is created.
4. Once nothing newer has been read for ``missing_signals_preempt_after``: every running Job is
   suspended (the strict fail-safe, ``missing_signals_stop_whole_units``; by default these
   units, which cannot checkpoint, run on and the second request still waits) (once) with the "live signals ... stopping every job" reason; the metrics count
   live preemptions; the new unit is still QUEUED; no Job was ever created twice.
"""

from __future__ import annotations

import json
import re
import secrets
import threading
import time
import urllib.request
from datetime import UTC, datetime, timedelta
from typing import Any

import kube_harness
import kubernetes
import numpy as np
import pytest
import urllib3
from kubernetes.client.exceptions import ApiException
from prom_server import start_scraping
from test_vllm_signals import TEMPLATES, Exporter, vllm_pages

from idlegpu.scheduler.adapters.kubernetes import (
    ANN_STOP_KIND,
    ANN_STOP_REASON,
    ANN_STOPPED_AT,
    KubernetesCluster,
)
from idlegpu.scheduler.adapters.store import JobStore
from idlegpu.scheduler.adapters.vllm import PrometheusSignals
from idlegpu.scheduler.config import load_config
from idlegpu.scheduler.controller import Controller, PassReport
from idlegpu.scheduler.daemon import Daemon, wait_until
from idlegpu.scheduler.specs import expand_units, validate_request
from idlegpu.scheduler.types import Action, FreeProfile, JobState, PolicySettings

priority_classes = kube_harness.priority_classes  # the Jobs' PriorityClass (fixture)

MAX_AGE_S = 3.0  # > scrape interval (1 s) + a pass's read delay: fresh while Prometheus is up
GIVE_UP_S = 10.0  # every job stops once nothing newer was read for this long
TOTAL_GPUS = 48
# chat: 3 replicas x 4 GPUs, code: 1 replica x 2 GPUs -> 34 idle before our jobs
SERVICES = {"chat": (4, 1, 6), "code": (2, 1, 3)}  # gpus_per_replica, min, max replicas
PAGE = [("chat", 2, 20, 0.5, 3), ("code", 1, 5, 0.4, 1)]  # no queue or KV pressure
SERVICE_GPUS = 3 * 4 + 1 * 2


def settings(url: str):
    return load_config(data={
        "pool": {"total_gpus": TOTAL_GPUS, "headroom_gpus": 0},
        "prometheus": {"url": url, "retries": 0, "timeout_seconds": 5},
        "query_templates": TEMPLATES,
        "services": [
            {"name": n, "gpus_per_replica": g, "min_replicas": lo, "max_replicas": hi}
            for n, (g, lo, hi) in SERVICES.items()
        ],
    })


def request(name: str, shards: list[int]) -> dict:
    return {
        "name": name, "team": "data", "kind": "datagen",
        "image": "registry.example.com/research/vllm-datagen:0.6.3",
        "command": ["python", "generate.py"], "args": ["--shard", "{shard}"],
        "sweep": {"shard": shards}, "gpus": 8, "runtime_estimate": "2h",
        "output": "s3://runs/{team}/{name}/{shard}",
    }


def submit(store: JobStore, data: dict, now: datetime) -> str:
    req = validate_request(data)
    return store.submit(req.name, req.team, req.kind, data, expand_units(req), now)


class RecordingDaemon(Daemon):
    """The real daemon, keeping every pass's report (what it saw, decided and did)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.reports: list[tuple[str, PassReport]] = []
        self._lock = threading.Lock()

    def reconcile(self) -> PassReport:
        report = super().reconcile()
        with self._lock:
            self.reports.append(("reconcile", report))
        return report

    def backstop(self) -> PassReport:
        report = super().backstop()
        with self._lock:
            self.reports.append(("backstop", report))
        return report

    def since(self, when: datetime, kind: str | None = None) -> list[PassReport]:
        """Reports of passes that started after ``when``."""
        with self._lock:
            return [r for k, r in self.reports if r.now > when and kind in (None, k)]


def metric(url: str, name: str, labels: str = "") -> float:
    with urllib.request.urlopen(f"{url}/metrics", timeout=5) as response:
        text = response.read().decode()
    pattern = re.escape(name) + (re.escape("{" + labels + "}") if labels else "") + r" (\S+)"
    found = re.search(rf"^{pattern}$", text, re.MULTILINE)
    return float(found.group(1)) if found else 0.0


class JobHistory:
    """Every version of every Job of ``namespace``, as a watch on the real server delivers
    them (one watch a second, each resuming from the last resourceVersion seen: none missed);
    kept after the Job is deleted."""

    def __init__(self, api_client: Any, namespace: str) -> None:
        self.batch = kubernetes.client.BatchV1Api(api_client)
        self.namespace = namespace
        # (ADDED/MODIFIED/DELETED, or LISTED after a 410, the Job)
        self.events: list[tuple[str, dict]] = []
        self.errors: list[str] = []
        self._lock = threading.Lock()
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, name="job-history", daemon=True)

    def start(self) -> JobHistory:
        self._rv = self.batch.list_namespaced_job(self.namespace).metadata.resource_version
        self._thread.start()
        return self

    def stop(self) -> None:
        self._done.set()
        self._thread.join(timeout=10)
        assert not self._thread.is_alive()

    def _run(self) -> None:
        while not self._done.is_set():
            try:
                for event in kubernetes.watch.Watch().stream(
                        self.batch.list_namespaced_job, self.namespace, deserialize=False,
                        resource_version=self._rv, timeout_seconds=1):
                    job = event["object"]
                    with self._lock:
                        self.events.append((event["type"], job))
                    self._rv = job["metadata"]["resourceVersion"]
            except ApiException as exc:
                if exc.status != 410:
                    self.errors.append(f"watch: {exc}")
                    time.sleep(0.2)
                    continue
                # our resourceVersion left the server's watch window: list again, go on
                listed = self.batch.list_namespaced_job(self.namespace, _preload_content=False)
                body = json.loads(listed.data)
                with self._lock:
                    self.events.extend(("LISTED", job) for job in body["items"])
                self._rv = body["metadata"]["resourceVersion"]
            except (urllib3.exceptions.HTTPError, OSError, ValueError) as exc:
                # kept for the test to see (it fails on any), then the watch resumes
                self.errors.append(f"{type(exc).__name__}: {exc}")
                time.sleep(0.2)

    def versions(self, name: str) -> list[tuple[str, dict]]:
        with self._lock:
            return [(kind, job) for kind, job in self.events if job["metadata"]["name"] == name]

    def names(self) -> list[str]:
        with self._lock:
            return sorted({job["metadata"]["name"] for _, job in self.events})

    def stops(self, name: str) -> list[tuple[str, str, str]]:
        """The distinct stops written on the Job, in order: (kind, reason, stopped-at)."""
        found: list[tuple[str, str, str]] = []
        for _, job in self.versions(name):
            notes = job["metadata"].get("annotations") or {}
            if ANN_STOP_KIND in notes:
                stop = (notes[ANN_STOP_KIND], notes.get(ANN_STOP_REASON, ""),
                        notes.get(ANN_STOPPED_AT, ""))
                if stop not in found:
                    found.append(stop)
        return found

    def suspended(self, name: str) -> bool:
        return any(job["spec"].get("suspend") for _, job in self.versions(name))


@pytest.mark.slow  # long (10-25 s): run by scripts/test.sh and CI
@pytest.mark.parametrize("strict", [True, False], ids=["stop-whole-units", "default"])
def test_prometheus_down_no_admission_then_every_running_job_stops(
        tmp_path, kube_control_plane, kube_namespace, node_sim, priority_classes, strict):
    """``strict`` (``missing_signals_stop_whole_units: true``): step 4 as the module says.
    By default these units, which cannot checkpoint, run on past the give-up time instead,
    and still nothing is admitted."""
    began = time.monotonic()
    labels = {"idlegpu.test/pool": secrets.token_hex(4)}
    # 8 GPUs a node, with the CPUs and memory that go with them (8 and 64Gi per GPU)
    sim = node_sim(2, 8, labels=labels, cpu="96", memory="1Ti")
    admin = kube_control_plane.api_client()
    batch = kubernetes.client.BatchV1Api(admin)
    history = JobHistory(admin, kube_namespace).start()
    exporter = Exporter()
    exporter.pages["/metrics"] = vllm_pages(PAGE)
    store = JobStore(f"sqlite:///{tmp_path / 'jobs.db'}")
    prom = sched = daemon = source = None

    def job(name: str) -> dict:
        return batch.read_namespaced_job(name, kube_namespace).to_dict()

    def created() -> list[str]:
        """Jobs the daemon's passes created, every pass so far."""
        return [n for _, r in list(daemon.reports) for n in r.created + r.recreated]

    try:
        prom = start_scraping([f"127.0.0.1:{exporter.port}"], tmp_path / "prom", interval="1s")
        source = PrometheusSignals(settings(prom.url))
        # Prometheus has scraped the exporter: the signals read back fresh
        assert wait_until(
            lambda: source.read(datetime.now(UTC), job_gpus=0).observed_at is not None,
            timeout=30), source.last_report
        fresh = source.read_report(datetime.now(UTC))
        assert fresh.ok, fresh.problems
        assert fresh.signals.idle_gpus == TOTAL_GPUS - SERVICE_GPUS

        start = datetime.now(UTC)
        profile = FreeProfile(start - timedelta(minutes=10), 300, np.full(6 * 12, 40.0), 0.9,
                              start)  # generous and constant: the forecast never forces a stop
        cluster = KubernetesCluster(kube_control_plane.api_client(), namespace=kube_namespace,
                                    node_selector=labels, retries=2, backoff_s=0.2)
        policy = PolicySettings(max_signal_age_s=MAX_AGE_S,
                                missing_signals_preempt_after_s=GIVE_UP_S, grace_s=60,
                                whole_units_through_outages=not strict)
        controller = Controller(store, cluster, source, lambda now: profile,
                                lambda spec: spec.runtime_estimate_s, policy)
        daemon = RecordingDaemon(controller, reconcile_seconds=1, backstop_seconds=1,
                                 refresh_forecast=lambda now: None,
                                 clock=lambda: datetime.now(UTC))
        url = f"http://127.0.0.1:{daemon.serve(0, host='127.0.0.1')}"
        first = submit(store, request("before", [0, 1]), start)

        # --- 1. Prometheus up: both units admitted, then running on the simulated nodes ---
        sched = daemon.scheduler(blocking=False)
        sched.start()
        assert wait_until(lambda: len(history.names()) == 2, timeout=15), daemon.reports
        rows = [row for row in store.queue() if row.request_id == first]
        assert [store.unit(row.id).attempts for row in rows] == [1, 1]
        names = sorted(cluster.job_name(row.id, 1) for row in rows)
        assert history.names() == names
        # the pods run (the simulated kubelet starts them); the daemon sees their containers
        assert wait_until(lambda: all(
            store.unit(row.id).state is JobState.RUNNING for row in rows), timeout=30)
        assert len(sim.running_pods()) == 2
        assert metric(url, "idlegpu_admissions_total") == 2
        assert 0 <= metric(url, "idlegpu_signal_age_seconds") <= MAX_AGE_S
        assert metric(url, "idlegpu_pass_errors_total") == 0
        assert all(not history.stops(name) and not history.suspended(name) for name in names)

        # --- 2. Prometheus stops: missing since the newest good reading -----------------
        prom.stop()
        stopped = datetime.now(UTC)
        # passes go on (no crash), each reporting the problem of the source
        assert wait_until(lambda: len(daemon.since(stopped, "reconcile")) >= 1
                          and len(daemon.since(stopped, "backstop")) >= 1, timeout=10)
        after = daemon.since(stopped)
        for report in after:
            assert any(e.startswith("signals missing: ") and "is unreachable" in e
                       and prom.url in e for e in report.errors), report.errors
        assert all(r.signals.observed_at is None for r in after)  # blind at once
        last_good = after[0].signals.missing_since
        assert last_good is not None and last_good <= stopped  # missing since the last good
        assert {r.signals.missing_since for r in after} == {last_good}  # reading, for all
        give_up_at = last_good + timedelta(seconds=GIVE_UP_S)
        blind_at = last_good + timedelta(seconds=MAX_AGE_S)
        assert metric(url, "idlegpu_pass_errors_total") >= len(after)

        # --- 3. blind: a new request is not admitted ------------------------------------
        # a reconcile pass started after blind_at has run: none that could see the signals
        # fresh is still under way (a pass kind never overlaps itself)
        assert wait_until(lambda: daemon.since(blind_at, "reconcile"), timeout=MAX_AGE_S + 5)
        assert sorted(created()) == names and history.names() == names
        submitted = datetime.now(UTC)
        second = submit(store, request("during", [0]), submitted)
        (new,) = [row.id for row in store.queue() if row.request_id == second]
        # two reconcile passes that saw the new unit waiting
        assert wait_until(lambda: len(daemon.since(submitted, "reconcile")) >= 2, timeout=10)
        checked = datetime.now(UTC)
        # a moment clearly before the give-up time: nothing admitted, nothing stopped yet
        assert checked < give_up_at - timedelta(seconds=1), (
            f"too slow to check before the give-up: {checked} vs {give_up_at}")
        assert sorted(created()) == names and history.names() == names  # nothing created
        assert store.unit(new).state is JobState.QUEUED
        assert all(not history.stops(name) for name in names)  # nothing stopped yet
        assert all(job(name)["spec"]["suspend"] is False for name in names)
        assert all(store.unit(row.id).state is JobState.RUNNING for row in rows)
        assert metric(url, "idlegpu_preemptions_total", 'kind="live"') == 0
        waiting = [r for r in daemon.since(submitted, "reconcile") if r.now <= checked]
        for report in waiting:
            (deferred,) = [d for d in report.plan.decisions if d.job_id == new]
            assert deferred.action is Action.DEFER
            assert "not admitting blind" in deferred.reason
            assert not report.created
        assert metric(url, "idlegpu_pass_errors_total") > 0
        assert 0 < metric(url, "idlegpu_signal_age_seconds") < GIVE_UP_S

        if not strict:
            # --- 4, by default: past the give-up time these units run on, still blind ---
            later = give_up_at + timedelta(seconds=3)
            assert wait_until(lambda: len([r for r in daemon.since(later, "reconcile")]) >= 2
                              and len(daemon.since(later, "backstop")) >= 2,
                              timeout=GIVE_UP_S + 10)
            assert all(not history.stops(name) for name in names)
            assert all(job(name)["spec"]["suspend"] is False for name in names)
            assert all(store.unit(row.id).state is JobState.RUNNING for row in rows)
            assert len(sim.running_pods()) == 2
            assert store.unit(new).state is JobState.QUEUED
            assert sorted(created()) == names and history.names() == names
            assert metric(url, "idlegpu_preemptions_total", 'kind="live"') == 0
            return

        # --- 4. missing for longer than missing_signals_preempt_after: every job stops ---
        assert wait_until(lambda: all(history.stops(name) for name in names),
                          timeout=GIVE_UP_S + 10), "no Job was stopped"
        seen = datetime.now(UTC)
        assert seen > give_up_at
        # the next reconcile pass sees the Jobs suspended and puts their units back in the queue
        assert wait_until(lambda: all(
            store.unit(row.id).state is JobState.QUEUED for row in rows), timeout=10)
        # let the passes under way be recorded and a few more run: a second stop would show
        settled = datetime.now(UTC)
        assert wait_until(lambda: len(daemon.since(settled, "reconcile")) >= 2
                          and len(daemon.since(settled, "backstop")) >= 2, timeout=10)
        for name in names:
            told = [f"{k} pass at {r.now:%H:%M:%S.%f}" for k, r in list(daemon.reports)
                    if name in r.stopped]
            assert len(told) == 1, (  # told once, not once per pass
                f"{name} was told to stop {len(told)} times: " + "; ".join(told))
            # on the Job itself: one stop written, never rewritten, with its suspend
            (stop,) = history.stops(name)
            kind, reason, stopped_at = stop
            assert kind == "preempt"
            assert "live signals missing for" in reason
            assert "stopping every job" in reason
            assert datetime.fromisoformat(stopped_at) > give_up_at
            assert history.suspended(name)
            # its pod got SIGTERM and exited: the GPUs came back
            (pod,) = [p for p in sim.pods() if p.name.startswith(f"{name}-")]
            assert pod.exit_code == 143 and pod.deletion_seen_at is not None
        # the stops came from passes that saw the signals missing for longer than the limit,
        # none before
        stops = [r for r in daemon.since(stopped) if r.stopped]
        assert sorted(n for r in stops for n in r.stopped) == names
        assert all(r.now > give_up_at for r in stops)
        for report in stops:
            for d in report.plan.of(Action.PREEMPT):
                assert not d.planned and d.job_id in {row.id for row in rows}
        assert all(not r.stopped and not r.plan.of(Action.PREEMPT)
                   for r in daemon.since(stopped) if r.now <= give_up_at)
        # on the server each Job is suspended, or already deleted once the store recorded
        # its end: then the last version before its deletion was the suspended, stopped one
        for name in names:
            versions = history.versions(name)
            if versions[-1][0] == "DELETED":
                last = versions[-1][1]
                assert last["spec"]["suspend"] is True
                assert "live signals" in last["metadata"]["annotations"][ANN_STOP_REASON]
            else:
                now_on_server = job(name)
                assert now_on_server["spec"]["suspend"] is True
                assert "live signals" in now_on_server["metadata"]["annotations"][
                    ANN_STOP_REASON]
        for row in rows:
            unit = store.unit(row.id)
            assert (unit.state, unit.preemptions, unit.attempts) == (JobState.QUEUED, 1, 1)
        assert metric(url, "idlegpu_preemptions_total", 'kind="live"') == len(names)
        assert metric(url, "idlegpu_preemptions_total", 'kind="planned"') == 0
        # still blind: nothing admitted, nothing created twice
        assert store.unit(new).state is JobState.QUEUED
        assert sorted(created()) == names and history.names() == names
        assert len(sim.pods()) == len(names)  # one pod a Job, never a second
        assert metric(url, "idlegpu_admissions_total") == 2
        assert metric(url, "idlegpu_signal_age_seconds") > GIVE_UP_S
        with urllib.request.urlopen(f"{url}/healthz", timeout=5) as response:
            assert response.status == 200  # the passes never stopped
    finally:
        if sched is not None:
            sched.shutdown(wait=True)  # the pass under way finishes first
        if daemon is not None:
            daemon.close()
        if prom is not None:
            prom.stop()
        if source is not None:
            source.close()
        exporter.close()
        history.stop()
        store.close()
        admin.close()
    assert sched.get_jobs() == []  # shut down cleanly
    assert history.errors == []
    assert time.monotonic() - began < 60
