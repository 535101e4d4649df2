"""Build the real-traffic pool of data/real/pool/ from the traces in data/real/.

    python scripts/build_real_pool.py [--out data/real/pool]

Four services of one GPU pool, each driven by a public trace that ran over the same weeks of
2018 (15 March to 5 May, on the same Pacific wall clock), so the services rise and fall together
as they really did: Microsoft's e-commerce API and the hourly in-app purchases of three markets
(``msft-ecommerce-api``, ``msft-purchases-03``, ``-04``, ``-02``; data/real/README.md has the
sources). Each service's replicas come from its trace's request rate by the same HPA-like rule as
the traces' own (``fetch_real_traces.hpa_replicas``), with a per-replica capacity sized for this
pool; each hour's count is held over its twelve 5-minute steps (the resolution the daemon
scrapes at). The pool's configuration is ``data/real/pool/idlegpu.yaml``; its service list must
match ``SERVICES`` here (a test checks it).

The history is ``history.csv.gz``; the job trace ``jobs.yaml`` is the sample's (data/sample/jobs.yaml) moved onto the pool's
calendar: the entries submitted in the 31 days from Wednesday 2025-11-05 (Seoul), each at the
same local time on the same weekday of the weeks from Wednesday 2018-04-04 (Los Angeles),
deadlines moved alike. Nothing else of an entry changes.

``bench/real_pool_bench.py`` simulates the pool as recorded and with the three things that cost
on real pools switched on one at a time: metrics gaps (``with_gaps``), a traffic surge
(``surge_rates``) and jobs that overrun their estimates.
"""

from __future__ import annotations

import argparse
import gzip
import re
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

SCRIPTS = Path(__file__).resolve().parent
REPO = SCRIPTS.parent
sys.path.insert(0, str(SCRIPTS))

import fetch_real_traces as traces  # a script beside this one

REAL = REPO / "data" / "real"
POOL = REAL / "pool"
TIMEZONE = "America/Los_Angeles"
STEP = pd.Timedelta(minutes=5)


@dataclass(frozen=True)
class PoolService:
    name: str
    trace: str  # the trace of data/real/ whose request rate drives it
    capacity: float  # requests (purchases) per second one replica serves
    gpus_per_replica: int
    min_replicas: int
    max_replicas: int


SERVICES = (
    PoolService("storefront", "msft-ecommerce-api", 18.0, 4, 2, 12),
    PoolService("checkout", "msft-purchases-03", 0.9, 4, 1, 8),
    PoolService("payments", "msft-purchases-04", 0.04, 2, 1, 6),
    PoolService("fraud", "msft-purchases-02", 0.002, 1, 1, 6),
)
FIRST = pd.Timestamp("2018-03-15T07:00:00Z")  # the purchases' first hour (00:00 Pacific)
END = pd.Timestamp("2018-05-06T07:00:00Z")  # after their last hour

TRACE_SOURCE = REPO / "data" / "sample" / "jobs.yaml"
TRACE_FROM = pd.Timestamp("2025-11-05T00:00:00", tz="Asia/Seoul")  # a Wednesday
TRACE_TO = pd.Timestamp("2018-04-04T00:00:00", tz=TIMEZONE)  # a Wednesday
TRACE_DAYS = 31


def trace_rates() -> dict[str, pd.Series]:
    """Per service, its trace's request rate (hourly, UTC index) over the pool's span."""
    out = {}
    for service in SERVICES:
        frame = pd.read_csv(REAL / f"{service.trace}.csv")
        rows = frame[frame["unique_id"] == f"{service.trace}/{traces.REQUEST_RATE}"]
        rate = pd.Series(rows["y"].to_numpy(float), index=pd.DatetimeIndex(rows["ds"]))
        out[service.name] = rate[(rate.index >= FIRST) & (rate.index < END)]
    return out


def surge_rates(rates: dict[str, pd.Series], service: str, start: pd.Timestamp, *,
                per_day: float = 0.2, days: int = 3) -> dict[str, pd.Series]:
    """``rates`` with ``service``'s traffic growing ``per_day`` a day (compounded, smoothly)
    for ``days`` days from ``start``, then held at that level: a launch."""
    rate = rates[service]
    elapsed = ((rate.index - start).total_seconds() / 86400).to_numpy()
    factor = (1 + per_day) ** np.clip(elapsed, 0, days)
    return {**rates, service: rate * factor}


