"""Benchmark: pulling 90 days at 1-minute step for 10 series out of a local Prometheus.

    OMP_NUM_THREADS=1 /work/venv/bin/python bench/fetch_bench.py [--days 90] [--repeat 3] \
        [--latency-ms 0,20]

Starts a real Prometheus (the test helper ``tests/prom_server.py``) backfilled from a generated
10-series history (5 services x {replicas gauge, generation-token counter}: 129,600 points per
series at 90 days), then times

  (a) ``fetch_history`` with chunks of ``max_points_per_query`` fetched by 8 parallel workers,
  (b) the very same chunks one at a time (``workers=1``),
  (c) prometheus-api-client's own ``get_metric_range_data(..., chunk_size=...)`` (instant queries
      over range selectors, one after the other), converted to the same tidy frame,

checks that (a), (b) and (c) return the same history, and prints a markdown table, then where
the CPU goes per series (``--breakdown``, on by default): the same queries one at a time, with
Prometheus's CPU, the client's HTTP (requests, reading the body), decoding the answers
(``decode_matrix``; the standard library's ``json`` on the same bodies, the decoding before, for
comparison) and the rest of ``fetch_history`` (joining the chunks, rates, the frame,
``validate_history``).

``--latency-ms`` (repeatable or comma-separated, default ``0,20``) repeats (a) and (b) with an
added network round-trip time: for a latency above 0 the client talks to Prometheus through
``bench/latency_proxy.py``, a loopback TCP proxy run as its own process that delays the bytes of
each direction by half the round trip (no bandwidth limit, no loss, no jitter; new connections pay
no handshake delay). A latency of 0 is the direct loopback connection, as before; (c) and the gzip
variants are only timed there. On loopback nothing waits: the client and Prometheus take turns
on the CPU, so parallel workers can at best spread that work over the cores (at most 2x on 2
cores); across a network (another node, an ingress, a Thanos or Mimir query frontend) every
sequential query also waits one round trip, which parallel chunks overlap.
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from datetime import timedelta
from http.client import HTTPConnection
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import numpy as np
import pandas as pd
from prometheus_api_client import PrometheusConnect

import record  # bench/record.py: --record writes the output into docs/bench/
from idlegpu.forecast.config import load_config
from idlegpu.forecast.schema import validate_history
from idlegpu.forecast.sources import prometheus as prom_module
from idlegpu.forecast.sources.prometheus import counter_rate, fetch_history
from tests.prom_server import PromServer, stop_process

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


def _cpu(pid: int) -> float:
    """CPU seconds (user + system) process ``pid`` has used so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def timed(fn, repeat: int, server_pid: int, proxy_pid: int | None = None):
    """Median wall time of ``repeat`` runs, all wall times, the last result, and the CPU seconds
    per run of this process, of the Prometheus server and of the latency proxy (None: none)."""
    times, result = [], None
    c0, s0 = time.process_time(), _cpu(server_pid)
    p0 = _cpu(proxy_pid) if proxy_pid is not None else None
    for _ in range(repeat):
        t = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - t)
    cpu = (
        (time.process_time() - c0) / repeat,
        (_cpu(server_pid) - s0) / repeat,
        None if p0 is None else (_cpu(proxy_pid) - p0) / repeat,
    )
    return statistics.median(times), times, result, cpu


@contextmanager
def latency_proxy(target_port: int, rtt_ms: float):
    """Run ``bench/latency_proxy.py`` in its own process; yield ``(url, pid)``."""
    proc = subprocess.Popen(
        [sys.executable, str(Path(__file__).with_name("latency_proxy.py")),
         "--target-port", str(target_port), "--rtt-ms", str(rtt_ms)],
        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, text=True,
    )
    try:
        line = proc.stdout.readline().strip()  # "listening 127.0.0.1:<port>"
        if not line.startswith("listening "):
            raise RuntimeError(f"latency proxy did not start (exit {proc.poll()}): {line!r}")
        yield f"http://{line.split()[1]}", proc.pid
    finally:
        stop_process(proc)
        proc.stdout.close()
        if proc.returncode not in (0, -15):
            print(f"warning: latency proxy exited with {proc.returncode}", file=sys.stderr)


