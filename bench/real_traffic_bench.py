"""Benchmark: the forecasters on real public traffic traces (data/real/), rolling origin.

    OMP_NUM_THREADS=1 python bench/real_traffic_bench.py [--traces nab-elb,...]
        [--models auto,curve,seasonal_naive,snaive_1d,prophet,sf_mstl,sf_autoets,sf_autotheta]
        [--out out/real_bench]

Needs the ``models`` extra (Prophet) and the ``bench`` extra (statsforecast). statsforecast
2.x requires pandas < 3, so install the ``bench`` extra into its own environment, not into one
that must keep pandas 3 (see docs/benchmarks.md).

Per trace (data/real/README.md: sources, licences, conversion), on HOURLY aggregates of its two
series (``request_rate``: the hour's mean; ``replicas``: the hour's maximum, the GPUs held at
some moment in it), every model is refitted at each daily cutoff on the past only and forecasts
the next 24 hours. Cutoffs (``idlegpu.forecast.backtest.daily_cutoffs``): the last 14 days at 18:00
local for the 8-month e-commerce trace and the three 52-day purchase traces (their first cutoff
has 37.75 days of history), the last 7 days at 23:00 for the two 14-day traces (the first
cutoff then has exactly one week of history, what seasonal-naive needs), the last 6 days at
17:00 Shanghai for ServeGen's m-mid (after its collection gap).

Models:

* ``auto``, ``curve``, ``seasonal_naive`` (the weekly lag), ``snaive_1d`` (seasonal naive at
  the daily lag), ``prophet``: idlegpu's own (``idlegpu.forecast.models``), with the trace's
  time zone, holiday calendar and, for ``replicas``, the autoscaler's min/max replicas as
  bounds (request rates: 0 to unbounded);
* ``sf_mstl``: statsforecast ``MSTL`` (seasons 24 and 168 h where the history holds two full
  weeks for the weekly one, else 24 h only; trend by ``AutoETS(model="ZZN")``) and
  ``sf_autoets``: statsforecast ``AutoETS(season_length=24)`` and ``sf_autotheta``:
  ``AutoTheta(season_length=24, decomposition_type="additive")``, all with conformal prediction
  intervals (``ConformalIntervals(h=24, n_windows=k)``, k = up to 7 one-day windows the history
  allows), fitted on the last 56 days (the window idlegpu's reference models use). q0.5 is the
  point forecast, q0.9 the upper end of the 80 % interval; quantiles are sorted and clipped to
  the same bounds as the other models'. Gaps are filled linearly for statsforecast (it needs a
  complete series).

Reported per trace and series: pinball loss of q0.9, MAE of q0.5, the P90 coverage band
[strict y < q, plain y <= q] (for integer replica counts a calibrated q0.9 has strict <= 0.9 <=
plain), fit+predict seconds per cutoff (both series), and ``auto``'s goals: its pinball at most
the best baseline's (``BASELINES``) on every series, at most 0.85x the better seasonal naive's
as the geometric mean over them, its P90 band overlapping 0.85-0.95.
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")

import argparse
import importlib.util
import math
import sys
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import numpy as np
import pandas as pd
from pandas.tseries.frequencies import to_offset
from threadpoolctl import threadpool_limits

import record  # bench/record.py: --record writes the output into docs/bench/
from idlegpu.forecast.backtest import backtest, daily_cutoffs, score
from idlegpu.forecast.models import make_model
from idlegpu.forecast.models.base import (
    finish_quantiles,
    parse_horizon,
    prepare_series,
    to_frame,
    validate_quantiles,
)
from idlegpu.forecast.schema import DS, UNIQUE_ID, Y
from idlegpu.forecast.sources import read_history


def _load_traces():
    spec = importlib.util.spec_from_file_location(
        "fetch_real_traces", REPO / "scripts" / "fetch_real_traces.py"
    )
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


TRACES = _load_traces()
QUANTILES = (0.5, 0.9)
HORIZON = pd.Timedelta(hours=24)
HOUR = pd.Timedelta(hours=1)
PROJECT_MODELS = ("auto", "curve", "seasonal_naive", "snaive_1d", "prophet")
SF_MODELS = ("sf_mstl", "sf_autoets", "sf_autotheta")
NAIVE_MODELS = ("seasonal_naive", "snaive_1d")  # the weekly and the daily lag
# what auto must not lose to on any trace: the simple baselines and the libraries
BASELINES = NAIVE_MODELS + ("prophet",) + SF_MODELS
ALL_MODELS = PROJECT_MODELS + SF_MODELS
SF_WINDOW = pd.Timedelta(days=56)


@dataclass(frozen=True)
class Plan:
    cutoff_hour: int
    days: int


PLANS = {
    "msft-ecommerce-api": Plan(cutoff_hour=18, days=14),
    "nab-elb": Plan(cutoff_hour=23, days=7),
    "msft-mongodb": Plan(cutoff_hour=23, days=7),
    "msft-purchases-02": Plan(cutoff_hour=18, days=14),
    "msft-purchases-03": Plan(cutoff_hour=18, days=14),
    "msft-purchases-04": Plan(cutoff_hour=18, days=14),
    # LLM serving (14 days, the collection gap on day 4): the last 6 days' 17:00 cutoffs
    "servegen-m-mid": Plan(cutoff_hour=17, days=6),
}

BEST_GOAL = 1.0  # auto's pinball q0.9 / the best baseline's, on every trace and series
NAIVE_GOAL = 0.85  # auto's / the better seasonal naive's, geometric mean over them
BAND = (0.85, 0.95)


def hourly(history: pd.DataFrame) -> pd.DataFrame:
    """Hourly aggregates: ``request_rate`` the hour's mean, ``replicas`` the hour's maximum
    (over the samples there are; an hour without any stays missing)."""
    frames = []
    for uid, group in history.groupby(UNIQUE_ID, sort=True, observed=True):
        values = group.set_index(DS)[Y]
        how = "max" if str(uid).endswith("/" + TRACES.REPLICAS) else "mean"
        agg = values.groupby(values.index.floor("h")).agg(how).dropna()
        frames.append(pd.DataFrame({UNIQUE_ID: str(uid), DS: agg.index, Y: agg.to_numpy()}))
    out = pd.concat(frames, ignore_index=True)
    out[UNIQUE_ID] = out[UNIQUE_ID].astype("string")
    return out


def bounds_for(trace) -> dict[str, tuple[float, float]]:
    return {
        f"{trace.name}/{TRACES.REPLICAS}": (float(trace.min_replicas), float(trace.max_replicas)),
        f"{trace.name}/{TRACES.REQUEST_RATE}": (0.0, math.inf),
    }


class StatsForecastModel:
    """statsforecast's MSTL or AutoETS with conformal intervals behind idlegpu's protocol."""

    def __init__(self, kind: str, *, bounds, window: pd.Timedelta = SF_WINDOW,
                 max_windows: int = 7) -> None:
        if kind not in SF_MODELS:
            raise ValueError(kind)
        self.kind = kind
        self.name = kind
        self.bounds = bounds
        self.window = window
        self.max_windows = max_windows

    def fit(self, history: pd.DataFrame) -> StatsForecastModel:
        self.series_ = prepare_series(history, self.bounds)
        return self

    def _model(self, n: int, h: int, step_h: float):
        from statsforecast.models import MSTL, AutoETS, AutoTheta
        from statsforecast.utils import ConformalIntervals

        day, week = round(24 / step_h), round(168 / step_h)
        windows = max(1, min(self.max_windows, n // h - 3))
        intervals = ConformalIntervals(h=h, n_windows=windows)
        if self.kind == "sf_autoets":
            return AutoETS(season_length=day, prediction_intervals=intervals)
        if self.kind == "sf_autotheta":
            # additive decomposition: a multiplicative one refuses series with zeros
            return AutoTheta(season_length=day, decomposition_type="additive",
                             prediction_intervals=intervals)
        fit_len = n - windows * h  # the shortest training set the conformal refits see
        seasons = [day] + ([week] if fit_len >= 2 * week else [])
        return MSTL(season_length=seasons if len(seasons) > 1 else day,
                    trend_forecaster=AutoETS(model="ZZN"), prediction_intervals=intervals)

    def predict(self, horizon, quantiles) -> pd.DataFrame:
        from statsforecast import StatsForecast

        qs = validate_quantiles(quantiles)
        span = parse_horizon(horizon)
        levels = sorted({round(abs(2 * q - 1) * 100) for q in qs if q != 0.5})
        frames = []
        for series in self.series_:
            values = series.values
            values = values[values.index > values.index[-1] - self.window]
            filled = values.interpolate(limit_direction="both")
            index = series.future_index(span)
            h = len(index)
            step_h = series.step / HOUR
            model = self._model(len(filled), h, step_h)
            df = pd.DataFrame({
                "unique_id": series.uid,
                "ds": filled.index.tz_convert("UTC").tz_localize(None),
                "y": filled.to_numpy(dtype=float),
            })
            sf = StatsForecast(models=[model], freq=to_offset(series.step), n_jobs=1)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                out = sf.forecast(df=df, h=h, level=levels)
            alias = str(model)
            cols = []
            for q in qs:
                if q == 0.5:
                    cols.append(out[alias].to_numpy())
                else:
                    side = "hi" if q > 0.5 else "lo"
                    cols.append(out[f"{alias}-{side}-{round(abs(2 * q - 1) * 100)}"].to_numpy())
            arr = finish_quantiles(np.column_stack(cols), series, qs, integer=False)
            frames.append(to_frame(series.uid, index, self.name, arr, qs))
        return pd.concat(frames, ignore_index=True)


def factories(trace, models):
    bounds = bounds_for(trace)
    out = {}
    for name in models:
        if name in SF_MODELS:
            out[name] = lambda name=name: StatsForecastModel(name, bounds=bounds)
        elif name == "snaive_1d":
            out[name] = lambda: make_model(
                "seasonal_naive", timezone=trace.timezone, holiday_country=trace.holiday_country,
                bounds=bounds, season=pd.Timedelta(days=1))
        else:
            out[name] = lambda name=name: make_model(
                name, timezone=trace.timezone, holiday_country=trace.holiday_country,
                bounds=bounds,
            )
    return out


def run_trace(trace, models):
    raw = read_history(REPO / "data" / "real" / trace.csv)
    history = hourly(raw)
    plan = PLANS[trace.name]
    cutoffs = daily_cutoffs(history, timezone=trace.timezone, hour=plan.cutoff_hour,
                            days=plan.days, horizon=HORIZON)
    done = [0]
    total = len(models) * len(cutoffs)

    def tick(name, cutoff):
        done[0] += 1
        print(f"\r  {trace.name:<20} {name:<15} {done[0]}/{total}", end="", file=sys.stderr,
              flush=True)

    result = backtest(history, factories(trace, models), cutoffs=cutoffs, horizon=HORIZON,
                      quantiles=QUANTILES, on_step=tick)
    print(file=sys.stderr)
    seconds = pd.Series(result.seconds) / len(cutoffs)
    tables = {}
    for metric in (TRACES.REPLICAS, TRACES.REQUEST_RATE):
        uid = f"{trace.name}/{metric}"
        part = result.forecasts[result.forecasts[UNIQUE_ID] == uid]
        table = score(part, QUANTILES)
        table["fit_predict_s"] = seconds
        tables[metric] = table
    return history, cutoffs, tables, result.forecasts


def ratios(table: pd.DataFrame) -> dict[str, float]:
    """auto's pinball q0.9 against the best baseline and the better seasonal naive."""
    pin = table["pinball_0.9"]
    out: dict = {}
    if "auto" not in table.index:
        return out
    present = [m for m in BASELINES if m in table.index]
    if present:
        best = min(present, key=lambda m: pin[m])
        out["best"] = pin["auto"] / pin[best]
        out["best_name"] = best
    naive = [m for m in NAIVE_MODELS if m in table.index]
    if naive:
        out["naive"] = pin["auto"] / min(pin[m] for m in naive)
    for ref in ("seasonal_naive", "snaive_1d", "prophet", "curve"):
        if ref in table.index:
            out[ref] = pin["auto"] / pin[ref]
    if "prophet" in table.index:
        out["time_prophet"] = table.loc["auto", "fit_predict_s"] / table.loc["prophet",
                                                                               "fit_predict_s"]
    return out


