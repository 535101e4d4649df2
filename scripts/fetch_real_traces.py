"""Regenerate the real-traffic histories in data/real/ from public GitHub repositories.

    python scripts/fetch_real_traces.py [--nab DIR] [--cloud-monitoring DIR] [--servegen DIR] \
        [--out data/real]    # the traces of the sources given

``DIR`` is a copy of the source repository: a bare git directory (a mirror or ``git clone
--bare``), or an ordinary clone (its work tree). The raw files are read at the pinned commit
(bare directory) or from the work tree, and each one's git blob id is checked against the one
recorded below before anything is converted, so a different version of a raw file is refused
instead of silently giving other numbers. Nothing is downloaded here.

Sources (details, licences and the exact rules in data/real/README.md):

* ``nab-elb``: numenta/NAB ``data/realAWSCloudwatch/elb_request_count_8c0756.csv``, the request
  count of an AWS Elastic Load Balancer per 5 minutes, 2014-04-10 to 2014-04-24 (MIT);
* ``msft-ecommerce-api``: microsoft/cloud-monitoring-dataset
  ``data/ecommerce-api-incoming-rps/api-01.csv``, the hourly incoming request rate of a
  Microsoft e-commerce API, 2017-11-01 to 2018-07-16 (MIT);
* ``msft-mongodb``: microsoft/cloud-monitoring-dataset
  ``data/mongodb-machine-rps/machine-01.csv``, the per-minute query rate of one production
  MongoDB server, 2018-06-13 to 2018-06-26 (MIT);
* ``msft-purchases-02``, ``-03``, ``-04``: microsoft/cloud-monitoring-dataset
  ``data/consumer-purchase-rate/purchase-0N.csv``, the hourly count of in-app purchases in
  three markets, 2018-03-15 to 2018-05-05, the span of the e-commerce API's (MIT);
* ``servegen-m-mid``: alibaba/ServeGen ``data/language/m-mid/chunk-*-trace.csv``, the request
  rate of each of the 109 API clients of one language-model family of a cloud model platform
  per 10 minutes over 14 days, summed (Apache-2.0; its files and blob ids in
  ``data/real/servegen-m-mid.blobs``).

Each trace becomes one tidy history ``data/real/<trace>.csv`` (``unique_id, ds, y``) with two
series: ``<trace>/request_rate`` (mean requests per second over each step) and
``<trace>/replicas`` (the replica count an HPA-like autoscaler would have run, ``hpa_replicas``).
ServeGen also gives ``data/real/servegen-m-mid-tenants.csv``: the request rates of four groups of
its clients (``SERVEGEN_TENANTS``), the services of the ServeGen pool
(``scripts/build_real_pool.py``).
"""

from __future__ import annotations

import argparse
import hashlib
import io
import math
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

MANIFESTS = Path(__file__).resolve().parents[1] / "data" / "real"  # folder sources' file lists
REQUEST_RATE = "request_rate"
REPLICAS = "replicas"
COLUMNS = ["unique_id", "ds", "y"]


@dataclass(frozen=True)
class Source:
    repo: str  # owner/name on GitHub
    commit: str  # the commit the raw file is read at (bare git directory)
    path: str  # the file inside the repository (a folder, for a source of several files)
    blob: str  # its git blob id: the exact bytes converted (a folder: its git tree id)
    licence: str
    manifest: str | None = None  # a folder's files and their blob ids (data/real/<this>)


@dataclass(frozen=True)
class Trace:
    """One public trace and how it becomes a history."""

    name: str
    source: Source
    # "nab" (timestamp,value: requests per 5 min) | "cmd" (TimeStamp,Value,Label: a rate) |
    # "servegen" (one file a client: offset s,rate req/s over the next step,...; summed)
    kind: str
    step: pd.Timedelta  # the step of the derived history
    capacity: float  # requests per second one replica serves
    min_replicas: int
    max_replicas: int
    stabilization: pd.Timedelta  # scale-down stabilization window
    wall_clock_tz: str | None = None  # raw times are this zone's wall clock, not UTC
    per_seconds: float = 1.0  # the raw value counts events over this many seconds (1: a rate)
    timezone: str = "UTC"  # the pool time zone the benchmark uses for this trace
    holiday_country: str | None = None
    start: str | None = None  # servegen: the instant offset 0 is pinned to (none is published)

    @property
    def csv(self) -> str:
        return f"{self.name}.csv"

    @property
    def tenants_csv(self) -> str:
        """servegen: the request rates of the family's tenant groups (the ServeGen pool's)."""
        return f"{self.name}-tenants.csv"


