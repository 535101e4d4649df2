"""Benchmark: the admission policies on the real-traffic pool, with gaps, a surge and overruns
each switched on alone.

    OMP_NUM_THREADS=1 python bench/real_pool_bench.py [--pool real|servegen] [--days N] \
        [--variants ...]

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
  its GPUs (``min_gpus = gpus / 2``) by whole replicas of up to a node's 8 GPUs
  (``gpus_step = min(8, gpus / 2)``: 32 GPUs run on 32, 24 or 16): what shrinking and smaller
  admissions buy.

``--pool servegen``: the ServeGen pool of data/real/servegen-pool/ (four LLM-serving deployments
of one model family, driven by the request rates of its API clients; 11 days from Thursday
2025-01-09 00:00 Shanghai, after three days of history), its gap ``tenants-c``'s replicas
missing for 20 hours over a 17:00 refit (Monday 2025-01-13 12:00 to Tuesday 08:00) and the
whole pool's for 2 hours one night (Friday 2025-01-17 02:00-04:00), its surge on ``long-tail``
from Wednesday 2025-01-15 00:00.

Prints per variant each policy's metrics and the admission goals (forecast useful >= 1.0x
reactive's, lost <= 0.5x reactive's and <= 2 % of useful, service delay <= 0.1x reactive's,
and whether the clairvoyant reference harvests at least every policy), each a ratio measured
in the same run, how much of the forecast and night policies' service delay came in events
that began with the service rising more than the pool's headroom within one step
(``simulate.delay_events``), and the wall time of each variant's forecasts.
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")

import argparse
import re
import sys
import time
from dataclasses import dataclass, replace
from datetime import timedelta
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "scripts"))

import build_real_pool as pool  # scripts/
import pandas as pd

import record  # bench/record.py: --record writes the output into docs/bench/
from idlegpu.scheduler.config import load_config
from idlegpu.scheduler.policy import policy_settings
from idlegpu.scheduler.runtime import RuntimeEstimator, load_runs
from idlegpu.scheduler.simulate import (
    POLICIES,
    delay_events,
    forecast_profiles_for,
    shifted_jobs,
    simulate,
    trace_jobs,
)
from idlegpu.scheduler.specs import load_trace

TZ = pool.TIMEZONE
SG = pool.SERVEGEN_TZ


@dataclass(frozen=True)
class PoolRun:
    spec: pool.PoolSpec
    start: pd.Timestamp
    days: int
    gaps: list
    surge: tuple[str, pd.Timestamp]


RUNS = {
    "real": PoolRun(pool.REAL_POOL, pd.Timestamp("2018-04-04T00:00:00", tz=TZ), 31, [
        ("checkout", pd.Timestamp("2018-04-10T12:00:00", tz=TZ), pd.Timedelta(hours=26)),
        (None, pd.Timestamp("2018-04-19T01:00:00", tz=TZ), pd.Timedelta(hours=2, minutes=30)),
    ], ("storefront", pd.Timestamp("2018-04-16T00:00:00", tz=TZ))),
    "servegen": PoolRun(pool.SERVEGEN_POOL, pd.Timestamp("2025-01-09T00:00:00", tz=SG), 11, [
        ("tenants-c", pd.Timestamp("2025-01-13T12:00:00", tz=SG), pd.Timedelta(hours=20)),
        (None, pd.Timestamp("2025-01-17T02:00:00", tz=SG), pd.Timedelta(hours=2)),
    ], ("long-tail", pd.Timestamp("2025-01-15T00:00:00", tz=SG))),
}
VARIANTS = {
    "recorded": (),
    "gaps": ("gaps",),
    "surge": ("surge",),
    "overruns": ("overruns",),
    "all": ("gaps", "surge", "overruns"),
    "elastic": ("gaps", "surge", "overruns", "elastic"),
}


def variant_inputs(switches, settings, entries, estimator, run: PoolRun = RUNS["real"]):
    """The pool history and simulation jobs of one variant."""
    rates = pool.trace_rates(run.spec)
    if "surge" in switches:
        rates = pool.surge_rates(rates, run.surge[0], run.surge[1].tz_convert("UTC"))
    history = pool.pool_history(rates, run.spec)
    if "gaps" in switches:
        history = pool.with_gaps(history, [(s, t.tz_convert("UTC"), d) for s, t, d in run.gaps])
    jobs = trace_jobs(entries, lambda unit: estimator.estimate(unit).seconds)
    if "overruns" not in switches:
        jobs = [replace(j, work_s=j.estimate_s) for j in jobs]
    if "elastic" in switches:
        jobs = [replace(j, min_gpus=j.gpus // 2, gpus_step=min(8, j.gpus // 2))
                if j.checkpointable and j.gpus >= 8 else j for j in jobs]
    return history, jobs


def goals_of(rows: dict[str, dict]) -> dict[str, object]:
    """The admission goals (issue 25) of one variant's metrics by policy."""
    f, c, r = rows["forecast"], rows["clairvoyant"], rows["reactive"]

    def ratio(a: float, b: float) -> float:
        return a / b if b else float("nan")

    return {
        "forecast / reactive useful (>= 1.0)": ratio(f["useful_gpu_hours"],
                                                     r["useful_gpu_hours"]),
        "lost: forecast / reactive (<= 0.5)": ratio(f["lost_gpu_hours"], r["lost_gpu_hours"]),
        "forecast lost / useful (<= 0.02)": ratio(f["lost_gpu_hours"], f["useful_gpu_hours"]),
        "delay: forecast / reactive (<= 0.1)": ratio(f["service_delay_gpu_minutes"],
                                                     r["service_delay_gpu_minutes"]),
        "forecast delay (GPU-min)": f["service_delay_gpu_minutes"],
        "reactive delay (GPU-min)": r["service_delay_gpu_minutes"],
        # the delay of events that began with the service rising more than the headroom in
        # one step, the forecast policy's and the night policy's (which holds GPUs by the clock)
        "forecast delay, rises > headroom": f["delay_in_rises_above_headroom"],
        "night delay, rises > headroom": rows["night"]["delay_in_rises_above_headroom"],
        "clairvoyant >= every policy (useful)": all(
            c["useful_gpu_hours"] >= v["useful_gpu_hours"] for v in rows.values()),
        "clairvoyant >= every policy (work)": all(
            c["work_gpu_hours"] >= v["work_gpu_hours"] for v in rows.values()),
    }


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pool", choices=list(RUNS), default="real")
    parser.add_argument("--days", type=int, help="default: the pool's job trace's span")
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--pool-uncertainty", choices=["sum", "joint"],
                        help="admission.pool_uncertainty (default: the pool's config)")
    parser.add_argument("--no-stop-after-checkpoint", action="store_true",
                        help="stop when the need comes within the grace period, not just "
                             "after a checkpoint (the rule before it)")
    parser.add_argument("--early-stop-only-if-likely", action="store_true",
                        help="stop a unit early, just after a checkpoint, only if the median "
                             "forecast also falls short before its next one")
    parser.add_argument("--checkpointable-on-promise", action="store_true",
                        help="plan checkpointable units on the promise too, not on the median "
                             "forecast (the rule before it)")
    parser.add_argument("--saves-on-stop", action="store_true",
                        help="model workloads that save when told to stop (SIGTERM)")
    parser.add_argument("--checkpoint-notice", type=float, default=0.0, metavar="SECONDS",
                        help="planned stops of checkpointing units come with this much notice "
                             "(the cooperative checkpoint; 0: blind SIGTERMs)")
    parser.add_argument("--notice-answer", type=float, default=120.0, metavar="SECONDS",
                        help="how long after a notice a unit has saved and answered")
    parser.add_argument("--offsets", default="0", metavar="HOURS,...",
                        help="run each variant with the job trace submitted this many hours "
                             "later (negative: earlier), and print each goal's spread over "
                             "them (e.g. -48,-24,0,24,48); the forecasts are made once")
    parser.add_argument("--unanswered-share", type=float, default=0.0,
                        help="the share of units that never answer a notice")
    return parser


