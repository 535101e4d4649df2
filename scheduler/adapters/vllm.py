"""Live serving signals of the vLLM services: the ``SignalSource`` port's adapters.

Two sources, same answer (``ServingSignals``):

* ``PrometheusSignals`` runs instant queries (``/api/v1/query`` with an explicit ``time``) on
  Prometheus, one per service and metric of ``settings.queries_for(service)``: ``replicas``,
  ``requests_waiting`` and ``kv_cache_usage`` are required; ``kv_cache_usage`` falls back to
  vLLM's old ``vllm:gpu_cache_usage_perc`` when the configured query finds no series.
* ``MetricsEndpointSignals`` scrapes the replicas' vLLM ``/metrics`` pages directly (no
  Prometheus in between) and parses them with ``prometheus_client``'s parser.

Missing is never "no load": when a required signal cannot be read (no series, an unreachable
server, a malformed page), ``observed_at`` is None and the reason is kept in ``last_report``;
``read`` never raises for that. An old signal gives an old ``observed_at`` (the policy compares
its age with ``admission.max_signal_age_seconds``).

**Sample age.** An instant query's answer ``[t, value]`` carries the *evaluation* time ``t``,
not the time of the sample it used: Prometheus takes the newest sample up to 5 minutes old
(its lookback delta) and stamps it ``t``. So the age is asked for separately: for every vector
selector of a query (``metric{labels}``, found in the PromQL text) ``min(timestamp(selector))``
gives the time of the oldest of the newest samples of its series. ``observed_at`` is the oldest
such time across all required signals of all services. A query with no vector selector (e.g.
``vector(3)``) counts as fresh. A sample older than the lookback delta is not seen at all: the
signal is missing.

**Pool arithmetic.** ``idle_gpus = pool.total_gpus - sum(replicas * gpus_per_replica) -
job_gpus`` (``read(now, job_gpus=...)``; ``replicas`` is what the replicas query counts, e.g.
``kube_deployment_status_replicas``, which includes pods still pending). ``gpus_short`` needs
the autoscaler's desired replicas: the optional ``desired_replicas`` query (in
``query_templates`` or a service's ``queries``, e.g.
``kube_horizontalpodautoscaler_status_desired_replicas{namespace="inference",
horizontalpodautoscaler="$service"}``) gives ``gpus_short = max(0, sum(max(0, desired -
replicas) * gpus_per_replica) - idle_gpus)``; without it ``gpus_short`` is 0.

**Aggregation.** Queue and KV pressure only matter for a service the autoscaler can still grow
(``replicas < max_replicas``): ``kv_cache_usage`` is the max of those services' KV usage,
``requests_waiting_per_replica`` the max of their ``waiting / max(replicas, 1)``.

Only plain ``requests`` is used (not ``prometheus_api_client``; see the import contracts).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import requests
from prometheus_client.parser import text_string_to_metric_families

from idlegpu.forecast.config import Settings
from idlegpu.forecast.errors import TemporaryError
from idlegpu.forecast.redact import redact, warn_unverified_tls
from idlegpu.forecast.schema import (
    DESIRED_REPLICAS,
    KV_CACHE_USAGE,
    REPLICAS,
    REQUESTS_RUNNING,
    REQUESTS_WAITING,
)
from idlegpu.scheduler.types import ServingSignals

__all__ = [
    "KV_METRIC",
    "KV_METRIC_OLD",
    "MetricsEndpointSignals",
    "PrometheusSignals",
    "ServiceReading",
    "SignalsError",
    "SignalsReport",
    "fallback_kv_query",
    "parse_vllm_metrics",
    "vector_selectors",
]

KV_METRIC = "vllm:kv_cache_usage_perc"
KV_METRIC_OLD = "vllm:gpu_cache_usage_perc"
WAITING_METRIC = "vllm:num_requests_waiting"
RUNNING_METRIC = "vllm:num_requests_running"
REQUIRED = (REPLICAS, REQUESTS_WAITING, KV_CACHE_USAGE)


class SignalsError(TemporaryError):
    """A live signal could not be read (server down, bad answer, no series); retried next tick."""

    def __init__(self, message: str, *, delay: float = 15.0) -> None:
        super().__init__(message, delay=delay)


@dataclass(frozen=True)
class ServiceReading:
    """What was read for one service (None: not read)."""

    service: str
    replicas: float | None = None
    requests_waiting: float | None = None
    requests_running: float | None = None
    kv_cache_usage: float | None = None
    desired_replicas: float | None = None
    oldest_sample: datetime | None = None
    kv_fallback: bool = False
    """The KV usage came from ``vllm:gpu_cache_usage_perc`` (an older vLLM)."""


@dataclass(frozen=True)
class SignalsReport:
    """One read: the signals, each service's readings, and every problem met (empty: all good)."""

    signals: ServingSignals
    services: tuple[ServiceReading, ...] = ()
    problems: tuple[str, ...] = field(default_factory=tuple)

    @property
    def ok(self) -> bool:
        return self.signals.observed_at is not None and not self.problems


