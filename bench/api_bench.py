"""Benchmark: the job API (`idlegpu serve`) against the direct-store path, one run.

    OMP_NUM_THREADS=1 python bench/api_bench.py [--queued 10000] [--submits 200] [--lists 20]

A SQLite store is filled with ``--queued`` queued units (requests of examples/jobs/eval-sweep.yaml,
renamed), then:

* **submit**: ``--submits`` submissions of examples/jobs/sft-rl-eval.yaml, one after another,
  (a) through a real ``idlegpu serve`` (its own process, uvicorn, loopback HTTP, a bearer
  token, YAML body, an idempotency key each) and (b) the direct-store path the CLI's
  ``idlegpu submit --store`` takes (load and validate the file, expand, ``JobStore.submit``),
  in this process;
* **queue listing**: ``--lists`` listings of every live unit, (a) ``GET /v1/units?scope=all``
  and (b) ``JobStore.queue()``.

Prints requests per second and p50/p99 latency of each, and the ratios API / direct measured
in this run (the baseline), then the memory one daemon pass costs for the queue: the peak
Python allocation of the store's ``waiting()`` view (what every pass reads) per queued unit.
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
import tracemalloc
from datetime import UTC, datetime
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import requests
import yaml

import record  # bench/record.py: --record writes the output into docs/bench/
from idlegpu.scheduler.adapters.store import AuditEntry, JobStore
from idlegpu.scheduler.api.auth import new_token, token_sha256
from idlegpu.scheduler.config import load_config
from idlegpu.scheduler.specs import expand_units, load_request, load_request_text

FILL = REPO / "examples" / "jobs" / "eval-sweep.yaml"
SUBMIT = REPO / "examples" / "jobs" / "sft-rl-eval.yaml"


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def fill(store: JobStore, settings, queued: int) -> int:
    """Queue about ``queued`` units; returns how many."""
    text = FILL.read_text(encoding="utf-8")
    base = yaml.safe_load(text)
    units_done, n = 0, 0
    now = datetime(2026, 3, 2, 12, tzinfo=UTC)
    while units_done < queued:
        base["name"] = f"fill-{n:05d}"
        request = load_request_text(yaml.safe_dump(base), settings.admission)
        units = expand_units(request)
        store.submit(request.name, request.team, request.kind,
                     request.model_dump(mode="json"), units, now)
        units_done += len(units)
        n += 1
    return units_done


def percentiles(samples: list[float]) -> tuple[float, float]:
    ordered = sorted(samples)
    p99 = ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))]
    return statistics.median(ordered), p99


def report(name: str, samples: list[float]) -> dict[str, float]:
    p50, p99 = percentiles(samples)
    rps = len(samples) / sum(samples)
    print(f"  {name:<34} {rps:8.1f} req/s   p50 {p50 * 1000:8.1f} ms   p99 {p99 * 1000:8.1f} ms")
    return {"rps": rps, "p50": p50, "p99": p99}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--queued", type=int, default=10_000)
    parser.add_argument("--submits", type=int, default=200)
    parser.add_argument("--lists", type=int, default=20)
    args = parser.parse_args()
    config = REPO / "idlegpu.yaml"
    # --submits requests within a minute from one member: past the default per-member quota
    # (120 requests an hour), which this bench does not measure; the environment reaches the
    # server's config too
    os.environ["IDLEGPU_API__TEAMS"] = json.dumps({"*": {"quota": {
        "requests_per_hour": 10**6, "live_units": 10**7, "stored_bytes": 10**12}}})
    settings = load_config(config)
    assert settings.api.team("alignment").quota.requests_per_hour == 10**6
    with tempfile.TemporaryDirectory() as tmp:
        url = f"sqlite:///{Path(tmp) / 'bench.db'}"
        store = JobStore(url)
        began = time.perf_counter()
        queued = fill(store, settings, args.queued)
        print(f"{queued} units queued in {time.perf_counter() - began:.1f} s")
        token = new_token()
        now = datetime.now(UTC)
        store.create_api_token("bench", "alignment", "operator", token_sha256(token), now, None,
                               AuditEntry(at=now, actor="bench", auth="cli", role="operator",
                                          team=None, action="token.create", target="bench"))
        port = free_port()
        log = open(Path(tmp) / "serve.log", "wb")  # noqa: SIM115  (a pipe nobody reads fills)
        server = subprocess.Popen(
            [str(Path(sys.executable).with_name("idlegpu")), "serve", "--config", str(config),
             "--store", url, "--host", "127.0.0.1", "--port", str(port)],
            cwd=REPO, stdout=log, stderr=subprocess.STDOUT)
        base = f"http://127.0.0.1:{port}/v1"
        session = requests.Session()
        session.headers["Authorization"] = f"Bearer {token}"
        try:
            deadline = time.monotonic() + 60
            while True:
                try:
                    if session.get(f"{base}/whoami", timeout=2).ok:
                        break
                except requests.RequestException:
                    pass
                if server.poll() is not None or time.monotonic() > deadline:
                    raise SystemExit("idlegpu serve did not start: " + (Path(tmp) / "serve.log")
                                     .read_text(errors="replace")[-2000:])
                time.sleep(0.2)
            text = SUBMIT.read_text(encoding="utf-8")
            body = yaml.safe_load(text)
            results: dict[str, dict[str, float]] = {}
            print(f"\nsubmit ({args.submits} each; {SUBMIT.name}):")
            samples = []
            for i in range(args.submits):
                body["name"] = f"api-{i:05d}"
                payload = yaml.safe_dump(body).encode()
                t = time.perf_counter()
                answer = session.post(f"{base}/requests", data=payload, timeout=60, headers={
                    "Content-Type": "application/yaml", "Idempotency-Key": f"bench-{i}"})
                samples.append(time.perf_counter() - t)
                if answer.status_code != 201:
                    raise SystemExit(f"submit refused: {answer.status_code} {answer.text}")
            results["api submit"] = report("(a) API: POST /v1/requests", samples)
            request_file = Path(tmp) / "request.yaml"
            samples = []
            for i in range(args.submits):
                body["name"] = f"direct-{i:05d}"
                request_file.write_text(yaml.safe_dump(body), encoding="utf-8")
                t = time.perf_counter()
                request = load_request(request_file, settings.admission)
                units = expand_units(request)
                store.submit(request.name, request.team, request.kind,
                             request.model_dump(mode="json"), units, datetime.now(UTC))
                samples.append(time.perf_counter() - t)
            results["direct submit"] = report("(b) direct store (CLI's path)", samples)

            live = len(store.queue())
            print(f"\nqueue listing ({args.lists} each; {live} live units):")
            samples = []
            for _ in range(args.lists):
                t = time.perf_counter()
                answer = session.get(f"{base}/units", params={"scope": "all",
                                                              "limit": 10_000}, timeout=120)
                answer.json()
                samples.append(time.perf_counter() - t)
            results["api list"] = report("(a) API: GET /v1/units", samples)
            samples = []
            for _ in range(args.lists):
                t = time.perf_counter()
                store.queue()
                samples.append(time.perf_counter() - t)
            results["direct list"] = report("(b) direct store: JobStore.queue()", samples)
        finally:
            server.terminate()
            server.wait(timeout=30)
            log.close()
        print("\nratios API / direct (same run):")
        for what in ("submit", "list"):
            a, b = results[f"api {what}"], results[f"direct {what}"]
            print(f"  {what:<7} throughput {a['rps'] / b['rps']:.2f}x, "
                  f"p50 {a['p50'] / b['p50']:.2f}x, p99 {a['p99'] / b['p99']:.2f}x")

        tracemalloc.start()
        rows = store.waiting(datetime.now(UTC), lambda row: 3600.0)
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        print(f"\none pass's view of the queue (JobStore.waiting, {len(rows)} units): peak "
              f"{peak / 2**20:.1f} MiB, {peak / max(1, len(rows)) / 1024:.1f} KiB per unit")
        store.close()

        # the worst request the limits accept: 1,024 units, each with 40 args of 300 characters
        worst = JobStore(f"sqlite:///{Path(tmp) / 'worst.db'}")
        base = yaml.safe_load(SUBMIT.read_text(encoding="utf-8"))
        text = yaml.safe_dump({
            "name": "worst", "team": "evaluation", "kind": "eval",
            "image": "registry.example.com/research/lm-eval:0.4.4",
            "gpus": 1, "runtime_estimate": "1h", "parameters": {"blob": "x" * 300},
            "steps": [{"name": f"s{i}", "sweep": {"seed": list(range(256))},
                       "args": ["{blob}"] * 40} for i in range(4)],
            "output": "s3://runs/{name}/{step}/{member}"})
        request = load_request_text(text, settings.admission)
        units = expand_units(request)
        worst.submit(request.name, request.team, request.kind, request.model_dump(mode="json"),
                     units, datetime.now(UTC))
        tracemalloc.start()
        rows = worst.waiting(datetime.now(UTC), lambda row: 3600.0)
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        print(f"the worst accepted request ({len(text)} bytes, {len(units)} units in 4 steps): one pass's "
              f"view of it peaks at {peak / 2**20:.1f} MiB ({len(rows)} units waiting: the first "
              f"step; the others wait on it), {peak / max(1, len(rows)) / 1024:.0f} KiB a unit")
        worst.close()


if __name__ == "__main__":
    record.run("api", main)
