"""scheduler/admission_checks.py: Kueue Workloads (as the real Kueue writes them,
tests/data/kueue/, captured from tests/kueue_manager.py's controller) as units for decide(), and
decisions as check states."""

from __future__ import annotations

import copy
import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from zoneinfo import ZoneInfo

import numpy as np
import pytest

from idlegpu.scheduler.admission_checks import (
    CheckedWorkload,
    WorkloadError,
    check_active,
    check_updates,
    checked_workload,
    policy_units,
)
from idlegpu.scheduler.policy import decide
from idlegpu.scheduler.types import FreeProfile, PolicySettings, ServingSignals

DATA = Path(__file__).parent / "data" / "kueue"
CHECKS = ["idlegpu-forecast"]
SEOUL = ZoneInfo("Asia/Seoul")


def real(name: str) -> dict:
    return json.loads((DATA / f"workload_{name}.json").read_text())


def test_a_real_pending_workload_is_a_unit_with_its_gpus_pods_and_runtime():
    w = checked_workload(real("pending"), CHECKS)
    assert w is not None
    # an Indexed Job of 2 pods of 2 GPUs, `kueue.x-k8s.io/max-exec-time-seconds: 7200`
    assert (w.gpus, w.pods, w.max_exec_s) == (4, 2, 7200.0)
    assert (w.state, w.quota_reserved, w.admitted) == ("Pending", True, False)
    name = real("pending")["metadata"]["name"]  # job-sft-a-<hash>, Kueue's
    assert w.cluster_queue == "research" and w.id == f"kueue/dump/{name}"
    admitted = checked_workload(real("admitted"), CHECKS)
    assert admitted is not None and admitted.admitted and admitted.state == "Ready"
    assert admitted.admitted_at == datetime(2026, 12, 6, 23, 34, 23, tzinfo=UTC)


def test_a_workload_without_our_check_is_not_ours():
    other = real("pending")
    other["status"]["admissionChecks"][0]["name"] = "someone-elses"
    assert checked_workload(other, CHECKS) is None
    del other["status"]["admissionChecks"]
    assert checked_workload(other, CHECKS) is None


@pytest.mark.parametrize(("path", "value", "field"), [
    (("spec", "podSets", 0, "count"), -1, "spec.podSets[0].count"),
    (("spec", "podSets", 0, "template", "spec", "containers", 0, "resources", "requests",
      "nvidia.com/gpu"), "0.5", "nvidia.com/gpu"),
    (("spec", "podSets", 0, "template", "spec", "containers", 0, "resources", "requests",
      "nvidia.com/gpu"), "1e400", "nvidia.com/gpu"),
    (("status", "admissionChecks", 0, "state"), "Bogus", "state"),
    (("metadata", "creationTimestamp"), "yesterday", "metadata.creationTimestamp"),
    (("spec", "maximumExecutionTimeSeconds"), "7200", "maximumExecutionTimeSeconds"),
])
def test_a_hostile_workload_is_refused_with_the_field(path, value, field):
    obj = real("pending")
    target = obj
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    with pytest.raises(WorkloadError, match=field.replace(".", r"\.").replace("[", r"\[")):
        checked_workload(obj, CHECKS)


def _profile(now: datetime, free: list[float]) -> FreeProfile:
    return FreeProfile(start=now, step_s=300, free=np.asarray(free), confidence=0.9,
                       made_at=now)


def test_decisions_become_check_states_and_an_unchanged_one_is_not_written():
    now = datetime(2026, 12, 6, 12, 0, tzinfo=UTC)  # Sunday 21:00 in Seoul
    pending = checked_workload(real("pending"), CHECKS)
    assert pending is not None
    big = copy.deepcopy(real("pending"))
    big["metadata"]["name"] = "job-big"
    big["spec"]["podSets"][0]["count"] = 8  # 16 GPUs
    waits = checked_workload(big, CHECKS)
    assert waits is not None
    runtime = {pending.id: 7200.0, waits.id: 9 * 3600.0}
    queue, running = policy_units([pending, waits], now, runtime)
    assert [j.id for j in queue] == sorted([pending.id, waits.id]) and running == []
    # 8 GPUs free for 10 h, then 20 for 12 h: the 4-GPU unit fits now, the 16-GPU one later
    profile = _profile(now, [8.0] * 120 + [20.0] * 144)
    signals = ServingSignals(observed_at=now, idle_gpus=16, service_gpus=56)
    plan = decide(now, profile, running, queue, signals, {},
                  PolicySettings(headroom_gpus=8, pool_gpus=80))
    updates = {u.name: u for u in check_updates([pending, waits], plan.decisions, 80, SEOUL)}
    assert updates[pending.name].state == "Ready"
    assert updates[pending.name].message.startswith("fits the forecast: 4 GPUs stay free")
    assert updates["job-big"].state == "Pending"
    assert "first fits Mon 07:00" in updates["job-big"].message, updates["job-big"].message
    # the next pass finds those states written: nothing to write
    written = [CheckedWorkload(**{**w.__dict__, "state": updates[w.name].state,
                                  "message": updates[w.name].message})
               for w in (pending, waits)]
    assert [u.name for u in check_updates(written, plan.decisions, 80, SEOUL)] == []


