"""Trace entries, the simulation's input: a request with when it is submitted and the work
its units really need."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any

from pydantic import AwareDatetime, PlainValidator, field_validator, model_validator

from idlegpu.scheduler.limits import brief
from idlegpu.scheduler.specs.errors import _custom
from idlegpu.scheduler.specs.expansion import expand_units
from idlegpu.scheduler.specs.model import JobRequest
from idlegpu.scheduler.specs.parts import _Strict
from idlegpu.scheduler.specs.quantities import _bounded_duration, _to_utc
from idlegpu.scheduler.types import UnitSpec


def _parse_actual_runtime(value: Any) -> float | dict[str, float | list[float]]:
    if not isinstance(value, Mapping):
        return _bounded_duration(value)
    parsed: dict[str, float | list[float]] = {}
    for step, item in value.items():
        try:
            parsed[str(step)] = (
                [_bounded_duration(v) for v in item] if isinstance(item, list)
                else _bounded_duration(item)
            )
        except ValueError as exc:
            raise ValueError(f"step {brief(step, 40)}: {exc}") from None
    return parsed


class TraceEntry(_Strict):
    """One submission of a simulated job trace: when it arrives, the work it really needs, and
    the request itself. In a trace file the request's fields sit next to ``submit_at`` and
    ``actual_runtime`` in one mapping."""

    submit_at: AwareDatetime
    """When the request is submitted (stored in UTC)."""
    actual_runtime: Annotated[
        float | dict[str, float | list[float]], PlainValidator(_parse_actual_runtime)
    ]
    """Seconds of work each unit really needs (unknown to the scheduler): one duration for
    every unit, or one per step name, or per step a list with one duration per sweep member."""
    request: JobRequest

    _submit = field_validator("submit_at")(classmethod(lambda cls, v: _to_utc(v)))

    @model_validator(mode="before")
    @classmethod
    def _flat_file_layout(cls, data: Any) -> Any:
        if isinstance(data, Mapping) and "request" not in data:
            rest = {k: v for k, v in data.items() if k not in ("submit_at", "actual_runtime")}
            data = {k: data[k] for k in ("submit_at", "actual_runtime") if k in data}
            data["request"] = rest
        return data

    @model_validator(mode="after")
    def _runtimes_cover_the_units(self) -> TraceEntry:
        if isinstance(self.actual_runtime, dict):
            counts = self.request.member_counts()
            missing = [s for s in counts if s not in self.actual_runtime]
            unknown = [s for s in self.actual_runtime if s not in counts]
            if missing or unknown:
                raise _custom(
                    "actual_runtime",
                    f"steps {', '.join(counts)} need a runtime each (missing: "
                    f"{', '.join(missing) or 'none'}; unknown: {', '.join(unknown) or 'none'}); "
                    "give one duration per step name",
                )
            for step, value in self.actual_runtime.items():
                if isinstance(value, list) and len(value) != counts[step]:
                    raise _custom(
                        f"actual_runtime.{step}",
                        f"{len(value)} durations for {counts[step]} sweep members; give one per "
                        "member, or a single duration for all",
                    )
        return self

    def actual_runtime_s(self, step: str, member: int = 0) -> float:
        """Seconds of work the unit ``(step, member)`` really needs."""
        value: float | dict[str, float | list[float]] | list[float] = self.actual_runtime
        if isinstance(value, dict):
            value = value[step]
        if isinstance(value, list):
            value = value[member]
        return float(value)

    def units(self) -> list[UnitSpec]:
        return expand_units(self.request)

    @property
    def gpu_hours(self) -> float:
        """GPU-hours of work of the whole request (GPUs x actual runtime over all units)."""
        return sum(u.gpus * self.actual_runtime_s(u.step, u.member) for u in self.units()) / 3600