NAB = "numenta/NAB"
CMD = "microsoft/cloud-monitoring-dataset"
SERVEGEN = "alibaba/ServeGen"
NAB_COMMIT = "ea702d75cc2258d9d7dd35ca8e5e2539d71f3140"
CMD_COMMIT = "6a07a53c2fac495fb6831811df4c980d6c04bd10"
SERVEGEN_COMMIT = "f891d1189eb32b3868dfc443800c4150548c282a"

def _purchases(n: str, blob: str, capacity: float) -> Trace:
    """The hourly count of in-app purchases of one market, read on the e-commerce API's wall
    clock (same publisher and span; no clock change falls inside it to prove it)."""
    return Trace(
        name=f"msft-purchases-{n}",
        source=Source(CMD, CMD_COMMIT, f"data/consumer-purchase-rate/purchase-{n}.csv", blob,
                      "MIT"),
        kind="cmd",
        step=pd.Timedelta(hours=1),
        capacity=capacity,
        min_replicas=1,
        max_replicas=16,
        stabilization=pd.Timedelta(hours=1),
        wall_clock_tz="America/Los_Angeles",
        per_seconds=3600.0,
        timezone="America/Los_Angeles",
        holiday_country="US",
    )


TRACES = (
    Trace(
        name="nab-elb",
        source=Source(NAB, NAB_COMMIT, "data/realAWSCloudwatch/elb_request_count_8c0756.csv",
                      "c2c83f9f470653d5db71f8aa6a038a98e075c7ae", "MIT"),
        kind="nab",
        step=pd.Timedelta(minutes=5),
        capacity=0.08,
        min_replicas=1,
        max_replicas=16,
        stabilization=pd.Timedelta(minutes=30),
    ),
    Trace(
        name="msft-ecommerce-api",
        source=Source(CMD, CMD_COMMIT, "data/ecommerce-api-incoming-rps/api-01.csv",
                      "18fca867dcd996d505ea961a1e63125617165b57", "MIT"),
        kind="cmd",
        step=pd.Timedelta(hours=1),
        capacity=12.0,
        min_replicas=1,
        max_replicas=16,
        stabilization=pd.Timedelta(hours=1),
        # the raw "Z" times repeat 01:00 on 2017-11-05 and skip 02:00 on 2018-03-11: US wall
        # clock (the zone itself is not published; Pacific is assumed)
        wall_clock_tz="America/Los_Angeles",
        timezone="America/Los_Angeles",
        holiday_country="US",
    ),
    Trace(
        name="msft-mongodb",
        source=Source(CMD, CMD_COMMIT, "data/mongodb-machine-rps/machine-01.csv",
                      "da43e20272dfc5678cdae4b4ed3c6513ffa6c82a", "MIT"),
        kind="cmd",
        step=pd.Timedelta(minutes=5),
        capacity=150.0,
        min_replicas=1,
        max_replicas=16,
        stabilization=pd.Timedelta(minutes=30),
    ),
    *(_purchases(n, blob, capacity) for n, blob, capacity in (
        ("02", "40ceedd319419079658ed1383a06a1863a83656e", 0.0006),
        ("03", "48521e9a0b4f660ec5318da46a3bfee75ec65f38", 0.36),
        ("04", "efa4e9b152efb67100eaa30c2568bedf6751b659", 0.016),
    )),
    Trace(
        # the m-mid language-model family of a cloud model platform: 109 API clients, 14 days
        # at 10 minutes. Offset 0 is a midnight (the publisher's own example reads offset
        # 72,000 s as 20:00); which day and zone is not published: pinned to Monday 2025-01-06
        # in Asia/Shanghai (no public holiday falls in its 14 days)
        name="servegen-m-mid",
        source=Source(SERVEGEN, SERVEGEN_COMMIT, "data/language/m-mid",
                      "42ddd24ec2a7b4e6be0ba2c6c97a9111a35bf3ca", "Apache-2.0",
                      manifest="servegen-m-mid.blobs"),
        kind="servegen",
        step=pd.Timedelta(minutes=10),
        capacity=300.0,
        min_replicas=1,
        max_replicas=16,
        stabilization=pd.Timedelta(minutes=30),
        timezone="Asia/Shanghai",
        holiday_country="CN",
        start="2025-01-06T00:00:00+08:00",
    ),
)
BY_NAME = {t.name: t for t in TRACES}


