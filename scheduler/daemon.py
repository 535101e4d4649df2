"""``idlegpu run``: the admission daemon under APScheduler.

Jobs (fixed ids, ``max_instances=1``, ``coalesce=True``): the reconcile pass every
``daemon.reconcile_seconds``, the live backstop every ``daemon.backstop_seconds``, the forecast
refresh every evening at ``daemon.forecast_refresh_hour`` (local), and last month's report at
06:00 on the 1st. Every period is one of the daemon's clock (``idlegpu.scheduler.clock``): the real
time, or a replay's, which runs ``speed`` times faster, so the interval triggers fire every
period/speed real seconds, and the evening refresh and the monthly report are checks made
every reconcile period against the clock ("has 17:00 passed since the last forecast?"), not
wall-clock crons. The reconcile pass makes the refresh check too, so the pass that first sees
17:00 (or the first pass of a daemon that was down then) runs on tonight's forecast.
A failed refresh (Prometheus down) is logged and counted; the pass goes on with the forecast it
has, which the policy refuses to admit on once it is older than ``max_forecast_age``.
The daemon serves its own Prometheus metrics and a health endpoint, and stops gracefully on
SIGTERM (the pass under way finishes; nothing is left half-applied).

High availability: given a ``leader`` (``idlegpu.scheduler.adapters.lease.LeaderElector``), several
replicas run and only the one holding the Lease runs passes and writes reports. A standby
keeps its forecast fresh (the refresh checks run on every replica) and is healthy as such.
A standby that becomes leader has a forecast before its first pass (it refreshes first if it
has none or it is due, and does not act until it has one): a pass on an empty profile would
have the backstop stop every running job. On SIGTERM the leader finishes the pass under way,
then releases the Lease, so the other replica takes over at once.

After every pass (and every tick of a standby) the replica writes its status into the store
(``JobStore.record_daemon_status``: its identity, role, last passes, their counts, the
forecast's and signals' ages), which ``GET /v1/daemon`` and the console's operators' page
read: the API server shares nothing with the daemon but the store. A failed write is logged
and never fails the pass.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import threading
import time
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import TYPE_CHECKING
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest
from prometheus_client.core import CounterMetricFamily
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from idlegpu.forecast.errors import IdlegpuError
from idlegpu.forecast.redact import RedactingFilter
from idlegpu.forecast.sources.prometheus import fetch_history
from idlegpu.scheduler.adapters.store import DaemonStatus
from idlegpu.scheduler.clock import Clock, as_clock, real_seconds, refresh_due, report_due
from idlegpu.scheduler.controller import Controller, PassReport
from idlegpu.scheduler.refresh import Refresher
from idlegpu.scheduler.reports import (
    Month,
    build_report,
    held_and_lost,
    notices_from_store,
    runs_from_store,
    write_report,
)
from idlegpu.scheduler.types import NIGHT_HOURS, Action, FreeProfile

if TYPE_CHECKING:
    from idlegpu.scheduler.refresh import Refresh

log = logging.getLogger("idlegpu.daemon")

NOTICE_POLL_SECONDS = 2.0
"""How often the daemon looks for acknowledged checkpoint notices (real seconds)."""
# every line, every 15 s, may quote a source's error: never with its credentials
log.addFilter(RedactingFilter())


class StoreTotals:
    """The job store's GPU-seconds over every ended attempt, as of the last pass: harvested
    (useful: held minus lost, the monthly report's count) and lost. Totals of the store, not of
    this process, so a restart or a new leader goes on from the same figure; nothing is
    exported before the first pass has read them (a standby exports none)."""

    def __init__(self) -> None:
        self.harvested: float | None = None
        self.lost: float | None = None
        self.stale = True
        """True until read, and after a read that failed."""

    def update(self, attempts: list[tuple[str, float, float | None]]) -> None:
        held, lost = 0.0, 0.0
        for outcome, gpu_seconds, lost_seconds in attempts:
            h, lo = held_and_lost(outcome, gpu_seconds, lost_seconds)
            held, lost = held + h, lost + lo
        self.harvested, self.lost, self.stale = held - lost, lost, False

    def collect(self):
        if self.harvested is None:
            return
        yield CounterMetricFamily(
            "idlegpu_harvested_gpu_seconds", "Useful GPU-seconds of every ended attempt in the "
            "job store: held minus lost, as the monthly report counts them",
            value=self.harvested)
        yield CounterMetricFamily(
            "idlegpu_lost_gpu_seconds", "GPU-seconds of work lost by ended attempts in the job "
            "store: since the last checkpoint of a preempted one, all of a failed one",
            value=self.lost)


class NoticeTotals:
    """Checkpoint notices in the job store by outcome (sent, answered in time, missed, cut
    short by the service, ended otherwise, open), as of the last pass that sent or closed
    one: the store's totals, so a restart or a new leader goes on from the same figures."""

    def __init__(self) -> None:
        self.counts: dict[str, int] | None = None
        self.stale = True

    def collect(self):
        if self.counts is None:
            return
        family = CounterMetricFamily(
            "idlegpu_checkpoint_notices", "Checkpoint notices sent before planned stops, by "
            "outcome: sent (all), answered (acknowledged in time), missed (stopped at the "
            "deadline), cut (the service needed the GPUs first), ended (the attempt ended "
            "first), open (under way)", labels=["outcome"])
        for outcome, n in sorted(self.counts.items()):
            family.add_metric([outcome], n)
        yield family


class DaemonMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.running_jobs = Gauge("idlegpu_running_jobs", "Job units holding GPUs", registry=r)
        self.running_gpus = Gauge("idlegpu_running_gpus", "GPUs held by research jobs",
                                  registry=r)
        self.admissions = Counter("idlegpu_admissions", "Job units admitted", registry=r)
        self.preemptions = Counter("idlegpu_preemptions", "Stops sent, by kind",
                                   ["kind"], registry=r)
        self.store_totals = StoreTotals()
        r.register(self.store_totals)
        self.notice_totals = NoticeTotals()
        r.register(self.notice_totals)
        self.forecast_age = Gauge("idlegpu_forecast_age_seconds", "Age of the forecast in use",
                                  registry=r)
        self.signal_age = Gauge("idlegpu_signal_age_seconds",
                                "Age of the newest good live signals (-1: never read)",
                                registry=r)
        self.passes = Counter("idlegpu_passes", "Controller passes, by kind", ["kind"],
                              registry=r)
        self.errors = Counter("idlegpu_pass_errors", "Errors met during passes", registry=r)
        self.refresh_failures = Counter("idlegpu_forecast_refresh_failures",
                                        "Forecast refreshes that failed", registry=r)
        self.leader = Gauge("idlegpu_leader", "1 while this replica leads (runs passes), 0 "
                            "while it stands by", registry=r)
        self.forecast_coverage = Gauge(
            "idlegpu_forecast_coverage", "Share of the last week's replica samples at or below "
            "what the forecasts in use promised at the admission confidence (NaN: none yet)",
            ["service"], registry=r)
        self.forecast_widened = Gauge(
            "idlegpu_forecast_widened", "1 while a service is planned with a wider quantile "
            "because its forecasts covered less than promised by more than chance",
            ["service"], registry=r)


class Daemon:
    def __init__(
        self,
        controller: Controller,
        *,
        reconcile_seconds: int = 60,
        backstop_seconds: int = 15,
        refresh_forecast: Callable[[datetime], object] | None = None,
        refresh_hour: int = 17,
        monthly_report: Callable[[datetime], None] | None = None,
        report_hour: int = 6,
        timezone: str = "UTC",
        clock: Clock | Callable[[], datetime] | None = None,
        leader=None,
        identity: str | None = None,
        retention_days: float | None = None,
    ) -> None:
        """``clock``: a ``idlegpu.scheduler.clock`` clock (default the real time) or a plain
        ``() -> datetime`` (taken as real-time speed). ``leader``: a leader elector
        (``is_leader()``, ``alive()``, ``start()``, ``stop(release=)``), None for a single
        replica that always acts. ``identity``: the replica in the status it writes to the
        store (default: the leader elector's, else ``$POD_NAME`` or ``<hostname>-<pid>``)."""
        self.controller = controller
        self.retention_days = retention_days
        self._retention_at: datetime | None = None  # the last retention sweep
        self.reconcile_seconds = reconcile_seconds
        self.backstop_seconds = backstop_seconds
        self.refresh_forecast = refresh_forecast
        self.refresh_hour = refresh_hour
        self.monthly_report = monthly_report
        self.report_hour = report_hour
        self.timezone = timezone
        self.clock = as_clock(clock)
        self.metrics = DaemonMetrics()
        self.last_pass: datetime | None = None
        self.forecast_made: datetime | None = None
        # the monthly report is due once 06:00 on a 1st passes after this (the last report, or
        # the start: like a cron, a daemon started later that month does not write it). The
        # start is now, not when the scheduler begins: a first pass that runs past 06:00 must
        # not make the 1st's report never due
        self.report_since: datetime = self.clock.now()
        self._refresh_lock = threading.Lock()
        self._server: WSGIServer | None = None
        self.leader = leader
        self._leading = leader is None  # acting as the leader (took over, has a forecast)
        self.leading_since: datetime | None = None
        self._sched = None
        self.metrics.leader.set(1 if leader is None else 0)
        self.identity = identity or getattr(leader, "identity", None) or (
            os.environ.get("POD_NAME") or f"{socket.gethostname()}-{os.getpid()}")
        self.last_reconcile: datetime | None = None
        self.last_backstop: datetime | None = None

    # ------------------------------------------------------------------ jobs
    def reconcile(self) -> PassReport | None:
        self.refresh_if_due()
        report = self._pass("reconcile", self.controller.reconcile_once)
        if report is not None:
            self.retain(report.now)
        return report

    def retain(self, now: datetime) -> int:
        """Retention (``store.retention_days``): at most once an hour, after a pass, drop the
        bulk of the specs of units that ended that long ago (``JobStore.drop_ended_specs``,
        in batches). A failure is logged and counted; the next hour tries again."""
        if self.retention_days is None or (
                self._retention_at is not None
                and (now - self._retention_at).total_seconds() < 3600):
            return 0
        self._retention_at = now
        try:
            dropped = self.controller.store.drop_ended_specs(
                now - timedelta(days=self.retention_days), now)
        except Exception as exc:  # noqa: BLE001 - retention waits; the pass stands
            self.metrics.errors.inc()
            log.warning("retention: could not drop old specs: %s", exc)
            return 0
        if dropped:
            log.info("retention: dropped the specs of %d unit(s) ended over %g days ago",
                     dropped, self.retention_days)
        return dropped

    def backstop(self) -> PassReport | None:
        return self._pass("backstop", self.controller.backstop_once)

    def notices(self) -> PassReport | None:
        """The quick pass while checkpoint notices are under way: a unit that answered is
        stopped within seconds of its acknowledgement, whatever the backstop's period."""
        if not self.acting() or self.controller.checkpoint_notice_s <= 0:
            return None
        try:
            report = self.controller.notices_once(self.clock.now())
        except IdlegpuError as exc:
            self.metrics.errors.inc()
            log.error("notices pass failed: %s", exc)
            return None
        if report.notices_closed or report.stopped or report.errors:
            self._record(report, "notices")
        return report

    def _pass(self, kind: str, run: Callable[[datetime], PassReport]) -> PassReport | None:
        """One pass; a failure of a part it cannot do without (the store down, say) is logged
        and counted, and the pass does not count as run, so /healthz turns 503 once that has
        lasted three reconcile periods. A standby runs none (None)."""
        if not self.acting():
            self.write_status(None, kind)
            return None
        try:
            report = run(self.clock.now())
        except IdlegpuError as exc:
            self.metrics.passes.labels(kind).inc()
            self.metrics.errors.inc()
            log.error("%s pass failed: %s", kind, exc)
            return None
        self._record(report, kind)
        self.write_status(report, kind)
        return report

    def write_status(self, report: PassReport | None, kind: str) -> None:
        """This replica's status into the store after a pass (``report``; None: a standby's
        tick), for ``GET /v1/daemon``. One write; a failure is logged and counted, never
        raised: the pass has been applied whatever its status says."""
        if report is not None:
            if kind == "reconcile":
                self.last_reconcile = report.now
            else:
                self.last_backstop = report.now
        age = (report.signals.missing_for_s(report.now)
               if report is not None and report.signals else None)
        status = DaemonStatus(
            identity=self.identity, host=socket.gethostname(), pid=os.getpid(),
            role=self.role(), updated_at=report.now if report else self.clock.now(),
            reconcile_seconds=int(self.reconcile_seconds),
            last_reconcile_at=self.last_reconcile, last_backstop_at=self.last_backstop,
            last_pass=kind if report is not None else None,
            admitted=len(report.created) if report else 0,
            stopped=len(report.stopped) if report else 0,
            errors=len(report.errors) if report else 0,
            forecast_made_at=self.forecast_made, signals_age_s=age)
        try:
            self.controller.store.record_daemon_status(status)
        except Exception as exc:  # noqa: BLE001 - the status is for people; the pass stands
            self.metrics.errors.inc()
            log.warning("could not write this replica's status to the store: %s", exc)

    def refresh(self) -> bool:
        """Refresh the forecast now; False (logged, counted) when it failed."""
        if self.refresh_forecast is None:
            return False
        with self._refresh_lock:
            return self._refresh(self.clock.now())

    def _refresh(self, now: datetime) -> bool:
        refresh_forecast = self.refresh_forecast
        assert refresh_forecast is not None  # its callers return first without one
        try:
            result = refresh_forecast(now)
        except IdlegpuError as exc:
            self.metrics.errors.inc()
            self.metrics.refresh_failures.inc()
            log.warning("forecast refresh failed, keeping the current forecast: %s", exc)
            return False
        self.forecast_made = now
        log.info("forecast refreshed at %s", now.isoformat(timespec="seconds"))
        self._record_coverage(getattr(result, "coverage", None))
        return True

    def _record_coverage(self, coverage) -> None:
        """A refresh's scores of the forecasts in use (``idlegpu.scheduler.refresh.Refresh``), per
        service: the gauges, and a warning for each service planned wider."""
        for service, c in (coverage or {}).items():
            self.metrics.forecast_coverage.labels(service).set(c.coverage)
            self.metrics.forecast_widened.labels(service).set(1 if c.widened else 0)
            if c.widened:
                log.warning("forecast of %s covers less than promised: %s", service,
                            c.describe())

    def refresh_due(self, now: datetime) -> bool:
        """True when no forecast was made yet, or a refresh hour passed since the last one."""
        if self.refresh_forecast is None:
            return False
        return refresh_due(now, self.forecast_made, self.timezone, self.refresh_hour)

    def refresh_if_due(self) -> bool:
        """Refresh when due (the scheduled check, and the start of every reconcile pass);
        False when it was not due or failed. Checked again under the lock: the check job and
        a pass that meet at 17:00 refresh once."""
        with self._refresh_lock:
            now = self.clock.now()
            return self.refresh_due(now) and self._refresh(now)

    def report(self) -> None:
        """Write last month's report now (the monthly job, or on demand)."""
        if self.monthly_report is not None:
            now = self.clock.now()
            self.monthly_report(now)
            self.report_since = now

    def report_due(self, now: datetime) -> bool:
        if self.monthly_report is None:
            return False
        return report_due(now, self.report_since, self.timezone, self.report_hour)

    def report_if_due(self) -> bool:
        """Write the report when due, on the leader only (a standby that takes over later
        writes it then, if it is still due by its own count: the same files again at worst)."""
        if not self.report_due(self.clock.now()) or not self.acting():
            return False
        try:
            self.report()
        except (IdlegpuError, OSError) as exc:  # retried at the next check
            self.metrics.errors.inc()
            log.error("last month's report failed: %s", exc)
            return False
        return True

    def _record(self, report: PassReport, kind: str) -> None:
        m = self.metrics
        m.passes.labels(kind).inc()
        m.admissions.inc(len(report.created))
        for d in report.plan.of(Action.PREEMPT):
            m.preemptions.labels("planned" if d.planned else "live").inc()
        m.errors.inc(len(report.errors))
        for error in report.errors:
            log.warning("%s pass: %s", kind, error)
        for d in report.plan.decisions:
            if d.action is not Action.DEFER:
                log.info("%s pass at %s: %s %s (%d GPUs): %s", kind, report.now.isoformat(
                    timespec="seconds"), d.action.value, d.job_id, d.gpus, d.reason)
        for unit, outcome in report.notices_closed:
            log.info("%s pass at %s: checkpoint notice of %s %s", kind,
                     report.now.isoformat(timespec="seconds"), unit, outcome)
        for what in ("created", "recreated", "started", "noticed", "stopped", "released",
                     "finished", "failed", "deleted"):
            names = getattr(report, what)
            if names:
                log.info("%s pass at %s: %s %s", kind, report.now.isoformat(timespec="seconds"),
                         what, ", ".join(names))
        holding = self.controller.store.holding()
        m.running_jobs.set(len(holding))
        m.running_gpus.set(sum(row.gpus for row in holding))
        age = report.signals.missing_for_s(report.now) if report.signals else None
        m.signal_age.set(-1 if age is None else age)
        if self.forecast_made is not None:
            m.forecast_age.set((report.now - self.forecast_made).total_seconds())
        # attempts end only in passes (a cancel too goes through one), so the totals are read
        # again only after a pass that ended some: a read costs ~2 ms per 1,000 ended attempts
        if m.store_totals.stale or report.finished or report.failed or report.released:
            try:
                m.store_totals.update(self.controller.store.ended_attempt_seconds())
            except Exception as exc:  # noqa: BLE001 - the last figures stand; read next pass
                m.errors.inc()
                m.store_totals.stale = True
                log.warning("could not read the GPU-hours totals from the store: %s", exc)
        if m.notice_totals.stale or report.noticed or report.notices_closed:
            try:
                m.notice_totals.counts = self.controller.store.notice_counts()
                m.notice_totals.stale = False
            except Exception as exc:  # noqa: BLE001 - the last figures stand; read next pass
                m.errors.inc()
                m.notice_totals.stale = True
                log.warning("could not read the checkpoint notices from the store: %s", exc)
        self.last_pass = report.now

    # ------------------------------------------------------------------ leadership
    def acting(self) -> bool:
        """True when this replica may act now: no election, or it leads and has taken over
        (with a forecast). Notices a step-down or a new leadership at once."""
        if self.leader is None:
            return True
        leads = self.leader.is_leader()
        if not leads:
            if self._leading:
                log.warning("no longer the leader: standing by (no passes, no reports)")
                self._leading = False
                self.leading_since = None
            self.metrics.leader.set(0)
            return False
        if not self._leading:
            self._take_over()
        self.metrics.leader.set(1 if self._leading else 0)
        return self._leading

    def _take_over(self) -> None:
        """Became leader: make sure of a forecast before the first pass."""
        if self.refresh_forecast is not None:
            self.refresh_if_due()
            if self.forecast_made is None:
                self.metrics.errors.inc()
                log.error("leader, but without a forecast (the refresh failed): no pass until "
                          "one is made")
                return
        self._leading = True
        self.leading_since = self.clock.now()
        log.info("now the leader: running passes from %s (forecast of %s)",
                 self.leading_since.isoformat(timespec="seconds"),
                 self.forecast_made.isoformat(timespec="seconds") if self.forecast_made
                 else "none")

    def _elected(self) -> None:
        """The elector's callback (its thread): run a reconcile pass now, not at the next
        period."""
        sched = self._sched
        if sched is not None:
            try:
                sched.add_job(self.reconcile, id="takeover", replace_existing=True,
                              max_instances=1)
            except Exception:  # the scheduler is shutting down
                log.debug("no take-over pass: the scheduler is stopping")

    # ------------------------------------------------------------------ scheduling
    def scheduler(self, *, blocking: bool = True):
        """The jobs, every period in the clock's time: a replay at ``speed`` 60 runs its
        reconcile pass every second, 60 per replayed hour, as the real daemon does per hour."""
        from apscheduler.schedulers.background import BackgroundScheduler
        from apscheduler.schedulers.blocking import BlockingScheduler
        from apscheduler.triggers.interval import IntervalTrigger

        sched = (BlockingScheduler if blocking else BackgroundScheduler)(timezone=self.timezone)
        common = {"max_instances": 1, "coalesce": True, "replace_existing": True,
                  "misfire_grace_time": 30}

        def every(seconds: float) -> IntervalTrigger:
            return IntervalTrigger(seconds=real_seconds(self.clock, seconds))

        sched.add_job(self.reconcile, every(self.reconcile_seconds), id="reconcile", **common)
        sched.add_job(self.backstop, every(self.backstop_seconds), id="backstop", **common)
        if getattr(self.controller, "checkpoint_notice_s", 0) > 0:
            # in real seconds, even in a replay: acknowledgements come in the workloads' time
            sched.add_job(self.notices, IntervalTrigger(seconds=NOTICE_POLL_SECONDS),
                          id="notices", **common)
        sched.add_job(self.refresh_if_due, every(self.reconcile_seconds),
                      id="forecast-refresh", **common)
        sched.add_job(self.report_if_due, every(self.reconcile_seconds), id="monthly-report",
                      **common)
        return sched

    # ------------------------------------------------------------------ endpoints
    def healthy(self) -> bool:
        """Alive when a pass ran within three reconcile periods (of the clock's time); the
        leader counts them from when it took over. A standby is healthy while its election
        loop runs."""
        if self.leader is not None and not (self._leading and self.leader.is_leader()):
            return self.leader.alive()
        last = self.last_pass
        if self.leading_since is not None and (last is None or last < self.leading_since):
            last = self.leading_since
        if last is None:
            return False
        return (self.clock.now() - last).total_seconds() <= 3 * self.reconcile_seconds

    def role(self) -> str:
        if self.leader is None:
            return "single"
        return "leader" if self._leading and self.leader.is_leader() else "standby"

    def wsgi(self, environ, start_response):
        path = environ.get("PATH_INFO", "")
        if path == "/metrics":
            start_response("200 OK", [("Content-Type", CONTENT_TYPE_LATEST)])
            return [generate_latest(self.metrics.registry)]
        if path in ("/healthz", "/readyz"):
            ok = self.healthy()
            start_response("200 OK" if ok else "503 Service Unavailable",
                           [("Content-Type", "text/plain")])
            role = self.role()
            body = ("ok" if ok else "no recent pass" if role != "standby" else
                    "leader election stopped") + ("" if role == "single" else f" ({role})")
            return [f"{body}\n".encode()]
        start_response("404 Not Found", [("Content-Type", "text/plain")])
        return [b"not found\n"]

    def serve(self, port: int, host: str = "0.0.0.0") -> int:
        """Serve /metrics and /healthz in a thread; returns the bound port."""

        class Quiet(WSGIRequestHandler):
            def log_message(self, *args) -> None:  # keep the log clean
                pass

        self._server = make_server(host, port, self.wsgi, handler_class=Quiet)
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self._server.server_port

    def run(self, *, metrics_port: int = 0) -> None:
        """Run until SIGTERM or SIGINT: a first refresh and pass at once, then on schedule;
        SIGHUP refreshes the forecast on demand. With a leader elector: it starts first (a
        replica alone leads from its first try), and on the way out, after the last pass,
        the Lease is released."""
        if metrics_port:
            self.serve(metrics_port)
        if self.leader is not None:
            self.leader.on_started_leading = self._elected
            self.leader.start()
            wait_until(lambda: self.leader.last_attempt_at is not None, timeout=10)
        try:
            self._run_scheduled()
        finally:
            if self.leader is not None:
                self.leader.stop(release=True)
                self._leading = False
                self.metrics.leader.set(0)

    def _run_scheduled(self) -> None:
        self.reconcile()  # refreshes the forecast first (none yet)
        sched = self._sched = self.scheduler(blocking=True)

        def stop(signum, frame) -> None:
            log.info("signal %s: finishing the pass under way, then stopping", signum)
            # not from the handler itself: it runs in the scheduler's own thread, possibly in
            # the middle of its job loop, whose (reentrant) lock it would walk straight
            # through and empty the job store under it (APScheduler's JobLookupError)
            threading.Thread(target=sched.shutdown, kwargs={"wait": True},
                             name="idlegpu-stop", daemon=True).start()

        def refresh_now(signum, frame) -> None:  # on demand: kill -HUP <pid>
            log.info("SIGHUP: refreshing the forecast")
            sched.add_job(self.refresh, id="forecast-refresh-now", replace_existing=True,
                          max_instances=1)

        signal.signal(signal.SIGTERM, stop)
        signal.signal(signal.SIGINT, stop)
        signal.signal(signal.SIGHUP, refresh_now)
        sched.start()
        if self._server is not None:
            self._server.shutdown()

    def close(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server = None


def wait_until(predicate: Callable[[], bool], timeout: float = 5.0) -> bool:
    """Poll ``predicate`` until true or ``timeout`` seconds (for tests and start-up checks)."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if predicate():
            return True
        time.sleep(0.05)
    return predicate()


# --------------------------------------------------------------------------- what it runs


class ForecastProvider:
    """The daemon's current free-GPU profile: refreshed nightly (and at start), from recorded
    history in a replay, else from the last five weeks in Prometheus, by the refresh the
    simulator and ``plan`` share (``idlegpu.scheduler.refresh``: it scores the forecasts in use over
    the last week and plans a service that under-covers with a wider quantile). In
    ``night-only`` mode the profile offers nothing between 08:00 and 20:00 local, so jobs are
    admitted only into the night and stopped (checkpointed, as planned) before the morning."""

    HISTORY = timedelta(days=35)

    def __init__(self, settings, frame=None) -> None:
        self.settings = settings
        self.frame = frame
        self.profile: FreeProfile | None = None
        self.refresher = Refresher(settings)
        self.last: Refresh | None = None

    def refresh(self, now: datetime):
        """Refresh the profile; returns the ``Refresh`` (with the coverage scores)."""
        frame = self.frame
        if frame is None:
            frame = fetch_history(self.settings, now - self.HISTORY, now)
        result = self.refresher.refresh(frame, now)
        profile = result.profile
        if self.settings.daemon.mode == "night-only":
            profile = night_only(profile, self.settings.pool.timezone)
        self.profile = profile
        self.last = result
        return result

    def __call__(self, now: datetime):
        return self.profile


def night_only(profile, tz: str):
    """The profile with nothing free outside the night (``NIGHT_HOURS``, local)."""
    import numpy as np
    import pandas as pd

    times = pd.date_range(profile.start, periods=len(profile.free),
                          freq=f"{profile.step_s}s").tz_convert(tz)
    night = (times.hour >= NIGHT_HOURS[0]) | (times.hour < NIGHT_HOURS[1])
    likely = None if profile.likely is None else np.where(night, profile.likely, 0.0)
    return FreeProfile(profile.start, profile.step_s, np.where(night, profile.free, 0.0),
                       profile.confidence, profile.made_at, likely=likely)


def write_last_month_report(settings, store, now: datetime):
    """Last month's report (with the two months before it for comparison) from the store's
    attempts, into ``daemon.reports_dir/YYYY-MM/``; returns the files written."""
    from pathlib import Path

    local = now.astimezone(settings.pool.tz)
    month = Month(local.year, local.month).shift(-1)
    runs = runs_from_store(store, now)
    report = build_report(runs, month, months=3, tz=settings.pool.timezone,
                          price=settings.report.price_per_gpu_hour,
                          currency=settings.report.currency, pool=settings.pool.name,
                          notices=notices_from_store(store, month, settings.pool.timezone))
    files = write_report(report, Path(settings.daemon.reports_dir) / month.label)
    log.info("wrote the report of %s to %s", month.label, files[0].parent)
    return files