# --------------------------------------------------------------------------- PromQL text

_STRING = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`')
_GROUPING = re.compile(
    r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", re.IGNORECASE
)
_NAME = r"[a-zA-Z_:][a-zA-Z0-9_:]*"
_SELECTOR = re.compile(rf"(?<![a-zA-Z0-9_:.\"'])({_NAME})?\s*(\{{[^}}]*\}})?")
_KEYWORDS = frozenset({
    "by", "without", "on", "ignoring", "group_left", "group_right", "bool", "and", "or",
    "unless", "offset", "inf", "nan", "atan2", "start", "end",
})


def vector_selectors(query: str) -> list[str]:
    """The vector selectors (``name{matchers}`` or ``{matchers}``) of a PromQL expression, in
    order, without duplicates. Function and aggregation names (followed by ``(``), keywords,
    grouping label lists and durations are left out. Text-based: good for the usual queries
    of idlegpu.yaml, not a full PromQL parser."""
    # Grouping label lists (`by (model_name)`) are not selectors: drop them first.
    text = _GROUPING.sub(" ", query)
    found: list[str] = []
    i = 0
    while i < len(text):
        m = _SELECTOR.match(text, i)
        if m is None or m.end() == i or (m.group(1) is None and m.group(2) is None):
            i += 1
            continue
        name, braces = m.group(1), m.group(2)
        rest = text[m.end():].lstrip()
        if name is not None and braces is None and (
            rest.startswith("(") or name.lower() in _KEYWORDS
        ):
            i = m.end()
            continue
        if name is not None and braces is None and _preceded_by_digit(text, m.start()):
            i = m.end()
            continue
        selector = (name or "") + (braces or "")
        if selector not in found:
            found.append(selector)
        i = m.end()
    return found


def _preceded_by_digit(text: str, pos: int) -> bool:
    return pos > 0 and text[pos - 1].isdigit()


def fallback_kv_query(query: str) -> str | None:
    """The query with ``vllm:kv_cache_usage_perc`` renamed to vLLM's older
    ``vllm:gpu_cache_usage_perc``; None when the query does not use the new name."""
    pattern = re.compile(rf"(?<![a-zA-Z0-9_:]){re.escape(KV_METRIC)}(?![a-zA-Z0-9_:])")
    if not pattern.search(_STRING.sub("", query)):
        return None
    return pattern.sub(KV_METRIC_OLD, query)


# --------------------------------------------------------------------------- Prometheus


class _SignalReader:
    """What both signal sources share: ``read`` is ``read_report(...).signals``, and the last
    report's first problem is kept for logs and metrics."""

    session: requests.Session
    last_report: SignalsReport | None = None

    def read_report(self, now: datetime, *, job_gpus: int = 0) -> SignalsReport:
        raise NotImplementedError

    def read(self, now: datetime, *, job_gpus: int = 0) -> ServingSignals:
        return self.read_report(now, job_gpus=job_gpus).signals

    @property
    def last_problem(self) -> str | None:
        """The first problem of the last read, if any."""
        if self.last_report is None or not self.last_report.problems:
            return None
        return self.last_report.problems[0]

    def close(self) -> None:
        self.session.close()


class PrometheusSignals(_SignalReader):
    """``SignalSource`` reading the services' live signals from Prometheus (instant queries)."""

    def __init__(
        self,
        settings: Settings,
        *,
        session: requests.Session | None = None,
        timeout_s: float | None = None,
    ) -> None:
        self.settings = settings
        cfg = settings.prometheus
        self.url = cfg.url.rstrip("/")
        self.shown_url = redact(self.url)  # what messages show: no credentials
        self.timeout_s = float(timeout_s if timeout_s is not None else cfg.timeout_seconds)
        self.session = session if session is not None else requests.Session()
        self.session.verify = cfg.verify_tls
        if not cfg.verify_tls:
            warn_unverified_tls(self.url)
        self._headers = {"Accept-Encoding": "identity"}
        if cfg.bearer_token:
            self._headers["Authorization"] = f"Bearer {cfg.bearer_token}"
        self.last_report: SignalsReport | None = None

    def read_report(self, now: datetime, *, job_gpus: int = 0) -> SignalsReport:
        """Read every service at ``now``; never raises for a server or data problem."""
        at = _epoch(now)
        problems: list[str] = []
        readings: list[ServiceReading] = []
        missing = False
        for service in self.settings.services:
            reading, errs, complete = self._read_service(service.name, at)
            readings.append(reading)
            problems.extend(errs)
            missing |= not complete
            if errs and _unreachable(errs):
                break  # the server is down: do not wait for a timeout per query
        report = _aggregate(self.settings, readings, problems, missing, job_gpus)
        self.last_report = report
        return report

    # -- one service

    def _read_service(self, name: str, at: float) -> tuple[ServiceReading, list[str], bool]:
        queries = self.settings.queries_for(name)
        errs: list[str] = []
        values: dict[str, float | None] = {}
        oldest: float | None = None
        kv_fallback = False
        complete = True
        wanted = [m for m in (REPLICAS, REQUESTS_WAITING, REQUESTS_RUNNING, KV_CACHE_USAGE,
                              DESIRED_REPLICAS) if m in queries]
        for metric in REQUIRED:
            if metric not in queries:
                errs.append(f"{name}/{metric}: no query configured (set query_templates."
                            f"{metric} or services[].queries.{metric})")
                complete = False
        for metric, query in [(m, queries[m].query) for m in wanted]:
            required = metric in REQUIRED
            try:
                value, used = self._value(query, at)
                if value is None and metric == KV_CACHE_USAGE:
                    old = fallback_kv_query(query)
                    if old is not None:
                        value, used = self._value(old, at)
                        kv_fallback = value is not None
                if value is None:
                    raise SignalsError(
                        f"{name}/{metric}: no series at {_iso(at)} for {query!r} (no sample "
                        "in the last 5 minutes, or the query matches nothing)"
                    )
                values[metric] = value
                if required:
                    t = self._oldest_sample(used, at)
                    if t is not None:
                        oldest = t if oldest is None else min(oldest, t)
            except SignalsError as exc:
                values[metric] = None
                msg = str(exc)
                errs.append(msg if msg.startswith(f"{name}/") else f"{name}/{metric}: {msg}")
                if required:
                    complete = False
                if _unreachable([msg]):
                    complete = False
                    break
        reading = ServiceReading(
            service=name,
            replicas=values.get(REPLICAS),
            requests_waiting=values.get(REQUESTS_WAITING),
            requests_running=values.get(REQUESTS_RUNNING),
            kv_cache_usage=values.get(KV_CACHE_USAGE),
            desired_replicas=values.get(DESIRED_REPLICAS),
            oldest_sample=None if oldest is None else datetime.fromtimestamp(oldest, tz=UTC),
            kv_fallback=kv_fallback,
        )
        return reading, errs, complete

    def _value(self, query: str, at: float) -> tuple[float | None, str]:
        """The single value of ``query`` at ``at`` (None: no series); the query used."""
        result = self._instant(query, at)
        if not result:
            return None, query
        if len(result) > 1:
            raise SignalsError(
                f"{query!r} returned {len(result)} series; aggregate it (sum/max/avg) so it "
                "returns one"
            )
        value = float(result[0]["value"][1])
        if math.isnan(value):
            return None, query
        return value, query

    def _oldest_sample(self, query: str, at: float) -> float:
        """Epoch time of the oldest newest-sample of the query's series (``at`` when the query
    has no vector selector matching anything: the evaluation time is all there is)."""
        oldest: float | None = None
        for selector in vector_selectors(query):
            result = self._instant(f"min(timestamp({selector}))", at)
            if not result:
                continue  # the selector matches nothing now (e.g. one side of an `or`)
            t = float(result[0]["value"][1])
            oldest = t if oldest is None else min(oldest, t)
        return oldest if oldest is not None else at

    def _instant(self, query: str, at: float) -> list[dict[str, Any]]:
        try:
            resp = self.session.get(
                f"{self.url}/api/v1/query",
                params={"query": query, "time": f"{at:.3f}"},
                headers=self._headers,
                timeout=self.timeout_s,
                # per request: a session's verify loses to $REQUESTS_CA_BUNDLE (requests #3829)
                verify=self.session.verify,
            )
        except requests.exceptions.RequestException as exc:
            raise SignalsError(
                f"Prometheus at {self.shown_url} is unreachable ({type(exc).__name__}: "
                f"{_short(exc)}); check prometheus.url"
            ) from None
        try:
            body = resp.json()
        except ValueError:
            raise SignalsError(
                f"Prometheus at {self.shown_url} answered HTTP {resp.status_code} with "
                f"something that is not Prometheus JSON ({redact(repr(resp.text[:120]))})"
            ) from None
        if resp.status_code != 200 or body.get("status") != "success":
            raise SignalsError(
                f"Prometheus at {self.shown_url} refused {query!r} (HTTP {resp.status_code}: "
                + redact(f"{body.get('errorType', '')} {body.get('error', '')})".rstrip())
            )
        data = body.get("data") or {}
        if data.get("resultType") == "scalar":
            return [{"metric": {}, "value": data["result"]}]
        if data.get("resultType") != "vector":
            raise SignalsError(
                f"{query!r} returned a {data.get('resultType')}, not an instant vector"
            )
        return list(data.get("result") or [])


# --------------------------------------------------------------------------- /metrics pages


class MetricsEndpointSignals(_SignalReader):
    """``SignalSource`` scraping the services' vLLM ``/metrics`` endpoints directly.

    ``endpoints`` maps a service to its replicas' metrics URLs; ``replicas`` gives each
    service's replica count (a mapping, or a callable ``service -> int``; default: the number
    of endpoints). Waiting and running requests are summed over a service's endpoints, KV usage
    is their mean (``vllm:kv_cache_usage_perc``, else ``vllm:gpu_cache_usage_perc``).
    ``observed_at`` is ``now`` when every endpoint answered, else None (see ``last_report``).
    """

    def __init__(
        self,
        settings: Settings,
        endpoints: Mapping[str, Sequence[str]],
        replicas: Mapping[str, int] | Callable[[str], int] | None = None,
        *,
        session: requests.Session | None = None,
        timeout_s: float = 5.0,
        workers: int = 8,
    ) -> None:
        self.settings = settings
        for name in endpoints:
            settings.service(name)  # ConfigError naming the known services
        self.endpoints = {k: list(v) for k, v in endpoints.items()}
        self.replicas = replicas
        self.session = session if session is not None else requests.Session()
        self.timeout_s = timeout_s
        self.workers = workers
        self.last_report: SignalsReport | None = None

    def read_report(self, now: datetime, *, job_gpus: int = 0) -> SignalsReport:
        urls = [(svc, url) for svc, lst in self.endpoints.items() for url in lst]
        problems: list[str] = []
        missing = False
        for name in self.settings.service_names:
            if not self.endpoints.get(name):
                problems.append(f"{name}: no /metrics endpoint given")
                missing = True
        pages: dict[tuple[str, str], dict[str, float] | SignalsError] = {}
        if urls:
            with ThreadPoolExecutor(max_workers=min(self.workers, len(urls))) as pool:
                results = pool.map(lambda su: self._scrape_safe(su[1]), urls)
                pages = dict(zip(urls, results, strict=True))
        readings: list[ServiceReading] = []
        for name in self.settings.service_names:
            got = [(u, pages[(name, u)]) for u in self.endpoints.get(name, [])]
            errs = [p for _, p in got if isinstance(p, SignalsError)]
            problems.extend(f"{name}: {e}" for e in errs)
            ok = [p for _, p in got if not isinstance(p, SignalsError)]
            if errs or not ok:
                missing = True
                readings.append(ServiceReading(service=name))
                continue
            try:
                count = self._replicas(name, len(ok))
            except Exception as exc:  # noqa: BLE001 - a callable asking a cluster may fail
                problems.append(f"{name}: replica count unavailable ({exc})")
                missing = True
                readings.append(ServiceReading(service=name))
                continue
            readings.append(ServiceReading(
                service=name,
                replicas=float(count),
                requests_waiting=sum(p["waiting"] for p in ok),
                requests_running=sum(p["running"] for p in ok),
                kv_cache_usage=sum(p["kv"] for p in ok) / len(ok),
                oldest_sample=now,
                kv_fallback=any(p["kv_fallback"] for p in ok),
            ))
        report = _aggregate(self.settings, readings, problems, missing, job_gpus)
        self.last_report = report
        return report

    def _replicas(self, name: str, default: int) -> int:
        if self.replicas is None:
            return default
        if callable(self.replicas):
            return int(self.replicas(name))
        return int(self.replicas.get(name, default))

    def _scrape_safe(self, url: str) -> dict[str, float] | SignalsError:
        try:
            return self.scrape(url)
        except SignalsError as exc:
            return exc

    def scrape(self, url: str) -> dict[str, float]:
        """``{"waiting", "running", "kv", "kv_fallback"}`` of one vLLM /metrics page; raises
        ``SignalsError`` naming the endpoint when it cannot be read or parsed."""
        try:
            resp = self.session.get(url, timeout=self.timeout_s,
                                    headers={"Accept": "text/plain;version=0.0.4"})
        except requests.exceptions.RequestException as exc:
            raise SignalsError(
                f"vLLM metrics endpoint {redact(url)} is unreachable ({type(exc).__name__}: "
                f"{_short(exc)})"
            ) from None
        if resp.status_code != 200:
            raise SignalsError(
                f"vLLM metrics endpoint {redact(url)} answered HTTP {resp.status_code}: "
                f"{redact(repr(resp.text[:120]))}"
            )
        return parse_vllm_metrics(resp.text, source=redact(url))


def parse_vllm_metrics(text: str, *, source: str = "page") -> dict[str, float]:
    """Sum waiting/running, mean KV usage over the samples of one vLLM exposition page (one
    sample per engine/model); ``SignalsError`` for a malformed page or missing metrics."""
    sums: dict[str, list[float]] = {}
    try:
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name in (WAITING_METRIC, RUNNING_METRIC, KV_METRIC, KV_METRIC_OLD):
                    sums.setdefault(sample.name, []).append(float(sample.value))
    except (ValueError, TypeError, IndexError, KeyError) as exc:
        raise SignalsError(
            f"vLLM metrics endpoint {source} served a malformed page "
            f"(not Prometheus text exposition: {exc})"
        ) from None
    lacking = [m for m in (WAITING_METRIC, RUNNING_METRIC) if m not in sums]
    kv_name = KV_METRIC if KV_METRIC in sums else KV_METRIC_OLD if KV_METRIC_OLD in sums else None
    if kv_name is None:
        lacking.append(f"{KV_METRIC} (or {KV_METRIC_OLD})")
    if lacking:
        raise SignalsError(
            f"vLLM metrics endpoint {source} has no {', '.join(lacking)}; is it a vLLM "
            "server's /metrics?"
        )
    assert kv_name is not None  # else it is lacking, raised above
    kv = sums[kv_name]
    return {
        "waiting": sum(sums[WAITING_METRIC]),
        "running": sum(sums[RUNNING_METRIC]),
        "kv": sum(kv) / len(kv),
        "kv_fallback": float(kv_name == KV_METRIC_OLD),
    }


# --------------------------------------------------------------------------- shared


def _aggregate(
    settings: Settings,
    readings: list[ServiceReading],
    problems: list[str],
    missing: bool,
    job_gpus: int,
) -> SignalsReport:
    if missing or any(r.replicas is None or r.requests_waiting is None or
                      r.kv_cache_usage is None for r in readings) or (
        len(readings) < len(settings.services)
    ):
        return SignalsReport(ServingSignals(observed_at=None), tuple(readings), tuple(problems))
    kv = 0.0
    waiting = 0.0
    held = 0
    want = 0.0
    for r in readings:
        svc = settings.service(r.service)
        assert r.replicas is not None and r.requests_waiting is not None
        assert r.kv_cache_usage is not None
        held += math.ceil(r.replicas) * svc.gpus_per_replica
        if r.replicas < svc.max_replicas:
            kv = max(kv, r.kv_cache_usage)
            waiting = max(waiting, r.requests_waiting / max(r.replicas, 1.0))
        if r.desired_replicas is not None:
            desired = min(r.desired_replicas, svc.max_replicas)
            want += max(0.0, desired - r.replicas) * svc.gpus_per_replica
    idle = max(0, settings.pool.total_gpus - held - int(job_gpus))
    short = max(0, math.ceil(want) - idle)
    times = [r.oldest_sample for r in readings if r.oldest_sample is not None]
    observed = min(times) if times else None
    signals = ServingSignals(
        observed_at=observed,
        requests_waiting_per_replica=float(waiting),
        kv_cache_usage=float(kv),
        gpus_short=int(short),
        idle_gpus=int(idle),
        service_gpus=int(held),
    )
    return SignalsReport(signals, tuple(readings), tuple(problems))


def _unreachable(errs: list[str]) -> bool:
    return any("is unreachable" in e for e in errs)


def _short(exc: BaseException) -> str:
    text = redact(" ".join(str(exc).split()))
    if "Connection refused" in text or "connection refused" in text:
        return "connection refused"
    if "timed out" in text.lower():
        return "timed out"
    return text[:160]


def _epoch(value: datetime) -> float:
    if value.tzinfo is None:
        value = value.replace(tzinfo=UTC)
    return value.timestamp()


def _iso(at: float) -> str:
    return datetime.fromtimestamp(at, tz=UTC).isoformat()
