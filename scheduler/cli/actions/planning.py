"""What ``idlegpu simulate`` and ``plan`` do (their signatures:
``idlegpu.scheduler.cli.planning``): the admission policy on a history and a job trace, and
tonight's dry run of it over the forecast."""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

import typer
from rich.markup import escape
from rich.text import Text

from idlegpu.forecast.capacity import FREE, pool_usage
from idlegpu.forecast.errors import HistoryError
from idlegpu.forecast.redact import redact
from idlegpu.forecast.schema import infer_step
from idlegpu.forecast.sources import read_history
from idlegpu.forecast.tables import iso_time, write_csv
from idlegpu.scheduler.cli.actions.forecasting import _print_served
from idlegpu.scheduler.cli.common import (
    _check,
    _warning,
    console,
    err_console,
    markup_console,
    markup_err_console,
    parse_time,
)
from idlegpu.scheduler.cli.inputs import (
    _check_horizon,
    _check_services,
    _history_until,
    _load_settings,
    _parse_horizon,
    _planning_estimate,
    _say_runtime_model,
    _store_url,
)
from idlegpu.scheduler.cli.remote import remote_plan
from idlegpu.scheduler.output import (
    FORMATS,
    PLAN_START_COLUMNS,
    PLAN_WAIT_COLUMNS,
    Column,
    emit,
    plain,
)
from idlegpu.scheduler.plan import store_queue, tonight
from idlegpu.scheduler.refresh import Refresher
from idlegpu.scheduler.reports import useful
from idlegpu.scheduler.simulate import (
    PLACEMENTS,
    POLICIES,
    delay_events,
    lost_work,
    simulate_policies,
    trace_jobs,
)
from idlegpu.scheduler.simulate import sweep as sweep_policies
from idlegpu.scheduler.simulate.cache import load_profiles, profiles_path, save_profiles
from idlegpu.scheduler.specs import SpecError, load_trace, parse_duration
from idlegpu.scheduler.types import JobState


def simulate(*, history: Path, jobs: Path, config: Path, runs: Path | None, policies: str,
             days: int | None, warmup_days: int, out: Path, placement: str,
             sweep: str | None, saves_on_stop: bool, checkpoint_notice: str,
             notice_answer: str, unanswered_share: float, workers: int | None,
             forecast_cache: Path | None = None) -> None:
    """``idlegpu simulate``."""
    names = [p.strip() for p in policies.split(",") if p.strip()]
    unknown = [p for p in names if p not in POLICIES]
    if unknown:
        raise typer.BadParameter(f"unknown policy {', '.join(unknown)}; choose from "
                                 f"{', '.join(POLICIES)}", param_hint="--policies")
    confidences = _confidences(sweep) if sweep is not None else []
    _check(days is None or days >= 1, "use at least 1 day", "--days")
    _check(warmup_days >= 0, "use 0 or more days", "--warmup-days")
    _check(workers is None or workers >= 1, "use 1 or more processes", "--workers")
    _check(0.0 <= unanswered_share <= 1.0, "use a share from 0 to 1", "--unanswered-share")
    notice_options = {
        "checkpoint_notice_s": _duration_s(checkpoint_notice, "--checkpoint-notice", "10m"),
        "notice_answer_s": _duration_s(notice_answer, "--notice-answer", "2m"),
        "unanswered_share": unanswered_share,
    }
    _check(placement in PLACEMENTS, f"choose from {', '.join(PLACEMENTS)}", "--placement")
    settings = _load_settings(config)
    _check(placement == "pool" or bool(settings.pool.nodes),
           "the config has no pool.nodes (node shapes, e.g. [{gpus: 8, count: 11}]); add them "
           "or use --placement pool", "--placement")
    frame = _check_services(read_history(history), settings)
    entries = load_trace(jobs, settings.admission)
    estimator = _planning_estimate(settings, runs)
    sim_jobs = trace_jobs(entries, estimator.seconds)
    _say_runtime_model(estimator)
    start, end = _simulated_span(frame, sim_jobs, warmup_days, days)
    out.mkdir(parents=True, exist_ok=True)
    cached = {}
    if workers is None:
        workers = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (
            os.cpu_count() or 1)
    keep = None
    if forecast_cache is not None and "forecast" in names:
        found, keep = _kept_forecasts(forecast_cache, frame, settings, start, end, workers)
        if found is not None:
            cached["forecast_profiles"] = found
    results = _run_policies(frame, settings, sim_jobs, names, start, end, workers,
                            placement=placement, saves_on_stop=saves_on_stop, **notice_options,
                            **cached, **({"on_profiles": keep} if keep else {}))
    if keep is not None:
        keep.say()
    rows, table, curves, losses, delays = _policy_tables(results, settings, out)
    chart = _print_policies(table, curves, settings, out, start=start, end=end,
                            requests=len(entries), units=len(sim_jobs), placement=placement)
    _print_delays_and_losses(names, frame, settings, losses, delays, out)
    console.print(f"tables: {out / 'policies.csv'}, runs_<policy>.csv, lost.csv (lost work by "
                  f"cause, overrun, checkpointing and admission hour), delays.csv (each step "
                  f"the service waited for GPUs units held); chart: {chart}")
    if confidences:
        _frontier(frame, settings, sim_jobs, confidences, rows, out, start=start, end=end,
                  placement=placement, saves_on_stop=saves_on_stop, workers=workers,
                  **notice_options)


