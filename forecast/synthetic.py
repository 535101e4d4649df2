"""A deterministic generator of realistic inference-pool histories.

It produces what Prometheus would hold for an LLM serving pool: per service, the replica count an
HPA-style autoscaler keeps (``kube_deployment_status_replicas``) and the vLLM signals that drive
it (requests running and waiting, KV-cache usage, prompt and generation token throughput).

How the traffic is made (all in the pool's local time zone, stored in UTC):

* request demand of a service = its weekday peak x a daily curve (weekday, weekend or holiday
  shape) x a slow growth trend x a day-to-day level x AR(1) noise, plus occasional unplanned
  spikes at any hour (some at night, which is what preemption must handle);
* Korean public holidays (Chuseok 2025, Christmas, New Year) follow the Sunday curve; the bridge
  day after Chuseok and the year-end eves are quieter than usual;
* the autoscaler targets 70 % utilisation: scale-up is immediate (new pods serve one step later,
  while the model loads), scale-down waits for a 30-minute stabilisation window and ignores
  changes within a 10 % tolerance, as the Kubernetes HPA does;
* signals follow from utilisation: Little's law for running requests, a queue that grows as
  utilisation nears 1, KV-cache usage rising with load;
* a few metric gaps (a Prometheus outage, a vLLM scrape failure, a kube-state-metrics restart).

Everything is drawn from one seeded ``numpy.random.Generator`` in a fixed order, so the same
arguments always give the same frame. The bundled pool is calibrated so that about 50 GPUs are
idle through a typical night and only a handful by day, as the original operator reported.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from zoneinfo import ZoneInfo

import numpy as np
import pandas as pd

from idlegpu.forecast.schema import (
    DS,
    GENERATION_TOKENS_PER_S,
    KV_CACHE_USAGE,
    PROMPT_TOKENS_PER_S,
    REPLICAS,
    REQUESTS_RUNNING,
    REQUESTS_WAITING,
    UNIQUE_ID,
    Y,
    series_id,
)

TARGET_UTILISATION = 0.7
SCALE_DOWN_WINDOW_STEPS = 6  # 30 minutes at 5-minute steps
HPA_TOLERANCE = 0.1

# Hour-of-day anchors (local time) of the demand curves, as a fraction of the weekday peak.
OFFICE_WEEKDAY = {
    0: 0.10, 5: 0.06, 7: 0.14, 8: 0.42, 9: 0.78, 10: 0.95, 11: 1.00, 12: 0.74, 13: 0.86,
    14: 1.00, 15: 1.00, 16: 0.95, 17: 0.84, 18: 0.58, 19: 0.38, 20: 0.28, 21: 0.20, 22: 0.15,
    23: 0.12, 24: 0.10,
}
OFFICE_WEEKEND = {
    0: 0.10, 5: 0.06, 8: 0.10, 10: 0.22, 12: 0.30, 14: 0.34, 16: 0.33, 18: 0.27, 20: 0.22,
    22: 0.15, 24: 0.10,
}
CONSUMER_WEEKDAY = {
    0: 0.16, 3: 0.08, 6: 0.09, 7: 0.18, 8: 0.45, 9: 0.78, 10: 0.94, 11: 1.00, 12: 0.80,
    13: 0.90, 14: 1.00, 15: 0.98, 16: 0.93, 17: 0.82, 18: 0.62, 19: 0.50, 20: 0.46, 21: 0.38,
    22: 0.30, 23: 0.22, 24: 0.16,
}
CONSUMER_WEEKEND = {
    0: 0.16, 3: 0.08, 7: 0.10, 9: 0.22, 11: 0.34, 13: 0.40, 15: 0.42, 17: 0.40, 19: 0.40,
    21: 0.34, 23: 0.22, 24: 0.16,
}


@dataclass(frozen=True)
class ServiceTraffic:
    """How one service's demand and signals behave."""

    name: str
    gpus_per_replica: int
    min_replicas: int
    max_replicas: int
    peak_replicas: float
    """Replicas needed at a weekday peak at the start of the history (at 70 % utilisation)."""
    weekday_curve: dict[int, float]
    weekend_curve: dict[int, float]
    requests_per_replica_s: float
    """Requests per second one replica serves at 100 % utilisation."""
    latency_s: float
    """Mean request duration (for Little's law)."""
    max_num_seqs: int
    """vLLM's cap on concurrently running requests per replica."""
    prompt_tokens: float
    generation_tokens: float
    noise_sd: float = 0.08
    spikes_per_week: float = 0.7
    spike_size: tuple[float, float] = (2.0, 6.0)
    """Extra replica-equivalents of demand an unplanned spike adds (uniform range)."""
    night_batch: tuple[int, int, float] | None = None
    """A nightly batch (start hour, end hour, replica-equivalents), e.g. re-indexing."""


