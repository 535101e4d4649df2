"""Secrets stay secret: a Prometheus URL's password and the bearer token never appear in what
idlegpu prints or logs (the `idlegpu fetch` and `idlegpu run` commands as subprocesses, the
daemon's log lines, config errors), and `verify_tls: false` gives one warning of ours per
process instead of urllib3's one per request (a REAL Prometheus serving TLS)."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import requests
import yaml
from prom_server import backfill, free_port, stop_process
from test_controller import T0, setup  # noqa: F401  (the controller fixture)
from urllib3.exceptions import InsecureRequestWarning

from idlegpu.forecast import redact as redact_module
from idlegpu.forecast.errors import ConfigError
from idlegpu.forecast.redact import redact
from idlegpu.forecast.sources.prometheus import fetch_history
from idlegpu.scheduler.adapters.vllm import PrometheusSignals
from idlegpu.scheduler.config import load_config

REPO = Path(__file__).resolve().parents[1]
IDLEGPU = Path(sys.executable).with_name("idlegpu")
PASSWORD = "s3cret"
TOKEN = "tok-9f8e7d6c5b4a3"
NUMERIC_TOKEN = 987654321


def _config(tmp_path: Path, url: str, **prometheus: object) -> Path:
    """The example idlegpu.yaml pointed at ``url``, with a token, a store and a daemon of
    1-second passes and no metrics port."""
    data = yaml.safe_load((REPO / "idlegpu.yaml").read_text())
    data["prometheus"] = {"url": url, "retries": 0, "timeout_seconds": 2,
                          "bearer_token": TOKEN, **prometheus}
    data["store"] = {"url": f"sqlite:///{tmp_path / 'jobs.db'}"}
    data["daemon"] = {**data.get("daemon", {}), "reconcile_seconds": 1, "backstop_seconds": 1,
                      "metrics_port": 0, "reports_dir": str(tmp_path / "reports")}
    path = tmp_path / "idlegpu.yaml"
    path.write_text(yaml.safe_dump(data), encoding="utf-8")
    return path


def _secret_url() -> tuple[str, str]:
    """A URL with a password where nothing listens, and how messages must show it."""
    port = free_port()
    return f"http://admin:{PASSWORD}@127.0.0.1:{port}/", f"http://***@127.0.0.1:{port}"


def _leaks(text: str) -> list[str]:
    return [s for s in (PASSWORD, TOKEN, str(NUMERIC_TOKEN)) if s in text]


# --------------------------------------------------------------------------- redact


@pytest.mark.parametrize(("text", "want"), [
    ("Prometheus at http://admin:s3cret@10.0.0.1:9090/ is down",
     "Prometheus at http://***@10.0.0.1:9090/ is down"),
    ("https://ghp_s3cretTOKEN@github.com/x", "https://***@github.com/x"),
    ("http://u:p@ss:w0rd@host/x", "http://***@host/x"),  # an '@' inside the password
    ("postgresql+psycopg://idle:s3cret@db:5432/jobs", "postgresql+psycopg://***@db:5432/jobs"),
    ("{'Authorization': 'Bearer s3cretTOKEN1'}", "{'Authorization': '***'}"),
    ("sent Bearer s3cretTOKEN1 to it", "sent Bearer *** to it"),
    ("/api/v1/query?query=up&token=s3cret&x=1", "/api/v1/query?query=up&token=***&x=1"),
    ("password=s3cret; api_key=s3cret", "password=***; api_key=***"),
    ('{"access_token": "s3cret"}', '{"access_token": "***"}'),
    ("bearer_token='s3cret'", "bearer_token='***'"),
])
def test_redact_masks_credentials(text, want):
    assert redact(text) == want
    assert redact(want) == want  # applying it twice changes nothing


@pytest.mark.parametrize("text", [
    ("Prometheus at http://localhost:9090 is unreachable (connection refused); check "
     "prometheus.url or IDLEGPU_PROMETHEUS__URL"),
    "prometheus.bearer_token: Input should be a valid string",
    "set prometheus.bearer_token or IDLEGPU_PROMETHEUS__BEARER_TOKEN",
    "run `idlegpu token create --team nlp`; args: [--max_tokens=2048]",
    "user@example.com asked for 8 GPUs",
])
def test_redact_keeps_ordinary_messages(text):
    assert redact(text) == text


# --------------------------------------------------------------------------- the commands


def _run(args: list[str], timeout: float = 90) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(IDLEGPU), *args], capture_output=True, text=True,
                          timeout=timeout, check=False, env={**os.environ, "COLUMNS": "300"})


def test_fetch_never_prints_the_password_or_the_token(tmp_path):
    url, shown = _secret_url()
    config = _config(tmp_path, url)
    proc = _run(["fetch", "-c", str(config), "--start", "2025-03-01T00:00:00Z",
                 "--end", "2025-03-02T00:00:00Z", "--out", str(tmp_path / "h.parquet")])
    assert proc.returncode == 2, proc.stderr
    assert _leaks(proc.stdout + proc.stderr) == []
    assert f"error: Prometheus at {shown} is unreachable (connection refused)" in proc.stderr


def test_the_daemon_and_a_pass_never_log_the_password_or_the_token(tmp_path):
    """`idlegpu run --once` (a pass: forecast refresh, live signals) and the daemon itself,
    each reading from an unreachable Prometheus whose URL holds a password: every line that
    names the server shows it without."""
    url, shown = _secret_url()
    config = _config(tmp_path, url)
    once = _run(["run", "--once", "--dry-run", "-c", str(config)])
    assert _leaks(once.stdout + once.stderr) == []
    assert shown in once.stdout + once.stderr  # the problem is said, without the password

    daemon = subprocess.Popen(
        [str(IDLEGPU), "run", "--dry-run", "-c", str(config)], stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env={**os.environ, "COLUMNS": "300"})
    lines: list[str] = []
    try:
        deadline = time.monotonic() + 60
        assert daemon.stdout is not None
        while time.monotonic() < deadline:
            line = daemon.stdout.readline()
            if not line:
                break
            lines.append(line)
            # a pass that met the outage (after the refresh that failed)
            if any("pass:" in entry and "signals" in entry for entry in lines):
                break
        daemon.send_signal(signal.SIGTERM)
        rest, _ = daemon.communicate(timeout=30)
        lines.append(rest)
    finally:
        stop_process(daemon)
    log = "".join(lines)
    assert "forecast refresh failed" in log, log
    assert sum(shown in line for line in log.splitlines()) >= 2, log  # refresh, pass
    assert _leaks(log) == [], log


def test_a_daemon_pass_with_log_capture(setup, tmp_path, caplog):  # noqa: F811
    """In process: the Daemon's refresh and passes over PrometheusSignals and fetch_history
    log the outage; captured, no record holds the password or the token."""
    from idlegpu.scheduler.daemon import Daemon

    url, shown = _secret_url()
    settings = load_config(_config(tmp_path, url))
    _, _, _, controller, _ = setup
    controller.signals = PrometheusSignals(settings)
    daemon = Daemon(controller, refresh_forecast=lambda now: fetch_history(
        settings, now - pd.Timedelta(hours=1), now), clock=lambda: T0)
    with caplog.at_level(logging.INFO):
        daemon.refresh()
        daemon.reconcile()
        daemon.backstop()
    text = "\n".join(r.getMessage() for r in caplog.records)
    assert "forecast refresh failed" in text and "signals missing" in text, text
    assert shown in text, text
    assert _leaks(text) == [], text


# --------------------------------------------------------------------------- config errors


def test_a_numeric_token_is_named_never_echoed(tmp_path, cli):
    config = _config(tmp_path, "http://localhost:9090")
    data = yaml.safe_load(config.read_text())
    data["prometheus"]["bearer_token"] = NUMERIC_TOKEN
    config.write_text(yaml.safe_dump(data))
    code, out, err = cli(["fetch", "-c", str(config), "--start", "2025-03-01T00:00:00Z",
                          "--end", "2025-03-02T00:00:00Z", "--out", str(tmp_path / "h.parquet")])
    assert code == 2
    assert "prometheus.bearer_token: Input should be a valid string" in err
    assert _leaks(out + err) == []


def test_config_errors_never_show_a_urls_password(tmp_path, monkeypatch):
    base = yaml.safe_load(_config(tmp_path, "http://localhost:9090").read_text())
    # a string where the section belongs: pydantic echoes the value it refused
    with pytest.raises(ConfigError) as info:
        load_config(data={**base, "prometheus": f"http://admin:{PASSWORD}@prom:9090"})
    assert "http://***@prom:9090" in str(info.value) and _leaks(str(info.value)) == []
    # from the environment too
    monkeypatch.setenv("IDLEGPU_PROMETHEUS__BEARER_TOKEN", TOKEN)
    with pytest.raises(ConfigError) as info:
        load_config(data={**base, "prometheus": {"bearer_token": ["a", TOKEN], "workers": 0}})
    assert "prometheus.workers" in str(info.value) and _leaks(str(info.value)) == []


# --------------------------------------------------------------------------- verify_tls: false


@pytest.fixture(scope="module")
def tls_prometheus(prometheus_binaries, tmp_path_factory):
    """A REAL Prometheus serving HTTPS with a self-signed certificate (its web config), on a
    backfilled 2-day history; yields its https URL with a password in it."""
    prometheus, _ = prometheus_binaries
    work = tmp_path_factory.mktemp("tls")
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
                    "-keyout", str(work / "key.pem"), "-out", str(work / "cert.pem"),
                    "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1"],
                   check=True, capture_output=True)
    (work / "web.yml").write_text(
        f"tls_server_config:\n  cert_file: {work / 'cert.pem'}\n  key_file: {work / 'key.pem'}\n")
    (work / "prometheus.yml").write_text("global:\n  scrape_interval: 1h\nscrape_configs: []\n")
    ds = pd.date_range("2025-03-01", periods=2 * 288, freq="5min", tz="UTC")
    history = pd.DataFrame({"unique_id": "chat/replicas", "ds": ds,
                            "y": np.arange(len(ds), dtype=float) % 7})
    backfill(history, work / "data", workdir=work)
    port = free_port()
    log = open(work / "prometheus.log", "wb")  # noqa: SIM115 - closed below
    proc = subprocess.Popen(
        [prometheus, f"--config.file={work / 'prometheus.yml'}",
         f"--storage.tsdb.path={work / 'data'}", "--storage.tsdb.retention.time=4000d",
         f"--web.listen-address=127.0.0.1:{port}", f"--web.config.file={work / 'web.yml'}",
         "--log.level=warn"],
        stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, cwd=work)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                if requests.get(f"https://127.0.0.1:{port}/-/ready", verify=str(work / "cert.pem"),
                                timeout=1).status_code == 200:
                    break
            except requests.exceptions.RequestException:
                pass
            assert proc.poll() is None and time.monotonic() < deadline, (
                (work / "prometheus.log").read_text())
            time.sleep(0.1)
        yield f"https://admin:{PASSWORD}@127.0.0.1:{port}", history
    finally:
        stop_process(proc)
        log.close()


def test_unverified_tls_is_one_warning_of_ours_over_many_requests(
    tls_prometheus, tmp_path, caplog, monkeypatch
):
    url, history = tls_prometheus
    monkeypatch.setattr(redact_module, "_warned", set())  # as in a fresh process
    data = yaml.safe_load(_config(tmp_path, url, verify_tls=False, max_points_per_query=50,
                                  workers=3).read_text())
    data["services"] = [{"name": "chat", "gpus_per_replica": 1, "min_replicas": 0,
                         "max_replicas": 8}]
    settings = load_config(data=data)
    start, end = history["ds"].min().to_pydatetime(), history["ds"].max().to_pydatetime()
    # no simplefilter here: the process's own filters (urllib3's "always", ours) decide
    with warnings.catch_warnings(record=True) as caught, caplog.at_level(logging.WARNING):
        got = [fetch_history(settings, start, end) for _ in range(2)]  # 2 x 12 queries
        signals = PrometheusSignals(settings)
        for _ in range(3):
            signals.read(end)
        signals.close()
        # another host's unverified requests still warn: the silence is for our server only
        requests.get(url.replace("127.0.0.1", "localhost") + "/-/ready", verify=False,
                     timeout=5)
    assert len(got[0]) == len(history)
    assert (got[0]["y"].to_numpy() == history["y"].to_numpy()).all()
    insecure = [w for w in caught if issubclass(w.category, InsecureRequestWarning)]
    assert len(insecure) == 1 and "'localhost'" in str(insecure[0].message)
    ours = [r for r in caplog.records if r.name == "idlegpu.tls"]
    assert len(ours) == 1, [r.getMessage() for r in ours]
    message = ours[0].getMessage()
    assert "https://***@127.0.0.1:" in message and "verify_tls: false" in message
    assert _leaks(message) == []