class _Keeper:
    """Keeps the forecast policy's profiles in ``path`` when the simulation made them (its
    ``on_profiles``); ``say`` tells where, or why not."""

    def __init__(self, path: Path):
        self.path = path
        self.kept = False
        self.error: OSError | None = None

    def __call__(self, profiles) -> None:
        try:
            save_profiles(self.path, profiles)
            self.kept = True
        except OSError as error:  # the simulation goes on: only a later run is slower
            self.error = error

    def say(self) -> None:
        if self.kept:
            console.print(f"forecasts kept in {escape(str(self.path))}")
        elif self.error is not None:
            err_console.print(f"could not keep the forecasts in {escape(str(self.path))}: "
                              f"{escape(self.error.strerror or str(self.error))}")


def _kept_forecasts(directory: Path, frame, settings, start, end, workers: int):
    """The forecast policy's nightly profiles read from ``directory``, or (None and) what
    keeps them there once the simulation has made them (its refits in ``workers`` processes,
    beside the other policies)."""
    try:
        directory.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=directory):
            pass  # writable: a run that cannot keep its forecasts is told so before it runs
    except OSError as error:
        raise typer.BadParameter(f"cannot keep forecasts in {directory}: "
                                 f"{error.strerror or error}; give a directory you can "
                                 "write to", param_hint="--forecast-cache") from None
    path = profiles_path(directory, frame, settings, start.to_pydatetime(), end.to_pydatetime())
    found = load_profiles(path)
    if found is not None:
        console.print(f"forecasts read from {escape(str(path))}")
        return found, None
    return None, _Keeper(path)


def _simulated_span(frame, sim_jobs, warmup_days: int, days: int | None):
    """The simulated stretch: from the first whole hour after both the warm-up history and the
    trace's first submission, for ``days`` (or to the history's end)."""
    import pandas as pd

    first, last = frame["ds"].min(), frame["ds"].max()
    start = max(first + pd.Timedelta(days=warmup_days), min(j.submit_at for j in sim_jobs))
    start = pd.Timestamp(start).ceil("h")
    end = last if days is None else min(last, start + pd.Timedelta(days=days))
    if end <= start:
        raise typer.BadParameter("nothing to simulate: the history ends before the trace starts")
    return start, end


def _run_policies(frame, settings, sim_jobs, names, start, end, workers: int, *,
                  placement: str, saves_on_stop: bool, **notice_options):
    """Each policy simulated over ``start``-``end`` (``workers`` at once), with a progress
    line per policy (and the forecast's evening refits)."""
    from rich.progress import Progress

    with Progress(console=err_console, transient=True) as progress:
        tasks = {}
        for name in names:
            if name == "forecast" and "forecast_profiles" not in notice_options:
                tasks[name, "refreshes"] = progress.add_task("forecast: refitting each evening",
                                                             total=None)
            tasks[name, "steps"] = progress.add_task(escape(plain(f"simulating {name}")),
                                                     total=None)

        def advance(name: str, what: str, done: int, total: int) -> None:
            task = tasks.get((name, what))
            if task is not None:
                progress.update(task, completed=done, total=total)

        return simulate_policies(
            frame, settings, sim_jobs, names, start=start.to_pydatetime(),
            end=end.to_pydatetime(), workers=workers, on_progress=advance,
            placement=placement, saves_on_stop=saves_on_stop, **notice_options)


