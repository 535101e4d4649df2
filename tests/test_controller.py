"""reconcile_once() with a real SQLite store, an in-memory cluster and scripted signals."""

from dataclasses import replace
from datetime import UTC, datetime, timedelta

import numpy as np
import pytest

from idlegpu.forecast.errors import TemporaryError
from idlegpu.scheduler.adapters.store import JobStore
from idlegpu.scheduler.controller import Controller
from idlegpu.scheduler.ports import ClusterJob, JobPhase, StopKind
from idlegpu.scheduler.specs import expand_units, validate_request
from idlegpu.scheduler.types import (
    Action,
    FreeProfile,
    JobState,
    PolicySettings,
    ServingSignals,
)

T0 = datetime(2026, 1, 28, 11, 0, tzinfo=UTC)  # 20:00 in Seoul
H = timedelta(hours=1)


class MemoryCluster:
    """The Cluster port in memory: Jobs by name, with phases the test sets."""

    def __init__(self):
        self.jobs: dict[str, ClusterJob] = {}
        self.created: list[str] = []
        self.stops: list[tuple[str, str]] = []
        self.deleted: list[str] = []
        self.fail_apply = 0
        self.renewals: list[tuple[str, object]] = []
        self.fail_renew = 0
        self.pinned: dict[str, tuple[str, ...]] = {}  # Job name -> the nodes it is pinned to

    def job_name(self, unit_id, attempt):
        return f"idlegpu-{unit_id}-a{attempt}"

    def apply(self, unit_id, attempt, spec, *, team, stop_by, now, nodes=None):
        if self.fail_apply:
            self.fail_apply -= 1
            raise TemporaryError("the API server is unavailable (503)")
        name = self.job_name(unit_id, attempt)
        if nodes:
            self.pinned[name] = tuple(nodes)
        if name not in self.jobs:  # adopt an existing one, like a 409
            self.jobs[name] = ClusterJob(name, unit_id, attempt, JobPhase.PENDING, spec.gpus, now)
            self.created.append(name)
        return name

    def renew(self, name, *, stop_by):
        if self.fail_renew:
            self.fail_renew -= 1
            return False  # as the real one answers a Job written meanwhile (409)
        self.renewals.append((name, stop_by))
        return name in self.jobs

    def stop(self, name, *, reason, kind, now):
        self.stops.append((name, reason))
        if name in self.jobs:  # like the real one: the first stop's kind and time stand
            job = self.jobs[name]
            self.jobs[name] = replace(job, phase=JobPhase.SUSPENDED,
                                      stop_kind=job.stop_kind or kind,
                                      stopped_at=job.stopped_at or now)

    def delete(self, name):
        self.deleted.append(name)
        self.jobs.pop(name, None)

    def observe(self):
        return list(self.jobs.values())

    def set_phase(self, name, phase, at):
        job = self.jobs[name]
        self.jobs[name] = replace(
            job, phase=phase, started_at=at if phase is JobPhase.RUNNING else job.started_at,
            finished_at=at if phase.is_over() else None)


class Signals:
    def __init__(self):
        self.value = ServingSignals(observed_at=T0)
        self.job_gpus: list[int] = []
        self.last_problem = None

    def read(self, now, *, job_gpus=0):
        self.job_gpus.append(job_gpus)
        return self.value


REQUEST = {
    "name": "shards", "team": "data", "kind": "datagen",
    "image": "registry.example.com/research/vllm-datagen:0.6.3",
    "command": ["python", "generate.py"], "args": ["--shard", "{shard}"],
    "sweep": {"shard": [0, 1]}, "gpus": 8, "runtime_estimate": "2h",
    "output": "s3://runs/{team}/{name}/{shard}",
    "checkpoint": {"enabled": True, "interval": "30m", "resume_args": ["--resume"]},
}


