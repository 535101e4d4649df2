"""The small arithmetic every phase of the policy shares: steps of the profile, hours as
text, a unit's notice and its shortest worthwhile segment."""

from __future__ import annotations

import math

from idlegpu.scheduler.types import PolicySettings, RunningJob, WaitingJob

MAX_RESERVATION_ATTEMPTS = 8


SHORT_BY_A_GPU = 0.5
"""A forecast shortfall this large or larger asks a whole GPU (``_forecast_need``)."""


def _forecast_need(short: float) -> int:
    """The GPUs a forecast shortfall asks of the running units, to the nearest whole GPU.
    A replica's GPUs are whole; a forecast's fraction is an average of them, and it moves by
    fractions from one pass to the next (the live correction re-anchors it on the pool each
    pass). Admission asks the whole unit's GPUs of the forecast; were a stop to ask only more
    than nothing, a unit admitted on a forecast that just held would be stopped by the next
    pass's drift of a tenth of a GPU (admit-then-stop churn), with the headroom untouched."""
    return max(0, math.floor(short + SHORT_BY_A_GPU))


def _hours(seconds: float) -> str:
    return f"{seconds / 3600:.1f} h"


def _steps(seconds: float, step_s: int) -> int:
    return max(1, math.ceil(seconds / step_s))


def _notice_steps(seconds: float, step_s: int) -> int:
    return math.ceil(seconds / step_s) if seconds > 0 else 0


def _notice_s(job: RunningJob) -> float:
    """The notice a unit gets before a planned stop (only units that checkpoint get one)."""
    return job.notice_s if job.checkpointable and job.notice_s > 0 else 0.0


def _min_segment_s(job: WaitingJob | RunningJob, settings: PolicySettings,
                   reload_s: float) -> float:
    """The shortest segment worth starting for a checkpointable unit: ``min_segment_s``, and
    at least the reload it begins with (``reload_s``: a queued unit's own, a shrink's restart
    the configured cost) plus one checkpoint interval (a shorter one would save nothing: a
    stop's SIGTERM is no checkpoint, and the reload does no work)."""
    return max(settings.min_segment_s, reload_s + (job.checkpoint_interval_s or 0.0))
