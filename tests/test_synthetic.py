"""The sample pool looks like the operator's pool, and regenerates exactly."""

from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from idlegpu.forecast.capacity import (
    hourly_idle_profile,
    idle_depth_summary,
    nightly_idle,
    pool_usage,
    typical_night,
)
from idlegpu.forecast.config import load_config
from idlegpu.forecast.schema import validate_history
from idlegpu.forecast.sources import read_history, write_history
from idlegpu.forecast.synthetic import SAMPLE_POOL, generate_pool_history

REPO = Path(__file__).resolve().parents[1]
COMMITTED = REPO / "data" / "sample" / "history.parquet"
TZ = "Asia/Seoul"


@pytest.fixture(scope="module")
def sample() -> pd.DataFrame:
    return generate_pool_history()


@pytest.fixture(scope="module")
def usage(sample) -> pd.DataFrame:
    return pool_usage(sample, load_config(REPO / "idlegpu.yaml"))


def test_committed_sample_equals_the_regenerated_one(sample, tmp_path):
    committed = read_history(COMMITTED)
    pd.testing.assert_frame_equal(committed, validate_history(sample))
    first = write_history(sample, tmp_path / "a.parquet").read_bytes()
    second = write_history(generate_pool_history(), tmp_path / "b.parquet").read_bytes()
    assert first == second  # byte-identical for the same seed and library versions
    assert first == COMMITTED.read_bytes()
    assert COMMITTED.stat().st_size < 10 * 2**20


def test_another_seed_gives_another_history(sample):
    other = generate_pool_history(replace(SAMPLE_POOL, end="2025-10-07"), seed=7)
    head = sample[sample["ds"] < other["ds"].max()]
    merged = head.merge(other, on=["unique_id", "ds"], suffixes=("", "_other"))
    assert not np.allclose(merged["y"], merged["y_other"])


def test_shape_of_the_history(sample):
    assert sample["unique_id"].nunique() == 4 * 6
    local = sample["ds"].dt.tz_convert(TZ)
    assert local.min() == pd.Timestamp("2025-10-01 00:00", tz=TZ)
    assert local.max() == pd.Timestamp("2026-01-31 23:55", tz=TZ)
    assert str(sample["ds"].dt.tz) == "UTC"
    steps = sample.groupby("unique_id")["ds"].diff().dropna()
    assert steps.min() == pd.Timedelta("5min")
    assert (steps > pd.Timedelta("5min")).sum() >= 3  # a few metric gaps
    replicas = sample[sample["unique_id"].str.endswith("/replicas")]
    assert (replicas["y"] == replicas["y"].round()).all()
    for service in SAMPLE_POOL.services:
        r = replicas[replicas["unique_id"] == f"{service.name}/replicas"]["y"]
        assert r.min() == service.min_replicas and r.max() <= service.max_replicas
    kv = sample[sample["unique_id"].str.endswith("/kv_cache_usage")]["y"]
    assert kv.between(0, 1).all()
    assert (sample[sample["unique_id"].str.contains("tokens")]["y"] >= 0).all()
    assert sum(s.gpus_per_replica == 4 for s in SAMPLE_POOL.services) >= 3


def test_about_fifty_gpus_idle_through_a_typical_night_and_little_by_day(usage):
    profile = hourly_idle_profile(usage, TZ)
    weekday_nights = profile.loc[["Mon", "Tue", "Wed", "Thu", "Fri"], [0, 1, 2, 3, 4, 5]]
    assert 44 <= weekday_nights.to_numpy().mean() <= 56
    weekday_days = profile.loc[["Mon", "Tue", "Wed", "Thu", "Fri"], [10, 11, 14, 15]]
    assert weekday_days.to_numpy().mean() < 12
    summary = idle_depth_summary(nightly_idle(usage, TZ), min_hours=10)
    assert 40 <= typical_night(summary, 10) <= 56  # ~48 GPUs for 10+ hours, like the report


def test_weekends_and_holidays_are_quiet(usage):
    local = usage["free"].tz_convert(TZ)
    midday = local[(local.index.hour >= 10) & (local.index.hour < 16)]
    by_day = midday.groupby(midday.index.date).mean()
    chuseok = by_day[pd.Timestamp("2025-10-06").date()]  # a Monday
    christmas = by_day[pd.Timestamp("2025-12-25").date()]  # a Thursday
    normal_monday = by_day[pd.Timestamp("2025-10-13").date()]
    assert chuseok > normal_monday + 25
    assert christmas > by_day[pd.Timestamp("2025-12-18").date()] + 25


def test_autoscaler_scales_up_fast_and_down_slowly(sample):
    chat = sample[sample["unique_id"] == "chat/replicas"].set_index("ds")["y"]
    chat = chat.asfreq("5min")
    change = chat.diff().dropna()
    assert change.max() >= 2  # scale-up jumps several replicas in one step
    # scale-down waits out the 30-minute window: a drop never follows a rise within 30 min
    rises = change.index[change > 0]
    drops = change.index[change < 0]
    gaps = [d - rises[rises < d].max() for d in drops if (rises < d).any()]
    assert min(gaps) >= pd.Timedelta("30min")


def test_spikes_happen_at_night_too(sample):
    chat = sample[sample["unique_id"] == "chat/replicas"].set_index("ds")["y"]
    local = chat.tz_convert(TZ)
    night = local[(local.index.hour >= 1) & (local.index.hour < 5)]
    assert (night > 5).sum() > 0  # an unplanned night-time scale-up the admitter must survive


def test_signals_follow_load(sample):
    wide = sample[sample["unique_id"].str.startswith("chat/")].pivot(
        index="ds", columns="unique_id", values="y"
    )
    corr = wide.corr()
    assert corr.loc["chat/replicas", "chat/prompt_tokens_per_s"] > 0.8
    assert corr.loc["chat/requests_running", "chat/prompt_tokens_per_s"] > 0.9
    busy = wide["chat/kv_cache_usage"] > 0.85
    assert wide.loc[busy, "chat/requests_waiting"].mean() > wide.loc[~busy, "chat/requests_waiting"].mean()
