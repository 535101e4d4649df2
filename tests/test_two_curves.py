"""decide() on two curves (policy.py, "Two curves"): checkpointing units are planned on the
pool's median free GPUs (``FreeProfile.likely``), units that cannot checkpoint on the promise."""

from dataclasses import replace

import numpy as np
from test_policy import SETTINGS, flat, job, plan, run

from idlegpu.scheduler.types import Action

PROMISE_ONLY = replace(SETTINGS, checkpointable_on_likely=False)


def two_curves(promise_hours: float, likely_hours: float, gpus: int = 16, hours: float = 8):
    """``gpus`` free for ``promise_hours`` in the promise and ``likely_hours`` in the median,
    then nothing, over ``hours``."""
    promise = flat(gpus, promise_hours, then_hours=hours - promise_hours)
    steps = len(promise.free)
    likely = np.where(np.arange(steps) < likely_hours * 12, float(gpus), 0.0)
    return replace(promise, likely=np.maximum(likely, promise.free))


def test_a_checkpointing_unit_gets_the_median_window_and_a_whole_one_the_promise():
    prof = two_curves(promise_hours=2, likely_hours=6)
    got = {d.job_id: d for d in plan(prof, [job("ft", gpus=8, hours=5, ckpt=True,
                                                checkpoint_interval_s=1800),
                                            job("ev", gpus=8, hours=4)]).decisions}
    # the fine-tune runs its whole 5 h in the median's 6 h window: no stop planned
    assert got["ft"].action is Action.ADMIT and got["ft"].stop_by is None
    # the evaluation cannot checkpoint: the promise's 2 h is all it may count on
    assert got["ev"].action is Action.DEFER
    # with the promise only, the fine-tune gets a segment that ends before 2 h
    got = {d.job_id: d for d in plan(prof, [job("ft", gpus=8, hours=5, ckpt=True,
                                                checkpoint_interval_s=1800)],
                                     settings=PROMISE_ONLY).decisions}
    assert got["ft"].action is Action.ADMIT and got["ft"].stop_by is not None
    assert (got["ft"].stop_by - prof.start).total_seconds() <= 2 * 3600


def test_a_shortfall_only_the_promise_sees_does_not_stop_a_checkpointing_unit():
    # the promise falls short in 5 minutes, the median only in 3 hours
    prof = two_curves(promise_hours=5 / 60, likely_hours=3)
    running = [run("ft", gpus=16, since_ckpt_h=0.2)]
    assert plan(prof, running=running).decisions == ()
    got = {d.job_id: d for d in plan(prof, running=running, settings=PROMISE_ONLY).decisions}
    assert got["ft"].action is Action.PREEMPT and got["ft"].cause == "forecast"
    # a shortfall the median sees too stops it, as planned
    both = two_curves(promise_hours=5 / 60, likely_hours=5 / 60)
    (d,) = plan(both, running=running).decisions
    assert d.action is Action.PREEMPT and d.planned and d.cause == "forecast"


def test_without_a_median_every_unit_is_planned_on_the_promise():
    prof = flat(16, 2, then_hours=6)
    queue = [job("ft", gpus=8, hours=5, ckpt=True, checkpoint_interval_s=1800)]
    assert plan(prof, queue).decisions == plan(prof, queue, settings=PROMISE_ONLY).decisions
