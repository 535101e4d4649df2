"""Shrinks, growths and reduced admissions through reconcile_once() (a real SQLite store, the in-memory
cluster of test_controller): the attempts, their GPUs and the accounting."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

import numpy as np
import pytest
from test_controller import T0, MemoryCluster, Signals

from idlegpu.scheduler.adapters.store import AttemptOutcome, JobStore, TransitionRefusedError
from idlegpu.scheduler.controller import Controller
from idlegpu.scheduler.ports import JobPhase, StopKind
from idlegpu.scheduler.specs import expand_units, validate_request
from idlegpu.scheduler.types import EventKind, FreeProfile, JobState, PolicySettings, ServingSignals

MIN = timedelta(minutes=1)
ELASTIC = {
    "name": "sft", "team": "alignment", "kind": "sft",
    "image": "registry.example.com/research/trl-sft:0.12.2", "command": ["torchrun", "sft.py"],
    "args": ["--out", "{output}"], "gpus": 8, "min_gpus": 4, "cpu": 64, "memory": "512Gi",
    "runtime_estimate": "4h", "output": "s3://runs/{team}/{name}",
    "checkpoint": {"interval": "30m", "resume_args": ["--resume"]},
}


@pytest.fixture
def setup(tmp_path, request):
    store = JobStore(f"sqlite:///{tmp_path / 'jobs.db'}")
    body = getattr(request, "param", ELASTIC)
    request = validate_request(body)
    store.submit(request.name, request.team, request.kind, body, expand_units(request),
                 T0 - timedelta(hours=1))
    cluster, signals = MemoryCluster(), Signals()
    free = {"values": np.full(288, 16.0)}
    controller = Controller(store, cluster, signals,
                            lambda now: FreeProfile(T0, 300, free["values"], 0.9, T0),
                            lambda spec: spec.runtime_estimate_s, PolicySettings(grace_s=600))
    (unit,) = [row.id for row in store.queue()]
    yield store, cluster, signals, controller, free, unit
    store.close()


def running_at(controller, cluster, when):
    (name,) = controller.reconcile_once(when).created
    cluster.set_phase(name, JobPhase.RUNNING, when)
    controller.reconcile_once(when + MIN)
    return name


def test_a_live_shortfall_shrinks_the_job_and_its_next_attempt_runs_on_fewer_gpus(setup):
    store, cluster, signals, controller, _, unit = setup
    first = running_at(controller, cluster, T0)
    assert cluster.jobs[first].gpus == 8
    signals.value = ServingSignals(observed_at=T0 + 20 * MIN, gpus_short=3)
    report = controller.reconcile_once(T0 + 20 * MIN)
    (d,) = report.plan.decisions
    assert (d.action.value, d.gpus) == ("shrink", 5)
    assert report.stopped == [first] and store.unit(unit).shrink_to == 5
    signals.value = ServingSignals(observed_at=T0 + 21 * MIN)  # the 3 GPUs are on their way
    report = controller.reconcile_once(T0 + 21 * MIN)
    assert report.shrunk == [unit] and report.created == [cluster.job_name(unit, 2)]
    job = cluster.jobs[cluster.job_name(unit, 2)]
    assert job.gpus == 5 and first in report.deleted
    row = store.unit(unit)
    assert (row.state, row.gpus, row.attempts, row.preemptions, row.shrink_to) == (
        JobState.ADMITTED, 5, 2, 0, None)
    spec = row.attempt_spec
    assert (spec.gpus, spec.cpu, spec.memory, dict(spec.env)["IDLEGPU_GPUS"]) == (
        5, 40.0, "320Gi", "5")
    one, two = store.attempts(unit)
    assert (one.gpus, one.outcome, two.gpus, two.outcome) == (8, AttemptOutcome.SHRUNK, 5, None)
    # live: the GPU-time since the admission (no checkpoint yet) is lost, on all 8 GPUs
    assert one.lost_gpu_seconds == pytest.approx(8 * 21 * 60)
    assert one.gpu_seconds == pytest.approx(8 * 21 * 60)
    # it runs on 5 GPUs, then finishes: every attempt counts the GPUs it held
    cluster.set_phase(job.name, JobPhase.RUNNING, T0 + 22 * MIN)
    controller.reconcile_once(T0 + 23 * MIN)
    (running,) = store.running(T0 + 23 * MIN, lambda r: 4 * 3600.0)
    assert (running.gpus, running.min_gpus) == (5, 4)
    assert running.remaining_s == pytest.approx((4 * 3600 - 60 * 5 / 8) * 8 / 5)
    cluster.set_phase(job.name, JobPhase.SUCCEEDED, T0 + 82 * MIN)
    controller.reconcile_once(T0 + 83 * MIN)
    assert store.unit(unit).state is JobState.SUCCEEDED
    _, two = store.attempts(unit)
    assert two.gpu_seconds == pytest.approx(5 * 61 * 60)
    assert store.team_gpu_hours(T0 + 83 * MIN, 86400) == {
        "alignment": pytest.approx((8 * 21 + 5 * 61) / 60)}
    # the monthly report's run table counts each attempt at the GPUs it held
    from idlegpu.scheduler.reports import runs_from_store
    runs = runs_from_store(store, T0 + 90 * MIN)
    assert list(zip(runs["gpus"], runs["outcome"], strict=True)) == [(8, "stopped"),
                                                                     (5, "finished")]
    assert runs["gpu_hours"].tolist() == pytest.approx([8 * 21 / 60, 5 * 61 / 60])
    kinds = [(e.kind, e.gpus) for e in store.events(unit_id=unit)]
    assert kinds[-4:] == [(EventKind.PREEMPTED, 8), (EventKind.ADMITTED, 5),
                          (EventKind.STARTED, 5), (EventKind.FINISHED, 5)]


def _run_second_attempt_then_stop_it_as_planned(controller, cluster, unit) -> None:
    """The attempt on fewer GPUs starts at +26 min and is stopped as planned at +66 min."""
    cluster.set_phase(cluster.job_name(unit, 2), JobPhase.RUNNING, T0 + 26 * MIN)
    controller.reconcile_once(T0 + 27 * MIN)
    cluster.stop(cluster.job_name(unit, 2), reason="test", kind=StopKind.PLANNED,
                 now=T0 + 66 * MIN)
    controller.reconcile_once(T0 + 67 * MIN)


SAVES_ON_STOP = {**ELASTIC, "checkpoint": {**ELASTIC["checkpoint"], "saves_on_stop": True}}


@pytest.mark.parametrize("setup", [SAVES_ON_STOP], indirect=True)
def test_a_planned_shrink_keeps_the_work_and_counts_it_at_the_gpus_it_ran_on(setup):
    store, cluster, signals, controller, free, unit = setup
    first = running_at(controller, cluster, T0)
    # the policy sees that it saves on stop (a planned stop then costs it no work)
    (held,) = store.running(T0 + MIN, lambda r: 4 * 3600.0)
    assert held.saves_on_stop and held.unsaved_work_s(T0 + MIN, planned=True) == 0.0
    free["values"] = np.concatenate([np.full(6, 16.0), np.full(282, 6.0)])  # a ramp at +30 min
    signals.value = ServingSignals(observed_at=T0 + 25 * MIN)
    report = controller.reconcile_once(T0 + 25 * MIN)
    (d,) = report.plan.decisions
    assert (d.action.value, d.gpus, d.planned) == ("shrink", 6, True)
    signals.value = ServingSignals(observed_at=T0 + 26 * MIN)
    report = controller.reconcile_once(T0 + 26 * MIN)
    assert report.shrunk == [unit]
    row = store.unit(unit)
    assert row.work_done_s == pytest.approx(25 * 60)  # from its start to the stop
    one, _ = store.attempts(unit)
    assert one.lost_gpu_seconds == 0.0 and one.outcome is AttemptOutcome.SHRUNK
    # on 6 GPUs, a planned stop later saves 6/8 of a second of work per second
    _run_second_attempt_then_stop_it_as_planned(controller, cluster, unit)
    row = store.unit(unit)
    assert row.state is JobState.QUEUED and row.preemptions == 1
    assert row.work_done_s == pytest.approx(25 * 60 + 40 * 60 * 6 / 8)
    (waiting,) = store.waiting(T0 + 67 * MIN, lambda r: 4 * 3600.0)
    assert (waiting.gpus, waiting.min_gpus) == (8, 4)
    del first


def test_a_planned_shrink_without_a_save_on_stop_keeps_only_the_periodic_checkpoints(setup):
    """The workload checkpoints every 30 minutes and does not save on SIGTERM: a planned
    stop keeps the work up to its last periodic checkpoint and counts the rest as lost, at
    the GPUs the attempt held."""
    store, cluster, signals, controller, free, unit = setup
    running_at(controller, cluster, T0)
    (held,) = store.running(T0 + MIN, lambda r: 4 * 3600.0)
    assert not held.saves_on_stop and held.unsaved_work_s(T0 + MIN, planned=True) == 60.0
    free["values"] = np.concatenate([np.full(6, 16.0), np.full(282, 6.0)])  # a ramp at +30 min
    signals.value = ServingSignals(observed_at=T0 + 25 * MIN)
    controller.reconcile_once(T0 + 25 * MIN)
    signals.value = ServingSignals(observed_at=T0 + 26 * MIN)
    assert controller.reconcile_once(T0 + 26 * MIN).shrunk == [unit]
    assert store.unit(unit).work_done_s == 0.0  # stopped 25 min in, before its first checkpoint
    one, _ = store.attempts(unit)
    assert one.outcome is AttemptOutcome.SHRUNK
    assert one.lost_gpu_seconds == pytest.approx(8 * 25 * 60)
    _run_second_attempt_then_stop_it_as_planned(controller, cluster, unit)
    row = store.unit(unit)
    # 40 minutes on 6 GPUs: one checkpoint at +30 min saved 30 * 6/8 minutes of work
    assert row.state is JobState.QUEUED
    assert row.work_done_s == pytest.approx(30 * 60 * 6 / 8)
    _, two = store.attempts(unit)
    assert two.lost_gpu_seconds == pytest.approx(6 * 10 * 60)


def test_a_reduced_admission_opens_an_attempt_on_the_gpus_granted(setup):
    store, cluster, _, controller, free, unit = setup
    free["values"] = np.full(288, 6.0)
    report = controller.reconcile_once(T0)
    (d,) = report.plan.decisions
    assert (d.action.value, d.gpus) == ("admit", 6)
    (name,) = report.created
    assert cluster.jobs[name].gpus == 6
    assert [a.gpus for a in store.attempts(unit)] == [6]
    assert store.unit(unit).gpus == 6 and store.unit(unit).spec.gpus == 8


def test_the_store_refuses_sizes_outside_the_unit_range(setup):
    store, _, _, _, _, unit = setup
    with pytest.raises(TransitionRefusedError, match="runs on 4 to 8 GPUs, not 3"):
        store.admit(unit, T0, gpus=3)
    store.admit(unit, T0, gpus=6)
    with pytest.raises(TransitionRefusedError, match="cannot shrink unit .* to 6 GPUs: it holds 6"):
        store.shrinking(unit, T0, 6)
    with pytest.raises(TransitionRefusedError, match="is not shrinking"):
        store.shrunk(unit, T0 + MIN)


STEPPED = {**ELASTIC, "gpus_step": 4}


@pytest.mark.parametrize("setup", [STEPPED], indirect=True)
def test_a_stepped_unit_shrinks_and_is_admitted_by_whole_steps(setup):
    store, cluster, signals, controller, _, unit = setup
    first = running_at(controller, cluster, T0)
    signals.value = ServingSignals(observed_at=T0 + 20 * MIN, gpus_short=3)
    report = controller.reconcile_once(T0 + 20 * MIN)
    (d,) = report.plan.decisions
    assert (d.action.value, d.gpus) == ("shrink", 4)  # a whole step, though 3 would do
    assert report.stopped == [first] and store.unit(unit).shrink_to == 4
    # the store refuses a size off the step, as the policy never asks for one
    with pytest.raises(TransitionRefusedError, match="runs on 4 to 8 GPUs in steps of 4, not 6"):
        store.shrinking(unit, T0 + 21 * MIN, 6)


@pytest.mark.parametrize("setup", [STEPPED], indirect=True)
def test_a_stepped_unit_waits_for_a_whole_step(setup):
    store, cluster, _, controller, free, unit = setup
    free["values"] = np.full(288, 7.0)  # 7 free: one step of 4, not 7
    (d,) = controller.reconcile_once(T0).plan.decisions
    assert (d.action.value, d.gpus) == ("admit", 4)
    assert [a.gpus for a in store.attempts(unit)] == [4]
    (job,) = cluster.jobs.values()
    assert job.gpus == 4


def test_a_cancel_during_a_shrink_cancels_instead_of_restarting(setup):
    store, cluster, signals, controller, _, unit = setup
    running_at(controller, cluster, T0)
    signals.value = ServingSignals(observed_at=T0 + 20 * MIN, gpus_short=2)
    controller.reconcile_once(T0 + 20 * MIN)
    store.cancel(unit, T0 + 20 * MIN)
    signals.value = ServingSignals(observed_at=T0 + 21 * MIN)
    report = controller.reconcile_once(T0 + 21 * MIN)
    assert report.shrunk == [] and report.created == []
    assert store.unit(unit).state is JobState.CANCELLED
    assert [a.outcome for a in store.attempts(unit)] == [AttemptOutcome.CANCELLED]


def test_a_version_2_store_gains_shrink_to_and_keeps_its_units(tmp_path, monkeypatch):
    import sqlalchemy as sa

    from idlegpu.scheduler.adapters import store as store_mod

    url = f"sqlite:///{tmp_path / 'old.db'}"
    with monkeypatch.context() as m:
        m.setattr(store_mod, "MIGRATIONS", store_mod.MIGRATIONS[:2])
        engine = sa.create_engine(url)
        with engine.begin() as conn:
            store_mod.SCHEMA_VERSION_TABLE.create(conn)
            for version, (name, migrate) in enumerate(store_mod.MIGRATIONS[:2], start=1):
                migrate(conn)
                conn.execute(sa.insert(store_mod.SCHEMA_VERSION_TABLE).values(
                    version=version, name=name))
        engine.dispose()
    assert "shrink_to" not in {c["name"] for c in sa.inspect(sa.create_engine(url))
                               .get_columns("units")}
    with JobStore(url) as store:
        assert store.schema_version() == store_mod.SCHEMA_VERSION >= 3  # migrated to the newest
        request = validate_request(ELASTIC)
        store.submit(request.name, request.team, request.kind, ELASTIC, expand_units(request),
                     T0)
        (row,) = store.queue()
        assert row.shrink_to is None and row.spec.min_gpus == 4


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_a_shrink_with_a_window_gives_the_next_attempt_its_stop_by(backend, tmp_path, request):
    url = (f"sqlite:///{tmp_path / 'jobs.db'}" if backend == "sqlite"
           else request.getfixturevalue("fresh_postgres_url"))
    with JobStore(url) as store:
        req = validate_request(ELASTIC)
        store.submit(req.name, req.team, req.kind, ELASTIC, expand_units(req), T0)
        (unit,) = [row.id for row in store.queue()]
        store.admit(unit, T0)
        store.started(unit, T0)
        until = T0 + 3 * timedelta(hours=1)
        store.shrinking(unit, T0 + 20 * MIN, 6, stop_by=until)
        assert store.unit(unit).shrink_to == 6
        assert store.shrunk(unit, T0 + 21 * MIN, work_done_s=20 * 60.0) == 2
        row = store.unit(unit)
        assert (row.gpus, row.stop_by, row.work_done_s, row.shrink_to) == (6, until, 1200.0,
                                                                           None)
        assert store.attempts(unit)[1].stop_by == until


def test_a_unit_admitted_on_fewer_gpus_is_stopped_to_grow_and_admitted_again_on_more(setup):
    """Admitted on 6 of its 8 GPUs, it is stopped as planned just after its first checkpoint
    once 16 are free (policy.growth), its work kept, and admitted again on 8."""
    store, cluster, signals, controller, free, unit = setup
    free["values"] = np.full(288, 6.0)
    first = running_at(controller, cluster, T0)
    assert cluster.jobs[first].gpus == 6
    free["values"] = np.full(288, 16.0)
    signals.value = ServingSignals(observed_at=T0 + 20 * MIN)
    assert controller.reconcile_once(T0 + 20 * MIN).plan.decisions == ()  # work unsaved
    signals.value = ServingSignals(observed_at=T0 + 30 * MIN)
    report = controller.reconcile_once(T0 + 30 * MIN)
    (stop,) = report.plan.decisions
    assert (stop.action.value, stop.cause, stop.planned) == ("preempt", "grow", True)
    assert report.stopped == [first]
    signals.value = ServingSignals(observed_at=T0 + 31 * MIN)
    report = controller.reconcile_once(T0 + 31 * MIN)
    second = cluster.job_name(unit, 2)
    assert report.created == [second] and cluster.jobs[second].gpus == 8
    row = store.unit(unit)
    assert (row.state, row.gpus) == (JobState.ADMITTED, 8)
    # its first checkpoint at +30 min kept 30 min on 6 of 8 GPUs; nothing was lost
    assert row.work_done_s == pytest.approx(30 * 60 * 6 / 8)
    one, two = store.attempts(unit)
    assert (one.gpus, one.outcome, one.lost_gpu_seconds) == (6, AttemptOutcome.PREEMPTED, 0.0)
    assert two.gpus == 8


def test_no_unit_is_stopped_to_grow_while_admission_is_paused(setup):
    """A stop to grow is an admission of more GPUs: a paused admission would leave the unit
    stopped in the queue, so it runs on where it is until the pause ends."""
    from idlegpu.scheduler.adapters.store import AuditEntry

    store, cluster, signals, controller, free, _ = setup
    free["values"] = np.full(288, 6.0)
    first = running_at(controller, cluster, T0)
    free["values"] = np.full(288, 16.0)
    who = AuditEntry(at=T0, actor="olga", auth="token", role="operator", team="platform",
                     action="admission.pause", target="pool")
    store.pause_admission(T0 + 29 * MIN, "node upgrade", who)
    signals.value = ServingSignals(observed_at=T0 + 30 * MIN)
    report = controller.reconcile_once(T0 + 30 * MIN)
    assert report.plan.decisions == () and report.stopped == []
    assert cluster.jobs[first].phase is JobPhase.RUNNING
    store.resume_admission(T0 + 59 * MIN, replace(who, action="admission.resume"))
    signals.value = ServingSignals(observed_at=T0 + 60 * MIN)
    (stop,) = controller.reconcile_once(T0 + 60 * MIN).plan.decisions
    assert stop.cause == "grow"