def git_blob_id(data: bytes) -> str:
    """The id git gives a file with these bytes (``git hash-object``)."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def read_raw(root: Path, source: Source) -> bytes:
    """The raw file from a bare git directory (at the pinned commit) or a clone's work tree,
    refused unless its bytes are the recorded blob."""
    root = Path(root)
    if (root / "objects").is_dir() and (root / "HEAD").is_file():
        done = subprocess.run(
            ["git", "--git-dir", str(root), "show", f"{source.commit}:{source.path}"],
            capture_output=True, check=False,
        )
        if done.returncode != 0:
            raise SystemExit(
                f"error: {root} has no {source.path} at commit {source.commit} of "
                f"{source.repo}: {done.stderr.decode(errors='replace').strip()}"
            )
        data = done.stdout
    else:
        path = root / source.path
        if not path.is_file():
            raise SystemExit(f"error: {path} not found; pass a copy of {source.repo}")
        data = path.read_bytes()
    got = git_blob_id(data)
    if got != source.blob:
        raise SystemExit(
            f"error: {source.repo}:{source.path} has blob {got}, expected {source.blob} "
            f"(commit {source.commit}); this is another version of the raw file"
        )
    return data


def read_manifest(path: Path) -> list[tuple[str, str]]:
    """``(file name, blob id)`` per line of a folder source's manifest (``#`` comments)."""
    entries = []
    for line in path.read_text(encoding="utf-8").splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, blob = line.split()
            entries.append((name, blob))
    return entries


def read_raw_files(root: Path, source: Source, manifest: Path) -> dict[str, bytes]:
    """Every file the manifest names in the source's folder, each refused unless its bytes
    are its recorded blob; from a bare git directory the folder's tree id is checked too."""
    root = Path(root)
    if (root / "objects").is_dir() and (root / "HEAD").is_file():
        tree = subprocess.run(
            ["git", "--git-dir", str(root), "rev-parse", f"{source.commit}:{source.path}"],
            capture_output=True, text=True, check=False).stdout.strip()
        if tree != source.blob:
            raise SystemExit(f"error: {source.repo}:{source.path} at {source.commit} is tree "
                             f"{tree or '(none)'}, expected {source.blob}")
    out = {}
    for name, blob in read_manifest(manifest):
        out[name] = read_raw(root, Source(source.repo, source.commit, f"{source.path}/{name}",
                                          blob, source.licence))
    return out


def servegen_clients(files: dict[str, bytes], start: str, step: pd.Timedelta) -> pd.DataFrame:
    """ServeGen clients' traces (``offset,rate,cv,family,p1,p2``: the client's mean request
    rate in req/s over the ``step`` from ``offset`` seconds), one column per file, offset 0 at
    ``start`` (a client without a row at a step sent nothing then: 0). A step where every
    client's rate is 0 is the data's own collection gap (84 steps, 14 h, in m-mid): dropped,
    missing rather than an idle service."""
    columns = {}
    for name in sorted(files):
        raw = pd.read_csv(io.BytesIO(files[name]), header=None,
                          names=["offset", "rate", "cv", "family", "p1", "p2"],
                          usecols=["offset", "rate"])
        rate = pd.Series(raw["rate"].astype(float).to_numpy(),
                         index=raw["offset"].astype(int).to_numpy())
        if rate.index.duplicated().any() or (rate.index % int(step.total_seconds())).any():
            raise ValueError(f"{name}: offsets are not one per {step} step")
        columns[name] = rate
    if not columns:
        raise ValueError("no client files")
    clients = pd.DataFrame(columns).sort_index().fillna(0.0)
    clients = clients[clients.sum(axis=1) > 0]
    origin = pd.Timestamp(start).tz_convert("UTC")
    clients.index = origin + pd.to_timedelta(clients.index, unit="s")
    return clients


def parse_servegen(files: dict[str, bytes], start: str, step: pd.Timedelta) -> pd.Series:
    """The family's load: its clients' rates (``servegen_clients``) summed."""
    return servegen_clients(files, start, step).sum(axis=1)


