"""What a report says, in order: its sections as (kind, payload) pairs, plain text that each
renderer (``render_markdown``, ``render_html``) escapes its own way."""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd

from idlegpu.forecast.nodes import MULTI_NODE
from idlegpu.scheduler.reports.build import Report
from idlegpu.scheduler.reports.charts import COVERAGE_CHART
from idlegpu.scheduler.reports.formatting import (
    format_change,
    format_gpus,
    format_hours,
    format_money,
    format_share,
)


def _summary_rows(report: Report) -> tuple[list[str], list[list[str]]]:
    cur = report.currency
    headers = ["month", "days", "useful GPU-hours", "GPUs (12 h)", "GPUs (24 h)",
               "change vs prev. month", "lost GPU-hours", "preemptions", "jobs run",
               "jobs finished", f"savings ({cur})", f"cumulative savings ({cur})",
               "idle GPU-hours", "share of idle used"]
    rows = [
        [r.month, str(r.days), format_hours(r.useful_gpu_hours), format_gpus(r.gpus_12h),
         format_gpus(r.gpus_24h), format_change(r.mom_change), format_hours(r.lost_gpu_hours),
         f"{r.preemptions:,}", f"{r.jobs_run:,}", f"{r.jobs_finished:,}",
         format_money(r.savings, cur), format_money(r.cumulative_savings, cur),
         format_hours(r.idle_gpu_hours), format_share(r.idle_share_used)]
        for r in report.summary.itertuples()
    ]
    return headers, rows


def _breakdown_rows(frame: pd.DataFrame, by: str, currency: str):
    headers = [by, "jobs run", "jobs finished", "useful GPU-hours", "share", "lost GPU-hours",
               "preemptions", f"savings ({currency})"]
    rows = [
        [str(getattr(r, by)), f"{r.jobs_run:,}", f"{r.jobs_finished:,}",
         format_hours(r.useful_gpu_hours), format_share(r.share), format_hours(r.lost_gpu_hours),
         f"{r.preemptions:,}", format_money(r.savings, currency)]
        for r in frame.itertuples()
    ]
    return headers, rows


def _headline(report: Report) -> list[str]:
    r = report.row
    cur = report.currency
    lines = [
        (f"**{format_hours(r.useful_gpu_hours)} useful GPU-hours** in {r.month} "
        f"({r.days} days): the equivalent of **{format_gpus(r.gpus_12h)} GPUs** lent 12 hours "
        f"a day, or {format_gpus(r.gpus_24h)} GPUs around the clock "
        f"({format_change(r.mom_change)} vs the month before)."),
        (f"**Savings {format_money(r.savings, cur)}** at {format_money(report.price, cur)} per "
        f"GPU-hour; {format_money(r.cumulative_savings, cur)} over "
        f"{report.months[0].label} to {report.months[-1].label}."),
        (f"{r.jobs_run:,} jobs ran and {r.jobs_finished:,} finished; {r.preemptions:,} "
        f"preemptions and {r.planned_stops:,} planned stops lost "
        f"{format_hours(r.lost_gpu_hours)} GPU-hours."),
    ]
    if math.isfinite(r.idle_gpu_hours):
        lines.append(f"The pool had {format_hours(r.idle_gpu_hours)} idle GPU-hours; jobs held "
                     f"{format_share(r.idle_share_used)} of them.")
    return lines


_DEFINITIONS = (
    "Months and days are local ({tz}). Useful GPU-hours = GPU-hours held minus GPU-hours lost "
    "(work thrown away when a job was preempted or stopped), split across day and month "
    "boundaries by time; lost "
    "GPU-hours and preemptions count in the month the attempt ended. GPUs (12 h) = useful "
    "GPU-hours / (12 x days); GPUs (24 h) = useful GPU-hours / (24 x days). Savings = useful "
    "GPU-hours x {price} per GPU-hour; cumulative savings add up the months of this report. "
    "Idle GPU-hours: free GPUs of the pool (capacity - headroom - services) summed over the "
    "month; share used = GPU-hours held by jobs / idle GPU-hours."
)


