"""The daemon: scheduled passes, its metrics and health endpoints, a graceful stop."""

import time
import urllib.error
import urllib.request
from datetime import UTC, datetime, timedelta

import pytest
from test_controller import T0, setup  # noqa: F401  (the fixture)

from idlegpu.scheduler.clock import ReplayClock
from idlegpu.scheduler.daemon import Daemon, wait_until


def test_scheduled_passes_metrics_and_health(setup):  # noqa: F811
    store, cluster, _, controller, _ = setup
    clock = {"now": T0}
    daemon = Daemon(controller, reconcile_seconds=1, backstop_seconds=1,
                    refresh_forecast=lambda now: None, clock=lambda: clock["now"])
    port = daemon.serve(0, host="127.0.0.1")
    url = f"http://127.0.0.1:{port}"
    try:
        with urllib.request.urlopen(f"{url}/healthz") as _:
            raise AssertionError("healthy before any pass")
    except urllib.error.HTTPError as exc:
        assert exc.code == 503
    daemon.refresh()
    sched = daemon.scheduler(blocking=False)
    sched.start()
    try:
        assert wait_until(lambda: len(cluster.created) == 2, timeout=10)
    finally:
        sched.shutdown(wait=True)  # the pass under way finishes first
    with urllib.request.urlopen(f"{url}/healthz") as response:
        assert response.status == 200
    with urllib.request.urlopen(f"{url}/metrics") as response:
        text = response.read().decode()
    assert "idlegpu_admissions_total 2.0" in text
    assert 'idlegpu_passes_total{kind="reconcile"}' in text
    assert "idlegpu_running_gpus 16.0" in text  # two admitted 8-GPU units hold their GPUs
    assert "idlegpu_signal_age_seconds 0.0" in text
    daemon.close()
    assert {job.id for job in sched.get_jobs()} == set()  # shut down
    assert len(cluster.created) == 2  # passes after the first never duplicate a Job


def test_jobs_are_registered_once_with_safe_options(setup):  # noqa: F811
    _, _, _, controller, _ = setup
    daemon = Daemon(controller, clock=lambda: datetime.now(UTC))
    sched = daemon.scheduler(blocking=False)
    jobs = {job.id: job for job in sched.get_jobs()}
    assert set(jobs) == {"reconcile", "backstop", "forecast-refresh", "monthly-report"}
    assert all(job.max_instances == 1 and job.coalesce for job in jobs.values())
    assert jobs["reconcile"].trigger.interval.total_seconds() == 60
    assert jobs["backstop"].trigger.interval.total_seconds() == 15
    # with checkpoint notices on, a quick pass stops the units that answered
    controller.checkpoint_notice_s = 600.0
    jobs = {job.id: job for job in daemon.scheduler(blocking=False).get_jobs()}
    assert jobs["notices"].trigger.interval.total_seconds() == 2
    assert jobs["notices"].max_instances == 1


def test_a_replayed_daemon_keeps_every_period_in_replayed_time(setup):  # noqa: F811
    _, _, _, controller, _ = setup
    clock = ReplayClock(datetime(2026, 1, 28, 8, 0, tzinfo=UTC), speed=60)
    daemon = Daemon(controller, reconcile_seconds=60, backstop_seconds=15, clock=clock)
    jobs = {job.id: job for job in daemon.scheduler(blocking=False).get_jobs()}
    # real seconds between runs: the period over the speed
    assert jobs["reconcile"].trigger.interval.total_seconds() == 1.0
    assert jobs["backstop"].trigger.interval.total_seconds() == 0.25
    assert jobs["forecast-refresh"].trigger.interval.total_seconds() == 1.0
    assert jobs["monthly-report"].trigger.interval.total_seconds() == 1.0


def run_replayed(controller, start, speed, seconds, **kwargs):
    """Run a replayed daemon (background scheduler, health endpoint) for ``seconds`` real
    seconds; returns (daemon, replayed hours run, /healthz codes after the first pass)."""
    clock = ReplayClock(start, speed)
    daemon = Daemon(controller, clock=clock, timezone="Asia/Seoul", **kwargs)
    port = daemon.serve(0, host="127.0.0.1")
    codes: list[int] = []
    try:
        first = clock.now()
        daemon.reconcile()  # what run() does first
        sched = daemon.scheduler(blocking=False)
        sched.start()
        end = time.monotonic() + seconds
        try:
            while time.monotonic() < end:
                try:
                    with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz") as r:
                        codes.append(r.status)
                except urllib.error.HTTPError as exc:
                    codes.append(exc.code)
                time.sleep(0.1)
        finally:
            sched.shutdown(wait=True)
        hours = (clock.now() - first).total_seconds() / 3600
    finally:
        daemon.close()
    return daemon, hours, codes