# The m-mid family's clients split into four tenant groups by their mean rate over the 14 days
# (ranks 1, 2-3, 4-20, 21-109), each group served by its own deployment in the ServeGen pool
# (data/real/servegen-pool/): a platform's largest tenants get dedicated endpoints. The chunk
# numbers are pinned here, so the groups are data, not a ranking recomputed on each run.
SERVEGEN_TENANTS = {
    "tenant-a": (60,),
    "tenants-b": (36, 73),
    "tenants-c": (101, 66, 93, 15, 40, 23, 30, 70, 14, 71, 11, 21, 7, 48, 80, 92, 53),
}
SERVEGEN_LONG_TAIL = "long-tail"  # every other client


def servegen_tenant_rates(clients: pd.DataFrame) -> pd.DataFrame:
    """Each tenant group's summed request rate (one column per group, ``SERVEGEN_TENANTS``
    then ``long-tail``) from ``servegen_clients``' columns (``chunk-N-trace.csv``)."""
    named = {f"chunk-{n}-trace.csv": group
             for group, numbers in SERVEGEN_TENANTS.items() for n in numbers}
    missing = sorted(set(named) - set(clients.columns))
    if missing:
        raise ValueError(f"tenant clients absent from the files: {', '.join(missing)}")
    groups = [named.get(name, SERVEGEN_LONG_TAIL) for name in clients.columns]
    out = clients.T.groupby(groups).sum().T
    return out[[*SERVEGEN_TENANTS, SERVEGEN_LONG_TAIL]]


def tenant_frame(trace: "Trace", clients: pd.DataFrame) -> pd.DataFrame:
    """The tidy ``<trace>/<group>/request_rate`` series of the tenant groups."""
    rates = servegen_tenant_rates(clients)
    return pd.concat([pd.DataFrame({"unique_id": f"{trace.name}/{group}/{REQUEST_RATE}",
                                    "ds": rates.index, "y": rates[group].round(6).to_numpy()})
                      for group in rates.columns], ignore_index=True)


def parse_nab(text: str) -> pd.Series:
    """NAB ``timestamp,value``: requests counted per 5-minute CloudWatch period, naive times
    (read as UTC). Times are floored to the 5-minute grid; the value becomes requests/s."""
    raw = pd.read_csv(io.StringIO(text))
    ds = pd.to_datetime(raw["timestamp"], format="%Y-%m-%d %H:%M:%S").dt.tz_localize("UTC")
    rate = pd.Series(raw["value"].astype(float).to_numpy() / 300.0,
                     index=pd.DatetimeIndex(ds).floor("5min"))
    if rate.index.duplicated().any():
        raise ValueError("two NAB samples fall in one 5-minute step")
    return rate.sort_index()


def parse_cmd(text: str, wall_clock_tz: str | None = None) -> pd.Series:
    """cloud-monitoring-dataset ``TimeStamp,Value,Label`` (the anomaly label is dropped).

    With ``wall_clock_tz`` the times are that zone's wall clock despite their ``Z``: a repeated
    time (the hour the clocks go back) is daylight time the first time and standard time the
    second; a time that does not exist there is refused.
    """
    raw = pd.read_csv(io.StringIO(text), dtype={"TimeStamp": str})
    stamps = raw["TimeStamp"].str.replace("Z", "", regex=False)
    wall = pd.to_datetime(stamps, format="ISO8601")
    values = pd.to_numeric(raw["Value"], errors="raise").astype(float).to_numpy()
    if wall_clock_tz is None:
        index = pd.DatetimeIndex(wall).tz_localize("UTC")
    else:
        first = ~wall.duplicated(keep="first").to_numpy()  # first of a repeated wall time: DST
        try:
            local = pd.DatetimeIndex(wall).tz_localize(
                wall_clock_tz, ambiguous=first, nonexistent="raise"
            )
        except Exception as exc:  # pandas' (or pytz's) NonExistentTimeError
            raise ValueError(
                f"a time that does not exist on the {wall_clock_tz} wall clock: {exc}"
            ) from exc
        index = local.tz_convert("UTC")
    series = pd.Series(values, index=index)
    if series.index.duplicated().any():
        raise ValueError("duplicate instants after reading the wall clock")
    return series.sort_index()


def to_step(series: pd.Series, step: pd.Timedelta) -> pd.Series:
    """Mean over each step (labelled by its start); steps without a sample stay missing."""
    if len(series) > 1 and series.index.to_series().diff().min() == step:
        return series
    binned = series.groupby(series.index.floor(step)).mean()
    binned.index.name = None
    return binned


