"""The scalar field types of a request: durations, memory and storage quantities, CPU counts,
times (UTC, 1970 to 2999) and parameter values, each parsed with the fix in its error."""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from datetime import UTC, datetime
from decimal import Decimal, InvalidOperation
from typing import Annotated, Any

from pydantic import BeforeValidator, Field, PlainValidator

from idlegpu.scheduler.limits import brief

_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)([wdhms])")
_DURATION_UNITS = {"w": 604800.0, "d": 86400.0, "h": 3600.0, "m": 60.0, "s": 1.0}
_MEMORY = re.compile(r"^(\d+(?:\.\d+)?)(Ki|Mi|Gi|Ti|Pi|Ei|k|K|M|G|T|P|E)?$")
_MEMORY_FACTORS = {
    None: 1, "k": 10**3, "K": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15,
    "E": 10**18, "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60,
}


def parse_duration(value: Any) -> float:
    """Seconds in ``value``: a number of seconds, or ``"90m"``, ``"36h"``, ``"2d"``, ``"1h30m"``.

    Units: ``w`` weeks, ``d`` days, ``h`` hours, ``m`` minutes, ``s`` seconds. Raises
    ``ValueError`` (with the fix in its message) for anything else or a duration <= 0.
    """
    fix = "use a duration such as 90m, 36h, 2d, 1h30m or a number of seconds"
    if isinstance(value, bool):
        raise ValueError(f"{brief(value)} is not a duration; {fix}")  # noqa: TRY004 (pydantic)
    if isinstance(value, int | float):
        seconds = float(value)
    elif isinstance(value, str):
        text = value.strip().replace(" ", "")
        if not text or _DURATION_PART.sub("", text) != "":
            try:
                seconds = float(text)
            except ValueError:
                raise ValueError(f"{value!r} is not a duration; {fix}") from None
        else:
            seconds = sum(
                float(n) * _DURATION_UNITS[u] for n, u in _DURATION_PART.findall(text)
            )
    else:
        raise ValueError(f"{brief(value)} is not a duration; {fix}")  # noqa: TRY004 (pydantic)
    if not math.isfinite(seconds) or seconds <= 0:
        raise ValueError(f"{value!r} is not a positive duration; {fix}")
    return seconds


def format_duration(seconds: float) -> str:
    """The shortest ``parse_duration`` text for ``seconds``, whole minutes when above an hour:
    ``3600 -> "1h"``, ``5400 -> "1h30m"``, ``129600 -> "36h"``, ``90 -> "1m30s"``."""
    total = round(seconds)
    if total >= 3600:
        total = round(seconds / 60) * 60
    hours, rest = divmod(total, 3600)
    minutes, secs = divmod(rest, 60)
    parts = [(hours, "h"), (minutes, "m"), (secs, "s")]
    return "".join(f"{n}{unit}" for n, unit in parts if n) or "0s"


def parse_memory(value: Any) -> str:
    """A Kubernetes memory quantity (``"64Gi"``, ``"512Mi"``, ``"1.5Ti"``, bytes as a number),
    returned as text; ``ValueError`` with the fix for anything else."""
    fix = "use a Kubernetes quantity such as 64Gi, 512Mi or 1Ti"
    if isinstance(value, int) and not isinstance(value, bool):
        value = str(value)
    if not isinstance(value, str) or not _MEMORY.fullmatch(value.strip()):
        raise ValueError(f"{brief(value)} is not a memory quantity; {fix}")
    text = value.strip()
    number, suffix = _MEMORY.fullmatch(text).groups()  # type: ignore[union-attr]
    if float(number) * _MEMORY_FACTORS[suffix] < 2**20:
        raise ValueError(f"{value!r} is less than 1Mi of memory; {fix}")
    return text


def quantity_bytes(text: str) -> Decimal:
    """Bytes in a Kubernetes memory/storage quantity such as ``"64Gi"`` or ``"1.5Ti"``
    (``ValueError`` for anything else)."""
    match = _MEMORY.fullmatch(str(text).strip())
    if not match:
        raise ValueError(f"{text!r} is not a Kubernetes quantity; write e.g. 64Gi")
    number, suffix = match.groups()
    try:
        return Decimal(number) * _MEMORY_FACTORS[suffix]
    except InvalidOperation:
        raise ValueError(f"{text!r} is not a Kubernetes quantity; write e.g. 64Gi") from None


def _format_bytes(value: Decimal) -> str:
    """``value`` bytes in the largest binary unit that holds it whole (``384Gi``)."""
    for suffix in ("Ei", "Pi", "Ti", "Gi", "Mi", "Ki"):
        factor = _MEMORY_FACTORS[suffix]
        if value >= factor and value % factor == 0:
            return f"{int(value // factor)}{suffix}"
    return str(int(value))


def _parse_cpu(value: Any) -> Any:
    if isinstance(value, str) and re.fullmatch(r"\d+m", value.strip()):
        return int(value.strip()[:-1]) / 1000
    return value


def _scalar(value: Any) -> str | int | float | bool:
    if isinstance(value, bool | int | str):
        return value
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(f"{value!r} is not a finite number; use a plain number")
        return value
    what = "a list" if isinstance(value, list | tuple) else (
        "a mapping" if isinstance(value, Mapping) else type(value).__name__
    )
    raise ValueError(
        f"got {what}; use a string, a number or true/false (quote dates and paths)"
    )


def _env_value(value: Any) -> Any:
    if isinstance(value, bool | int | float) and not isinstance(value, str):
        return scalar_text(value)
    return value


def scalar_text(value: str | float | bool) -> str:
    """How a parameter value is written into args and env: ``true``/``false``, ``3``,
    ``0.0003``, strings as they are."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return repr(value)
    return str(value)


Scalar = Annotated[str | int | float | bool, PlainValidator(_scalar)]
MAX_DURATION_S = 3650 * 86400.0
"""The longest duration a request may give (ten years): every duration becomes a timedelta."""
EARLIEST = datetime(1970, 1, 1, tzinfo=UTC)
LATEST = datetime(3000, 1, 1, tzinfo=UTC)
"""Times in requests and traces (``deadline``, ``submit_at``) lie in [EARLIEST, LATEST)."""


def _bounded_duration(value: Any) -> float:
    seconds = parse_duration(value)
    if seconds > MAX_DURATION_S:
        raise ValueError(f"{brief(value)} is more than ten years; use a duration such as 36h or "
                         "2d")
    return seconds


Duration = Annotated[float, BeforeValidator(_bounded_duration)]
"""Seconds; written in files as ``"36h"``, ``"90m"``, ``"2d"`` or a number of seconds (at most
ten years)."""
Memory = Annotated[str, BeforeValidator(parse_memory)]
Cpu = Annotated[float, BeforeValidator(_parse_cpu), Field(gt=0, allow_inf_nan=False)]


def _to_utc(value: datetime | None) -> datetime | None:
    """``value`` in UTC; ``ValueError`` outside 1970..2999 (every time becomes a timestamp,
    and a year-1 time cannot even move to UTC)."""
    if value is None:
        return None
    try:
        utc = value.astimezone(UTC)
    except (OverflowError, ValueError):
        utc = None
    if utc is None or not EARLIEST <= utc < LATEST:
        raise ValueError(f"{value.isoformat()} is outside the years 1970 to 2999; write a time "
                         "in that range, e.g. 2025-11-03T09:00:00+09:00")
    return utc
