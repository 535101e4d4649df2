"""The work left of a unit past its estimate (``Overruns.remaining_s``): the one rule the
simulator, the store (daemon, plan) and the policy's view of running jobs share."""

import numpy as np
import pandas as pd
import pytest
from hypothesis import given
from hypothesis import strategies as st
from test_simulate import at, job, pool

import idlegpu.scheduler.simulate.engine as sim  # its decide(), patched to spy on it
from idlegpu.scheduler.types import Overruns

E = 3600.0


def test_before_its_estimate_a_unit_has_what_the_estimate_leaves():
    assert Overruns().remaining_s(E, 0) == E
    assert Overruns.of([3.0] * 10).remaining_s(E, 0.25 * E) == 0.75 * E


def test_without_enough_overruns_it_runs_as_long_again_at_least_a_quarter_of_its_estimate():
    few = Overruns.of([2.0, 3.0])  # fewer than 5 beyond the unit's own ratio
    assert few.remaining_s(E, E) == 0.25 * E  # just at its estimate
    assert few.remaining_s(E, 1.1 * E) == pytest.approx(0.25 * E)
    assert few.remaining_s(E, 2 * E) == pytest.approx(E)  # 1 h over: another hour


def test_past_its_estimate_the_quantile_of_the_overruns_beyond_its_own():
    ratios = [0.5, 0.8, 0.9, 1.2, 1.4, 1.5, 1.6, 1.8, 2.0, 3.0]
    overruns = Overruns.of(ratios, quantile=0.9)
    beyond = [r for r in ratios if r > 1.1]  # 7 of them
    expected = (np.quantile(beyond, 0.9) - 1.1) * E
    assert overruns.remaining_s(E, 1.1 * E) == pytest.approx(expected)
    # further along, fewer of them are beyond it: back to the fallback
    assert overruns.remaining_s(E, 1.9 * E) == pytest.approx(0.9 * E)


def test_bad_ratios_are_ignored_and_the_ratios_stay_sorted():
    overruns = Overruns.of([float("nan"), -1.0, 0.0, 2.0, float("inf"), 1.5])
    assert overruns.ratios == (1.5, 2.0)
    assert overruns.with_ratio(1.7).ratios == (1.5, 1.7, 2.0)
    assert overruns.with_ratio(float("nan")) is overruns
    assert Overruns().remaining_s(0.0, 100.0) == 0.0


@given(ratios=st.lists(st.floats(0.05, 20), max_size=40), done=st.floats(0, 30 * E),
       estimate=st.floats(60, 10 * E))
def test_never_nothing_left_past_the_estimate(ratios, done, estimate):
    left = Overruns.of(ratios).remaining_s(estimate, done)
    assert left >= 0
    if done >= estimate:  # never "it ends within a step"
        assert left > 0
        assert Overruns().remaining_s(estimate, done) >= 0.25 * estimate


# ----------------------------------------------------------------------------- simulate


def seen_by_policy(monkeypatch, policy, jobs, days=(7, 9)):
    """Run the small simulated pool, recording what ``decide()`` saw of running jobs."""
    seen = []
    real = sim.decide

    def spy(now, profile, running, queue, signals, usage, settings):
        seen.extend((now, r) for r in running)
        return real(now, profile, running, queue, signals, usage, settings)

    monkeypatch.setattr(sim, "decide", spy)
    settings, history = pool()
    result = sim.simulate(history, settings, jobs, policy, start=at(days[0], 0),
                          end=at(days[1], 0))
    return result, seen


def test_the_simulator_plans_a_unit_past_its_estimate_to_run_on(monkeypatch):
    # estimated 2 h, really 5 h: from 2 h on the policy is told it runs on, not that it ends
    overrun = job("slow", 8, 5, ckpt=False)
    overrun = sim.SimJob(**{**overrun.__dict__, "estimate_s": 2 * 3600})
    result, seen = seen_by_policy(monkeypatch, "forecast", [overrun])
    assert result.metrics["jobs_finished"] == 1
    started = pd.Timestamp(result.runs["start"].iloc[0]).to_pydatetime()
    past = [(now, r) for now, r in seen if (now - started).total_seconds() >= 2 * 3600]
    assert past
    for now, r in past:
        ran = (now - started).total_seconds()
        assert r.remaining_s >= max(ran - 2 * 3600, 0.25 * 2 * 3600) - 1


def test_the_oracle_knows_every_runtime(monkeypatch):
    overrun = job("slow", 8, 5, ckpt=False)
    overrun = sim.SimJob(**{**overrun.__dict__, "estimate_s": 2 * 3600})
    result, seen = seen_by_policy(monkeypatch, "oracle", [overrun])
    started = pd.Timestamp(result.runs["start"].iloc[0]).to_pydatetime()
    for now, r in seen:
        truth = 5 * 3600 - (now - started).total_seconds()
        assert r.remaining_s == pytest.approx(max(300, truth))


def test_the_simulator_learns_the_overruns_online(monkeypatch):
    real = sim.Overruns.with_ratio
    learnt = []

    def record(self, ratio):
        learnt.append(ratio)
        return real(self, ratio)

    monkeypatch.setattr(sim.Overruns, "with_ratio", record)
    jobs = []
    for n in range(3):
        j = job(f"e{n}", 4, 3, ckpt=False)
        jobs.append(sim.SimJob(**{**j.__dict__, "estimate_s": 2 * 3600}))
    settings, history = pool()
    result = sim.simulate(history, settings, jobs, "forecast", start=at(7, 0), end=at(9, 0))
    assert result.metrics["jobs_finished"] == 3
    assert learnt == pytest.approx([1.5] * 3)


