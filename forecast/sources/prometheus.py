"""Read the pool's history from Prometheus: one series per ``<service>/<metric>``.

This is the only module that imports ``prometheus_api_client``. Every range is cut into chunks
below Prometheus's limit of 11,000 points per series per query, the chunks of all series are
fetched in parallel, and the result is the tidy history frame (``unique_id, ds, y``).

Timestamps are aligned to the step grid (start rounded up to a multiple of the step). A gap stays
a gap: nothing is filled or interpolated. (Prometheus itself answers a query at time ``t`` with
the newest sample up to 5 minutes old, so the first step after a series stops may repeat its
last value; idlegpu does not add anything beyond that.)

Counter queries (``counter: true``) are turned into per-second rates between consecutive
samples exactly one step apart (``counter_rate``); a decrease is a counter reset.
"""

from __future__ import annotations

import ast
import json
import math
import threading
from collections.abc import Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from itertools import chain
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import requests
from prometheus_api_client import PrometheusApiClientException, PrometheusConnect
from urllib3.exceptions import ReadTimeoutError
from urllib3.util.retry import Retry

from forecast.config import MetricQuery, Settings
from forecast.errors import ConfigError, IdlegpuError, SourceUnavailableError
from forecast.schema import (
    DS,
    LIVE_METRICS,
    UNIQUE_ID,
    Y,
    empty_history,
    series_id,
    validate_history,
)

__all__ = ["Chunk", "align_range", "counter_rate", "fetch_history", "plan_chunks"]

# Prometheus refuses a range query of more than this many points per series (HTTP 400).
PROMETHEUS_MAX_POINTS = 11_000
# Statuses worth retrying: overloaded or restarting servers and proxies.
_RETRY_STATUSES = (429, 500, 502, 503, 504)
_BACKOFF_FACTOR = 0.5
_URL_HINT = "check prometheus.url or IDLEGPU_PROMETHEUS__URL"
# Ask for uncompressed JSON. Prometheus gzips its answers when asked (requests asks by
# default); measured on 2 cores with a local server (bench/fetch_bench.py, 1.3M points), gzip
# quadrupled Prometheus's CPU (2.2 vs 0.5 CPU s) and made a sequential fetch 1.8x slower. A
# 10,000-point answer is ~335 kB: cheap to send uncompressed on an in-cluster network.
_ACCEPT_ENCODING = "identity"


# --------------------------------------------------------------------------- chunk planning


@dataclass(frozen=True)
class Chunk:
    """One range query: ``points`` samples at ``start, start + step, ..., end`` (epoch seconds)."""

    start: int
    end: int
    step: int

    @property
    def points(self) -> int:
        return (self.end - self.start) // self.step + 1


def align_range(start: datetime, end: datetime, step: int) -> tuple[int, int] | None:
    """The first and last step-grid times (epoch seconds, multiples of ``step``) in
    ``[start, end]``; ``None`` when no grid time falls in the range."""
    t0 = math.ceil(_epoch(start) / step) * step
    t1 = math.floor(_epoch(end) / step) * step
    if t1 < t0:
        return None
    return t0, t1


def plan_chunks(start: int, end: int, step: int, max_points: int) -> list[Chunk]:
    """Split the grid ``start, start + step, ..., <= end`` into range queries of at most
    ``max_points`` points each. Chunk ``k`` covers ``[s_k, s_k + (n - 1) * step]`` and the next
    starts at ``s_k + n * step``: no overlap, no hole."""
    if step <= 0:
        raise ValueError("step must be positive")
    if max_points < 1:
        raise ValueError("max_points must be at least 1")
    chunks: list[Chunk] = []
    span = (max_points - 1) * step
    s = start
    while s <= end:
        e = min(s + span, end)
        e -= (e - s) % step  # stay on the grid
        chunks.append(Chunk(s, e, step))
        s = e + step
    return chunks


# --------------------------------------------------------------------------- counters


