"""Benchmark: every forecaster on the sample pool, same rolling-origin cutoffs, one run.

    OMP_NUM_THREADS=1 python bench/forecast_bench.py [--days 28] [--horizons 24h,7d]
                                                     [--models auto,seasonal_naive,...]

For each horizon: daily cutoffs at 18:00 Asia/Seoul over the last ``--days`` days of
data/sample/history.parquet; every model is refitted at every cutoff on the past only and
forecasts the four services' replica counts. Printed per model: pinball loss at q0.9, MAE of
the median, coverage of q0.9 (share of actuals at or below it) and strict coverage (strictly
below: for integer replica counts a calibrated q0.9 has strict <= 0.9 <= coverage), idle-window
precision/recall at 90 % confidence, fit+predict seconds, and the ratios of ``auto`` to Prophet
and to seasonal-naive measured in the same run. A second table repeats the quantile metrics on
a continuous signal (KV-cache usage), where coverage can be compared with 0.9 directly.
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")

import argparse
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import pandas as pd
from threadpoolctl import threadpool_limits

import record  # bench/record.py: --record writes the output into docs/bench/
from idlegpu.forecast.backtest import backtest, daily_cutoffs, score, window_quality
from idlegpu.forecast.config import load_config
from idlegpu.forecast.models import MODEL_NAMES, model_for
from idlegpu.forecast.sources import read_history

QUANTILES = [0.5, 0.9, 0.95]


def run(history, settings, models, horizon, days, with_windows, horizon_label=""):
    cutoffs = daily_cutoffs(history, timezone=settings.pool.timezone, hour=18, days=days,
                            horizon=horizon)
    factories = {m: (lambda m=m: model_for(m, settings)) for m in models}
    done = [0]
    total = len(models) * len(cutoffs)

    def tick(name, cutoff):
        done[0] += 1
        print(f"\r  {horizon_label} {name:<15} {done[0]}/{total}", end="", file=sys.stderr, flush=True)

    result = backtest(history, factories, cutoffs=cutoffs, horizon=horizon,
                      quantiles=QUANTILES, on_step=tick)
    print(file=sys.stderr)
    table = score(result.forecasts, QUANTILES)
    table["fit_predict_s"] = pd.Series(result.seconds) / len(cutoffs)
    if with_windows:
        table = table.join(window_quality(result.forecasts, history, settings, 0.9))
    return table, len(cutoffs)


def report(table: pd.DataFrame, title: str, windows: bool) -> None:
    cols = ["pinball_0.9", "mae", "coverage_0.9", "strict_coverage_0.9", "fit_predict_s"]
    if windows:
        cols += ["precision", "recall"]
    print(f"\n### {title}\n")
    print("| model | " + " | ".join(cols) + " |")
    print("|---" * (len(cols) + 1) + "|")
    for model, row in table[cols].iterrows():
        cells = [f"{row[c]:.3f}" if c != "fit_predict_s" else f"{row[c]:.2f} s" for c in cols]
        print(f"| {model} | " + " | ".join(cells) + " |")
    if "auto" in table.index:
        for ref in ("prophet", "seasonal_naive", "statsmodels", "gbm"):
            if ref in table.index:
                pin = table.loc["auto", "pinball_0.9"] / table.loc[ref, "pinball_0.9"]
                sec = table.loc["auto", "fit_predict_s"] / table.loc[ref, "fit_predict_s"]
                print(f"\nauto / {ref}: pinball(q0.9) x{pin:.3f}, fit+predict time x{sec:.3f}",
                      end="")
        print()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--days", type=int, default=28, help="daily cutoffs over the last N days")
    parser.add_argument("--horizons", default="24h,7d")
    parser.add_argument("--models", default=",".join(MODEL_NAMES))
    parser.add_argument("--signal-days", type=int, default=14,
                        help="cutoffs for the continuous-signal table (0 skips it)")
    args = parser.parse_args()
    settings = load_config(REPO / "idlegpu.yaml")
    history = read_history(REPO / "data" / "sample" / "history.parquet")
    metric = history["unique_id"].str.rpartition("/")[2]
    replicas = history[metric == "replicas"]
    models = [m.strip() for m in args.models.split(",")]
    started = time.perf_counter()
    with threadpool_limits(1):
        for horizon in args.horizons.split(","):
            span = pd.Timedelta(horizon.replace("d", "D"))
            table, n = run(replicas, settings, models, span, args.days, True, horizon)
            report(table, f"replicas, horizon {horizon}, {n} daily cutoffs at 18:00", True)
        if args.signal_days:
            kv = history[metric == "kv_cache_usage"]
            table, n = run(kv, settings, models, pd.Timedelta("24h"), args.signal_days, False, "24h")
            report(table, f"KV-cache usage (continuous), horizon 24h, {n} cutoffs", False)
    print(f"\n(total {time.perf_counter() - started:.0f} s)")


if __name__ == "__main__":
    record.run("forecast", main)