@pytest.mark.slow  # long (10-25 s): run by scripts/test.sh and CI
def test_a_60x_replay_passes_60_times_an_hour_and_refreshes_at_17(setup):  # noqa: F811
    from zoneinfo import ZoneInfo

    _, _, _, controller, _ = setup
    made: list[datetime] = []
    seoul = ZoneInfo("Asia/Seoul")
    start = datetime(2026, 1, 28, 16, 58, tzinfo=seoul)
    daemon, hours, codes = run_replayed(
        controller, start, 60, 12, reconcile_seconds=60, backstop_seconds=15,
        refresh_forecast=made.append, refresh_hour=17)
    passes = daemon.metrics.passes.labels("reconcile")._value.get()
    backstops = daemon.metrics.passes.labels("backstop")._value.get()
    rate = (passes - 1) / hours  # the scheduled ones (the first runs at the start)
    print(f"\nreplay at 60x: {passes:.0f} reconcile and {backstops:.0f} backstop passes in "
          f"{hours * 60:.1f} replayed minutes = {rate:.1f} reconcile passes per replayed hour")
    assert 50 <= rate <= 66, rate  # the real daemon: 60 an hour
    assert backstops / hours >= 180  # 240 an hour at 15 s
    assert codes and set(codes) == {200}, codes  # healthy all along after the first pass
    # the forecast made at the start, then again at the replayed 17:00 (within a period)
    assert made[0] - start < timedelta(seconds=30)
    evening = made[1:]
    assert len(evening) == 1, made
    at = evening[0].astimezone(seoul)
    assert at.replace(hour=17, minute=0, second=0, microsecond=0) <= at < at.replace(
        hour=17, minute=1, second=30), at


def test_a_replay_writes_last_months_report_on_the_replayed_1st(setup):  # noqa: F811
    from zoneinfo import ZoneInfo

    _, _, _, controller, _ = setup
    seoul = ZoneInfo("Asia/Seoul")
    written: list[datetime] = []
    start = datetime(2026, 2, 1, 5, 59, tzinfo=seoul)
    daemon, hours, _ = run_replayed(controller, start, 60, 4, reconcile_seconds=60,
                                    monthly_report=written.append)
    assert len(written) == 1, written  # not at the start (like a cron), once at 06:00
    at = written[0].astimezone(seoul)
    assert datetime(2026, 2, 1, 6, 0, tzinfo=seoul) <= at < datetime(2026, 2, 1, 6, 1, 30,
                                                                       tzinfo=seoul), at


def test_the_forecast_is_refreshed_when_a_refresh_hour_passed_and_failures_keep_it(setup):  # noqa: F811
    from datetime import timedelta

    from idlegpu.forecast.errors import SourceUnavailableError

    _, _, _, controller, _ = setup
    made: list[datetime] = []
    down = {"on": False}

    def refresh(now):
        if down["on"]:
            raise SourceUnavailableError("prometheus at http://x is unreachable")
        made.append(now)

    clock = {"now": datetime(2026, 1, 28, 7, 0, tzinfo=UTC)}  # 16:00 in Seoul
    daemon = Daemon(controller, refresh_forecast=refresh, refresh_hour=17,
                    timezone="Asia/Seoul", clock=lambda: clock["now"])
    daemon.reconcile()  # no forecast yet: made first
    assert made == [clock["now"]]
    clock["now"] += timedelta(minutes=50)  # 16:50: the last one is still current
    daemon.reconcile()
    assert len(made) == 1
    clock["now"] += timedelta(minutes=20)  # 17:10: the 17:00 refresh was missed (down, say)
    daemon.reconcile()
    assert made[-1] == clock["now"] and len(made) == 2
    down["on"] = True
    clock["now"] += timedelta(days=1)  # the next evening, Prometheus down
    report = daemon.reconcile()  # the pass still runs, on the forecast it has
    assert report.now == clock["now"] and daemon.forecast_made == made[-1]
    assert daemon.metrics.refresh_failures._value.get() == 1
    down["on"] = False
    clock["now"] += timedelta(minutes=1)
    daemon.reconcile()  # retried at the next pass
    assert made[-1] == clock["now"]


REPO = __import__("pathlib").Path(__file__).resolve().parents[1]


