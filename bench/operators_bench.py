"""Benchmark: what the operators' controls (store schema v5) cost the daemon and the console.

    python bench/operators_bench.py [--queued 2000] [--ended 4000] [--repeat 200] [--store URL]

On a SQLite store (or ``--store``, e.g. a PostgreSQL URL) holding ``--queued`` waiting units,
measured in the same run:

- the admission state read every reconcile pass (``JobStore.admission()``) and the daemon's
  status write after every pass (``record_daemon_status``), against the baseline of the
  cheapest read there is, ``schema_version()``;
- a reconcile pass (``Controller.reconcile_once`` on tests/test_controller.py's in-memory
  cluster, nothing to apply: the pool is full) with admission open, and paused (no queue read,
  nothing to decide on), so the read's share of a pass is seen;
- the console's per-request logout check (``session_ended``);
- the daemon's harvested and lost totals read after every pass (``ended_attempt_seconds``
  over ``--ended`` ended attempts, added up by ``StoreTotals.update``).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

import numpy as np
from test_controller import MemoryCluster

import record  # bench/record.py: --record writes the output into docs/bench/
from idlegpu.scheduler.adapters.store import AuditEntry, DaemonStatus, JobStore
from idlegpu.scheduler.controller import Controller
from idlegpu.scheduler.daemon import StoreTotals
from idlegpu.scheduler.specs import expand_units, validate_request
from idlegpu.scheduler.types import FreeProfile, PolicySettings, ServingSignals

NOW = datetime(2026, 1, 28, 11, 0, tzinfo=UTC)


class Signals:
    last_problem = None

    def read(self, now, *, job_gpus=0):
        return ServingSignals(observed_at=now, kv_cache_usage=0.4, idle_gpus=0)


def per_call_ms(fn, repeat: int) -> float:
    """The median of ``repeat`` calls, in milliseconds."""
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1000)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--queued", type=int, default=2000)
    parser.add_argument("--ended", type=int, default=4000)
    parser.add_argument("--repeat", type=int, default=200)
    parser.add_argument("--store", default=None)
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="operators-bench-"))
    store = JobStore(args.store or f"sqlite:///{tmp / 'bench.db'}")
    def submit_sweep(name: str, team: str, runtime: str, at: datetime) -> str:
        """A request of 100 4-GPU units."""
        data = {"name": name, "team": team, "kind": "eval",
                "image": "registry.example.com/research/eval:1.0",
                "command": ["python", "eval.py"], "args": ["--seed", "{seed}"],
                "sweep": {"seed": [str(k) for k in range(100)]}, "gpus": 4,
                "runtime_estimate": runtime}
        request = validate_request(data)
        return store.submit(request.name, request.team, request.kind, data,
                            expand_units(request), at)

    for i in range(args.queued // 100):
        submit_sweep(f"sweep-{i}", f"team-{i % 12}", "2h", NOW - timedelta(hours=1))
    # the ended attempts of a few busy months: admitted and finished an hour later
    month_ago = NOW - timedelta(days=30)
    for i in range(args.ended // 100):
        for unit in store.request_units(submit_sweep(f"done-{i}", f"team-{i % 12}", "1h",
                                                     month_ago)):
            store.admit(unit.id, month_ago)
            store.finished(unit.id, month_ago + timedelta(hours=1))
    # a full pool: nothing is admitted, so every pass does the same work
    profile = FreeProfile(NOW, 300, np.zeros(288), 0.9, NOW)
    controller = Controller(store, MemoryCluster(), Signals(), lambda now: profile,
                            lambda spec: spec.runtime_estimate_s, PolicySettings())
    audit = AuditEntry(at=NOW, actor="bench", auth="cli", role="operator", team=None,
                       action="admission.pause", target="pool")
    status = DaemonStatus(identity="bench-1", host="bench", pid=1, role="single",
                          updated_at=NOW, last_reconcile_at=NOW)
    repeat = args.repeat
    baseline = per_call_ms(store.schema_version, repeat)
    read = per_call_ms(store.admission, repeat)
    write = per_call_ms(lambda: store.record_daemon_status(status), repeat)
    ended = per_call_ms(lambda: store.session_ended("no-such-session"), repeat)
    totals = StoreTotals()
    attempts = len(store.ended_attempt_seconds())
    read_totals = per_call_ms(lambda: totals.update(store.ended_attempt_seconds()), repeat)
    passes = max(5, repeat // 20)
    controller.reconcile_once(NOW)  # warm: the overrun model, the estimates
    open_pass = per_call_ms(lambda: controller.reconcile_once(NOW), passes)
    store.pause_admission(NOW, "bench", audit)
    paused_pass = per_call_ms(lambda: controller.reconcile_once(NOW), passes)
    print(f"store {store.location}, {len(store.queue())} queued units, median of {repeat} "
          f"calls ({passes} passes)")
    print(f"  schema_version() (baseline)      {baseline:8.3f} ms")
    print(f"  admission() (every pass)         {read:8.3f} ms  = {read / baseline:.2f}x baseline")
    print(f"  record_daemon_status() (a pass)  {write:8.3f} ms  = {write / baseline:.2f}x baseline")
    print(f"  session_ended() (every request)  {ended:8.3f} ms  = {ended / baseline:.2f}x baseline")
    label = f"GPU-hours totals ({attempts} ended)"
    print(f"  {label:<32} {read_totals:8.3f} ms  = "
          f"{read_totals / baseline:.2f}x baseline")
    print(f"  reconcile pass, admission open   {open_pass:8.1f} ms; the read is "
          f"{read / open_pass:.2%} of it, the status write {write / open_pass:.2%}, the totals "
          f"{read_totals / open_pass:.2%}")
    print(f"  reconcile pass, paused           {paused_pass:8.1f} ms "
          f"({paused_pass / open_pass:.2f}x the open pass: no queue read, nothing to decide)")
    store.close()


if __name__ == "__main__":
    record.run("operators", main)
