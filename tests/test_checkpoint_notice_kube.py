"""Cooperative checkpoints end to end on the REAL control plane (kube-apiserver 1.36 and its
controllers, ``kube_control_plane``), the REAL job API (uvicorn, real Kubernetes TokenReview),
the real daemon's controller and adapter, and the real workload helper: the node simulator
plays the kubelet, projecting the pods' notice annotation into their notice file and their
pod-bound token (TokenRequest bound to the pod, audience ``idlegpu``), and runs each pod's
workload as a local process (``examples/workloads/train_loop.py``, or a workload that never
answers).

The daemon runs replayed (``speed`` replayed seconds per real one, as ``idlegpu run --history
--speed``): a notice of 300 replayed seconds lasts 300 / speed real seconds, which the silent
unit's stop shows."""

from __future__ import annotations

import sys
import time
from datetime import datetime, timedelta
from pathlib import Path

import numpy as np
import pytest
from api_server import ApiServer, Client, api_settings
from kube_harness import REPLAY_START, Harness, priority_classes, request, submit  # noqa: F401

from idlegpu.scheduler.adapters.store import JobStore
from idlegpu.scheduler.server import create_server
from idlegpu.scheduler.types import EventKind, JobState

pytestmark = pytest.mark.slow  # about a minute: run by scripts/test.sh and CI

ROOT = Path(__file__).resolve().parents[1]
TRAIN_LOOP = ROOT / "examples" / "workloads" / "train_loop.py"
SPEED = 10.0
NOTICE_S = 300.0  # replayed: 30 real seconds
SILENT = "import signal, sys, time\nsignal.signal(signal.SIGTERM, lambda *a: sys.exit(143))\n" \
         "while True: time.sleep(0.2)\n"


def wait(predicate, timeout: float, what: str, every: float = 0.2):
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(every)