def test_night_only_mode_offers_nothing_by_day():
    import numpy as np
    import pandas as pd

    from idlegpu.forecast.sources import read_history
    from idlegpu.scheduler.config import load_config
    from idlegpu.scheduler.daemon import ForecastProvider

    settings = load_config(REPO / "idlegpu.yaml")
    night = settings.model_copy(update={"daemon": settings.daemon.model_copy(
        update={"mode": "night-only"})})
    history = read_history(REPO / "data/sample/history.parquet")
    at = datetime(2026, 1, 28, 9, 0, tzinfo=UTC)  # 18:00 in Seoul
    always, nightly = ForecastProvider(settings, history), ForecastProvider(night, history)
    always.refresh(at)
    nightly.refresh(at)
    a, n = always(at), nightly(at)
    hours = pd.date_range(n.start, periods=len(n.free), freq=f"{n.step_s}s").tz_convert(
        "Asia/Seoul").hour
    day = (hours >= 8) & (hours < 20)
    assert np.all(n.free[day] == 0) and np.any(a.free[day] > 0)
    assert np.array_equal(n.free[~day], a.free[~day]) and n.free[~day].max() > 0


def test_the_daemon_writes_last_months_report_from_the_store(tmp_path, setup):  # noqa: F811
    import csv
    from datetime import timedelta

    from idlegpu.scheduler.config import load_config
    from idlegpu.scheduler.daemon import write_last_month_report

    store, _, _, controller, _ = setup
    settings = load_config(REPO / "idlegpu.yaml")
    settings = settings.model_copy(update={"daemon": settings.daemon.model_copy(
        update={"reports_dir": str(tmp_path / "reports")})})
    unit = store.queue()[0].id  # 8 GPUs, runs 2 h one January night
    night = datetime(2026, 1, 10, 12, 0, tzinfo=UTC)
    store.admit(unit, night)
    store.started(unit, night)
    store.finished(unit, night + timedelta(hours=2))
    daemon = Daemon(controller, monthly_report=lambda at: write_last_month_report(
        settings, store, at), clock=lambda: datetime(2026, 1, 31, 21, 0, tzinfo=UTC))
    daemon.report()  # 06:00 on 1 February in Seoul: January's report
    out = tmp_path / "reports" / "2026-01"
    assert (out / "report-2026-01.md").is_file() and (out / "report-2026-01.html").is_file()
    rows = {r["month"]: r for r in csv.DictReader((out / "summary.csv").open())}
    assert float(rows["2026-01"]["useful_gpu_hours"]) == 16.0
    assert float(rows["2026-01"]["savings"]) == 16.0 * settings.report.price_per_gpu_hour


def test_a_pass_that_cannot_run_is_counted_and_turns_health_red(setup):  # noqa: F811
    from datetime import timedelta

    from idlegpu.scheduler.adapters.store import StoreUnavailableError

    store, _, _, controller, _ = setup
    clock = {"now": T0}
    daemon = Daemon(controller, reconcile_seconds=60, clock=lambda: clock["now"])
    assert daemon.reconcile() is not None and daemon.healthy()

    def down(*args, **kwargs):
        raise StoreUnavailableError("the job store is unreachable: connection refused")

    store.holding = store.queue = down  # the database goes away
    for minute in range(1, 5):
        clock["now"] = T0 + timedelta(minutes=minute)
        assert daemon.reconcile() is None and daemon.backstop() is None  # no crash
    assert daemon.metrics.errors._value.get() == 8
    assert not daemon.healthy()  # no pass for more than three reconcile periods
    del store.holding, store.queue  # it is back
    assert daemon.reconcile() is not None and daemon.healthy()


class FakeElector:
    """The leader elector's interface, led by the test."""

    def __init__(self, leading=False):
        self.leading = leading
        self.running = True
        self.on_started_leading = None
        self.last_attempt_at = 0.0
        self.identity = "replica-test"

    def is_leader(self):
        return self.leading

    def alive(self):
        return self.running

    def describe(self):
        return "ns/idlegpu"


def health(daemon):
    status = {}

    def start_response(code, headers):
        status["code"] = int(code.split()[0])

    body = b"".join(daemon.wsgi({"PATH_INFO": "/healthz"}, start_response)).decode()
    return status["code"], body.strip()


def leader_gauge(daemon):
    return daemon.metrics.leader._value.get()


