"""The real-traffic pool of data/real/pool/: rebuilt from the traces, and simulated with a gap."""

from __future__ import annotations

import gzip
import importlib.util
import sys
from pathlib import Path

import pandas as pd
import pytest
import yaml

from idlegpu.forecast.config import load_config
from idlegpu.forecast.sources import read_history
from idlegpu.scheduler.cli import main
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


def test_the_committed_history_is_rebuilt_from_the_traces():
    rebuilt = pool.to_csv_text(pool.pool_history(pool.trace_rates()))
    committed = gzip.decompress((POOL_DIR / "history.csv.gz").read_bytes()).decode("utf-8")
    assert rebuilt == committed
    history = read_history(POOL_DIR / "history.csv.gz")  # a valid history
    assert set(history["unique_id"]) == {f"{s.name}/replicas" for s in pool.SERVICES}
    assert history["ds"].min() == pd.Timestamp("2018-03-15T07:00:00Z")


def test_the_config_describes_the_builders_services():
    settings = load_config(POOL_DIR / "idlegpu.yaml")
    described = {(s.name, s.gpus_per_replica, s.min_replicas, s.max_replicas)
                 for s in settings.services}
    built = {(s.name, s.gpus_per_replica, s.min_replicas, s.max_replicas) for s in pool.SERVICES}
    assert described == built
    history = read_history(POOL_DIR / "history.csv.gz")
    for service in pool.SERVICES:
        y = history[history["unique_id"] == f"{service.name}/replicas"]["y"]
        assert y.min() >= service.min_replicas and y.max() <= service.max_replicas
    assert settings.pool.timezone == pool.TIMEZONE


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
                 "reactive,forecast,oracle", "--days", "8", "--out", str(out)])
    assert code in (0, None)
    table = pd.read_csv(out / "policies.csv", index_col="policy")
    metrics = table.to_dict(orient="index")
    oracle = metrics["oracle"]
    assert oracle["unobserved_hours"] == pytest.approx(26.0)
    for policy in ("reactive", "forecast"):
        assert metrics[policy]["useful_gpu_hours"] <= oracle["useful_gpu_hours"]
        assert metrics[policy]["useful_gpu_hours"] > 0
    assert metrics["forecast"]["service_delay_gpu_minutes"] <= (
        metrics["reactive"]["service_delay_gpu_minutes"])
