"""A REAL uvicorn server for the job API on a free loopback port, in a thread of the test
process (``ApiServer(app).start()`` ... ``.stop()``), and the helpers its tests share."""

from __future__ import annotations

import socket
import threading
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import requests
import uvicorn

T0 = datetime(2026, 3, 2, 12, 0, tzinfo=UTC)
IMAGE = "registry.example.com/research/trl-sft:2.1.0"


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_healthy(url: str, process: Any, timeout: float = 60) -> None:
    """Wait until the ``idlegpu serve`` subprocess ``process`` at ``url`` answers /healthz."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            if requests.get(f"{url}/healthz", timeout=2).status_code == 200:
                return
        except requests.ConnectionError:
            pass
        assert process.poll() is None and time.monotonic() < deadline, "serve did not start"
        time.sleep(0.2)


class MovableClock:
    """The server's clock in tests: ``now()``, moved by hand with ``advance``."""

    def __init__(self, start: datetime = T0) -> None:
        self.at = start
        self.speed = 1.0

    def now(self) -> datetime:
        return self.at

    def __call__(self) -> datetime:
        return self.at

    def advance(self, **delta: float) -> None:
        self.at += timedelta(**delta)


class ApiServer:
    """uvicorn serving ``app`` on 127.0.0.1:<free port> (``.url``) until ``stop()``."""

    def __init__(self, app: Any) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        config = uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning",
                                proxy_headers=False, lifespan="off", access_log=False)
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, name="uvicorn", daemon=True)

    def start(self, timeout: float = 15.0) -> ApiServer:
        self.thread.start()
        deadline = time.monotonic() + timeout
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"uvicorn did not start on port {self.port}")
            time.sleep(0.02)
        return self

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=15)
        assert not self.thread.is_alive(), "uvicorn did not stop"


def api_settings(**api: Any):
    """A one-service pool config with the given ``api:`` section."""
    from idlegpu.scheduler.config import load_config

    return load_config(data={
        "pool": {"name": "test-pool", "total_gpus": 40, "timezone": "UTC"},
        "query_templates": {"replicas": 'kube_deployment_status_replicas{deployment="$service"}'},
        "services": [{"name": "chat", "gpus_per_replica": 4, "min_replicas": 0,
                      "max_replicas": 10}],
        "admission": {"allowed_registries": ["registry.example.com/"]},
        "api": api,
    })


def job(name: str = "sft-a", team: str = "alignment", **fields: Any) -> dict[str, Any]:
    """A valid request body: two steps, the second a 3-member sweep (4 units)."""
    body: dict[str, Any] = {
        "name": name, "team": team, "kind": "sft", "image": IMAGE, "gpus": 4,
        "runtime_estimate": "2h",
        "steps": [{"name": "train", "args": ["--lr", "{lr}"]},
                  {"name": "eval", "kind": "eval", "gpus": 1,
                   "sweep": {"task": ["gsm8k", "mmlu", "humaneval"]},
                   "args": ["--task", "{task}"]}],
        "parameters": {"lr": "2e-5"},
    }
    body.update(fields)
    return body


class Client:
    """``requests`` against the server with one bearer token (or none)."""

    def __init__(self, url: str, token: str | None = None,
                 headers: dict[str, str] | None = None) -> None:
        self.url = url
        self.session = requests.Session()
        if token is not None:
            self.session.headers["Authorization"] = f"Bearer {token}"
        self.session.headers.update(headers or {})

    def get(self, path: str, **kw: Any) -> requests.Response:
        return self.session.get(self.url + path, timeout=30, **kw)

    def post(self, path: str, **kw: Any) -> requests.Response:
        return self.session.post(self.url + path, timeout=30, **kw)

    def close(self) -> None:
        self.session.close()
