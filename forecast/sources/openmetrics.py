"""Write a tidy history as OpenMetrics text, to backfill a Prometheus with ``promtool``.

The metric names and labels are those the example configuration (``idlegpu.yaml``) queries, so
fetching a backfilled Prometheus with that configuration returns the same series::

    replicas                 gauge   kube_deployment_status_replicas{namespace="inference",
                                                                     deployment="<service>"}
    requests_running         gauge   vllm:num_requests_running{model_name="<service>"}
    requests_waiting         gauge   vllm:num_requests_waiting{model_name="<service>"}
    kv_cache_usage           gauge   vllm:kv_cache_usage_perc{model_name="<service>"}
    prompt_tokens_per_s      counter vllm:prompt_tokens_total{model_name="<service>"}
    generation_tokens_per_s  counter vllm:generation_tokens_total{model_name="<service>"}

Token rates become cumulative counters: a first sample 0 one step before the series' first
timestamp, then ``c_i = c_{i-1} + y_i * step`` (``step`` = the series' sampling step), so the
rate between consecutive samples one step apart is ``y_i`` again. Across a gap the counter just
continues from its last value.

Load the file into a fresh directory with::

    promtool tsdb create-blocks-from openmetrics --max-block-duration=486h FILE DATADIR

(promtool rounds the duration down to 2h, 6h, 18h, 54h, 162h or 486h blocks and re-reads the
file once per block: for 45 days of 12 series at 5 min, 24h took 6.3 s here and 486h 0.5 s.)
Start Prometheus with a retention longer than the data's age, e.g. ``4000d``.

Timestamps are written in seconds (OpenMetrics; milliseconds would land in the far future),
values with ``repr`` so they read back exactly, every family's samples together, ``# EOF`` last.
"""

from __future__ import annotations

import io
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from idlegpu.forecast.errors import HistoryError
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
    infer_step,
    split_series_id,
    validate_history,
)

if TYPE_CHECKING:
    from idlegpu.forecast.config import Settings

__all__ = ["FAMILIES", "Family", "iter_openmetrics", "openmetrics_text", "write_openmetrics"]


@dataclass(frozen=True)
class Family:
    """How one metric of a service is exposed to Prometheus."""

    name: str
    """Metric family name (``# TYPE`` line); counters' samples carry ``_total``."""
    type: str
    """``gauge`` or ``counter``."""
    help: str
    service_label: str
    """Label holding the service name."""
    extra_labels: tuple[tuple[str, str], ...] = ()
    """Labels written before the service label."""

    @property
    def sample_name(self) -> str:
        return f"{self.name}_total" if self.type == "counter" else self.name

    def labels(self, service: str) -> str:
        pairs = [*self.extra_labels, (self.service_label, service)]
        return ",".join(f'{k}="{_escape_label(v)}"' for k, v in pairs)


FAMILIES: dict[str, Family] = {
    REPLICAS: Family(
        "kube_deployment_status_replicas",
        "gauge",
        "The number of replicas per deployment.",
        "deployment",
        (("namespace", "inference"),),
    ),
    REQUESTS_RUNNING: Family(
        "vllm:num_requests_running",
        "gauge",
        "Number of requests currently running on GPU.",
        "model_name",
    ),
    REQUESTS_WAITING: Family(
        "vllm:num_requests_waiting",
        "gauge",
        "Number of requests waiting to be processed.",
        "model_name",
    ),
    KV_CACHE_USAGE: Family(
        "vllm:kv_cache_usage_perc",
        "gauge",
        "KV-cache usage. 1 means 100 percent usage.",
        "model_name",
    ),
    PROMPT_TOKENS_PER_S: Family(
        "vllm:prompt_tokens",
        "counter",
        "Number of prefill tokens processed.",
        "model_name",
    ),
    GENERATION_TOKENS_PER_S: Family(
        "vllm:generation_tokens",
        "counter",
        "Number of generation tokens processed.",
        "model_name",
    ),
}


