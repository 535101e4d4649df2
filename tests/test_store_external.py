"""The store's units outside the store (schema version 8): Kueue Workloads and users' Jobs as
the daemon's passes saw them, and the GPU time they held, on SQLite and on a REAL PostgreSQL."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest

from idlegpu.scheduler.adapters.store import JobStore
from idlegpu.scheduler.types import ExternalUnit

T0 = datetime(2026, 1, 28, 11, 0, tzinfo=UTC)
H = timedelta(hours=1)


@pytest.fixture(params=["sqlite", "postgresql"])
def store(request, tmp_path):
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'jobs.db'}"
    else:
        url = request.getfixturevalue("fresh_postgres_url")
    with JobStore(url) as s:
        yield s


def _unit(name: str, state: str, *, origin: str = "kueue", gpus: int = 4,
          since: datetime | None = None, reason: str = "") -> ExternalUnit:
    return ExternalUnit(id=f"{origin}/research/{name}", origin=origin, namespace="research",
                        name=name, team="nlp", gpus=gpus, state=state, reason=reason,
                        since=since)


def test_passes_are_recorded_where_they_changed_and_gpu_time_is_counted(store):
    waiting = _unit("eval", "waiting", reason="waits: needs 4 GPUs for 2.0 h")
    job = _unit("train", "waiting", origin="job", gpus=8)
    assert store.record_external([waiting, job], T0, ["kueue", "job"]) == 2
    assert store.record_external([waiting, job], T0 + timedelta(minutes=1),
                                 ["kueue", "job"]) == 0  # nothing moved: nothing written
    # eval admitted at T0 + 1 h; train admitted at T0 + 2 h
    running = replace(waiting, state="running", reason="", since=T0 + H)
    store.record_external([running, job], T0 + H, ["kueue", "job"])
    store.record_external([running, replace(job, state="running", since=T0 + 2 * H)],
                          T0 + 2 * H, ["kueue", "job"])
    # Kueue unreadable this pass: its rows and holds stay as they were
    store.record_external([replace(job, state="running", since=T0 + 2 * H)], T0 + 3 * H,
                          ["job"])
    assert {u.id: u.state for u in store.external_units()} == {
        "kueue/research/eval": "running", "job/research/train": "running"}
    # eval ends at T0 + 4 h (gone from Kueue's list), train is stopped at T0 + 5 h
    store.record_external([replace(job, state="running", since=T0 + 2 * H)], T0 + 4 * H,
                          ["kueue", "job"])
    store.record_external([replace(job, state="waiting")], T0 + 5 * H, ["kueue", "job"])
    assert [u.id for u in store.external_units()] == ["job/research/train"]
    used = store.external_gpu_seconds(T0, T0 + 24 * H)
    assert used == {("kueue", "nlp"): 3 * 3600 * 4, ("job", "nlp"): 3 * 3600 * 8}
    # a window cuts the holds at its edges; a hold still open counts until the window's end
    store.record_external([replace(job, state="running", since=T0 + 6 * H)], T0 + 6 * H,
                          ["kueue", "job"])
    assert store.external_gpu_seconds(T0 + 3 * H, T0 + 7 * H) == {
        ("kueue", "nlp"): 1 * 3600 * 4, ("job", "nlp"): (2 + 1) * 3600 * 8}


def test_the_monthly_report_counts_their_gpu_hours_by_team_and_origin(tmp_path):
    from idlegpu.scheduler.reports import build_report
    from idlegpu.scheduler.reports.runs import runs_from_store

    with JobStore(f"sqlite:///{tmp_path / 'jobs.db'}") as store:
        workload = _unit("eval", "running", since=T0)
        job = _unit("train", "running", origin="job", gpus=8, since=T0)
        store.record_external([workload, job], T0, ["kueue", "job"])
        # the Workload finishes after 2 h; the Job is stopped after 3 h (waiting again)
        store.record_external([replace(workload, state="ended"), job], T0 + 2 * H,
                              ["kueue", "job"])
        store.record_external([replace(job, state="waiting")], T0 + 3 * H, ["kueue", "job"])
        assert {h.unit_id: h.outcome for h in store.external_holds()} == {
            "kueue/research/eval": "finished", "job/research/train": "stopped"}
        runs = runs_from_store(store, T0 + 24 * H)
    kinds = dict(zip(runs["kind"], zip(runs["gpu_hours"], runs["lost_gpu_hours"],
                                       strict=True), strict=True))
    assert kinds == {"kueue-workload": (8.0, 0.0), "kubernetes-job": (24.0, 24.0)}
    report = build_report(runs, "2026-01", tz="Asia/Seoul", price=3000.0)
    kinds = report.kinds.set_index("kind")
    assert kinds.loc["kueue-workload", "jobs_finished"] == 1
    assert kinds.loc["kueue-workload", "savings"] == 8.0 * 3000.0  # its useful GPU-hours
    assert kinds.loc["kubernetes-job", "preemptions"] == 1
    assert kinds.loc["kubernetes-job", "savings"] == 0.0  # stopped: lost whole
