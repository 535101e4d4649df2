"""Benchmark: the admission policies on the real-traffic pool, with gaps, a surge and overruns
each switched on alone.

    OMP_NUM_THREADS=1 python bench/real_pool_bench.py [--days 31] [--variants ...]

The pool of data/real/pool/ (four services driven by public traces of real traffic over the
same weeks of 2018; scripts/build_real_pool.py) and its job trace (the sample's, moved onto
that calendar), runtime estimates from data/sample/runs.csv, from Wednesday 2018-04-04 00:00
Los Angeles. Variants:

* ``recorded``: the traffic as recorded, no metrics gap, every unit runs exactly its estimate;
* ``gaps``: plus two metrics outages: ``checkout``'s replicas missing for 26 hours over a
  17:00 refit (Tuesday 2018-04-10 12:00 to Wednesday 14:00) and the whole pool's for 2.5 hours
  one night (Thursday 2018-04-19 01:00-03:30);
* ``surge``: plus a launch on ``storefront``: its traffic +20 % a day for three days from Monday
  2018-04-16 00:00, then held (x1.73);
* ``overruns``: plus the trace's true runtimes (units run longer or shorter than estimated);
* ``all``: all three;
* ``elastic``: ``all``, with every checkpointable unit of 8 GPUs or more elastic down to half
  its GPUs (``min_gpus = gpus / 2``): what shrinking and smaller admissions buy.

Prints per variant each policy's metrics and the goals of issue 12 (forecast useful / oracle
useful >= 0.95, lost / useful <= 0.02, service delay <= 0.1x reactive's), each a ratio
measured in the same run, and the wall time of each variant's forecasts.
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")

import argparse
import sys
import time
from dataclasses import replace
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "scripts"))

import build_real_pool as pool  # scripts/
import pandas as pd

from idlegpu.forecast.config import load_config
from idlegpu.scheduler.runtime import RuntimeEstimator, load_runs
from idlegpu.scheduler.simulate import forecast_profiles_for, simulate, trace_jobs
from idlegpu.scheduler.specs import load_trace

TZ = pool.TIMEZONE
START = pd.Timestamp("2018-04-04T00:00:00", tz=TZ)
GAPS = [
    ("checkout", pd.Timestamp("2018-04-10T12:00:00", tz=TZ), pd.Timedelta(hours=26)),
    (None, pd.Timestamp("2018-04-19T01:00:00", tz=TZ), pd.Timedelta(hours=2, minutes=30)),
]
SURGE = ("storefront", pd.Timestamp("2018-04-16T00:00:00", tz=TZ))
VARIANTS = {
    "recorded": (),
    "gaps": ("gaps",),
    "surge": ("surge",),
    "overruns": ("overruns",),
    "all": ("gaps", "surge", "overruns"),
    "elastic": ("gaps", "surge", "overruns", "elastic"),
}
POLICIES = ("night", "reactive", "forecast", "oracle")


def variant_inputs(switches, settings, entries, estimator):
    """The pool history and simulation jobs of one variant."""
    rates = pool.trace_rates()
    if "surge" in switches:
        rates = pool.surge_rates(rates, SURGE[0], SURGE[1].tz_convert("UTC"))
    history = pool.pool_history(rates)
    if "gaps" in switches:
        history = pool.with_gaps(history, [(s, t.tz_convert("UTC"), d) for s, t, d in GAPS])
    jobs = trace_jobs(entries, lambda unit: estimator.estimate(unit).seconds)
    if "overruns" not in switches:
        jobs = [replace(j, work_s=j.estimate_s) for j in jobs]
    if "elastic" in switches:
        jobs = [replace(j, min_gpus=j.gpus // 2) if j.checkpointable and j.gpus >= 8 else j
                for j in jobs]
    return history, jobs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--days", type=int, default=31)
    parser.add_argument("--variants", default=",".join(VARIANTS))
    args = parser.parse_args()
    settings = load_config(pool.POOL / "idlegpu.yaml")
    estimator = RuntimeEstimator.from_config(load_runs(REPO / "data" / "sample" / "runs.csv"),
                                             settings.admission)
    entries = load_trace(pool.POOL / "jobs.yaml", settings.admission)
    start = START.tz_convert("UTC")
    end = start + pd.Timedelta(days=args.days)
    index = pd.date_range(start, end, freq="5min", inclusive="left")
    goals = []
    for name in args.variants.split(","):
        history, jobs = variant_inputs(VARIANTS[name], settings, entries, estimator)
        began = time.perf_counter()
        profiles = forecast_profiles_for(history, settings, index, 17, pd.Timedelta(hours=48))
        seconds = time.perf_counter() - began
        rows = {}
        for policy in POLICIES:
            result = simulate(history, settings, jobs, policy, start=start.to_pydatetime(),
                              end=end.to_pydatetime(),
                              forecast_profiles=profiles if policy == "forecast" else None)
            rows[policy] = result.metrics
        table = pd.DataFrame(rows)
        print(f"\n== {name} ({len(jobs)} units, {args.days} days; forecasts {seconds:.1f} s)")
        print(table.to_string(float_format=lambda v: f"{v:,.1f}"))
        f, o, r = rows["forecast"], rows["oracle"], rows["reactive"]
        delay = (f["service_delay_gpu_minutes"] / r["service_delay_gpu_minutes"]
                 if r["service_delay_gpu_minutes"] else float("nan"))
        goals.append({
            "variant": name,
            "forecast / oracle useful (>= 0.95)": f["useful_gpu_hours"] / o["useful_gpu_hours"],
            "forecast lost / useful (<= 0.02)": f["lost_gpu_hours"] / f["useful_gpu_hours"],
            "forecast delay / reactive (<= 0.1)": delay,
            "forecast delay (GPU-min)": f["service_delay_gpu_minutes"],
            "reactive delay (GPU-min)": r["service_delay_gpu_minutes"],
            "oracle >= every policy": all(o["useful_gpu_hours"] >= v["useful_gpu_hours"]
                                          for v in rows.values()),
        })
    print("\n== goals")
    print(pd.DataFrame(goals).set_index("variant").to_string(float_format=lambda v: f"{v:.3f}"))


if __name__ == "__main__":
    main()
