"""Fetching history from a REAL Prometheus (backfilled with promtool) and the pieces behind it:
the OpenMetrics writer, chunk planning and the counter-rate math."""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import requests
import yaml
from prom_server import free_port

from idlegpu.forecast.config import load_config
from idlegpu.forecast.errors import ConfigError, HistoryError, SourceUnavailableError
from idlegpu.forecast.schema import SERVICE_METRICS, series_id
from idlegpu.forecast.sources import read_history
from idlegpu.forecast.sources.openmetrics import openmetrics_text
from idlegpu.forecast.sources.prometheus import (
    align_range,
    counter_rate,
    fetch_history,
    plan_chunks,
)
from idlegpu.scheduler.cli import main

REPO = Path(__file__).resolve().parents[1]
STEP = 300
DAYS = 45
POINTS = DAYS * 86400 // STEP  # 12,960 points per series: more than Prometheus's 11,000
START = pd.Timestamp("2025-03-01T00:00:00Z")
SERVICES = ("chat", "code")
COUNTER_METRICS = ("prompt_tokens_per_s", "generation_tokens_per_s")


def _example_templates() -> dict:
    """The query templates of the example idlegpu.yaml: what the writer must match."""
    return yaml.safe_load((REPO / "idlegpu.yaml").read_text())["query_templates"]


def _config(tmp_path: Path, url: str, **prometheus: object) -> dict:
    return {
        "pool": {"total_gpus": 32, "headroom_gpus": 0},
        "prometheus": {"url": url, "retries": 1, "timeout_seconds": 20, **prometheus},
        "query_templates": _example_templates(),
        "services": [
            {"name": name, "gpus_per_replica": 4, "min_replicas": 1, "max_replicas": 4}
            for name in SERVICES
        ],
    }


def _write_config(tmp_path: Path, data: dict) -> Path:
    path = tmp_path / "idlegpu.yaml"
    path.write_text(yaml.safe_dump(data), encoding="utf-8")
    return path


def _series(metric: str, rng: np.random.Generator, n: int) -> np.ndarray:
    day = np.sin(np.arange(n) * 2 * np.pi * STEP / 86400) * 0.5 + 0.5
    if metric == "replicas":
        return np.floor(2 + 10 * day + rng.integers(0, 3, n)).astype(np.float64)
    if metric == "kv_cache_usage":
        return np.clip(day * 0.9 + rng.random(n) * 0.1, 0.0, 1.0)
    if metric in COUNTER_METRICS:
        rate = day * 4000 * rng.random(n)
        rate[rng.random(n) < 0.05] = 0.0  # idle intervals
        return rate
    return day * 50 + rng.random(n) * 7.3  # requests_running / requests_waiting


def make_history(
    services: tuple[str, ...] = SERVICES,
    *,
    days: int = DAYS,
    start: pd.Timestamp = START,
    seed: int = 7,
) -> pd.DataFrame:
    """Deterministic history: every metric of every service, every step, no gaps."""
    rng = np.random.default_rng(seed)
    n = days * 86400 // STEP
    ds = pd.date_range(start, periods=n, freq=f"{STEP}s")
    frames = [
        pd.DataFrame({"unique_id": series_id(s, m), "ds": ds, "y": _series(m, rng, n)})
        for s in services
        for m in SERVICE_METRICS
    ]
    return pd.concat(frames, ignore_index=True)


@pytest.fixture(scope="module")
def full_history() -> pd.DataFrame:
    return make_history()


@pytest.fixture(scope="module")
def prom(prometheus_factory, full_history):
    return prometheus_factory(full_history, name="full")


def _hours_after_start(hours: float) -> datetime:
    return (START + pd.Timedelta(hours=hours)).to_pydatetime()


def _assert_same(got: pd.DataFrame, want: pd.DataFrame) -> None:
    got = got.sort_values(["unique_id", "ds"]).reset_index(drop=True)
    want = want.sort_values(["unique_id", "ds"]).reset_index(drop=True)
    assert sorted(got["unique_id"].unique()) == sorted(want["unique_id"].unique())
    for uid, w in want.groupby("unique_id"):
        g = got[got["unique_id"] == uid]
        assert len(g) == len(w), uid
        assert (g["ds"].to_numpy() == w["ds"].to_numpy()).all(), uid
        if uid.endswith(COUNTER_METRICS):
            assert np.isclose(g["y"], w["y"], rtol=1e-9).all(), uid
        else:
            assert (g["y"].to_numpy() == w["y"].to_numpy()).all(), uid


# --------------------------------------------------------------------------- must-show


