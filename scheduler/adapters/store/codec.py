"""What the store's columns hold and what it checks of what comes in: aware times, plain
JSON, ``UnitSpec`` to JSON and back, the ids of requests and units, a submission's units."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import fields
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any

from idlegpu.scheduler.adapters.store.errors import InvalidRequestError, StoreError
from idlegpu.scheduler.queue_view import _aware  # the one check, shared with the pure side
from idlegpu.scheduler.types import EnvFromSource, EnvKeyRef, UnitSpec, UnitVolume


def _aware_opt(value: datetime | None, name: str) -> datetime | None:
    return None if value is None else _aware(value, name)


def _iso(value: datetime | None) -> str | None:
    return None if value is None else value.astimezone(UTC).isoformat()


def _jsonable(value: Any) -> Any:
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, (tuple, list)):
        return [_jsonable(v) for v in value]
    if isinstance(value, Mapping):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, StrEnum):
        return value.value
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    return str(value)


DROPPED_SPEC_FIELDS = ("command", "args", "env", "parameters", "resume_args")
"""What retention (``JobStore.drop_ended_specs``) empties in an ended unit's spec: the bulk a
request may carry, never what reports or runtime estimates read."""


def spec_to_json(spec: UnitSpec) -> dict[str, Any]:
    """A ``UnitSpec`` as plain JSON (tuples as lists, datetimes as ISO 8601, volumes and
    Secret/ConfigMap references as objects of their fields)."""
    def plain(value: Any) -> Any:
        if isinstance(value, tuple | list):
            return [plain(v) for v in value]
        if hasattr(type(value), "__dataclass_fields__"):
            return {f.name: plain(getattr(value, f.name)) for f in fields(value)}
        return value

    return {f.name: _jsonable(plain(getattr(spec, f.name))) for f in fields(UnitSpec)}


def spec_from_json(data: Mapping[str, Any]) -> UnitSpec:
    """Inverse of ``spec_to_json``; unknown keys (from a newer writer) are ignored, and keys an
    older writer did not know (volumes, env_from, env_refs, ephemeral storage) take their
    defaults."""

    def records(kind: type, items: Any) -> tuple[Any, ...]:
        names = {f.name for f in fields(kind)}
        out = []
        for item in items or ():
            if not isinstance(item, Mapping):
                raise StoreError(f"stored unit spec cannot be read: {kind.__name__} {item!r} is "
                                 "not an object")
            try:
                out.append(kind(**{k: v for k, v in item.items() if k in names}))
            except TypeError as exc:
                raise StoreError(f"stored unit spec cannot be read: {exc}") from exc
        return tuple(out)

    known = {f.name for f in fields(UnitSpec)}
    values = {k: v for k, v in data.items() if k in known}
    for name, kind in (("volumes", UnitVolume), ("env_from", EnvFromSource),
                       ("env_refs", EnvKeyRef)):
        if name in values:
            values[name] = records(kind, values[name])
    for name in ("command", "args", "resume_args"):
        if name in values:
            values[name] = tuple(values[name] or ())
    for name in ("env", "parameters"):
        if name in values:
            values[name] = tuple((str(k), str(v)) for k, v in values[name] or ())
    if "depends_on" in values:
        values["depends_on"] = tuple((int(s), int(m)) for s, m in values["depends_on"] or ())
    if values.get("deadline") is not None:
        values["deadline"] = datetime.fromisoformat(values["deadline"])
    try:
        return UnitSpec(**values)
    except TypeError as exc:
        raise StoreError(f"stored unit spec cannot be read: {exc}") from exc


def unit_id_for(request_id: str, step_index: int, member: int) -> str:
    return f"{request_id}-{step_index}-{member}"


def _slug(name: str) -> str:
    slug = re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")[:40].strip("-")
    return slug or "job"


def _short(exc: BaseException) -> str:
    text = str(getattr(exc, "orig", None) or exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


def _check_units(units: Sequence[UnitSpec]) -> None:
    if not units:
        raise InvalidRequestError("a request needs at least one unit")
    keys = [(u.step_index, u.member) for u in units]
    dupes = sorted({k for k in keys if keys.count(k) > 1})
    if dupes:
        raise InvalidRequestError(
            "units repeat (step_index, member): " + ", ".join(f"{s}-{m}" for s, m in dupes)
        )
    known = set(keys)
    for u in units:
        if u.gpus < 1:
            raise InvalidRequestError(f"unit {u.step}[{u.member}] asks for {u.gpus} GPUs")
        for dep in u.depends_on:
            if tuple(dep) not in known:
                raise InvalidRequestError(
                    f"unit {u.step_index}-{u.member} depends on {dep[0]}-{dep[1]}, "
                    "which the request does not have"
                )
    # Kahn's algorithm: every unit must be reachable without a cycle.
    pending = {(u.step_index, u.member): {tuple(d) for d in u.depends_on} for u in units}
    while pending:
        ready = [k for k, deps in pending.items() if not deps & pending.keys()]
        if not ready:
            cycle = ", ".join(f"{s}-{m}" for s, m in sorted(pending))
            raise InvalidRequestError(f"dependencies form a cycle among units {cycle}")
        for k in ready:
            del pending[k]
