"""idlegpu forecast / windows / backtest on the sample and on other histories."""

from pathlib import Path

import pandas as pd
import pytest
from forecast_data import replica_history
from matplotlib.image import imread

REPO = Path(__file__).resolve().parents[1]
SAMPLE = str(REPO / "data" / "sample" / "history.parquet")
CONFIG = str(REPO / "idlegpu.yaml")
NOW = "2026-01-28T18:00:00+09:00"  # a Wednesday evening



def test_forecast_writes_quantile_columns_and_a_plot(tmp_path, cli):
    out, png = tmp_path / "f.csv", tmp_path / "f.png"
    code, stdout, err = cli(
        ["forecast", "--history", SAMPLE, "--config", CONFIG, "--horizon", "24h",
         "--quantiles", "0.5,0.9,0.95", "--metric", "replicas", "--now", NOW,
         "--out", str(out), "--plot", str(png)])
    assert code == 0, err
    frame = pd.read_csv(out, parse_dates=["ds"])
    assert list(frame.columns) == ["unique_id", "ds", "model", "q0.5", "q0.9", "q0.95",
                                   "served_by", "skill"]
    assert frame["unique_id"].nunique() == 4 and len(frame) == 4 * 288
    # auto names what served every series, in the file and on the screen
    assert frame["served_by"].notna().all() and frame["skill"].between(-5, 1).all()
    assert "What forecasts each series" in stdout and "summarize/replicas" in stdout
    assert frame["ds"].min() == pd.Timestamp(NOW) + pd.Timedelta("5min")
    assert (frame["q0.5"] <= frame["q0.9"]).all() and (frame["q0.9"] <= frame["q0.95"]).all()
    image = imread(png)
    assert image.shape[0] > 400 and image[..., :3].std() > 0.05


def test_forecast_any_step_without_config(tmp_path, cli, monkeypatch):
    monkeypatch.chdir(tmp_path)  # no ./idlegpu.yaml here: UTC, no holidays
    history = tmp_path / "h.csv"
    replica_history(days=10, step="1h").to_csv(history, index=False)
    out = tmp_path / "f.parquet"
    code, _, err = cli(["forecast", "--history", str(history), "--horizon", "2d",
                        "--quantiles", "0.5,0.9", "--model", "seasonal_naive",
                        "--out", str(out)])
    assert code == 0, err
    assert len(pd.read_parquet(out)) == 48


def test_tonights_windows_on_the_sample(tmp_path, cli):
    code, out, err = cli(["windows", "--history", SAMPLE, "--config", CONFIG, "--now", NOW,
                          "--out", str(tmp_path)])
    assert code == 0, err
    assert "Idle windows after Wed 2026-01-28 18:00" in out
    table = pd.read_csv(tmp_path / "windows.csv")
    deepest = table.loc[table["gpus"].idxmax()]
    assert 40 <= deepest["gpus"] <= 56 and deepest["hours"] >= 6  # the night, ~48 GPUs
    start = pd.Timestamp(deepest["start"])
    assert start.hour >= 19 or start.hour <= 1
    assert (table["gpus"] % 4 == 0).all()
    assert imread(tmp_path / "free_gpus.png")[..., :3].std() > 0.05


def test_backtest_table(tmp_path, cli):
    out = tmp_path / "bt.csv"
    code, stdout, err = cli(["backtest", "--history", SAMPLE, "--config", CONFIG, "--days", "3",
                             "--models", "auto,seasonal_naive", "--out", str(out)])
    assert code == 0, err
    table = pd.read_csv(out, index_col="model")
    assert set(table.index) == {"auto", "seasonal_naive"}
    for column in ("mae", "pinball_0.9", "coverage_0.9", "precision", "recall", "fit_predict_s"):
        assert table[column].notna().all(), column
    assert table.loc["auto", "points"] == 3 * 4 * 288
    assert "pinball_0.9" in stdout
    # per series: the q0.9 verdict, printed and in bt_series.csv
    series = pd.read_csv(tmp_path / "bt_series.csv")
    assert len(series) == 8 and set(series["model"]) == {"auto", "seasonal_naive"}
    assert (series["points"] == 3 * 288).all()
    assert set(series["verdict_0.9"]) <= {"calibrated", "over-covers", "under-covers"}
    ok = (series["strict_coverage_0.9"] <= 0.92) & (series["coverage_0.9"] >= 0.88)
    assert ((series["verdict_0.9"] == "calibrated") == ok).all()
    assert "Per series: q0.9 calibrated when" in stdout and "summarize/replicas" in stdout
    assert stdout.count("calibrated") + stdout.count("covers") >= 9  # title + 8 verdicts


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["forecast", "--history", SAMPLE, "--out", "x.csv", "--model", "arima"], "choose one of"),
        (["forecast", "--history", SAMPLE, "--out", "x.csv", "--quantiles", "0.5,1.2"],
         "strictly between 0 and 1"),
        (["forecast", "--history", SAMPLE, "--out", "x.csv", "--horizon", "soon"],
         "not understood"),
        (["windows", "--history", SAMPLE, "--config", CONFIG, "--now", "2020-01-01"],
         "nothing at or before --now"),
        (["backtest", "--history", SAMPLE, "--metric", "qps"], "no series of metric(s) qps"),
    ],
)
def test_bad_input_gets_one_clear_line(args, needle, cli, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code, _, err = cli(args)
    assert code == 2
    assert needle in " ".join(err.split())
    assert "Traceback" not in err
