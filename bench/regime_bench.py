"""Benchmark: how forecasters follow a regime change (a launch), against the same pool stable.

    OMP_NUM_THREADS=1 python bench/regime_bench.py [--models auto,auto_static] [--days 5] [--hourly]

Three synthetic pools from ``idlegpu.forecast.synthetic`` (the sample's four services with room to
grow: max replicas x2.5, no holidays in the window, 2025-10-13 to 2025-12-14, one seed):
``stable``; ``step``, demand +40 % from Monday 2025-12-01 09:00 on; ``surge``, demand +20 %/day
from Monday 2025-12-01 00:00 for three days (x1.728), then held. Daily cutoffs at 18:00 Seoul
from the event's day on (``--days`` of them; ``--hourly`` adds every hour in between), a 24 h
horizon, the four replica series. Printed per model and pool: MAE of the median, q0.9 coverage
(y <= q) and strict coverage (y < q), pinball of q0.9, and the MAE and coverage of the shifted
pools relative to the stable one over the same cutoffs; then per cutoff for ``auto``.
``auto_static`` is ``auto`` without its regime handling (no rescaling by the last day's ratio,
no adaptive quantile level): the forecaster as it was before them.
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")

import argparse
import dataclasses
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import numpy as np
import pandas as pd

import record  # bench/record.py: --record writes the output into docs/bench/
from idlegpu.forecast.backtest import CUTOFF, backtest
from idlegpu.forecast.models import make_model
from idlegpu.forecast.schema import UNIQUE_ID, Y
from idlegpu.forecast.synthetic import SAMPLE_POOL, generate_pool_history

TZ = "Asia/Seoul"
EVENT = "2025-12-01"
SHIFTS = {
    "stable": (),
    "step": (("2025-12-01T09:00", 1.4, 0.0),),
    "surge": (("2025-12-01T00:00", 1.2**3, 3.0),),
}


def pool(shifts=()):
    services = tuple(dataclasses.replace(s, max_replicas=int(np.ceil(s.max_replicas * 2.5)))
                     for s in SAMPLE_POOL.services)
    return dataclasses.replace(SAMPLE_POOL, services=services, start="2025-10-13",
                               end="2025-12-14", gaps=(), quiet_days={}, shifts=shifts)


def replicas(shifts=(), seed=7) -> pd.DataFrame:
    frame = generate_pool_history(pool(shifts), seed=seed)
    return frame[frame[UNIQUE_ID].str.endswith("/replicas")].reset_index(drop=True)


def bounds():
    return {f"{s.name}/replicas": (float(s.min_replicas), float(s.max_replicas))
            for s in pool().services}


def cutoffs(days: int, hourly: bool) -> list[pd.Timestamp]:
    first = pd.Timestamp(f"{EVENT}T18:00", tz=TZ)
    step = pd.Timedelta(hours=1 if hourly else 24)
    n = (days - 1) * (24 if hourly else 1) + 1
    return [(first + k * step).tz_convert("UTC") for k in range(n)]


def metrics(frame: pd.DataFrame) -> dict[str, float]:
    y, med, q9 = frame[Y].to_numpy(), frame["q0.5"].to_numpy(), frame["q0.9"].to_numpy()
    diff = y - q9
    return {"mae": float(np.mean(np.abs(y - med))),
            "coverage": float(np.mean(y <= q9 + 1e-9)),
            "strict": float(np.mean(y < q9 - 1e-9)),
            "pinball": float(np.mean(np.maximum(0.9 * diff, -0.1 * diff)))}


STATIC = {"level_band": None, "aci_gamma": None}  # curve_static: the curve without regime handling


def factory(label: str):
    name, options = ("curve", STATIC) if label == "curve_static" else (label, {})
    return lambda: make_model(name, timezone=TZ, holiday_country="KR", bounds=bounds(),
                              **options)


def run(models: list[str], days: int, hourly: bool) -> dict:
    cuts = cutoffs(days, hourly)
    out = {}
    for name, shifts in SHIFTS.items():
        history = replicas(shifts)
        frames = []
        for label in models:
            result = backtest(history, {label: factory(label)}, cutoffs=cuts,
                              horizon=pd.Timedelta("24h"), quantiles=[0.5, 0.9])
            frames.append(result.forecasts.assign(model=label))
        out[name] = pd.concat(frames, ignore_index=True).dropna(subset=[Y])
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="auto,curve,curve_static")
    parser.add_argument("--days", type=int, default=5, help="daily cutoffs from the event on")
    parser.add_argument("--hourly", action="store_true", help="a cutoff every hour")
    args = parser.parse_args()
    models = [m.strip() for m in args.models.split(",")]
    forecasts = run(models, args.days, args.hourly)
    print("| model | pool | MAE | coverage q0.9 | strict | pinball q0.9 | MAE / stable "
          "| coverage - stable |")
    print("|---|---|---|---|---|---|---|---|")
    for model in models:
        base = metrics(forecasts["stable"][forecasts["stable"]["model"] == model])
        for name, frame in forecasts.items():
            m = metrics(frame[frame["model"] == model])
            print(f"| {model} | {name} | {m['mae']:.3f} | {m['coverage']:.3f} | {m['strict']:.3f}"
                  f" | {m['pinball']:.3f} | {m['mae'] / base['mae']:.2f} | "
                  f"{m['coverage'] - base['coverage']:+.3f} |")
    for model in models:
        print(f"\n{model} per daily cutoff (coverage q0.9 / MAE):")
        for name, frame in forecasts.items():
            frame = frame[frame["model"] == model]
            local = pd.DatetimeIndex(frame[CUTOFF]).tz_convert(TZ)
            daily = frame[local.hour == 18]
            cells = [f"{pd.Timestamp(c).tz_convert(TZ):%a %m-%d}: "
                     f"{metrics(g)['coverage']:.2f}/{metrics(g)['mae']:.2f}"
                     for c, g in daily.groupby(CUTOFF)]
            print(f"  {name:<7} " + "  ".join(cells))
        for name, frame in forecasts.items():
            frame = frame[frame["model"] == model]
            per = frame.groupby(UNIQUE_ID).apply(lambda g: metrics(g)["coverage"])
            print(f"  {name:<7} per series coverage: "
                  + ", ".join(f"{k.split('/')[0]} {v:.2f}" for k, v in per.items()))


if __name__ == "__main__":
    record.run("regime", main)
