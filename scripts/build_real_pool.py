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
TRACE_SOURCE = REPO / "data" / "sample" / "jobs.yaml"
SAMPLE_FROM = pd.Timestamp("2025-11-05T00:00:00", tz="Asia/Seoul")  # the sample trace: a Wednesday


@dataclass(frozen=True)
class PoolService:
    name: str
    trace: str  # the file of data/real/ (without .csv) whose request rate drives it
    capacity: float  # requests (purchases) per second one replica serves
    gpus_per_replica: int
    min_replicas: int
    max_replicas: int
    series: str | None = None  # the rate's unique_id there; default ``<trace>/request_rate``

    @property
    def rate_id(self) -> str:
        return self.series or f"{self.trace}/{traces.REQUEST_RATE}"


@dataclass(frozen=True)
class PoolSpec:
    """One pool of data/real/: its services, span, clock and job trace."""

    directory: Path
    services: tuple[PoolService, ...]
    timezone: str
    first: pd.Timestamp  # the history's first instant (UTC)
    end: pd.Timestamp  # after its last
    source_step: pd.Timedelta  # the rates' step: each value is held over its 5-minute steps
    stabilization: pd.Timedelta  # the HPA's scale-down window
    trace_from: tuple[pd.Timestamp, ...]  # the sample trace's entries of the days from each ...
    trace_to: pd.Timestamp  # ... moved to the same weekday and local time from here
    trace_days: int
    # the first step after a collection gap is a partial one (its rate counts only the part
    # of the step after collection resumed: ServeGen's read 1 % of their neighbours): missing
    partial_after_gap: bool = False


TIMEZONE = "America/Los_Angeles"
STEP = pd.Timedelta(minutes=5)
REAL_POOL = PoolSpec(
    directory=REAL / "pool",
    services=(
        PoolService("storefront", "msft-ecommerce-api", 18.0, 4, 2, 12),
        PoolService("checkout", "msft-purchases-03", 0.9, 4, 1, 8),
        PoolService("payments", "msft-purchases-04", 0.04, 2, 1, 6),
        PoolService("fraud", "msft-purchases-02", 0.002, 1, 1, 6),
    ),
    timezone=TIMEZONE,
    first=pd.Timestamp("2018-03-15T07:00:00Z"),  # the purchases' first hour (00:00 Pacific)
    end=pd.Timestamp("2018-05-06T07:00:00Z"),  # after their last hour
    source_step=pd.Timedelta(hours=1),
    stabilization=pd.Timedelta(hours=1),
    trace_from=(SAMPLE_FROM,),
    trace_to=pd.Timestamp("2018-04-04T00:00:00", tz=TIMEZONE),  # a Wednesday
    trace_days=31,
)
SERVEGEN_TZ = "Asia/Shanghai"  # the zone the ServeGen trace is pinned to (data/real/README.md)
SERVEGEN_POOL = PoolSpec(
    directory=REAL / "servegen-pool",
    services=tuple(
        PoolService(name, "servegen-m-mid-tenants", capacity, gpus, 1, most,
                    series=f"servegen-m-mid/{name}/{traces.REQUEST_RATE}")
        for name, capacity, gpus, most in (
            ("tenant-a", 250.0, 4, 12),
            ("tenants-b", 60.0, 2, 9),
            ("tenants-c", 150.0, 4, 10),
            ("long-tail", 40.0, 1, 19),
        )),
    timezone=SERVEGEN_TZ,
    first=pd.Timestamp("2025-01-06T00:00:00", tz=SERVEGEN_TZ).tz_convert("UTC"),
    end=pd.Timestamp("2025-01-20T00:00:00", tz=SERVEGEN_TZ).tz_convert("UTC"),
    source_step=pd.Timedelta(minutes=10),
    stabilization=pd.Timedelta(minutes=30),
    # three 11-day stretches of the sample trace, each from a Thursday (24 requests), laid
    # over the pool's last 11 days: a queue that asks for more than the pool lends, from
    # auto's minimum of three days of history on
    trace_from=tuple(pd.Timestamp(day, tz="Asia/Seoul")
                     for day in ("2025-10-30", "2025-11-13", "2025-11-27")),
    trace_to=pd.Timestamp("2025-01-09T00:00:00", tz=SERVEGEN_TZ),
    trace_days=11,
    partial_after_gap=True,
)
POOLS = {"real": REAL_POOL, "servegen": SERVEGEN_POOL}


def trace_rates(spec: PoolSpec = REAL_POOL) -> dict[str, pd.Series]:
    """Per service, its trace's request rate (UTC index) over the pool's span."""
    out = {}
    frames: dict[str, pd.DataFrame] = {}
    for service in spec.services:
        if service.trace not in frames:
            frames[service.trace] = pd.read_csv(REAL / f"{service.trace}.csv")
        frame = frames[service.trace]
        rows = frame[frame["unique_id"] == service.rate_id]
        if rows.empty:
            raise ValueError(f"{service.trace}.csv has no series {service.rate_id}")
        rate = pd.Series(rows["y"].to_numpy(float), index=pd.DatetimeIndex(rows["ds"]))
        out[service.name] = rate[(rate.index >= spec.first) & (rate.index < spec.end)]
    return out


