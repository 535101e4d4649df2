"""Read the pool's history from Prometheus: one series per ``<service>/<metric>``.

Every range is cut into chunks below Prometheus's limit of 11,000 points per series per query,
the chunks of all series are fetched in parallel (``/api/v1/query_range`` over ``requests``,
one kept-alive session per worker), and the result is the tidy history frame (``unique_id, ds,
y``). Answers are decoded straight into numpy (``decode_matrix``): the small JSON around the
samples by orjson, the ``[t, "v"]`` pairs by Arrow's CSV reader, which runs without the GIL, so
workers decode in parallel; an answer laid out otherwise takes the general JSON path, with the
same result.

Timestamps are aligned to the step grid (start rounded up to a multiple of the step). A gap stays
a gap: nothing is filled or interpolated. (Prometheus itself answers a query at time ``t`` with
the newest sample up to 5 minutes old, so the first step after a series stops may repeat its
last value; idlegpu does not add anything beyond that.)

Counter queries (``counter: true``) are turned into per-second rates between consecutive
samples exactly one step apart (``counter_rate``); a decrease is a counter reset.
"""

from __future__ import annotations

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
import orjson
import pandas as pd
import pyarrow as pa
import pyarrow.csv as pa_csv
import requests
from requests.adapters import HTTPAdapter
from urllib3.exceptions import ReadTimeoutError
from urllib3.util.retry import Retry

from idlegpu.forecast.config import MetricQuery, Settings
from idlegpu.forecast.errors import ConfigError, IdlegpuError, SourceUnavailableError
from idlegpu.forecast.redact import redact, warn_unverified_tls
from idlegpu.forecast.schema import (
    DS,
    LIVE_METRICS,
    UNIQUE_ID,
    Y,
    empty_history,
    series_id,
    validate_history,
)

