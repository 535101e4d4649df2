"""Live serving signals (scheduler/adapters/vllm.py) from a REAL Prometheus (backfilled with
promtool, or scraping a loopback exporter) and from vLLM-style /metrics pages on loopback."""

from __future__ import annotations

import http.server
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import numpy as np
import pandas as pd
import pytest
from prom_server import free_port, serve_openmetrics, start_scraping
from prometheus_client import CollectorRegistry, Gauge, generate_latest

from idlegpu.forecast.config import Settings, load_config
from idlegpu.forecast.errors import TemporaryError
from idlegpu.forecast.sources.openmetrics import openmetrics_text
from idlegpu.scheduler.adapters.vllm import (
    KV_METRIC,
    KV_METRIC_OLD,
    MetricsEndpointSignals,
    PrometheusSignals,
    SignalsError,
    fallback_kv_query,
    parse_vllm_metrics,
    vector_selectors,
)
from idlegpu.scheduler.ports import SignalSource

START = pd.Timestamp("2026-01-05T00:00:00Z")
STEP = 60
N = 61  # one hour at one-minute steps, both ends included
LAST = (START + pd.Timedelta(seconds=STEP * (N - 1))).to_pydatetime()
SERVICES = {"chat": (4, 1, 6), "code": (2, 1, 3)}  # gpus_per_replica, min, max replicas
TOTAL_GPUS = 40

TEMPLATES = {
    "replicas": 'kube_deployment_status_replicas{namespace="inference",deployment="$service"}',
    "requests_running": 'sum(vllm:num_requests_running{model_name="$service"})',
    "requests_waiting": 'sum(vllm:num_requests_waiting{model_name="$service"})',
    "kv_cache_usage": 'avg(vllm:kv_cache_usage_perc{model_name="$service"})',
}
HPA = ('kube_horizontalpodautoscaler_status_desired_replicas{namespace="inference",'
       'horizontalpodautoscaler="$service"}')


def _settings(url: str = "http://127.0.0.1:1", **prometheus: object) -> Settings:
    return load_config(data={
        "pool": {"total_gpus": TOTAL_GPUS, "headroom_gpus": 0},
        "prometheus": {"url": url, "retries": 0, "timeout_seconds": 5, **prometheus},
        "query_templates": TEMPLATES,
        "services": [
            {"name": n, "gpus_per_replica": g, "min_replicas": lo, "max_replicas": hi}
            for n, (g, lo, hi) in SERVICES.items()
        ],
    })


