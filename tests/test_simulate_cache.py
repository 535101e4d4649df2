"""The forecast policy's nightly profiles kept on disk (``simulate.cache``, ``idlegpu simulate
--forecast-cache``): read back for the same inputs only, and never trusted beyond plain arrays."""

from pathlib import Path

import numpy as np
import pandas as pd
from test_simulate import at, job, pool

from idlegpu.forecast.sources import read_history
from idlegpu.scheduler.config import load_config
from idlegpu.scheduler.simulate import forecast_profiles_for, simulate
from idlegpu.scheduler.simulate.cache import cached_forecast_profiles, load_profiles
from idlegpu.scheduler.simulate.timeline import simulated_steps

REPO = Path(__file__).resolve().parents[1]


def test_a_second_run_reads_the_same_profiles_and_simulates_the_same(tmp_path):
    settings, history = pool(days=14)
    start, end = at(9, 0), at(12, 0)
    made, path, read = cached_forecast_profiles(tmp_path, history, settings, start, end)
    assert not read and path.is_file() and len(made) >= 3
    again, same_path, read = cached_forecast_profiles(tmp_path, history, settings, start, end)
    assert read and same_path == path
    assert list(again) == list(made)
    for moment, profile in made.items():
        back = again[moment]
        assert (back.start, back.step_s, back.made_at) == (profile.start, profile.step_s,
                                                           profile.made_at)
        assert back.confidence == profile.confidence
        np.testing.assert_array_equal(back.free, profile.free)
        assert (back.likely is None) == (profile.likely is None)
        if profile.likely is not None:
            np.testing.assert_array_equal(back.likely, profile.likely)
    jobs = [job("train", 16, 20, ckpt=True, submit=(9, 18)), job("eval", 8, 3, ckpt=False)]
    fresh = simulate(history, settings, jobs, "forecast", start=start, end=end)
    cached = simulate(history, settings, jobs, "forecast", start=start, end=end,
                      forecast_profiles=again)
    assert cached.metrics == fresh.metrics
    pd.testing.assert_frame_equal(cached.runs, fresh.runs)


def test_other_inputs_make_another_file(tmp_path):
    settings, history = pool(days=14)
    start, end = at(9, 0), at(12, 0)
    _, path, _ = cached_forecast_profiles(tmp_path, history, settings, start, end)
    changed = history.copy()
    changed.loc[changed.index[100], "y"] += 1.0  # one reading a week before the span
    _, other, read = cached_forecast_profiles(tmp_path, changed, settings, start, end)
    assert other != path and not read
    admission = settings.admission.model_copy(update={"confidence": 0.5})
    wider = settings.model_copy(update={"admission": admission})
    _, third, read = cached_forecast_profiles(tmp_path, history, wider, start, end)
    assert third not in (path, other) and not read
    _, fourth, read = cached_forecast_profiles(tmp_path, history, settings, start, at(11, 0))
    assert fourth not in (path, other, third) and not read


class _Planted:
    """What a hostile cache file would unpickle: it leaves a mark when it is."""

    def __init__(self, mark: str) -> None:
        self.mark = mark

    def __reduce__(self):
        return (Path.touch, (Path(self.mark),))


def test_a_damaged_or_planted_file_is_made_again_never_unpickled(tmp_path):
    settings, history = pool(days=14)
    start, end = at(9, 0), at(12, 0)
    made, path, _ = cached_forecast_profiles(tmp_path, history, settings, start, end)
    mark = tmp_path / "unpickled"
    with path.open("wb") as out:  # an object array: only a pickle can read it
        np.savez(out, format=np.array("idlegpu-profiles-1"),
                 made=np.array([_Planted(str(mark))], dtype=object))
    assert load_profiles(path) is None and not mark.exists()
    again, _, read = cached_forecast_profiles(tmp_path, history, settings, start, end)
    assert not read and list(again) == list(made) and not mark.exists()
    path.write_bytes(b"not an archive")
    assert load_profiles(path) is None
    path.write_bytes(path.read_bytes()[:0])
    assert load_profiles(path) is None
    assert load_profiles(tmp_path / "missing.npz") is None


def test_simulate_reads_the_forecasts_it_kept(tmp_path, cli):
    cache = tmp_path / "cache"
    args = ["simulate", "--history", str(REPO / "data/sample/history.parquet"),
            "--jobs", str(REPO / "data/sample/jobs.yaml"),
            "--runs", str(REPO / "data/sample/runs.csv"), "--policies", "forecast",
            "--days", "3", "--workers", "2", "--forecast-cache", str(cache)]
    code, out, err = cli([*args, "--out", str(tmp_path / "first")])
    assert code == 0, err
    [kept] = list(cache.glob("*.npz"))
    assert f"forecasts kept in {kept}" in out.replace("\n", "")
    # what the first run's workers made, beside its policy, is what a fit makes on its own
    settings = load_config(REPO / "idlegpu.yaml")
    history = read_history(REPO / "data/sample/history.parquet")
    profiles = load_profiles(kept)
    assert profiles is not None
    first = min(profiles)  # the run's start: its first refresh
    index = simulated_steps(history, settings, first, first + pd.Timedelta(days=3))
    own = forecast_profiles_for(history, settings, index, 17, pd.Timedelta(hours=48))
    assert list(own) == list(profiles) and len(own) == 4
    for moment, profile in own.items():
        np.testing.assert_array_equal(profiles[moment].free, profile.free)
        np.testing.assert_array_equal(profiles[moment].likely, profile.likely)
    code, out, err = cli([*args, "--out", str(tmp_path / "second")])
    assert code == 0, err
    assert "forecasts read from" in out and len(list(cache.glob("*.npz"))) == 1
    first = pd.read_csv(tmp_path / "first" / "policies.csv", index_col="policy")
    second = pd.read_csv(tmp_path / "second" / "policies.csv", index_col="policy")
    pd.testing.assert_frame_equal(first, second)
    blocked = tmp_path / "a-file"
    blocked.write_text("")
    code, _, err = cli([*args[:-1], str(blocked / "cache"), "--out", str(tmp_path / "third")])
    assert code == 2 and "--forecast-cache" in err and "Traceback" not in err