def pool_history(rates: dict[str, pd.Series]) -> pd.DataFrame:
    """The pool's history (``<service>/replicas``, 5-minute steps) from the services' rates."""
    frames = []
    for service in SERVICES:
        rate = rates[service.name]
        hourly = traces.hpa_replicas(rate, capacity=service.capacity, lo=service.min_replicas,
                                     hi=service.max_replicas, stabilization=pd.Timedelta(hours=1))
        steps = pd.date_range(hourly.index[0], hourly.index[-1] + pd.Timedelta(hours=1),
                              freq=STEP, inclusive="left")
        held = hourly.reindex(steps, method="ffill", limit=11)  # a missing hour stays missing
        held = held.dropna()
        frames.append(pd.DataFrame({"unique_id": f"{service.name}/{traces.REPLICAS}",
                                    "ds": held.index, "y": held.to_numpy()}))
    return pd.concat(frames, ignore_index=True)


def with_gaps(history: pd.DataFrame, gaps: list[tuple[str | None, pd.Timestamp, pd.Timedelta]]
              ) -> pd.DataFrame:
    """``history`` without the samples of each gap ``(service or None for all, start,
    length)``: a metrics outage, as Prometheus would have it (no rows)."""
    keep = np.ones(len(history), dtype=bool)
    ds = pd.DatetimeIndex(history["ds"])
    for service, start, length in gaps:
        inside = (ds >= start) & (ds < start + length)
        if service is not None:
            inside &= (history["unique_id"] == f"{service}/{traces.REPLICAS}").to_numpy()
        keep &= ~inside
    return history[keep].reset_index(drop=True)


_STAMP = re.compile(r"^(\s*(?:- )?(?:submit_at|deadline): )(\S+)\s*$")


def shift_trace(text: str) -> str:
    """The sample job trace's entries of ``TRACE_DAYS`` days from ``TRACE_FROM``, moved to
    the same weekday and local time from ``TRACE_TO`` on (see the module docstring)."""
    _, _, body = text.partition("\njobs:\n")
    entries = re.split(r"(?m)^(?=- name: )", body)
    kept = []
    for entry in entries:
        if not entry.startswith("- name: "):
            continue
        submit = re.search(r"(?m)^\s*submit_at: (\S+)", entry)
        at = pd.Timestamp(submit.group(1)).tz_convert(TRACE_FROM.tz)
        if not TRACE_FROM <= at < TRACE_FROM + pd.Timedelta(days=TRACE_DAYS):
            continue
        lines = [line for line in entry.rstrip("\n").split("\n") if not line.startswith("#")]
        kept.append("\n".join(_moved(line) for line in lines))
    note = (f"# The sample job trace (data/sample/jobs.yaml) moved onto the real-traffic pool's\n"
            f"# calendar by scripts/build_real_pool.py: the {len(kept)} entries submitted in the\n"
            f"# {TRACE_DAYS} days from {TRACE_FROM:%Y-%m-%d} (Seoul), at the same local time and\n"
            f"# weekday from {TRACE_TO:%Y-%m-%d} ({TIMEZONE}). Do not edit by hand.\n")
    return note + "jobs:\n" + "\n".join(kept) + "\n"


def _moved(line: str) -> str:
    match = _STAMP.match(line)
    if not match:
        return line
    local = pd.Timestamp(match.group(2)).tz_convert(TRACE_FROM.tz).tz_localize(None)
    days = (local.normalize() - TRACE_FROM.tz_localize(None)).days
    wall = TRACE_TO.tz_localize(None) + pd.Timedelta(days=days) + (local - local.normalize())
    moved = wall.tz_localize(TIMEZONE)
    return f"{match.group(1)}{moved.isoformat()}"


def to_csv_text(history: pd.DataFrame) -> str:
    return traces.to_csv_text(history)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=POOL)
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    history = pool_history(trace_rates())
    target = args.out / "history.csv.gz"
    # mtime 0: the same history gives the same bytes
    with open(target, "wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", mtime=0,
                                                   filename="") as out:
        out.write(to_csv_text(history).encode("utf-8"))
    jobs = shift_trace(TRACE_SOURCE.read_text(encoding="utf-8"))
    (args.out / "jobs.yaml").write_text(jobs, encoding="utf-8")
    print(f"{target}: {len(history)} rows, "
          f"{history['unique_id'].nunique()} services; {args.out / 'jobs.yaml'}: "
          f"{jobs.count(chr(10) + '- name: ')} jobs")
    return 0


if __name__ == "__main__":
    sys.exit(main())