def test_a_planned_stop_with_notice_loses_nothing_and_a_silent_unit_stops_at_the_deadline(
        kube_control_plane, kube_namespace, node_sim, priority_classes, tmp_path):  # noqa: F811
    ns = kube_namespace
    store = JobStore(f"sqlite:///{tmp_path / 'jobs.db'}")
    settings = api_settings(token_review={
        "enabled": True, "kubeconfig": kube_control_plane.kubeconfig, "cache_seconds": 0,
        "audiences": ["idlegpu"]})
    settings = settings.model_copy(update={
        "cluster": settings.cluster.model_copy(update={"namespace": ns})})
    # the API stamps reports with the daemon's (replayed) clock, as one process's clock
    origin = time.monotonic()

    def replayed() -> datetime:
        return REPLAY_START + timedelta(seconds=(time.monotonic() - origin) * SPEED)

    api = ApiServer(create_server(settings, store, clock=replayed)).start()
    checkpoints = tmp_path / "checkpoints"

    def workload(pod):
        env = pod.values.get(pod.containers[0], {})
        unit = env.get("IDLEGPU_UNIT", "")
        if unit.startswith("silent"):
            return [sys.executable, "-c", SILENT]
        return [sys.executable, str(TRAIN_LOOP), "--steps", "100000", "--step-seconds", "0.1",
                "--checkpoint-dir", str(checkpoints / unit), "--progress-every", "1"]

    labels = {"idlegpu.test/pool": "notice"}
    sim = node_sim(1, 4, labels=labels, volume_root=str(tmp_path / "kubelet"),
                   workload=workload)
    daemon = Harness(kube_control_plane, ns, store, labels, speed=SPEED,
                     cluster_options={"job_api_url": api.url, "token_audience": "idlegpu"},
                     checkpoint_notice_s=NOTICE_S)
    daemon._origin = origin  # one clock for the daemon and the API
    try:
        answering = submit(store, request("trainer", gpus=2, checkpoint={
            "interval": "1h", "resume_args": ["--resume"], "notice": True}))
        silent = submit(store, request("silent", gpus=2, checkpoint={
            "interval": "1h", "notice": True}))
        daemon.until(lambda r: all(store.unit(u).state is JobState.RUNNING
                                   for u in (answering, silent)), what="both units running")
        # the helper reaches the API with its pod-bound token: its progress is recorded
        wait(lambda: (store.workload_reports(answering) or [{}])[0].get("progress"), 30,
             "the first progress report")

        # the forecast turns: no GPU free from now on, a planned stop for both
        daemon.free = np.zeros_like(daemon.free)
        report = daemon.until(lambda r: len(r.noticed) == 2, what="the notices")
        noticed_at, noticed_real = report.now, time.monotonic()
        assert not report.stopped  # a notice first, no SIGTERM yet
        pod = next(p for p in sim.pods() if p.values[p.containers[0]]["IDLEGPU_UNIT"]
                   == answering)
        notice_file = Path(pod.mounts["/etc/idlegpu"]) / "checkpoint-request"
        deadline = wait(lambda: notice_file.read_text(), 10, "the notice file")
        # in the daemon's (replayed) time: the notice's lead after the pass that sent it
        assert datetime.fromisoformat(deadline.strip()) == (
            noticed_at + timedelta(seconds=NOTICE_S))

        # the helper saves and acknowledges; the quick pass stops it within seconds
        wait(lambda: "acknowledged step=" in Path(pod.log).read_text(), 20,
             "the acknowledgement")
        acked_real = time.monotonic()
        stopped = wait(lambda: daemon.controller.notices_once(daemon.now()).stopped, 10,
                       "the stop after the acknowledgement")
        assert stopped == [daemon.cluster.job_name(answering, 1)]
        assert time.monotonic() - acked_real < 5
        log = Path(pod.log).read_text()
        saved_step = int(log.split("acknowledged step=")[1].split()[0])

        # the silent unit works on until its deadline (in replayed time), then is stopped
        def silent_stopped():
            daemon.controller.notices_once(daemon.now())
            return store.notice(f"{silent}/1").outcome is not None

        wait(silent_stopped, NOTICE_S / SPEED + 20, "the silent unit's deadline")
        waited = time.monotonic() - noticed_real
        assert NOTICE_S / SPEED - 3 <= waited <= NOTICE_S / SPEED + 10, waited
        daemon.until(lambda r: all(store.unit(u).state is JobState.QUEUED
                                   for u in (answering, silent)), what="both released")

        # the answering unit lost (next to) nothing; the silent one its whole run
        first = {u: store.attempts(u)[0] for u in (answering, silent)}
        assert first[answering].lost_gpu_seconds < 2 * 5 * SPEED  # seconds of replayed time
        assert first[silent].lost_gpu_seconds > 2 * NOTICE_S * 0.9
        notices = {e.unit_id: e.detail for e in store.events() if e.kind is EventKind.NOTICE}
        assert notices[answering]["outcome"] == "answered"
        assert notices[answering]["step"] == saved_step
        assert notices[silent]["outcome"] == "missed"
        counts = store.notice_counts()
        assert (counts["answered"], counts["missed"], counts["sent"]) == (1, 1, 2)

        # the forecast clears: the next attempt resumes from the saved checkpoint
        daemon.free = np.full_like(daemon.free, 16.0)
        daemon.until(lambda r: store.unit(answering).state is JobState.RUNNING,
                     what="the second attempt")
        second = wait(lambda: next((p for p in sim.pods() if p.log and p.values[
            p.containers[0]].get("IDLEGPU_UNIT") == answering and p.uid != pod.uid), None),
            20, "the second attempt's pod")
        wait(lambda: "resumed step=" in Path(second.log).read_text(), 20, "the resume")
        assert f"resumed step={saved_step} " in Path(second.log).read_text()

        # a pod's token speaks for its own unit only, and for nothing else
        token = (Path(second.mounts["/var/run/secrets/idlegpu"]) / "token").read_text()
        as_pod = Client(api.url, token)
        other = as_pod.post(f"/v1/units/{silent}/checkpoint",
                            json={"kind": "checkpoint", "step": 1, "path": "/x"})
        assert other.status_code == 403, other.text
        assert f"of unit {answering}" in other.json()["error"]["message"]
        for path in ("/v1/units", f"/v1/units/{answering}", "/v1/whoami"):
            assert as_pod.get(path).status_code == 403, path
        assert as_pod.post(f"/v1/units/{answering}/cancel").status_code == 403
        bad = as_pod.post(f"/v1/units/{answering}/checkpoint", json={"kind": "checkpoint",
                                                                     "step": -1})
        assert bad.status_code == 422 and bad.json()["error"]["field"] == "step"
        big = as_pod.post(f"/v1/units/{answering}/checkpoint",
                          data=b'{"kind": "progress", "step": 1, "path": "' + b"x" * 5000
                          + b'"}', headers={"Content-Type": "application/json"})
        assert big.status_code == 413
        # the pod runs attempt 2: a report about attempt 1 is refused
        late = as_pod.post(f"/v1/units/{answering}/checkpoint",
                           json={"kind": "checkpoint", "step": saved_step + 5, "attempt": 1})
        assert late.status_code == 422 and late.json()["error"]["field"] == "attempt"
        ok = as_pod.post(f"/v1/units/{answering}/checkpoint", json={
            "kind": "checkpoint", "step": saved_step + 1, "path": "/ckpt/again"})
        assert ok.status_code == 200 and ok.json()["recorded"] is True
        # a workload reporting in a loop is held to one report per kind every few seconds
        again = as_pod.post(f"/v1/units/{answering}/checkpoint", json={
            "kind": "checkpoint", "step": saved_step + 2, "path": "/ckpt/again"})
        assert again.status_code == 429 and int(again.headers["Retry-After"]) >= 1
    finally:
        api.stop()
        store.close()