def _sections(report: Report, charts: dict[str, Path]):
    """(kind, payload) in order; kind is h1, h2, h3, code, list, text, table or chart. Text
    is plain (each renderer escapes it); list lines mark bold with ``**``."""
    label = report.month.label
    yield ("h1", f"{report.pool}: harvested GPUs, {label}")
    if report.commands:
        yield ("h2", "How this report was made")
        yield ("code", "\n".join(report.commands))
    yield ("h2", "Summary")
    yield ("list", _headline(report))
    yield ("table", _summary_rows(report))
    yield ("text", _DEFINITIONS.format(tz=report.tz,
                                        price=format_money(report.price, report.currency)))
    if report.accuracy is not None:
        yield from _forecast_sections(report, charts)
    if report.job_sizes is not None:
        yield from _job_size_section(report)
    if report.notices and report.notices.get("sent"):
        yield from _notice_section(report)
    yield ("h2", f"By team, {label}")
    yield ("table", _breakdown_rows(report.teams, "team", report.currency))
    yield ("h2", f"By kind of job, {label}")
    yield ("table", _breakdown_rows(report.kinds, "kind", report.currency))
    yield ("h2", "Charts")
    for title, path in charts.items():
        if title != COVERAGE_CHART:  # shown with the forecast accuracy
            yield ("chart", (title, path))



def _notice_section(report: Report):
    n = report.notices or {}
    sent = int(n.get("sent", 0))
    yield ("h2", f"Checkpoint notices, {report.month.label}")
    yield ("table", (["sent", "answered in time", "missed (stopped at the deadline)",
                      "cut short by the service", "ended first", "GPU-hours saved"],
                     [[f"{sent:,}", f"{int(n.get('answered', 0)):,}",
                       f"{int(n.get('missed', 0)):,}", f"{int(n.get('cut', 0)):,}",
                       f"{int(n.get('ended', 0)):,}",
                       format_hours(float(n.get("saved_gpu_hours", 0.0)))]]))
    yield ("text", "A planned stop of a unit that answers notices (checkpoint.notice) first "
                   "tells its pods to checkpoint; an answered notice stops it at its "
                   "acknowledgement, losing nothing. GPU-hours saved: the work since their "
                   "last periodic checkpoint, which a blind stop would have lost.")


def _job_size_section(report: Report):
    """Idle GPU-hours usable by jobs of each size on the nodes, next to the pool view."""
    sizes = report.job_sizes
    assert sizes is not None  # _sections calls it only with job sizes
    yield ("h2", f"Idle capacity by job size, {report.month.label}")
    if sizes.by_size is not None:
        rows = []
        for size, row in sizes.by_size.iterrows():
            name = ("multi-node (whole nodes)" if size == MULTI_NODE
                    else f"{size} GPU" + ("s" if size != 1 else ""))
            rows.append([name, format_hours(row["pool_view_gpu_hours"]),
                         format_hours(row["on_nodes_gpu_hours"]), format_share(row["share"])])
        yield ("table", (["job size", "idle GPU-hours (pool view)", "usable on the nodes",
                          "share"], rows))
    yield ("text", sizes.note)


