"""Benchmark: the forecast and oracle policies with the pool as one bin and on 8-GPU nodes.

    OMP_NUM_THREADS=1 python bench/node_placement_bench.py [--days 90]

The sample pool (``idlegpu.yaml``: 88 GPUs) as 11 nodes of 8 GPUs (``pool.nodes``), the
sample trace (data/sample/jobs.yaml; its 24- and 32-GPU pretraining units become 3- and 4-node
gangs on nodes) and runtime estimates from data/sample/runs.csv, ``--days`` days from
2025-10-15. One table: useful, lost GPU-hours and service delay of ``forecast`` and ``oracle``
for ``pool`` (today's pool-level figures), ``spread`` (kube-scheduler's default
``LeastAllocated``), ``binpack`` (``MostAllocated``) and ``binpack`` with the
``pod-deletion-cost`` lever (scale-downs empty the least-used nodes). The forecast profiles are
fitted once and shared (they are of the pool, whatever the placement). Also: whether the oracle
bounds the forecast policy under each placement, and the wall time of each node run as a ratio
to the pool-level run of the same policy in this run (the node model's overhead).
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
from idlegpu.forecast.planning import what_if
from idlegpu.forecast.sources import read_history
from idlegpu.scheduler.config import load_config
from idlegpu.scheduler.runtime import RuntimeEstimator, load_runs
from idlegpu.scheduler.simulate import forecast_profiles_for, simulate, trace_jobs
from idlegpu.scheduler.specs import load_trace

VARIANTS = {  # label: (placement, deletion_cost)
    "pool": ("pool", False),
    "spread": ("spread", False),
    "binpack": ("binpack", False),
    "binpack + deletion cost": ("binpack", True),
}
METRICS = ("useful_gpu_hours", "lost_gpu_hours", "service_delay_gpu_minutes", "jobs_finished",
           "service_unplaced_gpu_hours", "gangs", "gangs_finished", "gang_queue_wait_hours")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--days", type=int, default=90)
    parser.add_argument("--start", default="2025-10-15T00:00:00+09:00")
    parser.add_argument("--node-gpus", type=int, default=8)
    args = parser.parse_args()
    base = load_config(REPO / "idlegpu.yaml")
    count, rest = divmod(base.pool.total_gpus, args.node_gpus)
    if rest:
        sys.exit(f"--node-gpus {args.node_gpus} does not divide the pool's "
                 f"{base.pool.total_gpus} GPUs")
    settings = what_if(base, pool={"nodes": [{"gpus": args.node_gpus, "count": count}]})
    history = read_history(REPO / "data" / "sample" / "history.parquet")
    estimator = RuntimeEstimator.from_config(load_runs(REPO / "data" / "sample" / "runs.csv"),
                                             settings.admission)
    entries = load_trace(REPO / "data" / "sample" / "jobs.yaml", settings.admission)
    jobs = trace_jobs(entries, lambda unit: estimator.estimate(unit).seconds)
    start = pd.Timestamp(args.start).tz_convert("UTC")
    end = start + pd.Timedelta(days=args.days)
    index = pd.date_range(start, end, freq="5min", inclusive="left")
    began = time.perf_counter()
    profiles = forecast_profiles_for(history, settings, index, 17, pd.Timedelta(hours=48))
    print(f"  forecasts: {time.perf_counter() - began:.1f} s", file=sys.stderr)
    rows, seconds = {}, {}
    for label, (placement, cost) in VARIANTS.items():
        for policy in ("forecast", "oracle"):
            began = time.perf_counter()
            result = simulate(history, settings, jobs, policy, start=start.to_pydatetime(),
                              end=end.to_pydatetime(), forecast_profiles=profiles,
                              placement=placement, deletion_cost=cost)
            seconds[(label, policy)] = time.perf_counter() - began
            rows[(label, policy)] = result.metrics
            print(f"  {label} / {policy}: {seconds[(label, policy)]:.1f} s", file=sys.stderr)
    print(f"\n### {args.days} days from {args.start}, {len(entries)} requests ({len(jobs)} "
          f"units), {count} nodes of {args.node_gpus} GPUs\n")
    print("| placement | policy | useful GPU-h | lost GPU-h | service delay GPU-min | "
          "finished | gangs finished | gang wait h | service unplaced GPU-h | wall s | "
          "wall / pool's |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for (label, policy), m in rows.items():
        ratio = seconds[(label, policy)] / seconds[("pool", policy)]
        unplaced = m.get("service_unplaced_gpu_hours")
        print(f"| {label} | {policy} | {m['useful_gpu_hours']:,.0f} | {m['lost_gpu_hours']:,.1f} "
              f"| {m['service_delay_gpu_minutes']:,.0f} | {m['jobs_finished']:.0f} | "
              f"{_gangs(m)} | "
              f"{'-' if unplaced is None else f'{unplaced:,.0f}'} | "
              f"{seconds[(label, policy)]:.1f} | {ratio:.2f} |")
    print("\n| placement | forecast / oracle useful | forecast / pool-level forecast useful | "
          "oracle bounds forecast |\n|---|---|---|---|")
    pool_forecast = rows[("pool", "forecast")]["useful_gpu_hours"]
    for label in VARIANTS:
        f, o = rows[(label, "forecast")], rows[(label, "oracle")]
        print(f"| {label} | {f['useful_gpu_hours'] / o['useful_gpu_hours']:.3f} | "
              f"{f['useful_gpu_hours'] / pool_forecast:.3f} | "
              f"{'yes' if o['useful_gpu_hours'] >= f['useful_gpu_hours'] else 'NO'} |")


def _gangs(metrics: dict[str, float]) -> str:
    """``finished of gangs | mean wait``, or dashes with the pool as one bin (no gangs)."""
    if "gangs" not in metrics:
        return "- | -"
    return (f"{metrics['gangs_finished']:.0f} of {metrics['gangs']:.0f} | "
            f"{metrics['gang_queue_wait_hours']:.1f}")


if __name__ == "__main__":
    record.run("node_placement", main)
