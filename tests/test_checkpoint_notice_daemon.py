"""The daemon's checkpoint notices pass by pass (a real SQLite store, an in-memory cluster):
a planned stop of a unit that answers notices becomes a notice; the stop comes at the
acknowledgement, at the deadline, or at once when the service is short; a restarted daemon
goes on with the notices under way; units without the option are stopped as before.
The real control plane, API and helper: tests/test_checkpoint_notice_kube.py."""

from datetime import timedelta

import numpy as np
import pytest
from prometheus_client import generate_latest
from test_controller import T0, MemoryCluster, Signals

from idlegpu.scheduler.adapters.store import JobStore, NoticeOutcome
from idlegpu.scheduler.controller import Controller
from idlegpu.scheduler.daemon import Daemon
from idlegpu.scheduler.ports import JobPhase, StopKind
from idlegpu.scheduler.reports import Month, notices_from_store
from idlegpu.scheduler.specs import expand_units, validate_request
from idlegpu.scheduler.types import EventKind, FreeProfile, JobState, PolicySettings, ServingSignals

NOTICE = timedelta(minutes=10)


class NoticingCluster(MemoryCluster):
    def __init__(self):
        super().__init__()
        self.notices: list[tuple[str, object]] = []
        self.down = False

    def request_checkpoint(self, name, *, deadline, reason, now):
        if self.down:
            from idlegpu.forecast.errors import TemporaryError

            raise TemporaryError("the API server is unavailable (503)")
        self.notices.append((name, deadline))
        return 1


def request(notice: bool = True) -> dict:
    return {"name": "sft", "team": "nlp", "kind": "training",
            "image": "registry.example.com/research/train:1.0", "command": ["python", "t.py"],
            "gpus": 8, "runtime_estimate": "6h", "sweep": {"seed": [1, 2]},
            "args": ["--seed", "{seed}"],
            "checkpoint": {"interval": "2h", "resume_args": ["--resume"], "notice": notice}}


@pytest.fixture
def pool(tmp_path):
    def make(notice: bool = True):
        store = JobStore(f"sqlite:///{tmp_path / f'jobs-{notice}.db'}")
        data = request(notice)
        req = validate_request(data)
        store.submit(req.name, req.team, req.kind, data, expand_units(req), T0 - timedelta(hours=1))
        cluster, signals = NoticingCluster(), Signals()
        free = {"values": np.full(288, 16.0)}

        def forecast(now):
            return FreeProfile(T0, 300, free["values"], 0.9, T0)

        def controller():
            return Controller(store, cluster, signals, forecast,
                              lambda spec: spec.runtime_estimate_s, PolicySettings(),
                              checkpoint_notice_s=NOTICE.total_seconds())

        made.append(store)
        return store, cluster, signals, controller, free
    made: list[JobStore] = []
    yield make
    for store in made:
        store.close()


def running(store, cluster, controller, signals):
    controller.reconcile_once(T0)
    for name in cluster.created:
        cluster.set_phase(name, JobPhase.RUNNING, T0)
    signals.value = ServingSignals(observed_at=T0 + timedelta(minutes=1))
    controller.reconcile_once(T0 + timedelta(minutes=1))
    assert [r.state for r in store.queue()] == [JobState.RUNNING, JobState.RUNNING]


def noticed(controller, signals, free, at):
    """The forecast turns (no GPU free from 20:30): passes until the notices go out."""
    free["values"][6:] = 0.0
    for minute in range(30):
        now = at + timedelta(minutes=minute)
        signals.value = ServingSignals(observed_at=now)
        report = controller.reconcile_once(now)
        if report.noticed:
            return now, report
    raise AssertionError("no notice was sent")