def main() -> None:
    args = _parser().parse_args()
    run = RUNS[args.pool]
    days = args.days or run.days
    settings = load_config(run.spec.directory / "idlegpu.yaml")
    if args.pool_uncertainty:
        admission = settings.admission.model_copy(
            update={"pool_uncertainty": args.pool_uncertainty})
        settings = settings.model_copy(update={"admission": admission})
    estimator = RuntimeEstimator.from_config(load_runs(REPO / "data" / "sample" / "runs.csv"),
                                             settings.admission)
    entries = load_trace(run.spec.directory / "jobs.yaml", settings.admission)
    start = run.start.tz_convert("UTC")
    end = min(start + pd.Timedelta(days=days), run.spec.end)
    index = pd.date_range(start, end, freq="5min", inclusive="left")
    config = replace(policy_settings(settings.admission, settings.pool.headroom_gpus,
                                     settings.pool.total_gpus),
                     stop_after_checkpoint=not args.no_stop_after_checkpoint,
                     early_stop_only_if_likely=args.early_stop_only_if_likely,
                     checkpointable_on_likely=not args.checkpointable_on_promise)
    offsets = [float(h) for h in args.offsets.split(",")]
    goals = []
    for name in args.variants.split(","):
        history, jobs = variant_inputs(VARIANTS[name], settings, entries, estimator, run)
        began = time.perf_counter()
        profiles = forecast_profiles_for(history, settings, index, 17, pd.Timedelta(hours=48),
                                         workers=2)
        seconds = time.perf_counter() - began
        for hours in offsets:
            shifted = shifted_jobs(jobs, timedelta(hours=hours))
            rows = {}
            for policy in POLICIES:
                result = simulate(history, settings, shifted, policy,
                                  start=start.to_pydatetime(), end=end.to_pydatetime(),
                                  policy_config=config, saves_on_stop=args.saves_on_stop,
                                  checkpoint_notice_s=args.checkpoint_notice,
                                  notice_answer_s=args.notice_answer,
                                  unanswered_share=args.unanswered_share,
                                  forecast_profiles=profiles if policy == "forecast" else None)
                rows[policy] = result.metrics
                events = delay_events(result.delays, 300, settings.pool.headroom_gpus)
                rows[policy]["delay_in_rises_above_headroom"] = float(
                    events.loc[events["above_headroom"], "gpu_minutes"].sum())
            if hours == 0 or len(offsets) == 1:
                table = pd.DataFrame(rows)
                print(f"\n== {args.pool}: {name} ({len(jobs)} units, {(end - start).days} "
                      f"days; forecasts {seconds:.1f} s)")
                print(table.to_string(float_format=lambda v: f"{v:,.1f}"))
            goals.append({"variant": name, "offset_h": hours, **goals_of(rows)})
    frame = pd.DataFrame(goals)
    print("\n== goals" + ("" if len(offsets) == 1 else " (the trace as recorded)"))
    recorded = frame[frame["offset_h"] == (0.0 if 0.0 in offsets else offsets[0])]
    print(recorded.drop(columns="offset_h").set_index("variant").to_string(
        float_format=lambda v: f"{v:.3f}"))
    if len(offsets) > 1:
        print(f"\n== the goals over {len(offsets)} shifts of the job trace "
              f"({', '.join(f'{h:+g} h' for h in offsets)})")
        print(spread_of(frame).to_string(float_format=lambda v: f"{v:.3f}"))