def hpa_replicas(
    rate: pd.Series, *, capacity: float, lo: int, hi: int, stabilization: pd.Timedelta
) -> pd.Series:
    """The replicas an HPA-like autoscaler runs for this request rate.

    ``desired(t) = clip(ceil(rate(t) / capacity), lo, hi)``; scaling up is immediate and
    scaling down waits out the stabilization window, as Kubernetes' HPA does:
    ``replicas(t) = max desired(s) for t - window <= s <= t`` (over the samples there are; a
    missing sample stays missing).
    """
    desired = np.clip(np.ceil(rate.to_numpy() / capacity - 1e-9), lo, hi)
    desired = pd.Series(desired, index=rate.index)
    held = desired.rolling(stabilization, closed="both").max()
    return held.astype(float)


def convert(trace: Trace, data: bytes | dict[str, bytes]) -> pd.DataFrame:
    """The tidy history of one trace from its raw file's bytes (a folder source: each file's,
    by name)."""
    if trace.kind == "servegen":
        assert isinstance(data, dict) and trace.start is not None
        raw = parse_servegen(data, trace.start, trace.step)
    elif trace.kind == "nab":
        raw = parse_nab(data.decode("utf-8"))  # type: ignore[union-attr]
    elif trace.kind == "cmd":
        raw = parse_cmd(data.decode("utf-8"),  # type: ignore[union-attr]
                        trace.wall_clock_tz) / trace.per_seconds
    else:
        raise ValueError(f"unknown trace kind {trace.kind!r}")
    rate = to_step(raw, trace.step)
    replicas = hpa_replicas(rate, capacity=trace.capacity, lo=trace.min_replicas,
                            hi=trace.max_replicas, stabilization=trace.stabilization)
    frames = []
    for metric, values in ((REQUEST_RATE, rate.round(6)), (REPLICAS, replicas)):
        frames.append(pd.DataFrame({
            "unique_id": f"{trace.name}/{metric}",
            "ds": values.index,
            "y": values.to_numpy(),
        }))
    return pd.concat(frames, ignore_index=True)


def to_csv_text(frame: pd.DataFrame) -> str:
    """The committed CSV: ISO UTC times, ``y`` with at most 6 decimals, no index."""
    out = frame.copy()
    out["ds"] = pd.DatetimeIndex(out["ds"]).tz_convert("UTC").strftime("%Y-%m-%dT%H:%M:%SZ")
    out["y"] = [_number(v) for v in out["y"]]
    return out.to_csv(index=False, lineterminator="\n")


def _number(value: float) -> str:
    if math.isfinite(value) and value == round(value):
        return str(int(value))
    return f"{value:.6f}".rstrip("0").rstrip(".")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nab", type=Path, help="a copy of numenta/NAB")
    parser.add_argument("--cloud-monitoring", type=Path,
                        help="a copy of microsoft/cloud-monitoring-dataset")
    parser.add_argument("--servegen", type=Path, help="a copy of alibaba/ServeGen")
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parents[1]
                        / "data" / "real")
    args = parser.parse_args(argv)
    roots = {NAB: args.nab, CMD: args.cloud_monitoring, SERVEGEN: args.servegen}
    if not any(roots.values()):
        parser.error("give a copy of at least one source: --nab, --cloud-monitoring, --servegen")
    args.out.mkdir(parents=True, exist_ok=True)
    for trace in TRACES:
        source = trace.source
        if roots[source.repo] is None:
            print(f"{trace.name}: skipped (no copy of {source.repo} given)")
            continue
        raw: bytes | dict[str, bytes] = (
            read_raw_files(roots[source.repo], source, MANIFESTS / source.manifest)
            if source.manifest else read_raw(roots[source.repo], source))
        frame = convert(trace, raw)
        target = args.out / trace.csv
        target.write_text(to_csv_text(frame), encoding="utf-8")
        if trace.kind == "servegen":
            assert isinstance(raw, dict) and trace.start is not None
            tenants = tenant_frame(trace, servegen_clients(raw, trace.start, trace.step))
            tenant_target = args.out / trace.tenants_csv
            tenant_target.write_text(to_csv_text(tenants), encoding="utf-8")
            print(f"{tenant_target}: {len(tenants)} rows, {tenants['unique_id'].nunique()} "
                  f"tenant groups")
        span = frame["ds"].max() - frame["ds"].min()
        print(f"{target}: {len(frame)} rows, {frame['unique_id'].nunique()} series, "
              f"{frame['ds'].min():%Y-%m-%d %H:%M} to {frame['ds'].max():%Y-%m-%d %H:%M} UTC "
              f"({span}), step {trace.step}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