@pytest.fixture
def setup(tmp_path):
    store = JobStore(f"sqlite:///{tmp_path / 'jobs.db'}")
    request = validate_request(REQUEST)
    store.submit(request.name, request.team, request.kind, REQUEST, expand_units(request),
                 T0 - timedelta(hours=1))
    cluster, signals = MemoryCluster(), Signals()
    free = {"values": np.full(288, 16.0)}

    def forecast(now):
        return FreeProfile(T0, 300, free["values"], 0.9, T0)

    controller = Controller(store, cluster, signals, forecast,
                            lambda spec: spec.runtime_estimate_s * 1.3, PolicySettings())
    yield store, cluster, signals, controller, free
    store.close()


def start_both(controller, cluster):
    """Both units admitted at T0 and running from T0 (recorded at T0 + 1 min)."""
    controller.reconcile_once(T0)
    for name in cluster.created:
        cluster.set_phase(name, JobPhase.RUNNING, T0)
    controller.reconcile_once(T0 + timedelta(minutes=1))


def states(store):
    return sorted(row.state.value for row in store.queue(include_terminal=True))


def test_admit_start_finish_with_gpu_seconds(setup):
    store, cluster, _, controller, _ = setup
    report = controller.reconcile_once(T0)
    assert len(report.created) == 2 and states(store) == ["admitted", "admitted"]
    for name in cluster.created:
        cluster.set_phase(name, JobPhase.RUNNING, T0 + timedelta(minutes=1))
    report = controller.reconcile_once(T0 + timedelta(minutes=1))
    assert len(report.started) == 2 and states(store) == ["running", "running"]
    for name in cluster.created:
        cluster.set_phase(name, JobPhase.SUCCEEDED, T0 + timedelta(hours=2))
    controller.reconcile_once(T0 + timedelta(hours=2, minutes=1))
    assert states(store) == ["succeeded", "succeeded"]
    finished = [e for e in store.events() if e.kind == "finished"]
    assert len(finished) == 2
    assert all(e.gpu_seconds == pytest.approx(8 * 2 * 3600, rel=0.01) for e in finished)
    assert len(cluster.created) == 2  # never a second Job


def test_a_crash_between_admission_and_job_creation_loses_nothing(setup):
    store, cluster, _, controller, _ = setup
    cluster.fail_apply = 2  # the API refuses both creations in this pass
    report = controller.reconcile_once(T0)
    assert states(store) == ["admitted", "admitted"] and not cluster.jobs
    assert len(report.errors) == 2
    report = controller.reconcile_once(T0 + timedelta(minutes=1))
    assert len(report.recreated) == 2 and len(cluster.jobs) == 2
    controller.reconcile_once(T0 + timedelta(minutes=2))
    assert len(cluster.created) == 2  # created exactly once each
    assert [row.attempts for row in store.queue()] == [1, 1]


def test_stale_signals_admit_nothing(setup):
    store, cluster, signals, controller, _ = setup
    signals.value = ServingSignals(observed_at=T0 - timedelta(minutes=5))
    report = controller.reconcile_once(T0)
    assert not cluster.jobs and states(store) == ["queued", "queued"]
    assert all("not admitting blind" in d.reason for d in report.plan.decisions)


def test_live_pressure_stops_a_job_and_the_unit_returns_to_the_queue(setup):
    store, cluster, signals, controller, _ = setup
    start_both(controller, cluster)
    signals.value = ServingSignals(observed_at=T0 + timedelta(minutes=2), gpus_short=4)
    report = controller.reconcile_once(T0 + timedelta(minutes=2))
    assert len(report.stopped) == 1  # one 8-GPU job covers the need of 4
    report = controller.reconcile_once(T0 + timedelta(minutes=3))
    assert len(report.released) == 1
    assert sorted(states(store)) == ["queued", "running"]
    preempted = next(row for row in store.queue() if row.state is JobState.QUEUED)
    assert preempted.preemptions == 1
    # its suspended Job is deleted once the store has recorded the end of the attempt
    assert report.deleted == [cluster.job_name(preempted.id, 1)]
    assert cluster.job_name(preempted.id, 1) not in cluster.jobs


def test_signals_are_read_net_of_the_gpus_our_jobs_hold(setup):
    _, _, signals, controller, _ = setup
    controller.reconcile_once(T0)
    controller.backstop_once(T0 + timedelta(seconds=15))
    assert signals.job_gpus == [0, 16]  # two admitted 8-GPU units hold 16 GPUs


