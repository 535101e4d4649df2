"""The daemon killed (SIGKILL) at the worst moments, then restarted: no duplicate Job, no lost
queue entry.

The real ``idlegpu run`` runs as a subprocess, replaying the sample evening at 60x against the
fake API server through a kubeconfig (the official client over HTTP), with a SQLite store. The
fake API server kills the daemon from inside its first Job creation request:

* ``served``: the Job is created, the daemon dies before it hears so (it recorded the admission
  just before, as it always does);
* ``lost``: the daemon dies with the request in flight; the Job never exists.

After a restart, every unit gets exactly one Job, and the daemon still stops on SIGTERM.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from fake_kube import FakeKube

from idlegpu.scheduler.adapters.kubernetes import job_name
from idlegpu.scheduler.adapters.store import JobStore
from idlegpu.scheduler.daemon import wait_until
from idlegpu.scheduler.types import JobState

REPO = Path(__file__).resolve().parents[1]
NS = "idlegpu-jobs"
EVENING = "2026-01-28T20:00:00+09:00"
REQUEST = """\
name: crash-sweep
team: research
kind: datagen
image: registry.example.com/research/datagen:1.0
command: [python, gen.py]
args: ["--shard", "{shard}"]
sweep: {shard: [0, 1, 2]}
gpus: 4
runtime_estimate: 2h
output: s3://runs/{name}/{shard}
"""


def start_daemon(tmp_path: Path, kubeconfig: Path, store: str, log_name: str):
    env = {
        **os.environ,
        "IDLEGPU_CLUSTER__KUBECONFIG": str(kubeconfig),
        "IDLEGPU_CLUSTER__NAMESPACE": NS,
        "IDLEGPU_DAEMON__RECONCILE_SECONDS": "1",
        "IDLEGPU_DAEMON__BACKSTOP_SECONDS": "1",
        "IDLEGPU_DAEMON__METRICS_PORT": "0",
    }
    log = (tmp_path / log_name).open("w")
    return subprocess.Popen(
        [sys.executable, "-m", "idlegpu.scheduler.cli", "run",
         "--config", str(REPO / "idlegpu.yaml"),
         "--history", str(REPO / "data/sample/history.parquet"), "--now", EVENING,
         "--speed", "60", "--store", store, "--runs", str(REPO / "data/sample/runs.csv")],
        cwd=tmp_path, env=env, stdout=log, stderr=subprocess.STDOUT,
    )


def created_names(kube: FakeKube) -> list[str]:
    return [r.body["metadata"]["name"] for r in kube.requests
            if r.method == "POST" and isinstance(r.body, dict)]


@pytest.mark.slow  # long (over 15 s): scripts/test.sh and CI run it, a plain pytest does not
@pytest.mark.parametrize("moment", ["served", "lost"])
def test_sigkill_mid_creation_then_restart(tmp_path, cli, moment):
    """fake API server: the daemon SIGKILLed from inside its own Job-creation request, at that
    exact point (the Job made and the answer not yet sent, or the request never served); a
    real server cannot run code of the test in the middle of a request."""
    store_url = f"sqlite:///{tmp_path / 'jobs.db'}"
    (tmp_path / "sweep.yaml").write_text(REQUEST)
    code, _, err = cli(["submit", str(tmp_path / "sweep.yaml"), "--store", store_url,
                        "--now", "2026-01-28T19:00:00+09:00"])
    assert code == 0, err
    with FakeKube() as kube:
        kubeconfig = kube.write_kubeconfig(tmp_path / "kubeconfig", NS)
        victim: dict[str, int] = {}
        kube.on_next("POST", lambda request: os.kill(victim["pid"], signal.SIGKILL),
                     served=moment == "served")
        first = start_daemon(tmp_path, kubeconfig, store_url, "first.log")
        victim["pid"] = first.pid
        try:
            assert first.wait(timeout=120) == -signal.SIGKILL, (tmp_path / "first.log").read_text()
        finally:
            if first.poll() is None:
                first.kill()

        # the moment of the crash: the admission is recorded, the Job exists or not
        store = JobStore(store_url)
        try:
            units = store.queue()
            assert len(units) == 3  # nothing lost
            admitted = [u for u in units if u.state is JobState.ADMITTED]
            assert len(admitted) == 1 and admitted[0].attempts == 1
            crashed = job_name(admitted[0].id, 1)
            assert created_names(kube) == [crashed]
            assert [name for _, name in kube.jobs] == ([crashed] if moment == "served" else [])

            second = start_daemon(tmp_path, kubeconfig, store_url, "second.log")
            try:
                assert wait_until(lambda: len(kube.jobs) == 3, timeout=120), (
                    tmp_path / "second.log").read_text()
                for _, name in list(kube.jobs):
                    kube.set_status(name, {"active": 1, "ready": 1,
                                           "startTime": "2026-01-28T11:00:30Z"})
                assert wait_until(lambda: all(u.state is JobState.RUNNING
                                              for u in store.queue()), timeout=60)
                second.send_signal(signal.SIGHUP)  # a forecast refresh on demand
                assert wait_until(lambda: (tmp_path / "second.log").read_text().count(
                    "forecast refreshed at") == 2, timeout=60)
                second.send_signal(signal.SIGTERM)
                assert second.wait(timeout=60) == 0  # graceful stop
            finally:
                if second.poll() is None:
                    second.kill()

            units = store.queue()
            assert len(units) == 3 and all(u.attempts == 1 for u in units)
            want = sorted(job_name(u.id, 1) for u in units)
            assert sorted(name for _, name in kube.jobs) == want  # one Job per unit
            names = created_names(kube)
            # the crashed unit's Job: adopted as it was, or created once after the lost request
            assert names.count(crashed) == (1 if moment == "served" else 2)
            assert sorted(set(names)) == want
            log = (tmp_path / "second.log").read_text()
            assert "replaying from 2026-01-28 20:00 at 60x" in log
            assert f"recreated {crashed}" in log if moment == "lost" else "recreated" not in log
            assert "admit" in log and "created" in log and "started" in log
        finally:
            store.close()
