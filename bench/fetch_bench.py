"""Benchmark: pulling 90 days at 1-minute step for 10 series out of a local Prometheus.

    OMP_NUM_THREADS=1 /work/venv/bin/python bench/fetch_bench.py [--days 90] [--repeat 3]

Starts a real Prometheus (the test helper ``tests/prom_server.py``) backfilled from a generated
10-series history (5 services x {replicas gauge, generation-token counter}: 129,600 points per
series at 90 days), then times

  (a) ``fetch_history`` with chunks of ``max_points_per_query`` fetched by 8 parallel workers,
  (b) the very same chunks one at a time (``workers=1``),
  (c) prometheus-api-client's own ``get_metric_range_data(..., chunk_size=...)`` (instant queries
      over range selectors, one after the other), converted to the same tidy frame,

checks that (a), (b) and (c) return the same history, and prints a markdown table.
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")

import argparse
import statistics
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import numpy as np
import pandas as pd
from prometheus_api_client import PrometheusConnect

from forecast.config import load_config
from forecast.schema import validate_history
from forecast.sources import prometheus as prom_module
from forecast.sources.prometheus import counter_rate, fetch_history
from tests.prom_server import PromServer

STEP = 60
SERVICES = [f"svc{i}" for i in range(5)]
START = pd.Timestamp("2025-01-01T00:00:00Z")


def make_history(days: int, seed: int = 1) -> pd.DataFrame:
    """10 series (replicas + generation tokens/s of 5 services), every minute, built with numpy."""
    n = days * 86400 // STEP
    rng = np.random.default_rng(seed)
    ds = pd.date_range(START, periods=n, freq=f"{STEP}s").as_unit("ns").asi8
    day = np.sin(np.arange(n) * 2 * np.pi * STEP / 86400) * 0.5 + 0.5
    uids, ys = [], []
    for svc in SERVICES:
        uids.append(f"{svc}/replicas")
        ys.append(np.floor(2 + 10 * day + rng.integers(0, 3, n)).astype(np.float64))
        uids.append(f"{svc}/generation_tokens_per_s")
        ys.append(day * 3000 * rng.random(n))
    return pd.DataFrame(
        {
            "unique_id": np.repeat(np.array(uids, dtype=object), n),
            "ds": pd.DatetimeIndex(np.tile(ds, len(uids)).view("datetime64[ns]"), tz="UTC"),
            "y": np.concatenate(ys),
        }
    )


def settings_for(url: str, workers: int):
    return load_config(
        data={
            "pool": {"total_gpus": 64},
            "prometheus": {"url": url, "step_seconds": STEP, "workers": workers, "retries": 1},
            "query_templates": {
                "replicas": (
                    'kube_deployment_status_replicas{namespace="inference",deployment="$service"}'
                ),
                "generation_tokens_per_s": {
                    "query": 'sum(vllm:generation_tokens_total{model_name="$service"})',
                    "counter": True,
                },
            },
            "services": [
                {"name": s, "gpus_per_replica": 1, "min_replicas": 1, "max_replicas": 8}
                for s in SERVICES
            ],
        }
    )


def naive_client_fetch(url: str, start, end, max_points: int) -> pd.DataFrame:
    """prometheus-api-client's chunked path: raw samples via instant queries on range selectors,
    one chunk after another; boundary repeats dropped, counters turned into rates as we do."""
    chunk = timedelta(seconds=STEP * max_points)
    frames = []
    with PrometheusConnect(url=url) as prom:
        for svc in SERVICES:
            for metric, name, labels, counter in (
                ("replicas", "kube_deployment_status_replicas",
                 {"namespace": "inference", "deployment": svc}, False),
                ("generation_tokens_per_s", "vllm:generation_tokens_total",
                 {"model_name": svc}, True),
            ):
                first = start - timedelta(seconds=STEP) if counter else start
                data = prom.get_metric_range_data(
                    name, label_config=labels, start_time=first - timedelta(seconds=1),
                    end_time=end, chunk_size=chunk,
                )
                values = [v for part in data for v in part["values"]]
                ts = np.array([v[0] for v in values], dtype=np.float64)
                ys = np.array([v[1] for v in values], dtype=np.float64)
                ts, idx = np.unique(ts, return_index=True)  # chunk boundaries repeat a sample
                ys = ys[idx]
                if counter:
                    ts, ys = counter_rate(ts, ys, STEP)
                keep = (ts >= start.timestamp()) & (ts <= end.timestamp())
                frames.append(
                    pd.DataFrame(
                        {
                            "unique_id": f"{svc}/{metric}",
                            "ds": pd.to_datetime(ts[keep], unit="s", utc=True),
                            "y": ys[keep],
                        }
                    )
                )
    return validate_history(pd.concat(frames, ignore_index=True), source="naive")


def _server_cpu(pid: int) -> float:
    """CPU seconds (user + system) the Prometheus process has used so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def timed(fn, repeat: int, pid: int):
    """Median wall time of ``repeat`` runs, all wall times, the last result, and the CPU seconds
    per run of this process and of the Prometheus server."""
    times, result = [], None
    c0, s0 = time.process_time(), _server_cpu(pid)
    for _ in range(repeat):
        t = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - t)
    cpu = ((time.process_time() - c0) / repeat, (_server_cpu(pid) - s0) / repeat)
    return statistics.median(times), times, result, cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--days", type=int, default=90)
    parser.add_argument("--repeat", type=int, default=3, help="runs per variant (median shown)")
    parser.add_argument("--workers", type=int, default=8)
    parser.add_argument("--skip-naive", action="store_true")
    parser.add_argument("--gzip", action=argparse.BooleanOptionalAction, default=True,
                        help="also time (a) and (b) with gzip-compressed answers")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="fetch-bench-") as tmp:
        t = time.perf_counter()
        history = make_history(args.days)
        t_gen = time.perf_counter() - t
        t = time.perf_counter()
        server = PromServer.from_history(history, Path(tmp))
        t_backfill = time.perf_counter() - t
        n_series = history["unique_id"].nunique()
        per_series = len(history) // n_series
        print(
            f"history: {n_series} series x {per_series:,} points ({len(history):,} samples), "
            f"generated in {t_gen:.1f} s; OpenMetrics + promtool + start in {t_backfill:.1f} s",
            flush=True,
        )
        try:
            start = history["ds"].min().to_pydatetime()
            end = history["ds"].max().to_pydatetime()
            par = settings_for(server.url, args.workers)
            max_points = par.prometheus.max_points_per_query
            fetch_history(par, start, start + timedelta(hours=1))  # warm-up (page cache, pools)

            pid = server.proc.pid
            t_par, runs_par, got_par, cpu_par = timed(
                lambda: fetch_history(par, start, end, workers=args.workers), args.repeat, pid
            )
            t_seq, runs_seq, got_seq, cpu_seq = timed(
                lambda: fetch_history(par, start, end, workers=1), args.repeat, pid
            )
            rows = [
                (f"(a) fetch_history, chunks of {max_points:,} points, {args.workers} workers",
                 t_par, runs_par, cpu_par),
                ("(b) same chunks, one at a time (workers=1)", t_seq, runs_seq, cpu_seq),
            ]
            same_ab = got_par.equals(got_seq)
            same_src = _matches_source(got_par, history)
            t = time.perf_counter()
            validate_history(got_par)
            t_validate = time.perf_counter() - t
            gz = None
            if args.gzip:
                # The same two runs with gzip-compressed answers (what requests asks for by
                # default; fetch_history asks for identity): shows where the server's CPU goes.
                prom_module._ACCEPT_ENCODING = "gzip, deflate"
                try:
                    t_gz_par, runs, got_gz, cpu = timed(
                        lambda: fetch_history(par, start, end, workers=args.workers),
                        args.repeat, pid,
                    )
                    rows.append(("(a') as (a), gzip-compressed answers", t_gz_par, runs, cpu))
                    t_gz_seq, runs, _, cpu = timed(
                        lambda: fetch_history(par, start, end, workers=1), args.repeat, pid
                    )
                    rows.append(("(b') as (b), gzip-compressed answers", t_gz_seq, runs, cpu))
                    same_ab = same_ab and got_gz.equals(got_par)
                    gz = t_gz_seq / t_gz_par
                finally:
                    prom_module._ACCEPT_ENCODING = "identity"
            same_c = None
            if not args.skip_naive:
                t_naive, runs_naive, got_naive, cpu_naive = timed(
                    lambda: naive_client_fetch(server.url, start, end, max_points),
                    args.repeat, pid,
                )
                rows.append(
                    (
                        ("(c) prometheus-api-client get_metric_range_data"
                         f"(chunk_size={max_points:,} min)"),
                        t_naive, runs_naive, cpu_naive,
                    )
                )
                same_c = _same(got_naive, got_par)
        finally:
            server.stop()

    requests_per_run = sum(
        -(-(per_series + (1 if "tokens" in uid else 0)) // max_points)
        for uid in history["unique_id"].unique()
    )
    print()
    print(f"{n_series} series x {per_series:,} points, {requests_per_run} range queries per run, "
          f"median of {args.repeat} runs, {os.cpu_count()} CPUs, OMP_NUM_THREADS="
          f"{os.environ.get('OMP_NUM_THREADS')}")
    print()
    print("| variant | median time (s) | runs (s) | vs (b) | client CPU s/run "
          "| Prometheus CPU s/run |")
    print("|---|---|---|---|---|---|")
    for name, med, runs, (cpu_client, cpu_server) in rows:
        print(f"| {name} | {med:.2f} | {', '.join(f'{r:.2f}' for r in runs)} | "
              f"{t_seq / med:.2f}x | {cpu_client:.2f} | {cpu_server:.2f} |")
    print()
    print(f"speed-up (b)/(a): {t_seq / t_par:.2f}x"
          + ("" if gz is None else f"; with gzip-compressed answers (b')/(a'): {gz:.2f}x"))
    cores = os.cpu_count() or 1
    client, server = cpu_seq
    bound = max(client, (client + server) / cores)
    print(f"CPU per run at workers=1: client {client:.2f} s (one interpreter, GIL: ~serial), "
          f"Prometheus {server:.2f} s; on {cores} cores a run cannot take less than "
          f"max(client, total/{cores}) = {bound:.2f} s, i.e. at most {t_seq / bound:.2f}x "
          "over (b). "
          f"validate_history of the result alone takes {t_validate:.2f} s of each run.")
    print(f"(a) == (b): {same_ab}; (a) == generated source (gauges exact, rates rtol 1e-9): "
          f"{same_src}" + ("" if same_c is None else f"; (c) == (a): {same_c}"))
    if not (same_ab and same_src and same_c in (None, True)):
        raise SystemExit(1)


def _same(a: pd.DataFrame, b: pd.DataFrame) -> bool:
    if len(a) != len(b) or not (a["unique_id"].to_numpy() == b["unique_id"].to_numpy()).all():
        return False
    if not (a["ds"].to_numpy() == b["ds"].to_numpy()).all():
        return False
    return bool(np.array_equal(a["y"].to_numpy(), b["y"].to_numpy()))


def _matches_source(got: pd.DataFrame, source: pd.DataFrame) -> bool:
    want = validate_history(source)
    if len(got) != len(want) or not (got["ds"].to_numpy() == want["ds"].to_numpy()).all():
        return False
    if not (got["unique_id"].to_numpy() == want["unique_id"].to_numpy()).all():
        return False
    rate = want["unique_id"].str.endswith("_per_s").to_numpy()
    g, w = got["y"].to_numpy(), want["y"].to_numpy()
    return bool((g[~rate] == w[~rate]).all() and np.isclose(g[rate], w[rate], rtol=1e-9).all())


if __name__ == "__main__":
    main()