def counter_rate(
    ds: Sequence[Any] | np.ndarray, values: Sequence[float] | np.ndarray, step: float | timedelta
) -> tuple[np.ndarray, np.ndarray]:
    """Per-second rate of a counter sampled every ``step``.

    ``ds`` are increasing timestamps (epoch seconds as numbers, or ``datetime64``) and ``values``
    the counter there; ``step`` is in seconds (or a ``timedelta``). For each sample whose
    predecessor is exactly one step earlier the rate is ``(v_i - v_{i-1}) / step``, or
    ``v_i / step`` when the counter went down (a reset). A sample after a gap, and the first
    sample, have no rate. NaN values count as missing samples.

    Returns ``(ds, rate)`` of the samples that have a rate, ``ds`` in the input's type.
    """
    t = np.asarray(ds)
    v = np.asarray(values, dtype=np.float64)
    if t.shape != v.shape or t.ndim != 1:
        raise ValueError("ds and values must be 1-D arrays of the same length")
    step_s = step.total_seconds() if isinstance(step, timedelta) else float(step)
    if step_s <= 0:
        raise ValueError("step must be positive")
    keep = ~np.isnan(v)
    if not keep.all():
        t, v = t[keep], v[keep]
    if len(v) < 2:
        return t[:0], v[:0]
    if t.dtype.kind == "M":
        gap = (t[1:] - t[:-1]) == np.timedelta64(round(step_s * 1e9), "ns")
    else:
        gap = (t[1:] - t[:-1]) == step_s
    delta = v[1:] - v[:-1]
    rate = np.where(delta >= 0, delta, v[1:]) / step_s
    return t[1:][gap], rate[gap]


# --------------------------------------------------------------------------- fetching


@dataclass(frozen=True)
class _Request:
    service: str
    metric: str
    query: MetricQuery
    chunk: Chunk

    @property
    def uid(self) -> str:
        return series_id(self.service, self.metric)


class _Clients:
    """One ``PrometheusConnect`` (own Session, own keep-alive connection) per worker thread."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.url = settings.prometheus.url.rstrip("/")
        self._local = threading.local()
        self._lock = threading.Lock()
        self._all: list[PrometheusConnect] = []

    def get(self) -> PrometheusConnect:
        client = getattr(self._local, "client", None)
        if client is None:
            client = self._make()
            self._local.client = client
            with self._lock:
                self._all.append(client)
        return client

    def _make(self) -> PrometheusConnect:
        cfg = self.settings.prometheus
        retry = Retry(
            total=cfg.retries,
            connect=cfg.retries,
            read=cfg.retries,
            status=cfg.retries,
            other=0,
            backoff_factor=_BACKOFF_FACTOR,
            status_forcelist=_RETRY_STATUSES,
            allowed_methods=frozenset({"GET", "POST"}),
            raise_on_status=False,  # hand back the last 5xx so its text reaches the user
            respect_retry_after_header=True,
        )
        session = requests.Session()  # kept alive for all of this thread's queries
        session.verify = cfg.verify_tls
        headers = {"Accept-Encoding": _ACCEPT_ENCODING}
        if cfg.bearer_token:
            headers["Authorization"] = f"Bearer {cfg.bearer_token}"
        # PrometheusConnect mounts an HTTPAdapter with this Retry on the session for its URL.
        return PrometheusConnect(
            url=self.url,
            headers=headers,
            disable_ssl=not cfg.verify_tls,
            retry=retry,
            session=session,
            timeout=cfg.timeout_seconds,
        )

    def close(self) -> None:
        with self._lock:
            for client in self._all:
                client.close()
            self._all.clear()


def fetch_history(
    settings: Settings,
    start: datetime,
    end: datetime,
    *,
    services: list[str] | None = None,
    step_seconds: int | None = None,
    workers: int | None = None,
    progress: bool = False,
) -> pd.DataFrame:
    """The history of ``services`` (default: all) between ``start`` and ``end`` (inclusive).

    One series ``<service>/<metric>`` per query of ``settings.queries_for(service)``, sampled
    every ``step_seconds`` (default ``prometheus.step_seconds``) on the grid of multiples of the
    step. Raises ``SourceUnavailableError`` when Prometheus cannot be reached (after
    ``prometheus.retries`` retries) and ``ConfigError`` for a query Prometheus rejects or that
    returns more than one series.
    """
    cfg = settings.prometheus
    step = int(step_seconds if step_seconds is not None else cfg.step_seconds)
    if step <= 0:
        raise ConfigError(f"the step must be a positive number of seconds (got {step})")
    n_workers = int(workers if workers is not None else cfg.workers)
    if n_workers <= 0:
        raise ConfigError(f"workers must be at least 1 (got {n_workers})")
    max_points = min(int(cfg.max_points_per_query), PROMETHEUS_MAX_POINTS)
    names = list(dict.fromkeys(services)) if services else settings.service_names
    for name in names:
        settings.service(name)  # ConfigError naming the known services

    grid = align_range(start, end, step)
    if grid is None:
        return empty_history()
    t0, t1 = grid

    requests_: list[_Request] = []
    for name in names:
        for metric, query in settings.queries_for(name).items():
            if metric in LIVE_METRICS:  # read live by the daemon, not part of the history
                continue
            first = t0 - step if query.counter else t0
            for chunk in plan_chunks(first, t1, step, max_points):
                requests_.append(_Request(name, metric, query, chunk))
    if not requests_:
        return empty_history()

    clients = _Clients(settings)
    try:
        results = _run_all(clients, requests_, n_workers, progress)
    finally:
        clients.close()

    # Assemble per series, in request order (services, metrics, chunks): deterministic.
    uids: list[str] = []
    ds_parts: list[np.ndarray] = []
    y_parts: list[np.ndarray] = []
    for uid, members in _group_by_series(requests_, results):
        req = members[0][0]
        ts = np.concatenate([r[1][0] for r in members])
        ys = np.concatenate([r[1][1] for r in members])
        ts, ys = _dedupe(ts, ys)
        if req.query.counter:
            ts, ys = counter_rate(ts, ys, step)
        keep = ~np.isnan(ys)
        ts, ys = ts[keep], ys[keep]
        if len(ts):
            uids.append(uid)
            ds_parts.append(ts)
            y_parts.append(ys)
    if not uids:
        return empty_history()

    lengths = [len(p) for p in ds_parts]
    seconds = np.concatenate(ds_parts)
    frame = pd.DataFrame(
        {
            UNIQUE_ID: pd.Categorical.from_codes(
                np.repeat(np.arange(len(uids)), lengths), categories=uids
            ),
            DS: pd.DatetimeIndex(
                (np.round(seconds * 1000).astype(np.int64) * 1_000_000).view("datetime64[ns]"),
                tz="UTC",
            ),
            Y: np.concatenate(y_parts),
        }
    )
    return validate_history(frame, source=f"Prometheus at {clients.url}")


def _group_by_series(
    reqs: list[_Request], results: list[tuple[np.ndarray, np.ndarray]]
) -> Iterator[tuple[str, list[tuple[_Request, tuple[np.ndarray, np.ndarray]]]]]:
    current: str | None = None
    members: list[tuple[_Request, tuple[np.ndarray, np.ndarray]]] = []
    for req, res in zip(reqs, results, strict=True):
        if req.uid != current and members:
            yield current, members  # type: ignore[misc]
            members = []
        current = req.uid
        members.append((req, res))
    if members:
        yield current, members  # type: ignore[misc]


def _dedupe(ts: np.ndarray, ys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Sort by time and keep the first sample of each timestamp (chunks never overlap, but a
    misbehaving proxy or server could repeat a boundary sample)."""
    if len(ts) < 2:
        return ts, ys
    if not (ts[1:] > ts[:-1]).all():
        order = np.argsort(ts, kind="stable")
        ts, ys = ts[order], ys[order]
        first = np.r_[True, ts[1:] != ts[:-1]]
        ts, ys = ts[first], ys[first]
    return ts, ys