def _forecast_sections(report: Report, charts: dict[str, Path]):
    """The forecast accuracy of the month: pooled, then per service with the chart of the
    daily coverage and what the widened evenings meant for the GPUs lent."""
    label = report.month.label
    a = report.accuracy
    assert a is not None  # _sections calls it only with an accuracy
    c = a["confidence"]
    hour = int(a.get("refresh_hour", 18))
    strict = a.get("strict_coverage", math.nan)
    yield ("h2", f"Forecast accuracy, {label}")
    yield ("table", (
        ["daily forecasts", "MAE (replicas)", f"pinball q{c:g}",
         f"coverage q{c:g}: strict / plain", "windows: precision", "windows: recall"],
        [[f"{a['cutoffs']:.0f}", f"{a['mae']:.3f}", f"{a['pinball']:.3f}",
          (f"{format_share(strict)} / {format_share(a['coverage'])}" if math.isfinite(strict)
           else format_share(a["coverage"])),
          format_share(a["precision"]), format_share(a["recall"])]],
    ))
    yield ("text", (
        f"Each day at {hour:02d}:00 the forecaster was refitted on the history before it and "
        f"scored on the next 24 hours of every service's replicas. Precision: of the GPU-hours "
        f"it promised free with {c:.0%} confidence, the share that really were; recall: of the "
        "GPU-hours really free, the share it promised."))
    check = report.forecast
    if check is None:
        return
    wide = check.widened_quantile
    yield ("h3", f"Per service: does the q{c:g} forecast keep its promise?")
    rows = []
    for r in check.services.itertuples():
        days = _days(r.widened_on)
        rows.append([
            str(r.service), f"{r.forecasts:,}",
            f"{format_share(r.strict_coverage)} / {format_share(r.coverage)}",
            r.verdict or "n/a",
            "n/a" if not math.isfinite(r.pinball) else f"{r.pinball:.3f}",
            "n/a" if not math.isfinite(r.mae) else f"{r.mae:.3f}",
            f"{r.days_widened} of {r.evenings}", days,
            format_hours(r.held_back_gpu_hours),
            r.served_by or "n/a",
            "n/a" if not math.isfinite(r.skill) else f"{r.skill:+.0%}",
        ])
    yield ("table", (
        ["service", "forecasts", f"coverage q{c:g}: strict / plain", "verdict",
         f"pinball q{c:g}", "MAE (replicas)", "evenings widened", "widened on",
         "GPU-hours held back", "served by (most steps)", "skill vs seasonal naive"], rows))
    yield ("text", (
        f"Coverage: the share of steps strictly below (strict) and at or below (plain) the "
        f"q{c:g} forecast. Replica counts are whole numbers, so a forecast that keeps its "
        f"promise has a strict coverage of at most {c:g} and a plain one of at least {c:g}: "
        "calibrated (within 0.02). Under-covers: the service needed GPUs the forecast had "
        "promised free (jobs on them are preempted); over-covers: even strictly below more "
        "often than promised (GPUs held back that stayed free). Widened: at "
        f"that evening's refresh the forecasts in use had covered less than q{c:g} by more than "
        f"chance over the last day or week, so the service was planned with q{wide:g} until a "
        f"day was covered again (as the daemon does, replayed); GPU-hours held back: its "
        f"q{wide:g} minus q{c:g} replicas x GPUs per replica over those nights' 24 hours."))
    if COVERAGE_CHART in charts:
        yield ("chart", (COVERAGE_CHART, charts[COVERAGE_CHART]))
    yield ("text", _widened_words(report))


def _days(dates: str) -> str:
    """``2025-12-08 2025-12-09`` as ``Dec 8, 9`` (one month: the report's)."""
    days = [pd.Timestamp(d) for d in str(dates).split()]
    if not days:
        return "-"
    return f"{days[0]:%b} " + ", ".join(str(d.day) for d in days)


def _widened_words(report: Report) -> str:
    """Which services were widened, how many evenings, and what it meant for lent GPUs."""
    check, accuracy = report.forecast, report.accuracy
    # only called from _forecast_sections, past its checks of both
    assert check is not None and accuracy is not None
    c, wide, label = check.confidence, check.widened_quantile, report.month.label
    widened = check.widened
    if widened.empty:
        return (f"No service was widened in {label}: at every nightly refresh the forecasts "
                f"in use of every service had kept their q{c:g} promise within chance, so every "
                f"night was planned at q{c:g} and no GPUs were held back.")
    parts = []
    for r in widened.itertuples():
        parts.append(f"{r.service} on {r.days_widened} evening{'s' if r.days_widened != 1 else ''}"
                     f" ({_days(r.widened_on)}; {format_hours(r.held_back_gpu_hours)} GPU-hours "
                     "held back)")
    text = (f"Widened in {label}: {'; '.join(parts)}. Those nights the plan used the "
            f"service's q{wide:g} forecast instead of q{c:g}: ")
    promised = accuracy.get("promised_gpu_hours", math.nan)
    share = (f" ({format_share(check.held_back_gpu_hours / promised)} of the "
             f"{format_hours(promised)} GPU-hours the q{c:g} forecasts promised free over the "
             "month)" if math.isfinite(promised) and promised > 0 else "")
    text += (f"the pool lent up to {format_hours(check.held_back_gpu_hours)} GPU-hours fewer"
             f"{share}, in exchange for fewer jobs preempted while the forecast was below the "
             "service's traffic.")
    never = [s for s in check.services["service"] if s not in set(widened["service"])]
    if never:
        text += f" Never widened: {', '.join(never)}."
    return text