def band(table: pd.DataFrame) -> tuple[float, float, bool]:
    strict = table.loc["auto", "strict_coverage_0.9"]
    plain = table.loc["auto", "coverage_0.9"]
    return strict, plain, bool(strict <= BAND[1] + 1e-9 and plain >= BAND[0] - 1e-9)


def verdicts(table: pd.DataFrame, r: dict) -> list[str]:
    """One line per goal: measured value, target, met or missed."""
    lines = []
    if "best" in r:
        met = "met" if r["best"] <= BEST_GOAL + 1e-9 else "MISSED"
        lines.append(f"pinball auto / the best baseline ({r['best_name']}): {r['best']:.2f}x "
                     f"(goal <= {BEST_GOAL}x) {met}")
    if "naive" in r:
        lines.append(f"pinball auto / the better seasonal naive: {r['naive']:.2f}x")
    if "auto" in table.index:
        strict, plain, ok = band(table)
        lines.append(f"auto P90 coverage band [{strict:.3f}, {plain:.3f}] overlaps "
                     f"[{BAND[0]}, {BAND[1]}]: {'met' if ok else 'MISSED'}")
    return lines


def markdown(table: pd.DataFrame) -> str:
    rows = ["| model | pinball q0.9 | MAE | P90 coverage [strict, plain] | fit+predict |",
            "|---|---|---|---|---|"]
    for model, row in table.iterrows():
        name = f"**{model}**" if model == "auto" else model
        rows.append(
            f"| {name} | {_num(row['pinball_0.9'])} | {_num(row['mae'])} | "
            f"[{row['strict_coverage_0.9']:.3f}, {row['coverage_0.9']:.3f}] | "
            f"{row['fit_predict_s']:.2f} s |"
        )
    return "\n".join(rows)


