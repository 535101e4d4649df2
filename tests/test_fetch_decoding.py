"""The fast decoding of range-query answers (``decode_matrix``) returns exactly what decoding
the whole JSON did: the same times and values bit for bit (NaN, +Inf, -Inf, -0, subnormals,
the largest double, fractional timestamps), the same labels, series and gaps. The answers come
from a REAL Prometheus (hand-written OpenMetrics backfilled with promtool)."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
import requests
from prom_server import serve_openmetrics

from idlegpu.forecast.config import load_config
from idlegpu.forecast.sources import prometheus
from idlegpu.forecast.sources.prometheus import decode_matrix, fetch_history

T0 = 1_735_689_600  # 2025-01-01T00:00:00Z
STEP = 60
# what Prometheus itself may write for a sample: Go's shortest round-trip formatting
VALUES = ["1", "0.1", "NaN", "+Inf", "-Inf", "1e-300", "5e-324", "1.7976931348623157e308",
          "-2.5", "-0", "123456789.123456789", "3", "42", "0", "7.25"]
POINTS = 240  # 4 hours


def _openmetrics() -> str:
    lines = ["# TYPE sample_values gauge"]
    for i in range(POINTS):
        lines.append(f'sample_values{{kind="mixed"}} {VALUES[i % len(VALUES)]} {T0 + STEP * i}')
    for i in range(POINTS):
        if 60 <= i < 90:  # a 30-minute hole: longer than the 5-minute lookback
            continue
        lines.append(f'sample_values{{kind="steady",team="a b\\"c"}} {i * 1.5} {T0 + STEP * i}')
    return "\n".join([*lines, "# EOF"]) + "\n"


@pytest.fixture(scope="module")
def prom(prometheus_binaries, tmp_path_factory):
    server = serve_openmetrics(_openmetrics(), tmp_path_factory.mktemp("decoding"))
    try:
        yield server
    finally:
        server.stop()


def _answer(prom, query: str, start: float, end: float, step: float) -> bytes:
    resp = requests.get(
        f"{prom.url}/api/v1/query_range",
        params={"query": query, "start": start, "end": end, "step": step},
        headers={"Accept-Encoding": "identity"},
        timeout=30,
    )
    assert resp.status_code == 200, resp.text
    return resp.content


def _decoded_whole(body: bytes) -> list[tuple[dict, np.ndarray, np.ndarray]]:
    """How the answers were decoded before: the standard library's JSON, float() per value."""
    result = json.loads(body)["data"]["result"]
    return [
        (
            entry["metric"],
            np.array([t for t, _ in entry["values"]], dtype=np.float64),
            np.array([float(v) for _, v in entry["values"]], dtype=np.float64),
        )
        for entry in result
    ]


def _same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    """Equal as doubles, bit for bit (so -0 != 0), every NaN equal to every NaN."""
    if a.shape != b.shape:
        return False
    nan = np.isnan(a)
    if not (nan == np.isnan(b)).all():
        return False
    return bool((a[~nan].view(np.int64) == b[~nan].view(np.int64)).all())


QUERIES = [
    ('sample_values{kind="mixed"}', "every special value as Prometheus writes it"),
    ('sample_values{kind="mixed"} / 0', "+Inf, -Inf and NaN (0/0) computed by Prometheus"),
    ('sample_values{kind="mixed"} * 1e-310', "subnormal values"),
    ("timestamp(sample_values)", "two series; times as values"),
    ('sample_values{kind="steady"}', "a series with a hole (missing steps)"),
    ("sample_values{kind=\"nothing\"}", "no series at all"),
]


