"""The report's PNG charts (matplotlib's Figure API, imported when the charts are drawn)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from idlegpu.scheduler.reports.accuracy import ForecastCheck
from idlegpu.scheduler.reports.build import Report
from idlegpu.scheduler.reports.formatting import format_money

COVERAGE_CHART = "Realised coverage per service"


def write_charts(report: Report, out: Path, *, dpi: int = 100) -> dict[str, Path]:
    """The PNG charts (matplotlib Figure API), by title: four, and with a forecast check the
    daily coverage per service."""
    from matplotlib.figure import Figure

    label = report.month.label
    cur = report.currency
    charts: dict[str, Path] = {}

    def save(fig: Figure, name: str, title: str) -> None:
        path = out / f"{name}-{label}.png"
        fig.savefig(path, dpi=dpi, bbox_inches="tight", metadata={"Software": None})
        charts[title] = path

    # 1. daily useful GPU-hours of the report month, stacked by team
    dates = report.daily.index
    days = report.daily[(dates.year == report.month.year) & (dates.month == report.month.month)]
    teams = [c for c in days.columns if c != "held"]
    fig = Figure(figsize=(10, 3.8))
    ax = fig.add_subplot()
    bottom = np.zeros(len(days))
    colours = ["#4C72B0", "#55A868", "#C44E52", "#8172B2", "#CCB974", "#64B5CD", "#8C8C8C"]
    for k, team in enumerate(teams):
        ax.bar(days.index, days[team], bottom=bottom, width=0.85, label=_mpl_text(team),
               color=colours[k % len(colours)])
        bottom += days[team].to_numpy()
    ax.set_ylabel("useful GPU-hours per day")
    ax.set_title(f"Useful GPU-hours per day by team, {label} ({report.tz})")
    ax.legend(loc="upper left", fontsize=8, ncols=min(len(teams), 4) or 1)
    fig.autofmt_xdate()
    save(fig, "daily-teams", "Useful GPU-hours per day, by team")

    # 2. idle vs harvested per day (report month)
    fig = Figure(figsize=(10, 3.8))
    ax = fig.add_subplot()
    if report.idle_daily is not None:
        idle = report.idle_daily.reindex(days.index)
        ax.bar(days.index, idle, width=0.85, color="#D0D8E8", label="idle GPU-hours (pool)")
    ax.bar(days.index, days["held"], width=0.5, color="#4C72B0", label="held by jobs")
    ax.bar(days.index, days[teams].sum(axis=1), width=0.5, color="#55A868",
           label="useful (held minus lost)")
    ax.set_ylabel("GPU-hours per day")
    ax.set_title(f"Idle vs harvested GPU-hours per day, {label}")
    ax.legend(loc="upper left", fontsize=8)
    fig.autofmt_xdate()
    save(fig, "idle-vs-harvested", "Idle vs harvested GPU-hours per day")

    # 3. cumulative savings over the report's months, by day
    fig = Figure(figsize=(10, 3.8))
    ax = fig.add_subplot()
    cumulative = report.daily[teams].sum(axis=1).cumsum() * report.price
    ax.plot(cumulative.index, cumulative.to_numpy(), color="#55A868", linewidth=2)
    ax.fill_between(cumulative.index, cumulative.to_numpy(), color="#55A868", alpha=0.15)
    ax.set_ylabel(f"cumulative savings ({cur})")
    ax.yaxis.set_major_formatter(lambda v, _pos: format_money(v, cur))
    ax.set_title(f"Cumulative savings, {report.months[0].label} to {label}")
    ax.grid(alpha=0.3)
    fig.autofmt_xdate()
    save(fig, "cumulative-savings", "Cumulative savings")

    # 4. monthly bars: useful and lost GPU-hours, with the 12-hour GPU equivalent
    s = report.summary
    fig = Figure(figsize=(8, 3.8))
    ax = fig.add_subplot()
    x = np.arange(len(s))
    ax.bar(x, s["useful_gpu_hours"], width=0.6, color="#4C72B0", label="useful GPU-hours")
    ax.bar(x, s["lost_gpu_hours"], width=0.6, bottom=s["useful_gpu_hours"], color="#C44E52",
           label="lost (preempted or stopped)")
    for k, row in enumerate(s.itertuples()):
        ax.annotate(f"{row.gpus_12h:,.1f} GPUs (12 h)",
                    (k, row.useful_gpu_hours + row.lost_gpu_hours),
                    ha="center", va="bottom", fontsize=8, xytext=(0, 3),
                    textcoords="offset points")
    ax.set_xticks(x, list(s["month"]))
    ax.set_ylabel("GPU-hours")
    ax.set_title("GPU-hours per month")
    ax.legend(loc="upper left", fontsize=8)
    save(fig, "monthly", "GPU-hours per month")

    # 5. with a forecast check: daily realised coverage per service, widened nights shaded
    if report.forecast is not None:
        save(_coverage_figure(report.forecast, report.tz), "coverage", COVERAGE_CHART)
    return charts


def _mpl_text(text: str) -> str:
    """``text`` as matplotlib draws it literally (``$`` would start mathtext)."""
    return str(text).replace("$", r"\$")


def _coverage_figure(check: ForecastCheck, tz: str):
    """One panel per service: the coverage [strict, plain] of each evening's forecast over
    the 24 hours it planned, the target, and the nights planned wider shaded."""
    from matplotlib.figure import Figure

    services = list(check.services["service"])
    fig = Figure(figsize=(10, 1.6 + 1.5 * len(services)), layout="constrained")
    axes = fig.subplots(len(services), 1, sharex=True, squeeze=False)[:, 0]
    day = pd.Timedelta(hours=24)
    for ax, service in zip(axes, services, strict=True):
        rows = check.daily[check.daily["service"] == service]
        made = pd.DatetimeIndex(pd.to_datetime(rows["made_at"], utc=True)).tz_convert(tz)
        made = made.tz_localize(None)
        middle = made + day / 2
        for start, wide in zip(made, rows["widened"], strict=True):
            if wide:
                ax.axvspan(start, start + day, color="#DD8452", alpha=0.3, lw=0,
                           label=f"planned with q{check.widened_quantile:g}")
        ax.plot(middle, rows["coverage"], marker="o", ms=3, color="#4C72B0",
                label=f"coverage (y <= q{check.confidence:g})")
        ax.plot(middle, rows["strict_coverage"], ls=":", color="#4C72B0", lw=1,
                label=f"strict (y < q{check.confidence:g})")
        ax.axhline(check.confidence, color="#C44E52", ls="--", lw=1,
                   label=f"target {check.confidence:g}")
        ax.set_ylim(0, 1.05)
        ax.set_ylabel("coverage")
        ax.set_title(_mpl_text(service), loc="left", fontsize=9)
        ax.grid(alpha=0.3)
    handles, labels = axes[0].get_legend_handles_labels()
    for other in axes[1:]:
        for h, label in zip(*other.get_legend_handles_labels(), strict=True):
            if label not in labels:
                handles.append(h)
                labels.append(label)
    unique = dict(zip(labels, handles, strict=True))
    fig.legend(unique.values(), unique.keys(), loc="outside lower center", fontsize=8,
               ncols=min(len(unique), 5))
    fig.suptitle(f"Realised coverage of each evening's q{check.confidence:g} forecast over "
                 f"the next 24 h, {check.label} ({tz})", fontsize=10)
    for label in axes[-1].get_xticklabels():
        label.set_rotation(30)
        label.set_ha("right")
    return fig