def _policy_tables(results, settings, out: Path):
    """Each policy's runs written (runs_<policy>.csv), its metrics in policies.csv; returns
    the metrics by policy, their table, the cumulative useful GPU-hours and each policy's lost
    work and service delays."""
    import pandas as pd

    rows, cumulative, losses, delays = {}, {}, [], []
    for name, result in results.items():
        rows[name] = result.metrics
        write_csv(result.runs, out / f"runs_{name}.csv", tz=settings.pool.timezone,
                  decimals=None)  # read back by `idlegpu report`: every digit
        losses.append(lost_work(result.runs, settings.pool.timezone).assign(policy=name))
        delays.append(result.delays.assign(policy=name))
        kept = useful(result.runs)
        ends = pd.to_datetime(result.runs["end"], utc=True).dt.tz_convert(
            settings.pool.timezone).dt.tz_localize(None)
        cumulative[name] = pd.Series(kept, index=ends).groupby(level=0).sum().cumsum()
    table = pd.DataFrame(rows).T
    table.index.name = "policy"
    write_csv(table, out / "policies.csv", index=True)
    curves = pd.concat(cumulative, axis=1, sort=True).ffill().fillna(0)
    return rows, table, curves, losses, delays


def _print_policies(table, curves, settings, out: Path, *, start, end, requests: int,
                    units: int, placement: str):
    """The policies' chart (policies.png, returned) and their metrics side by side."""
    from rich.table import Table

    from idlegpu.forecast import plots  # matplotlib: loaded for a chart

    chart = plots.policy_chart(
        table, curves, out / "policies.png",
        title=f"{settings.pool.name}: {units} job units, "
        f"{start:%Y-%m-%d} to {end:%Y-%m-%d}",
    )
    where = "" if placement == "pool" else f", services placed {placement} on pool.nodes"
    view = Table(title=f"Policies over {(end - start).days} days, {requests} requests "
                 f"({units} units){where}", title_justify="left")
    view.add_column("metric")
    for name in table.index:
        view.add_column(name, justify="right")
    for col in table.columns:
        view.add_row(col, *[f"{v:,.3g}" if abs(v) < 100 else f"{v:,.0f}" for v in table[col]])
    console.print(view)
    return chart


def _print_delays_and_losses(names, frame, settings, losses, delays, out: Path) -> None:
    """lost.csv and delays.csv, and per policy the service's waits (those that began with a
    rise beyond the headroom) and the work lost by cause."""
    import pandas as pd

    lost = pd.concat(losses, ignore_index=True)
    lost = lost[["policy", *[c for c in lost.columns if c != "policy"]]]
    write_csv(lost, out / "lost.csv")
    waited = pd.concat(delays, ignore_index=True)[["policy", "time", "gpus_short",
                                                   "service_rise_gpus"]]
    write_csv(waited, out / "delays.csv", tz=settings.pool.timezone)
    step_s = int(frame["ds"].drop_duplicates().sort_values().diff().median().total_seconds())
    headroom = settings.pool.headroom_gpus
    for name in names:
        events = delay_events(waited[waited["policy"] == name], step_s, headroom)
        if len(events):
            jumps = events[events["above_headroom"]]
            console.print(
                f"{name}: the service waited {events['gpu_minutes'].sum():,.0f} GPU-min in "
                f"{len(events)} events; {len(jumps)} of them ({jumps['gpu_minutes'].sum():,.0f} "
                f"GPU-min) began with the service rising more than the headroom "
                f"({headroom} GPUs) within one step", highlight=False, markup=False)
    for name in names:
        causes = lost[(lost["policy"] == name) & (lost["by"] == "cause")]
        if len(causes):
            console.print(f"{name} lost " + ", ".join(
                f"{r.lost_gpu_hours:,.0f} GPU-h to {r.value} ({r.stops} stops)"
                for r in causes.sort_values("lost_gpu_hours", ascending=False).itertuples()),
                highlight=False, markup=False)