def test_fetch_cli_round_trips_long_history_in_chunks(
    prom, full_history, tmp_path, monkeypatch, capsys
):
    """Backfill 45 days at 5 min (12,960 points per series, above Prometheus's 11,000 limit),
    pull it back with `idlegpu fetch`: same timestamps, same values, several chunks per series."""
    calls: list[tuple[str, int, int]] = []
    original = requests.Session.get

    def counting(self, url, params=None, **kwargs):
        if url.endswith("/api/v1/query_range"):
            calls.append((params["query"], int(params["start"]), int(params["end"])))
        return original(self, url, params=params, **kwargs)

    monkeypatch.setattr(requests.Session, "get", counting)
    max_points = 5000
    config = _write_config(
        tmp_path, _config(tmp_path, prom.url, max_points_per_query=max_points, workers=4)
    )
    out = tmp_path / "history.parquet"
    first, last = full_history["ds"].min(), full_history["ds"].max()
    try:  # success returns; an exit must be a clean one
        main(
            [
                "fetch", "--config", str(config),
                "--start", first.isoformat(), "--end", last.isoformat(),
                "--out", str(out),
            ]
        )
    except SystemExit as exc:
        assert exc.code in (None, 0), capsys.readouterr().err
    assert f"{len(full_history):,} samples of 12 series" in capsys.readouterr().out

    _assert_same(read_history(out), full_history)

    # 12 series; gauges 12,960 points, counters one more: 3 chunks of <= 5,000 points each.
    assert len(calls) == 12 * 3
    per_query: dict[str, list[tuple[int, int]]] = {}
    for query, s, e in calls:
        assert (e - s) // STEP + 1 <= max_points
        per_query.setdefault(query, []).append((s, e))
    for query, spans in per_query.items():
        spans.sort()
        assert len(spans) == 3, query
        for (_, e0), (s1, _) in itertools.pairwise(spans):
            assert s1 == e0 + STEP  # adjacent, no overlap, no hole


def test_fetch_history_subset_of_services_and_unaligned_range(prom, full_history, tmp_path):
    data = _config(tmp_path, prom.url)
    # a live-only query is not part of the history, even where Prometheus has its series
    data["query_templates"]["desired_replicas"] = data["query_templates"]["replicas"]
    settings = load_config(data=data)
    start = (START + pd.Timedelta(days=3, seconds=17)).to_pydatetime()  # rounded up to the grid
    end = (START + pd.Timedelta(days=4, seconds=-1)).to_pydatetime()
    got = fetch_history(settings, start, end, services=["code"], workers=2)
    want = full_history[
        full_history["unique_id"].str.startswith("code/")
        & (full_history["ds"] >= START + pd.Timedelta(days=3, seconds=STEP))
        & (full_history["ds"] <= START + pd.Timedelta(days=4, seconds=-STEP))
    ]
    _assert_same(got, want)
    # Same answer fetched one query at a time and with a coarser step's grid being different.
    again = fetch_history(settings, start, end, services=["code"], workers=1)
    pd.testing.assert_frame_equal(got, again)


# --------------------------------------------------------------------------- gaps


def test_gaps_stay_gaps(prometheus_factory, tmp_path):
    history = make_history(("gappy",), days=2, seed=3)
    gap_start = START + pd.Timedelta(hours=20)
    gap_end = START + pd.Timedelta(hours=26)  # first sample after the 6-hour hole
    in_gap = (history["ds"] >= gap_start) & (history["ds"] < gap_end)
    history = history[~in_gap].reset_index(drop=True)
    server = prometheus_factory(history, name="gappy")

    data = _config(tmp_path, server.url)
    data["services"] = [
        {"name": "gappy", "gpus_per_replica": 1, "min_replicas": 0, "max_replicas": 2}
    ]
    settings = load_config(data=data)
    got = fetch_history(
        settings, history["ds"].min().to_pydatetime(), history["ds"].max().to_pydatetime()
    )

    last_before = gap_start - pd.Timedelta(seconds=STEP)
    for uid, want in history.groupby("unique_id"):
        g = got[got["unique_id"] == uid].set_index("ds")["y"]
        w = want.set_index("ds")["y"]
        echoed = g[(g.index >= gap_start) & (g.index < gap_end)]
        # Prometheus 2.x may repeat the last sample once (5-minute lookback, inclusive);
        # nothing else shows up in the hole, nothing is interpolated.
        assert len(echoed) <= 1, uid
        if len(echoed):
            assert echoed.index[0] == gap_start, uid
        outside = g.drop(echoed.index)
        if uid.endswith(COUNTER_METRICS):
            if len(echoed):
                assert echoed.iloc[0] == 0.0  # the repeated counter value: no increase
            # The first sample after the hole has no predecessor one step back: no rate.
            assert gap_end not in outside.index, uid
            expected = w.drop(gap_end)
            assert outside.index.equals(expected.index), uid
            assert np.isclose(outside.to_numpy(), expected.to_numpy(), rtol=1e-9).all(), uid
        else:
            if len(echoed):
                assert echoed.iloc[0] == w[last_before]
            assert outside.index.equals(w.index), uid
            assert (outside.to_numpy() == w.to_numpy()).all(), uid


