"""``simulate.simulate_policies``: the policies of one simulation in worker processes at once
(real processes: forkserver workers), with the same results as one after another."""

import pandas as pd
import pytest
from test_simulate import at, job, pool

from idlegpu.scheduler.simulate import simulate_policies

POLICIES = ["night", "reactive", "forecast", "oracle", "clairvoyant"]


def test_policies_in_two_processes_give_what_they_give_one_by_one_and_report_progress():
    settings, history = pool()
    jobs = [job("long", 16, 10, True), job("short", 8, 2, False, submit=(8, 21)),
            job("big", 32, 6, True, submit=(9, 19))]
    window = {"start": at(7, 0), "end": at(10, 0)}
    serial_seen, parallel_seen = [], []
    serial = simulate_policies(history, settings, jobs, POLICIES, workers=1,
                               on_progress=lambda *a: serial_seen.append(a), **window)
    parallel = simulate_policies(history, settings, jobs, POLICIES, workers=2,
                                 on_progress=lambda *a: parallel_seen.append(a), **window)
    assert list(parallel) == POLICIES == list(serial)  # in the order asked, not run
    for name in POLICIES:
        assert parallel[name].metrics == serial[name].metrics, name
        pd.testing.assert_frame_equal(parallel[name].runs, serial[name].runs)
        pd.testing.assert_frame_equal(parallel[name].delays, serial[name].delays)
    assert serial["forecast"].metrics["useful_gpu_hours"] > 0
    # every policy's steps reach their end in the caller's process; the forecast's refits too
    for seen in (serial_seen, parallel_seen):
        last = {(name, what): (done, total) for name, what, done, total in seen}
        assert {name for name, _ in last} == set(POLICIES)
        assert all(done == total for done, total in last.values())
        assert ("forecast", "refreshes") in last
    assert len(parallel_seen) <= 5 * 2 * 101  # at most every percent, not every step


def test_an_unknown_policy_is_refused_before_any_process_starts():
    settings, history = pool()
    with pytest.raises(ValueError, match="unknown policy 'psychic'; choose from night"):
        simulate_policies(history, settings, [], ["night", "psychic"], workers=2,
                          start=at(7, 0), end=at(8, 0))
