"""Benchmark: what the bounded body reader and the quota check cost a submit, one run.

    OMP_NUM_THREADS=1 python bench/submit_guard_bench.py [--live 2000] [--submits 200]

A SQLite store where the caller already holds ``--live`` live units (its quota's default is
2,000, so the check reads as much as it ever will), then ``--submits`` submissions of
tests/api_server.py's 4-unit request (JSON) to ``POST /v1/requests``, called in-process
through the ASGI app (no network: only the app's own cost), in interleaved rounds of:

* **before**: the app without ``BoundedBodies`` and with the quota check switched off;
* **reader**: the app with ``BoundedBodies``, the quota check still off;
* **now**: the app as ``idlegpu serve`` runs it (the body read under its limit, the quota
  checked in the submission's transaction).

Prints p50 and p99 of each and the ratios to before (the baseline of this run), the quota
check alone (``JobStore.quota_use``) at that use, then one member filling its default quota
with tests/test_api_hostile.py's amplifying request: the store's growth and what a daemon
pass's queue view of those units holds at its peak.
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))

from api_server import job  # noqa: E402
from test_api_plan import settings_for  # noqa: E402

import record  # bench/record.py: --record writes the output into docs/bench/
from idlegpu.scheduler.adapters.store import AuditEntry, JobStore  # noqa: E402
from idlegpu.scheduler.config import ApiQuota  # noqa: E402
from idlegpu.scheduler.server import create_server  # noqa: E402
from idlegpu.scheduler.api.auth import new_token, token_sha256  # noqa: E402
from idlegpu.scheduler.web.bodies import BoundedBodies  # noqa: E402

NOW = datetime(2026, 3, 2, 12, tzinfo=UTC)


async def post(app, path: str, body: bytes, token: str) -> tuple[int, bytes]:
    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1",
             "method": "POST", "scheme": "http", "path": path, "raw_path": path.encode(),
             "query_string": b"", "root_path": "", "client": ("127.0.0.1", 5000),
             "server": ("127.0.0.1", 8080),
             "headers": [(b"authorization", f"Bearer {token}".encode()),
                         (b"content-type", b"application/json"),
                         (b"content-length", str(len(body)).encode())]}
    sent = False

    async def receive():
        nonlocal sent
        if sent:
            return {"type": "http.disconnect"}
        sent = True
        return {"type": "http.request", "body": body, "more_body": False}

    status, chunks = 0, []

    async def send(message):
        nonlocal status
        if message["type"] == "http.response.start":
            status = message["status"]
        elif message["type"] == "http.response.body":
            chunks.append(message.get("body", b""))

    await app(scope, receive, send)
    return status, b"".join(chunks)


def percentiles(samples: list[float]) -> tuple[float, float]:
    ordered = sorted(samples)
    return statistics.median(ordered), ordered[min(len(ordered) - 1,
                                                   round(0.99 * (len(ordered) - 1)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--live", type=int, default=2000)
    parser.add_argument("--submits", type=int, default=200)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        base = settings_for(Path(tmp) / "reports")
        roomy = ApiQuota(live_units=10**7, requests_per_hour=10**7, stored_bytes=10**13)
        settings = base.model_copy(update={"api": base.api.model_copy(
            update={"users": {"bench": roomy}})})
        store = JobStore(f"sqlite:///{Path(tmp) / 'bench.db'}")
        secret = new_token()
        store.create_api_token("bench", "alignment", "member", token_sha256(secret), NOW, None,
                               AuditEntry(at=NOW, actor="bench", auth="cli", role="operator",
                                          team=None, action="token.create", target="bench"))
        now_app = create_server(settings, store, clock=lambda: NOW)
        before_app = create_server(settings, store, clock=lambda: NOW)
        before_app.user_middleware = [m for m in before_app.user_middleware
                                      if m.cls is not BoundedBodies]
        before_app.middleware_stack = None

        loop = asyncio.new_event_loop()
        began = time.perf_counter()
        n = 0
        while n < args.live:  # the caller's live units, through the API itself
            status, text = loop.run_until_complete(post(
                now_app, "/v1/requests", json.dumps(job(f"fill-{n}")).encode(), secret))
            assert status == 201, text
            n += 4
        print(f"{n} live units of the caller in {time.perf_counter() - began:.1f} s")

        checking = store._check_quota
        variants = ("before", "reader", "now")  # reader: the bounded reader, no quota check
        samples: dict[str, list[float]] = {name: [] for name in variants}
        for i in range(args.submits):
            for name in variants if i % 2 else variants[::-1]:
                app = before_app if name == "before" else now_app
                store._check_quota = checking if name == "now" else (lambda *a, **k: None)
                body = json.dumps(job(f"{name}-{i}")).encode()
                start = time.perf_counter()
                status, text = loop.run_until_complete(post(app, "/v1/requests", body, secret))
                samples[name].append(time.perf_counter() - start)
                assert status == 201, text
        store._check_quota = checking
        for name, values in samples.items():
            p50, p99 = percentiles(values)
            print(f"  submit, {name:<7} p50 {p50 * 1000:7.2f} ms   p99 {p99 * 1000:7.2f} ms")
        base = statistics.median(samples["before"])
        for name in ("reader", "now"):
            print(f"  {name} / before (p50): {statistics.median(samples[name]) / base:.3f}")
        use = store.quota_use("token:bench", NOW)
        times = []
        for _ in range(50):
            start = time.perf_counter()
            store.quota_use("token:bench", NOW)
            times.append(time.perf_counter() - start)
        print(f"  quota check alone at {use['live_units']} live units, "
              f"{use['stored_bytes']:,} stored bytes: p50 "
              f"{statistics.median(times) * 1000:.2f} ms")
        store.close()
    at_quota()


def at_quota() -> None:
    """One member filling its default quota with the amplifying request of
    tests/test_api_hostile.py (a 5 kB parameter templated into 256 units) until the 429: how
    much the store grew, and what one daemon pass's view of the queue (``waiting``) holds at
    its peak for that member's units."""
    import tracemalloc

    sys.path.insert(0, str(REPO / "tests"))
    from test_api_hostile import _amplifying

    with tempfile.TemporaryDirectory() as tmp:
        settings = settings_for(Path(tmp) / "reports")
        path = Path(tmp) / "quota.db"
        store = JobStore(f"sqlite:///{path}")
        secret = new_token()
        store.create_api_token("mallory", "alignment", "member", token_sha256(secret), NOW,
                               None, AuditEntry(at=NOW, actor="bench", auth="cli",
                                                role="operator", team=None,
                                                action="token.create", target="mallory"))
        empty = path.stat().st_size
        app = create_server(settings, store, clock=lambda: NOW)
        loop = asyncio.new_event_loop()
        accepted, answer = 0, b""
        for i in range(100):
            status, answer = loop.run_until_complete(post(
                app, "/v1/requests", json.dumps(_amplifying(i)).encode(), secret))
            if status != 201:
                break
            accepted += 1
        use = store.quota_use("token:mallory", NOW)
        grown = (path.stat().st_size - empty) / 1e6
        tracemalloc.start()
        rows = store.waiting(NOW, lambda row: 3600.0)
        peak = tracemalloc.get_traced_memory()[1] / 2**20
        tracemalloc.stop()
        refused = json.loads(answer)["error"]["quota"]["name"]
        print(f"  at quota: {accepted} requests accepted, then {refused}: "
              f"{use['live_units']} live units, "
              f"{use['stored_bytes']:,} stored bytes; the store grew {grown:.0f} MB; a pass's "
              f"queue view of them ({len(rows)} waiting) peaked at {peak:.0f} MiB")
        store.close()


if __name__ == "__main__":
    record.run("submit_guard", main)
