"""What ``idlegpu run`` does (its signature: ``idlegpu.scheduler.cli.daemon``): the admission
daemon, or one reconcile pass (``--once``), and what it is built from: the store, the
Kubernetes cluster (or ``--dry-run``'s manifests), the live signals, the leader election. The
daemon's modules come with the daemon extra, so they are imported by the functions that use
them."""

from __future__ import annotations

import logging
import os
import re
import sys
from pathlib import Path

import typer

from idlegpu.forecast.redact import RedactingFilter, redact
from idlegpu.forecast.sources import read_history
from idlegpu.scheduler.admission_checks import planned_runtime_s
from idlegpu.scheduler.cli.common import (
    _now,
    _warning,
    console,
    err_console,
)
from idlegpu.scheduler.cli.inputs import (
    _load_settings,
    _planning_estimate,
    _say_runtime_model,
    _store_url,
)
from idlegpu.scheduler.clock import ReplayClock, WallClock
from idlegpu.scheduler.controller import Controller
from idlegpu.scheduler.controller.kueue import KueueAdmission
from idlegpu.scheduler.controller.native import NativeAdmission
from idlegpu.scheduler.native_jobs import native_unit_spec
from idlegpu.scheduler.output import Column, emit
from idlegpu.scheduler.policy import policy_settings
from idlegpu.scheduler.replay import HistorySignals
from idlegpu.scheduler.specs import recheck_unit

ONCE_COLUMNS = (Column("decision", "decision"), Column("unit", "unit", identifier=True),
                Column("gpus", "GPUs", right=True), Column("why", "why"))


def run(*, config: Path, once: bool, now: str | None, history: Path | None, dry_run: bool,
        store: str | None, runs: Path | None, kubeconfig: str | None, context: str | None,
        speed: float) -> None:
    """``idlegpu run``."""
    from idlegpu.scheduler.adapters.store import JobStore
    from idlegpu.scheduler.daemon import ForecastProvider

    settings = _load_settings(config)
    if now is not None and not once and history is None:
        raise typer.BadParameter("--now replays recorded history: use it with --once, or with "
                                 "--history to replay the daemon from that moment",
                                 param_hint="--now")
    if speed != 1.0 and (once or now is None or history is None):
        raise typer.BadParameter("--speed paces a replayed daemon: use it with --history and "
                                 "--now, without --once", param_hint="--speed")
    moment = _now(now)
    frame = None
    if history is not None:
        frame = read_history(history)
    job_store = JobStore(_store_url(settings, store))
    cluster = _cluster(settings, dry_run=dry_run, kubeconfig=kubeconfig, context=context,
                       instance=_instance(settings, job_store))
    signals = _signal_source(settings, frame)
    forecast = ForecastProvider(settings, frame)
    estimator = _planning_estimate(settings, runs)
    controller = _controller(settings, job_store, cluster, signals, forecast,
                             estimator.seconds, dry_run=dry_run,
                             external=_external_units(settings, estimator.seconds,
                                                      dry_run=dry_run, kubeconfig=kubeconfig,
                                                      context=context, watch=not once))
    try:
        if once:
            _run_once(settings, job_store, controller, forecast, estimator, cluster, moment,
                      dry_run=dry_run, store=store)
            return
        _run_daemon(settings, job_store, controller, forecast, moment, store=store,
                    replay_speed=speed if now is not None else None, kubeconfig=kubeconfig,
                    context=context)
    finally:
        job_store.close()


def _controller(settings, job_store, cluster, signals, forecast, estimate, *, dry_run: bool,
                external=()):
    """The reconcile pass of ``run``, with the config's policy, timeouts and rechecks."""
    return Controller(job_store, cluster, signals, forecast, estimate,
                      policy_settings(settings.admission, settings.pool.headroom_gpus,
                                      settings.pool.total_gpus),
                      fair_share_days=settings.admission.fair_share_days,
                      pending_timeout_s=settings.cluster.pending_timeout_seconds,
                      stop_timeout_s=_stop_timeout(settings),
                      max_unscheduled_attempts=settings.cluster.max_unscheduled_attempts,
                      gang_timeout_s=settings.cluster.gang_timeout_seconds,
                      recheck=_admission_recheck(settings),
                      dry_run=dry_run,
                      runtime_quantile=settings.admission.runtime_quantile,
                      checkpoint_notice_s=settings.admission.checkpoint_notice_seconds,
                      external=external)


