"""``simulate.lost_work``: the lost GPU-hours of a run table by cause, overrun, checkpointing
and the local hour of admission."""

import pandas as pd
import pytest

from idlegpu.scheduler.simulate import CAUSE_NAMES, lost_work


def runs(*rows):
    columns = ["start", "lost_gpu_hours", "cause", "overran", "checkpointable"]
    return pd.DataFrame([dict(zip(columns, row)) for row in rows])


def test_lost_work_by_every_view_in_the_pools_hours():
    table = runs(
        (pd.Timestamp("2025-01-09T09:30Z"), 6.0, "forecast", False, False),  # 17:30 Shanghai
        (pd.Timestamp("2025-01-09T10:10Z"), 2.0, "live", True, True),  # 18:10
        (pd.Timestamp("2025-01-09T09:00Z"), 2.0, "eviction", False, True),  # 17:00
        (pd.Timestamp("2025-01-09T01:00Z"), 0.0, "window", False, True),  # saved all: no loss
        (pd.Timestamp("2025-01-09T01:00Z"), 0.0, "", False, True),  # finished
    )
    got = lost_work(table, "Asia/Shanghai").set_index(["by", "value"])
    assert got.loc[("cause", CAUSE_NAMES["forecast"]), "lost_gpu_hours"] == 6.0
    assert got.loc[("cause", "backstop preemption"), "stops"] == 1
    assert got.loc[("cause", "scheduler eviction"), "share"] == pytest.approx(0.2)
    assert ("cause", "planned stop: window closed") not in got.index  # lost nothing
    assert got.loc[("overran", "past its planned runtime"), "lost_gpu_hours"] == 2.0
    assert got.loc[("checkpointable", "not checkpointable"), "share"] == pytest.approx(0.6)
    assert got.loc[("admission_hour", "17:00"), "lost_gpu_hours"] == 8.0
    assert got.loc[("admission_hour", "18:00"), "stops"] == 1
    for by in ("cause", "overran", "checkpointable", "admission_hour"):
        assert got.loc[by, "lost_gpu_hours"].sum() == 10.0


def test_nothing_lost_is_an_empty_table():
    assert lost_work(runs(), "UTC").empty
    none = lost_work(runs((pd.Timestamp("2025-01-09T01:00Z"), 0.0, "", False, True)), "UTC")
    assert none.empty and list(none.columns) == ["by", "value", "stops", "lost_gpu_hours",
                                                 "share"]