def small_request_rtt(url: str, n: int = 9) -> float:
    """Median milliseconds of ``GET /-/ready`` on one kept-alive connection (after a first one)."""
    host, port = url.removeprefix("http://").split(":")
    conn = HTTPConnection(host, int(port), timeout=10)
    try:
        times = []
        for _ in range(n + 1):
            t = time.perf_counter()
            conn.request("GET", "/-/ready")
            resp = conn.getresponse()
            resp.read()
            if resp.status != 200:
                raise RuntimeError(f"{url}/-/ready answered {resp.status}")
            times.append(time.perf_counter() - t)
        return statistics.median(times[1:]) * 1000
    finally:
        conn.close()


def cpu_breakdown(settings, start, end, server_pid: int, repeat: int) -> dict[str, float]:
    """CPU seconds per run of each stage of a sequential fetch (median of ``repeat``): the
    HTTP exchanges alone (client, Prometheus), decoding the bodies (decode_matrix; json.loads,
    the decoding before, and what it took to arrays), and the rest of fetch_history."""
    grid = prom_module.align_range(start, end, STEP)
    reqs = []
    for name in settings.service_names:
        for query in settings.queries_for(name).values():
            first = grid[0] - STEP if query.counter else grid[0]
            for chunk in prom_module.plan_chunks(first, grid[1], STEP,
                                                 settings.prometheus.max_points_per_query):
                reqs.append((query.query, chunk))
    clients = prom_module._Clients(settings)
    session = clients.get()

    def bodies():
        return [
            session.get(clients.query_range_url, params={
                "query": q, "start": c.start, "end": c.end, "step": c.step}, timeout=60).content
            for q, c in reqs
        ]

    def decode_fast(texts):
        for body in texts:
            prom_module.decode_matrix(body)

    def decode_json(texts):  # what prometheus-api-client's response.json() and _to_arrays did
        for body in texts:
            values = json.loads(body)["data"]["result"][0]["values"]
            flat = [x for pair in values for x in pair]
            np.array(flat[0::2], dtype=np.float64)
            prom_module.pa.array(flat[1::2], type=prom_module.pa.string()).cast(
                prom_module.pa.float64()).to_numpy()

    def cpu_of(fn, *args):
        runs = []
        for _ in range(repeat):
            c0, s0 = time.process_time(), _cpu(server_pid)
            out = fn(*args)
            runs.append((time.process_time() - c0, _cpu(server_pid) - s0, out))
        runs.sort(key=lambda r: r[0])
        return runs[len(runs) // 2]

    def assemble():  # fetch_history with the answers already fetched and decoded
        fetched = prom_module._run_all
        cache: dict[str, list] = {}

        def replay(*args, **kwargs):
            if "answers" not in cache:
                cache["answers"] = fetched(*args, **kwargs)
            return cache["answers"]

        prom_module._run_all = replay
        try:
            fetch_history(settings, start, end, workers=1)  # fills the cache
            c0 = time.process_time()
            fetch_history(settings, start, end, workers=1)
            return time.process_time() - c0
        finally:
            prom_module._run_all = fetched

    try:
        http_client, http_server, texts = cpu_of(bodies)
        fast, _, _ = cpu_of(decode_fast, texts)
        old, _, _ = cpu_of(decode_json, texts)
        rest = statistics.median(assemble() for _ in range(repeat))
        whole, whole_server, _ = cpu_of(lambda: fetch_history(settings, start, end, workers=1))
    finally:
        clients.close()
    return {
        "queries": len(reqs), "bytes": sum(len(b) for b in texts),
        "http_client": http_client, "prometheus": http_server, "decode": fast,
        "decode_json": old, "rest": rest, "whole": whole, "whole_prometheus": whole_server,
    }


def parse_latencies(values: list[str] | None) -> list[float]:
    out: list[float] = []
    for value in values or ["0,20"]:
        for part in value.split(","):
            if part.strip():
                ms = float(part)
                if ms < 0:
                    raise SystemExit(f"--latency-ms must be >= 0 (got {ms:g})")
                if ms not in out:
                    out.append(ms)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--days", type=int, default=90)
    parser.add_argument("--repeat", type=int, default=3, help="runs per variant (median shown)")
    parser.add_argument("--workers", type=int, default=8)
    parser.add_argument("--skip-naive", action="store_true")
    parser.add_argument("--breakdown", action=argparse.BooleanOptionalAction, default=True,
                        help="also measure where the CPU of a sequential fetch goes, per series")
    parser.add_argument("--gzip", action=argparse.BooleanOptionalAction, default=True,
                        help="also time (a) and (b) with gzip-compressed answers (latency 0 only)")
    parser.add_argument("--latency-ms", action="append", metavar="MS[,MS...]",
                        help="added network round-trip times in ms, repeatable or comma-separated "
                             "(default 0,20); 0 is the direct loopback connection")
    args = parser.parse_args()
    latencies = parse_latencies(args.latency_ms)

    # rows: (latency ms, variant, median s, runs, (client, server, proxy) CPU s/run, vs-(b) key)
    rows = []
    seq = {}      # latency -> median of (b), the reference of the speed-up column
    par_t = {}    # latency -> median of (a)
    rtts = {}     # latency -> measured ms of a small request
    cpu_seq = {}  # latency -> CPU per run of (b)
    same_all = True
    same_c = None
    gz = None
    breakdown = None
    t_validate = None
    t_total = time.perf_counter()
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
            pid = server.proc.pid
            reference = None
            max_points = settings_for(server.url, args.workers).prometheus.max_points_per_query
            for ms in latencies:
                with (latency_proxy(server.port, ms) if ms > 0 else _direct(server.url)) as (
                    url, proxy_pid,
                ):
                    par = settings_for(url, args.workers)
                    fetch_history(par, start, start + timedelta(hours=1))  # warm-up
                    rtts[ms] = small_request_rtt(url)
                    t_par, runs_par, got_par, cpu_par = timed(
                        lambda: fetch_history(par, start, end, workers=args.workers),
                        args.repeat, pid, proxy_pid,
                    )
                    t_seq, runs_seq, got_seq, cpu_b = timed(
                        lambda: fetch_history(par, start, end, workers=1),
                        args.repeat, pid, proxy_pid,
                    )
                    seq[ms], par_t[ms], cpu_seq[ms] = t_seq, t_par, cpu_b
                    rows.append((ms, f"(a) fetch_history, chunks of {max_points:,} points, "
                                 f"{args.workers} workers", t_par, runs_par, cpu_par))
                    rows.append((ms, "(b) same chunks, one at a time (workers=1)",
                                 t_seq, runs_seq, cpu_b))
                    if reference is None:
                        reference = got_par
                        same_src = _matches_source(got_par, history)
                        t = time.perf_counter()
                        validate_history(got_par)
                        t_validate = time.perf_counter() - t
                    same_all = same_all and got_par.equals(reference) and got_seq.equals(reference)
                    print(f"latency {ms:g} ms done: (a) {t_par:.2f} s, (b) {t_seq:.2f} s",
                          flush=True)
                    if ms > 0:
                        continue
                    if args.gzip:
                        # The same two runs with gzip-compressed answers (what requests asks for
                        # by default; fetch_history asks for identity): where the server's CPU
                        # goes.
                        prom_module._ACCEPT_ENCODING = "gzip, deflate"
                        try:
                            t_gz_par, runs, got_gz, cpu = timed(
                                lambda: fetch_history(par, start, end, workers=args.workers),
                                args.repeat, pid,
                            )
                            rows.append((ms, "(a') as (a), gzip-compressed answers",
                                         t_gz_par, runs, cpu))
                            t_gz_seq, runs, got_gz_seq, cpu = timed(
                                lambda: fetch_history(par, start, end, workers=1),
                                args.repeat, pid,
                            )
                            rows.append((ms, "(b') as (b), gzip-compressed answers",
                                         t_gz_seq, runs, cpu))
                            same_all = (same_all and got_gz.equals(reference)
                                        and got_gz_seq.equals(reference))
                            gz = t_gz_seq / t_gz_par
                        finally:
                            prom_module._ACCEPT_ENCODING = "identity"
                    if not args.skip_naive:
                        t_naive, runs_naive, got_naive, cpu_naive = timed(
                            lambda: naive_client_fetch(url, start, end, max_points),
                            args.repeat, pid,
                        )
                        rows.append((ms, ("(c) prometheus-api-client get_metric_range_data"
                                          f"(chunk_size={max_points:,} min)"),
                                     t_naive, runs_naive, cpu_naive))
                        same_c = _same(got_naive, reference)
                    if args.breakdown:
                        breakdown = cpu_breakdown(par, start, end, pid, args.repeat)
        finally:
            server.stop()
    t_total = time.perf_counter() - t_total

    requests_per_run = sum(
        -(-(per_series + (1 if "tokens" in uid else 0)) // max_points)
        for uid in history["unique_id"].unique()
    )
    print()
    print(f"{n_series} series x {per_series:,} points, {requests_per_run} range queries per run, "
          f"median of {args.repeat} runs, {os.cpu_count()} CPUs, OMP_NUM_THREADS="
          f"{os.environ.get('OMP_NUM_THREADS')}; added round trip 0 = direct loopback, > 0 = "
          "through bench/latency_proxy.py (simulated latency on loopback, no bandwidth limit)")
    print()
    print("| added RTT (ms) | measured small-request RTT (ms) | variant | median time (s) "
          "| runs (s) | vs (b) at same RTT | client CPU s/run | Prometheus CPU s/run "
          "| proxy CPU s/run |")
    print("|---|---|---|---|---|---|---|---|---|")
    for ms, name, med, runs, (cpu_client, cpu_server, cpu_proxy) in rows:
        proxy = "-" if cpu_proxy is None else f"{cpu_proxy:.2f}"
        print(f"| {ms:g} | {rtts[ms]:.1f} | {name} | {med:.2f} | "
              f"{', '.join(f'{r:.2f}' for r in runs)} | {seq[ms] / med:.2f}x | "
              f"{cpu_client:.2f} | {cpu_server:.2f} | {proxy} |")
    print()
    print("speed-up (b)/(a): "
          + "; ".join(f"{seq[ms] / par_t[ms]:.2f}x at +{ms:g} ms" for ms in latencies)
          + ("" if gz is None else f"; with gzip-compressed answers (b')/(a') at +0 ms: "
             f"{gz:.2f}x"))
    for ms in latencies:
        if ms > 0:
            floor = requests_per_run * ms / 1000
            print(f"at +{ms:g} ms: {requests_per_run} sequential round trips alone are "
                  f"{floor:.2f} s of (b); (b) took {seq[ms] - seq[latencies[0]]:+.2f} s "
                  f"more than at +{latencies[0]:g} ms")
    cores = os.cpu_count() or 1
    ref_ms = latencies[0]
    client, srv, _ = cpu_seq[ref_ms]
    bound = (client + srv) / cores
    print(f"CPU per run at workers=1, +{ref_ms:g} ms: client {client:.2f} s, Prometheus "
          f"{srv:.2f} s; (b) took {seq[ref_ms]:.2f} s, so it spent "
          f"{max(0.0, seq[ref_ms] - client - srv):.2f} s waiting on neither; on {cores} cores a "
          f"run cannot take less than total/{cores} = {bound:.2f} s, i.e. at most "
          f"{seq[ref_ms] / bound:.2f}x over (b) at that latency. validate_history of the result "
          f"alone takes {t_validate:.2f} s of each run.")
    if breakdown is not None:
        b = breakdown
        per = 1 / n_series
        print()
        print(f"Where the CPU goes (workers=1, loopback, median of {args.repeat}), per series of "
              f"{per_series:,} points ({b['queries'] / n_series:.0f} queries, "
              f"{b['bytes'] / n_series / 1e6:.1f} MB of JSON) and per run of {n_series}:")
        print()
        print("| stage | CPU ms per series | CPU s per run |")
        print("|---|---|---|")
        for label, key in (
            ("Prometheus: evaluate and write the JSON", "prometheus"),
            ("client: HTTP (requests: prepare, send, read the body)", "http_client"),
            ("client: decode_matrix (orjson + Arrow CSV, GIL released)", "decode"),
            ("client: joining chunks, rates, the frame, validate_history", "rest"),
            ("(for comparison) json.loads + lists to arrays, the decoding before",
             "decode_json"),
        ):
            print(f"| {label} | {b[key] * per * 1000:.1f} | {b[key]:.2f} |")
        total = b["prometheus"] + b["http_client"] + b["decode"] + b["rest"]
        print(f"| sum of the stages (without the comparison row) | {total * per * 1000:.1f} | "
              f"{total:.2f} |")
        print()
        print(f"decode_matrix is {b['decode_json'] / max(b['decode'], 1e-9):.1f}x faster than "
              f"json.loads on the same {b['bytes'] / 1e6:.0f} MB; a sequential fetch_history "
              f"used {b['whole']:.2f} s of client CPU and {b['whole_prometheus']:.2f} s of "
              f"Prometheus's: with nothing to wait for, {cores} cores run it at most "
              f"{cores}x faster, whatever the workers")
    print(f"all (a)/(b) results identical across latencies and variants: {same_all}; "
          f"(a) == generated source (gauges exact, rates rtol 1e-9): {same_src}"
          + ("" if same_c is None else f"; (c) == (a): {same_c}"))
    print(f"total wall time of the benchmark: {t_total:.1f} s")
    if not (same_all and same_src and same_c in (None, True)):
        raise SystemExit(1)


@contextmanager
def _direct(url: str):
    yield url, None


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
    record.run("fetch", main)