def _confidences(text: str) -> list[float]:
    """``--sweep``'s comma-separated confidences, each a valid ``admission.confidence``."""
    values = []
    for part in (p.strip() for p in text[:1000].split(",")):
        if not part:
            continue
        try:
            value = float(part)
        except ValueError:
            raise typer.BadParameter(f"{part[:40]!r} is not a number; give confidences such as "
                                     "0.5,0.7,0.8,0.9,0.95", param_hint="--sweep") from None
        _check(0.5 <= value < 1.0, f"{value:g} is not from 0.5 up to (not including) 1, as "
               "admission.confidence (the quantile of the free-GPU forecast admission plans "
               "on)", "--sweep")
        values.append(value)
    _check(bool(values) and len(values) <= 20, "give 1 to 20 confidences, e.g. "
           "0.5,0.7,0.8,0.9,0.95", "--sweep")
    return sorted(set(values))


def _duration_s(text: str, option: str, example: str) -> float:
    """A duration option's seconds (0 and up to a day), or a clear error naming the option."""
    if text.strip() == "0":
        return 0.0
    try:
        seconds = parse_duration(text)
    except (SpecError, ValueError) as exc:
        raise typer.BadParameter(f"{text[:40]!r}: {exc}; use a duration such as {example}, "
                                 "or 0", param_hint=option) from None
    _check(0 <= seconds <= 86400, f"{text[:40]!r}: use a duration from 0 to 24h", option)
    return float(seconds)


def _frontier(frame, settings, sim_jobs, confidences, rows, out: Path, *, start, end,
              placement: str, saves_on_stop: bool = False, workers: int = 1,
              **options) -> None:
    """``simulate --sweep``: the forecast policy at each confidence beside the policies just
    run (and any not run yet), as a table, frontier.csv and frontier.png (``workers`` points
    at once)."""
    import pandas as pd
    from rich.progress import Progress
    from rich.table import Table

    from idlegpu.forecast import plots  # matplotlib: loaded for a chart

    references = {name: metrics for name, metrics in rows.items() if name != "forecast"}
    with Progress(console=err_console, transient=True) as progress:
        task = progress.add_task(f"sweeping {len(confidences)} confidences", total=None)
        frontier = sweep_policies(
            frame, settings, sim_jobs, confidences, start=start.to_pydatetime(),
            end=end.to_pydatetime(), references=references, placement=placement,
            saves_on_stop=saves_on_stop, workers=workers, **options,
            on_point=lambda n, total: progress.update(task, completed=n, total=total))
    write_csv(frontier, out / "frontier.csv")
    chart = plots.frontier_chart(
        frontier, out / "frontier.png",
        title=f"{settings.pool.name}: the forecast policy at each confidence, "
        f"{start:%Y-%m-%d} to {end:%Y-%m-%d}")
    view = Table(title="Frontier: useful GPU-hours against lost work and service delay",
                 title_justify="left")
    for column in ("policy", "confidence", "useful GPU-h", "lost GPU-h", "delay GPU-min",
                   "finished"):
        view.add_column(column, justify="left" if column == "policy" else "right")
    for row in frontier.itertuples():
        view.add_row(row.policy, "" if pd.isna(row.confidence) else f"{row.confidence:g}",
                     f"{row.useful_gpu_hours:,.0f}", f"{row.lost_gpu_hours:,.0f}",
                     f"{row.service_delay_gpu_minutes:,.0f}", f"{row.jobs_finished:,.0f}")
    console.print(view)
    console.print(f"frontier: {out / 'frontier.csv'}; chart: {chart}")