def _run_all(
    clients: _Clients, reqs: list[_Request], n_workers: int, progress: bool
) -> list[tuple[np.ndarray, np.ndarray]]:
    results: list[tuple[np.ndarray, np.ndarray] | None] = [None] * len(reqs)
    bar = _progress_bar(len(reqs)) if progress else None
    executor = ThreadPoolExecutor(max_workers=min(n_workers, len(reqs)), thread_name_prefix="prom")
    try:
        futures: dict[Future[tuple[np.ndarray, np.ndarray]], int] = {
            executor.submit(_fetch_one, clients, req): i for i, req in enumerate(reqs)
        }
        for fut in as_completed(futures):
            exc = fut.exception()
            if exc is not None:
                # Fail fast: drop the queued queries (the finally clause cancels them).
                raise exc
            results[futures[fut]] = fut.result()
            if bar is not None:
                bar[0].advance(bar[1], 1)
    finally:
        executor.shutdown(wait=True, cancel_futures=True)
        if bar is not None:
            bar[0].stop()
    return results  # type: ignore[return-value]


def _progress_bar(total: int) -> tuple[Any, Any]:
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
    )

    console = Console(stderr=True)
    bar = Progress(
        TextColumn("fetching from Prometheus"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("queries"),
        TimeElapsedColumn(),
        console=console,
        transient=True,
        disable=not console.is_terminal,  # no stray lines in logs and pipes
    )
    bar.start()
    task = bar.add_task("fetch", total=total)
    return bar, task


def _fetch_one(clients: _Clients, req: _Request) -> tuple[np.ndarray, np.ndarray]:
    """Run one range query; ``(epoch seconds, values)`` of its single series (empty if none)."""
    chunk = req.chunk
    client = clients.get()
    try:
        result = client.custom_query_range(
            req.query.query,
            start_time=datetime.fromtimestamp(chunk.start, tz=UTC),
            end_time=datetime.fromtimestamp(chunk.end, tz=UTC),
            step=str(chunk.step),
        )
    except PrometheusApiClientException as exc:
        raise _http_error(clients, req, exc) from None
    except requests.exceptions.RequestException as exc:
        raise _connection_error(clients, req, exc) from None
    except ValueError as exc:  # a 200 whose body is not JSON: not a Prometheus API
        raise ConfigError(
            f"{clients.url} answered {req.uid} with something that is not Prometheus JSON "
            f"({exc}); {_URL_HINT}"
        ) from None
    return _to_arrays(clients, req, result)


def _to_arrays(
    clients: _Clients, req: _Request, result: Any
) -> tuple[np.ndarray, np.ndarray]:
    if not isinstance(result, list):
        raise ConfigError(
            f"{clients.url} answered {req.uid} with an unexpected result "
            f"({type(result).__name__}); "
            f"{_URL_HINT}"
        )
    if not result:
        return np.empty(0, dtype=np.float64), np.empty(0, dtype=np.float64)
    if len(result) > 1:
        shown = ", ".join(_labels(r.get("metric", {})) for r in result[:3])
        more = f" and {len(result) - 3} more" if len(result) > 3 else ""
        raise ConfigError(
            f"service {req.service!r}, metric {req.metric!r}: query {req.query.query!r} returned "
            f"{len(result)} series ({shown}{more}); it must return one: aggregate it, e.g. "
            f"sum({req.query.query}) or max(...)"
        )
    values = result[0].get("values") or []
    n = len(values)
    if n == 0:
        return np.empty(0, dtype=np.float64), np.empty(0, dtype=np.float64)
    # [[t, "v"], ...] -> [t, "v", t, "v", ...]; times through numpy, the value strings through
    # Arrow's exact string->double cast (~3x faster than float(); handles NaN, +Inf, -Inf).
    flat = list(chain.from_iterable(values))
    ts = np.array(flat[0::2], dtype=np.float64)
    texts = flat[1::2]
    try:
        ys = pa.array(texts, type=pa.string()).cast(pa.float64()).to_numpy()
    except (pa.ArrowInvalid, pa.ArrowTypeError):
        try:  # not strings after all (a proxy rewrote the answer?): let numpy try
            ys = np.array(texts, dtype=np.float64)
        except (TypeError, ValueError) as exc:
            raise ConfigError(
                f"service {req.service!r}, metric {req.metric!r}: query {req.query.query!r} "
                f"returned a non-numeric value ({exc})"
            ) from None
    return ts, ys


def _labels(metric: dict[str, str]) -> str:
    name = metric.get("__name__", "")
    rest = ",".join(f'{k}="{v}"' for k, v in sorted(metric.items()) if k != "__name__")
    return f"{name}{{{rest}}}"


def _http_error(
    clients: _Clients, req: _Request, exc: PrometheusApiClientException
) -> IdlegpuError:
    status, body = _parse_client_exception(exc)
    text = _prometheus_error_text(body)
    where = f"service {req.service!r}, metric {req.metric!r}, query {req.query.query!r}"
    if status in (400, 422):
        hint = ""
        if "exceeded maximum resolution" in text:
            hint = "; lower prometheus.max_points_per_query"
        return ConfigError(f"Prometheus rejected the query of {where}: {text}{hint}")
    if status in (401, 403):
        return ConfigError(
            f"Prometheus at {clients.url} refused access (HTTP {status}: {text}); set "
            "prometheus.bearer_token or IDLEGPU_PROMETHEUS__BEARER_TOKEN"
        )
    if status == 404:
        return ConfigError(
            f"{clients.url} has no Prometheus query API (HTTP 404 on /api/v1/query_range); "
            f"{_URL_HINT} (the URL of Prometheus itself, without /api/v1)"
        )
    if status is not None and status >= 500 or status in (408, 429):
        return SourceUnavailableError(
            f"Prometheus at {clients.url} failed on {where} with HTTP {status} after "
            f"{_retries(clients.settings.prometheus.retries)}: {text}"
        )
    return ConfigError(f"Prometheus at {clients.url} answered {where} with HTTP {status}: {text}")


def _parse_client_exception(exc: PrometheusApiClientException) -> tuple[int | None, str]:
    """prometheus-api-client raises ``HTTP Status Code 400 (b'...body...')``."""
    message = str(exc)
    status: int | None = None
    body = message
    head, sep, rest = message.partition(" (")
    if head.startswith("HTTP Status Code ") and sep:
        try:
            status = int(head.removeprefix("HTTP Status Code ").strip())
        except ValueError:
            status = None
        literal = rest.removesuffix(")")
        try:
            raw = ast.literal_eval(literal)
            body = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else str(raw)
        except (ValueError, SyntaxError):
            body = literal
    return status, body


def _prometheus_error_text(body: str) -> str:
    try:
        payload = json.loads(body)
    except ValueError:
        return " ".join(body.split())[:300] or "(empty answer)"
    if isinstance(payload, dict) and payload.get("error"):
        kind = payload.get("errorType")
        return f"{payload['error']}" + (f" ({kind})" if kind else "")
    return " ".join(body.split())[:300]


def _connection_error(
    clients: _Clients, req: _Request, exc: requests.exceptions.RequestException
) -> IdlegpuError:
    cfg = clients.settings.prometheus
    url = clients.url
    if isinstance(exc, requests.exceptions.SSLError):
        return SourceUnavailableError(
            f"Prometheus at {url}: TLS handshake failed ({_root_reason(exc)}); for a self-signed "
            "certificate set prometheus.verify_tls: false"
        )
    if isinstance(exc, requests.exceptions.ConnectTimeout):
        return SourceUnavailableError(
            f"Prometheus at {url} is unreachable (connection timed out after "
            f"{cfg.timeout_seconds:g} s, {_retries(cfg.retries)}); {_URL_HINT}"
        )
    if isinstance(exc, requests.exceptions.ReadTimeout | requests.exceptions.Timeout) or (
        isinstance(exc, requests.exceptions.ConnectionError)
        and isinstance(getattr(exc.args[0] if exc.args else None, "reason", None), ReadTimeoutError)
    ):
        return SourceUnavailableError(
            f"Prometheus at {url} did not answer {req.uid} within {cfg.timeout_seconds:g} s "
            f"({_retries(cfg.retries)}); raise prometheus.timeout_seconds or lower "
            "prometheus.max_points_per_query"
        )
    if isinstance(exc, requests.exceptions.RetryError):
        return SourceUnavailableError(
            f"Prometheus at {url} kept failing on {req.uid} after {_retries(cfg.retries)} "
            f"({_root_reason(exc)})"
        )
    if isinstance(exc, requests.exceptions.ConnectionError):
        return SourceUnavailableError(
            f"Prometheus at {url} is unreachable ({_root_reason(exc)}); {_URL_HINT}"
        )
    if isinstance(exc, requests.exceptions.InvalidURL | requests.exceptions.MissingSchema
                  | requests.exceptions.InvalidSchema):
        return ConfigError(f"prometheus.url {url!r} is not a valid URL ({exc}); {_URL_HINT}")
    return SourceUnavailableError(f"Prometheus at {url}: request failed ({_root_reason(exc)})")


def _retries(n: int) -> str:
    return "1 retry" if n == 1 else f"{n} retries"


def _root_reason(exc: BaseException) -> str:
    """A short human reason from requests/urllib3's nested connection errors."""
    seen: list[BaseException] = []
    stack: list[BaseException] = [exc]
    while stack:
        e = stack.pop()
        if e in seen:
            continue
        seen.append(e)
        for nxt in (getattr(e, "reason", None), e.__cause__, e.__context__, *e.args):
            if isinstance(nxt, BaseException):
                stack.append(nxt)
    text = " ".join(str(e) for e in seen).lower()
    types = {type(e).__name__ for e in seen}
    if any(isinstance(e, ConnectionRefusedError) for e in seen) or "connection refused" in text:
        return "connection refused"
    if "NameResolutionError" in types or "name or service not known" in text or (
        "nodename nor servname" in text
    ) or "temporary failure in name resolution" in text:
        return "host name not found"
    if any(isinstance(e, TimeoutError) for e in seen) or "timed out" in text:
        return "timed out"
    if "connection reset" in text or any(isinstance(e, ConnectionResetError) for e in seen):
        return "connection reset"
    if "remotedisconnected" in text.replace(" ", "") or "RemoteDisconnected" in types:
        return "connection closed by the server"
    last = seen[-1]
    return " ".join(str(last).split())[:200] or type(last).__name__


def _epoch(value: datetime) -> float:
    """Seconds since the epoch; naive datetimes are UTC."""
    if isinstance(value, pd.Timestamp):
        value = value.to_pydatetime()
    if value.tzinfo is None:
        value = value.replace(tzinfo=UTC)
    return value.timestamp()