@dataclass(frozen=True)
class PoolTraffic:
    """A pool and its services, in the shape of ``idlegpu.yaml``'s pool section."""

    name: str
    total_gpus: int
    headroom_gpus: int
    timezone: str
    services: tuple[ServiceTraffic, ...]
    start: str = "2025-10-01"
    end: str = "2026-01-31"
    """First and last local day of the history (inclusive)."""
    step_minutes: int = 5
    growth_per_30_days: float = 0.035
    holidays: tuple[str, ...] = (
        "2025-10-03", "2025-10-05", "2025-10-06", "2025-10-07", "2025-10-08", "2025-10-09",
        "2025-12-25", "2026-01-01",
    )
    """Korean public holidays in the sample window (National Foundation Day, Chuseok and its
    substitute day, Hangul Day, Christmas, New Year's Day), fixed here so regeneration does not
    depend on the ``holidays`` package's release."""
    quiet_days: dict[str, float] = field(
        default_factory=lambda: {
            "2025-10-10": 0.55, "2025-12-24": 0.8, "2025-12-31": 0.7, "2026-01-02": 0.85,
        }
    )
    """Working days with lower traffic (bridge days, eves): demand factor."""
    gaps: tuple[tuple[str, str, str], ...] = (
        ("2025-11-12T02:10", "2025-11-12T04:40", "*"),
        ("2025-12-03T13:00", "2025-12-03T13:45", "code/vllm"),
        ("2026-01-14T10:05", "2026-01-14T10:25", "*/replicas"),
    )
    """Metric gaps (local start, local end exclusive, which series): ``*`` all series,
    ``<service>/vllm`` that service's vLLM signals, ``*/replicas`` every replica series."""
    shifts: tuple[tuple[str, float, float], ...] = ()
    """Lasting changes of every service's demand (regimes, for forecaster tests): (local start,
    factor, days): from ``start`` demand grows geometrically to ``factor`` times its level over
    ``days`` days (0: a step) and stays there, e.g. ``("2026-01-19", 1.4, 0)`` a +40 % step,
    ``("2026-01-19", 1.2**3, 3)`` a surge of +20 %/day for three days. None in the sample."""


SAMPLE_POOL = PoolTraffic(
    name="inference-pool-a",
    total_gpus=88,
    headroom_gpus=8,
    timezone="Asia/Seoul",
    services=(
        ServiceTraffic(
            name="chat", gpus_per_replica=4, min_replicas=4, max_replicas=12,
            peak_replicas=10.2, weekday_curve=CONSUMER_WEEKDAY, weekend_curve=CONSUMER_WEEKEND,
            requests_per_replica_s=1.6, latency_s=9.0, max_num_seqs=64,
            prompt_tokens=1400.0, generation_tokens=380.0, spike_size=(2.0, 6.0),
        ),
        ServiceTraffic(
            name="code", gpus_per_replica=4, min_replicas=2, max_replicas=5,
            peak_replicas=4.1, weekday_curve=OFFICE_WEEKDAY, weekend_curve=OFFICE_WEEKEND,
            requests_per_replica_s=2.4, latency_s=4.5, max_num_seqs=64,
            prompt_tokens=2600.0, generation_tokens=160.0, spike_size=(1.0, 3.0),
        ),
        ServiceTraffic(
            name="summarize", gpus_per_replica=4, min_replicas=1, max_replicas=3,
            peak_replicas=2.5, weekday_curve=OFFICE_WEEKDAY, weekend_curve=OFFICE_WEEKEND,
            requests_per_replica_s=0.35, latency_s=24.0, max_num_seqs=32,
            prompt_tokens=6200.0, generation_tokens=420.0, noise_sd=0.12,
            spikes_per_week=0.4, spike_size=(1.0, 2.0),
        ),
        ServiceTraffic(
            name="embed", gpus_per_replica=1, min_replicas=2, max_replicas=6,
            peak_replicas=4.4, weekday_curve=OFFICE_WEEKDAY, weekend_curve=OFFICE_WEEKEND,
            requests_per_replica_s=60.0, latency_s=0.15, max_num_seqs=256,
            prompt_tokens=320.0, generation_tokens=1.0, spikes_per_week=0.3,
            spike_size=(1.0, 2.0), night_batch=(2, 4, 2.2),
        ),
    ),
)