def _values() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(7)
    t = np.arange(N)
    return {
        "chat/replicas": np.minimum(6, 2 + t // 20).astype(float),  # 2, 3, 4, 5 at the end
        "chat/requests_running": rng.integers(10, 60, N).astype(float),
        "chat/requests_waiting": rng.integers(0, 30, N).astype(float),
        "chat/kv_cache_usage": np.round(rng.uniform(0.2, 0.9, N), 3),
        "code/replicas": np.full(N, 3.0),  # at its maximum: its pressure does not count
        "code/requests_running": rng.integers(0, 20, N).astype(float),
        "code/requests_waiting": np.full(N, 50.0),
        "code/kv_cache_usage": np.full(N, 0.99),
    }


def _history() -> pd.DataFrame:
    ds = pd.date_range(START, periods=N, freq=f"{STEP}s")
    return pd.concat(
        [pd.DataFrame({"unique_id": uid, "ds": ds, "y": y}) for uid, y in _values().items()],
        ignore_index=True,
    )


@pytest.fixture(scope="module")
def prom(prometheus_factory):
    return prometheus_factory(_history(), name="vllm-signals")


@pytest.fixture(scope="module")
def old_vllm_prom(tmp_path_factory) -> Iterator[object]:
    """Only vLLM's old KV name, plus the autoscaler's desired replicas (hand-written text)."""
    text = openmetrics_text(_history()).replace(KV_METRIC, KV_METRIC_OLD).removesuffix("# EOF\n")
    stamps = [int((START + pd.Timedelta(seconds=STEP * i)).timestamp()) for i in range(N)]
    text += "# HELP kube_horizontalpodautoscaler_status_desired_replicas Desired replicas.\n"
    text += "# TYPE kube_horizontalpodautoscaler_status_desired_replicas gauge\n"
    for name, desired in (("chat", 6.0), ("code", 3.0)):
        labels = f'namespace="inference",horizontalpodautoscaler="{name}"'
        text += "".join(
            f"kube_horizontalpodautoscaler_status_desired_replicas{{{labels}}} {desired} {ts}\n"
            for ts in stamps
        )
    text += "# EOF\n"
    server = serve_openmetrics(text, tmp_path_factory.mktemp("old-vllm"))
    yield server
    server.stop()


# --------------------------------------------------------------------------- Prometheus


def test_reads_back_the_values_at_now(prom):
    source: SignalSource = PrometheusSignals(_settings(prom.url))
    assert isinstance(source, PrometheusSignals)
    v = {k: a[-1] for k, a in _values().items()}
    report = source.read_report(LAST, job_gpus=6)
    assert report.problems == ()
    s = report.signals
    assert s.observed_at == LAST
    # only chat can still scale (code is at max_replicas): its KV and queue per replica
    assert s.kv_cache_usage == pytest.approx(v["chat/kv_cache_usage"])
    assert s.requests_waiting_per_replica == pytest.approx(
        v["chat/requests_waiting"] / v["chat/replicas"]
    )
    held = v["chat/replicas"] * 4 + v["code/replicas"] * 2
    assert s.idle_gpus == TOTAL_GPUS - held - 6
    assert s.gpus_short == 0  # no desired-replicas query given
    chat = {r.service: r for r in report.services}["chat"]
    assert chat.requests_running == v["chat/requests_running"]
    assert not chat.kv_fallback
    # plain read(now) works too, and mid-history values are those of that minute
    mid = (START + pd.Timedelta(minutes=30)).to_pydatetime()
    s = source.read(mid)
    assert s.observed_at == mid
    assert s.kv_cache_usage == pytest.approx(_values()["chat/kv_cache_usage"][30])
    assert s.idle_gpus == TOTAL_GPUS - 3 * 4 - 3 * 2


def test_old_samples_make_old_signals_and_then_missing_ones(prom):
    source = PrometheusSignals(_settings(prom.url))
    # 3 minutes after the last sample Prometheus still answers (lookback 5 min), but with the
    # old sample: observed_at is that sample's time, not the query time
    s = source.read(LAST + timedelta(minutes=3))
    assert s.observed_at == LAST
    assert s.age_s(LAST + timedelta(minutes=3)) == 180
    # 10 minutes after: nothing at all, reported as missing (never as "no load")
    s = source.read(LAST + timedelta(minutes=10))
    assert s.observed_at is None
    assert s.kv_cache_usage == 0 and s.idle_gpus is None
    assert "no series" in source.last_problem
    assert "chat/replicas" in source.last_problem


def test_one_missing_required_series_makes_everything_missing(prom):
    settings = load_config(data={
        **_settings(prom.url).model_dump(mode="json"),
        "services": [
            {"name": "chat", "gpus_per_replica": 4, "min_replicas": 1, "max_replicas": 6},
            {"name": "ghost", "gpus_per_replica": 1, "min_replicas": 0, "max_replicas": 2},
        ],
    })
    source = PrometheusSignals(settings)
    report = source.read_report(LAST)
    assert report.signals.observed_at is None
    assert any(p.startswith("ghost/replicas: no series") for p in report.problems)
    assert {r.service: r for r in report.services}["chat"].replicas == 5


def test_falls_back_to_gpu_cache_usage_and_computes_gpus_short(old_vllm_prom):
    v = {k: a[-1] for k, a in _values().items()}
    plain = PrometheusSignals(_settings(old_vllm_prom.url))
    report = plain.read_report(LAST)
    assert report.problems == ()
    assert report.signals.observed_at == LAST
    assert report.signals.kv_cache_usage == pytest.approx(v["chat/kv_cache_usage"])
    assert {r.service: r for r in report.services}["chat"].kv_fallback
    assert report.signals.gpus_short == 0

    with_hpa = load_config(data={**_settings(old_vllm_prom.url).model_dump(mode="json"),
                                 "query_templates": {**TEMPLATES, "desired_replicas": HPA}})
    hpa = PrometheusSignals(with_hpa)
    idle = TOTAL_GPUS - 5 * 4 - 3 * 2  # 14
    # chat wants 6 replicas, has 5: 4 GPUs; covered by idle GPUs unless jobs hold them
    assert hpa.read(LAST).gpus_short == 0
    s = hpa.read(LAST, job_gpus=idle - 1)
    assert s.idle_gpus == 1
    assert s.gpus_short == 3


def test_prometheus_down_is_missing_signals_not_a_crash():
    source = PrometheusSignals(_settings(f"http://127.0.0.1:{free_port()}"))
    s = source.read(LAST)
    assert s.observed_at is None
    assert "is unreachable" in source.last_problem
    assert "connection refused" in source.last_problem
    assert len(source.last_report.problems) == 1  # stops at the first unreachable answer


def test_a_rejected_query_is_reported(prom):
    settings = load_config(data={
        **_settings(prom.url).model_dump(mode="json"),
        "query_templates": {**TEMPLATES, "kv_cache_usage": "avg(vllm:kv_cache_usage_perc{"},
    })
    source = PrometheusSignals(settings)
    assert source.read(LAST).observed_at is None
    assert "refused" in source.last_problem and "HTTP 400" in source.last_problem


def test_promql_text_helpers():
    assert vector_selectors(
        'sum by (model_name) (rate(vllm:x_total{model_name="a"}[5m] offset 1m)) / 2.5e3 '
        "or on(job) up"
    ) == ['vllm:x_total{model_name="a"}', "up"]
    assert vector_selectors("vector(1)") == []
    assert fallback_kv_query('avg(vllm:kv_cache_usage_perc{model_name="a"})') == (
        'avg(vllm:gpu_cache_usage_perc{model_name="a"})'
    )
    assert fallback_kv_query("avg(vllm:kv_cache_usage_perc_other)") is None


# --------------------------------------------------------------------------- /metrics pages


def vllm_page(model: str, waiting: float, running: float, kv: float, *,
              old_kv_name: bool = False, replicas: float | None = None) -> bytes:
    """vLLM's exposition text of one model, generated by prometheus_client."""
    return vllm_pages([(model, waiting, running, kv, replicas)], old_kv_name=old_kv_name)


def vllm_pages(rows: list[tuple[str, float, float, float, float | None]], *,
               old_kv_name: bool = False) -> bytes:
    """One page with a sample per ``(model, waiting, running, kv, replicas)`` row; a row's
    replicas (if not None) as kube-state-metrics would expose them."""
    registry = CollectorRegistry()
    labels = ["model_name", "engine"]
    waiting_g = Gauge("vllm:num_requests_waiting", "Waiting requests.", labels,
                      registry=registry)
    running_g = Gauge("vllm:num_requests_running", "Running requests.", labels,
                      registry=registry)
    kv_g = Gauge(KV_METRIC_OLD if old_kv_name else KV_METRIC, "KV-cache usage.", labels,
                 registry=registry)
    replicas_g = Gauge("kube_deployment_status_replicas", "Replicas.",
                       ["namespace", "deployment"], registry=registry)
    for model, waiting, running, kv, replicas in rows:
        waiting_g.labels(model, "0").set(waiting)
        running_g.labels(model, "0").set(running)
        kv_g.labels(model, "0").set(kv)
        if replicas is not None:
            replicas_g.labels("inference", model).set(replicas)
    return generate_latest(registry)


class Exporter:
    """A tiny HTTP server on loopback serving ``pages[path]`` (bytes) with status 200."""

    def __init__(self) -> None:
        self.pages: dict[str, bytes] = {}
        pages = self.pages

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                body = pages.get(self.path)
                if body is None:
                    self.send_response(404)
                    body = b"not found"
                else:
                    self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def exporter() -> Iterator[Exporter]:
    ex = Exporter()
    yield ex
    ex.close()


def test_scrapes_and_aggregates_two_endpoints(exporter):
    exporter.pages["/chat-0/metrics"] = vllm_page("chat", 6, 20, 0.5)
    exporter.pages["/chat-1/metrics"] = vllm_page("chat", 4, 30, 0.7)
    exporter.pages["/code-0/metrics"] = vllm_page("code", 9, 1, 0.3, old_kv_name=True)
    endpoints = {
        "chat": [exporter.url("/chat-0/metrics"), exporter.url("/chat-1/metrics")],
        "code": [exporter.url("/code-0/metrics")],
    }
    source = MetricsEndpointSignals(_settings(), endpoints)  # replicas = endpoints
    now = datetime(2026, 1, 5, 12, tzinfo=UTC)
    report = source.read_report(now, job_gpus=10)
    assert report.problems == ()
    chat, code = report.services
    assert (chat.requests_waiting, chat.requests_running) == (10, 50)
    assert chat.kv_cache_usage == pytest.approx(0.6)
    assert code.kv_cache_usage == pytest.approx(0.3) and code.kv_fallback
    s = report.signals
    assert s.observed_at == now
    assert s.kv_cache_usage == pytest.approx(0.6)
    assert s.requests_waiting_per_replica == pytest.approx(9.0)  # code: 9 waiting, 1 replica
    assert s.idle_gpus == TOTAL_GPUS - 2 * 4 - 1 * 2 - 10
    # replica counts from elsewhere (a mapping or a callable): code at its max stops counting
    s = MetricsEndpointSignals(_settings(), endpoints, {"chat": 2, "code": 3}).read(now)
    assert s.requests_waiting_per_replica == pytest.approx(5.0)
    s = MetricsEndpointSignals(_settings(), endpoints, lambda name: 5).read(now)
    assert s.requests_waiting_per_replica == pytest.approx(2.0)
    assert s.kv_cache_usage == pytest.approx(0.6)


def test_malformed_page_is_a_clear_error(exporter):
    exporter.pages["/ok/metrics"] = vllm_page("chat", 1, 1, 0.1)
    exporter.pages["/bad/metrics"] = b"<html><body>Welcome to nginx</body></html>\n"
    exporter.pages["/other/metrics"] = b"# TYPE up gauge\nup 1\n"
    bad = exporter.url("/bad/metrics")
    source = MetricsEndpointSignals(_settings(), {
        "chat": [exporter.url("/ok/metrics"), bad],
        "code": [exporter.url("/other/metrics")],
    })
    s = source.read(datetime(2026, 1, 5, tzinfo=UTC))
    assert s.observed_at is None
    problems = source.last_report.problems
    assert problems[0].startswith(f"chat: vLLM metrics endpoint {bad} served a malformed page")
    assert "has no vllm:num_requests_waiting" in problems[1] and "/other/metrics" in problems[1]
    with pytest.raises(SignalsError, match="malformed") as err:
        parse_vllm_metrics("vllm:num_requests_waiting{ 3\n", source="x")
    assert isinstance(err.value, TemporaryError)


def test_unreachable_endpoint_is_a_clear_error(exporter):
    dead = f"http://127.0.0.1:{free_port()}/metrics"
    exporter.pages["/metrics"] = vllm_page("code", 1, 1, 0.1)
    source = MetricsEndpointSignals(_settings(), {
        "chat": [dead], "code": [exporter.url("/metrics")],
    }, timeout_s=2)
    s = source.read(datetime(2026, 1, 5, tzinfo=UTC))
    assert s.observed_at is None
    assert source.last_problem == (
        f"chat: vLLM metrics endpoint {dead} is unreachable (ConnectionError: connection refused)"
    )
    missing = MetricsEndpointSignals(_settings(), {"chat": [exporter.url("/metrics")]})
    assert missing.read(datetime(2026, 1, 5, tzinfo=UTC)).observed_at is None
    assert missing.last_problem == "code: no /metrics endpoint given"


# --------------------------------------------------------------------------- scraping


def test_real_prometheus_scraping_a_loopback_exporter(exporter, tmp_path):
    exporter.pages["/metrics"] = vllm_pages([("chat", 12, 40, 0.8, 3), ("code", 2, 5, 0.4, 1)])
    server = start_scraping([f"127.0.0.1:{exporter.port}"], tmp_path / "prom")
    try:
        source = PrometheusSignals(_settings(server.url))
        deadline = time.monotonic() + 30
        while True:
            now = datetime.now(UTC)
            report = source.read_report(now)
            if report.signals.observed_at is not None or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        s = report.signals
        assert s.observed_at is not None, report.problems
        assert 0 <= s.age_s(now) < 5
        assert s.kv_cache_usage == pytest.approx(0.8)
        assert s.requests_waiting_per_replica == pytest.approx(4.0)
        assert s.idle_gpus == TOTAL_GPUS - 3 * 4 - 1 * 2
        # the exporter goes silent (404): Prometheus marks the series stale -> missing
        exporter.pages.clear()
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if source.read(datetime.now(UTC)).observed_at is None:
                break
            time.sleep(0.2)
        assert source.last_report.signals.observed_at is None
        assert "no series" in source.last_problem
    finally:
        server.stop()

