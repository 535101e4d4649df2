"""``simulate.sweep`` and ``idlegpu simulate --sweep``: the forecast policy at each admission
confidence beside the reference policies (the frontier an operator picks a point from)."""

from datetime import timedelta
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from test_simulate import at, job, pool

from idlegpu.scheduler.simulate import (
    FRONTIER_METRICS,
    forecast_profiles_for,
    simulate,
    sweep,
)

REPO = Path(__file__).resolve().parents[1]


def noisy_pool():
    """``pool()`` with replicas that wander by day (so the quantiles differ)."""
    settings, history = pool()
    rng = np.random.default_rng(7)
    y = history["y"].to_numpy() + rng.integers(-1, 2, len(history)) * (history["y"] > 2)
    return settings, history.assign(y=y.astype(float))


def test_a_shared_forecast_cache_changes_no_profile_and_quantiles_order_them():
    settings, history = noisy_pool()
    index = pd.date_range(at(7, 0), at(9, 0), freq="15min", inclusive="left")
    shared: dict = {}
    profiles = {}
    for confidence in (0.5, 0.95):
        admission = settings.admission.model_copy(update={"confidence": confidence})
        at_c = settings.model_copy(update={"admission": admission})
        with_cache = forecast_profiles_for(history, at_c, index, 17, timedelta(hours=48),
                                           cache=shared)
        alone = forecast_profiles_for(history, at_c, index, 17, timedelta(hours=48))
        assert with_cache.keys() == alone.keys()
        for made in alone:
            np.testing.assert_array_equal(with_cache[made].free, alone[made].free)
        profiles[confidence] = alone
    for made in profiles[0.5]:  # the higher confidence never promises more
        assert np.all(profiles[0.95][made].free <= profiles[0.5][made].free + 1e-9)


def test_the_sweep_runs_the_forecast_at_each_confidence_beside_the_references():
    settings, history = noisy_pool()
    jobs = [job("eval", 16, 6, ckpt=False), job("train", 32, 20, ckpt=True)]
    frontier = sweep(history, settings, jobs, [0.9, 0.5], start=at(7, 0), end=at(10, 0))
    forecast = frontier[frontier["policy"] == "forecast"]
    assert list(forecast["confidence"]) == [0.5, 0.9]  # sorted
    assert set(frontier.loc[frontier["confidence"].isna(), "policy"]) == {
        "night", "reactive", "oracle", "clairvoyant"}
    assert list(frontier.columns) == ["policy", "confidence", *FRONTIER_METRICS]
    # each point is the policy's own run at that confidence
    admission = settings.admission.model_copy(update={"confidence": 0.9})
    alone = simulate(history, settings.model_copy(update={"admission": admission}), jobs,
                     "forecast", start=at(7, 0), end=at(10, 0)).metrics
    row = forecast[forecast["confidence"] == 0.9].iloc[0]
    assert row["useful_gpu_hours"] == pytest.approx(alone["useful_gpu_hours"])
    assert row["service_delay_gpu_minutes"] == pytest.approx(alone["service_delay_gpu_minutes"])
    bound = frontier.loc[frontier["policy"] == "clairvoyant", "useful_gpu_hours"].iloc[0]
    assert (frontier["useful_gpu_hours"] <= bound + 1e-6).all()


@pytest.mark.parametrize("bad", [[], [0.3], [1.0], [1.5]])
def test_the_sweep_refuses_what_is_no_confidence(bad):
    settings, history = pool()
    with pytest.raises(ValueError, match="confidence"):
        sweep(history, settings, [], bad, start=at(7, 0), end=at(8, 0), references={})


@pytest.mark.slow  # long (over 15 s): scripts/test.sh and CI run it, a plain pytest does not
def test_simulate_sweep_writes_the_frontier_table_and_chart(tmp_path, cli):
    code, out, err = cli(["simulate", "--history", str(REPO / "data/sample/history.parquet"),
                          "--jobs", str(REPO / "data/sample/jobs.yaml"),
                          "--runs", str(REPO / "data/sample/runs.csv"),
                          "--policies", "reactive,forecast", "--days", "3",
                          "--sweep", "0.95,0.6", "--out", str(tmp_path)])
    assert code == 0, err
    frontier = pd.read_csv(tmp_path / "frontier.csv")
    assert list(frontier.loc[frontier["policy"] == "forecast", "confidence"]) == [0.6, 0.95]
    # the references: those just run (reactive), and no others
    assert list(frontier.loc[frontier["confidence"].isna(), "policy"]) == ["reactive"]
    reactive = pd.read_csv(tmp_path / "policies.csv", index_col="policy").loc["reactive"]
    assert frontier.loc[frontier["policy"] == "reactive", "useful_gpu_hours"].iloc[0] == (
        pytest.approx(reactive["useful_gpu_hours"], rel=1e-6))
    assert (tmp_path / "frontier.png").stat().st_size > 10_000
    assert "Frontier" in out


@pytest.mark.parametrize("value, says", [("0.9,abc", "'abc' is not a number"),
                                         ("0.9,1.2", "not from 0.5 up to"),
                                         ("0.2", "not from 0.5 up to"),
                                         (",", "give 1 to 20 confidences")])
def test_simulate_sweep_names_a_bad_value(tmp_path, cli, value, says):
    code, _, err = cli(["simulate", "--history", str(REPO / "data/sample/history.parquet"),
                        "--jobs", str(REPO / "data/sample/jobs.yaml"), "--sweep", value,
                        "--out", str(tmp_path)])
    assert code == 2 and says in " ".join(err.split()) and "Traceback" not in err