def _external_units(settings, estimate, *, dry_run: bool, kubeconfig: str | None,
                    context: str | None, watch: bool = False) -> list:
    """The units that live outside the store: Kueue's Workloads on idlegpu's admission
    checks (``cluster.kueue``) and users' own suspended Jobs (``cluster.native_jobs``); the
    daemon (``watch``) keeps both by the API server's watch, a single pass lists them."""
    kueue = _kueue(settings, estimate, dry_run=dry_run, kubeconfig=kubeconfig, context=context,
                   watch=watch)
    native = _native_jobs(settings, estimate, dry_run=dry_run, kubeconfig=kubeconfig,
                          context=context, watch=watch)
    return [source for source in (kueue, native) if source is not None]


def _native_jobs(settings, estimate, *, dry_run: bool, kubeconfig: str | None,
                 context: str | None, watch: bool = False):
    """Users' suspended Jobs with ``idlegpu.io/queue: <pool>`` (``cluster.native_jobs``)."""
    c = settings.cluster
    if not c.native_jobs.namespaces:
        return None
    from idlegpu.scheduler.adapters.kubernetes.native import NativeJobs

    source = NativeJobs.from_config(
        kubeconfig or c.kubeconfig, context or c.context, c.in_cluster,
        namespaces=c.native_jobs.namespaces, queue=settings.pool.name,
        allowed_registries=settings.admission.allowed_registries,
        max_gpus=settings.admission.max_gpus_per_job, pool_gpus=settings.pool.total_gpus,
        node_selector=dict(c.node_selector), tolerations=list(c.tolerations),
        grace_seconds=settings.admission.grace_seconds, watch=watch)
    return NativeAdmission(source, lambda job: job.runtime_s or estimate(native_unit_spec(job)),
                           team_of=c.native_jobs.teams, dry_run=dry_run)


def _kueue(settings, estimate, *, dry_run: bool, kubeconfig: str | None, context: str | None,
           watch: bool = False):
    """Kueue's Workloads on idlegpu's admission checks (``cluster.kueue``), or None."""
    c = settings.cluster
    if not c.kueue.admission_checks:
        return None
    from idlegpu.scheduler.adapters.kubernetes.kueue import KueueChecks

    source = KueueChecks.from_config(
        kubeconfig or c.kubeconfig, context or c.context, c.in_cluster,
        checks=c.kueue.admission_checks, node_selector=dict(c.node_selector),
        tolerations=list(c.tolerations), watch=watch)
    return KueueAdmission(source, lambda workload: planned_runtime_s(workload, estimate),
                          pool_gpus=settings.pool.total_gpus, tz=settings.pool.tz,
                          team_of=c.kueue.teams, dry_run=dry_run)


def _run_once(settings, job_store, controller, forecast, estimator, cluster, moment, *,
              dry_run: bool, store: str | None) -> None:
    """``run --once``: one forecast and reconcile pass at ``moment``, its decisions as a
    table; with ``--dry-run`` the manifests alone on stdout (kubectl apply -f -), the rest on
    stderr."""
    from idlegpu.scheduler.service.operations import paused_reason

    out = err_console if dry_run else console
    with out.status("forecasting and deciding..."):
        forecast.refresh(moment)
        report = controller.reconcile_once(moment)
    local = moment.astimezone(settings.pool.tz)
    # (ids whole, never cut: a Kueue Workload's or a user's Job's is namespace/name)
    emit(out, [{"decision": d.action.value, "unit": d.job_id, "gpus": d.gpus,
                "why": d.reason} for d in report.plan.decisions], ONCE_COLUMNS, "table",
         title=f"One pass at {local:%a %Y-%m-%d %H:%M} ({settings.pool.timezone})")
    for error in report.errors:
        err_console.print(_warning(str(error)))
    _say_runtime_model(estimator)
    paused = paused_reason(job_store.admission(), settings.pool.tz)
    if paused:  # nothing was admitted for that, whatever the table says
        err_console.print(_warning(f"{paused}; `idlegpu admission resume` resumes"))
    if dry_run:
        sys.stdout.write(manifest_stream(getattr(cluster, "last_manifests", [])))
        sys.stdout.flush()
    checks = (f", {len(report.checks_written)} Kueue admission-check entr"
              f"{'y' if len(report.checks_written) == 1 else 'ies'} "
              f"{'would be ' if dry_run else ''}written" if report.checks_written else "")
    out.print(
        f"{len(report.created)} Job(s) {'would be ' if dry_run else ''}created, "
        f"{len(report.stopped)} stopped, {len(report.recreated)} recreated after a "
        f"restart{checks}; store: {redact(_store_url(settings, store))}"
    )