def plan(*, history: Path | None, config: Path, jobs: Path | None, store: str | None,
         runs: Path | None, now: str | None, from_last_sample: bool, horizon: str,
         queue_days: float, out: Path, server: str | None, token_file: Path | None,
         output: str) -> None:
    """``idlegpu plan``."""
    import pandas as pd

    _check(queue_days > 0, "use a number of days above 0", "--queue-days")
    _check(output in FORMATS, f"use one of {', '.join(FORMATS)}", "--output")
    span = _parse_horizon(horizon)
    if server:
        _check(history is None and jobs is None and store is None and runs is None
               and now is None, "the server plans from its own history, queue and clock; "
               "drop --history, --jobs, --store, --runs and --now", "--server")
        return remote_plan(markup_console, markup_err_console, server, token_file,
                           span.total_seconds() / 3600)
    if history is None:
        raise typer.BadParameter("give the pool's history (or --server URL for the job "
                                 "API's plan)", param_hint="--history")
    settings = _load_settings(config)
    tz = settings.pool.timezone
    frame = _history_until(history, now, ["replicas"], from_last_sample)
    _check_horizon(span, frame, horizon)
    frame = _check_services(frame, settings)
    moment = frame["ds"].max() + infer_step(frame)  # right after the newest sample
    if now is not None:  # past the newest sample only with --from-last-sample: from after it
        at = pd.Timestamp(parse_time(now, name="--now"))
        moment = min(moment, at) if from_last_sample else at
    past = frame[frame["ds"] < moment]
    if past.empty:
        raise HistoryError(f"{history}: no history before {moment}")
    confidence = settings.admission.confidence
    with console.status("forecasting the pool..."):
        # the daemon's refresh: services whose forecasts under-covered lately are planned wider
        refreshed = Refresher(settings, horizon=span).refresh(past, moment.to_pydatetime())
    for line in refreshed.warnings():
        err_console.print(_warning(line))
    estimator = _planning_estimate(settings, runs)
    start = refreshed.profile.start
    if jobs is not None:
        queued = _queue_of_trace(jobs, settings, estimator.seconds, start, queue_days)
    else:
        queued = _queue_of_store(settings, store, estimator.seconds, start)
    _say_runtime_model(estimator)
    planned = tonight(settings, refreshed, queued.queue, running=queued.running,
                      team_usage=queued.usage, horizon=span, start=start)
    out.mkdir(parents=True, exist_ok=True)
    write_csv(planned.windows, out / "windows.csv", tz=tz, decimals=3)
    rows = _plan_rows(planned.plan, queued.blocked)
    write_csv(rows, out / "plan.csv", tz=tz)
    if output in ("csv", "json"):  # the rows of plan.csv on stdout, for scripts
        data = [{k: (None if pd.isna(v) else v) for k, v in row.items()}
                for row in rows.to_dict("records")]
        emit(console, data, [Column(c, c) for c in rows.columns], output, tz=tz)
    else:
        _print_plan(planned, refreshed, queued, out, start=start, tz=tz, confidence=confidence,
                    output=output, from_trace=jobs is not None)
    _free_gpu_chart(settings, frame, moment, span, confidence, refreshed.free, planned.windows,
                    out, tz, refreshed.likely)


@dataclass
class _PlanQueue:
    """What ``plan`` plans with: the waiting units, the running ones (they hold their GPUs),
    the teams' recent use (fair share), the units waiting for a previous pipeline step, where
    the queue came from, and (an empty store) the units queued after the plan's start."""

    queue: list
    running: list
    usage: dict
    blocked: list
    source: str
    later: list


def _queue_of_trace(jobs: Path, settings, estimate, start, queue_days: float) -> _PlanQueue:
    """``plan --jobs``: the requests of a job trace submitted in the ``queue_days`` before the
    plan's start; nothing runs yet."""
    import pandas as pd

    entries = [e for e in load_trace(jobs, settings.admission)
               if start - pd.Timedelta(days=queue_days) <= e.submit_at <= start]
    units = trace_jobs(entries, estimate)
    return _PlanQueue(
        queue=[u.as_waiting() for u in units if not u.depends_on], running=[], usage={},
        blocked=[u for u in units if u.depends_on],
        source=f"{jobs} ({len(entries)} requests submitted in the {queue_days:g} days before)",
        later=[])


def _queue_of_store(settings, store: str | None, estimate, start) -> _PlanQueue:
    """``plan`` on the job store: what already runs holds its GPUs, and fair share counts what
    teams used lately."""
    from idlegpu.scheduler.adapters.store import JobStore
    later: list = []
    with JobStore(_store_url(settings, store)) as job_store:
        queue, running, usage = store_queue(job_store, settings, estimate, start)
        if not queue and not running:  # say why the plan is empty
            later = [u for u in job_store.find_units(states=(JobState.QUEUED,))
                     if u.submitted_at > start]
    # a PostgreSQL URL carries its password
    return _PlanQueue(queue, running, usage, [], redact(_store_url(settings, store)), later)


def _plan_rows(result, blocked):
    """plan.csv's rows: the units that start, then those that wait, each with its reason."""
    import pandas as pd

    return pd.DataFrame(
        [r.__dict__ for r in result.runs]
        + [{"job_id": job.id, "team": job.team, "kind": job.kind, "gpus": job.gpus,
            "start": None, "end": None, "outcome": "waits", "reason": reason}
           for job, reason in result.waiting]
        + [{"job_id": unit.id, "team": unit.team, "kind": unit.kind, "gpus": unit.gpus,
            "start": None, "end": None, "outcome": "waits",
            "reason": "waits for its previous pipeline step"} for unit in blocked],
        columns=["job_id", "team", "kind", "gpus", "start", "end", "outcome", "reason"])


