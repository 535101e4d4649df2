"""A real Prometheus server for tests and benchmarks, backfilled from a tidy history.

    with PromServer.from_history(history, workdir) as prom:
        ... prom.url ...

The history is written as OpenMetrics (``idlegpu.forecast.sources.openmetrics``), loaded with
``promtool tsdb create-blocks-from openmetrics`` into a fresh data directory, and served by
``prometheus`` on a free loopback port with no scrape targets. Needs Debian's ``prometheus``
package (``apt-get install prometheus``), which brings both binaries.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Self

import pandas as pd

from idlegpu.forecast.sources.openmetrics import write_openmetrics

INSTALL_HINT = (
    "install Debian's Prometheus: apt-get update && DEBIAN_FRONTEND=noninteractive "
    "apt-get install -y --no-install-recommends prometheus"
)

# promtool rounds --max-block-duration down to one of 2h, 6h, 18h, 54h, 162h, 486h, ... and
# re-reads the whole file once per block. Measured here on 45 days x 12 series at 5 min
# (155,520 samples): 24h (18h blocks, 61 of them) 6.3 s; 486h (3 blocks) 0.5 s. 486h (about
# 20 days) is the largest size below Prometheus's own 31-day block limit.
DEFAULT_MAX_BLOCK_DURATION = "486h"

_CONFIG = """\
global:
  scrape_interval: 1h
  evaluation_interval: 1h
scrape_configs: []
"""


class PrometheusMissingError(RuntimeError):
    """``prometheus`` or ``promtool`` is not installed."""


def find_binaries() -> tuple[str, str]:
    """Paths of ``prometheus`` and ``promtool``; raise ``PrometheusMissingError`` if absent."""
    found = []
    for name in ("prometheus", "promtool"):
        path = shutil.which(name)
        if path is None and os.access(f"/usr/bin/{name}", os.X_OK):
            path = f"/usr/bin/{name}"
        if path is None:
            raise PrometheusMissingError(f"`{name}` not found on PATH; {INSTALL_HINT}")
        found.append(path)
    return found[0], found[1]


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def backfill(
    history: pd.DataFrame,
    data_dir: Path,
    *,
    workdir: Path | None = None,
    max_block_duration: str = DEFAULT_MAX_BLOCK_DURATION,
) -> Path:
    """Write ``history`` as OpenMetrics and turn it into TSDB blocks in ``data_dir`` (fresh)."""
    _, promtool = find_binaries()
    data_dir = Path(data_dir)
    if data_dir.exists() and any(data_dir.iterdir()):
        raise ValueError(f"{data_dir} is not empty; backfill into a fresh directory")
    data_dir.mkdir(parents=True, exist_ok=True)
    workdir = Path(workdir) if workdir is not None else data_dir.parent
    om = write_openmetrics(history, None, workdir / "history.om")
    proc = subprocess.run(
        [
            promtool, "tsdb", "create-blocks-from", "openmetrics",
            f"--max-block-duration={max_block_duration}", str(om), str(data_dir),
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode != 0:
        raise RuntimeError(
            f"promtool failed (exit {proc.returncode}):\n"
            f"{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}"
        )
    om.unlink()
    return data_dir


class PromServer:
    """A running ``prometheus`` process serving ``data_dir`` on 127.0.0.1."""

    def __init__(self, data_dir: Path, workdir: Path, *, ready_timeout: float = 30.0) -> None:
        self.data_dir = Path(data_dir)
        self.workdir = Path(workdir)
        self.ready_timeout = ready_timeout
        self.port: int | None = None
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path = self.workdir / "prometheus.log"

    @property
    def url(self) -> str:
        if self.port is None:
            raise RuntimeError("the server is not started")
        return f"http://127.0.0.1:{self.port}"

    @classmethod
    def from_history(
        cls,
        history: pd.DataFrame,
        workdir: Path,
        *,
        max_block_duration: str = DEFAULT_MAX_BLOCK_DURATION,
    ) -> PromServer:
        """Backfill ``history`` into ``workdir/data`` and start a server on it."""
        workdir = Path(workdir)
        workdir.mkdir(parents=True, exist_ok=True)
        data_dir = backfill(
            history, workdir / "data", workdir=workdir, max_block_duration=max_block_duration
        )
        server = cls(data_dir, workdir)
        server.start()
        return server

    def start(self) -> None:
        prometheus, _ = find_binaries()
        config = self.workdir / "prometheus.yml"
        config.write_text(_CONFIG, encoding="utf-8")
        last_error = ""
        for _attempt in range(3):  # a free port may be taken between probing and binding
            self.port = free_port()
            log = open(self.log_path, "wb")  # noqa: SIM115 - closed in stop()
            self._log = log
            self.proc = subprocess.Popen(
                [
                    prometheus,
                    f"--config.file={config}",
                    f"--storage.tsdb.path={self.data_dir}",
                    "--storage.tsdb.retention.time=4000d",
                    f"--web.listen-address=127.0.0.1:{self.port}",
                    "--log.level=warn",
                ],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=self.workdir,
            )
            if self._wait_ready():
                return
            last_error = self.log_path.read_text(errors="replace")[-3000:]
            self.stop()
        raise RuntimeError(f"prometheus did not become ready; its log:\n{last_error}")

    def _wait_ready(self) -> bool:
        assert self.proc is not None
        deadline = time.monotonic() + self.ready_timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                return False
            try:
                with urllib.request.urlopen(f"{self.url}/-/ready", timeout=1) as resp:
                    if resp.status == 200:
                        return True
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            time.sleep(0.05)
        return False

    def stop(self) -> None:
        """Terminate, wait, kill if it will not go."""
        proc, self.proc = self.proc, None
        if proc is not None:
            stop_process(proc)
        log = getattr(self, "_log", None)
        if log is not None:
            log.close()
            self._log = None

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def stop_process(proc: subprocess.Popen, timeout: float = 10) -> None:
    """Terminate a child process, and kill it if it will not go."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=timeout)


