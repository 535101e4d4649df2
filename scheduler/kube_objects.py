"""Fields of the Kubernetes objects users write (Kueue Workloads, Jobs) read as a unit's: pure,
bounded, and every error naming the field at fault (``admission_checks``, ``native_jobs``)."""

from __future__ import annotations

import math
from datetime import datetime
from typing import Any

from idlegpu.scheduler.types import UnitSpec

GPU_RESOURCE = "nvidia.com/gpu"
RUNTIME_ANNOTATION = "idlegpu.io/runtime-estimate"
"""The runtime to plan with when nothing else gives it, as in a request ("2h", "90m")."""
STEP_LABEL = "idlegpu.io/step"
"""The runtime family's step, so runs of one image and step share their runtime history as
requests' units do."""
CHECKPOINTABLE_ANNOTATION = "idlegpu.io/checkpointable"
"""``"true"``: the workload saves its progress on SIGTERM and resumes from it when started
again, so it may be planned on the likely free GPUs and stopped at its window's end."""


def rfc3339(text: Any, field: str, error: type[ValueError]) -> datetime:
    """``text`` as an aware time; ``error`` naming ``field`` when it is none."""
    if not isinstance(text, str):
        raise error(f"{field}: expected an RFC 3339 time, got {type(text).__name__}")
    try:
        parsed = datetime.fromisoformat(text)
    except ValueError as exc:
        raise error(f"{field}: not an RFC 3339 time ({text[:40]!r})") from exc
    if parsed.tzinfo is None:
        raise error(f"{field}: a time without its offset ({text[:40]!r})")
    return parsed


def whole(value: Any, field: str, error: type[ValueError]) -> int:
    """A count of GPUs or pods: a whole number >= 0 (as Kubernetes quantities of GPUs are)."""
    try:
        number = float(str(value))
    except ValueError as exc:
        raise error(f"{field}: not a number ({str(value)[:40]!r})") from exc
    if not math.isfinite(number) or number < 0 or number != int(number):
        raise error(f"{field}: expected a whole number, got {str(value)[:40]!r}")
    return int(number)


def family_unit_spec(*, step: str, image: str, gpus: int, runtime_estimate_s: float | None,
                     checkpointable: bool, priority: int, kind: str) -> UnitSpec:
    """A unit for the runtime model: its image and step are its family, ``runtime_estimate_s``
    the user's own estimate (what a request's ``runtime_estimate`` is). Nothing else of it is
    run by idlegpu."""
    return UnitSpec(
        step=step, step_index=0, member=0, image=image, command=(), args=(), env=(),
        parameters=(), gpus=gpus, cpu=0.0, memory="0", runtime_estimate_s=runtime_estimate_s,
        checkpointable=checkpointable, checkpoint_interval_s=None, resume_args=(),
        priority=priority, deadline=None, max_preemptions=None, output=None, depends_on=(),
        kind=kind)
