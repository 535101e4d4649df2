"""Benchmark: the cost of ``auto``'s choice, against the forecaster it replaced, in one run.

    OMP_NUM_THREADS=1 python bench/auto_speed_bench.py [--services 50] [--days 56] [--sim-days 90]

Two figures, each for ``auto`` and for ``curve`` (the day-type curve model, which was ``auto``
until ``auto`` became a choice among candidates by backtest), measured in the same process,
one thread:

1. **Nightly refit of a pool**: ``--services`` replica series at a 5-minute step with
   ``--days`` of history (synthetic, ``idlegpu.forecast.synthetic``: the sample pool's four
   kinds of service with their own seeds and sizes), one fit and a 48-hour forecast of every
   series, best of three. Goal (issue 24): <= 5 s for 50 services and 56 days on 2 cores.
2. **The forecasts of a simulation**: ``forecast_profiles_for`` (the nightly refreshes of
   ``idlegpu simulate``'s forecast policy) over ``--sim-days`` of the bundled sample from
   2025-10-15, with the refits' shared cache. Goal: <= 4 s for 90 days.
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")

import argparse
import dataclasses
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import pandas as pd
from threadpoolctl import threadpool_limits

import record  # bench/record.py: --record writes the output into docs/bench/
from idlegpu.forecast.models import make_model
from idlegpu.forecast.sources import read_history
from idlegpu.forecast.synthetic import SAMPLE_POOL, generate_pool_history
from idlegpu.scheduler.config import load_config
from idlegpu.scheduler.simulate import forecast_profiles_for

MODELS = ("curve", "auto")
REFIT_GOAL_S = 5.0
SIMULATE_GOAL_S = 4.0


def pool_history(services: int, days: int) -> tuple[pd.DataFrame, dict]:
    """``services`` replica series of ``days`` days: the sample's kinds, sized and seeded
    apart."""
    frames, bounds = [], {}
    kinds = SAMPLE_POOL.services
    end = pd.Timestamp("2026-01-31")
    start = end - pd.Timedelta(days=days - 1)
    for n in range(services):
        kind = kinds[n % len(kinds)]
        scale = 1.0 + 0.25 * (n // len(kinds) % 5)
        service = dataclasses.replace(
            kind, name=f"{kind.name}{n:02d}", peak_replicas=kind.peak_replicas * scale,
            max_replicas=int(kind.max_replicas * scale) + 1)
        pool = dataclasses.replace(SAMPLE_POOL, services=(service,), start=f"{start:%Y-%m-%d}",
                                   end=f"{end:%Y-%m-%d}", gaps=())
        frame = generate_pool_history(pool, seed=1000 + n)
        frames.append(frame[frame["unique_id"] == f"{service.name}/replicas"])
        bounds[f"{service.name}/replicas"] = (float(service.min_replicas),
                                              float(service.max_replicas))
    return pd.concat(frames, ignore_index=True), bounds


def refit_seconds(name: str, history: pd.DataFrame, bounds: dict, repeats: int = 3) -> float:
    best = float("inf")
    for _ in range(repeats):
        began = time.perf_counter()
        make_model(name, timezone=SAMPLE_POOL.timezone, holiday_country="KR",
                   bounds=bounds).fit(history).predict("48h", [0.5, 0.9])
        best = min(best, time.perf_counter() - began)
    return best


def simulate_seconds(name: str, days: int) -> float:
    settings = load_config(REPO / "idlegpu.yaml")
    history = read_history(REPO / "data" / "sample" / "history.parquet")
    start = pd.Timestamp("2025-10-15T00:00:00+09:00").tz_convert("UTC")
    index = pd.date_range(start, start + pd.Timedelta(days=days), freq="5min", inclusive="left")
    began = time.perf_counter()
    forecast_profiles_for(history, settings, index, 17, pd.Timedelta(hours=48), model=name)
    return time.perf_counter() - began


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--services", type=int, default=50)
    parser.add_argument("--days", type=int, default=56)
    parser.add_argument("--sim-days", type=int, default=90)
    args = parser.parse_args()
    with threadpool_limits(1):
        print(f"generating {args.services} series x {args.days} days at 5 min...",
              file=sys.stderr)
        history, bounds = pool_history(args.services, args.days)
        refit = {name: refit_seconds(name, history, bounds) for name in MODELS}
        simulate = {name: simulate_seconds(name, args.sim_days) for name in MODELS}
    print(f"| {args.services} services x {args.days} d at 5 min | fit + 48 h forecast "
          f"(best of 3) | {args.sim_days}-day simulate's forecasts |")
    print("|---|---|---|")
    for name in MODELS:
        print(f"| {name} | {refit[name]:.2f} s | {simulate[name]:.2f} s |")
    print(f"| auto / curve | {refit['auto'] / refit['curve']:.2f}x | "
          f"{simulate['auto'] / simulate['curve']:.2f}x |")
    print(f"\nauto's refit {refit['auto']:.2f} s (goal <= {REFIT_GOAL_S} s): "
          f"{'met' if refit['auto'] <= REFIT_GOAL_S else 'MISSED'}; its simulate forecasts "
          f"{simulate['auto']:.2f} s (goal <= {SIMULATE_GOAL_S} s): "
          f"{'met' if simulate['auto'] <= SIMULATE_GOAL_S else 'MISSED'}")


if __name__ == "__main__":
    record.run("auto_speed", main)