def combined(everything: dict[str, dict[str, pd.DataFrame]]) -> str:
    """One table of every trace and model: replicas and request rate side by side."""
    rows = [("| trace | model | replicas: pinball q0.9 | MAE | P90 [strict, plain] | "
             "request rate: pinball q0.9 | MAE | P90 coverage | fit+predict |"),
            "|---|---|---|---|---|---|---|---|---|"]
    for name, tables in everything.items():
        rep, rate = tables[TRACES.REPLICAS], tables[TRACES.REQUEST_RATE]
        for model in rep.index:
            a, b = rep.loc[model], rate.loc[model]
            label = f"**{model}**" if model == "auto" else model
            rows.append(
                f"| {name} | {label} | {_num(a['pinball_0.9'])} | {_num(a['mae'])} | "
                f"[{a['strict_coverage_0.9']:.3f}, {a['coverage_0.9']:.3f}] | "
                f"{_num(b['pinball_0.9'])} | {_num(b['mae'])} | {b['coverage_0.9']:.3f} | "
                f"{a['fit_predict_s']:.2f} s |"
            )
    return "\n".join(rows)


def _num(x: float) -> str:
    if x == 0 or not math.isfinite(x):
        return f"{x:g}"
    digits = max(0, 2 - math.floor(math.log10(abs(x))))
    return f"{x:.{digits}f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--traces", default=",".join(t.name for t in TRACES.TRACES))
    parser.add_argument("--models", default=",".join(ALL_MODELS))
    parser.add_argument("--out", type=Path, default=REPO / "out" / "real_bench")
    args = parser.parse_args()
    models = [m.strip() for m in args.models.split(",") if m.strip()]
    unknown = [m for m in models if m not in ALL_MODELS]
    if unknown:
        parser.error(f"unknown model(s) {unknown}; choose from {', '.join(ALL_MODELS)}")
    names = [t.strip() for t in args.traces.split(",") if t.strip()]
    args.out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    summary = []
    everything = {}
    with threadpool_limits(1):
        for name in names:
            trace = TRACES.BY_NAME[name]
            history, cutoffs, tables, forecasts = run_trace(trace, models)
            forecasts.to_csv(args.out / f"{name}_forecasts.csv", index=False)
            first = history[DS].min()
            print(f"\n## {name}: {trace.source.repo} {trace.source.path}\n")
            print(f"hourly, {history[DS].min():%Y-%m-%d} to {history[DS].max():%Y-%m-%d} UTC; "
                  f"{len(cutoffs)} daily cutoffs {cutoffs[0]:%Y-%m-%d %H:%M} to "
                  f"{cutoffs[-1]:%Y-%m-%d %H:%M} UTC ({trace.timezone}), horizon 24 h; "
                  f"history at the first cutoff {(cutoffs[0] - first) / pd.Timedelta(days=1):.1f} d")
            everything[name] = tables
            for metric, table in tables.items():
                table.to_csv(args.out / f"{name}_{metric}.csv")
                r = ratios(table)
                print(f"\n### {name}/{metric}\n")
                print(markdown(table))
                print()
                for line in verdicts(table, r):
                    print(f"- {line}")
                row = {"trace": name, "series": metric, **r}
                if "auto" in table.index:
                    row["strict"], row["plain"], row["band_ok"] = band(table)
                summary.append(row)
    frame = pd.DataFrame(summary)
    frame.to_csv(args.out / "summary.csv", index=False)
    if everything:
        print("\n### every trace (hourly, 24 h ahead)\n")
        print(combined(everything))
    if not frame.empty and "best" in frame:
        print("\n### auto against its goals\n")
        print(f"| trace / series | auto / the best baseline (<= {BEST_GOAL}x) | "
              "auto / better seasonal naive | auto / curve | auto P90 band (overlaps 0.85-0.95) |")
        print("|---|---|---|---|---|")
        for _, row in frame.iterrows():
            ok = row["best"] <= BEST_GOAL + 1e-9
            print(f"| {row['trace']}/{row['series']} | {row['best']:.2f}x {'✅' if ok else '❌'} "
                  f"({row['best_name']}) | {row.get('naive', float('nan')):.2f}x | "
                  f"{row.get('curve', float('nan')):.2f}x | [{row['strict']:.3f}, "
                  f"{row['plain']:.3f}] {'✅' if row['band_ok'] else '❌'} |")
        if "naive" in frame:
            geo = float(np.exp(np.log(frame["naive"]).mean()))
            print(f"\nGeometric mean of auto / the better seasonal naive over "
                  f"{len(frame)} trace series: {geo:.3f}x (goal <= {NAIVE_GOAL}x) "
                  f"{'met' if geo <= NAIVE_GOAL else 'MISSED'}")
    print(f"\n(total {time.perf_counter() - started:.0f} s)")


if __name__ == "__main__":
    record.run("real_traffic", main)
