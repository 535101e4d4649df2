"""Retention (``store.retention_days``): one daemon pass drops the bulk of the specs of units
that ended 100 days ago, on SQLite and on a real PostgreSQL, and ``idlegpu report`` for those
months prints the same figures before and after; recent and live units keep everything."""

from __future__ import annotations

import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np
import pytest
from test_controller import MemoryCluster, Signals
from typer.testing import CliRunner

from idlegpu.scheduler.adapters.store import JobStore
from idlegpu.scheduler.controller import Controller
from idlegpu.scheduler.daemon import Daemon
from idlegpu.scheduler.specs import expand_units, validate_request
from idlegpu.scheduler.types import FreeProfile, JobState, PolicySettings

REPO = Path(__file__).resolve().parents[1]
NOW = datetime(2026, 5, 20, 3, 0, tzinfo=UTC)
OLD = NOW - timedelta(days=100)  # 2026-02-09
BLOB = "w" * 4000


def _request(name: str) -> dict:
    return {"name": name, "team": "nlp", "kind": "sft",
            "image": "registry.example.com/research/train:1.0", "gpus": 4,
            "runtime_estimate": "2h", "command": ["python", "train.py"],
            "args": ["--blob", "{blob}", "--seed", "{seed}"], "env": {"WANDB_MODE": "offline"},
            "parameters": {"blob": BLOB}, "sweep": {"seed": [1, 2, 3]}}


def _submit(store: JobStore, name: str, at: datetime) -> list[str]:
    req = validate_request(_request(name))
    store.submit(req.name, req.team, req.kind, _request(name), expand_units(req), at)
    return [u.id for u in store.queue() if u.request_name == name]


def _run(store: JobStore, unit: str, start: datetime, hours: float) -> None:
    store.admit(unit, start)
    store.started(unit, start)
    store.finished(unit, start + timedelta(hours=hours))


def _report(store_url: str, month: str, out: Path) -> str:
    from idlegpu.scheduler.cli import app

    result = CliRunner().invoke(app, ["report", "--store", store_url, "--month", month,
                                      "--months", "2", "--out", str(out),
                                      "--config", str(REPO / "idlegpu.yaml")])
    assert result.exit_code == 0, result.output
    return (out / f"report-{month}.md").read_text() + (out / "summary.csv").read_text()


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_one_pass_drops_old_specs_and_the_reports_stay_the_same(
        backend, tmp_path, request) -> None:
    url = (f"sqlite:///{tmp_path / 'jobs.db'}" if backend == "sqlite"
           else request.getfixturevalue("fresh_postgres_url"))
    store = JobStore(url)
    old = _submit(store, "old-sweep", OLD - timedelta(days=1))
    for i, unit in enumerate(old[:2]):  # two ran in February, one was cancelled
        _run(store, unit, OLD + timedelta(hours=i * 3), 2.5)
    store.cancel(old[2], OLD)
    recent = _submit(store, "recent-sweep", NOW - timedelta(days=10))
    _run(store, recent[0], NOW - timedelta(days=9), 1.0)  # ended 9 days ago: kept
    before = {month: _report(url, month, tmp_path / "before" / month)
              for month in ("2026-02", "2026-05")}
    # 2 units x 2.5 h x 4 GPUs = 20 useful GPU-hours in February, 4 (1 h) in May
    assert "\n2026-02,28,20.000000,0.000000,0,0,2,2," in before["2026-02"]
    assert "\n2026-05,31,4.000000," in before["2026-05"]

    controller = Controller(store, MemoryCluster(), Signals(),
                            lambda now: FreeProfile(now, 300, np.zeros(288), 0.9, now),
                            lambda spec: spec.runtime_estimate_s, PolicySettings())
    daemon = Daemon(controller, clock=lambda: NOW, retention_days=90)
    assert daemon.reconcile() is not None  # one pass

    for unit in old:
        spec = store.unit(unit).spec
        assert spec.args == () and spec.env == () and spec.parameters == ()
        assert spec.command == () and spec.image.endswith("train:1.0") and spec.gpus == 4
    old_request = store.request(store.unit(old[0]).request_id)
    assert BLOB not in str(old_request.raw) and old_request.raw["name"] == "old-sweep"
    for unit in recent:  # ended 9 days ago, or still queued: untouched
        assert BLOB in " ".join(store.unit(unit).spec.args)
    assert store.unit(recent[1]).state is JobState.QUEUED
    after = {month: _report(url, month, tmp_path / "after" / month) for month in before}
    assert after == before
    # the next pass within the hour does nothing; a second sweep finds nothing left
    assert daemon.retain(NOW + timedelta(minutes=5)) == 0
    assert store.drop_ended_specs(NOW - timedelta(days=90), NOW) == 0
    store.close()