def generate_pool_history(pool: PoolTraffic = SAMPLE_POOL, *, seed: int = 20251001) -> pd.DataFrame:
    """The tidy history (``unique_id, ds, y``; ``ds`` in UTC) of every service of ``pool``."""
    rng = np.random.default_rng(seed)
    tz = ZoneInfo(pool.timezone)
    local = pd.date_range(
        pd.Timestamp(pool.start, tz=tz),
        pd.Timestamp(pool.end, tz=tz) + pd.Timedelta(days=1),
        freq=f"{pool.step_minutes}min",
        inclusive="left",
    )
    calendar = _calendar(local, pool)
    frames = []
    for service in pool.services:
        demand = _demand(service, local, calendar, pool, rng)
        replicas = _autoscale(demand, service)
        signals = _signals(demand, replicas, service, rng)
        signals[REPLICAS] = replicas.astype(float)
        for metric, values in signals.items():
            frames.append(
                pd.DataFrame(
                    {
                        UNIQUE_ID: series_id(service.name, metric),
                        DS: local.tz_convert("UTC"),
                        Y: values,
                    }
                )
            )
    frame = pd.concat(frames, ignore_index=True)
    frame = _drop_gaps(frame, pool, tz)
    frame[UNIQUE_ID] = frame[UNIQUE_ID].astype("string")
    return frame.sort_values([UNIQUE_ID, DS], kind="stable").reset_index(drop=True)


@dataclass(frozen=True)
class _Calendar:
    hour: np.ndarray  # fractional local hour of day
    weekend_like: np.ndarray  # Saturdays, Sundays and holidays
    day_factor: np.ndarray  # quiet working days
    day_index: np.ndarray  # days since the start
    days_elapsed: np.ndarray  # fractional days since the start


def _calendar(local: pd.DatetimeIndex, pool: PoolTraffic) -> _Calendar:
    dates = local.normalize().tz_localize(None)
    holidays = pd.DatetimeIndex(pd.to_datetime(list(pool.holidays)))
    weekend_like = (local.day_of_week >= 5) | dates.isin(holidays)
    day_factor = np.ones(len(local))
    for day, factor in pool.quiet_days.items():
        day_factor[dates == pd.Timestamp(day)] = factor
    elapsed = (local - local[0]) / pd.Timedelta(days=1)
    return _Calendar(
        hour=np.asarray(local.hour + local.minute / 60.0, dtype=float),
        weekend_like=np.asarray(weekend_like),
        day_factor=day_factor,
        day_index=np.asarray(np.floor(elapsed), dtype=int),
        days_elapsed=np.asarray(elapsed, dtype=float),
    )


def _curve(anchors: dict[int, float], hour: np.ndarray) -> np.ndarray:
    xs = np.array(sorted(anchors), dtype=float)
    ys = np.array([anchors[int(x)] for x in xs])
    return np.interp(hour, xs, ys)


def _demand(
    service: ServiceTraffic,
    local: pd.DatetimeIndex,
    cal: _Calendar,
    pool: PoolTraffic,
    rng: np.random.Generator,
) -> np.ndarray:
    """Replica-equivalents of demand at the target utilisation, per step."""
    n = len(local)
    shape = np.where(
        cal.weekend_like,
        _curve(service.weekend_curve, cal.hour),
        _curve(service.weekday_curve, cal.hour),
    )
    trend = 1.0 + pool.growth_per_30_days * cal.days_elapsed / 30.0
    day_level = np.exp(rng.normal(0.0, 0.05, size=cal.day_index.max() + 1))[cal.day_index]
    phi = 0.92
    shocks = rng.normal(0.0, service.noise_sd * math.sqrt(1 - phi**2), size=n)
    noise = np.empty(n)
    noise[0] = shocks[0]
    for i in range(1, n):
        noise[i] = phi * noise[i - 1] + shocks[i]
    demand = service.peak_replicas * shape * trend * day_level * cal.day_factor * np.exp(noise)
    demand = demand * _shift_factor(local, pool)

    if service.night_batch is not None:
        start_h, end_h, size = service.night_batch
        in_batch = (cal.hour >= start_h) & (cal.hour < end_h)
        demand = demand + np.where(in_batch, size, 0.0)

    weeks = n * pool.step_minutes / (60 * 24 * 7)
    n_spikes = rng.poisson(service.spikes_per_week * weeks)
    starts = np.sort(rng.integers(0, n, size=n_spikes))
    lengths = rng.integers(6, 31, size=n_spikes)  # 30 minutes to 2.5 hours
    sizes = rng.uniform(*service.spike_size, size=n_spikes)
    for start, length, size in zip(starts, lengths, sizes):
        end = min(n, start + length)
        ramp = np.minimum(1.0, np.linspace(0.35, 1.6, end - start))
        demand[start:end] += size * ramp
    return demand