def test_a_planned_stop_becomes_a_notice_then_a_stop_at_the_answer(pool):
    store, cluster, signals, make, free = pool()
    controller = make()
    running(store, cluster, controller, signals)
    at, report = noticed(controller, signals, free, T0 + timedelta(minutes=2))
    assert len(report.noticed) == 2 and not report.stopped and not cluster.stops
    assert all(deadline == at + NOTICE for _, deadline in cluster.notices)
    # their GPUs count as coming back: the next pass decides nothing more about them
    report = controller.reconcile_once(at + timedelta(minutes=1))
    assert not report.noticed and not report.stopped
    first, second = (row.id for row in store.queue())
    answer = store.workload_report(first, at + timedelta(minutes=2), kind="checkpoint",
                                   step=4200, path="/ckpt/4200")
    assert answer.recorded and answer.answered_notice
    report = controller.notices_once(at + timedelta(minutes=2, seconds=2))
    assert report.stopped == [cluster.job_name(first, 1)]
    assert report.notices_closed == [(first, "answered")]
    assert cluster.jobs[cluster.job_name(first, 1)].stop_kind is StopKind.PLANNED
    # released: the work up to the acknowledgement is kept, two seconds of 8 GPUs lost
    controller.reconcile_once(at + timedelta(minutes=3))
    unit = store.unit(first)
    assert unit.state is JobState.QUEUED
    assert unit.work_done_s == pytest.approx((at + timedelta(minutes=2) - T0).total_seconds())
    assert store.attempts(first)[0].lost_gpu_seconds == pytest.approx(8 * 2)
    # the other never answers: stopped at its deadline, losing what it did since its start
    report = controller.notices_once(at + NOTICE - timedelta(seconds=1))
    assert not report.stopped
    report = controller.notices_once(at + NOTICE)
    assert report.notices_closed == [(second, "missed")]
    (event,) = [e for e in store.events() if e.kind is EventKind.NOTICE and e.unit_id == first]
    assert event.detail["outcome"] == "answered" and event.detail["step"] == 4200
    # a blind stop at that moment would have lost the work since 20:00's last checkpoint
    assert event.detail["saved_gpu_seconds"] == pytest.approx(
        8 * (at + timedelta(minutes=2) - T0).total_seconds())
    counts = store.notice_counts()
    assert (counts["sent"], counts["answered"], counts["missed"], counts["open"]) == (2, 1, 1, 0)
    # the monthly report's figures, and the daemon's /metrics
    figures = notices_from_store(store, Month(2026, 1), "UTC")
    assert (figures["sent"], figures["answered"], figures["missed"]) == (2, 1, 1)
    assert figures["saved_gpu_hours"] == pytest.approx(event.detail["saved_gpu_seconds"] / 3600)
    daemon = Daemon(controller, clock=lambda: at + NOTICE)
    daemon._record(report, "notices")
    exported = generate_latest(daemon.metrics.registry).decode()
    assert 'idlegpu_checkpoint_notices_total{outcome="answered"} 1.0' in exported
    assert 'idlegpu_checkpoint_notices_total{outcome="sent"} 2.0' in exported
    # a report after the stop is late: recorded, and changes nothing
    late = store.workload_report(first, at + timedelta(minutes=4), kind="checkpoint",
                                 step=4300, attempt=1)
    assert late.late and not late.recorded
    assert store.unit(first).work_done_s == unit.work_done_s


def test_the_service_short_now_cuts_every_notice_short(pool):
    store, cluster, signals, make, free = pool()
    controller = make()
    running(store, cluster, controller, signals)
    at, _ = noticed(controller, signals, free, T0 + timedelta(minutes=2))
    signals.value = ServingSignals(observed_at=at + timedelta(seconds=15), gpus_short=4)
    report = controller.backstop_once(at + timedelta(seconds=15))
    assert sorted(outcome for _, outcome in report.notices_closed) == ["cut", "cut"]
    assert all(cluster.jobs[name].stop_kind is StopKind.PREEMPT for name in report.stopped)
    assert len(report.stopped) == 2


def test_a_restarted_daemon_goes_on_with_the_notices_under_way(pool):
    store, cluster, signals, make, free = pool()
    cluster.down = True  # the annotation cannot be written: recorded, delivered later
    controller = make()
    running(store, cluster, controller, signals)
    at, report = noticed(controller, signals, free, T0 + timedelta(minutes=2))
    assert report.errors and not cluster.notices
    assert all(n.delivered_at is None for n in store.open_notices())
    cluster.down = False
    restarted = make()  # a new process: what it knows of the notices is in the store
    signals.value = ServingSignals(observed_at=at + timedelta(minutes=1))
    report = restarted.reconcile_once(at + timedelta(minutes=1))
    assert not report.noticed and not report.stopped and len(cluster.notices) == 2
    # the deadline is the first notice's, not a new one from the restart
    assert all(deadline == at + NOTICE for _, deadline in cluster.notices)
    assert all(n.delivered_at is not None for n in store.open_notices())
    report = restarted.notices_once(at + NOTICE)
    assert sorted(o for _, o in report.notices_closed) == ["missed", "missed"]


def test_units_without_the_option_are_stopped_blind_as_before(pool):
    store, cluster, signals, make, free = pool(notice=False)
    controller = make()
    running(store, cluster, controller, signals)
    free["values"][6:] = 0.0
    for minute in range(2, 32):
        now = T0 + timedelta(minutes=minute)
        signals.value = ServingSignals(observed_at=now)
        report = controller.reconcile_once(now)
        if report.stopped:
            break
    assert report.stopped and not report.noticed and not cluster.notices
    assert store.notice_counts()["sent"] == 0