# ----------------------------------------------------------------------------- daemon


def test_the_daemon_learns_the_overruns_from_the_stores_finished_units(tmp_path):
    from datetime import timedelta

    from test_controller import REQUEST, T0, MemoryCluster, Signals

    from idlegpu.scheduler.adapters.store import JobStore
    from idlegpu.scheduler.controller import Controller
    from idlegpu.scheduler.ports import JobPhase
    from idlegpu.scheduler.specs import expand_units, validate_request
    from idlegpu.scheduler.types import FreeProfile, PolicySettings

    raw = {**REQUEST, "sweep": {"shard": list(range(8))}}
    request = validate_request(raw)
    with JobStore(f"sqlite:///{tmp_path / 'jobs.db'}") as store:
        store.submit(request.name, request.team, request.kind, raw, expand_units(request),
                     T0 - timedelta(days=1))
        units = [row.id for row in store.queue()]
        estimate_s = 2 * 3600 * 1.3
        for n, unit in enumerate(units[:6]):  # each ran twice its estimate
            began = T0 - timedelta(hours=20) + timedelta(minutes=n)
            store.admit(unit, began)
            store.started(unit, began)
            store.finished(unit, began + timedelta(seconds=2 * estimate_s))
        cluster = MemoryCluster()
        controller = Controller(
            store, cluster, Signals(), lambda now: FreeProfile(T0, 300, np.zeros(288), 0.9, T0),
            lambda spec: spec.runtime_estimate_s * 1.3, PolicySettings(), runtime_quantile=0.9)
        controller.reconcile_once(T0)
        assert controller._overrun_model().ratios == pytest.approx((2.0,) * 6)
        # a unit 3 h into its 2.6 h estimate: the others ran 2x theirs, so 2.2 h are left
        slow, began = units[6], T0 - timedelta(hours=4)
        store.admit(slow, began)
        store.started(slow, began)
        [running] = store.running(began + timedelta(hours=3), controller._estimate_row,
                                  controller._overrun_model())
        assert running.remaining_s == pytest.approx(2 * estimate_s - 3 * 3600)
        # it finishes (at 1.5x): the pass that sees it learns it
        name = cluster.apply(slow, 1, store.unit(slow).spec, team="data", stop_by=None,
                             now=began)
        cluster.set_phase(name, JobPhase.RUNNING, began)
        cluster.set_phase(name, JobPhase.SUCCEEDED, began + timedelta(seconds=1.5 * estimate_s))
        report = controller.reconcile_once(T0 + timedelta(minutes=1))
        assert report.finished == [slow]
        assert sorted(controller._overrun_model().ratios) == pytest.approx([1.5] + [2.0] * 6)


def test_the_daemon_sees_a_resumed_attempt_reload_its_checkpoint_first(tmp_path):
    # the store's view (queue_view), the one the controller and `plan` give the policy: the
    # same reload the simulator charges (admission.restart_cost_seconds)
    from datetime import timedelta

    from test_controller import REQUEST, T0

    from idlegpu.scheduler.adapters.store import JobStore
    from idlegpu.scheduler.queue_view import running_jobs, waiting_jobs
    from idlegpu.scheduler.specs import expand_units, validate_request

    request = validate_request(REQUEST)  # 2 h estimate, checkpoints every 30 min
    with JobStore(f"sqlite:///{tmp_path / 'jobs.db'}") as store:
        store.submit(request.name, request.team, request.kind, REQUEST, expand_units(request),
                     T0 - timedelta(days=1))
        unit = store.queue()[0].id
        began = T0 - timedelta(hours=3)
        store.admit(unit, began)
        store.started(unit, began)
        store.checkpointed(unit, began + timedelta(hours=1), 3600.0)
        store.preempted(unit, began + timedelta(hours=1, minutes=10))
        estimates = {unit: 7200.0}
        [fresh] = waiting_jobs([r for r in store.ready_units(T0) if r.id == unit], estimates)
        [queued] = waiting_jobs([r for r in store.ready_units(T0) if r.id == unit], estimates,
                                restart_cost_s=600)
        assert fresh.runtime_s == 3600 and queued.runtime_s == 3600 + 600  # work left + reload
        assert (fresh.reload_s, queued.reload_s) == (0.0, 600.0)
        store.admit(unit, T0)
        store.started(unit, T0)
        now = T0 + timedelta(minutes=5)
        [free] = running_jobs(store.holding(), now, estimates)
        [view] = running_jobs(store.holding(), now, estimates, restart_cost_s=600)
        # without the reload, 5 minutes of unsaved work and its checkpoint at 30 min
        assert free.unsaved_work_s(now) == 300
        assert free.next_checkpoint(now) == T0 + timedelta(minutes=30)
        # reloading: nothing to lose yet, its first checkpoint 30 min after the reload, and
        # the 5 minutes of reload left still ahead of its hour of work
        assert view.unsaved_work_s(now) == 0
        assert view.next_checkpoint(now) == T0 + timedelta(minutes=40)
        assert view.remaining_s == 3600 + 300
        later = T0 + timedelta(minutes=25)
        [view] = running_jobs(store.holding(), later, estimates, restart_cost_s=600)
        assert view.unsaved_work_s(later) == 15 * 60 and view.remaining_s == 3600 - 15 * 60
