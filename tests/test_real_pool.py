"""The pools of data/real/ (the real-traffic pool, the ServeGen pool): rebuilt from the traces,
and simulated."""

from __future__ import annotations

import gzip
import importlib.util
import sys
from pathlib import Path

import pandas as pd
import pytest
import yaml

from idlegpu.forecast.sources import read_history
from idlegpu.scheduler.cli import main
from idlegpu.scheduler.config import load_config
from idlegpu.scheduler.specs import load_trace

REPO = Path(__file__).resolve().parents[1]
POOL_DIR = REPO / "data" / "real" / "pool"


def _script():
    sys.path.insert(0, str(REPO / "scripts"))
    spec = importlib.util.spec_from_file_location("build_real_pool",
                                                  REPO / "scripts" / "build_real_pool.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


pool = _script()


SERVEGEN_DIR = REPO / "data" / "real" / "servegen-pool"
SPECS = pytest.mark.parametrize("name", ["real", "servegen"])


@SPECS
def test_the_committed_history_and_jobs_are_rebuilt_from_the_traces(name):
    spec = pool.POOLS[name]
    rebuilt = pool.to_csv_text(pool.pool_history(pool.trace_rates(spec), spec))
    committed = gzip.decompress((spec.directory / "history.csv.gz").read_bytes()).decode("utf-8")
    assert rebuilt == committed
    sample = (REPO / "data" / "sample" / "jobs.yaml").read_text(encoding="utf-8")
    assert pool.shift_trace(sample, spec) == (spec.directory / "jobs.yaml").read_text(
        encoding="utf-8")
    history = read_history(spec.directory / "history.csv.gz")  # a valid history
    assert set(history["unique_id"]) == {f"{s.name}/replicas" for s in spec.services}
    assert history["ds"].min() == spec.first


@SPECS
def test_the_config_describes_the_builders_services(name):
    spec = pool.POOLS[name]
    settings = load_config(spec.directory / "idlegpu.yaml")
    described = {(s.name, s.gpus_per_replica, s.min_replicas, s.max_replicas)
                 for s in settings.services}
    built = {(s.name, s.gpus_per_replica, s.min_replicas, s.max_replicas) for s in spec.services}
    assert described == built
    history = read_history(spec.directory / "history.csv.gz")
    for service in spec.services:
        y = history[history["unique_id"] == f"{service.name}/replicas"]["y"]
        assert y.min() >= service.min_replicas and y.max() <= service.max_replicas
    assert settings.pool.timezone == spec.timezone
    if name == "real":
        return  # sized for the median day: its busiest days need more than its 80 GPUs
    # the ServeGen pool serves its busiest step with the headroom kept
    wide = history.pivot(index="ds", columns="unique_id", values="y").dropna()
    gpus = sum(wide[f"{s.name}/replicas"] * s.gpus_per_replica for s in spec.services)
    assert gpus.max() <= settings.pool.total_gpus - settings.pool.headroom_gpus


def test_the_servegen_pool_drops_the_partial_step_after_each_collection_gap():
    spec = pool.SERVEGEN_POOL
    rates = pool.trace_rates(spec)["tenant-a"]
    steps = rates.index.to_series().diff()
    partial = rates.index[(steps > spec.source_step).to_numpy()]
    assert len(partial) >= 5
    history = pool.pool_history({**pool.trace_rates(spec)}, spec)
    held = pd.DatetimeIndex(history.loc[history["unique_id"] == "tenant-a/replicas", "ds"])
    for at in partial:
        assert at not in held and at + pd.Timedelta(minutes=5) not in held
        assert at + spec.source_step in held  # the next, whole step is read


def test_the_servegen_jobs_are_three_stretches_of_the_sample_on_the_pools_last_days():
    spec = pool.SERVEGEN_POOL
    settings = load_config(SERVEGEN_DIR / "idlegpu.yaml")
    sample = yaml.safe_load((REPO / "data" / "sample" / "jobs.yaml").read_text("utf-8"))["jobs"]
    original = {e["name"]: pd.Timestamp(e["submit_at"]).tz_convert("Asia/Seoul") for e in sample}
    moved = load_trace(SERVEGEN_DIR / "jobs.yaml", settings.admission)
    expected = [name for name, at in original.items()
                if any(begin <= at < begin + pd.Timedelta(days=11) for begin in spec.trace_from)]
    assert sorted(e.request.name for e in moved) == sorted(expected) and len(expected) == 24
    stamps = [pd.Timestamp(e.submit_at) for e in moved]
    assert stamps == sorted(stamps)
    for entry in moved:
        before = original[entry.request.name]
        after = pd.Timestamp(entry.submit_at).tz_convert(spec.timezone)
        assert (after.weekday(), after.time()) == (before.weekday(), before.time())
        assert spec.first + pd.Timedelta(days=3) <= after < spec.end


def test_the_job_trace_is_the_samples_moved_to_the_same_weekday_and_local_time():
    sample = (REPO / "data" / "sample" / "jobs.yaml").read_text(encoding="utf-8")
    committed = (POOL_DIR / "jobs.yaml").read_text(encoding="utf-8")
    assert pool.shift_trace(sample) == committed
    settings = load_config(POOL_DIR / "idlegpu.yaml")
    moved = {e.request.name: e for e in load_trace(POOL_DIR / "jobs.yaml", settings.admission)}
    original = {e["name"]: e for e in yaml.safe_load(sample)["jobs"]}
    assert len(moved) == 32
    for name, entry in moved.items():
        before = pd.Timestamp(original[name]["submit_at"]).tz_convert("Asia/Seoul")
        after = pd.Timestamp(entry.submit_at).tz_convert(pool.TIMEZONE)
        assert (after.weekday(), after.time()) == (before.weekday(), before.time())
        assert pd.Timestamp("2018-04-04", tz=pool.TIMEZONE) <= after
        assert after < pd.Timestamp("2018-05-05", tz=pool.TIMEZONE)


def test_a_surge_grows_one_service_for_three_days_then_holds():
    rates = pool.trace_rates()
    start = pd.Timestamp("2018-04-16T07:00:00Z")
    surged = pool.surge_rates(rates, "storefront", start)
    ratio = surged["storefront"] / rates["storefront"]
    assert (ratio[ratio.index <= start] == 1.0).all()
    assert ratio[start + pd.Timedelta(days=1)] == pytest.approx(1.2)
    assert ratio[ratio.index >= start + pd.Timedelta(days=3)].to_numpy() == pytest.approx(1.2 ** 3)
    assert surged["checkout"] is rates["checkout"]


def test_gaps_remove_exactly_their_samples():
    history = pool.pool_history(pool.trace_rates())
    start = pd.Timestamp("2018-04-10T19:00:00Z")
    gapped = pool.with_gaps(history, [("checkout", start, pd.Timedelta(hours=26)),
                                      (None, start + pd.Timedelta(days=5), pd.Timedelta(hours=1))])
    lost = len(history) - len(gapped)
    assert lost == 26 * 12 + 4 * 12  # checkout's 26 hours, then one hour of every service


def test_simulate_on_the_real_pool_with_a_26_hour_gap(tmp_path):
    history = pool.with_gaps(pool.pool_history(pool.trace_rates()),
                             [("checkout", pd.Timestamp("2018-04-05T19:00:00Z"),
                               pd.Timedelta(hours=26))])
    path = tmp_path / "history.csv"
    path.write_text(pool.to_csv_text(history), encoding="utf-8")
    out = tmp_path / "sim"
    code = main(["simulate", "-c", str(POOL_DIR / "idlegpu.yaml"), "-H", str(path),
                 "--jobs", str(POOL_DIR / "jobs.yaml"), "--runs",
                 str(REPO / "data" / "sample" / "runs.csv"), "--policies",
                 "reactive,forecast,oracle,clairvoyant", "--days", "8", "--out", str(out)])
    assert code in (0, None)
    table = pd.read_csv(out / "policies.csv", index_col="policy")
    metrics = table.to_dict(orient="index")
    bound = metrics["clairvoyant"]
    assert bound["unobserved_hours"] == pytest.approx(26.0)
    for policy in ("reactive", "forecast", "oracle"):
        assert metrics[policy]["useful_gpu_hours"] <= bound["useful_gpu_hours"]
        assert metrics[policy]["useful_gpu_hours"] > 0
    assert metrics["forecast"]["service_delay_gpu_minutes"] <= (
        metrics["reactive"]["service_delay_gpu_minutes"])


def test_simulate_the_servegen_pool_from_three_days_of_history(tmp_path):
    out = tmp_path / "sim"
    code = main(["simulate", "-c", str(SERVEGEN_DIR / "idlegpu.yaml"), "-H",
                 str(SERVEGEN_DIR / "history.csv.gz"), "--jobs", str(SERVEGEN_DIR / "jobs.yaml"),
                 "--runs", str(REPO / "data" / "sample" / "runs.csv"), "--warmup-days", "3",
                 "--policies", "reactive,forecast", "--days", "4", "--out", str(out)])
    assert code in (0, None)
    metrics = pd.read_csv(out / "policies.csv", index_col="policy").to_dict(orient="index")
    runs = pd.read_csv(out / "runs_forecast.csv")
    first = pd.Timestamp(runs["start"].min())
    # the first job starts on the first day after the three days of history, forecast by auto
    assert first.tz_convert(pool.SERVEGEN_TZ).date() == pd.Timestamp("2025-01-09").date()
    for policy in ("reactive", "forecast"):
        assert metrics[policy]["useful_gpu_hours"] > 100
        assert metrics[policy]["unobserved_hours"] > 0  # the collection gap of 2025-01-09
    # where the work was lost: every view adds up to the policy's lost GPU-hours
    lost = pd.read_csv(out / "lost.csv")
    from idlegpu.scheduler.simulate import CAUSE_NAMES

    assert set(lost["by"]) <= {"cause", "overran", "checkpointable", "admission_hour"}
    assert set(lost.loc[lost["by"] == "cause", "value"]) <= set(CAUSE_NAMES.values())
    for policy in ("reactive", "forecast"):
        mine = lost[lost["policy"] == policy]
        assert len(mine), f"{policy} lost nothing on 4 days of this pool?"
        for by, part in mine.groupby("by"):
            assert part["lost_gpu_hours"].sum() == pytest.approx(
                metrics[policy]["lost_gpu_hours"], rel=1e-3), by
            # (each share is written to 4 decimals: their sum is 1 within the rounding)
            assert part["share"].sum() == pytest.approx(1.0, abs=0.5e-4 * len(part))
        runs = pd.read_csv(out / f"runs_{policy}.csv")
        stopped = runs[runs["outcome"].isin(["stopped", "preempted"])]
        assert (stopped["cause"].fillna("") != "").all()  # every stop names its cause
    # when the service waited: each step on record, adding up to each policy's delay
    delays = pd.read_csv(out / "delays.csv")
    assert list(delays.columns) == ["policy", "time", "gpus_short", "service_rise_gpus"]
    for policy in ("reactive", "forecast"):
        mine = delays[delays["policy"] == policy]
        assert mine["gpus_short"].sum() * 5 == pytest.approx(
            metrics[policy]["service_delay_gpu_minutes"], abs=1e-6), policy