def test_an_admitted_workload_runs_and_a_stop_is_a_retry_and_too_big_is_rejected():
    now = datetime(2026, 12, 6, 23, 44, 23, tzinfo=UTC)
    admitted = checked_workload(real("admitted"), CHECKS)
    assert admitted is not None
    queue, running = policy_units([admitted], now, {admitted.id: 7200.0})
    assert queue == [] and [j.id for j in running] == [admitted.id]
    assert running[0].remaining_s == pytest.approx(7200 - 600)
    assert not running[0].checkpointable  # idlegpu cannot see a Workload's checkpoints
    # the service needs the GPUs now: decide() stops it, the check says Retry
    profile = _profile(now, [0.0] * 24)
    signals = ServingSignals(observed_at=now, idle_gpus=0, service_gpus=80, gpus_short=4)
    plan = decide(now, profile, running, [], signals, {},
                  PolicySettings(headroom_gpus=8, pool_gpus=80))
    (update,) = check_updates([admitted], plan.decisions, 80, SEOUL)
    assert update.state == "Retry" and "cannot get" in update.message
    huge = copy.deepcopy(real("pending"))
    huge["spec"]["podSets"][0]["count"] = 50  # 100 GPUs in an 80-GPU pool
    w = checked_workload(huge, CHECKS)
    assert w is not None
    (rejected,) = check_updates([w], [], 80, SEOUL)
    assert rejected.state == "Rejected" and "can never fit" in rejected.message


def test_a_message_is_bounded_to_kueues_limit():
    pending = checked_workload(real("pending"), CHECKS)
    assert pending is not None
    from idlegpu.scheduler.types import Action, Decision

    long = Decision(Action.DEFER, pending.id, 4, "x" * 5000)
    (update,) = check_updates([pending], [long], 80, SEOUL)
    assert len(update.message) <= 1024


def test_the_checks_are_active_only_while_idlegpu_can_decide():
    fresh = dict(forecast_age_s=600.0, max_forecast_age_s=26 * 3600.0, signals_age_s=5.0,
                 max_signal_age_s=120.0)
    assert check_active(**fresh)[0] is True
    assert check_active(**{**fresh, "forecast_age_s": None})[1] == "NoForecast"
    assert check_active(**{**fresh, "forecast_age_s": 27 * 3600.0})[1] == "ForecastStale"
    assert check_active(**{**fresh, "signals_age_s": None})[1] == "SignalsMissing"
    assert check_active(**{**fresh, "signals_age_s": 600.0})[1] == "SignalsStale"
    paused = check_active(**fresh, paused_reason="maintenance until 06:00")
    assert paused[:2] == (False, "AdmissionPaused") and "maintenance" in paused[2]


def test_a_ready_workload_not_admitted_yet_holds_its_gpus_and_a_stop_takes_the_ready_back():
    now = datetime(2026, 12, 6, 23, 44, 23, tzinfo=UTC)
    obj = copy.deepcopy(real("pending"))
    obj["status"]["admissionChecks"][0].update(state="Ready",
                                               lastTransitionTime="2026-12-06T23:40:00Z")
    ready = checked_workload(obj, CHECKS)
    assert ready is not None and not ready.admitted
    queue, running = policy_units([ready], now, {ready.id: 3600.0})
    # promised: the next pass counts its GPUs as taken (never admits past them)
    assert queue == [] and [j.id for j in running] == [ready.id]
    assert running[0].remaining_s == pytest.approx(3600 - 263)
    profile = _profile(now, [0.0] * 24)
    signals = ServingSignals(observed_at=now, idle_gpus=0, service_gpus=80, gpus_short=4)
    plan = decide(now, profile, running, [], signals, {},
                  PolicySettings(headroom_gpus=8, pool_gpus=80))
    (update,) = check_updates([ready], plan.decisions, 80, SEOUL)
    assert update.state == "Pending" and update.message.startswith("waits: ")


def test_a_workload_that_checkpoints_is_stopped_at_its_windows_end_one_that_does_not_runs_on():
    now = datetime(2026, 12, 6, 23, 44, 23, tzinfo=UTC)
    obj = real("admitted")
    saves = copy.deepcopy(obj)
    saves["spec"]["podSets"][0]["template"].setdefault("metadata", {}).setdefault(
        "annotations", {})["idlegpu.io/checkpointable"] = "true"
    plain_w, saving = checked_workload(obj, CHECKS), checked_workload(saves, CHECKS)
    assert plain_w is not None and saving is not None
    assert saving.checkpointable and not plain_w.checkpointable
    # the window closes in 10 minutes (the forecast's ramp), nobody needs the GPUs yet
    profile = _profile(now, [8.0, 8.0] + [0.0] * 22)
    signals = ServingSignals(observed_at=now, idle_gpus=8, service_gpus=64, gpus_short=0)
    settings = PolicySettings(headroom_gpus=8, pool_gpus=80, grace_s=600)
    for w, stopped in ((saving, True), (plain_w, False)):
        _, running = policy_units([w], now, {w.id: 7200.0})
        plan = decide(now, profile, running, [], signals, {}, settings)
        updates = check_updates([w], plan.decisions, 80, SEOUL)
        assert [u.state for u in updates] == (["Retry"] if stopped else []), plan.decisions