# --------------------------------------------------------------------------- counter_rate


def test_counter_rate_steady_reset_and_gap():
    ds = np.array([0, 60, 120, 180, 300, 360, 420])  # 240 missing
    v = np.array([10.0, 70.0, 130.0, 40.0, 100.0, 160.0, 100.0])
    t, r = counter_rate(ds, v, 60)
    # 60: +60; 120: +60; 180: reset -> 40/60; 300: predecessor missing; 360: +60; 420: reset
    assert t.tolist() == [60, 120, 180, 360, 420]
    assert r.tolist() == [1.0, 1.0, 40.0 / 60, 1.0, 100.0 / 60]


def test_counter_rate_datetimes_nan_and_short():
    ds = pd.date_range("2025-01-01", periods=5, freq="5min").to_numpy()
    v = np.array([0.0, 300.0, np.nan, 900.0, 1200.0])
    t, r = counter_rate(ds, v, pd.Timedelta(minutes=5))
    assert t.tolist() == [ds[1], ds[4]] and r.tolist() == [1.0, 1.0]
    t, r = counter_rate(ds[:1], v[:1], 300)
    assert len(t) == 0 and len(r) == 0


# --------------------------------------------------------------------------- chunk planning


@pytest.mark.parametrize(
    ("n_points", "max_points"),
    [(1, 10), (10, 10), (11, 10), (12_960, 10_000), (12_961, 5000), (7, 1)],
)
def test_plan_chunks_cover_grid_once(n_points, max_points):
    step, start = 300, 1_740_787_200
    end = start + (n_points - 1) * step
    chunks = plan_chunks(start, end, step, max_points)
    assert chunks[0].start == start and chunks[-1].end == end
    assert all(c.points <= max_points for c in chunks)
    assert sum(c.points for c in chunks) == n_points
    for a, b in itertools.pairwise(chunks):
        assert b.start == a.end + step  # no overlap, no hole
    assert len(chunks) == -(-n_points // max_points)


def test_plan_chunks_end_off_grid_and_align_range():
    chunks = plan_chunks(0, 1000, 300, 2)
    assert [(c.start, c.end) for c in chunks] == [(0, 300), (600, 900)]
    utc = UTC
    assert align_range(
        datetime(2025, 1, 1, 0, 0, 1, tzinfo=utc), datetime(2025, 1, 1, 1, 4, tzinfo=utc), 300
    ) == (1735689900, 1735693200)
    assert align_range(datetime(2025, 1, 1, 0, 0, 1), datetime(2025, 1, 1, 0, 4), 300) is None


# --------------------------------------------------------------------------- OpenMetrics


def test_openmetrics_text_format():
    ds = pd.date_range("2025-01-01", periods=3, freq="60s", tz="UTC")
    history = pd.DataFrame(
        {
            "unique_id": ["a/prompt_tokens_per_s"] * 3 + ["a/replicas"] * 3 + ["b/replicas"] * 2,
            "ds": list(ds) + list(ds) + list(ds[:2]),
            "y": [1.5, 0.0, 2.0, 3.0, 4.0, 0.1, 5.0, 6.0],
        }
    )
    text = openmetrics_text(history)
    lines = text.splitlines()
    assert lines[-1] == "# EOF"
    t0 = int(ds[0].timestamp())
    assert lines[:2] == [
        "# HELP kube_deployment_status_replicas The number of replicas per deployment.",
        "# TYPE kube_deployment_status_replicas gauge",
    ]
    replicas = [ln for ln in lines if ln.startswith("kube_deployment_status_replicas{")]
    assert replicas[0] == (
        f'kube_deployment_status_replicas{{namespace="inference",deployment="a"}} 3.0 {t0}'
    )
    assert replicas[2].endswith(f" 0.1 {t0 + 120}")  # repr: round-trips exactly
    assert len(replicas) == 5 and lines.index(replicas[-1]) == 6  # one family, contiguous
    counter = [ln for ln in lines if ln.startswith("vllm:prompt_tokens_total{")]
    assert counter == [
        f'vllm:prompt_tokens_total{{model_name="a"}} 0.0 {t0 - 60}',
        f'vllm:prompt_tokens_total{{model_name="a"}} 90.0 {t0}',
        f'vllm:prompt_tokens_total{{model_name="a"}} 90.0 {t0 + 60}',
        f'vllm:prompt_tokens_total{{model_name="a"}} 210.0 {t0 + 120}',
    ]
    assert "# TYPE vllm:prompt_tokens counter" in lines


def test_openmetrics_rejects_unknown_metric_and_negative_rate():
    ds = pd.date_range("2025-01-01", periods=2, freq="60s", tz="UTC")
    with pytest.raises(HistoryError, match="chat/gpu_temp"):
        openmetrics_text(pd.DataFrame({"unique_id": "chat/gpu_temp", "ds": ds, "y": [1.0, 2.0]}))
    with pytest.raises(HistoryError, match="chat/prompt_tokens_per_s"):
        openmetrics_text(
            pd.DataFrame({"unique_id": "chat/prompt_tokens_per_s", "ds": ds, "y": [1.0, -2.0]})
        )


# --------------------------------------------------------------------------- bad input


def test_cli_prometheus_down_is_one_line_exit_2(tmp_path):
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    config = _write_config(tmp_path, _config(tmp_path, url))
    exe = Path(sys.executable).with_name("idlegpu")
    proc = subprocess.run(
        [
            str(exe), "fetch", "-c", str(config), "--start", "2025-03-01T00:00:00Z",
            "--end", "2025-03-02T00:00:00Z", "--out", str(tmp_path / "h.parquet"),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={**os.environ, "COLUMNS": "300"},
    )
    assert proc.returncode == 2, proc.stderr
    config_line, *rest = proc.stderr.strip().splitlines()
    assert config_line.startswith(f"config: {config}")  # which config it read, first
    err = "\n".join(rest)
    assert "Traceback" not in err
    assert len(err.splitlines()) == 1, err
    assert err == (
        f"error: Prometheus at {url} is unreachable (connection refused); "
        "check prometheus.url or IDLEGPU_PROMETHEUS__URL"
    )
    assert not (tmp_path / "h.parquet").exists()


def test_fetch_history_unreachable_raises_source_unavailable(tmp_path):
    settings = load_config(data=_config(tmp_path, f"http://127.0.0.1:{free_port()}", retries=0))
    with pytest.raises(SourceUnavailableError, match="unreachable"):
        fetch_history(settings, START.to_pydatetime(), _hours_after_start(1))


def test_cli_bad_promql_names_service_and_metric(prom, tmp_path, capsys):
    data = _config(tmp_path, prom.url)
    bad = 'sum(vllm:num_requests_waiting{model_name="code"}'  # unclosed parenthesis
    data["services"][1]["queries"] = {"requests_waiting": bad}
    config = _write_config(tmp_path, data)
    with pytest.raises(SystemExit) as exit_info:
        main(
            [
                "fetch", "-c", str(config), "--start", "2025-03-01", "--end", "2025-03-02",
                "--out", str(tmp_path / "h.parquet"),
            ]
        )
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert "service 'code', metric 'requests_waiting'" in err
    assert 'sum(vllm:num_requests_waiting{model_name="code"}' in err
    assert "parse error" in err


def test_query_returning_several_series_is_a_clear_error(prom, tmp_path):
    data = _config(tmp_path, prom.url)
    data["services"][0]["queries"] = {"requests_running": "vllm:num_requests_running"}
    settings = load_config(data=data)
    with pytest.raises(ConfigError) as info:
        fetch_history(
            settings,
            START.to_pydatetime(),
            (START + pd.Timedelta(hours=2)).to_pydatetime(),
            services=["chat"],
        )
    message = str(info.value)
    assert "service 'chat', metric 'requests_running'" in message
    assert "returned 2 series" in message
    assert "aggregate" in message and "sum(" in message


def test_server_errors_are_retried_then_reported_with_token_sent(tmp_path):
    """A 503 is retried (prometheus.retries) and then reported as SourceUnavailableError; the
    bearer token travels in the Authorization header."""
    import json
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    seen: list[tuple[str, str | None, str | None]] = []

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):
            seen.append(
                (self.path, self.headers.get("Authorization"), self.headers.get("Accept-Encoding"))
            )
            body = json.dumps(
                {"status": "error", "errorType": "unavailable", "error": "TSDB not ready"}
            ).encode()
            self.send_response(503)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/"
        data = _config(tmp_path, url, retries=1, bearer_token="s3cret", workers=1)
        data["services"] = data["services"][:1]
        data["query_templates"] = {"replicas": data["query_templates"]["replicas"]}
        settings = load_config(data=data)
        with pytest.raises(SourceUnavailableError) as info:
            fetch_history(settings, START.to_pydatetime(), _hours_after_start(1))
    finally:
        server.shutdown()
        server.server_close()
    message = str(info.value)
    assert "HTTP 503" in message and "TSDB not ready" in message and "after 1 retry:" in message
    assert len(seen) == 2  # the first try and one retry
    assert all(path.startswith("/api/v1/query_range?") for path, _, _ in seen)
    assert all(auth == "Bearer s3cret" for _, auth, _ in seen)
    assert all(enc == "identity" for _, _, enc in seen)
