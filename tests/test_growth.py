"""Elastic units grow back: one admitted on fewer GPUs than it asks is stopped just after a
checkpoint to restart on more where they come free and stay free (``policy.growth``), in the
pure policy and in the simulator (through the controller: tests/test_elastic_controller.py)."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta

import numpy as np
import pandas as pd
import pytest
from test_elastic import TZ, at, sim_pool

from idlegpu.scheduler.policy import decide, policy_settings
from idlegpu.scheduler.simulate import SimJob, lost_work, simulate
from idlegpu.scheduler.types import (
    Action,
    FreeProfile,
    NodeState,
    NodeView,
    PolicySettings,
    RunningJob,
    ServingSignals,
    WaitingJob,
)

T0 = datetime(2026, 1, 28, 13, 0, tzinfo=UTC)  # 22:00 in Seoul
STEP = 300
H = 3600
SETTINGS = PolicySettings(grace_s=600, min_segment_s=1800, restart_cost_s=600)
FRESH = ServingSignals(observed_at=T0, requests_waiting_per_replica=0.0, kv_cache_usage=0.3)


def flat(gpus, hours, then=0, then_hours=2):
    values = [gpus] * int(hours * 12) + [then] * int(then_hours * 12)
    return FreeProfile(start=T0, step_s=STEP, free=np.asarray(values, dtype=float),
                       confidence=0.9, made_at=T0)


def elastic(id="sft", gpus=16, most=32, since_ckpt_min=2.0, hours_left=10.0, **over):
    """A unit that asks 32 GPUs (16 at least, by 8) running on ``gpus``, its last checkpoint
    ``since_ckpt_min`` ago (every 30 min), ``hours_left`` of work at its size."""
    fields = {"id": id, "team": "a", "gpus": gpus, "priority": 0,
              "started_at": T0 - timedelta(hours=3), "checkpointable": True,
              "remaining_s": hours_left * H,
              "last_checkpoint_at": T0 - timedelta(minutes=since_ckpt_min), "min_gpus": 16,
              "gpus_step": 8, "max_gpus": most, "checkpoint_interval_s": 1800.0}
    return RunningJob(**{**fields, **over})


def plan(profile, running, queue=(), settings=SETTINGS, now=T0, nodes=None):
    signals = replace(FRESH, observed_at=now)
    return decide(now, profile, list(running), list(queue), signals, {}, settings, nodes)


def growth(result):
    return [d for d in result.decisions if d.cause == "grow"]


def test_an_elastic_unit_on_fewer_gpus_stops_to_restart_on_more_that_stay_free():
    result = plan(flat(40, 6), [elastic()])
    (stop,) = result.decisions
    assert stop.action is Action.PREEMPT and stop.planned and stop.cause == "grow"
    assert "restart on 32 of its 32 GPUs" in stop.reason and "16 more GPUs" in stop.reason


def test_it_grows_by_whole_steps_as_far_as_stays_free():
    # 28 free, 16 held: 12 more, so one step of 8: 24 GPUs
    (stop,) = growth(plan(flat(28, 6), [elastic()]))
    assert "restart on 24 of its 32" in stop.reason
    # 20 free: 4 more, less than a step: it stays as it is
    assert plan(flat(20, 6), [elastic()]).decisions == ()


def test_no_growth_where_the_gpus_do_not_stay_free_or_the_work_ends_first():
    assert plan(flat(40, 1.5, then=16), [elastic()]).decisions == ()  # 1.5 h < 2 h
    assert plan(flat(40, 2.5, then=16), [elastic()]).decisions != ()  # 2.5 h
    # 1.5 h of work left on 16 GPUs is 45 min on 32: not worth a restart
    assert plan(flat(40, 6), [elastic(hours_left=1.5)]).decisions == ()
    longer = replace(SETTINGS, grow_window_s=4 * H)
    assert plan(flat(40, 3), [elastic()], settings=longer).decisions == ()


def test_a_unit_grows_only_just_after_a_checkpoint_of_its_attempt():
    assert plan(flat(40, 6), [elastic(since_ckpt_min=20)]).decisions == ()  # 20 min unsaved
    # reloading its checkpoint (its first one counts from the reload's end): not now
    reloading = elastic(last_checkpoint_at=T0 + timedelta(minutes=5))
    assert plan(flat(40, 6), [reloading]).decisions == ()
    # admitted a minute ago (no checkpoint of this attempt yet)
    young = elastic(started_at=T0 - timedelta(minutes=1), last_checkpoint_at=None)
    assert plan(flat(40, 6), [young]).decisions == ()
    # one that saves when stopped loses nothing whenever it stops
    saves = elastic(since_ckpt_min=20, saves_on_stop=True)
    assert growth(plan(flat(40, 6), [saves]))


def test_no_growth_off_elastic_past_its_deadline_with_a_stop_limit_or_switched_off():
    assert plan(flat(40, 6), [elastic(max_gpus=None)]).decisions == ()
    assert plan(flat(40, 6), [elastic(checkpointable=False)]).decisions == ()
    assert plan(flat(40, 6), [elastic(deadline=T0 - timedelta(minutes=1))]).decisions == ()
    # a stop to grow spends one of its stops: only with one more left for the service
    assert plan(flat(40, 6), [elastic(preemptions=1, max_preemptions=2)]).decisions == ()
    assert growth(plan(flat(40, 6), [elastic(preemptions=1, max_preemptions=3)]))
    assert growth(plan(flat(40, 6), [elastic(deadline=T0 + timedelta(days=1))]))
    off = replace(SETTINGS, grow_window_s=0.0)
    assert plan(flat(40, 6), [elastic()], settings=off).decisions == ()


def test_queued_units_take_the_free_gpus_before_a_unit_grows():
    waiting = WaitingJob(id="q", team="b", gpus=24, runtime_s=2 * H, checkpointable=False,
                         priority=0, submitted_at=T0 - timedelta(hours=1))
    result = plan(flat(40, 6), [elastic()], queue=[waiting])
    assert [(d.job_id, d.action) for d in result.decisions] == [("q", Action.ADMIT)]
    # with room for both: the queued unit first, the growth with what is left (8 of 24)
    (stop,) = growth(plan(flat(48, 6), [elastic()], queue=[waiting]))
    assert "restart on 24 of its 32" in stop.reason


def test_two_units_do_not_grow_into_the_same_gpus():
    a = elastic("a", started_at=T0 - timedelta(hours=5))
    b = elastic("b", last_checkpoint_at=T0 - timedelta(minutes=1))
    # 48 free, 32 held: 16 more, for the one running longer only
    (stop,) = growth(plan(flat(48, 6), [a, b]))
    assert stop.job_id == "a" and "restart on 32" in stop.reason


def test_the_stopped_unit_is_admitted_again_on_more_gpus():
    (stop,) = plan(flat(40, 6), [elastic()]).decisions
    # back in the queue as the controller and the simulator hold it: its whole ask
    queued = WaitingJob(id="sft", team="a", gpus=32, runtime_s=5 * H + 600,
                        checkpointable=True, priority=0, submitted_at=T0 - timedelta(hours=4),
                        min_gpus=16, gpus_step=8, checkpoint_interval_s=1800.0, reload_s=600)
    later = T0 + timedelta(minutes=10)  # its grace period over
    (admitted,) = plan(flat(40, 6), [], queue=[queued], now=later).decisions
    assert stop.cause == "grow" and admitted.action is Action.ADMIT and admitted.gpus == 32




# ----------------------------------------------------------------------------- simulator

def night_jobs():
    """On test_elastic's pool (40 GPUs, 32 free from 20:00 to 08:00): at 20:00 a 16-GPU evaluation (2 h, first in the queue) and a 32-GPU fine-tuning that
    runs on 16 to 32 by 8 (8 h of work on 32, a checkpoint an hour): the fine-tuning starts
    on the 16 the evaluation leaves, which come back at 22:00."""
    return [
        SimJob(id="a-eval", team="t", kind="eval", gpus=16, submit_at=at(7, 18),
               work_s=2 * H, estimate_s=2 * H, checkpointable=False),
        SimJob(id="b-sft", team="t", kind="sft", gpus=32, submit_at=at(7, 19),
               work_s=8 * H, estimate_s=8 * H, checkpointable=True, checkpoint_interval_s=H,
               min_gpus=16, gpus_step=8),
    ]


def test_the_simulator_grows_a_unit_when_gpus_come_free_and_it_finishes_sooner():
    settings, history = sim_pool()
    span = {"start": at(7, 12), "end": at(8, 12)}
    grown = simulate(history, settings, night_jobs(), "oracle", **span)
    runs = grown.runs[grown.runs["job_id"] == "b-sft"].sort_values("start")
    assert list(runs["gpus"]) == [16, 32]
    assert list(runs["cause"]) == ["grow", ""]
    assert runs.iloc[0]["start"] == pd.Timestamp(at(7, 20))
    assert runs.iloc[0]["end"] <= pd.Timestamp(at(7, 22)) + pd.Timedelta(minutes=15)
    # stopped just after its 22:00 checkpoint: it loses only the reload on 32 GPUs
    assert grown.metrics["lost_gpu_hours"] == pytest.approx(32 * 600 / H)
    assert grown.metrics["jobs_finished"] == 2
    breakdown = lost_work(grown.runs, TZ)
    assert "planned stop: to grow" not in set(breakdown.loc[breakdown["by"] == "cause", "value"])
    # without growth it runs on 16 all night and is still running at noon
    off = replace(policy_settings(settings.admission, 0, 40), grow_window_s=0.0)
    rigid = simulate(history, settings, night_jobs(), "oracle", policy_config=off, **span)
    assert set(rigid.runs.loc[rigid.runs["job_id"] == "b-sft", "gpus"]) <= {16}
    assert rigid.metrics["jobs_finished"] == 1
    assert grown.metrics["work_gpu_hours"] > rigid.metrics["work_gpu_hours"]


def on_nodes(*free_by_node):
    """32-GPU nodes n0, n1, ... with these many GPUs free."""
    return NodeView(tuple(NodeState(name=f"n{i}", gpus=32, gpus_requested=32 - free)
                          for i, free in enumerate(free_by_node)))


def test_on_nodes_the_larger_pod_must_fit_its_own_node_or_another():
    unit = elastic(nodes=("n0",))  # its 16 GPUs on n0
    # n0 has 16 more free: it restarts on 32 there
    (stop,) = growth(plan(flat(40, 6), [unit], nodes=on_nodes(16, 0)))
    assert "restart on 32" in stop.reason
    # 8 more on n0 and 12 on n1: 24 fits n0 (its own 16 back), 32 fits nowhere
    (stop,) = growth(plan(flat(40, 6), [unit], nodes=on_nodes(8, 12)))
    assert "restart on 24" in stop.reason
    # n0 full; n1 has 32 free: the restart fits n1 whole
    (stop,) = growth(plan(flat(40, 6), [unit], nodes=on_nodes(0, 32)))
    assert "restart on 32" in stop.reason
    # 4 more on each: the pool has 8 more, but no node holds a pod of 24
    assert growth(plan(flat(40, 6), [unit], nodes=on_nodes(4, 4))) == []
    # where its pod runs is not known: it does not grow on nodes
    assert growth(plan(flat(40, 6), [elastic()], nodes=on_nodes(16, 16))) == []


def test_on_nodes_two_units_do_not_count_on_the_same_node():
    a = elastic("a", nodes=("n0",), started_at=T0 - timedelta(hours=5))
    b = elastic("b", nodes=("n1",), last_checkpoint_at=T0 - timedelta(minutes=1))
    # 16 free on n2 only, and the pool 16 more: one of them may move there, not both
    nodes = NodeView((NodeState("n0", 16, gpus_requested=16), NodeState("n1", 16,
                      gpus_requested=16), NodeState("n2", 32, gpus_requested=0)))
    (stop,) = growth(plan(flat(64, 6), [a, b], nodes=nodes))
    assert stop.job_id == "a" and "restart on 32" in stop.reason


def test_the_config_switch_reaches_the_policy():
    settings, _ = sim_pool()
    assert policy_settings(settings.admission).grow_window_s == 7200
    off = settings.admission.model_copy(update={"grow_window_seconds": 0})
    assert policy_settings(off).grow_window_s == 0


def test_reactive_never_grows_a_unit():
    settings, history = sim_pool()
    result = simulate(history, settings, night_jobs(), "reactive", start=at(7, 12),
                      end=at(8, 12))
    assert "grow" not in set(result.runs["cause"])