GOAL = re.compile(r"^(?P<name>.+) \((?P<side>>=|<=) (?P<limit>[0-9.]+)\)$")
"""goals_of's ratio columns: the goal they are held to, in their name ("... (>= 1.0)")."""


def spread_of(goals: pd.DataFrame) -> pd.DataFrame:
    """Per variant, each ratio goal's mean, lowest and highest over the trace's shifts and
    in how many shifts it holds (``"3/5"``); the clairvoyant bound as the shifts it holds in."""
    out = {}
    for variant, runs in goals.groupby("variant", sort=False):
        row: dict[str, object] = {}
        for column in runs.columns:
            goal = GOAL.match(column)
            if goal is None:
                continue
            values, limit = runs[column].astype(float), float(goal["limit"])
            met = values >= limit if goal["side"] == ">=" else values <= limit
            short = goal["name"]
            row[f"{short}: mean"] = values.mean()
            row[f"{short}: min"] = values.min()
            row[f"{short}: max"] = values.max()
            row[f"{short}: met"] = f"{int(met.sum())}/{len(values)}"
        bound = runs["clairvoyant >= every policy (useful)"]
        row["clairvoyant bounds: met"] = f"{int(bound.sum())}/{len(bound)}"
        out[variant] = row
    return pd.DataFrame(out)

def _record_name(argv: list[str]) -> str:
    """Each pool's record file of its own (docs/bench/real_pool.md, servegen_pool.md)."""
    pool = _parser().parse_known_args(argv)[0].pool
    return "real_pool" if pool == "real" else f"{pool}_pool"


if __name__ == "__main__":
    record.run(_record_name(sys.argv[1:]), main)