EXITS_0 = "import signal, sys, time\nsignal.signal(signal.SIGTERM, lambda *a: sys.exit(0))\n" \
          "while True: time.sleep(0.2)\n"


def test_a_workload_that_exits_0_at_its_stop_is_stopped_not_finished(
        kube_control_plane, kube_namespace, node_sim, priority_classes, tmp_path):  # noqa: F811
    """Lightning turns a SIGTERM during fit() into exit 0, a blind stop of a job without the
    helper too. The real Job controller of a suspended Job never counts that pod a success
    (it has dropped the pod's tracking finalizer): the attempt is a stop, and the unit goes
    back to the queue."""
    store = JobStore(f"sqlite:///{tmp_path / 'jobs.db'}")
    labels = {"idlegpu.test/pool": "exits-0"}
    sim = node_sim(1, 4, labels=labels, volume_root=str(tmp_path / "kubelet"),
                   workload=lambda pod: [sys.executable, "-c", EXITS_0])
    daemon = Harness(kube_control_plane, kube_namespace, store, labels)
    try:
        unit = submit(store, request("exits-0", gpus=2, checkpoint={
            "interval": "1h", "resume_args": ["--resume"]}))
        daemon.until(lambda r: store.unit(unit).state is JobState.RUNNING, what="running")
        daemon.free = np.zeros_like(daemon.free)
        daemon.until(lambda r: r.stopped, what="the planned stop")
        wait(lambda: [p for p in sim.pods() if p.exit_code == 0], 20, "the pod's exit 0")
        time.sleep(2)  # the Job controller's turn
        status = daemon.job(daemon.cluster.job_name(unit, 1))["status"]
        assert not status.get("succeeded")
        assert "Complete" not in {c["type"] for c in status.get("conditions") or []}
        daemon.until(lambda r: store.unit(unit).state is JobState.QUEUED, what="the release")
        (attempt,) = store.attempts(unit)
        assert attempt.outcome.value == "preempted" and store.unit(unit).preemptions == 1
    finally:
        store.close()