def _run_daemon(settings, job_store, controller, forecast, moment, *, store: str | None,
                replay_speed: float | None, kubeconfig: str | None,
                context: str | None) -> None:
    """``run`` without ``--once``: the daemon, until SIGTERM. ``replay_speed`` (a replay from
    ``moment``; None: real time) runs its clock, and so every period of the daemon, that many
    times faster than real time."""
    from idlegpu.scheduler.daemon import Daemon, write_last_month_report

    clock = ReplayClock(moment, replay_speed) if replay_speed is not None else WallClock()
    daemon = Daemon(
        controller,
        reconcile_seconds=settings.daemon.reconcile_seconds,
        backstop_seconds=settings.daemon.backstop_seconds,
        refresh_forecast=forecast.refresh,
        refresh_hour=settings.daemon.forecast_refresh_hour,
        monthly_report=lambda at: write_last_month_report(settings, job_store, at),
        timezone=settings.pool.timezone,
        clock=clock,
        leader=_leader_elector(settings, kubeconfig, context),
        retention_days=settings.store.retention_days,
    )
    # one plain line per event on stderr, for the cluster's log collector
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    for handler in logging.getLogger().handlers:  # urllib3's retries, the API client...
        handler.addFilter(RedactingFilter())
    logging.getLogger("apscheduler").setLevel(logging.WARNING)  # a line per job run is noise
    port = settings.daemon.metrics_port
    replay = (f"; replaying from {moment.astimezone(settings.pool.tz):%Y-%m-%d %H:%M} at "
              f"{replay_speed:g}x" if replay_speed is not None else "")
    if daemon.leader is not None:
        replay += (f"; leader election on lease {daemon.leader.describe()} as "
                   f"{daemon.leader.identity}")
    logging.getLogger("idlegpu.daemon").info(
        "starting on pool %s, store %s, %s%s; SIGTERM stops it gracefully",
        settings.pool.name, _store_url(settings, store),
        f"metrics on :{port}" if port else "no metrics endpoint", replay)
    daemon.run(metrics_port=settings.daemon.metrics_port)


def _instance(settings, job_store) -> str:
    """The identity on this daemon's Jobs: configured, or the pool name and the store's id
    (replicas share a store, so they share it; a second store in the namespace does not)."""
    from idlegpu.scheduler.adapters.kubernetes import label_value

    return settings.cluster.instance or label_value(
        f"{settings.pool.name}-{job_store.store_id()}")


def _admission_recheck(settings):
    """The daemon's own admission rules on each stored unit, right before its Job is made:
    whatever config the submitter ran with, nothing gets past the daemon's."""
    def recheck(row) -> None:
        recheck_unit(row.spec, row.team, settings.admission)

    return recheck


def _stop_timeout(settings) -> float | None:
    """How long a stop may take before its unit is released anyway: the grace period the Job
    gets (checkpointing), plus 10 minutes, unless configured."""
    configured = settings.cluster.stop_timeout_seconds
    return float(configured) if configured else settings.admission.grace_seconds + 600.0


def _leader_elector(settings, kubeconfig: str | None, context: str | None):
    """The Lease elector of ``daemon.leader_election``, or None when it is off."""
    election = settings.daemon.leader_election
    if not election.enabled:
        return None
    from idlegpu.scheduler.adapters.lease import LeaderElector

    c = settings.cluster
    namespace = election.namespace or os.environ.get("POD_NAMESPACE") or c.namespace
    return LeaderElector.from_config(
        kubeconfig or c.kubeconfig, context or c.context, c.in_cluster,
        namespace=namespace, name=election.lease_name,
        identity=election.identity, lease_duration_s=election.lease_duration_seconds,
        renew_deadline_s=election.renew_deadline_seconds,
        retry_period_s=election.retry_period_seconds)


