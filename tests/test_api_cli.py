"""``idlegpu serve`` and ``idlegpu token`` as commands: the one-machine recipe of the README
(a SQLite store, a token from the CLI, a YAML request with curl's headers, the daemon's dry-run
pass admitting it), with ``idlegpu serve`` as a real subprocess stopped by SIGTERM."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import requests
from api_server import free_port, wait_healthy

REPO = Path(__file__).resolve().parents[1]
IDLEGPU = [sys.executable, "-c", "from idlegpu.scheduler.cli import main; main()"]


def test_serve_token_and_run_on_one_machine(tmp_path):
    store = f"sqlite:///{tmp_path / 'demo.db'}"
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("IDLEGPU_")},
           "PYTHONUNBUFFERED": "1"}
    made = subprocess.run([*IDLEGPU, "token", "create", "--team", "foundation", "--name", "me",
                           "--store", store], capture_output=True, text=True, env=env,
                          cwd=REPO, check=True)
    token = made.stdout.strip()
    assert token.startswith("igt_") and "shown once" in made.stderr
    port = free_port()
    server = subprocess.Popen(
        [*IDLEGPU, "serve", "--config", "idlegpu.yaml", "--store", store, "--port", str(port),
         "--now", "2026-01-28T17:00:00+09:00"],
        cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url, server)
        response = requests.post(
            f"{url}/v1/requests", data=(REPO / "examples/jobs/pretrain.yaml").read_bytes(),
            headers={"Authorization": f"Bearer {token}", "Content-Type": "application/yaml"},
            timeout=30)
        assert response.status_code == 201, response.text
        submitted = response.json()["submitted_at"]  # --now's clock, in the pool's zone as
        assert submitted.startswith("2026-01-28T17:00") and submitted.endswith("+09:00")  # plans
        (unit,) = response.json()["unit_ids"]
    finally:
        server.send_signal(signal.SIGTERM)
        out, _ = server.communicate(timeout=30)
    # a graceful stop: uvicorn finishes, then re-raises the SIGTERM it caught
    assert server.returncode in (0, -signal.SIGTERM), out
    assert "Application shutdown complete" in out and "Traceback" not in out
    assert "idlegpu.audit" in out and '"action": "submit"' in out  # the audit line in its log

    passed = subprocess.run(
        [*IDLEGPU, "run", "--once", "--dry-run", "--store", store, "--now",
         "2026-01-28T20:00:00+09:00", "--history", "data/sample/history.parquet"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=600, check=False)
    assert passed.returncode == 0, passed.stderr
    assert "1 Job(s) would be created" in passed.stderr
    assert f"idlegpu.io/unit: {unit}" in passed.stdout or unit in passed.stdout
