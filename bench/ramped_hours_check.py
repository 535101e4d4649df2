"""Sensitivity check (not a goal): a real-traffic pool with each source step's change spread
over the step (the request rates interpolated linearly at 5 minutes before the same HPA)
instead of landing as one 5-minute jump, simulated with the forecast, reactive and night
policies; prints each policy's useful and lost GPU-hours, service delay and delay events.

    python bench/ramped_hours_check.py [real|servegen] [recorded,gaps,...]

docs/benchmarks.md ("Where those jumps come from") has its figures.
"""
import os
import sys
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT / "scripts"))
from dataclasses import replace

import build_real_pool as pool
import pandas as pd
import real_pool_bench as b

from idlegpu.scheduler.config import load_config
from idlegpu.scheduler.policy import policy_settings
from idlegpu.scheduler.runtime import RuntimeEstimator, load_runs
from idlegpu.scheduler.simulate import delay_events, forecast_profiles_for, simulate
from idlegpu.scheduler.specs import load_trace

orig_history = pool.pool_history


def ramped(rates, spec):
    fine = {k: v.resample("5min").interpolate("time") for k, v in rates.items()}
    return orig_history(fine, replace(spec, source_step=pd.Timedelta(minutes=5)))


poolname = sys.argv[1] if len(sys.argv) > 1 else "real"
variants = sys.argv[2].split(",") if len(sys.argv) > 2 else ["recorded"]
pool.pool_history = ramped
run = b.RUNS[poolname]
settings = load_config(run.spec.directory / "idlegpu.yaml")
est = RuntimeEstimator.from_config(load_runs(b.REPO / "data/sample/runs.csv"), settings.admission)
entries = load_trace(run.spec.directory / "jobs.yaml", settings.admission)
start = run.start.tz_convert("UTC"); end = min(start + pd.Timedelta(days=run.days), run.spec.end)
index = pd.date_range(start, end, freq="5min", inclusive="left")
config = policy_settings(settings.admission, settings.pool.headroom_gpus, settings.pool.total_gpus)
for name in variants:
    history, jobs = b.variant_inputs(b.VARIANTS[name], settings, entries, est, run)
    profiles = forecast_profiles_for(history, settings, index, 17, pd.Timedelta(hours=48))
    for pol in ["forecast", "reactive", "night"]:
        r = simulate(history, settings, jobs, pol, start=start.to_pydatetime(), end=end.to_pydatetime(),
                     policy_config=config, forecast_profiles=profiles if pol == "forecast" else None)
        m = r.metrics
        print(name, pol, round(m["useful_gpu_hours"]), round(m["lost_gpu_hours"], 1), m["service_delay_gpu_minutes"], flush=True)
        ev = delay_events(r.delays, 300, settings.pool.headroom_gpus)
        if len(ev): print(ev.to_string())