# A plain scalar that some YAML reader takes for something else than a string: YAML 1.1
# (PyYAML; go-yaml v2, which kubectl's sigs.k8s.io/yaml uses) or YAML 1.2 (core schema).
# Matched case-insensitively against the whole string; broader than any one schema on purpose.
_NOT_PLAIN = re.compile(r"""(?ix)
    ~ | null | true | false | yes | no | on | off | y | n | <<? | = | \s*
  | [-+]? \.? (?: inf (?:inity)? | nan )                               # .inf, -.Inf, .NaN
  | [-+]? (?: 0 [box] [0-9a-f_]+                                       # 0x1F, 0o17, 0b101
            | [0-9][0-9_]* (?: \.[0-9_]* )? (?: e [-+]? [0-9_]+ )?      # 17, 017, 1_000, 2e-05
            | \.[0-9_]+ (?: e [-+]? [0-9_]+ )? )                         # .5, .5e3
  | [-+]? [0-9][0-9_]* (?: :[0-5]?[0-9] )+ (?: \.[0-9_]* )?           # 1:30 (base 60, YAML 1.1)
  | [0-9]{4} - [0-9]{1,2} - [0-9]{1,2} (?: [Tt\s] .* )?                # 2026-01-28[T20:00:00Z]
""")


def yaml_needs_quotes(text: str) -> bool:
    """True when ``text`` written as a plain YAML scalar would not read back as this string
    in a YAML 1.1 or YAML 1.2 reader (a number, bool, null, timestamp, merge key...)."""
    return _NOT_PLAIN.fullmatch(text) is not None


def manifest_stream(manifests) -> str:
    """The manifests as one multi-document YAML stream (``---`` before each) that kubectl
    reads back exactly: every string a YAML 1.1 or 1.2 reader would take for a number, bool,
    null or timestamp is single-quoted, no anchors or aliases."""
    import yaml

    class Dumper(yaml.SafeDumper):
        def ignore_aliases(self, data) -> bool:
            return True

    def text(dumper, data: str):
        style = "'" if yaml_needs_quotes(data) else None
        if any(ch in data for ch in "\x85\u2028\u2029"):
            # YAML line breaks: PyYAML writes them raw inside single quotes, where a reader
            # folds them into a space; double quotes escape them (\N, \L, \P)
            style = '"'
        return dumper.represent_scalar("tag:yaml.org,2002:str", data, style=style)

    Dumper.add_representer(str, text)
    return yaml.dump_all(list(manifests), Dumper=Dumper, sort_keys=False, explicit_start=True,
                         allow_unicode=True, width=1 << 20) if manifests else ""


def _cluster(settings, *, dry_run: bool, kubeconfig: str | None, context: str | None,
             instance: str | None = None):
    from idlegpu.scheduler.adapters.kubernetes import KubernetesCluster

    c = settings.cluster
    options = {
        "instance": instance,
        "namespace": c.namespace, "node_selector": dict(c.node_selector),
        "tolerations": list(c.tolerations), "affinity": dict(c.affinity),
        "priority_class": c.priority_class,
        "active_deadline_seconds": c.active_deadline_seconds,
        "ttl_seconds_after_finished": c.ttl_seconds_after_finished,
        "backoff_limit": c.backoff_limit, "service_account": c.service_account,
        "run_as_user": c.run_as_user,
        "job_api_url": c.job_api_url, "token_audience": c.token_audience,
        "token_expiration_seconds": c.token_expiration_seconds,
        "grace_seconds": settings.admission.grace_seconds, "dry_run": dry_run,
    }
    if dry_run and kubeconfig is None and c.kubeconfig is None and not c.in_cluster:
        return KubernetesCluster(None, **options)
    return KubernetesCluster.from_config(kubeconfig or c.kubeconfig, context or c.context,
                                         c.in_cluster, **options)


def _signal_source(settings, frame):
    if frame is not None:
        return HistorySignals(frame, settings)
    from idlegpu.scheduler.adapters.vllm import PrometheusSignals

    return PrometheusSignals(settings)
