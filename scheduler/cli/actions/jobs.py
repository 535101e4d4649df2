"""What ``idlegpu submit``, ``queue``, ``cancel`` and ``admission`` do (their signatures:
``idlegpu.scheduler.cli.jobs``): the job store's queue, as the local operator (``cli:<login>``)
through the services, or through the job API (``--server``, ``idlegpu.scheduler.cli.remote``).
The job store comes with the daemon extra: the functions that use it import it."""

from __future__ import annotations

from datetime import timezone
from pathlib import Path

from idlegpu.forecast.redact import redact
from idlegpu.scheduler.cli.common import (
    _check,
    _now,
    console,
    markup_console,
    markup_err_console,
)
from idlegpu.scheduler.cli.inputs import (
    _optional_config,
    _store_url,
)
from idlegpu.scheduler.cli.remote import (
    print_admission,
    remote_admission,
    remote_cancel,
    remote_queue,
    remote_submit,
)
from idlegpu.scheduler.config import AdmissionConfig
from idlegpu.scheduler.output import FORMATS, Column, emit, plain
from idlegpu.scheduler.runtime import RuntimeEstimator, load_runs
from idlegpu.scheduler.specs import format_duration, load_request

QUEUE_COLUMNS = (
    Column("unit", "unit", identifier=True), Column("request", "request", identifier=True,
                                                     wide_only=True),
    Column("team", "team"), Column("step", "step", wide_only=True),
    Column("gpus", "GPUs", right=True), Column("state", "state"),
    Column("tries", "tries", right=True, wide_only=True),
    Column("done", "done", right=True, wide_only=True),
    Column("estimate", "estimate", right=True), Column("submitted", "submitted"))
QUEUE_DATA = (
    Column("unit", "unit"), Column("request", "request"), Column("team", "team"),
    Column("step", "step"), Column("gpus", "GPUs"), Column("state", "state"),
    Column("attempts", "attempts"), Column("preemptions", "preemptions"),
    Column("done_s", "done_s"), Column("estimate_s", "estimate_s"),
    Column("estimate_source", "estimate_source"), Column("submitted", "submitted"),
    Column("notice_deadline", "notice_deadline"))


ORIGIN_COLUMN = Column("origin", "origin")
EXTERNAL_DATA = (Column("reason", "reason"), Column("start_at", "start_at"),
                 Column("stop_by", "stop_by"))


def _external_row(unit, tz) -> dict:
    """A unit outside the store (a Kueue Workload, a user's Job) as a queue row: its state
    says why it waits and when it should start, as the daemon's last pass saw it."""
    state = unit.state
    if unit.reason:
        state += f": {unit.reason}"
    if unit.start_at is not None and "first fits" not in unit.reason:
        state += f" (estimated start {unit.start_at.astimezone(tz):%a %H:%M})"
    return {"unit": unit.id, "origin": "Kueue Workload" if unit.origin == "kueue" else "Job",
            "request": "", "team": unit.team, "step": "", "gpus": unit.gpus, "state": state,
            "tries": "", "done": "", "estimate": "", "submitted": None,
            "reason": unit.reason, "start_at": unit.start_at, "stop_by": unit.stop_by}


def submit(*, file: Path, config: Path | None, store: str | None, idempotency_key: str | None,
           now: str | None, server: str | None, token_file: Path | None) -> None:
    """``idlegpu submit``."""
    if server:
        _check(now is None and store is None, "--server decides the time and the store; drop "
               "--now and --store", "--server")
        return remote_submit(markup_console, markup_err_console, server, token_file, file,
                             idempotency_key)
    from idlegpu.scheduler.adapters.store import JobStore
    from idlegpu.scheduler.service import submissions
    from idlegpu.scheduler.service.identity import cli_identity
    settings = _optional_config(config)
    request = load_request(file, settings.admission if settings is not None else None,
                           nodes=settings.pool.nodes if settings is not None else ())
    when = _now(now)
    with JobStore(_store_url(settings, store)) as job_store:
        done = submissions.submit(job_store, settings, cli_identity(request.team), request, when,
                                  idempotency_key=idempotency_key)
    request_id, units = done.request_id, done.units
    if not done.created:
        console.print(f"{request.name} was already submitted as {request_id} "
                      "(same --idempotency-key); nothing queued")
        return
    steps = len({u.step_index for u in units})
    console.print(
        f"queued {request.name} ({request.team}, {request.kind}) as {request_id}: "
        f"{len(units)} unit(s) in {steps} step(s), up to {max(u.gpus for u in units)} GPUs each; "
        f"`idlegpu queue` shows them, `idlegpu cancel {request_id}` withdraws them"
    )


