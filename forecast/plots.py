"""Charts for people: matplotlib figures written as PNG (no display needed)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from idlegpu.forecast.capacity import FREE
from idlegpu.forecast.models.base import quantile_column

DPI = 110


def _save(fig: Figure, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=DPI, bbox_inches="tight", metadata={"Software": None})
    return path


def idle_heatmap(profile: pd.DataFrame, path: Path, *, title: str, capacity: int) -> Path:
    """Weekday x hour heatmap of mean free GPUs, each cell labelled."""
    fig = Figure(figsize=(12, 4.2))
    ax = fig.add_subplot()
    image = ax.imshow(profile.to_numpy(dtype=float), aspect="auto", cmap="viridis", vmin=0,
                      vmax=capacity)
    ax.set_xticks(range(24), [f"{h:02d}" for h in profile.columns])
    ax.set_yticks(range(len(profile.index)), list(profile.index))
    ax.set_xlabel("hour of day (local time)")
    ax.set_title(title)
    for (row, col), value in np.ndenumerate(profile.to_numpy(dtype=float)):
        if np.isfinite(value):
            ax.text(col, row, f"{value:.0f}", ha="center", va="center", fontsize=7,
                    color="white" if value < capacity * 0.6 else "black")
    fig.colorbar(image, ax=ax, label="mean free GPUs", pad=0.01)
    return _save(fig, path)


def daily_idle_chart(
    daily: pd.DataFrame, path: Path, *, title: str, holidays: dict | None = None
) -> Path:
    """Bars of idle GPU-hours per local day (weekends and holidays coloured) and a 7-day mean."""
    holidays = holidays or {}
    fig = Figure(figsize=(12, 4.2))
    ax = fig.add_subplot()
    days = daily.index
    kind = np.where(
        [d.date() in holidays for d in days], "holiday",
        np.where(days.day_of_week >= 5, "weekend", "weekday"),
    )
    colours = {"weekday": "#4C72B0", "weekend": "#55A868", "holiday": "#C44E52"}
    for name, colour in colours.items():
        mask = kind == name
        if mask.any():
            ax.bar(days[mask], daily["idle_gpu_hours"][mask], width=0.85, color=colour,
                   label=name)
    rolling = daily["idle_gpu_hours"].rolling(7, min_periods=1, center=True).mean()
    ax.plot(days, rolling, color="black", linewidth=1.2, label="7-day mean")
    ax.set_ylabel("idle GPU-hours per day")
    ax.set_title(title)
    ax.legend(loc="upper left", ncols=4, fontsize=8)
    ax.grid(axis="y", alpha=0.3)
    fig.autofmt_xdate()
    return _save(fig, path)


def pool_week_chart(
    usage: pd.DataFrame, services: list[str], path: Path, *, tz: str, capacity: int, title: str
) -> Path:
    """Stacked GPUs per service and the free GPUs over the last seven days of the history."""
    last = usage.index.max()
    window = usage[usage.index > last - pd.Timedelta(days=7)].tz_convert(tz)
    fig = Figure(figsize=(12, 4.2))
    ax = fig.add_subplot()
    x = window.index.tz_localize(None)
    stacks = [window[s].to_numpy(dtype=float) for s in services] + [window[FREE].to_numpy(dtype=float)]
    ax.stackplot(x, *stacks, labels=[*services, "free"], alpha=0.85,
                 colors=[*[f"C{i}" for i in range(len(services))], "#DDDDDD"])
    ax.axhline(capacity, color="black", linestyle="--", linewidth=1, label="pool minus headroom")
    ax.set_ylabel("GPUs")
    ax.set_title(title)
    ax.legend(loc="upper left", ncols=len(services) + 2, fontsize=8)
    fig.autofmt_xdate()
    return _save(fig, path)


def idle_depth_chart(summary: pd.DataFrame, path: Path, *, title: str, min_hours: float) -> Path:
    """Hours per night that N GPUs stay idle (median and 10th percentile) against N."""
    fig = Figure(figsize=(8, 4))
    ax = fig.add_subplot()
    levels = summary.index.to_numpy()
    ax.plot(levels, summary["median_hours"], marker="o", label="median night")
    ax.plot(levels, summary["p10_hours"], marker="o", linestyle="--", label="1 night in 10 below")
    ax.axhline(min_hours, color="grey", linewidth=1)
    ax.set_xlabel("GPUs idle at once")
    ax.set_ylabel("hours in one stretch per night")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend()
    return _save(fig, path)


def forecast_chart(
    history: pd.DataFrame,
    forecast: pd.DataFrame,
    path: Path,
    *,
    tz: str,
    quantiles: list[float],
    context: pd.Timedelta = pd.Timedelta(days=3),
    max_panels: int = 8,
) -> Path:
    """Per series: recent history, the median forecast and the band between the outer quantiles."""
    uids = list(dict.fromkeys(forecast["unique_id"]))[:max_panels]
    fig = Figure(figsize=(12, 2.4 * len(uids)), layout="constrained")
    axes = fig.subplots(len(uids), 1, squeeze=False, sharex=True)[:, 0]
    lo_q, hi_q = min(quantiles), max(quantiles)
    mid_q = 0.5 if 0.5 in quantiles else quantiles[len(quantiles) // 2]
    for ax, uid in zip(axes, uids):
        fc = forecast[forecast["unique_id"] == uid]
        start = fc["ds"].min() - context
        past = history[(history["unique_id"] == uid) & (history["ds"] >= start)]
        ax.plot(past["ds"].dt.tz_convert(tz).dt.tz_localize(None), past["y"], color="black",
                linewidth=1, label="history")
        x = fc["ds"].dt.tz_convert(tz).dt.tz_localize(None)
        if hi_q != lo_q:
            ax.fill_between(x, fc[quantile_column(lo_q)], fc[quantile_column(hi_q)],
                            step="post", alpha=0.25, color="C0",
                            label=f"q{lo_q:g} to q{hi_q:g}")
        ax.step(x, fc[quantile_column(mid_q)], where="post", color="C0",
                label=f"forecast q{mid_q:g} ({fc['model'].iloc[0]})")
        ax.set_title(uid, fontsize=9, loc="left")
        ax.grid(alpha=0.3)
    axes[0].legend(loc="upper left", fontsize=8, ncols=3)
    axes[-1].set_xlabel(f"local time ({tz})")
    return _save(fig, path)


def free_gpu_chart(
    past_free: pd.Series,
    forecast_free: dict[str, pd.Series],
    windows: pd.DataFrame,
    path: Path,
    *,
    tz: str,
    capacity: int,
    title: str,
) -> Path:
    """Free GPUs: the recent past, the forecast at each confidence, and the idle windows."""
    fig = Figure(figsize=(12, 4.5))
    ax = fig.add_subplot()
    ax.step(past_free.index.tz_convert(tz).tz_localize(None), past_free, where="post",
            color="black", linewidth=1, label="free (history)")
    for i, (label, series) in enumerate(forecast_free.items()):
        x = series.index.tz_convert(tz).tz_localize(None)
        ax.step(x, series, where="post", color=f"C{i}", label=label)
        if i == len(forecast_free) - 1:
            ax.fill_between(x, 0, series, step="post", color=f"C{i}", alpha=0.15)
    if not windows.empty:
        best = windows.loc[windows.groupby("start")["gpus"].idxmax()]
        for row in best.itertuples():
            ax.hlines(row.gpus, row.start.tz_localize(None), row.end.tz_localize(None),
                      colors="C3", linewidth=3)
        ax.plot([], [], color="C3", linewidth=3, label="idle windows (one line per size)")
    ax.axhline(capacity, color="grey", linestyle="--", linewidth=1, label="pool minus headroom")
    ax.set_ylim(0, capacity * 1.1)
    ax.set_ylabel("free GPUs")
    ax.set_xlabel(f"local time ({tz})")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(loc="upper left", fontsize=8, ncols=3)
    return _save(fig, path)


def policy_chart(metrics: pd.DataFrame, cumulative: pd.DataFrame, path: Path, *, title: str) -> Path:
    """Left: useful and lost GPU-hours per policy. Right: useful GPU-hours over time."""
    fig = Figure(figsize=(13, 4.5), layout="constrained")
    left, right = fig.subplots(1, 2, width_ratios=[1, 2])
    names = list(metrics.index)
    x = np.arange(len(names))
    left.bar(x - 0.2, metrics["useful_gpu_hours"], width=0.4, label="useful", color="C2")
    left.bar(x + 0.2, metrics["lost_gpu_hours"], width=0.4, label="lost to preemption",
             color="C3")
    left.set_xticks(x, names)
    left.set_ylabel("GPU-hours")
    left.legend(fontsize=8)
    left.grid(axis="y", alpha=0.3)
    for i, name in enumerate(cumulative.columns):
        right.plot(cumulative.index, cumulative[name], label=name, color=f"C{i}")
    right.set_ylabel("useful GPU-hours, cumulative")
    right.legend(fontsize=8)
    right.grid(alpha=0.3)
    fig.suptitle(title)
    return _save(fig, path)


def frontier_chart(frontier: pd.DataFrame, path: Path, *, title: str) -> Path:
    """The policy frontier (``idlegpu.scheduler.simulate.sweep``): useful GPU-hours against
    service delay (left) and against lost GPU-hours (right); the swept policy a line through
    its confidences (each point labelled), every other policy one marked point."""
    fig = Figure(figsize=(13, 4.8), layout="constrained")
    axes = fig.subplots(1, 2)
    swept = frontier[frontier["confidence"].notna()].sort_values("confidence")
    others = frontier[frontier["confidence"].isna()]
    markers = "osD^vP*X"
    for ax, x, label in ((axes[0], "service_delay_gpu_minutes", "service delay, GPU-minutes"),
                         (axes[1], "lost_gpu_hours", "lost GPU-hours")):
        for policy, part in swept.groupby("policy", sort=False):
            ax.plot(part[x], part["useful_gpu_hours"], "-o", color="C0", label=policy)
            for n, row in enumerate(part.itertuples()):  # labels alternate sides: points
                # of neighbouring confidences often nearly coincide
                ax.annotate(f"q{row.confidence:g}", (getattr(row, x), row.useful_gpu_hours),
                            textcoords="offset points", xytext=(6 if n % 2 else -30, 4),
                            fontsize=8)
        for i, row in enumerate(others.itertuples()):
            ax.plot(getattr(row, x), row.useful_gpu_hours, markers[i % len(markers)],
                    color=f"C{i + 1}", markersize=8, label=row.policy)
        ax.set_xlabel(label + " (less is better)")
        ax.set_ylabel("useful GPU-hours (more is better)")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.suptitle(title)
    return _save(fig, path)
