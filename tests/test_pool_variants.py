"""What-ifs on the pool's size and headroom reuse the refits (``pool_profiles_for``): the
profiles are exactly those of refitting each variant, and a variant that would forecast
otherwise (another confidence, other services) is refused rather than answered wrong."""

from __future__ import annotations

import pickle
from pathlib import Path

import pandas as pd
import pytest

from idlegpu.forecast.planning import what_if
from idlegpu.forecast.sources import read_history
from idlegpu.scheduler.config import load_config
from idlegpu.scheduler.refresh import same_forecasts
from idlegpu.scheduler.simulate import forecast_profiles_for, pool_profiles_for

REPO = Path(__file__).resolve().parents[1]
HORIZON = pd.Timedelta(hours=48)


@pytest.fixture(scope="module")
def sample():
    settings = load_config(REPO / "idlegpu.yaml")
    history = read_history(REPO / "data/sample/history.parquet")
    start = pd.Timestamp("2026-01-12T00:00:00+09:00").tz_convert("UTC")
    index = pd.date_range(start, start + pd.Timedelta(days=2), freq="5min", inclusive="left")
    return settings, history, index


def test_pool_variants_get_the_profiles_their_own_refits_would_give(sample):
    settings, history, index = sample
    pools = [what_if(settings, pool={"total_gpus": 80}),
             what_if(settings, pool={"headroom_gpus": 12})]
    base, smaller, wider = pool_profiles_for(history, settings, pools, index, 17, HORIZON)
    assert len(base) == 3  # the start and two evenings
    assert pickle.dumps(base) == pickle.dumps(
        forecast_profiles_for(history, settings, index, 17, HORIZON))
    for pool, got in ((pools[0], smaller), (pools[1], wider)):
        own = forecast_profiles_for(history, pool, index, 17, HORIZON)
        assert pickle.dumps(got) == pickle.dumps(own)
    # and they differ from the base where the pool's room differs
    first = next(iter(base))
    assert (smaller[first].free.sum() < base[first].free.sum()
            and wider[first].free.sum() < base[first].free.sum())


@pytest.mark.parametrize("change", [{"admission": {"confidence": 0.8}},
                                    {"pool": {"timezone": "UTC"}}])
def test_a_variant_that_forecasts_otherwise_is_refused(sample, change):
    settings, history, index = sample
    other = what_if(settings, **change)
    assert not same_forecasts(settings, other)
    with pytest.raises(ValueError, match=r"pools\[0\] changes more than the pool's size"):
        pool_profiles_for(history, settings, [other], index[:3], 17, HORIZON)