def test_a_standby_runs_no_pass_but_keeps_its_forecast_and_is_healthy(setup):  # noqa: F811
    _, cluster, _, controller, _ = setup
    made, written = [], []
    clock = {"now": T0}
    elector = FakeElector(leading=False)
    daemon = Daemon(controller, refresh_forecast=made.append, monthly_report=written.append,
                    timezone="Asia/Seoul", clock=lambda: clock["now"], leader=elector)
    assert daemon.reconcile() is None and daemon.backstop() is None
    assert cluster.created == [] and made == [T0]  # no Job; the forecast made (warm)
    assert health(daemon) == (200, "ok (standby)") and leader_gauge(daemon) == 0
    assert daemon.metrics.passes.labels("reconcile")._value.get() == 0
    # its monthly report is the leader's job
    daemon.report_since = T0
    clock["now"] = datetime(2026, 2, 1, 6, 0, tzinfo=UTC) + timedelta(hours=1)
    assert not daemon.report_if_due() and written == []
    clock["now"] = T0 + timedelta(minutes=1)
    elector.running = False  # its election loop died: not healthy any more
    assert health(daemon)[0] == 503


def test_a_standby_that_becomes_leader_refreshes_before_its_first_pass(setup):  # noqa: F811
    from idlegpu.forecast.errors import SourceUnavailableError

    _, cluster, _, controller, _ = setup
    clock = {"now": T0}
    calls: list[str] = []
    down = {"on": True}

    def refresh(now):
        calls.append("refresh")
        if down["on"]:
            raise SourceUnavailableError("prometheus at http://x is unreachable")

    def reconcile_once(now):
        calls.append("pass")
        return real_reconcile(now)

    def backstop_once(now):
        calls.append("backstop")
        return real_backstop(now)

    real_reconcile, real_backstop = controller.reconcile_once, controller.backstop_once
    controller.reconcile_once, controller.backstop_once = reconcile_once, backstop_once
    elector = FakeElector(leading=False)
    daemon = Daemon(controller, refresh_forecast=refresh, clock=lambda: clock["now"],
                    leader=elector)
    daemon.reconcile()  # standby, Prometheus down: no forecast yet
    assert calls == ["refresh"] and daemon.forecast_made is None
    elector.leading = True  # elected while it has no forecast
    assert daemon.backstop() is None  # no pass on an empty profile (it would stop every job)
    assert calls == ["refresh", "refresh"] and daemon.role() == "standby"
    assert leader_gauge(daemon) == 0
    down["on"] = False
    clock["now"] += timedelta(seconds=15)
    daemon.backstop()  # the forecast is made first, then the pass runs on it
    assert calls == ["refresh", "refresh", "refresh", "backstop"]
    assert daemon.forecast_made == clock["now"] and daemon.role() == "leader"
    assert leader_gauge(daemon) == 1
    assert health(daemon) == (200, "ok (leader)")  # counted from the take-over
    report = daemon.reconcile()
    assert calls[-1] == "pass" and report is not None and len(cluster.created) == 2
    # steps down (it could not renew): passes stop at once
    elector.leading = False
    assert daemon.reconcile() is None and calls[-1] == "pass" and leader_gauge(daemon) == 0
    assert health(daemon) == (200, "ok (standby)")


def test_a_leader_with_a_warm_forecast_takes_over_without_refreshing_again(setup):  # noqa: F811
    _, cluster, _, controller, _ = setup
    made: list[datetime] = []
    clock = {"now": T0}
    elector = FakeElector(leading=False)
    daemon = Daemon(controller, refresh_forecast=made.append, timezone="Asia/Seoul",
                    clock=lambda: clock["now"], leader=elector)
    daemon.reconcile()  # the standby's forecast
    clock["now"] += timedelta(minutes=30)
    elector.leading = True
    assert daemon.reconcile() is not None and made == [T0]  # still current: used as is
    assert daemon.leading_since == clock["now"] and daemon.last_pass == clock["now"]


def test_a_first_pass_that_runs_past_six_still_leaves_the_1sts_report_due(setup):  # noqa: F811
    # the daemon's start counts from when it was made: a first reconcile pass that ran from
    # 05:59 to 06:02 (a slow store, a loaded machine) must not move the start past 06:00
    from zoneinfo import ZoneInfo

    _, _, _, controller, _ = setup
    seoul = ZoneInfo("Asia/Seoul")
    now = [datetime(2026, 2, 1, 5, 59, tzinfo=seoul)]
    daemon = Daemon(controller, clock=lambda: now[0], timezone="Asia/Seoul",
                    monthly_report=lambda at: None)
    now[0] = datetime(2026, 2, 1, 6, 2, tzinfo=seoul)
    daemon.scheduler(blocking=False)  # built after the first pass, not started
    assert daemon.report_due(now[0])