def serve_openmetrics(text: str, workdir: Path) -> PromServer:
    """Backfill hand-written OpenMetrics ``text`` (ending in ``# EOF``) into ``workdir/data`` and
    start a server on it; the caller stops it."""
    _, promtool = find_binaries()
    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    om = workdir / "history.om"
    om.write_text(text, encoding="utf-8")
    data_dir = workdir / "data"
    proc = subprocess.run(
        [promtool, "tsdb", "create-blocks-from", "openmetrics",
         f"--max-block-duration={DEFAULT_MAX_BLOCK_DURATION}", str(om), str(data_dir)],
        capture_output=True, text=True, check=False,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"promtool failed (exit {proc.returncode}):\n{proc.stdout[-2000:]}\n"
                           f"{proc.stderr[-2000:]}")
    server = PromServer(data_dir, workdir)
    server.start()
    return server


def start_scraping(targets: list[str], workdir: Path, *, interval: str = "1s") -> PromServer:
    """A server with an empty TSDB scraping ``targets`` (``host:port``, path ``/metrics``) every
    ``interval``: started with no targets, then its config is rewritten and reloaded (SIGHUP).
    The caller stops it."""
    import signal

    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    server = PromServer(workdir / "data", workdir)
    server.start()
    config = (
        f"global:\n  scrape_interval: {interval}\n  scrape_timeout: {interval}\n"
        f"  evaluation_interval: {interval}\n"
        "scrape_configs:\n  - job_name: vllm\n    static_configs:\n      - targets: ["
        + ", ".join(f'"{t}"' for t in targets) + "]\n"
    )
    (workdir / "prometheus.yml").write_text(config, encoding="utf-8")
    assert server.proc is not None
    server.proc.send_signal(signal.SIGHUP)
    return server