def test_a_suspended_job_is_deleted_only_after_its_end_is_recorded(setup):
    store, cluster, _, controller, _ = setup
    controller.reconcile_once(T0)
    unit = store.queue()[0]
    name = cluster.job_name(unit.id, 1)
    cluster.set_phase(name, JobPhase.RUNNING, T0)
    controller.reconcile_once(T0 + timedelta(seconds=30))
    cluster.set_phase(name, JobPhase.SUSPENDED, T0 + timedelta(minutes=1))
    store_preempted = store.preempted

    def crash(*args, **kwargs):
        raise TemporaryError("database is locked")

    store.preempted = crash  # the release cannot be recorded: the Job must stay
    report = controller.reconcile_once(T0 + timedelta(minutes=1))
    assert name in cluster.jobs and not report.deleted
    store.preempted = store_preempted
    report = controller.reconcile_once(T0 + timedelta(minutes=2))
    assert report.released == [unit.id] and report.deleted == [name]


def test_a_cancelled_running_unit_is_stopped(setup):
    store, cluster, _, controller, _ = setup
    start_both(controller, cluster)
    unit = store.queue()[0].id
    store.cancel(unit, T0 + timedelta(minutes=2))
    report = controller.reconcile_once(T0 + timedelta(minutes=2))
    assert any(name.startswith(f"idlegpu-{unit}") for name, _ in cluster.stops)
    controller.reconcile_once(T0 + timedelta(minutes=3))
    assert store.unit(unit).state is JobState.CANCELLED
    del report


def test_dry_run_changes_nothing(setup):
    store, cluster, signals, _, free = setup
    dry = Controller(store, cluster, signals,
                     lambda now: FreeProfile(T0, 300, free["values"], 0.9, T0),
                     lambda spec: spec.runtime_estimate_s, PolicySettings(), dry_run=True)
    report = dry.reconcile_once(T0)
    assert len(report.created) == 2  # what would be created...
    assert states(store) == ["queued", "queued"]  # ...while the store is untouched
    assert [e.kind for e in store.events()] == ["submitted", "submitted"]


def test_missing_signals_age_from_the_last_good_reading_then_stop_every_job(setup):
    _, cluster, signals, controller, _ = setup
    controller.reconcile_once(T0)
    for name in cluster.created:
        cluster.set_phase(name, JobPhase.RUNNING, T0)
    controller.reconcile_once(T0 + timedelta(seconds=30))
    signals.value = ServingSignals(observed_at=None)  # the source goes down
    signals.last_problem = "prometheus at http://x is unreachable (connection refused)"
    report = controller.reconcile_once(T0 + timedelta(minutes=1))
    assert not report.stopped  # blind at once, but not yet given up
    assert "signals missing: prometheus at http://x is unreachable" in report.errors[0]
    assert report.signals.missing_since == T0  # since the last good reading
    report = controller.backstop_once(T0 + timedelta(minutes=5))
    assert not report.stopped
    report = controller.backstop_once(T0 + timedelta(minutes=16))
    assert len(report.stopped) == 2  # missing for more than 15 min: every job stops
    assert all("missing for 16 min" in d.reason for d in report.plan.decisions)


def test_a_restart_with_the_source_down_waits_before_giving_up(setup):
    store, cluster, signals, controller, _ = setup
    start_both(controller, cluster)
    signals.value = ServingSignals(observed_at=None)
    restarted = Controller(store, cluster, signals, controller.forecast,
                           lambda spec: spec.runtime_estimate_s * 1.3, PolicySettings())
    report = restarted.reconcile_once(T0 + timedelta(minutes=2))
    assert not report.stopped and not report.created
    assert report.signals.missing_since == T0 + timedelta(minutes=2)
    report = restarted.backstop_once(T0 + timedelta(minutes=18))
    assert len(report.stopped) == 2