def _print_plan(planned, refreshed, queued: _PlanQueue, out: Path, *, start, tz: str,
                confidence: float, output: str, from_trace: bool) -> None:
    """The plan as ``plan`` shows it in a table: the windows, what forecasts each service,
    the units that start and those that wait (and why), and the GPU-hours planned."""
    import pandas as pd

    result, table, blocked = planned.plan, planned.windows, queued.blocked
    local = pd.Timestamp(start).tz_convert(tz)
    console.print(Text.assemble((f"Plan from {local:%a %Y-%m-%d %H:%M} ({tz})", "bold"),
                                f", free GPUs promised with {confidence:.0%} confidence; "
                                f"queue: {plain(queued.source)}"))
    if not table.empty:
        console.print(f"largest idle window: {_largest_window(table)}")
    median = planned.median_windows
    if median is not None and not median.empty:
        console.print(f"units that checkpoint plan on the median: {_largest_window(median)} "
                      "in the median forecast")
    _print_served(refreshed.forecast, "What forecasts each service")
    starts = [{"job": r.job_id, "team": r.team, "kind": r.kind, "gpus": r.gpus,
               "from": pd.Timestamp(r.start).tz_convert(tz).strftime("%a %H:%M"),
               "until": pd.Timestamp(r.end).tz_convert(tz).strftime("%a %H:%M"),
               "then": r.outcome} for r in result.runs]
    emit(console, starts, PLAN_START_COLUMNS, output, title="Jobs that start")
    if result.waiting or blocked:
        waits = [{"job": job.id, "gpus": job.gpus, "why": reason}
                 for job, reason in result.waiting]
        waits += [{"job": unit.id, "gpus": unit.gpus,
                   "why": "waits for its previous pipeline step"} for unit in blocked]
        emit(console, waits, PLAN_WAIT_COLUMNS, output, title="Jobs that wait, and why")
    if not from_trace and not queued.queue and not queued.running:
        _say_why_empty(queued, local, tz)
    harvest = sum(r.gpus * (r.end - r.start).total_seconds() / 3600 for r in result.runs)
    console.print(Text.assemble(
        (f"{len(result.runs)} job unit(s) start, {harvest:,.0f} GPU-hours planned;",
         "bold green"),
        f" {len(result.waiting) + len(blocked)} wait. "
        f"Files: {plain(out / 'plan.csv')}, {plain(out / 'windows.csv')}, "
        f"{plain(out / 'free_gpus.png')}"))


def _say_why_empty(queued: _PlanQueue, local, tz: str) -> None:
    """An empty plan from the store: its units were all queued later, or there are none."""
    if queued.later:
        first = min(u.submitted_at for u in queued.later)
        console.print(f"The queue was empty at {iso_time(local)}: the store's "
                      f"{len(queued.later):,} queued unit(s) were all submitted later (the "
                      f"first at {iso_time(first, tz)}); pass a later --now to plan with them",
                      highlight=False)
    else:
        console.print(f"The queue at {plain(queued.source)} is empty: queue requests with "
                      "`idlegpu submit`, or pass --jobs to plan a job trace",
                      highlight=False)


def _largest_window(windows) -> str:
    """The window of most GPU-hours of a ``windows_frame``, as ``plan`` says it."""
    best = windows.loc[(windows["hours"] * windows["gpus"]).idxmax()]
    return (f"{best['gpus']} GPUs from {best['start']:%a %H:%M} to {best['end']:%a %H:%M} "
            f"({best['hours']:.1f} h)")


def _free_gpu_chart(settings, frame, moment, span, confidence, free, table, out, tz,
                    likely=None) -> None:
    from idlegpu.forecast import plots  # matplotlib: loaded for a chart

    actual = pool_usage(frame[frame["ds"] < moment], settings)[FREE]
    curves = {}  # the promise last: the chart shades it
    if likely is not None:
        curves["median (units that checkpoint plan on it)"] = likely.reindex(free.index)
    curves[f"free with {confidence:.0%} confidence"] = free
    plots.free_gpu_chart(
        actual[actual.index > actual.index.max() - 2 * span],
        curves, table, out / "free_gpus.png", tz=tz,
        capacity=settings.pool.lendable_gpus,
        title=f"{settings.pool.name}: free GPUs and tonight's windows",
    )