def _shift_factor(local: pd.DatetimeIndex, pool: PoolTraffic) -> np.ndarray:
    """The demand factor of ``pool.shifts`` at every step (1 before the first)."""
    factor = np.ones(len(local))
    for start, size, days in pool.shifts:
        elapsed = ((local - pd.Timestamp(start, tz=local.tz)) / pd.Timedelta(days=1)).to_numpy()
        share = np.clip(elapsed / days, 0.0, 1.0) if days > 0 else (elapsed >= 0).astype(float)
        factor *= np.where(elapsed >= 0, size**share, 1.0)
    return factor


def _autoscale(demand: np.ndarray, service: ServiceTraffic) -> np.ndarray:
    """Replicas an HPA keeps: immediate scale-up, stabilised scale-down, 10 % tolerance."""
    n = len(demand)
    replicas = np.empty(n, dtype=int)
    recent: list[int] = []
    current = max(service.min_replicas, min(service.max_replicas, math.ceil(demand[0])))
    for i in range(n):
        ratio = demand[i] / current
        desired = current if abs(ratio - 1.0) <= HPA_TOLERANCE else math.ceil(demand[i] - 1e-9)
        desired = max(service.min_replicas, min(service.max_replicas, desired))
        recent.append(desired)
        if len(recent) > SCALE_DOWN_WINDOW_STEPS:
            recent.pop(0)
        current = desired if desired >= current else max(recent)
        replicas[i] = current
    return replicas


def _signals(
    demand: np.ndarray, replicas: np.ndarray, service: ServiceTraffic, rng: np.random.Generator
) -> dict[str, np.ndarray]:
    # New pods load the model for about one step before they serve.
    ready = np.minimum(replicas, np.concatenate([[replicas[0]], replicas[:-1]])).astype(float)
    rate = demand * TARGET_UTILISATION * service.requests_per_replica_s  # requests/s
    capacity = ready * service.requests_per_replica_s
    utilisation = rate / capacity
    concurrency = rate * service.latency_s * (1.0 + 0.5 * np.clip(utilisation - 0.7, 0, None))
    slots = ready * service.max_num_seqs
    running = np.minimum(concurrency, slots) * np.exp(rng.normal(0, 0.05, size=len(demand)))
    overload = np.clip(utilisation - 0.85, 0.0, None)
    waiting = concurrency * (0.01 * utilisation**6 + 3.0 * overload**1.5)
    waiting = waiting + np.clip(concurrency - slots, 0.0, None)
    waiting = rng.poisson(np.maximum(waiting, 0.0)).astype(float)
    kv = 0.04 + 0.88 * np.clip(utilisation, 0, 1.1) ** 1.15 + rng.normal(0, 0.015, len(demand))
    throughput = rate * np.exp(rng.normal(0, 0.04, size=len(demand)))
    return {
        REQUESTS_RUNNING: np.round(running),
        REQUESTS_WAITING: waiting,
        KV_CACHE_USAGE: np.round(np.clip(kv, 0.0, 1.0), 4),
        PROMPT_TOKENS_PER_S: np.round(throughput * service.prompt_tokens, 1),
        GENERATION_TOKENS_PER_S: np.round(throughput * service.generation_tokens, 1),
    }


def _drop_gaps(frame: pd.DataFrame, pool: PoolTraffic, tz: ZoneInfo) -> pd.DataFrame:
    service = frame[UNIQUE_ID].str.rpartition("/")[0]
    metric = frame[UNIQUE_ID].str.rpartition("/")[2]
    drop = np.zeros(len(frame), dtype=bool)
    for start, end, which in pool.gaps:
        t0 = pd.Timestamp(start, tz=tz).tz_convert("UTC")
        t1 = pd.Timestamp(end, tz=tz).tz_convert("UTC")
        in_time = (frame[DS] >= t0) & (frame[DS] < t1)
        who_service, _, who_metric = which.partition("/")
        if which == "*":
            hit = in_time
        elif who_service == "*":
            hit = in_time & (metric == who_metric)
        elif who_metric == "vllm":
            hit = in_time & (service == who_service) & (metric != REPLICAS)
        else:
            hit = in_time & (frame[UNIQUE_ID] == which)
        drop |= np.asarray(hit)
    return frame[~drop]
