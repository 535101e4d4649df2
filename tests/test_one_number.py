"""One number per quantity: the simulator's figures are the report's, computed the same way
from the same run table; the daemon's harvested and lost counters are the report's over the
store's attempts; a shorter simulation counts only its own jobs; the report names the planned
stops whose GPU-hours it counts as lost."""

from __future__ import annotations

from datetime import datetime, timedelta
from pathlib import Path

import pandas as pd
import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families
from test_controller import T0, setup  # noqa: F401  (the fixture)

from idlegpu.forecast.sources import read_history
from idlegpu.scheduler.config import load_config
from idlegpu.scheduler.daemon import Daemon
from idlegpu.scheduler.plan import planning_estimate
from idlegpu.scheduler.ports import JobPhase, StopKind
from idlegpu.scheduler.reports import (
    build_report,
    render_markdown,
    runs_from_store,
    useful,
    validate_runs,
)
from idlegpu.scheduler.simulate import simulate, trace_jobs
from idlegpu.scheduler.specs import load_trace
from idlegpu.scheduler.types import ServingSignals

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def simulated():
    settings = load_config(REPO / "idlegpu.yaml")
    history = read_history(REPO / "data/sample/history.parquet")
    entries = load_trace(REPO / "data/sample/jobs.yaml", settings.admission)
    jobs = trace_jobs(entries, planning_estimate(settings))
    start = datetime.fromisoformat("2026-01-05T00:00:00+09:00")
    end = start + timedelta(days=4)
    result = simulate(history, settings, jobs, "oracle", start=start, end=end)
    return result, jobs, start, end


def test_the_simulators_useful_gpu_hours_are_the_reports(simulated):
    result, _, _, _ = simulated
    m = result.metrics
    runs = validate_runs(result.runs.drop(columns=["nodes"], errors="ignore"))
    assert m["useful_gpu_hours"] == pytest.approx(useful(runs).sum())
    report = build_report(runs, "2026-01", tz="Asia/Seoul")
    assert report.row.useful_gpu_hours == pytest.approx(m["useful_gpu_hours"])
    assert report.row.lost_gpu_hours == pytest.approx(m["lost_gpu_hours"])
    assert report.row.preemptions == m["preemptions"]
    assert report.row.planned_stops == m["planned_stops"]
    if (runs["outcome"] == "running").any():  # an attempt still running counts the same way
        assert useful(runs[runs["outcome"] == "running"]).sum() > 0


def _totals(daemon) -> dict[str, float]:
    """The daemon's two GPU-seconds totals, as /metrics exposes them."""
    text = generate_latest(daemon.metrics.registry).decode()
    return {sample.name: sample.value for family in text_string_to_metric_families(text)
            for sample in family.samples
            if sample.name in ("idlegpu_harvested_gpu_seconds_total",
                               "idlegpu_lost_gpu_seconds_total")}


def test_the_daemons_harvested_and_lost_counters_are_the_reports(setup):  # noqa: F811
    store, cluster, signals, controller, _ = setup
    clock = {"now": T0}
    daemon = Daemon(controller, clock=lambda: clock["now"])

    def reconcile(at):
        clock["now"] = at
        signals.value = ServingSignals(observed_at=at)  # fresh: the service is quiet
        assert daemon.reconcile() is not None

    assert _totals(daemon) == {}  # nothing said before the store was read
    reconcile(T0)  # both 8-GPU units admitted
    for name in list(cluster.created):
        cluster.set_phase(name, JobPhase.RUNNING, T0)
    reconcile(T0 + timedelta(minutes=1))
    assert _totals(daemon) == {"idlegpu_harvested_gpu_seconds_total": 0.0,
                               "idlegpu_lost_gpu_seconds_total": 0.0}
    first, second = sorted(row.id for row in store.queue())
    # the first finishes; the second checkpoints, is preempted, runs again and fails
    store.checkpointed(second, T0 + timedelta(minutes=30), 29 * 60)
    cluster.stop(cluster.job_name(second, 1), reason="KV cache full", kind=StopKind.PREEMPT,
                 now=T0 + timedelta(hours=1))
    reconcile(T0 + timedelta(hours=1, minutes=1))
    cluster.set_phase(cluster.job_name(first, 1), JobPhase.SUCCEEDED, T0 + timedelta(hours=2))
    again = cluster.job_name(second, 2)
    assert again in cluster.jobs  # admitted again into the free GPUs
    cluster.set_phase(again, JobPhase.RUNNING, T0 + timedelta(hours=1, minutes=2))
    reconcile(T0 + timedelta(hours=2, minutes=1))
    cluster.set_phase(again, JobPhase.FAILED, T0 + timedelta(hours=3))
    end = T0 + timedelta(hours=3, minutes=1)
    reconcile(end)

    runs = runs_from_store(store, end)
    assert sorted(runs["outcome"]) == ["failed", "finished", "preempted"]
    preempted = runs[runs["outcome"] == "preempted"].iloc[0]
    assert 0 < preempted["lost_gpu_hours"] < preempted["gpu_hours"]  # partly useful
    totals = _totals(daemon)
    assert totals["idlegpu_harvested_gpu_seconds_total"] == pytest.approx(
        useful(runs).sum() * 3600)
    assert totals["idlegpu_lost_gpu_seconds_total"] == pytest.approx(
        runs["lost_gpu_hours"].sum() * 3600)
    report = build_report(runs, "2026-01", tz="Asia/Seoul")
    assert totals["idlegpu_harvested_gpu_seconds_total"] == pytest.approx(
        report.row.useful_gpu_hours * 3600)
    # a daemon started afresh on the same store says the same (totals of the store)
    restarted = Daemon(controller, clock=lambda: end + timedelta(minutes=1))
    assert restarted.reconcile() is not None
    assert _totals(restarted) == pytest.approx(totals)


def test_a_shorter_simulation_counts_only_the_jobs_it_could_run(simulated):
    result, jobs, _, end = simulated
    by_end = sum(j.submit_at <= end for j in jobs)  # the backlog from before its start too
    assert 0 < by_end < len(jobs)
    assert result.metrics["jobs"] == by_end
    assert result.metrics["jobs_finished"] <= result.metrics["jobs"]


def test_the_report_says_planned_stops_lost_the_gpu_hours_not_preemptions():
    rows = [{"job_id": "a", "team": "t", "kind": "train", "gpus": 8,
             "start": "2026-01-10T20:00:00+09:00", "end": "2026-01-11T07:00:00+09:00",
             "outcome": "stopped", "gpu_hours": 88.0, "lost_gpu_hours": 2.0},
            {"job_id": "a", "team": "t", "kind": "train", "gpus": 8,
             "start": "2026-01-11T20:00:00+09:00", "end": "2026-01-12T02:00:00+09:00",
             "outcome": "finished", "gpu_hours": 48.0, "lost_gpu_hours": 0.0}]
    report = build_report(validate_runs(pd.DataFrame(rows)), "2026-01", tz="Asia/Seoul")
    text = " ".join(render_markdown(report, {}).split())
    assert "0 preemptions and 1 planned stops lost 2.0 GPU-hours" in text