__all__ = [
    "Chunk", "align_range", "counter_rate", "decode_matrix", "fetch_history", "plan_chunks",
]

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
    """One ``requests.Session`` (own keep-alive connection, retries mounted) per worker thread.

    ``shown`` is the URL as messages show it: without credentials."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.url = settings.prometheus.url.rstrip("/")
        self.shown = redact(self.url)
        self.query_range_url = f"{self.url}/api/v1/query_range"
        self._local = threading.local()
        self._lock = threading.Lock()
        self._all: list[requests.Session] = []
        if not settings.prometheus.verify_tls:
            warn_unverified_tls(self.url)

    def get(self) -> requests.Session:
        session = getattr(self._local, "session", None)
        if session is None:
            session = self._make()
            self._local.session = session
            with self._lock:
                self._all.append(session)
        return session

    def _make(self) -> requests.Session:
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
        session.headers["Accept-Encoding"] = _ACCEPT_ENCODING
        if cfg.bearer_token:
            session.headers["Authorization"] = f"Bearer {cfg.bearer_token}"
        adapter = HTTPAdapter(max_retries=retry, pool_connections=1, pool_maxsize=1)
        session.mount("http://", adapter)
        session.mount("https://", adapter)
        return session

    def close(self) -> None:
        with self._lock:
            for session in self._all:
                session.close()
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
    # in the order validate_history sorts into (series id, then time): it then has none to do
    order = sorted(range(len(uids)), key=uids.__getitem__)
    uids = [uids[i] for i in order]
    ds_parts = [ds_parts[i] for i in order]
    y_parts = [y_parts[i] for i in order]

    lengths = [len(p) for p in ds_parts]
    seconds = np.concatenate(ds_parts)
    # The ids as Arrow strings, validate_history's own dtype: a categorical would cost it a
    # conversion per sample (0.2-0.5 s at 1.3M samples).
    ids = pa.DictionaryArray.from_arrays(
        pa.array(np.repeat(np.arange(len(uids), dtype=np.int32), lengths)), pa.array(uids)
    ).cast(pa.string())
    frame = pd.DataFrame(
        {
            UNIQUE_ID: pd.array(ids, dtype="string"),
            DS: pd.DatetimeIndex(
                (np.round(seconds * 1000).astype(np.int64) * 1_000_000).view("datetime64[ns]"),
                tz="UTC",
            ),
            Y: np.concatenate(y_parts),
        }
    )
    return validate_history(frame, source=f"Prometheus at {clients.shown}")


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
    params: dict[str, str | int] = {"query": req.query.query, "start": chunk.start,
                                    "end": chunk.end, "step": chunk.step}
    try:
        resp = clients.get().get(
            clients.query_range_url,
            params=params,
            timeout=clients.settings.prometheus.timeout_seconds,
            # per request: a session's verify loses to $REQUESTS_CA_BUNDLE (requests #3829)
            verify=clients.settings.prometheus.verify_tls,
        )
        body = resp.content
    except requests.exceptions.RequestException as exc:
        raise _connection_error(clients, req, exc) from None
    if resp.status_code != 200:
        raise _http_error(clients, req, resp.status_code, body.decode("utf-8", "replace"))
    try:
        series = decode_matrix(body)
    except _NotANumber as exc:
        raise ConfigError(
            f"service {req.service!r}, metric {req.metric!r}: query {req.query.query!r} "
            f"returned a non-numeric value ({exc})"
        ) from None
    except ValueError as exc:  # a 200 whose body is not a range query's JSON
        raise ConfigError(
            f"{clients.shown} answered {req.uid} with something that is not Prometheus JSON "
            f"({exc}); {_URL_HINT}"
        ) from None
    if not series:
        return np.empty(0, dtype=np.float64), np.empty(0, dtype=np.float64)
    if len(series) > 1:
        shown = ", ".join(_labels(labels) for labels, _, _ in series[:3])
        more = f" and {len(series) - 3} more" if len(series) > 3 else ""
        raise ConfigError(
            f"service {req.service!r}, metric {req.metric!r}: query {req.query.query!r} returned "
            f"{len(series)} series ({shown}{more}); it must return one: aggregate it, e.g. "
            f"sum({req.query.query}) or max(...)"
        )
    return series[0][1], series[0][2]


# --------------------------------------------------------------------------- decoding


class _NotANumber(ValueError):
    """A sample value that is not a number."""


_VALUES_KEY = b'"values":['
# [[t,"v"],[t,"v"]] -> t\nv\nt\nv: one number per line, times and values alternating
_PAIRS_TO_LINES = bytes.maketrans(b",", b"\n")
_PAIR_CHARS = b'"[]'
_CSV_READ = pa_csv.ReadOptions(column_names=["x"], use_threads=False, block_size=1 << 26)
_CSV_PARSE = pa_csv.ParseOptions(quote_char=False, double_quote=False, escape_char=False)
# no null spellings: "NaN" is a number (Prometheus's NaN), never a missing value
_CSV_CONVERT = pa_csv.ConvertOptions(
    column_types={"x": pa.float64()}, null_values=[], strings_can_be_null=False,
    quoted_strings_can_be_null=False,
)
_EMPTY = np.empty(0, dtype=np.float64)


def decode_matrix(body: bytes) -> list[tuple[dict[str, str], np.ndarray, np.ndarray]]:
    """The series of a range query's JSON answer: ``(labels, epoch seconds, values)`` each, in
    the answer's order; values are float64 (``"NaN"``, ``"+Inf"``, ``"-Inf"`` included).

    Prometheus writes each series as ``{"metric": {...}, "values": [[t, "v"], ...]}``. The
    ``values`` arrays are cut out of the text and read by Arrow's CSV reader (C++, without the
    GIL); orjson reads what is left (the envelope and the labels, a few hundred bytes). An
    answer laid out otherwise (spaces, other keys, a proxy's rewrite) is read whole by orjson:
    the same numbers, about 3x slower. Raises ``ValueError`` saying what is not as expected.
    """
    spans = _values_spans(body)
    if spans is not None:
        pieces, last = [], 0
        for start, end in spans:
            pieces.append(body[last:start])
            last = end
        pieces.append(body[last:])
        result = _matrix_result(orjson.loads(b"[]".join(pieces)))
        if len(result) == len(spans):
            arrays = [_read_pairs(body[start:end]) for start, end in spans]
            if all(a is not None for a in arrays):
                return [
                    (_metric(entry), *pair)  # type: ignore[misc]
                    for entry, pair in zip(result, arrays, strict=True)
                ]
    result = _matrix_result(orjson.loads(body))
    return [(_metric(entry), *_pairs_from_lists(entry.get("values"))) for entry in result]


def _values_spans(body: bytes) -> list[tuple[int, int]] | None:
    """Byte ranges of every ``"values"`` array (brackets included); None when the text does not
    look like Prometheus's own layout. A ``"values":[`` cannot occur inside a JSON string (its
    quotes would be escaped), and within the array the first ``]]`` closes it: every element is
    ``[number, "number"]``."""
    spans: list[tuple[int, int]] = []
    at = body.find(_VALUES_KEY)
    while at >= 0:
        start = at + len(_VALUES_KEY) - 1
        if body.startswith(b"[]", start):
            end = start + 2
        else:
            close = body.find(b"]]", start)
            if close < 0:
                return None
            end = close + 2
        spans.append((start, end))
        at = body.find(_VALUES_KEY, end)
    return spans or None


def _read_pairs(segment: bytes) -> tuple[np.ndarray, np.ndarray] | None:
    """``(times, values)`` of one ``[[t,"v"],...]`` array; None when it is not exactly pairs of
    numbers (then the general path decides)."""
    if segment == b"[]":
        return _EMPTY, _EMPTY
    pairs = segment.count(b"[") - 1
    lines = segment.translate(_PAIRS_TO_LINES, _PAIR_CHARS)
    try:
        column = pa_csv.read_csv(
            pa.py_buffer(lines), read_options=_CSV_READ, parse_options=_CSV_PARSE,
            convert_options=_CSV_CONVERT,
        ).column(0)
    except (pa.ArrowInvalid, pa.ArrowTypeError):
        return None
    if len(column) != 2 * pairs or column.null_count:
        return None
    flat = column.to_numpy()
    return flat[0::2], flat[1::2]


def _matrix_result(payload: Any) -> list[dict[str, Any]]:
    if not isinstance(payload, dict) or payload.get("status") != "success":
        raise ValueError("no successful answer")
    data = payload.get("data")
    if not isinstance(data, dict) or data.get("resultType") != "matrix":
        kind = data.get("resultType") if isinstance(data, dict) else type(data).__name__
        raise ValueError(f"a {kind} result, not a range query's matrix")
    result = data.get("result")
    if not isinstance(result, list) or not all(isinstance(e, dict) for e in result):
        raise ValueError(f"an unexpected result ({type(result).__name__})")
    return result


def _metric(entry: dict[str, Any]) -> dict[str, str]:
    labels = entry.get("metric")
    return labels if isinstance(labels, dict) else {}


def _pairs_from_lists(values: Any) -> tuple[np.ndarray, np.ndarray]:
    """The general path: ``[[t, "v"], ...]`` as decoded JSON lists."""
    if not values:
        return _EMPTY, _EMPTY
    if not isinstance(values, list) or not all(
        isinstance(v, list) and len(v) == 2 for v in values
    ):
        raise ValueError("samples that are not [time, value] pairs")
    # [[t, "v"], ...] -> [t, "v", t, "v", ...]; times through numpy, the value strings through
    # Arrow's exact string->double cast (~3x faster than float(); handles NaN, +Inf, -Inf).
    flat = list(chain.from_iterable(values))
    try:
        ts = np.array(flat[0::2], dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"a sample time that is not a number ({exc})") from None
    texts = flat[1::2]
    try:
        ys = pa.array(texts, type=pa.string()).cast(pa.float64()).to_numpy()
    except (pa.ArrowInvalid, pa.ArrowTypeError):
        try:  # not strings after all (a proxy rewrote the answer?): let numpy try
            ys = np.array(texts, dtype=np.float64)
        except (TypeError, ValueError) as exc:
            raise _NotANumber(str(exc)) from None
    return ts, ys


def _labels(metric: dict[str, str]) -> str:
    name = metric.get("__name__", "")
    rest = ",".join(f'{k}="{v}"' for k, v in sorted(metric.items()) if k != "__name__")
    return f"{name}{{{rest}}}"


def _http_error(clients: _Clients, req: _Request, status: int, body: str) -> IdlegpuError:
    text = redact(_prometheus_error_text(body))
    where = f"service {req.service!r}, metric {req.metric!r}, query {req.query.query!r}"
    if status in (400, 422):
        hint = ""
        if "exceeded maximum resolution" in text:
            hint = "; lower prometheus.max_points_per_query"
        return ConfigError(f"Prometheus rejected the query of {where}: {text}{hint}")
    if status in (401, 403):
        return ConfigError(
            f"Prometheus at {clients.shown} refused access (HTTP {status}: {text}); set "
            "prometheus.bearer_token or IDLEGPU_PROMETHEUS__BEARER_TOKEN"
        )
    if status == 404:
        return ConfigError(
            f"{clients.shown} has no Prometheus query API (HTTP 404 on /api/v1/query_range); "
            f"{_URL_HINT} (the URL of Prometheus itself, without /api/v1)"
        )
    if status >= 500 or status in (408, 429):
        return SourceUnavailableError(
            f"Prometheus at {clients.shown} failed on {where} with HTTP {status} after "
            f"{_retries(clients.settings.prometheus.retries)}: {text}"
        )
    return ConfigError(
        f"Prometheus at {clients.shown} answered {where} with HTTP {status}: {text}"
    )


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
    url = clients.shown
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
    return redact(" ".join(str(last).split())[:200]) or type(last).__name__


def _epoch(value: datetime) -> float:
    """Seconds since the epoch; naive datetimes are UTC."""
    if isinstance(value, pd.Timestamp):
        value = value.to_pydatetime()
    if value.tzinfo is None:
        value = value.replace(tzinfo=UTC)
    return value.timestamp()