def surge_rates(rates: dict[str, pd.Series], service: str, start: pd.Timestamp, *,
                per_day: float = 0.2, days: int = 3) -> dict[str, pd.Series]:
    """``rates`` with ``service``'s traffic growing ``per_day`` a day (compounded, smoothly)
    for ``days`` days from ``start``, then held at that level: a launch."""
    rate = rates[service]
    elapsed = ((rate.index - start).total_seconds() / 86400).to_numpy()
    factor = (1 + per_day) ** np.clip(elapsed, 0, days)
    return {**rates, service: rate * factor}


def pool_history(rates: dict[str, pd.Series], spec: PoolSpec = REAL_POOL) -> pd.DataFrame:
    """The pool's history (``<service>/replicas``, 5-minute steps) from the services' rates."""
    frames = []
    hold = int(spec.source_step / STEP) - 1
    for service in spec.services:
        rate = rates[service.name]
        if spec.partial_after_gap:
            after_gap = rate.index.to_series().diff() > spec.source_step
            rate = rate[~after_gap.to_numpy()]
        desired = traces.hpa_replicas(rate, capacity=service.capacity, lo=service.min_replicas,
                                      hi=service.max_replicas, stabilization=spec.stabilization)
        steps = pd.date_range(desired.index[0], desired.index[-1] + spec.source_step,
                              freq=STEP, inclusive="left")
        held = desired.reindex(steps, method="ffill", limit=hold)  # a missing step stays so
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


def shift_trace(text: str, spec: PoolSpec = REAL_POOL) -> str:
    """The sample job trace's entries of ``spec.trace_days`` days from each of
    ``spec.trace_from``, moved to the same weekday and local time from ``spec.trace_to`` on
    (see the module docstring), in submission order."""
    _, _, body = text.partition("\njobs:\n")
    entries = re.split(r"(?m)^(?=- name: )", body)
    kept = []
    days = pd.Timedelta(days=spec.trace_days)
    for begin in spec.trace_from:
        for entry in entries:
            if not entry.startswith("- name: "):
                continue
            submit = re.search(r"(?m)^\s*submit_at: (\S+)", entry)
            at = pd.Timestamp(submit.group(1)).tz_convert(begin.tz)
            if not begin <= at < begin + days:
                continue
            lines = [line for line in entry.rstrip("\n").split("\n")
                     if not line.startswith("#")]
            moved = [_moved(line, begin, spec) for line in lines]
            kept.append((pd.Timestamp(_moved(f"submit_at: {submit.group(1)}", begin, spec)
                                      .split(": ", 1)[1]), "\n".join(moved)))
    kept.sort(key=lambda pair: pair[0])
    starts = ", ".join(f"{begin:%Y-%m-%d}" for begin in spec.trace_from)
    note = (f"# The sample job trace (data/sample/jobs.yaml) moved onto this pool's calendar by\n"
            f"# scripts/build_real_pool.py: the {len(kept)} entries submitted in the\n"
            f"# {spec.trace_days} days from {starts} (Seoul), at the same local time and\n"
            f"# weekday from {spec.trace_to:%Y-%m-%d} ({spec.timezone}). Do not edit by hand.\n")
    return note + "jobs:\n" + "\n".join(entry for _, entry in kept) + "\n"


def _moved(line: str, begin: pd.Timestamp, spec: PoolSpec) -> str:
    match = _STAMP.match(line)
    if not match:
        return line
    local = pd.Timestamp(match.group(2)).tz_convert(begin.tz).tz_localize(None)
    days = (local.normalize() - begin.tz_localize(None)).days
    wall = spec.trace_to.tz_localize(None) + pd.Timedelta(days=days) + (local - local.normalize())
    moved = wall.tz_localize(spec.timezone)
    return f"{match.group(1)}{moved.isoformat()}"


def to_csv_text(history: pd.DataFrame) -> str:
    return traces.to_csv_text(history)


def build(spec: PoolSpec, out: Path) -> str:
    """Write the pool's ``history.csv.gz`` and ``jobs.yaml`` to ``out``; what was written."""
    out.mkdir(parents=True, exist_ok=True)
    history = pool_history(trace_rates(spec), spec)
    target = out / "history.csv.gz"
    # mtime 0: the same history gives the same bytes
    with open(target, "wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", mtime=0,
                                                   filename="") as stream:
        stream.write(to_csv_text(history).encode("utf-8"))
    jobs = shift_trace(TRACE_SOURCE.read_text(encoding="utf-8"), spec)
    (out / "jobs.yaml").write_text(jobs, encoding="utf-8")
    return (f"{target}: {len(history)} rows, {history['unique_id'].nunique()} services; "
            f"{out / 'jobs.yaml'}: {jobs.count(chr(10) + '- name: ')} jobs")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pool", choices=[*POOLS, "all"], default="all",
                        help="which pool to build (default: both)")
    parser.add_argument("--out", type=Path,
                        help="a directory for it (default: its folder of data/real/)")
    args = parser.parse_args(argv)
    if args.out is not None and args.pool == "all":
        parser.error("--out needs one --pool")
    for name in POOLS if args.pool == "all" else [args.pool]:
        spec = POOLS[name]
        print(build(spec, args.out or spec.directory))
    return 0


if __name__ == "__main__":
    sys.exit(main())
