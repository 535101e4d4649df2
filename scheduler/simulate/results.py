"""What a simulation gives back: its run table (one row per attempt), its service delay, and
the tables read from them (delay events, where work was lost)."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

if TYPE_CHECKING:
    from idlegpu.scheduler.simulate.jobs import _Job

EVICTION = "eviction"  # a stop's cause: the service took GPUs that jobs held
RESTART = "restart"  # lost work's cause: a resumed attempt reloading its checkpoint
CAUSE_NAMES = {
    "window": "planned stop: window closed",
    # the free-GPU profile falls short within the grace period: the forecast's for the
    # forecast policy, the GPUs free now for reactive and night
    "forecast": "planned stop: profile falls short",
    "live": "backstop preemption",
    "signals": "live signals missing",
    "grow": "planned stop: to grow",
    EVICTION: "scheduler eviction",
    RESTART: "restart: reloading a checkpoint",
}
RUN_COLUMNS = ["job_id", "team", "kind", "gpus", "start", "end", "outcome", "gpu_hours",
               "lost_gpu_hours", "cause", "overran", "checkpointable", "notice",
               "notice_saved_gpu_hours", "restart_gpu_hours"]
"""The run table's columns (on nodes also ``nodes``: where the pods ran)."""


@dataclass(frozen=True)
class SimResult:
    policy: str
    metrics: dict[str, float]
    runs: pd.DataFrame  # one row per attempt
    delays: pd.DataFrame = field(default_factory=lambda: _delay_table([]))
    """One row per step the service waited for GPUs research units held: when, how many
    GPUs it waited for (their sum times the step is ``service_delay_gpu_minutes``) and how
    many GPUs more the service used than one step before (``delay_events`` groups them)."""


def _delay_table(delays: list[tuple[datetime, float, float]]) -> pd.DataFrame:
    return pd.DataFrame({"time": pd.to_datetime([d[0] for d in delays], utc=True),
                         "gpus_short": np.array([d[1] for d in delays], dtype=float),
                         "service_rise_gpus": np.array([d[2] for d in delays], dtype=float)})


def delay_events(delays: pd.DataFrame, step_s: int, headroom_gpus: float) -> pd.DataFrame:
    """A simulation's service delay (``SimResult.delays``) as events: each run of
    consecutive steps the service waited, from its first step, with its GPU-minutes, the
    service's rise over the step that opened it and whether that rise was above the pool's
    headroom. A rise above the headroom within one step meets whatever GPUs research holds:
    only GPUs left idle beyond the headroom, or a forecast of that very step, absorb it."""
    columns = ["start", "steps", "gpu_minutes", "opening_rise_gpus", "above_headroom"]
    if delays.empty:
        return pd.DataFrame(columns=columns)
    times = pd.to_datetime(delays["time"], utc=True)
    new = times.diff() != pd.Timedelta(seconds=step_s)
    event = new.cumsum()
    grouped = delays.assign(event=event.to_numpy()).groupby("event", sort=True)
    out = pd.DataFrame({
        "start": grouped["time"].first().to_numpy(),
        "steps": grouped.size().to_numpy(),
        "gpu_minutes": (grouped["gpus_short"].sum() * step_s / 60).to_numpy(),
        "opening_rise_gpus": grouped["service_rise_gpus"].first().to_numpy(),
    })
    out["above_headroom"] = out["opening_rise_gpus"] > headroom_gpus
    return out[columns]


@dataclass
class _Run:
    rows: list[dict] = field(default_factory=list)

    def close(self, job: _Job, end: datetime, outcome: str, lost_s: float, *,
              cause: str = "", overran: bool = False, notice: str = "",
              notice_saved_s: float = 0.0) -> None:
        start = job.started_at
        assert start is not None
        hours = (end - start).total_seconds() / 3600
        # what a resumed attempt held while it reloaded its checkpoint: no work, so lost
        reloaded = job.reloaded_at
        reload_h = (0.0 if reloaded is None
                    else max(0.0, (min(end, reloaded) - start).total_seconds()) / 3600)
        self.rows.append(
            {
                "job_id": job.spec.id, "team": job.spec.team, "kind": job.spec.kind,
                "gpus": job.gpus, "start": start, "end": end, "outcome": outcome,
                "gpu_hours": job.gpus * hours,
                # full-size work seconds, and the reload
                "lost_gpu_hours": job.spec.gpus * lost_s / 3600 + job.gpus * reload_h,
                # a stop's cause (STOP_CAUSES, or "eviction": the service took the GPUs),
                # whether the unit had run past its planned runtime, and whether it saves
                "cause": cause, "overran": overran,
                "checkpointable": job.spec.checkpointable,
                # a planned stop told ahead: answered, missed (stopped at the deadline) or cut
                # (the service first), and what the answer saved that a blind stop loses
                "notice": notice,
                "notice_saved_gpu_hours": job.spec.gpus * notice_saved_s / 3600,
                "restart_gpu_hours": job.gpus * reload_h,
                # on nodes: where its pods ran (NodeView.of_shapes names)
                **({"nodes": ",".join(f"node-{i}" for i in sorted(job.where))}
                   if job.where else {}),
            }
        )


def lost_work(runs: pd.DataFrame, timezone: str) -> pd.DataFrame:
    """Where a policy lost its work: the lost GPU-hours and the stops that lost any, by cause
    (``CAUSE_NAMES``; a resumed attempt's reload is a cause of its own), by whether the unit
    had run past its planned runtime (``overran``), by
    whether it checkpoints, and by the local hour its attempt was admitted. One row per
    (``by``, ``value``), with ``share`` of all the lost GPU-hours."""
    columns = ["by", "value", "stops", "lost_gpu_hours", "share"]
    if runs.empty:
        return pd.DataFrame(columns=columns)
    if "restart_gpu_hours" in runs.columns:
        # an attempt's reload is lost to its restart, whatever ended the attempt: one row
        # for each part, the reload's counted as a stop of cause "restart"
        reload = runs["restart_gpu_hours"].fillna(0.0).astype(float)
        runs = pd.concat([
            runs.assign(lost_gpu_hours=runs["lost_gpu_hours"] - reload),
            runs[reload > 0].assign(lost_gpu_hours=reload[reload > 0], cause=RESTART),
        ], ignore_index=True)
    lost = runs[runs["lost_gpu_hours"] > 1e-12]
    total = float(lost["lost_gpu_hours"].sum())
    hour = pd.to_datetime(lost["start"], utc=True).dt.tz_convert(timezone).dt.hour
    views = {
        "cause": lost["cause"].map(lambda c: CAUSE_NAMES.get(c, c or "other")),
        "overran": lost["overran"].map({True: "past its planned runtime",
                                        False: "within its planned runtime"}),
        "checkpointable": lost["checkpointable"].map({True: "checkpointable",
                                                      False: "not checkpointable"}),
        "admission_hour": hour.map(lambda h: f"{h:02d}:00"),
    }
    rows = []
    for by, keys in views.items():
        grouped = lost.groupby(keys.to_numpy())["lost_gpu_hours"].agg(["count", "sum"])
        for value, row in grouped.sort_index().iterrows():
            rows.append({"by": by, "value": value, "stops": int(row["count"]),
                         "lost_gpu_hours": float(row["sum"]),
                         "share": float(row["sum"]) / total if total else float("nan")})
    return pd.DataFrame(rows, columns=columns)
