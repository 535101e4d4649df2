"""Capacity-planning helpers (forecast/planning.py) on small hand-made histories."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from idlegpu.forecast.capacity import pool_usage
from idlegpu.forecast.errors import ConfigError
from idlegpu.forecast.planning import (
    RIGHTSIZING_COLUMNS,
    autoscaling_summary,
    night_demand,
    night_rightsizing,
    rightsized_history,
    service_replica_profile,
    what_if,
)
from idlegpu.scheduler.config import load_config


def settings(tz="UTC", a_min=3, b_min=2):
    return load_config(
        data={
            "pool": {"total_gpus": 40, "headroom_gpus": 2, "timezone": tz},
            "query_templates": {"replicas": "r{d='$service'}"},
            "services": [
                {"name": "a", "gpus_per_replica": 4, "min_replicas": a_min, "max_replicas": 6},
                {"name": "b", "gpus_per_replica": 1, "min_replicas": b_min, "max_replicas": 6},
            ],
        }
    )


HOURS = pd.date_range("2026-01-05 00:00", periods=24, freq="h", tz="UTC")  # one UTC day


def history(a_rep, a_kv, b_rep, b_kv=None, ds=HOURS):
    rows = [("a/replicas", t, v) for t, v in zip(ds, a_rep) if v is not None]
    rows += [("a/kv_cache_usage", t, v) for t, v in zip(ds, a_kv) if v is not None]
    rows += [("b/replicas", t, v) for t, v in zip(ds, b_rep) if v is not None]
    if b_kv is not None:
        rows += [("b/kv_cache_usage", t, v) for t, v in zip(ds, b_kv) if v is not None]
    return pd.DataFrame(rows, columns=["unique_id", "ds", "y"])


def night(hour: int) -> bool:
    return hour >= 22 or hour < 6


def test_rightsizing_reads_the_night_demand_from_kv_usage_by_hand():
    # a: 3 replicas all night (its floor) at 20 % KV usage -> 3 x 0.2 / 0.7 = 0.86 -> 1 needed;
    # by day 6 replicas at 90 %, which must not count.
    a_rep = [3 if night(h) else 6 for h in range(24)]
    a_kv = [0.2 if night(h) else 0.9 for h in range(24)]
    # b: 2 replicas (its floor), 49 % KV usage at night -> 2 x 0.49 / 0.7 = 1.4 -> 2 needed
    b_rep = [2] * 24
    b_kv = [0.49 if night(h) else 0.1 for h in range(24)]
    table = night_rightsizing(history(a_rep, a_kv, b_rep, b_kv), settings(), quantile=1.0)
    assert list(table.columns) == list(RIGHTSIZING_COLUMNS)
    a, b = table.set_index("service").loc["a"], table.set_index("service").loc["b"]
    assert (a["min_replicas"], a["needed_replicas"], a["suggested_night_min"]) == (3, 1, 1)
    assert a["gpus_freed"] == 8  # 2 replicas x 4 GPUs
    assert a["night_p50_replicas"] == 3 and a["night_share_at_min"] == 1.0
    assert (b["needed_replicas"], b["suggested_night_min"], b["gpus_freed"]) == (2, 2, 0)
    assert set(table["basis"]) == {"kv_cache_usage"}


def test_quantile_ignores_rare_spikes_and_floor_keeps_a_service_up():
    # 8 night steps; one spike to 100 % on 4 replicas. The 0.99 quantile sees it, the 0.5 does not
    a_rep = [4 if h == 2 else 3 for h in range(24)]
    a_kv = [1.0 if h == 2 else 0.0 for h in range(24)]
    h = history(a_rep, a_kv, [2] * 24, [0.0] * 24)
    high = night_rightsizing(h, settings(), quantile=0.99).set_index("service")
    low = night_rightsizing(h, settings(), quantile=0.5).set_index("service")
    # 0.99-quantile of [0 x7, 4/0.7=5.71] is about 5.4 -> 6 needed, capped at the floor 3
    assert high.loc["a", "needed_replicas"] == 6 and high.loc["a", "suggested_night_min"] == 3
    assert high.loc["a", "gpus_freed"] == 0
    # median demand is 0: the floor (1) keeps one replica
    assert low.loc["a", "needed_replicas"] == 1 and low.loc["a", "gpus_freed"] == 8
    assert low.loc["b", "suggested_night_min"] == 1 and low.loc["b", "gpus_freed"] == 1
    zero = night_rightsizing(h, settings(), quantile=0.5, floor=0).set_index("service")
    assert zero.loc["b", "suggested_night_min"] == 0 and zero.loc["b", "gpus_freed"] == 2


def test_night_hours_are_local_and_may_not_cross_midnight():
    # Seoul is UTC+9: local 22:00-06:00 is UTC 13:00-21:00
    demand = night_demand(history([3] * 24, [0.7] * 24, [2] * 24, [0.7] * 24),
                          settings("Asia/Seoul"))
    assert sorted(demand.index.hour) == list(range(13, 21))
    assert demand["a"].tolist() == pytest.approx([3.0] * 8)
    assert demand["b"].tolist() == pytest.approx([2.0] * 8)
    day = night_demand(history([3] * 24, [0.7] * 24, [2] * 24), settings(), night_hours=(1, 4))
    assert sorted(day.index.hour) == [1, 2, 3]
    assert day["b"].isna().all()  # b has no KV-cache series
    with pytest.raises(ValueError, match="night_hours"):
        night_demand(history([3] * 24, [0.7] * 24, [2] * 24), settings(), night_hours=(5, 5))


def test_without_kv_usage_the_observed_replicas_are_the_basis():
    b_rep = [3 if h == 23 else 2 for h in range(24)]
    table = night_rightsizing(history([3] * 24, [0.1] * 24, b_rep), settings(b_min=2),
                              quantile=1.0).set_index("service")
    assert table.loc["b", "basis"] == "replicas"
    # observed night replicas reach 3 > the floor 2: nothing to free
    assert table.loc["b", "needed_replicas"] == 3 and table.loc["b", "gpus_freed"] == 0
    assert table.loc["b", "night_share_at_min"] == pytest.approx(7 / 8)


def test_gaps_are_skipped_and_a_service_without_night_samples_frees_nothing():
    a_rep = [None if night(h) else 3 for h in range(24)]
    a_kv = [None if night(h) else 0.1 for h in range(24)]
    table = night_rightsizing(history(a_rep, a_kv, [2] * 24, [0.1] * 24), settings())
    a = table.set_index("service").loc["a"]
    assert math.isnan(a["needed_replicas"]) and math.isnan(a["gpus_freed"])
    assert table.set_index("service").loc["b", "gpus_freed"] == 1


def test_bad_parameters_are_refused():
    h = history([3] * 24, [0.1] * 24, [2] * 24, [0.1] * 24)
    with pytest.raises(ValueError, match="quantile"):
        night_rightsizing(h, settings(), quantile=0)
    with pytest.raises(ValueError, match="target_utilization"):
        night_rightsizing(h, settings(), target_utilization=1.5)
    with pytest.raises(ValueError, match="floor"):
        night_rightsizing(h, settings(), floor=-1)


def test_rightsized_history_lowers_night_replicas_to_the_new_floor_or_the_load():
    a_rep = [3 if night(h) else 6 for h in range(24)]
    # night load: 0.1 on 3 replicas -> 0.43 -> 1 replica; at 01:00 0.5 -> 2.14 -> 3 replicas
    a_kv = [0.5 if h == 1 else (0.1 if night(h) else 0.9) for h in range(24)]
    h = history(a_rep, a_kv, [2] * 24, [0.1] * 24)
    new = rightsized_history(h, settings(), {"a": 1})
    a = new[new["unique_id"] == "a/replicas"].set_index("ds")["y"]
    expected = [3 if h == 1 else (1 if night(h) else 6) for h in range(24)]
    assert a.tolist() == expected
    # other series and services untouched
    others = new["unique_id"] != "a/replicas"
    pd.testing.assert_frame_equal(new[others], h[others])
    # never above what really ran: a floor above the night's replicas changes nothing
    same = rightsized_history(h, settings(), {"a": 5})
    pd.testing.assert_frame_equal(same, h)
    # the pool view gains the freed GPUs at night: 2 replicas x 4 GPUs at 00:00
    before, after = pool_usage(h, settings()), pool_usage(new, settings())
    assert after.loc[HOURS[0], "free"] - before.loc[HOURS[0], "free"] == 8
    assert after.loc[HOURS[12], "free"] == before.loc[HOURS[12], "free"]


def test_rightsized_history_keeps_replicas_without_a_kv_sample_and_keeps_gaps():
    a_rep = [None if h == 0 else 3 for h in range(24)]
    a_kv = [0.1] * 24
    a_kv[2] = None
    h = history(a_rep, a_kv, [2] * 24, [0.1] * 24)
    new = rightsized_history(h, settings(), {"a": 1})
    a = new[new["unique_id"] == "a/replicas"].set_index("ds")["y"]
    assert HOURS[0] not in a.index  # the gap stays a gap
    assert a[HOURS[2]] == 3  # no load sample: no evidence it could shrink
    assert a[HOURS[3]] == 1
    with pytest.raises(ConfigError, match="unknown service"):
        rightsized_history(h, settings(), {"nope": 1})


def test_what_if_changes_fields_and_validates_like_the_config_file():
    base = settings()
    bigger = what_if(base, pool={"total_gpus": 96, "headroom_gpus": 4},
                     admission={"confidence": 0.8, "grace_seconds": 300},
                     min_replicas={"a": 1})
    assert (bigger.pool.total_gpus, bigger.pool.headroom_gpus) == (96, 4)
    assert bigger.admission.confidence == 0.8 and bigger.admission.grace_seconds == 300
    assert bigger.service("a").min_replicas == 1 and bigger.service("b").min_replicas == 2
    assert base.pool.total_gpus == 40 and base.service("a").min_replicas == 3  # unchanged
    assert what_if(base) == base
    with pytest.raises(ConfigError, match="headroom_gpus"):
        what_if(base, pool={"headroom_gpus": 40})
    with pytest.raises(ConfigError, match="unknown pool field"):
        what_if(base, pool={"gpus": 96})
    with pytest.raises(ConfigError, match="unknown service"):
        what_if(base, min_replicas={"nope": 1})
    with pytest.raises(ConfigError, match="min_replicas"):
        what_if(base, min_replicas={"a": 9})  # above max_replicas


def test_rightsizing_on_numbers_with_nan_kv_steps():
    # NaN KV samples inside the night are skipped, not read as zero load
    a_kv = [np.nan if h in (0, 1) else 0.7 for h in range(24)]
    table = night_rightsizing(history([3] * 24, a_kv, [2] * 24, [0.1] * 24), settings(),
                              quantile=0.0001).set_index("service")
    assert table.loc["a", "needed_replicas"] == 3


def test_service_replica_profile_by_hour_and_day_kind():
    # Fri 2026-01-02 (a working day), Sat 01-03, and Thu 01-01 (New Year, a holiday)
    ds = pd.date_range("2026-01-01", periods=72, freq="h", tz="UTC")
    a = [1 + (t.hour == 9) + 2 * (t.day == 2) for t in ds]
    h = history(a, [0.1] * 72, [2] * 72, ds=ds)
    usage = pool_usage(h, settings(a_min=1))
    table = service_replica_profile(usage, settings(a_min=1), {pd.Timestamp("2026-01-01").date(): "New Year"})
    assert list(table.columns.get_level_values("day").unique()) == ["working day", "weekend", "holiday"]
    assert table[("a", "working day")].tolist() == [3.0] * 9 + [4.0] + [3.0] * 14
    assert table[("a", "weekend")][9] == 2.0 and table[("a", "holiday")][0] == 1.0
    assert table[("b", "weekend")].eq(2.0).all()
    no_holidays = service_replica_profile(usage, settings(a_min=1))
    assert "holiday" not in no_holidays.columns.get_level_values("day")


def test_autoscaling_summary_counts_time_at_bounds_and_scaling_steps():
    a = [3] * 10 + [4, 5, 6, 6] + [3] * 10  # 3 ups, 1 down, 2 steps at max (6)
    h = history(a, [0.1] * 24, [2] * 12 + [None] * 2 + [3] * 10)
    table = autoscaling_summary(pool_usage(h, settings()), settings())
    a_row, b_row = table.loc["a"], table.loc["b"]
    assert a_row["share_at_min"] == pytest.approx(20 / 24)
    assert a_row["share_at_max"] == pytest.approx(2 / 24)
    assert a_row["scale_ups_per_day"] == pytest.approx(3.0)
    assert a_row["scale_downs_per_day"] == pytest.approx(1.0)
    assert a_row["gpu_hours_per_day"] == pytest.approx(sum(a) * 4 / 24 * 24)
    # b's 2 -> 3 happens across a gap: not a scaling step of the autoscaler
    assert b_row["scale_ups_per_day"] == 0.0
    assert b_row["share_at_min"] == pytest.approx(12 / 22)
