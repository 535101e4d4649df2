"""Idle-GPU analysis checked against small cases computed by hand."""

import numpy as np
import pandas as pd
import pytest

from idlegpu.forecast.capacity import (
    daily_idle_gpu_hours,
    hourly_idle_profile,
    idle_depth_summary,
    longest_run,
    nightly_idle,
    pool_usage,
    typical_night,
)
from idlegpu.forecast.config import load_config
from idlegpu.forecast.errors import ConfigError, HistoryError


def settings(tz="UTC"):
    return load_config(
        data={
            "pool": {"total_gpus": 20, "headroom_gpus": 2, "timezone": tz},
            "query_templates": {"replicas": "r{d='$service'}"},
            "services": [
                {"name": "a", "gpus_per_replica": 4, "min_replicas": 1, "max_replicas": 4},
                {"name": "b", "gpus_per_replica": 1, "min_replicas": 1, "max_replicas": 4},
            ],
        }
    )


def history(ds, a, b):
    rows = [("a/replicas", t, v) for t, v in zip(ds, a) if v is not None]
    rows += [("b/replicas", t, v) for t, v in zip(ds, b) if v is not None]
    rows += [("a/kv_cache_usage", t, 0.5) for t in ds]  # other metrics are ignored
    return pd.DataFrame(rows, columns=["unique_id", "ds", "y"])


def test_usage_free_and_daily_hours_by_hand():
    ds = pd.date_range("2025-10-06", periods=6, freq="h", tz="UTC")
    usage = pool_usage(history(ds, [1, 2, 3, 4, 1, 1], [2, 2, 2, 2, 2, None]), settings())
    # in use = 4a + b; free = (20 - 2) - in use, never below zero; unknown at a gap
    assert usage["in_use"].tolist()[:5] == [6, 10, 14, 18, 6]
    assert usage["free"].tolist()[:5] == [12, 8, 4, 0, 12]
    assert np.isnan(usage["free"].iloc[5]) and np.isnan(usage["in_use"].iloc[5])
    assert usage["a"].tolist() == [4, 8, 12, 16, 4, 4]

    daily = daily_idle_gpu_hours(usage, "UTC")
    assert daily["idle_gpu_hours"].iloc[0] == 36  # 12 + 8 + 4 + 0 + 12, one hour each
    assert daily["observed"].iloc[0] == pytest.approx(5 / 6)
    assert daily["min_free"].iloc[0] == 0

    run = longest_run(usage["free"], 8, 1.0)
    assert (run.start, run.end, run.hours) == (ds[0], ds[2], 2.0)
    assert longest_run(usage["free"], 12, 1.0).start == ds[0]  # the first of equal runs
    assert longest_run(usage["free"], 16, 1.0) is None


def test_oversubscribed_pool_has_zero_free_not_negative():
    ds = pd.date_range("2025-10-06", periods=3, freq="h", tz="UTC")
    usage = pool_usage(history(ds, [4, 4, 4], [4, 4, 4]), settings())
    assert usage["in_use"].tolist() == [20, 20, 20]
    assert usage["free"].tolist() == [0, 0, 0]


def two_nights():
    """Local (Asia/Seoul) hours from Mon 2025-10-06 12:00 to Wed 2025-10-08 12:00.

    Service a runs 1 replica from 20:00 to 08:00 and 3 by day; b always 2. The second night
    has a spike to 4 replicas at 02:00. Free = 18 - 4a - 2: 12 at night, 4 by day, 0 at 02:00.
    """
    local = pd.date_range("2025-10-06 12:00", periods=48, freq="h", tz="Asia/Seoul")
    a = [1 if (h >= 20 or h < 8) else 3 for h in local.hour]
    spike = local.get_loc(pd.Timestamp("2025-10-08 02:00", tz="Asia/Seoul"))
    a[spike] = 4
    return local, history(local.tz_convert("UTC"), a, [2] * 48)


def test_nightly_idle_depth_and_duration_by_hand():
    local, hist = two_nights()
    usage = pool_usage(hist, settings("Asia/Seoul"))
    nights = nightly_idle(usage, "Asia/Seoul", levels=[4, 8, 12, 16])
    assert len(nights) == 8  # 2 complete nights x 4 levels
    got = nights.set_index(["night", "level"])["hours"]
    first, second = pd.Timestamp("2025-10-06"), pd.Timestamp("2025-10-07")
    assert got[first, 4] == 24 and got[first, 8] == 12 and got[first, 12] == 12
    assert got[second, 8] == 6  # 20:00-02:00 beats 03:00-08:00
    assert got[second, 4] == 14  # 12:00-02:00
    assert got[first, 16] == 0 and got[second, 16] == 0
    row = nights[(nights["night"] == second) & (nights["level"] == 8)].iloc[0]
    assert row["start"] == pd.Timestamp("2025-10-07 20:00", tz="Asia/Seoul")
    assert row["end"] == pd.Timestamp("2025-10-08 02:00", tz="Asia/Seoul")

    summary = idle_depth_summary(nights, min_hours=8)
    assert summary.loc[8, "median_hours"] == 9
    assert summary.loc[8, "p10_hours"] == pytest.approx(6.6)
    assert summary.loc[8, "share_nights_ge_8h"] == 0.5
    assert summary.loc[4, "share_nights_ge_8h"] == 1.0
    assert typical_night(summary, 8) == 12
    assert typical_night(summary, 20) == 0


def test_hourly_profile_uses_local_weekday_and_hour():
    _, hist = two_nights()
    profile = hourly_idle_profile(pool_usage(hist, settings("Asia/Seoul")), "Asia/Seoul")
    assert profile.shape == (7, 24)
    assert profile.loc["Tue", 2] == 12  # the first night, 02:00 local on Tuesday
    assert profile.loc["Wed", 2] == 0  # the spike
    assert profile.loc["Tue", 14] == 4  # daytime
    assert np.isnan(profile.loc["Sun", 3])  # never observed


def test_unknown_service_in_config_is_named():
    ds = pd.date_range("2025-10-06", periods=3, freq="h", tz="UTC")
    hist = history(ds, [1, 1, 1], [1, 1, 1])
    hist = hist[hist["unique_id"] != "b/replicas"]
    with pytest.raises(ConfigError, match=r"no series b/replicas .* services in the history: a"):
        pool_usage(hist, settings())


def test_off_grid_samples_are_refused():
    ds = pd.DatetimeIndex(
        ["2025-10-06 00:00", "2025-10-06 00:05", "2025-10-06 00:10", "2025-10-06 00:12"], tz="UTC"
    )
    with pytest.raises(HistoryError, match="off the 0 days 00:05:00 grid"):
        pool_usage(history(ds, [1, 1, 1, 1], [1, 1, 1, 1]), settings())
