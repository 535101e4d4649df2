"""Recorded history served as live signals (``idlegpu run --history --now``)."""

from datetime import UTC, datetime, timedelta

import pandas as pd
import pytest

from idlegpu.scheduler.config import load_config
from idlegpu.scheduler.replay import HistorySignals

T0 = datetime(2026, 1, 28, 11, 0, tzinfo=UTC)


@pytest.fixture
def source():
    settings = load_config(data={
        "pool": {"total_gpus": 40, "headroom_gpus": 0},
        "query_templates": {"replicas": "r{s=\"$service\"}"},
        "services": [
            {"name": "chat", "gpus_per_replica": 4, "min_replicas": 1, "max_replicas": 6},
            {"name": "code", "gpus_per_replica": 2, "min_replicas": 1, "max_replicas": 3},
        ],
    })
    times = [T0 + timedelta(minutes=5 * i) for i in range(3)]
    rows = []
    for i, at in enumerate(times):
        rows += [("chat/replicas", at, 3.0 + i), ("chat/kv_cache_usage", at, 0.5 + 0.1 * i),
                 ("chat/requests_waiting", at, 6.0), ("code/replicas", at, 3.0),
                 ("code/kv_cache_usage", at, 0.99), ("code/requests_waiting", at, 90.0)]
    frame = pd.DataFrame(rows, columns=["unique_id", "ds", "y"])
    frame["ds"] = pd.to_datetime(frame["ds"], utc=True)
    return HistorySignals(frame, settings)


def test_a_sample_stands_for_its_step_then_shows_its_age(source):
    s = source.read(T0 + timedelta(minutes=7))
    assert s.observed_at == T0 + timedelta(minutes=7)  # within the 5-minute step of 11:05
    assert s.idle_gpus == 40 - 4 * 4 - 3 * 2
    # code is at its max replicas: its pressure cannot be helped by more GPUs
    assert s.kv_cache_usage == pytest.approx(0.6) and s.requests_waiting_per_replica == 1.5
    later = source.read(T0 + timedelta(minutes=17))  # 7 min after the last sample
    assert later.observed_at == T0 + timedelta(minutes=10)
    assert source.read(T0 + timedelta(minutes=21)).observed_at is None  # beyond max_age
    assert source.read(T0 - timedelta(minutes=1)).observed_at is None  # before the recording


def test_gpus_held_by_our_jobs_are_not_idle(source):
    assert source.read(T0, job_gpus=8).idle_gpus == 40 - 12 - 6 - 8
    assert source.read(T0, job_gpus=100).idle_gpus == 0


def test_a_profile_made_just_after_a_sample_covers_the_moment_it_was_made():
    from idlegpu.scheduler.replay import profile_of

    start = pd.Timestamp("2026-01-28T08:05:00Z")  # the forecast after a sample at 08:00
    free = pd.Series([12.0, 10.0, 8.0], index=pd.date_range(start, periods=3, freq="5min"))
    made = datetime(2026, 1, 28, 8, 0, 14, tzinfo=UTC)
    profile = profile_of(free, 0.9, made)
    assert profile.index_at(made) == 0 and profile.start == datetime(2026, 1, 28, 8, 0,
                                                                      tzinfo=UTC)
    assert list(profile.free) == [12.0, 12.0, 10.0, 8.0] and profile.made_at == made
    # made at or after its start: unchanged
    later = profile_of(free, 0.9, datetime(2026, 1, 28, 8, 6, tzinfo=UTC))
    assert later.start == start.to_pydatetime() and list(later.free) == [12.0, 10.0, 8.0]


def test_the_median_beside_a_profile_is_aligned_with_its_promise():
    from idlegpu.scheduler.replay import profile_of

    start = pd.Timestamp("2026-01-28T08:05:00Z")
    index = pd.date_range(start, periods=3, freq="5min")
    free = pd.Series([12.0, 10.0, 8.0], index=index)
    likely = pd.Series([20.0, 18.0, 16.0], index=index)
    early = profile_of(free, 0.9, datetime(2026, 1, 28, 8, 0, 14, tzinfo=UTC), likely)
    assert list(early.likely) == [20.0, 20.0, 18.0, 16.0] and len(early.free) == 4
    late = profile_of(free, 0.9, datetime(2026, 1, 28, 8, 11, tzinfo=UTC), likely)
    assert list(late.free) == [10.0, 8.0] and list(late.likely) == [18.0, 16.0]
    assert profile_of(free, 0.9, datetime(2026, 1, 28, 8, 6, tzinfo=UTC)).likely is None