def _escape_label(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _format_values(values: np.ndarray) -> list[str]:
    """Shortest round-trip text of each float (``repr``), with OpenMetrics' NaN/+Inf/-Inf."""
    text = list(map(repr, values.tolist()))
    if not np.isfinite(values).all():
        for i in np.flatnonzero(~np.isfinite(values)).tolist():
            v = values[i]
            text[i] = "NaN" if np.isnan(v) else ("+Inf" if v > 0 else "-Inf")
    return text


def _format_timestamps(ns: np.ndarray, uid: str) -> list[str]:
    """Nanoseconds since the epoch -> seconds (integers; 3 decimals only if a sample needs ms)."""
    if (ns % 1_000_000).any():
        raise HistoryError(
            f"series {uid}: timestamps finer than a millisecond cannot be stored in Prometheus; "
            "round ds to whole seconds"
        )
    ms = ns // 1_000_000
    if not (ms % 1000).any():
        return list(map(str, (ms // 1000).tolist()))
    sec, frac = np.divmod(ms, 1000)
    return [f"{s}.{f:03d}" for s, f in zip(sec.tolist(), frac.tolist(), strict=True)]


def _series_step_seconds(
    frame: pd.DataFrame, uid: str, fallback: pd.Timedelta | None
) -> float:
    if len(frame) >= 2:
        step = infer_step(frame)
    elif fallback is not None:
        step = fallback
    else:
        raise HistoryError(
            f"series {uid}: cannot infer its sampling step from a single sample; pass the step "
            "(step_seconds) or a config with prometheus.step_seconds"
        )
    return step.total_seconds()


def _counter_values(y: np.ndarray, step_s: float, uid: str) -> np.ndarray:
    if (y < 0).any():
        bad = float(y[y < 0][0])
        raise HistoryError(
            f"series {uid}: negative token rate {bad!r}; a counter-backed rate must be >= 0"
        )
    if not np.isfinite(y).all():
        raise HistoryError(f"series {uid}: a counter-backed rate must be finite")
    out = np.empty(len(y) + 1, dtype=np.float64)
    out[0] = 0.0
    np.cumsum(y * step_s, out=out[1:])
    return out


def iter_openmetrics(
    history: pd.DataFrame,
    settings: Settings | None = None,
    *,
    step_seconds: float | None = None,
) -> Iterator[str]:
    """The OpenMetrics text of ``history``, in pieces (one per series block), ``# EOF`` last.

    ``step_seconds`` (else the whole history's step, else ``prometheus.step_seconds`` of
    ``settings``) is used for series too short to infer their own step.
    """
    frame = validate_history(history, source="history")
    if frame.empty:
        yield "# EOF\n"
        return

    fallback: pd.Timedelta | None = None
    if step_seconds is not None:
        fallback = pd.Timedelta(seconds=step_seconds)
    else:
        try:
            fallback = infer_step(frame)
        except HistoryError:
            if settings is not None:
                fallback = pd.Timedelta(seconds=settings.prometheus.step_seconds)

    uids = frame[UNIQUE_ID].to_numpy(dtype=object)
    # Row ranges of each series (the frame is sorted by series, then time).
    starts = np.flatnonzero(np.r_[True, uids[1:] != uids[:-1]])
    ends = np.r_[starts[1:], len(frame)]
    by_metric: dict[str, list[tuple[str, int, int]]] = {m: [] for m in FAMILIES}
    for lo, hi in zip(starts.tolist(), ends.tolist(), strict=True):
        uid = str(uids[lo])
        service, metric = split_series_id(uid)
        if metric not in FAMILIES:
            raise HistoryError(
                f"series {uid}: no Prometheus metric for {metric or '(none)'!r}; series ids must "
                f"be <service>/<metric> with metric one of {', '.join(FAMILIES)}"
            )
        by_metric[metric].append((service, lo, hi))

    ds_ns = frame[DS].array.asi8  # UTC nanoseconds since the epoch
    ys = frame[Y].to_numpy(dtype=np.float64)

    for metric, family in FAMILIES.items():
        members = by_metric[metric]
        if not members:
            continue
        yield f"# HELP {family.name} {family.help}\n# TYPE {family.name} {family.type}\n"
        for service, lo, hi in members:
            uid = f"{service}/{metric}"
            ts = ds_ns[lo:hi]
            y = ys[lo:hi]
            if family.type == "counter":
                step_s = _series_step_seconds(frame.iloc[lo:hi], uid, fallback)
                y = _counter_values(y, step_s, uid)
                ts = np.r_[ts[0] - round(step_s * 1e9), ts]
            prefix = f"{family.sample_name}{{{family.labels(service)}}} "
            values = _format_values(y)
            stamps = _format_timestamps(ts, uid)
            # "<prefix><value> <ts>\n" per sample, built by C-level joins.
            body = ("\n" + prefix).join(map(" ".join, zip(values, stamps, strict=True)))
            yield prefix + body + "\n"
    yield "# EOF\n"


def openmetrics_text(
    history: pd.DataFrame,
    settings: Settings | None = None,
    *,
    step_seconds: float | None = None,
) -> str:
    """The whole OpenMetrics exposition of ``history`` as one string (see ``iter_openmetrics``)."""
    buffer = io.StringIO()
    for piece in iter_openmetrics(history, settings, step_seconds=step_seconds):
        buffer.write(piece)
    return buffer.getvalue()


def write_openmetrics(
    history: pd.DataFrame,
    settings: Settings | None,
    out: str | Path,
    *,
    step_seconds: float | None = None,
) -> Path:
    """Write ``history`` as OpenMetrics for ``promtool tsdb create-blocks-from openmetrics``.

    Streams one series block at a time; the file is written to a temporary name and renamed, so
    a failure never leaves half a file behind. Returns ``out``.
    """
    file = Path(out)
    file.parent.mkdir(parents=True, exist_ok=True)
    tmp = file.with_name(file.name + ".tmp")
    try:
        with open(tmp, "w", encoding="utf-8", newline="\n") as handle:
            handle.writelines(iter_openmetrics(history, settings, step_seconds=step_seconds))
        tmp.replace(file)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return file