def test_a_notice_waits_for_a_unit_that_has_not_started(pool):
    store, _cluster, _signals, make, _free = pool()
    controller = make()
    controller.reconcile_once(T0)  # admitted, their pods not running yet
    row = store.queue()[0]
    assert row.state is JobState.ADMITTED and not controller._answers_notice(row)
    with pytest.raises(ValueError):
        store.workload_report(row.id, T0, kind="restart", step=1)
    assert store.send_notice(row.id, T0, T0 + NOTICE, "test").attempt == 1
    again = store.send_notice(row.id, T0 + timedelta(minutes=1), T0 + 2 * NOTICE, "again")
    assert again.deadline == T0 + NOTICE  # one notice per attempt: the first stands
    assert store.close_notice(again.attempt_id, T0, NoticeOutcome.ENDED)
    assert not store.close_notice(again.attempt_id, T0, NoticeOutcome.ENDED)


def test_a_planned_shrink_with_notice_shrinks_at_the_answer_keeping_the_work(tmp_path):
    from test_elastic_controller import ELASTIC

    store = JobStore(f"sqlite:///{tmp_path / 'elastic.db'}")
    body = {**ELASTIC, "checkpoint": {**ELASTIC["checkpoint"], "notice": True}}
    req = validate_request(body)
    store.submit(req.name, req.team, req.kind, body, expand_units(req), T0 - timedelta(hours=1))
    cluster, signals = NoticingCluster(), Signals()
    free = np.full(288, 16.0)
    controller = Controller(store, cluster, signals, lambda now: FreeProfile(
        T0, 300, free, 0.9, T0), lambda spec: spec.runtime_estimate_s,
        PolicySettings(grace_s=600), checkpoint_notice_s=NOTICE.total_seconds())
    (unit,) = [row.id for row in store.queue()]
    (name,) = controller.reconcile_once(T0).created
    cluster.set_phase(name, JobPhase.RUNNING, T0)
    controller.reconcile_once(T0 + timedelta(minutes=1))
    free[6:] = 6.0  # a ramp at +30 min: 6 GPUs free
    for minute in range(2, 30):
        now = T0 + timedelta(minutes=minute)
        signals.value = ServingSignals(observed_at=now)
        report = controller.reconcile_once(now)
        if report.noticed:
            break
    (d,) = [d for d in report.plan.decisions if d.job_id == unit]
    assert (d.action.value, d.gpus, d.planned) == ("shrink", 6, True)
    assert not report.stopped and store.unit(unit).shrink_to is None  # a notice first
    store.workload_report(unit, now + timedelta(minutes=1), kind="checkpoint", step=7,
                          path="/ckpt/7")
    report = controller.notices_once(now + timedelta(minutes=1, seconds=3))
    assert report.stopped == [name] and store.unit(unit).shrink_to == 6
    report = controller.reconcile_once(now + timedelta(minutes=2))
    assert report.shrunk == [unit] and report.created == [cluster.job_name(unit, 2)]
    one, two = store.attempts(unit)
    assert one.lost_gpu_seconds == pytest.approx(8 * 3)  # the acknowledgement to the stop
    assert two.gpus == 6
    assert store.unit(unit).work_done_s == pytest.approx(
        (now + timedelta(minutes=1) - T0).total_seconds())
    store.close()


def test_reports_in_a_loop_are_recorded_once_every_few_seconds_but_never_an_answer(pool):
    store, cluster, signals, make, _ = pool()
    running(store, cluster, make(), signals)
    unit = store.queue()[0].id
    at = T0 + timedelta(minutes=5)
    assert store.workload_report(unit, at, kind="progress", step=1).recorded
    held = store.workload_report(unit, at + timedelta(seconds=1), kind="progress", step=2)
    assert not held.recorded and held.retry_after_s == pytest.approx(4.0)
    assert store.workload_report(unit, at + timedelta(seconds=5), kind="progress", step=3).recorded
    assert store.workload_report(unit, at, kind="checkpoint", step=3, path="/a").recorded
    assert not store.workload_report(unit, at + timedelta(seconds=2), kind="checkpoint",
                                     step=4, path="/b").recorded
    # an answer to a notice is never held back
    store.send_notice(unit, at + timedelta(seconds=2), at + NOTICE, "ramp")
    answer = store.workload_report(unit, at + timedelta(seconds=3), kind="checkpoint", step=5,
                                   path="/c")
    assert answer.recorded and answer.answered_notice
    (report,) = store.workload_reports(unit)
    assert (report["progress"]["step"], report["checkpoint"]["step"]) == (3, 5)