def test_a_failed_read_blocks_admission_at_once(setup):
    store, cluster, signals, controller, _ = setup
    controller.backstop_once(T0)  # a good reading
    signals.value = ServingSignals(observed_at=None)
    report = controller.reconcile_once(T0 + timedelta(seconds=10))
    assert not cluster.jobs and states(store) == ["queued", "queued"]
    assert "live signals missing for 10 s; not admitting blind" in report.plan.decisions[0].reason


def test_a_unit_cancelled_between_reading_the_queue_and_admitting_it_is_skipped(setup):
    store, _, _, controller, _ = setup
    first, second = (row.id for row in store.queue())
    admit = store.admit

    def cancelled_meanwhile(unit_id, now, **kwargs):
        if unit_id == first:
            store.cancel(first, now)  # `idlegpu cancel` ran during the pass
        return admit(unit_id, now, **kwargs)

    store.admit = cancelled_meanwhile
    report = controller.reconcile_once(T0)
    assert report.errors and report.errors[0].startswith(f"{first}: not admitted")
    assert len(report.created) == 1  # the pass went on with the next decision
    assert store.unit(first).state is JobState.CANCELLED
    assert store.unit(second).state is JobState.ADMITTED


# --------------------------------------------------------------------------- stops on the Job


def new_controller(store, cluster, signals, forecast, **kw):
    """A fresh process on the same store and cluster (a restart, or the other replica)."""
    return Controller(store, cluster, signals, forecast,
                      lambda spec: spec.runtime_estimate_s * 1.3, PolicySettings(), **kw)


def test_a_planned_stop_seen_by_another_process_stays_planned(setup):
    store, cluster, signals, controller, _ = setup
    start_both(controller, cluster)
    unit = store.queue()[0]
    name = cluster.job_name(unit.id, 1)
    # stopped as planned by this process, which then dies before it sees the Job stopped
    cluster.stop(name, reason="window closes", kind=StopKind.PLANNED, now=T0 + 2 * H)
    other = new_controller(store, cluster, signals, controller.forecast)
    report = other.reconcile_once(T0 + 2 * H + timedelta(minutes=5))
    assert unit.id in report.released
    row = store.unit(unit.id)
    assert row.state is JobState.QUEUED and row.preemptions == 1
    # the work up to the stop is kept, not what ran on while the process was gone
    assert row.work_done_s == pytest.approx(2 * 3600)
    (attempt,) = store.attempts(unit.id)
    assert attempt.lost_gpu_seconds == 0.0


def test_a_live_preemption_counts_the_work_since_the_checkpoint_as_lost(setup):
    store, cluster, _signals, controller, _ = setup
    start_both(controller, cluster)
    unit = store.queue()[0]
    cluster.stop(cluster.job_name(unit.id, 1), reason="KV cache full", kind=StopKind.PREEMPT,
                 now=T0 + H)
    controller.reconcile_once(T0 + H + timedelta(minutes=1))
    (attempt,) = store.attempts(unit.id)
    assert attempt.lost_gpu_seconds > 0 and store.unit(unit.id).work_done_s == 0


def test_a_stopping_job_holds_its_gpus_and_is_never_recorded_started(setup):
    store, cluster, _signals, controller, _ = setup
    controller.reconcile_once(T0)  # both admitted, neither ran
    unit = store.queue()[0]
    name = cluster.job_name(unit.id, 1)
    cluster.stop(name, reason="window closes", kind=StopKind.PLANNED, now=T0 + H)
    cluster.set_phase(name, JobPhase.STOPPING, T0 + H)
    report = controller.reconcile_once(T0 + H + timedelta(minutes=1))
    assert unit.id not in report.started and store.unit(unit.id).state is JobState.ADMITTED
    assert not report.released and name in cluster.jobs
    assert report.signals is not None
    cluster.set_phase(name, JobPhase.SUSPENDED, T0 + H + timedelta(minutes=2))
    report = controller.reconcile_once(T0 + H + timedelta(minutes=3))
    assert unit.id in report.released and store.unit(unit.id).state is JobState.QUEUED
    assert [a.started_at for a in store.attempts(unit.id)] == [None]  # never ran
    assert name in report.deleted