def queue(*, config: Path | None, store: str | None, all_units: bool, runs: Path | None,
          server: str | None, token_file: Path | None, scope: str, output: str) -> None:
    """``idlegpu queue``."""
    _check(output in FORMATS, f"use one of {', '.join(FORMATS)}", "--output")
    if server:
        _check(scope in ("mine", "team", "all"), "use mine, team or all", "--scope")
        settings = _optional_config(config)
        tz = settings.pool.tz if settings is not None else timezone.utc
        return remote_queue(markup_console, markup_err_console, server, token_file, scope,
                            all_units, tz, output)
    from idlegpu.scheduler.adapters.store import JobStore
    settings = _optional_config(config)
    admission = settings.admission if settings is not None else AdmissionConfig()
    tz = settings.pool.tz if settings is not None else timezone.utc
    estimator = RuntimeEstimator.from_config(load_runs(runs) if runs else None, admission)
    with JobStore(_store_url(settings, store)) as job_store:
        rows = job_store.queue(include_terminal=all_units)
        notices = {n.unit_id: n for n in job_store.open_notices()}
        notice_counts = job_store.notice_counts()
        external = [u for u in job_store.external_units() if all_units or u.state != "ended"]
    if not rows and not external:
        console.print("the queue is empty" + ("" if all_units else " (--all shows ended units)"))
        return
    listed = []
    for row in rows:
        estimate = estimator.estimate(row.spec)
        state = row.state.value
        if row.cancel_requested_at is not None and row.state.holds_gpus():
            state += " (stopping)"
        elif row.state.is_terminal() and row.reason:
            state += f": {row.reason}"
        notice = notices.get(row.id)
        if notice is not None and row.state.holds_gpus():
            state += (f" (checkpoint notice until "
                      f"{notice.deadline.astimezone(tz):%H:%M:%S})")
        listed.append({
            "unit": row.id, "request": row.request_id, "team": row.team,
            "step": f"{row.step}[{row.member}]" if row.member else row.step, "gpus": row.gpus,
            "state": state, "tries": f"{row.attempts}/{row.preemptions}",
            "attempts": row.attempts, "preemptions": row.preemptions,
            "done": format_duration(row.work_done_s) if row.work_done_s else "",
            "done_s": row.work_done_s,
            "estimate": f"{format_duration(estimate.seconds)} ({estimate.source})",
            "estimate_s": estimate.seconds, "estimate_source": estimate.source,
            "submitted": row.submitted_at,
            "notice_deadline": notice.deadline if notice is not None else None})
    columns = QUEUE_COLUMNS if output in ("table", "wide") else QUEUE_DATA
    if external:  # the units outside the store, with where they come from
        for listed_row in listed:
            listed_row["origin"] = "request"
        listed += [_external_row(unit, tz) for unit in external]
        columns = (*columns[:1], ORIGIN_COLUMN, *columns[1:],
                   *(EXTERNAL_DATA if output not in ("table", "wide") else ()))
    emit(console, listed, columns, output,
         title=f"job queue ({len(rows) + len(external)} unit(s))", tz=tz)
    if output not in ("table", "wide"):
        return
    counts: dict[str, int] = {}
    for row in rows:
        counts[row.state.value] = counts.get(row.state.value, 0) + 1
    for unit in external:
        origin = "Kueue Workload" if unit.origin == "kueue" else "Job"
        counts[f"{unit.state} ({origin})"] = counts.get(f"{unit.state} ({origin})", 0) + 1
    console.print(", ".join(f"{n} {s}" for s, n in counts.items())
                  + "; tries = admissions/preemptions; estimate source: history, model, user, "
                    "default (a guess)")
    if notice_counts["sent"]:
        console.print(
            f"checkpoint notices: {notice_counts['sent']} sent, {notice_counts['answered']} "
            f"answered in time, {notice_counts['missed']} missed (stopped at the deadline), "
            f"{notice_counts['cut']} cut short by the service, {notice_counts['open']} under "
            "way")


def cancel(*, job_id: str, config: Path | None, store: str | None, reason: str,
           now: str | None, server: str | None, token_file: Path | None) -> None:
    """``idlegpu cancel``."""
    if server:
        _check(now is None and store is None, "--server decides the time and the store; drop "
               "--now and --store", "--server")
        return remote_cancel(markup_console, markup_err_console, server, token_file, job_id,
                             reason)
    from idlegpu.scheduler.adapters.store import JobStore
    from idlegpu.scheduler.service import submissions
    from idlegpu.scheduler.service.identity import cli_identity

    settings = _optional_config(config)
    with JobStore(_store_url(settings, store)) as job_store:
        result = submissions.cancel(job_store, cli_identity(), job_id, _now(now), reason)
    if result.cancelled:
        console.print(f"cancelled {len(result.cancelled)} queued unit(s): "
                      + plain(", ".join(result.cancelled)), highlight=False, soft_wrap=True)
    if result.to_stop:
        console.print(f"{len(result.to_stop)} unit(s) hold GPUs and will be stopped by the "
                      "admission daemon: " + plain(", ".join(result.to_stop)), highlight=False,
                      soft_wrap=True)
    if not result.cancelled and not result.to_stop:
        console.print(f"nothing to cancel: every unit of {plain(job_id)} has already ended",
                      highlight=False)


def admission(*, action: str, config: Path | None, store: str | None, server: str | None,
              token_file: Path | None, reason: str | None) -> None:
    """`idlegpu admission ACTION`: on the store of the config (or --store), or through the
    job API (--server); both audited, both idempotent."""
    if server:
        _check(store is None, "--server decides the store; drop --store", "--server")
        return remote_admission(markup_console, markup_err_console, server, token_file,
                                action, reason)
    from idlegpu.scheduler.adapters.store import JobStore
    from idlegpu.scheduler.service import operations
    from idlegpu.scheduler.service.identity import cli_identity
    from idlegpu.scheduler.service.operations import paused_reason

    settings = _optional_config(config)
    tz = settings.pool.tz if settings is not None else timezone.utc
    url = _store_url(settings, store)
    when = _now(None)
    with JobStore(url) as job_store:
        if action == "pause":
            change = operations.pause(job_store, cli_identity(), reason, when, tz)
        elif action == "resume":
            change = operations.resume(job_store, cli_identity(), when)
        else:
            change = None
        state = change.state if change else job_store.admission()
    message = None
    if change is not None and not change.changed:
        message = (f"admission was already paused by {state.by}; nothing changed"
                   if state.paused else "admission was not paused; nothing changed")
    print_admission(markup_console, state.paused,
                    paused_reason(state, tz) or "admission is open", action,
                    change.changed if change else True, message, redact(url))

