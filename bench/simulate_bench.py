"""Benchmark: the admission policies (and the clairvoyant reference) on the sample pool and job
trace, one run.

    OMP_NUM_THREADS=1 python bench/simulate_bench.py [--days 90]

Simulates ``--days`` days from 2025-10-15 (two weeks of history before it feed the first
forecast) with data/sample/jobs.yaml and runtime estimates from data/sample/runs.csv. Prints
each policy's metrics (with the unobserved hours of the history and the physical limit), the
ratios the admission goals are stated in (forecast against reactive and night, all measured
in this run; whether the clairvoyant reference bounds every policy), and the wall time of the
forecast policy's whole simulation including its nightly forecasts.
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

import record  # bench/record.py: --record writes the output into docs/bench/
from idlegpu.forecast.sources import read_history
from idlegpu.scheduler.config import load_config
from idlegpu.scheduler.runtime import RuntimeEstimator, load_runs
from idlegpu.scheduler.simulate import (
    POLICIES,
    forecast_profiles_for,
    simulate,
    simulate_policies,
    trace_jobs,
)
from idlegpu.scheduler.specs import load_trace


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--days", type=int, default=90)
    parser.add_argument("--start", default="2025-10-15T00:00:00+09:00")
    parser.add_argument("--workers", type=int, default=2,
                        help="processes for the four policies at once (simulate_policies)")
    args = parser.parse_args()
    settings = load_config(REPO / "idlegpu.yaml")
    history = read_history(REPO / "data" / "sample" / "history.parquet")
    estimator = RuntimeEstimator.from_config(load_runs(REPO / "data" / "sample" / "runs.csv"),
                                             settings.admission)
    entries = load_trace(REPO / "data" / "sample" / "jobs.yaml", settings.admission)
    jobs = trace_jobs(entries, lambda unit: estimator.estimate(unit).seconds)
    start = pd.Timestamp(args.start).tz_convert("UTC")
    end = start + pd.Timedelta(days=args.days)
    index = pd.date_range(start, end, freq="5min", inclusive="left")
    rows, seconds = {}, {}
    forecast_profiles = None
    for policy in POLICIES:
        began = time.perf_counter()
        profiles = None
        if policy == "forecast":
            profiles = forecast_profiles_for(history, settings, index, 17, pd.Timedelta(hours=48))
            seconds["forecasts"] = time.perf_counter() - began
            forecast_profiles = profiles
        result = simulate(history, settings, jobs, policy, start=start.to_pydatetime(),
                          end=end.to_pydatetime(), forecast_profiles=profiles)
        seconds[policy] = time.perf_counter() - began
        rows[policy] = result.metrics
        print(f"  {policy}: {seconds[policy]:.1f} s", file=sys.stderr)
    four_names = ["night", "reactive", "forecast", "oracle"]
    began = time.perf_counter()
    together = simulate_policies(history, settings, jobs, four_names, workers=args.workers,
                                 start=start.to_pydatetime(), end=end.to_pydatetime())
    seconds["together"] = time.perf_counter() - began
    assert all(together[p].metrics == rows[p] for p in four_names), "workers changed a result"
    print(f"  the four in {args.workers} processes: {seconds['together']:.1f} s", file=sys.stderr)
    began = time.perf_counter()
    kept = simulate_policies(history, settings, jobs, four_names, workers=args.workers,
                             start=start.to_pydatetime(), end=end.to_pydatetime(),
                             forecast_profiles=forecast_profiles)
    seconds["kept"] = time.perf_counter() - began
    assert all(kept[p].metrics == rows[p] for p in four_names), "kept forecasts changed a result"
    print(f"  the four on kept forecasts: {seconds['kept']:.1f} s", file=sys.stderr)
    table = pd.DataFrame(rows)
    print(f"\n### {args.days} days from {args.start}, {len(entries)} requests ({len(jobs)} units)\n")
    print("| metric | " + " | ".join(table.columns) + " |")
    print("|---" * (len(table.columns) + 1) + "|")
    for metric, row in table.iterrows():
        print(f"| {metric} | " + " | ".join(f"{v:,.1f}" if abs(v) >= 10 else f"{v:.3f}"
                                            for v in row) + " |")
    f, c, r, n = (rows[p] for p in ("forecast", "clairvoyant", "reactive", "night"))
    useful = f["useful_gpu_hours"]

    def ratio(a: float, b: float) -> str:
        return f"{a / b:.3f}" if b else f"{a:,.0f} / 0"

    print("\n| goal | measured | target |\n|---|---|---|")
    print(f"| forecast useful / reactive useful | {ratio(useful, r['useful_gpu_hours'])} | >= 1.0 |")
    print(f"| forecast lost / reactive lost | {ratio(f['lost_gpu_hours'], r['lost_gpu_hours'])} "
          "| <= 0.5 |")
    print(f"| forecast lost / useful | {f['lost_gpu_hours'] / useful:.4f} | <= 0.02 |")
    print(f"| forecast service delay / reactive's | "
          f"{ratio(f['service_delay_gpu_minutes'], r['service_delay_gpu_minutes'])} | <= 0.1 |")
    print(f"| forecast useful / night useful | {useful / n['useful_gpu_hours']:.3f} | |")
    for figure in ("useful_gpu_hours", "work_gpu_hours"):
        best = max(rows, key=lambda p, f=figure: (rows[p][f], p == "clairvoyant"))
        print(f"| clairvoyant {figure} >= every other policy's | "
              f"{'yes' if best == 'clairvoyant' else 'no: ' + best} | yes |")
    print(f"| clairvoyant useful / physical limit (GPU-hours the trace could use at all) | "
          f"{c['useful_gpu_hours'] / c['physical_limit_gpu_hours']:.3f} | <= 1 |")
    four = sum(seconds[p] for p in ("night", "reactive", "forecast", "oracle"))
    print(f"| wall time of night, reactive, forecast and oracle, {args.days} days, with the "
          f"forecast's {len(index) // 288} nightly forecasts | {four:.1f} s (forecasts "
          f"{seconds['forecasts']:.1f} s; the forecast policy {seconds['forecast']:.1f} s, "
          f"night alone {seconds['night']:.1f} s; clairvoyant {seconds['clairvoyant']:.1f} s) "
          "| <= 10 s |")
    print(f"| the same four at once in {args.workers} processes (`simulate_policies`, as "
          f"`idlegpu simulate` runs them) | {seconds['together']:.1f} s "
          f"({four / seconds['together']:.2f}x faster than one by one) | <= 10 s |")
    print(f"| the same four in {args.workers} processes on forecasts an earlier run kept "
          f"(`--forecast-cache`'s later runs) | {seconds['kept']:.1f} s | <= 10 s |")

if __name__ == "__main__":
    record.run("simulate", main)