@pytest.mark.parametrize(("query", "what"), QUERIES, ids=[q for q, _ in QUERIES])
@pytest.mark.parametrize(("offset", "step"), [(0, STEP), (0.25, 37.5)], ids=["grid", "fractional"])
def test_fast_decoding_equals_whole_json_decoding(prom, query, what, offset, step):
    body = _answer(prom, query, T0 + offset, T0 + STEP * (POINTS + 10), step)
    want = _decoded_whole(body)
    got = decode_matrix(body)
    if want:  # Prometheus's own layout takes the fast path (else this test proves nothing)
        spans = prometheus._values_spans(body)
        assert spans is not None and len(spans) == len(want)
        assert all(prometheus._read_pairs(body[a:b]) is not None for a, b in spans)
    assert len(got) == len(want), what
    for (labels, ts, ys), (w_labels, w_ts, w_ys) in zip(got, want, strict=True):
        assert labels == w_labels, what
        assert _same_bits(ts, w_ts), what
        assert _same_bits(ys, w_ys), what
    if query.endswith('"mixed"}'):  # the answer holds what the test is about
        ys = got[0][2]
        assert np.isnan(ys).any() and np.isposinf(ys).any() and np.isneginf(ys).any()
        assert (np.signbit(ys) & (ys == 0)).any()  # -0 stays -0
    if step != STEP and got:
        assert (got[0][1] % 1 != 0).any()  # fractional timestamps were decoded


def test_an_answer_laid_out_otherwise_decodes_the_same(prom):
    """Spaces, another key order and the values as numbers (what a proxy might write) take
    the general path: the same result."""
    body = _answer(prom, "timestamp(sample_values) / 7", T0, T0 + STEP * POINTS, STEP)
    want = _decoded_whole(body)
    payload = json.loads(body)
    for entry in payload["data"]["result"]:
        entry["values"] = [[t, v] for t, v in entry["values"]]
    spaced = json.dumps(payload, indent=1).encode()
    reordered = json.dumps({"data": {"result": [
        {"values": e["values"], "metric": e["metric"]} for e in payload["data"]["result"]
    ], "resultType": "matrix"}, "status": "success"}).encode()
    numbers = json.dumps({"status": "success", "data": {"resultType": "matrix", "result": [
        {"metric": e["metric"], "values": [[t, float(v)] for t, v in e["values"]]}
        for e in payload["data"]["result"]
    ]}}).encode()
    for variant in (spaced, reordered, numbers):
        got = decode_matrix(variant)
        assert len(got) == len(want) == 2
        for (labels, ts, ys), (w_labels, w_ts, w_ys) in zip(got, want, strict=True):
            assert labels == w_labels
            assert _same_bits(ts, w_ts) and _same_bits(ys, w_ys)


@pytest.mark.parametrize("body", [
    b"<html>not json</html>",
    b'{"status":"error","error":"x"}',
    b'{"status":"success","data":{"resultType":"vector","result":[]}}',
    b'{"status":"success","data":{"resultType":"matrix","result":[{"values":[[1,"2"],[3]]}]}}',
])
def test_what_is_not_a_range_answer_is_a_value_error(body):
    with pytest.raises(ValueError):
        decode_matrix(body)


def test_fetch_history_keeps_the_values_and_the_hole(prom):
    """Through fetch_history (4 chunks, 3 workers): the steady series' values at their times,
    nothing in the hole but Prometheus's own lookback repeats, no NaN."""
    settings = load_config(data={
        "pool": {"total_gpus": 8},
        "prometheus": {"url": prom.url, "step_seconds": STEP, "max_points_per_query": 70,
                       "workers": 3, "retries": 0},
        "query_templates": {"replicas": 'sample_values{kind="steady"}'},
        "services": [{"name": "s", "gpus_per_replica": 1, "min_replicas": 0,
                      "max_replicas": 200}],
    })
    start = pd.Timestamp(T0, unit="s", tz="UTC")
    got = fetch_history(settings, start.to_pydatetime(),
                        (start + pd.Timedelta(seconds=STEP * (POINTS - 1))).to_pydatetime())
    seconds = (got["ds"] - start).dt.total_seconds().to_numpy().astype(np.int64)
    steps, ys = seconds // STEP, got["y"].to_numpy()
    kept = (steps < 60) | (steps >= 90)
    assert (steps[kept] == [i for i in range(POINTS) if not 60 <= i < 90]).all()
    assert (ys[kept] == steps[kept] * 1.5).all()
    echoed = steps[~kept]  # the last sample seen again while it is within the lookback
    assert 4 <= len(echoed) <= 5 and (echoed == np.arange(60, 60 + len(echoed))).all()
    assert (ys[~kept] == 59 * 1.5).all()
    assert str(got["unique_id"].dtype) == "string" and set(got["unique_id"]) == {"s/replicas"}
