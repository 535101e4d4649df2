"""Pool view of forecasts and idle windows, on hand-made profiles."""

import numpy as np
import pandas as pd
import pytest

from idlegpu.forecast.capacity import forecast_pool_usage, idle_windows, windows_frame
from idlegpu.forecast.config import load_config
from idlegpu.forecast.errors import ConfigError

T0 = pd.Timestamp("2026-01-28T11:00Z")  # 20:00 in Seoul


def profile(values, step="1h"):
    return pd.Series(values, index=pd.date_range(T0, periods=len(values), freq=step), dtype=float)


def test_windows_at_every_granularity_with_exact_edges():
    free = profile([0, 4, 8, 8, 12, 8, 0, 8])
    found = idle_windows(free, confidence=0.9, granularity=4, min_hours=1)
    got = [(w.start, w.end, w.gpus, w.open_end) for w in found]
    h = pd.Timedelta("1h")
    assert got == [
        (T0 + h, T0 + 6 * h, 4, False),  # 4+ GPUs from 1h to 6h
        (T0 + 2 * h, T0 + 6 * h, 8, False),
        (T0 + 4 * h, T0 + 5 * h, 12, False),
        (T0 + 7 * h, T0 + 8 * h, 8, True),  # reaches the end of the forecast
        (T0 + 7 * h, T0 + 8 * h, 4, True),
    ]
    assert found[1].hours == 4 and found[1].gpu_hours == 32
    assert all(w.confidence == 0.9 for w in found)


def test_min_hours_and_granularity():
    free = profile([9, 9, 9, 5, 9], step="30min")
    found = idle_windows(free, confidence=0.95, granularity=3, min_hours=1.0)
    # 6+ and 9+ GPUs also from 02:00 to 02:30, too short to list
    assert [(w.gpus, w.hours) for w in found] == [(9, 1.5), (6, 1.5), (3, 2.5)]
    assert idle_windows(free, confidence=0.95, granularity=3, min_hours=3) == []


def test_a_gap_breaks_a_window():
    free = profile([8, 8, np.nan, 8, 8, 8])
    found = idle_windows(free, confidence=0.9, granularity=8, min_hours=1)
    assert [(w.start, w.hours) for w in found] == [(T0, 2.0), (T0 + pd.Timedelta("3h"), 3.0)]


def test_no_free_gpus_no_windows():
    assert idle_windows(profile([0, 0, 3]), confidence=0.9, granularity=4) == []
    with pytest.raises(ValueError, match="granularity"):
        idle_windows(profile([1, 2]), confidence=0.9, granularity=0)


def settings():
    return load_config(
        data={
            "pool": {"total_gpus": 40, "headroom_gpus": 4},
            "query_templates": {"replicas": "r"},
            "services": [
                {"name": "a", "gpus_per_replica": 4, "min_replicas": 1, "max_replicas": 8},
                {"name": "b", "gpus_per_replica": 2, "min_replicas": 1, "max_replicas": 8},
            ],
        }
    )


def forecast_rows():
    ds = pd.date_range(T0, periods=3, freq="1h")
    return pd.DataFrame(
        {
            "unique_id": ["a/replicas"] * 3 + ["b/replicas"] * 3,
            "ds": list(ds) * 2,
            "model": "auto",
            "q0.5": [1, 2, 3, 1, 1, 2],
            "q0.9": [2, 3, 8, 2, 1, 4],
        }
    )


def test_pool_usage_of_a_forecast_adds_service_quantiles():
    usage = forecast_pool_usage(forecast_rows(), settings(), 0.9)
    # q0.9: a 2,3,8 replicas x4 = 8,12,32; b 2,1,4 x2 = 4,2,8; capacity 36
    assert usage["in_use"].tolist() == [12, 14, 40]
    assert usage["free"].tolist() == [24, 22, 0]
    median = forecast_pool_usage(forecast_rows(), settings(), 0.5)
    assert median["free"].tolist() == [30, 26, 20]


def test_pool_usage_needs_the_quantile_and_every_service():
    with pytest.raises(ConfigError, match=r"no quantile 0.95 \(has q0.5, q0.9\)"):
        forecast_pool_usage(forecast_rows(), settings(), 0.95)
    rows = forecast_rows()
    with pytest.raises(ConfigError, match="no series b/replicas"):
        forecast_pool_usage(rows[rows["unique_id"] == "a/replicas"], settings(), 0.9)


def test_windows_table_is_in_local_time():
    found = idle_windows(profile([8, 8]), confidence=0.9, granularity=8)
    table = windows_frame(found, "Asia/Seoul")
    assert table.loc[0, "start"] == pd.Timestamp("2026-01-28 20:00", tz="Asia/Seoul")
    assert table.loc[0, "end"].hour == 22
    assert list(table.columns) == ["start", "end", "gpus", "hours", "gpu_hours", "confidence",
                                   "open_end"]