def test_a_stop_whose_pods_never_end_is_released_after_the_timeout(setup):
    store, cluster, _signals, controller, _forecast = setup
    start_both(controller, cluster)
    unit = store.queue()[0]
    name = cluster.job_name(unit.id, 1)
    cluster.stop(name, reason="window closes", kind=StopKind.PLANNED, now=T0 + H)
    cluster.set_phase(name, JobPhase.STOPPING, T0 + H)  # its node died: pods stay Terminating
    report = controller.reconcile_once(T0 + H + timedelta(minutes=15))
    assert store.unit(unit.id).state is JobState.RUNNING and not report.released
    report = controller.reconcile_once(T0 + H + timedelta(minutes=21))  # 1200 s default
    assert unit.id in report.released and name in report.deleted
    assert store.unit(unit.id).state is JobState.QUEUED


def test_a_unit_no_node_can_place_fails_after_the_cap(setup):
    store, cluster, signals, controller, _ = setup
    controller = new_controller(store, cluster, signals, controller.forecast,
                                pending_timeout_s=900, max_unscheduled_attempts=3)
    now = T0
    unit = None
    for attempt in range(1, 4):
        signals.value = ServingSignals(observed_at=now)
        controller.reconcile_once(now)
        unit = unit or store.queue()[0].id
        assert store.unit(unit).attempts == attempt  # admitted again, pod never placed
        report = controller.reconcile_once(now + timedelta(minutes=16))
        assert cluster.job_name(unit, attempt) in report.stopped
        report = controller.reconcile_once(now + timedelta(minutes=17))
        now += timedelta(minutes=18)
        signals.value = ServingSignals(observed_at=now)
    row = store.unit(unit)
    assert row.state is JobState.FAILED
    assert "no node could place its pod in 3 attempts" in row.reason
    assert all(a.started_at is None for a in store.attempts(unit))
    assert unit in report.failed


def test_the_daemon_rechecks_each_unit_before_creating_its_job(setup):
    store, cluster, signals, controller, _ = setup
    from idlegpu.scheduler.specs import SpecError

    def refuse_datagen(row):
        if row.kind == "datagen":
            raise SpecError("the daemon's admission rules refuse it: image not allowed")

    controller = new_controller(store, cluster, signals, controller.forecast,
                                recheck=refuse_datagen)
    report = controller.reconcile_once(T0)
    assert not cluster.created and sorted(report.failed) == sorted(r.id for r in store.queue(
        include_terminal=True))
    assert all("the daemon's admission rules refuse it" in row.reason
               for row in store.queue(include_terminal=True))


def test_a_window_the_new_forecast_keeps_open_is_renewed_in_the_cluster_then_the_store(setup):
    """Admitted for an hour's window, the units are renewed when the forecast later keeps
    their GPUs free (not stopped and restarted): the Jobs' stops first, then the store; a
    Job the cluster does not renew keeps its stop in the store, and is renewed next pass."""
    store, cluster, signals, controller, free = setup
    free["values"] = np.array([16.0] * 12 + [0.0] * 276)  # an hour, then nothing
    start_both(controller, cluster)
    rows = store.queue()
    assert {row.stop_by for row in rows} == {T0 + timedelta(minutes=50)}
    free["values"] = np.full(288, 16.0)  # the next forecast: the night stays free
    now = T0 + timedelta(minutes=45)  # the last pass before their stop
    signals.value = ServingSignals(observed_at=now)
    cluster.fail_renew = 1
    report = controller.reconcile_once(now)
    assert not cluster.stops and not report.stopped
    renewed = {d.job_id for d in report.plan.decisions if d.action is Action.RENEW}
    assert renewed == {row.id for row in rows}
    assert len(cluster.renewals) == 1  # the other Job was written meanwhile
    assert sorted(row.stop_by is None for row in store.queue()) == [False, True]
    later = now + timedelta(minutes=5)
    signals.value = ServingSignals(observed_at=later)
    controller.reconcile_once(later)
    assert not cluster.stops and len(cluster.renewals) == 2
    assert all(row.stop_by is None and row.state is JobState.RUNNING for row in store.queue())
    assert [row.attempts for row in store.queue()] == [1, 1]
