"""The controller's Kueue pass (``controller/kueue.py``) with an in-memory AdmissionCheckSource:
what the real Kueue cannot produce on demand (its API unreadable mid-night, a write refused),
and the rules around it. The check controller on the real Kueue: tests/test_kueue_real.py.

The Workloads are the real one of tests/data/kueue/ (written by Kueue v0.13), with their
fields set per case."""

from __future__ import annotations

import copy
import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from zoneinfo import ZoneInfo

import numpy as np
import pytest
from test_controller import MemoryCluster, Signals

from idlegpu.forecast.errors import TemporaryError
from idlegpu.scheduler.adapters.store import JobStore
from idlegpu.scheduler.adapters.store.rows import AuditEntry
from idlegpu.scheduler.admission_checks import KueueReading, checked_workload
from idlegpu.scheduler.controller import Controller
from idlegpu.scheduler.controller.kueue import KueueAdmission
from idlegpu.scheduler.types import FreeProfile, PolicySettings, ServingSignals

T0 = datetime(2026, 1, 28, 11, 0, tzinfo=UTC)  # 20:00 in Seoul
CHECK = "idlegpu-forecast"
PENDING = json.loads((Path(__file__).parent / "data" / "kueue" / "workload_pending.json")
                     .read_text())


def _workload(name: str, gpus: int, runtime_s: int, *, state: str = "Pending",
              admitted: bool = False) -> dict:
    obj = copy.deepcopy(PENDING)
    obj["metadata"]["name"] = name
    obj["spec"]["maximumExecutionTimeSeconds"] = runtime_s
    container = obj["spec"]["podSets"][0]["template"]["spec"]["containers"][0]
    container["resources"] = {"requests": {"nvidia.com/gpu": str(gpus)}}
    obj["spec"]["podSets"][0]["count"] = 1
    obj["status"]["admissionChecks"] = [{"name": CHECK, "state": state, "message": "",
                                         "lastTransitionTime": "2026-01-28T10:00:00Z"}]
    if admitted:
        obj["status"]["conditions"].append({
            "type": "Admitted", "status": "True", "reason": "Admitted", "message": "",
            "lastTransitionTime": "2026-01-28T10:30:00Z"})
    return obj


class MemoryKueue:
    """The AdmissionCheckSource port in memory; ``down`` makes every call fail as a lost
    apiserver does (after the adapter's retries)."""

    def __init__(self, *objects: dict) -> None:
        self.objects = list(objects)
        self.active: dict[str, tuple[bool, str, str]] = {}
        self.writes: list[tuple[str, str, str]] = []
        self.down = False

    def read(self) -> KueueReading:
        if self.down:
            raise TemporaryError("Kubernetes API unavailable: list workloads.kueue.x-k8s.io")
        return KueueReading(active=dict(self.active), served=[CHECK], workloads=[
            w for w in (checked_workload(o, [CHECK]) for o in self.objects) if w])

    def set_active(self, check: str, active: tuple[bool, str, str]) -> None:
        self.active[check] = active

    def write(self, update) -> None:
        if self.down:
            raise TemporaryError("Kubernetes API unavailable: patch workloads/status")
        self.writes.append((update.name, update.state, update.message))
        for obj in self.objects:
            if obj["metadata"]["name"] == update.name:
                obj["status"]["admissionChecks"][0].update(state=update.state,
                                                           message=update.message)


@pytest.fixture
def daemon(tmp_path):
    store = JobStore(f"sqlite:///{tmp_path / 'jobs.db'}")
    signals = Signals()
    free = {"values": np.full(288, 16.0), "made_at": T0}

    def forecast(now):
        return FreeProfile(T0, 300, free["values"], 0.9, free["made_at"])

    def build(source: MemoryKueue, *, dry_run: bool = False) -> Controller:
        kueue = KueueAdmission(source, lambda w: w.max_exec_s or 3600.0, pool_gpus=32,
                               tz=ZoneInfo("Asia/Seoul"), dry_run=dry_run)
        return Controller(store, MemoryCluster(), signals, forecast, lambda spec: 3600.0,
                          PolicySettings(), external=[kueue])

    yield build, signals, free, store
    store.close()


def _now(minutes: float = 0) -> datetime:
    return T0 + timedelta(minutes=minutes)


def test_a_workload_that_fits_is_ready_one_that_does_not_waits_with_its_start(daemon):
    build, signals, free, _ = daemon
    # 16 GPUs free for 3 h, none for the day, 16 again after 20 h
    free["values"] = np.concatenate([np.full(36, 16.0), np.zeros(204), np.full(336, 16.0)])
    source = MemoryKueue(_workload("short", 8, 2 * 3600), _workload("long", 8, 9 * 3600),
                         _workload("huge", 64, 3600))
    signals.value = ServingSignals(observed_at=_now())
    report = build(source).reconcile_once(_now())
    states = {name: (state, message) for name, state, message in source.writes}
    assert states["short"][0] == "Ready" and "fits the forecast" in states["short"][1]
    assert states["long"][0] == "Pending" and states["long"][1].startswith("waits: ")
    assert states["huge"] == ("Rejected",
                              "needs 64 GPUs; the pool has 32 in all: it can never fit")
    assert source.active[CHECK][0] is True
    namespace = PENDING["metadata"]["namespace"]
    assert (f"kueue/{namespace}/short", "Ready") in report.checks_written
    # the queue views' record: each Workload with its state and why it waits
    shown = {u.name: u for u in daemon[3].external_units()}
    assert {n: u.state for n, u in shown.items()} == {
        "short": "admitted", "long": "waiting", "huge": "refused"}
    assert shown["long"].reason.startswith("waits: ") and shown["long"].origin == "kueue"
    assert shown["short"].stop_by is not None or "stops by" not in states["short"][1]


def test_kueue_unreadable_admits_none_of_its_workloads_and_keeps_what_runs(daemon):
    build, signals, _, _ = daemon
    source = MemoryKueue(_workload("running", 8, 4 * 3600, state="Ready", admitted=True),
                         _workload("waiting", 8, 3600))
    controller = build(source)
    signals.value = ServingSignals(observed_at=_now())
    controller.reconcile_once(_now())
    assert [w[:2] for w in source.writes] == [("waiting", "Ready")]
    source.objects[1]["status"]["admissionChecks"][0]["state"] = "Pending"  # requeued since
    source.writes.clear()
    source.down = True
    signals.value = ServingSignals(observed_at=_now(1))
    report = controller.reconcile_once(_now(1))
    assert any(e.startswith("kueue: ") for e in report.errors), report.errors
    assert source.writes == []
    # the backstop still knows the running one from the last reading: a live need stops it,
    # and a write that fails is reported, not lost silently
    source.down = False
    signals.value = ServingSignals(observed_at=_now(2), gpus_short=8)
    report = controller.backstop_once(_now(2))
    assert ("running", "Retry") in [w[:2] for w in source.writes], report
    # its GPUs are on their way back: counted once against the need, not twice
    assert controller._stopping
    signals.value = ServingSignals(observed_at=_now(3), gpus_short=8)
    assert controller.backstop_once(_now(3)).checks_written == []


def test_the_check_is_not_active_while_idlegpu_cannot_decide(daemon):
    build, signals, free, store = daemon
    source = MemoryKueue(_workload("waiting", 8, 3600))
    controller = build(source)
    signals.value = ServingSignals(observed_at=_now())
    controller.reconcile_once(_now())
    assert source.active[CHECK] == (True, "Active",
                                    "the forecast and the live signals are fresh")
    free["made_at"] = T0 - timedelta(hours=30)
    controller.reconcile_once(_now(1))
    assert source.active[CHECK][:2] == (False, "ForecastStale")
    free["made_at"] = T0
    signals.value = ServingSignals(observed_at=_now() - timedelta(minutes=10))
    controller.reconcile_once(_now(2))
    assert source.active[CHECK][:2] == (False, "SignalsStale")
    signals.value = ServingSignals(observed_at=_now(3))
    store.pause_admission(_now(3), "maintenance", AuditEntry(
        at=_now(3), actor="olga", auth="cli", role="operator", team=None,
        action="admission.pause", target="pool"))
    controller.reconcile_once(_now(3))
    assert source.active[CHECK][:2] == (False, "AdmissionPaused")
    assert "maintenance" in source.active[CHECK][2]


def test_a_dry_run_writes_no_check(daemon):
    build, signals, _, _ = daemon
    source = MemoryKueue(_workload("waiting", 8, 3600))
    signals.value = ServingSignals(observed_at=_now())
    report = build(source, dry_run=True).reconcile_once(_now())
    assert report.checks_written and source.writes == [] and source.active == {}


def test_changes_of_state_are_written_first_and_messages_a_bounded_number_a_pass(daemon):
    build, signals, free, _ = daemon
    free["values"] = np.zeros(288)  # the pool is full: everything waits
    source = MemoryKueue(*[_workload(f"w{i:02d}", 4, 3600) for i in range(12)],
                         _workload("huge", 64, 3600))
    controller = build(source)
    controller.external[0].max_message_writes = 5
    signals.value = ServingSignals(observed_at=_now())
    controller.reconcile_once(_now())
    assert source.writes[0][:2] == ("huge", "Rejected")  # a change of state goes first
    assert len(source.writes) == 1 + 5
    for minute in (1, 2):
        signals.value = ServingSignals(observed_at=_now(minute))
        controller.reconcile_once(_now(minute))
    told = {name for name, state, message in source.writes if message.startswith("waits: ")}
    assert told == {f"w{i:02d}" for i in range(12)}  # every wait explained within 3 passes
    source.writes.clear()
    signals.value = ServingSignals(observed_at=_now(3))
    controller.reconcile_once(_now(3))
    assert source.writes == []  # nothing moved: nothing written
    # the signals go stale: the check goes inactive (its message says why), and the waits'
    # messages are not rewritten pass after pass with the seconds since
    for minute in (6, 7, 8):
        controller.reconcile_once(_now(minute))
    assert source.active[CHECK][:2] == (False, "SignalsStale")
    assert len(source.writes) <= 5, source.writes
