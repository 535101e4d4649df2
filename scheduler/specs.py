"""Job request files: what a researcher submits, validated, and expanded into runnable units.

A request names a Docker image, its command and arguments, parameters (hyper-parameters, data
and model paths, the output location), the GPUs it needs as one gang, and optionally a pipeline
of ``steps`` run one after another, each of which may fan out over a parameter ``sweep``
(one parallel member per grid point). Everything is parameterised: ``args``, ``env`` values,
``checkpoint.resume_args`` and ``output`` take ``{placeholder}`` fields filled from the
parameters, the sweep values and the built-ins ``{name}``, ``{team}``, ``{step}``,
``{member}``, ``{gpus}`` (and ``{output}`` outside ``output`` itself); every parameter is also
passed as the environment variable ``IDLEGPU_PARAM_<NAME>``.

Job-level fields are defaults for every step; a step overrides them (``parameters`` and ``env``
are merged key by key, everything else is replaced). ``cpu`` and ``memory`` are totals for one
unit; left out they are 8 CPUs and 64Gi per GPU.

A unit may span nodes (a gang: one pod per node, all started together or none): ``nodes: N``
with ``gpus_per_node: G`` (or ``gpus`` the total N x G), ``cpu`` and ``memory`` then *per
node*. A plain ``gpus`` above the largest node of the pool (``pool.nodes``, passed as
``nodes=`` to the loaders) that is a multiple of that node's GPUs is split into whole nodes,
its ``cpu`` and ``memory`` shared evenly (the unit says so: ``nodes``, ``IDLEGPU_NODES``);
any other size above the node is refused with the fix. In a gang ``{gpus}`` and
``IDLEGPU_GPUS`` are the GPUs of one pod (``torchrun --nproc-per-node={gpus}``). Gangs are
not elastic (``min_gpus`` is refused with ``nodes``).

Requests run on a GPU pool shared with production inference, so settings that reach outside
the container are refused: ``privileged``, ``host_network``, ``host_pid``, ``host_ipc``,
``allow_privilege_escalation``, ``capabilities.add``, ``host_path`` volumes and environment
variables named ``NVIDIA_*``. Images must come from an allowed registry
(``admission.allowed_registries``) and carry a version tag or a digest so a rerun runs the same
code. ``cpu``, ``memory`` and ``ephemeral_storage`` are capped per GPU
(``admission.max_*_per_gpu``).

``volumes`` mount PersistentVolumeClaims, ConfigMaps, Secrets and ``empty_dir`` scratch space
(on disk, or ``medium: Memory`` for ``/dev/shm``); ``env_from`` and ``env`` values of the form
``{value_from: {secret: NAME, key: KEY}}`` read Secrets and ConfigMaps by reference. Claims,
Secrets and ConfigMaps must be on the team's list in ``admission.team_volumes`` (``"*"``: every
team); by default only ``empty_dir`` may be mounted.

The rules that can be checked on a stored unit are re-applied by :func:`recheck_unit` with the
daemon's own config, right before its Job is created: the store holds whatever a submitter's
process accepted under the submitter's config.

Validation takes the admission limits through pydantic's validation context::

    JobRequest.model_validate(data, context={"allowed_registries": [...], "max_gpus_per_job": 64})

and falls back to the defaults of :class:`idlegpu.forecast.config.AdmissionConfig` without it.
Files are read with :func:`load_request`, :func:`load_requests` and :func:`load_trace`, texts
(an API body, YAML or JSON) with :func:`parse_request_text`; every problem is a
:class:`SpecError` whose message reads ``<file>: <field.path>: <problem>; <fix>``. All of them,
and :func:`validate_request`, apply ``admission.limits`` (:mod:`idlegpu.scheduler.limits`:
sizes, depth, aliases, parameters, sweeps, steps, units, rendered sizes) before anything is
expanded or rendered.
"""

from __future__ import annotations

import fnmatch
import itertools
import math
import posixpath
import re
import string
import typing
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    AwareDatetime,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Discriminator,
    Field,
    PlainValidator,
    PrivateAttr,
    Tag,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError

from idlegpu.forecast.config import AdmissionConfig, unknown_field
from idlegpu.forecast.errors import PermanentError
from idlegpu.scheduler.limits import LimitError, brief, load_yaml_text, precheck
from idlegpu.scheduler.types import (
    REF_KINDS,
    VOLUME_KINDS,
    EnvFromSource,
    EnvKeyRef,
    UnitSpec,
    UnitVolume,
)

__all__ = [
    "BUILTIN_PLACEHOLDERS",
    "DEFAULT_CPU_PER_GPU",
    "DEFAULT_MEMORY_GI_PER_GPU",
    "Capabilities",
    "Checkpoint",
    "EmptyDir",
    "EnvFrom",
    "EphemeralStorage",
    "JobKind",
    "JobRequest",
    "KeyRef",
    "SpecError",
    "StepSpec",
    "TraceEntry",
    "ValueFrom",
    "Volume",
    "admission_context",
    "check_image",
    "expand_units",
    "format_duration",
    "load_request",
    "load_requests",
    "load_trace",
    "parse_duration",
    "parse_memory",
    "parse_request_text",
    "quantity_bytes",
    "recheck_unit",
    "render",
    "resize_unit",
    "scalar_text",
    "validate_request",
]


class SpecError(PermanentError):
    """A job request (or trace) file is invalid; the message names the file, field and fix."""


JobKind = Literal["training", "sft", "rl", "eval", "datagen", "other"]
KINDS: tuple[str, ...] = typing.get_args(JobKind)

BUILTIN_PLACEHOLDERS: tuple[str, ...] = ("name", "team", "step", "member", "gpus", "output")
"""Placeholders every template may use besides the parameters (``output`` not in ``output``)."""
PARAM_ENV_PREFIX = "IDLEGPU_PARAM_"
RESERVED_ENV_PREFIX = "IDLEGPU_"
NVIDIA_ENV_PREFIX = "NVIDIA_"
_NVIDIA_WHY = (
    "NVIDIA_* variables steer the NVIDIA container runtime: with its default settings "
    "NVIDIA_VISIBLE_DEVICES=all exposes every GPU of the node, including the ones serving "
    "production inference; remove it (the GPUs the job asked for are already visible)"
)
RECHECK_PREFIX = "the daemon's admission rules refuse it: "
DEFAULT_CPU_PER_GPU = 8.0
DEFAULT_MEMORY_GI_PER_GPU = 64
MAX_SWEEP_MEMBERS = 256
MAX_UNITS = 1024
UNITS_CEILING = 4096
"""No request expands to more units than this, whatever ``admission.limits.max_units`` says."""
MAIN_STEP = "main"
MAX_NODES = 1024
"""No unit spans more nodes than this (an Indexed Job's completions)."""

_DEFAULT_ADMISSION = AdmissionConfig()
_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_OBJECT_NAME = r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$"
_KEY = r"^[-._a-zA-Z0-9]+$"
_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)([wdhms])")
_DURATION_UNITS = {"w": 604800.0, "d": 86400.0, "h": 3600.0, "m": 60.0, "s": 1.0}
_MEMORY = re.compile(r"^(\d+(?:\.\d+)?)(Ki|Mi|Gi|Ti|Pi|Ei|k|K|M|G|T|P|E)?$")
_MEMORY_FACTORS = {
    None: 1, "k": 10**3, "K": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15,
    "E": 10**18, "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60,
}
_IMAGE_REPO = re.compile(
    r"^[a-z0-9]+(?:[._-][a-z0-9]+)*(?::[0-9]+)?(?:/[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*)+$"
)
_IMAGE_TAG = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$")
_IMAGE_DIGEST = re.compile(r"^sha256:[0-9a-f]{64}$")
_STORAGE_URI = re.compile(r"^[a-z][a-z0-9+.-]*://\S+$")
_EXAMPLES = "see examples/jobs/ for valid requests"


# --------------------------------------------------------------------------------------------
# Scalar field types


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
ObjectName = Annotated[str, Field(max_length=253, pattern=_OBJECT_NAME)]
"""The name of a PersistentVolumeClaim, Secret or ConfigMap in the jobs' namespace."""


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


# --------------------------------------------------------------------------------------------
# Sub-models


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Checkpoint(_Strict):
    """How a job saves and resumes its work; only a checkpointing job can be preempted and
    resumed later without losing everything since its start."""

    enabled: bool = True
    interval: Duration | None = None
    """Seconds between checkpoints (``"30m"``); required when enabled."""
    resume_args: list[str] = Field(default_factory=list)
    """Arguments added when the job restarts after a preemption, templated like ``args``
    (e.g. ``["--resume", "{output}/ckpt"]``)."""
    saves_on_stop: bool = False
    """The workload saves its state when told to stop (SIGTERM), within the pool's grace
    period: a planned stop then keeps all its work. Without it only the periodic checkpoints
    (every ``interval`` from the attempt's start) count, and a planned stop loses what was
    done since the last one."""
    notice: bool = False
    """The workload carries the idlegpu checkpoint helper (``idlegpu_checkpoint``, or the
    Lightning / Trainer callbacks): before a planned stop its pods get a checkpoint notice
    (the file ``/etc/idlegpu/checkpoint-request``), it saves and acknowledges, and it is
    stopped at once, losing nothing; one that never answers is stopped at the notice's
    deadline (``admission.checkpoint_notice`` after it)."""

    @model_validator(mode="after")
    def _interval_when_enabled(self) -> Checkpoint:
        if self.enabled and self.interval is None:
            raise _custom(
                "interval",
                "required when checkpointing is enabled; set how often the job saves its state, "
                "e.g. interval: 30m",
            )
        return self


class Capabilities(_Strict):
    """Linux capabilities of the container: dropping is fine, adding is refused."""

    add: list[str] = Field(default_factory=list)
    drop: list[str] = Field(default_factory=list)

    @field_validator("add")
    @classmethod
    def _no_added_capabilities(cls, value: list[str]) -> list[str]:
        if value:
            raise ValueError(
                f"adding Linux capabilities ({', '.join(map(str, value))}) is not allowed on the "
                "shared inference pool; remove capabilities.add (capabilities.drop is fine)"
            )
        return value


class EmptyDir(_Strict):
    """Scratch space that lives as long as the pod: on the node's disk (counted as
    ephemeral storage), or with ``medium: Memory`` in RAM (tmpfs, counted as the unit's memory;
    the usual ``/dev/shm`` of PyTorch data loaders)."""

    medium: Literal["", "Memory"] = ""
    size_limit: Memory | None = None
    """Largest size, e.g. ``64Gi``; the pod is evicted when it writes more."""


def _mount_path(value: str) -> str:
    parts = value.split("/")
    if ".." in parts:
        raise ValueError(f"{value!r} contains '..'; write the absolute path without it")
    norm = posixpath.normpath(value)
    if norm.startswith("//"):
        norm = "/" + norm.lstrip("/")
    if norm == "/":
        raise ValueError("a volume cannot be mounted over the container's root; mount it at "
                         "a directory such as /data")
    for system in ("/proc", "/sys", "/dev"):
        if (norm == system or norm.startswith(system + "/")) and not (
                norm == "/dev/shm" or norm.startswith("/dev/shm/")):
            raise ValueError(
                f"{value!r} is under {system}, which the container runtime provides; mount "
                "the volume elsewhere (/dev/shm is fine)"
            )
    return norm


def _sub_path_problem(value: str) -> str | None:
    if value.startswith("/"):
        return f"{value!r} is absolute; write a path relative to the volume's root, e.g. ckpt/run1"
    if ".." in value.split("/"):
        return f"{value!r} contains '..'; write a path inside the volume, e.g. ckpt/run1"
    if not value.strip("/"):
        return f"{value!r} is empty; leave sub_path out to mount the whole volume"
    return None


class Volume(_Strict):
    """A volume mounted into the job's container: exactly one of ``persistent_volume_claim``
    (claim name), ``config_map`` (name), ``secret`` (name) or ``empty_dir``.

    Claims, Secrets and ConfigMaps must be on the team's list in ``admission.team_volumes``;
    an ``empty_dir`` is always allowed. Secret and ConfigMap volumes are mounted read-only.
    """

    name: str = Field(max_length=63, pattern=_LABEL.pattern)
    """Unique within the unit: lowercase letters, digits and ``-``."""
    mount_path: str = Field(pattern=r"^/")
    """Absolute path in the container, unique within the unit (not under /proc, /sys, /dev
    except /dev/shm)."""
    read_only: bool = False
    sub_path: str | None = None
    """Mount only this directory of the volume (relative, templated like ``args``, e.g.
    ``"{name}/{member}"`` so every member of a sweep gets its own directory of one claim)."""
    persistent_volume_claim: ObjectName | None = None
    config_map: ObjectName | None = None
    secret: ObjectName | None = None
    empty_dir: EmptyDir | None = None
    host_path: Any = None
    """Refused: a hostPath exposes the node's filesystem to the job."""

    _mount = field_validator("mount_path")(classmethod(lambda cls, v: _mount_path(v)))

    @field_validator("sub_path")
    @classmethod
    def _relative_sub_path(cls, value: str | None) -> str | None:
        problem = None if value is None else _sub_path_problem(value)
        if problem:
            raise ValueError(problem)
        return value

    @model_validator(mode="before")
    @classmethod
    def _bare_empty_dir(cls, data: Any) -> Any:
        if isinstance(data, Mapping) and "empty_dir" in data and data["empty_dir"] is None:
            return {**data, "empty_dir": {}}
        return data

    @field_validator("host_path")
    @classmethod
    def _no_host_path(cls, value: Any) -> Any:
        if value is not None:
            raise ValueError(
                "hostPath volumes are not allowed (they expose the node's filesystem, shared with "
                "production inference); use a persistent_volume_claim, or read and write "
                "cloud storage"
            )
        return value

    @model_validator(mode="after")
    def _one_source(self) -> Volume:
        sources = [
            s for s in ("persistent_volume_claim", "config_map", "secret", "empty_dir")
            if getattr(self, s) is not None
        ]
        if len(sources) != 1:
            got = ", ".join(sources) or "none"
            raise ValueError(
                f"a volume needs exactly one source (got {got}); set one of "
                "persistent_volume_claim, config_map, secret or empty_dir"
            )
        return self

    @property
    def kind(self) -> str:
        return next(s for s in VOLUME_KINDS if getattr(self, s) is not None)


class _ObjectRef(_Strict):
    """Names exactly one Secret or ConfigMap (checked by ``_one_reference``)."""

    secret: ObjectName | None = None
    config_map: ObjectName | None = None

    @property
    def kind(self) -> str:
        return "secret" if self.secret is not None else "config_map"

    @property
    def ref(self) -> str:
        return self.secret if self.secret is not None else self.config_map  # type: ignore[return-value]


def _one_reference(model: _ObjectRef, what: str) -> None:
    if (model.secret is None) == (model.config_map is None):
        both = "both" if model.secret is not None else "neither"
        raise ValueError(f"{what} names {both} secret and config_map; set exactly one of them")


def _check_prefix(value: str) -> str:
    upper = value.upper()
    # "NVIDIA" or "N" before a key "_VISIBLE_DEVICES" or "VIDIA_VISIBLE_DEVICES" makes one too
    if upper.startswith(NVIDIA_ENV_PREFIX) or (upper and NVIDIA_ENV_PREFIX.startswith(upper)):
        raise ValueError(f"the prefix {value!r} would make NVIDIA_* variables; {_NVIDIA_WHY}")
    if value.upper().startswith(RESERVED_ENV_PREFIX):
        raise ValueError(
            f"the prefix {value!r} uses the reserved prefix {RESERVED_ENV_PREFIX}; choose "
            "another one"
        )
    return value


class EnvFrom(_ObjectRef):
    """Every key of a Secret or ConfigMap as an environment variable (``envFrom``): set one of
    ``secret`` or ``config_map``. The values never pass through idlegpu. Variables set in
    ``env`` take precedence over these."""

    prefix: str = Field(default="", pattern=r"^([A-Za-z_][A-Za-z0-9_]*)?$")
    """Put in front of every key, e.g. ``WANDB_``."""
    optional: bool = False
    """Start even when the Secret or ConfigMap does not exist."""

    _prefix = field_validator("prefix")(classmethod(lambda cls, v: _check_prefix(v)))

    @model_validator(mode="after")
    def _one_source(self) -> EnvFrom:
        _one_reference(self, "an env_from entry")
        return self



class KeyRef(_ObjectRef):
    """One key of a Secret or ConfigMap: ``{secret: wandb, key: api-key}``."""

    key: str = Field(max_length=253, pattern=_KEY)
    optional: bool = False
    """Leave the variable unset when the key or object does not exist."""

    @model_validator(mode="after")
    def _one_source(self) -> KeyRef:
        _one_reference(self, "value_from")
        return self



class ValueFrom(_Strict):
    """An ``env`` value read from a Secret or ConfigMap by the kubelet (``valueFrom``):
    ``WANDB_API_KEY: {value_from: {secret: wandb, key: api-key}}``."""

    value_from: KeyRef


class EphemeralStorage(_Strict):
    """Node-local disk of a unit: the container's writable layer, its logs and disk
    ``empty_dir`` volumes. A single quantity sets request and limit; ``{request, limit}`` a
    smaller request. The pod is evicted when it uses more than the limit."""

    request: Memory | None = None
    """What the scheduler reserves on the node; default: the limit."""
    limit: Memory

    @model_validator(mode="before")
    @classmethod
    def _one_quantity(cls, data: Any) -> Any:
        if isinstance(data, str | int) and not isinstance(data, bool):
            return {"request": data, "limit": data}
        return data

    @model_validator(mode="after")
    def _request_within_limit(self) -> EphemeralStorage:
        if self.request is not None and quantity_bytes(self.request) > quantity_bytes(self.limit):
            raise _custom(
                "request",
                f"the request {self.request} is above the limit {self.limit}; ask for at most "
                "the limit",
            )
        return self


def _env_kind(value: Any) -> str:
    return "env-ref" if isinstance(value, Mapping | ValueFrom) else "env-text"


EnvValue = Annotated[
    Annotated[Annotated[str, BeforeValidator(_env_value)], Tag("env-text")]
    | Annotated[ValueFrom, Tag("env-ref")],
    Discriminator(_env_kind),
]
"""A templated string, or ``{value_from: {secret|config_map: NAME, key: KEY}}``."""
_ENV_TAGS = ("env-text", "env-ref")
EnvMap = dict[str, EnvValue]


# --------------------------------------------------------------------------------------------
# Validators shared by jobs and steps


def _admission_of(context: Any) -> AdmissionConfig:
    """The admission limits of a validation context: its ``admission`` (an
    ``AdmissionConfig``, else the defaults), with ``allowed_registries`` and
    ``max_gpus_per_job`` overridden when the context names them."""
    if not isinstance(context, Mapping):
        return _DEFAULT_ADMISSION
    base = context.get("admission")
    base = base if isinstance(base, AdmissionConfig) else _DEFAULT_ADMISSION
    update: dict[str, Any] = {}
    if "allowed_registries" in context:
        update["allowed_registries"] = list(context["allowed_registries"])
    if "max_gpus_per_job" in context:
        update["max_gpus_per_job"] = int(context["max_gpus_per_job"])
    return base.model_copy(update=update) if update else base


def _admission(info: ValidationInfo) -> tuple[list[str], int]:
    admission = _admission_of(info.context)
    return list(admission.allowed_registries), int(admission.max_gpus_per_job)


def _registry_prefix(prefix: str) -> str:
    # A bare host ("registry.example.com") must not also admit "registry.example.com.evil.io/".
    return prefix if "/" in prefix else prefix + "/"


def check_image(image: str, allowed_registries: Sequence[str]) -> str:
    """``image`` if it is a registry-qualified reference from an allowed registry with a tag
    (not ``latest``) or a digest; ``ValueError`` naming the fix otherwise."""
    image = image.strip()
    name, _, digest = image.partition("@")
    slash, colon = name.rfind("/"), name.rfind(":")
    repo, tag = (name[:colon], name[colon + 1:]) if colon > slash else (name, None)
    if not _IMAGE_REPO.fullmatch(repo) or (tag is not None and not _IMAGE_TAG.fullmatch(tag)) or (
        digest and not _IMAGE_DIGEST.fullmatch(digest)
    ):
        raise ValueError(
            f"{image!r} is not a valid image reference; write registry/repository:tag, e.g. "
            "registry.example.com/research/trainer:1.4.2 (lowercase, no spaces)"
        )
    prefixes = [_registry_prefix(p) for p in allowed_registries]
    if not any(image.startswith(p) for p in prefixes):
        allowed = ", ".join(prefixes) or "(none configured)"
        raise ValueError(
            f"image {image!r} is not from an allowed registry; push it to one of: {allowed} "
            "(admission.allowed_registries)"
        )
    if not digest and tag is None:
        raise ValueError(
            f"image {image!r} has no tag; pin a version tag or digest (e.g. {repo}:1.0.0 or "
            f"{repo}@sha256:...) so reruns use the same code"
        )
    if not digest and tag == "latest":
        raise ValueError(
            f"image {image!r} uses the moving tag 'latest'; pin a version tag or digest so "
            "reruns use the same code"
        )
    return image


def _check_gpus(value: int, info: ValidationInfo) -> int:
    _, max_gpus = _admission(info)
    if value < 1:
        raise ValueError(
            f"a job needs at least 1 GPU (got {value}); ask for 1 to {max_gpus} GPUs (CPU-only "
            "work does not belong on the GPU pool)"
        )
    if value > max_gpus:
        raise ValueError(
            f"{value} GPUs is above this pool's limit of {max_gpus} per job; ask for at most "
            f"{max_gpus} (split the work into steps or a sweep)"
        )
    return value


def _check_parameter_names(names: Sequence[str], what: str) -> None:
    for key in names:
        if not _IDENT.fullmatch(key):
            raise ValueError(
                f"{what} name {key!r} is not usable as a placeholder; use letters, digits and "
                "'_' (starting with a letter), e.g. learning_rate"
            )
        if key in BUILTIN_PLACEHOLDERS:
            raise ValueError(
                f"{what} name {key!r} is a built-in placeholder "
                f"({', '.join(BUILTIN_PLACEHOLDERS)}); rename it"
            )


def _check_env(value: dict[str, Any]) -> dict[str, Any]:
    for key in value:
        if not _IDENT.fullmatch(key):
            raise ValueError(
                f"environment variable name {key!r} is invalid; use letters, digits and '_' "
                "(not starting with a digit)"
            )
        if key.upper().startswith(NVIDIA_ENV_PREFIX):
            raise _custom(key, f"environment variable {key!r} is refused: {_NVIDIA_WHY}")
        if key.upper().startswith(RESERVED_ENV_PREFIX):
            raise ValueError(
                f"environment variable {key!r} uses the reserved prefix {RESERVED_ENV_PREFIX}; "
                "rename it (parameters already arrive as IDLEGPU_PARAM_<NAME>)"
            )
    return value


def _check_sweep(value: dict[str, list[Any]] | None,
                 max_members: int = MAX_SWEEP_MEMBERS) -> dict[str, list[Any]] | None:
    if value is None:
        return value
    if not value:
        raise ValueError("a sweep needs at least one parameter; list values, e.g. lr: [1e-5, 3e-5]")
    _check_parameter_names(list(value), "sweep parameter")
    points = 1
    for key, values in value.items():
        if not values:
            raise ValueError(f"sweep parameter {key!r} has no values; list at least one")
        points *= len(values)
        if points > max_members:
            raise ValueError(
                f"the sweep has more than {max_members} grid points "
                "(admission.limits.max_sweep_members); sweep fewer values or split the request"
            )
        counts = Counter(scalar_text(v) for v in values)
        dupes = sorted(t for t, n in counts.items() if n > 1)
        if dupes:
            raise ValueError(
                f"sweep parameter {key!r} repeats {', '.join(brief(t)[1:-1] for t in dupes[:5])}"
                f"{' ...' if len(dupes) > 5 else ''}; list each value once"
            )
    return value


def _check_output(value: str | None) -> str | None:
    if value is not None and not _STORAGE_URI.fullmatch(value):
        raise ValueError(
            f"{value!r} is not a storage location; use a cloud storage URI such as "
            "s3://bucket/{team}/{name}/{step}/{member}"
        )
    return value


def _no_true(field: str, why: str) -> Any:
    def check(cls: type, value: bool) -> bool:
        if value:
            raise ValueError(
                f"true is not allowed on the shared inference pool ({why}); remove it or set "
                "it to false"
            )
        return value

    return field_validator(field)(classmethod(check))


class _PodSettings(_Strict):
    """Pod settings a job may not turn on; present so a request that asks gets a clear no."""

    privileged: bool = False
    host_network: bool = False
    host_pid: bool = False
    host_ipc: bool = False
    allow_privilege_escalation: bool = False
    capabilities: Capabilities | None = None

    _privileged = _no_true("privileged", "a privileged container controls the node")
    _host_network = _no_true(
        "host_network", "the job would share the node's network with the inference servers"
    )
    _host_pid = _no_true("host_pid", "the job would see and signal the node's processes")
    _host_ipc = _no_true("host_ipc", "the job would share the node's IPC namespace")
    _escalation = _no_true(
        "allow_privilege_escalation", "a process could gain more privileges than its parent"
    )


class _Runnable(_PodSettings):
    """Checks shared by a request and its steps, which declare the fields themselves."""

    @field_validator("image", check_fields=False)
    @classmethod
    def _image(cls, value: str | None, info: ValidationInfo) -> str | None:
        return None if value is None else check_image(value, _admission(info)[0])

    @field_validator("gpus", check_fields=False)
    @classmethod
    def _gpus(cls, value: int | None, info: ValidationInfo) -> int | None:
        return None if value is None else _check_gpus(value, info)

    @field_validator("gpus_per_node", check_fields=False)
    @classmethod
    def _gpus_per_node(cls, value: int | None, info: ValidationInfo) -> int | None:
        return None if value is None else _check_gpus(value, info)

    @field_validator("nodes", check_fields=False)
    @classmethod
    def _nodes(cls, value: int | None) -> int | None:
        if value is not None and value < 1:
            raise ValueError(
                f"nodes must be at least 1 (got {value}); ask for the number of nodes the unit "
                "spans (e.g. nodes: 4 with gpus_per_node: 8), or leave nodes out for one pod")
        if value is not None and value > MAX_NODES:
            raise ValueError(f"nodes {value} is above {MAX_NODES}; ask for fewer nodes")
        return value

    @field_validator("parameters", check_fields=False)
    @classmethod
    def _parameters(cls, value: dict[str, Any]) -> dict[str, Any]:
        _check_parameter_names(list(value), "parameter")
        return value

    @field_validator("env", check_fields=False)
    @classmethod
    def _env(cls, value: dict[str, Any]) -> dict[str, Any]:
        return _check_env(value)

    @field_validator("sweep", check_fields=False)
    @classmethod
    def _sweep(cls, value: dict[str, list[Any]] | None,
               info: ValidationInfo) -> dict[str, list[Any]] | None:
        return _check_sweep(value, _admission_of(info.context).limits.max_sweep_members)

    @field_validator("output", check_fields=False)
    @classmethod
    def _output(cls, value: str | None) -> str | None:
        return _check_output(value)

    @field_validator("deadline", check_fields=False)
    @classmethod
    def _deadline(cls, value: datetime | None) -> datetime | None:
        return _to_utc(value)

    @field_validator("priority", check_fields=False)
    @classmethod
    def _priority(cls, value: int | None, info: ValidationInfo) -> int | None:
        limits = _admission_of(info.context).limits
        if value is not None and not limits.min_priority <= value <= limits.max_priority:
            raise ValueError(
                f"priority {brief(value)} is outside {limits.min_priority}..{limits.max_priority} "
                "(admission.limits.min_priority, max_priority); use a whole number in that "
                "range (higher runs first)")
        return value


# --------------------------------------------------------------------------------------------
# Steps and requests


class StepSpec(_Runnable):
    """One step of a pipeline: runs after every member of the step before it has succeeded.

    Every field but ``name`` and ``sweep`` overrides the job-level value of the same name
    (``volumes`` and ``env_from`` replace the job's lists); ``parameters`` and ``env`` are
    merged into the job's, key by key.
    """

    name: str = Field(max_length=30, pattern=_LABEL.pattern)
    """Lowercase letters, digits and ``-`` (part of the Kubernetes Job names)."""
    kind: JobKind | None = None
    image: str | None = None
    command: list[str] | None = None
    args: list[str] | None = None
    parameters: dict[str, Scalar] = Field(default_factory=dict)
    env: EnvMap = Field(default_factory=dict)
    gpus: int | None = None
    min_gpus: int | None = None
    nodes: int | None = None
    gpus_per_node: int | None = None
    cpu: Cpu | None = None
    memory: Memory | None = None
    runtime_estimate: Duration | None = None
    checkpoint: Checkpoint | None = None
    priority: int | None = None
    deadline: AwareDatetime | None = None
    max_preemptions: int | None = Field(default=None, ge=0, le=1_000_000)
    output: str | None = None
    volumes: list[Volume] | None = None
    env_from: list[EnvFrom] | None = None
    ephemeral_storage: EphemeralStorage | None = None
    sweep: dict[str, list[Scalar]] | None = None
    """Fan the step out: one parallel member per point of the cartesian product of these
    values (first key slowest, last key fastest)."""


class JobRequest(_Runnable):
    """A job request file: one container image run as one step, or a pipeline of ``steps``."""

    name: str = Field(max_length=50, pattern=_LABEL.pattern)
    """Unique job name: lowercase letters, digits and ``-``, at most 50 characters."""
    team: str = Field(max_length=63, pattern=_LABEL.pattern)
    """The team whose fair share the job uses."""
    kind: JobKind
    """``training``, ``sft``, ``rl``, ``eval``, ``datagen`` or ``other`` (accounting)."""
    description: str = ""
    image: str | None = None
    """``registry/repository:tag`` or ``@sha256:...`` from an allowed registry; required here
    unless every step names its own."""
    command: list[str] = Field(default_factory=list)
    """Entry point; empty keeps the image's own."""
    args: list[str] = Field(default_factory=list)
    """Arguments, templated with ``{placeholders}``."""
    parameters: dict[str, Scalar] = Field(default_factory=dict)
    """Hyper-parameters, data and model paths: strings, numbers or booleans. Each one is
    a placeholder and the environment variable ``IDLEGPU_PARAM_<NAME>``."""
    env: EnvMap = Field(default_factory=dict)
    """Extra environment variables: templated strings, or values read from a Secret or
    ConfigMap, ``{value_from: {secret: NAME, key: KEY}}`` (never put a secret itself here).
    Names starting with ``NVIDIA_`` are refused."""
    env_from: list[EnvFrom] = Field(default_factory=list)
    """Secrets and ConfigMaps whose every key becomes an environment variable."""
    gpus: int | None = None
    """GPUs per unit, allocated together (gang); required here unless every step sets it."""
    min_gpus: int | None = None
    """Elastic units: the fewest GPUs a unit can run on (1..``gpus``; needs ``checkpoint``).
    The admitter may start it on fewer GPUs than ``gpus`` (down to this), or shrink it
    while it runs (checkpoint, then restart on fewer GPUs from the checkpoint) when the service
    needs GPUs back. The unit reads its GPU count from ``IDLEGPU_GPUS``. Left out: always
    ``gpus``."""
    nodes: int | None = None
    """A multi-node unit: this many pods, one per node (an Indexed Job with a headless
    Service and the rendezvous environment), all started together or none; ``gpus`` is then
    the total, or give ``gpus_per_node``. ``cpu`` and ``memory`` are per node. Not elastic."""
    gpus_per_node: int | None = None
    """GPUs of each pod of a multi-node unit (``nodes`` x this = ``gpus``)."""
    cpu: Cpu | None = None
    """CPU cores per unit (``"500m"`` works too), per node with ``nodes``; default 8 per
    GPU."""
    memory: Memory | None = None
    """Memory per unit as a Kubernetes quantity (``"256Gi"``), per node with ``nodes``;
    default 64Gi per GPU."""
    runtime_estimate: Duration | None = None
    """Expected run time of each unit, in seconds (``"36h"``, ``"90m"``, ``"2d"``)."""
    checkpoint: Checkpoint | None = None
    """How the job checkpoints; without it the job must fit into one idle window whole."""
    priority: int = 0
    """Higher runs first."""
    deadline: AwareDatetime | None = None
    """Finish-by time, with its offset (``2025-11-03T09:00:00+09:00``); stored in UTC."""
    max_preemptions: int | None = Field(default=None, ge=0, le=1_000_000)
    """Stop preempting the job after this many preemptions (None: no limit)."""
    output: str | None = None
    """Storage location of the results, templated: ``s3://bucket/{team}/{name}/{step}/{member}``."""
    volumes: list[Volume] = Field(default_factory=list)
    """Volumes mounted into every unit: claims, Secrets and ConfigMaps allowed for the team
    (``admission.team_volumes``), and ``empty_dir`` scratch space."""
    ephemeral_storage: EphemeralStorage | None = None
    """Node-local disk per unit (``"100Gi"``, or ``{request: 50Gi, limit: 100Gi}``)."""
    sweep: dict[str, list[Scalar]] | None = None
    """A sweep of the single step of a request without ``steps``."""
    steps: list[StepSpec] | None = Field(default=None, min_length=1)
    """Pipeline steps run in order; without them the request is one step named ``main``."""

    _node_shapes: tuple[tuple[int, float | None, int | None], ...] = PrivateAttr(default=())

    @model_validator(mode="after")
    def _request_is_consistent(self, info: ValidationInfo) -> JobRequest:
        try:
            admission = _admission_of(info.context)
            # the pool's node shapes it was validated against: expand_units splits the same
            self._node_shapes = _node_shapes_of(info.context)
            _admit_units(self, _build_units(self, admission.limits.max_units,
                                            self._node_shapes), admission)
        except _RuleError as exc:
            raise _custom(exc.field, exc.message) from None
        return self

    @property
    def step_names(self) -> list[str]:
        return [s.name for s in self.steps] if self.steps else [MAIN_STEP]

    def member_counts(self) -> dict[str, int]:
        """Parallel members of each step (1 for a step without a sweep)."""
        return {s.name: len(_grid(s.sweep)) for s in _resolve(self)}


# --------------------------------------------------------------------------------------------
# Expansion


class _RuleError(Exception):
    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


@dataclass(frozen=True)
class _Step:
    """One step with the job-level defaults applied; ``where`` maps a field to its path."""

    index: int
    name: str
    kind: str
    image: str | None
    command: list[str]
    args: list[str]
    parameters: dict[str, Any]
    env: dict[str, Any]
    gpus: int | None
    min_gpus: int | None
    nodes: int | None
    gpus_per_node: int | None
    cpu: float | None
    memory: str | None
    runtime: float | None
    checkpoint: Checkpoint | None
    priority: int
    deadline: datetime | None
    max_preemptions: int | None
    output: str | None
    volumes: list[Volume]
    env_from: list[EnvFrom]
    ephemeral_storage: EphemeralStorage | None
    sweep: dict[str, list[Any]] | None
    where: dict[str, str]
    env_where: dict[str, str]


_STEP_FIELDS = (
    "kind", "image", "command", "args", "gpus", "min_gpus", "nodes", "gpus_per_node", "cpu",
    "memory", "runtime_estimate",
    "checkpoint", "priority", "deadline", "max_preemptions", "output", "volumes", "env_from",
    "ephemeral_storage",
)


def _step(index: int, name: str, value: Mapping[str, Any], parameters: dict[str, Any],
          env: dict[str, Any], sweep: dict[str, list[Any]] | None, where: dict[str, str],
          env_where: dict[str, str]) -> _Step:
    return _Step(
        index=index, name=name, kind=value["kind"], image=value["image"],
        command=list(value["command"]), args=list(value["args"]), parameters=parameters,
        env=env, gpus=value["gpus"], min_gpus=value["min_gpus"], nodes=value["nodes"],
        gpus_per_node=value["gpus_per_node"], cpu=value["cpu"],
        memory=value["memory"],
        runtime=value["runtime_estimate"], checkpoint=value["checkpoint"],
        priority=value["priority"], deadline=value["deadline"],
        max_preemptions=value["max_preemptions"], output=value["output"],
        volumes=list(value["volumes"] or ()), env_from=list(value["env_from"] or ()),
        ephemeral_storage=value["ephemeral_storage"], sweep=sweep, where=where,
        env_where=env_where,
    )


def _resolve(req: JobRequest) -> list[_Step]:
    if not req.steps:
        where: dict[str, str] = {f: f for f in (*_STEP_FIELDS, "parameters", "sweep")}
        where["resume_args"] = "checkpoint.resume_args"
        return [_step(
            0, MAIN_STEP, {f: getattr(req, f) for f in _STEP_FIELDS}, dict(req.parameters),
            dict(req.env), req.sweep, where, {k: f"env.{k}" for k in req.env},
        )]
    steps = []
    for i, step in enumerate(req.steps):
        here = f"steps.{i}"
        value: dict[str, Any] = {}
        where = {}
        for f in _STEP_FIELDS:
            own = getattr(step, f)
            value[f] = own if own is not None else getattr(req, f)
            where[f] = f"{here}.{f}" if own is not None else f
        where["resume_args"] = f"{where['checkpoint']}.resume_args"
        where["parameters"] = f"{here}.parameters"
        where["sweep"] = f"{here}.sweep"
        steps.append(_step(
            i, step.name, value, {**req.parameters, **step.parameters}, {**req.env, **step.env},
            step.sweep, where,
            {k: f"{here}.env.{k}" if k in step.env else f"env.{k}"
             for k in {**req.env, **step.env}},
        ))
    return steps


def _grid(sweep: dict[str, list[Any]] | None) -> list[dict[str, Any]]:
    if not sweep:
        return [{}]
    keys = list(sweep)
    return [dict(zip(keys, point, strict=True)) for point in itertools.product(*sweep.values())]


_FORMATTER = string.Formatter()


def render(template: str, values: Mapping[str, str]) -> str:
    """``template`` with its ``{placeholders}`` filled from ``values`` (``{{``/``}}`` are
    literal braces); ``ValueError`` naming an unknown placeholder and the known ones."""
    known = ", ".join(sorted(values))
    try:
        pieces = list(_FORMATTER.parse(template))
    except ValueError as exc:
        raise ValueError(
            f"{template!r} has unbalanced braces ({exc}); write {{{{ and }}}} for literal braces"
        ) from None
    out = []
    for literal, field, spec, conversion in pieces:
        out.append(literal)
        if field is None:
            continue
        if spec or conversion or not _IDENT.fullmatch(field):
            raise ValueError(
                f"placeholder {{{field}{'!' + conversion if conversion else ''}"
                f"{':' + spec if spec else ''}}} is not supported; write a bare name such as "
                f"{{lr}} (known: {known})"
            )
        if field not in values:
            raise ValueError(
                f"unknown placeholder {{{field}}}; use one of: {known} (add it to parameters "
                "or the sweep, or write {{ and }} for literal braces)"
            )
        out.append(values[field])
    return "".join(out)


def _render_one(template: str, values: Mapping[str, str], where: str, step: _Step,
                req: JobRequest) -> str:
    try:
        return render(template, values)
    except ValueError as exc:
        raise _RuleError(where, _in_step(exc, where, step, req)) from None


def _render_all(templates: Sequence[str], values: Mapping[str, str], where: str, step: _Step,
                req: JobRequest) -> tuple[str, ...]:
    return tuple(
        _render_one(t, values, f"{where}.{i}", step, req) for i, t in enumerate(templates)
    )


def _in_step(exc: ValueError, where: str, step: _Step, req: JobRequest) -> str:
    inherited = req.steps and not where.startswith("steps.")
    return f"in step {step.name!r}: {exc}" if inherited else str(exc)


def _in_step_text(message: str, where: str, step: _Step, req: JobRequest) -> str:
    inherited = req.steps and not where.startswith("steps.")
    return f"in step {step.name!r}: {message}" if inherited else message


def _unit_volume(volume: Volume, values: Mapping[str, str], where: str, step: _Step,
                 req: JobRequest) -> UnitVolume:
    sub_path = None
    if volume.sub_path is not None:
        sub_path = _render_one(volume.sub_path, values, f"{where}.sub_path", step, req)
    kind = volume.kind
    empty = volume.empty_dir
    return UnitVolume(
        name=volume.name, kind=kind, mount_path=volume.mount_path,
        source="" if kind == "empty_dir" else getattr(volume, kind),
        read_only=volume.read_only or kind in ("secret", "config_map"), sub_path=sub_path,
        medium=empty.medium if empty is not None else "",
        size_limit=empty.size_limit if empty is not None else None,
    )


def _request_path(field: str, step: _Step) -> str:
    """The request path of a unit-relative ``field`` (``volumes.1.sub_path``, ``cpu``,
    ``env.NAME.value_from.secret``) in ``step``: its own, or the job-level one it inherits."""
    head, _, rest = field.partition(".")
    if head == "env":
        name, _, tail = rest.partition(".")
        base = step.env_where.get(name, f"env.{name}")
        return f"{base}.{tail}" if tail else base
    base = step.where.get(head, head)
    return f"{base}.{rest}" if rest else base


def _admit_units(req: JobRequest, units: Sequence[UnitSpec], admission: AdmissionConfig) -> None:
    """Raise ``_RuleError`` (at the request's field) for the first unit the admission limits
    refuse: resource caps and the team's volume and secret allow-lists."""
    steps = {s.index: s for s in _resolve(req)}
    for unit in units:
        step = steps[unit.step_index]
        if unit.gpus > admission.max_gpus_per_job:  # nodes x gpus_per_node (gpus is checked)
            where = step.where["gpus_per_node" if step.gpus_per_node is not None else "nodes"]
            raise _RuleError(where, _in_step_text(
                f"{unit.nodes} nodes x {unit.gpus_per_node} GPUs = {unit.gpus} GPUs is above "
                f"this pool's limit of {admission.max_gpus_per_job} per job "
                "(admission.max_gpus_per_job); ask for fewer nodes", where, step, req))
        problems = _admission_problems(unit, req.team, admission)
        if problems:
            field, message = problems[0]
            where = _request_path(field, step)
            raise _RuleError(where, _in_step_text(message, where, step, req))


def _build_units(req: JobRequest, max_units: int = UNITS_CEILING,
                 shapes: Sequence[tuple[int, float | None, int | None]] = ()) -> list[UnitSpec]:
    steps = _resolve(req)
    first: dict[str, int] = {}
    for i, name in enumerate(s.name for s in steps):
        if first.setdefault(name, i) != i:
            raise _RuleError(f"steps.{i}.name", f"step name {name!r} is used twice; rename one")
    if req.steps and req.sweep is not None:
        raise _RuleError(
            "sweep", "a request with steps sweeps inside a step; move it to steps[i].sweep"
        )
    for step in steps:
        for f, label in (("image", "an image"), ("gpus", "a GPU count")):
            if getattr(step, f) is None and not (f == "gpus" and step.gpus_per_node is not None):
                example = "registry.example.com/team/app:1.0" if f == "image" else "8"
                fix = (
                    f"set {f} at the job level or in step {step.name!r}" if req.steps
                    else f"set {f} (e.g. {example})"
                )
                raise _RuleError(f, f"required field is missing: every unit needs {label}; {fix}")

    units: list[UnitSpec] = []
    outputs: dict[str, tuple[str, int]] = {}
    previous: tuple[tuple[int, int], ...] = ()
    for step in steps:
        members = _grid(step.sweep)
        swept = step.sweep or {}
        base = {k: v for k, v in step.parameters.items() if k not in swept}
        upper: dict[str, str] = {}
        for key in (*base, *swept):
            other = upper.setdefault(key.upper(), key)
            if other != key:
                raise _RuleError(
                    step.where["parameters"],
                    f"parameters {other!r} and {key!r} both become {PARAM_ENV_PREFIX}"
                    f"{key.upper()}; rename one",
                )
        gpus, nodes, split = _node_layout(step, req, shapes)
        checkpointable = step.checkpoint is not None and step.checkpoint.enabled
        if step.min_gpus is not None and nodes > 1:
            where = step.where["min_gpus"]
            raise _RuleError(where, _in_step_text(
                f"a multi-node unit ({nodes} nodes of {gpus // nodes} GPUs) starts and stops as "
                "one gang and is not elastic; remove min_gpus (or run it on one node)", where,
                step, req))
        min_gpus = _check_min_gpus(step, gpus, checkpointable, req)
        per_node = gpus // nodes
        if nodes > 1:
            _check_gang_name(req, step, len(members) - 1, nodes)
        # with nodes given, cpu and memory are per node; a split plain request shares its own
        cpu_total, memory_total = _gang_resources(step, gpus, nodes, split)
        this_step: list[tuple[int, int]] = []
        for member, point in enumerate(members):
            params = {**base, **point}
            values = {k: scalar_text(v) for k, v in params.items()}
            values.update(
                name=req.name, team=req.team, step=step.name, member=str(member),
                gpus=str(per_node),
            )
            output = None
            if step.output is not None:
                output = _render_one(step.output, values, step.where["output"], step, req)
                if output in outputs:
                    first_step, first_member = outputs[output]
                    raise _RuleError(
                        step.where["output"],
                        f"units {first_step}/{first_member} and {step.name}/{member} would both "
                        f"write to {output}; put {{step}} and {{member}} (or the swept "
                        "parameters) into the output path",
                    )
                outputs[output] = (step.name, member)
                values["output"] = output
            args = _render_all(step.args, values, step.where["args"], step, req)
            env_user = {
                key: _render_one(text, values, step.env_where[key], step, req)
                for key, text in step.env.items() if isinstance(text, str)
            }
            env_refs = tuple(
                EnvKeyRef(name=key, kind=ref.value_from.kind, source=ref.value_from.ref,
                          key=ref.value_from.key, optional=ref.value_from.optional)
                for key, ref in step.env.items() if isinstance(ref, ValueFrom)
            )
            volumes = tuple(
                _unit_volume(v, values, f"{step.where['volumes']}.{i}", step, req)
                for i, v in enumerate(step.volumes)
            )
            resume: tuple[str, ...] = ()
            if checkpointable:
                resume = _render_all(
                    step.checkpoint.resume_args, values, step.where["resume_args"], step, req  # type: ignore[union-attr]
                )
            env = list(env_user.items())
            env += [
                ("IDLEGPU_JOB", req.name), ("IDLEGPU_TEAM", req.team),
                ("IDLEGPU_STEP", step.name), ("IDLEGPU_MEMBER", str(member)),
                ("IDLEGPU_GPUS", str(per_node)),
            ]
            if nodes > 1:
                env.append(("IDLEGPU_NODES", str(nodes)))
            if output is not None:
                env.append(("IDLEGPU_OUTPUT", output))
            env += [(PARAM_ENV_PREFIX + k.upper(), scalar_text(params[k])) for k in sorted(params)]
            units.append(UnitSpec(
                step=step.name,
                step_index=step.index,
                member=member,
                image=step.image,  # type: ignore[arg-type]
                command=tuple(step.command),
                args=args,
                env=tuple(env),
                parameters=tuple((k, scalar_text(params[k])) for k in sorted(params)),
                gpus=gpus,
                min_gpus=min_gpus,
                nodes=nodes,
                cpu=cpu_total,
                memory=memory_total,
                runtime_estimate_s=step.runtime,
                checkpointable=checkpointable,
                checkpoint_interval_s=step.checkpoint.interval if checkpointable else None,  # type: ignore[union-attr]
                saves_on_stop=checkpointable and step.checkpoint.saves_on_stop,  # type: ignore[union-attr]
                answers_notice=checkpointable and step.checkpoint.notice,  # type: ignore[union-attr]
                resume_args=resume,
                priority=step.priority,
                deadline=step.deadline,
                max_preemptions=step.max_preemptions,
                output=output,
                depends_on=previous,
                kind=step.kind,
                volumes=volumes,
                env_from=tuple(
                    EnvFromSource(kind=e.kind, name=e.ref, prefix=e.prefix, optional=e.optional)
                    for e in step.env_from
                ),
                env_refs=env_refs,
                ephemeral_storage_request=(
                    None if step.ephemeral_storage is None
                    else step.ephemeral_storage.request or step.ephemeral_storage.limit
                ),
                ephemeral_storage_limit=(
                    None if step.ephemeral_storage is None else step.ephemeral_storage.limit
                ),
            ))
            problems = _structure_problems(units[-1])
            if problems:
                field, message = problems[0]
                where = _request_path(field, step)
                raise _RuleError(where, _in_step_text(message, where, step, req))
            this_step.append((step.index, member))
            if len(units) > max_units:
                raise _RuleError(
                    "steps" if req.steps else "sweep",
                    f"the request expands to more than {max_units} units "
                    "(admission.limits.max_units); sweep fewer values or split it into several "
                    "requests",
                )
        previous = tuple(this_step)
    return units


def _check_min_gpus(step: _Step, gpus: int, checkpointable: bool,
                    req: JobRequest) -> int | None:
    """The unit's ``min_gpus`` (None: not elastic), or ``_RuleError`` at the field."""
    if step.min_gpus is None:
        return None
    where = step.where["min_gpus"]
    least = int(step.min_gpus)

    def refuse(message: str) -> _RuleError:
        return _RuleError(where, _in_step_text(message, where, step, req))

    if least < 1:
        raise refuse(f"min_gpus must be at least 1 (got {least}); set it to the fewest GPUs "
                     f"the unit can run on, from 1 to its {gpus} GPUs")
    if least > gpus:
        raise refuse(f"min_gpus {least} is above the unit's {gpus} GPUs; set min_gpus to at "
                     f"most {gpus} (or leave it out: the unit then always runs on {gpus})")
    if least == gpus:
        return None  # not elastic: it runs on gpus or not at all
    if not checkpointable:
        raise refuse(
            "an elastic unit shrinks by checkpointing and restarting on fewer GPUs, so it needs "
            "checkpointing; add checkpoint: {interval: 30m, resume_args: [...]}, or remove "
            "min_gpus"
        )
    templates = [("args", t) for t in step.args]
    templates += [("env", t) for t in step.env.values() if isinstance(t, str)]
    if step.checkpoint is not None:
        templates += [("resume_args", t) for t in step.checkpoint.resume_args]
    templates += [("volumes", v.sub_path) for v in step.volumes if v.sub_path]
    for field, template in templates:
        try:
            names = {f for _, f, _, _ in _FORMATTER.parse(template) if f}
        except ValueError:
            continue  # reported by the rendering, with its fix
        if "gpus" in names:
            raise refuse(
                f"{{gpus}} in {step.where.get(field, field)} is filled in once, but an elastic "
                f"unit may run on {least} to {gpus} GPUs; read the IDLEGPU_GPUS environment "
                "variable instead (it holds the GPUs of each attempt), or remove min_gpus"
            )
    return least


def _node_layout(step: _Step, req: JobRequest,
                 shapes: Sequence[tuple[int, float | None, int | None]]) -> tuple[int, int, bool]:
    """``(gpus in all, nodes, split)`` of a step's units, or ``_RuleError`` at the field:
    ``nodes`` x ``gpus_per_node`` (or ``gpus`` the total), checked against the largest node
    of the pool's shapes; a plain ``gpus`` above that node split into whole nodes
    (``split``)."""
    def refuse(field: str, message: str) -> _RuleError:
        where = step.where[field]
        return _RuleError(where, _in_step_text(message, where, step, req))

    biggest = max((g for g, _, _ in shapes), default=None)
    nodes, per_node, total = step.nodes, step.gpus_per_node, step.gpus
    if nodes is None and per_node is None:
        gpus = int(total)  # type: ignore[arg-type]
        if biggest is None or gpus <= biggest:
            return gpus, 1, False
        if gpus % biggest:
            lower, upper = gpus // biggest * biggest, (gpus // biggest + 1) * biggest
            sizes = f"{lower} or {upper}" if lower else f"{upper}"
            raise refuse("gpus", (
                f"{gpus} GPUs do not fit one node of this pool (at most {biggest} GPUs, "
                f"pool.nodes) and are not a multiple of {biggest}, so they cannot be split into "
                f"whole nodes; ask for {sizes} GPUs, or set nodes and gpus_per_node"))
        return gpus, gpus // biggest, True
    if per_node is None:  # nodes with the total
        nodes = int(nodes)  # type: ignore[arg-type]
        gpus = int(total)  # type: ignore[arg-type]
        if gpus % nodes:
            raise refuse("nodes", (
                f"{gpus} GPUs do not split evenly over {nodes} nodes; set gpus_per_node (gpus "
                f"is then nodes x gpus_per_node), or a gpus that is a multiple of {nodes}"))
        per_node = gpus // nodes
    else:
        per_node = int(per_node)
        if nodes is None:
            if total is None or int(total) == per_node:
                nodes = 1
            elif int(total) % per_node:
                raise refuse("gpus_per_node", (
                    f"gpus {total} is not a multiple of gpus_per_node {per_node}; set nodes, or "
                    f"a gpus that is a multiple of {per_node}"))
            else:
                nodes = int(total) // per_node
        nodes = int(nodes)
        if total is not None and int(total) != nodes * per_node:
            raise refuse("gpus", (
                f"gpus {total} is not nodes x gpus_per_node ({nodes} x {per_node} = "
                f"{nodes * per_node}); leave gpus out, or make it {nodes * per_node}"))
        gpus = nodes * per_node
    field = "gpus_per_node" if step.gpus_per_node is not None else "nodes"
    if biggest is not None and per_node > biggest:
        raise refuse(field, (
            f"{per_node} GPUs per node is above the pool's largest node ({biggest} GPUs, "
            f"pool.nodes); ask for at most {biggest} GPUs per node and more nodes (e.g. nodes: "
            f"{math.ceil(gpus / biggest)} with gpus_per_node: {biggest})"))
    return gpus, nodes, False


GANG_MAX_ATTEMPTS_DIGITS = 3
"""A gang's Job names leave room for attempt numbers up to 999."""


def _check_gang_name(req: JobRequest, step: _Step, last_member: int, nodes: int) -> None:
    """``_RuleError`` at ``name`` when the pods of this step's gangs could not be named: an
    Indexed Job's pod is ``<job>-<rank>``, a DNS label of at most 63 characters, and the Job
    is ``idlegpu-<name>-<8 hex>-<step>-<member>-a<attempt>`` (the server refuses a Job whose
    pods it could not name)."""
    longest = len(f"idlegpu-{req.name}-{'0' * 8}-{step.index}-{last_member}-a"
                  f"{'9' * GANG_MAX_ATTEMPTS_DIGITS}-{nodes - 1}")
    if longest > 63:
        raise _RuleError("name", (
            f"a multi-node unit's pods are named after its Kubernetes Job and their rank (63 "
            f"characters at most), which leaves this request's name at most "
            f"{len(req.name) - (longest - 63)} characters (it has {len(req.name)}); shorten it"))


def _gang_resources(step: _Step, gpus: int, nodes: int, split: bool) -> tuple[float, str]:
    """The unit's total CPU cores and memory: ``cpu`` and ``memory`` as given (one pod, or a
    plain request split into nodes: shared evenly), per node times ``nodes`` for a unit
    that names its nodes, else the defaults per GPU."""
    times = 1 if split else nodes
    cpu = float(step.cpu) * times if step.cpu is not None else DEFAULT_CPU_PER_GPU * gpus
    if step.memory is None:
        memory = f"{DEFAULT_MEMORY_GI_PER_GPU * gpus}Gi"
    elif times == 1:
        memory = step.memory
    else:
        memory = _format_bytes(quantity_bytes(step.memory) * times)
    return cpu, memory


def memory_per_node(spec: UnitSpec) -> str:
    """The memory quantity of one pod of ``spec`` (its total shared by its ``nodes``)."""
    if spec.nodes <= 1:
        return spec.memory
    share = quantity_bytes(spec.memory) / spec.nodes
    mib = max(1, int((share / 2**20).to_integral_value(rounding="ROUND_CEILING")))
    return _format_bytes(Decimal(mib) * 2**20)


def _node_shapes_of(context: Any) -> tuple[tuple[int, float | None, int | None], ...]:
    """``(gpus, cpu, memory bytes)`` of each node shape a validation context names."""
    if not isinstance(context, Mapping):
        return ()
    return tuple(context.get("node_shapes") or ())


def resize_unit(spec: UnitSpec, gpus: int) -> UnitSpec:
    """An elastic unit as it runs on ``gpus`` GPUs (``min_gpus`` to ``spec.gpus``): CPU and
    memory scaled to the same share of the full size (so the per-GPU caps still hold) and
    ``IDLEGPU_GPUS`` set to ``gpus``; the rest (image, args, output, checkpoint) unchanged."""
    full = int(spec.gpus)
    gpus = int(gpus)
    if gpus == full:
        return spec
    least = spec.min_gpus or full
    if not least <= gpus < full:
        raise ValueError(f"unit {spec.step}/{spec.member} runs on {least} to {full} GPUs, "
                         f"not {gpus}")
    memory = quantity_bytes(spec.memory) * gpus / full
    mib = max(1, int((memory / 2**20).to_integral_value(rounding="ROUND_CEILING")))
    env = tuple((k, str(gpus) if k == "IDLEGPU_GPUS" else v) for k, v in spec.env)
    return replace(spec, gpus=gpus, cpu=round(spec.cpu * gpus / full, 3),
                   memory=f"{mib // 1024}Gi" if mib % 1024 == 0 else f"{mib}Mi", env=env)


def expand_units(request: JobRequest) -> list[UnitSpec]:
    """The runnable units of ``request``: one per step and sweep member, in pipeline order.

    Members of a step are numbered along the sweep grid (first key slowest); each unit of step
    ``i > 0`` depends on every member of step ``i - 1``. Templates are filled, parameters are
    added to the environment as ``IDLEGPU_PARAM_<NAME>`` (next to ``IDLEGPU_JOB``,
    ``IDLEGPU_TEAM``, ``IDLEGPU_STEP``, ``IDLEGPU_MEMBER``, ``IDLEGPU_GPUS`` and
    ``IDLEGPU_OUTPUT``), durations are seconds and times UTC.
    """
    try:
        return _build_units(request, shapes=request._node_shapes)
    except _RuleError as exc:  # only reachable for a request built without validation
        raise SpecError(f"{request.name}: {exc.field}: {exc.message}") from None


# --------------------------------------------------------------------------------------------
# Rules on units: applied at submission and again by the daemon (recheck_unit)

_REF_WORDS = {
    "persistent_volume_claim": ("persistent volume claim", "persistent_volume_claims"),
    "secret": ("secret", "secrets"),
    "config_map": ("config map", "config_maps"),
}
_HOST_PATH = (
    "hostPath volumes are not allowed (they expose the node's filesystem, shared with "
    "production inference); use a persistent_volume_claim, or read and write cloud storage"
)


def _nvidia(name: str) -> bool:
    return name.upper().startswith(NVIDIA_ENV_PREFIX)


def _bytes_or_none(text: str | None) -> Decimal | None:
    try:
        return None if text is None else quantity_bytes(text)
    except ValueError:
        return None


def _structure_problems(unit: UnitSpec) -> list[tuple[str, str]]:
    """``(unit-relative field, problem; fix)`` for every rule a unit breaks whatever the
    admission limits: NVIDIA_* variables, volume kinds (never hostPath), names and mount paths
    unique, relative sub-paths, sizes that fit the unit."""
    problems: list[tuple[str, str]] = []
    for name, _ in unit.env:
        if _nvidia(name):
            problems.append((f"env.{name}", (f"environment variable {name!r} is refused: "
                             f"{_NVIDIA_WHY}")))
    for ref in unit.env_refs:
        where = f"env.{ref.name}"
        if _nvidia(ref.name):
            problems.append((where, (f"environment variable {ref.name!r} is refused: "
                             f"{_NVIDIA_WHY}")))
        if ref.kind not in REF_KINDS:
            problems.append((f"{where}.value_from", (f"{ref.kind!r} cannot be referenced; "
                             "read the value from a secret or config_map")))
    for i, env in enumerate(unit.env_from):
        if env.kind not in REF_KINDS:
            problems.append((f"env_from.{i}", (f"{env.kind!r} cannot be referenced; import a "
                             "secret or config_map")))
        try:
            _check_prefix(env.prefix)
        except ValueError as exc:
            problems.append((f"env_from.{i}.prefix", str(exc)))

    memory = _bytes_or_none(unit.memory)
    if memory is None:
        problems.append(("memory", (f"{unit.memory!r} is not a memory quantity; use a "
                         "Kubernetes quantity such as 64Gi")))
    limit = _bytes_or_none(unit.ephemeral_storage_limit)
    request = _bytes_or_none(unit.ephemeral_storage_request)
    if (unit.ephemeral_storage_limit is not None and limit is None) or (
            unit.ephemeral_storage_request is not None and request is None):
        problems.append(("ephemeral_storage", "not a Kubernetes quantity; use e.g. 100Gi"))
    elif request is not None and limit is None:
        problems.append(("ephemeral_storage.limit", ("a request without a limit lets the unit "
                         "fill the node's disk; set a limit")))
    elif request is not None and limit is not None and request > limit:
        problems.append(("ephemeral_storage.request",
                         (f"the request {unit.ephemeral_storage_request} is above the limit "
                         f"{unit.ephemeral_storage_limit}; ask for at most the limit")))

    names: dict[str, int] = {}
    paths: dict[str, int] = {}
    for i, volume in enumerate(unit.volumes):
        here = f"volumes.{i}"
        if volume.kind == "host_path":
            problems.append((f"{here}.host_path", _HOST_PATH))
            continue
        if volume.kind not in VOLUME_KINDS:
            problems.append((here, (f"unknown volume kind {volume.kind!r}; use one of "
                             f"{', '.join(VOLUME_KINDS)}")))
            continue
        if not _LABEL.fullmatch(volume.name) or len(volume.name) > 63:
            problems.append((f"{here}.name", (f"{volume.name!r} is not a volume name; use "
                             "lowercase letters, digits and '-' (at most 63)")))
        elif volume.name in names:
            problems.append((f"{here}.name", (f"volume name {volume.name!r} is also the name of "
                             f"volumes.{names[volume.name]}; give every volume its own name")))
        names.setdefault(volume.name, i)
        try:
            path = _mount_path(volume.mount_path) if volume.mount_path.startswith("/") else None
        except ValueError as exc:
            problems.append((f"{here}.mount_path", str(exc)))
            path = ""
        if path is None:
            problems.append((f"{here}.mount_path", (f"{volume.mount_path!r} is not absolute; "
                             "use an absolute path such as /data")))
        elif path and path in paths:
            problems.append((f"{here}.mount_path", (f"{path} is also the mount path of "
                             f"volumes.{paths[path]}; mount every volume at its own path")))
        if path:
            paths.setdefault(path, i)
        if volume.sub_path is not None:
            problem = _sub_path_problem(volume.sub_path)
            if problem:
                problems.append((f"{here}.sub_path", problem))
        if volume.kind != "empty_dir":
            if not re.match(_OBJECT_NAME, volume.source) or len(volume.source) > 253:
                problems.append((f"{here}.{volume.kind}", (f"{volume.source!r} is not the name "
                                 "of a Kubernetes object; use lowercase letters, digits, '-' "
                                 "and '.'")))
            if volume.medium or volume.size_limit is not None:
                problems.append((f"{here}.empty_dir", ("medium and size_limit are for "
                                 "empty_dir volumes only; remove them")))
            continue
        if volume.medium not in ("", "Memory"):
            problems.append((f"{here}.empty_dir.medium", (f"{volume.medium!r} is not a medium; "
                             "use Memory, or leave it out for the node's disk")))
        size = _bytes_or_none(volume.size_limit)
        if volume.size_limit is not None and size is None:
            problems.append((f"{here}.empty_dir.size_limit", (f"{volume.size_limit!r} is not a "
                             "Kubernetes quantity; use e.g. 16Gi")))
        elif size is not None and volume.medium == "Memory" and memory is not None \
                and size > memory:
            problems.append((f"{here}.empty_dir.size_limit", (
                f"a Memory empty_dir of {volume.size_limit} counts against the unit's memory "
                f"({unit.memory}); set size_limit to at most {unit.memory}, or raise memory")))
        elif size is not None and volume.medium != "Memory" and limit is not None \
                and size > limit:
            problems.append((f"{here}.empty_dir.size_limit", (
                f"a disk empty_dir of {volume.size_limit} is above the unit's ephemeral_storage "
                f"limit ({unit.ephemeral_storage_limit}); set size_limit to at most that, or "
                "raise ephemeral_storage")))
    return problems


def _allowed(admission: AdmissionConfig, team: str, key: str) -> list[str]:
    names: list[str] = []
    for entry in (admission.team_volumes.get(team), admission.team_volumes.get("*")):
        if entry is not None:
            names += getattr(entry, key)
    return list(dict.fromkeys(names))


def _refusal(admission: AdmissionConfig, team: str, kind: str, name: str,
             verb: str) -> str | None:
    word, key = _REF_WORDS[kind]
    allowed = _allowed(admission, team, key)
    if any(fnmatch.fnmatchcase(name, pattern) for pattern in allowed):
        return None
    setting = f"admission.team_volumes.{team}.{key}"
    if not allowed:
        return (
            f"team {team!r} may not {verb} the {word} {name!r}: no {key} are allowed for "
            f"{team} ({setting} is empty); ask the pool's operator to add it there"
            + (", or use an empty_dir" if kind == "persistent_volume_claim" else "")
        )
    return (
        f"team {team!r} may not {verb} the {word} {name!r}; allowed for {team}: "
        f"{', '.join(allowed)} ({setting}); use one of those, or ask the pool's operator to add "
        "it there"
    )


def _cap_text(gpus: int, per_gpu: str, absolute: str, setting: str, cap: str) -> str:
    if gpus > 0:
        return f"the cap of {per_gpu} per GPU ({cap} for {gpus} GPU(s), admission.{setting}_per_gpu)"
    return f"the cap of {absolute} for a unit without GPUs (admission.{setting}_without_gpus)"


def _admission_problems(unit: UnitSpec, team: str,
                        admission: AdmissionConfig) -> list[tuple[str, str]]:
    """``(unit-relative field, problem; fix)`` for every admission limit the unit breaks: the
    CPU, memory and ephemeral-storage caps, and the team's list of claims, Secrets and
    ConfigMaps."""
    problems: list[tuple[str, str]] = []
    gpus = max(0, int(unit.gpus))
    if gpus > 0:
        cpu_cap = admission.max_cpu_per_gpu * gpus
        memory_cap = quantity_bytes(admission.max_memory_per_gpu) * gpus
        disk_cap = quantity_bytes(admission.max_ephemeral_storage_per_gpu) * gpus
    else:
        cpu_cap = admission.max_cpu_without_gpus
        memory_cap = quantity_bytes(admission.max_memory_without_gpus)
        disk_cap = quantity_bytes(admission.max_ephemeral_storage_without_gpus)
    cpu = float(unit.cpu)
    if not math.isfinite(cpu) or cpu <= 0:
        problems.append(("cpu", f"{cpu!r} is not a number of CPU cores; use e.g. 8 or 500m"))
    elif cpu > cpu_cap + 1e-9:
        where = _cap_text(gpus, f"{admission.max_cpu_per_gpu:g}",
                          f"{admission.max_cpu_without_gpus:g}", "max_cpu", f"{cpu_cap:g}")
        problems.append(("cpu", f"{cpu:g} CPUs is above {where}; ask for at most {cpu_cap:g}"))
    memory = _bytes_or_none(unit.memory)
    if memory is not None and memory > memory_cap:
        where = _cap_text(gpus, admission.max_memory_per_gpu, admission.max_memory_without_gpus,
                          "max_memory", _format_bytes(memory_cap))
        problems.append(("memory", (f"{unit.memory} is above {where}; ask for at most "
                         f"{_format_bytes(memory_cap)}")))
    disk_where = _cap_text(gpus, admission.max_ephemeral_storage_per_gpu,
                           admission.max_ephemeral_storage_without_gpus,
                           "max_ephemeral_storage", _format_bytes(disk_cap))
    limit = _bytes_or_none(unit.ephemeral_storage_limit)
    if limit is not None and limit > disk_cap:
        problems.append(("ephemeral_storage", (f"{unit.ephemeral_storage_limit} of node disk is "
                         f"above {disk_where}; ask for at most {_format_bytes(disk_cap)}")))
    for i, volume in enumerate(unit.volumes):
        if volume.kind in _REF_WORDS:
            refused = _refusal(admission, team, volume.kind, volume.source, "mount")
            if refused:
                problems.append((f"volumes.{i}.{volume.kind}", refused))
        elif volume.kind == "empty_dir" and volume.medium != "Memory":
            size = _bytes_or_none(volume.size_limit)
            if size is not None and size > disk_cap:
                problems.append((f"volumes.{i}.empty_dir.size_limit", (
                    f"an empty_dir of {volume.size_limit} on the node's disk is above "
                    f"{disk_where}; set size_limit to at most {_format_bytes(disk_cap)}")))
    for i, env in enumerate(unit.env_from):
        if env.kind in _REF_WORDS:
            refused = _refusal(admission, team, env.kind, env.name, "read")
            if refused:
                problems.append((f"env_from.{i}.{env.kind}", refused))
    for ref in unit.env_refs:
        if ref.kind in _REF_WORDS:
            refused = _refusal(admission, team, ref.kind, ref.source, "read")
            if refused:
                problems.append((f"env.{ref.name}.value_from.{ref.kind}", refused))
    return problems


def recheck_unit(spec: UnitSpec, team: str, admission: AdmissionConfig) -> None:
    """Re-apply, to a stored unit, every admission rule that can be checked on it, with the
    *daemon's* ``admission`` config (the store holds whatever a submitter's process accepted,
    under its own config and environment): image registry, tag and digest; at most
    ``max_gpus_per_job`` GPUs; the CPU, memory and ephemeral-storage caps; the team's claims,
    Secrets and ConfigMaps; no NVIDIA_* variables; no hostPath or unknown volume; unique volume
    names and mount paths.

    Pure (no I/O). Raises ``SpecError("the daemon's admission rules refuse it: <field>:
    <problem>; <fix> | ...")`` listing every problem; returns None when the unit may run.
    """
    problems: list[tuple[str, str]] = []
    try:
        check_image(spec.image, admission.allowed_registries)
    except ValueError as exc:
        problems.append(("image", str(exc)))
    if spec.gpus < 0 or spec.gpus > admission.max_gpus_per_job:
        problems.append(("gpus", (f"{spec.gpus} GPUs is outside 0..{admission.max_gpus_per_job} "
                         "(admission.max_gpus_per_job); ask for fewer GPUs")))
    if spec.min_gpus is not None and not (
            1 <= spec.min_gpus < spec.gpus and spec.checkpointable):
        problems.append(("min_gpus", (
            f"min_gpus {spec.min_gpus} does not fit a unit of {spec.gpus} GPUs that "
            f"{'can' if spec.checkpointable else 'cannot'} checkpoint; an elastic unit runs on "
            "1 to gpus - 1 GPUs and checkpoints (resubmit it)")))
    if spec.nodes < 1 or spec.gpus % spec.nodes or (spec.nodes > 1 and spec.min_gpus):
        problems.append(("nodes", (
            f"{spec.gpus} GPUs on {spec.nodes} nodes{' elastic' if spec.min_gpus else ''} is "
            "no multi-node unit (whole pods of equal GPUs, not elastic); resubmit it")))
    problems += _structure_problems(spec)
    problems += _admission_problems(spec, team, admission)
    if problems:
        text = " | ".join(f"{field}: {message}" for field, message in problems)
        raise SpecError((RECHECK_PREFIX + text).replace("\n", " "))


# --------------------------------------------------------------------------------------------
# Trace entries (simulation input)


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


def _custom(field: str, message: str) -> PydanticCustomError:
    return PydanticCustomError(
        "idlegpu_spec", "{idlegpu_msg}", {"idlegpu_msg": message, "idlegpu_field": field}
    )


# --------------------------------------------------------------------------------------------
# Loading and error messages


def admission_context(admission: AdmissionConfig | None = None,
                      nodes: Sequence[Any] = ()) -> dict[str, Any]:
    """The validation context carrying ``admission``'s limits (defaults when None) and the
    pool's node shapes (``pool.nodes``: ``NodeShape``s; empty: not described)."""
    admission = admission or _DEFAULT_ADMISSION
    return {
        "admission": admission,
        "allowed_registries": list(admission.allowed_registries),
        "max_gpus_per_job": admission.max_gpus_per_job,
        "node_shapes": tuple((int(n.gpus), None if n.cpu is None else float(n.cpu),
                              n.memory_bytes) for n in nodes or ()),
    }


_HINTS = {
    "gpus": "use a whole number of GPUs from 1 to {max_gpus}",
    "min_gpus": "use a whole number of GPUs from 1 to the unit's gpus, or leave it out",
    "cpu": "use a number of CPU cores such as 8, 0.5 or 500m",
    "memory": "use a Kubernetes quantity such as 64Gi",
    "runtime_estimate": "use a duration such as 90m, 36h or 2d",
    "interval": "use a duration such as 30m",
    "actual_runtime": "use a duration such as 90m, 36h or 2d, or one per step",
    "deadline": "write an ISO 8601 time with its offset, e.g. 2025-11-03T09:00:00+09:00",
    "submit_at": "write an ISO 8601 time with its offset, e.g. 2025-11-03T09:00:00+09:00",
    "name": "use lowercase letters, digits and '-' (start and end with a letter or digit)",
    "team": "use lowercase letters, digits and '-', e.g. alignment",
    "kind": "use one of " + ", ".join(KINDS),
    "priority": "use a whole number (higher runs first)",
    "max_preemptions": "use a whole number from 0 to 1000000, or leave it out",
    "command": "use a list of strings, e.g. [python, train.py]",
    "args": "use a list of strings, e.g. [--lr, '{{lr}}']",
    "resume_args": "use a list of strings, e.g. [--resume, '{{output}}/ckpt']",
    "parameters": "use a mapping of names to strings, numbers or true/false",
    "sweep": "use a mapping of parameter names to lists of values",
    "env": ("use a mapping of variable names to strings, or to "
            "{{value_from: {{secret: NAME, key: KEY}}}}"),
    "env_from": "use a list of {{secret: NAME}} or {{config_map: NAME}} entries",
    "value_from": "use {{secret: NAME, key: KEY}} or {{config_map: NAME, key: KEY}}",
    "key": "use the key as it is in the Secret or ConfigMap (letters, digits, '-', '_', '.')",
    "prefix": "use letters, digits and '_', e.g. WANDB_",
    "persistent_volume_claim": ("use the claim's name: lowercase letters, digits, '-' and "
                                "'.'"),
    "secret": "use the Secret's name: lowercase letters, digits, '-' and '.'",
    "config_map": "use the ConfigMap's name: lowercase letters, digits, '-' and '.'",
    "size_limit": "use a Kubernetes quantity such as 16Gi",
    "ephemeral_storage": ("use a Kubernetes quantity such as 100Gi, or "
                          "{{request: 50Gi, limit: 100Gi}}"),
    "request": "use a Kubernetes quantity such as 50Gi",
    "limit": "use a Kubernetes quantity such as 100Gi",
    "sub_path": "use a relative path such as ckpt/{{name}}/{{member}}",
    "steps": "use a list of steps, each with a name",
    "volumes": "use a list of volumes, each with name, mount_path and one source",
    "mount_path": "use an absolute path such as /data",
}
_BOOLEANS = {
    "enabled", "read_only", "privileged", "host_network", "host_pid", "host_ipc",
    "allow_privilege_escalation", "optional", "saves_on_stop", "notice",
}


def _describe(err: Mapping[str, Any], root: type[BaseModel], prefix: Sequence[Any],
              max_gpus: int) -> str:
    loc = list(err["loc"])
    ctx = err.get("ctx") or {}
    if err["type"] == "idlegpu_spec":
        loc += ctx["idlegpu_field"].split(".") if ctx.get("idlegpu_field") else []
        problem = ctx["idlegpu_msg"]
    elif err["type"] == "extra_forbidden":
        problem = unknown_field(root, loc)
    elif err["type"] == "missing":
        problem = f"required field is missing; add it ({_EXAMPLES})"
    else:
        msg = err["msg"].removeprefix("Value error, ")
        if err["type"] == "value_error":
            problem = msg
        else:
            got = err.get("input")
            shown = "" if isinstance(got, Mapping | list) else f" (got {brief(got)})"
            names = [p for p in loc if isinstance(p, str) and (p in _HINTS or p in _BOOLEANS)]
            last = names[-1] if names else None
            hint = (
                "use true or false" if last in _BOOLEANS
                else _HINTS.get(last, _EXAMPLES).format(max_gpus=max_gpus) if last else _EXAMPLES
            )
            if err["type"] == "timezone_aware":
                msg = "the time has no time zone"
                hint = "add its offset, e.g. 2025-11-03T09:00:00+09:00 (or Z for UTC)"
            problem = f"{msg}{shown}; {hint}"
    where = ".".join(str(p) for p in (*prefix, *loc)) or "(top level)"
    return f"{where}: {problem}"


def _format(exc: ValidationError, root: type[BaseModel], prefix: Sequence[Any] = (),
            context: Mapping[str, Any] | None = None, limit: int = 5) -> str:
    """Every problem of ``exc`` on one line: ``field.path: problem; fix | ...``."""
    max_gpus = int((context or {}).get("max_gpus_per_job", _DEFAULT_ADMISSION.max_gpus_per_job))
    errors = exc.errors()
    parts = []
    for err in errors[:limit]:
        # the tags of the env union (text or value_from) are not part of the file's layout
        loc, model = tuple(p for p in err["loc"] if p not in _ENV_TAGS), root
        if root is TraceEntry and loc[:1] == ("request",):
            # In a trace file the request's fields sit next to submit_at: no "request" level.
            loc, model = loc[1:], JobRequest
        parts.append(_describe({**err, "loc": loc}, model, prefix, max_gpus))
    if len(errors) > limit:
        parts.append(f"and {len(errors) - limit} more problem(s)")
    return " | ".join(parts).replace("\n", " ")


def validate_request(data: Any, admission: AdmissionConfig | None = None, *,
                     source: str = "request", nodes: Sequence[Any] = ()) -> JobRequest:
    """``data`` (a mapping, e.g. parsed YAML or an API body) as a validated ``JobRequest``;
    ``SpecError("<source>: <field>: <problem>; <fix>")`` when it is not one. ``nodes``: the
    pool's node shapes (``pool.nodes``) multi-node units are checked against and split by
    (every loader takes it)."""
    return _validate(JobRequest, data, admission, source, (), nodes)


def _validate(model: type[BaseModel], data: Any, admission: AdmissionConfig | None, source: str,
              prefix: Sequence[Any], nodes: Sequence[Any] = ()) -> Any:
    context = admission_context(admission, nodes)
    where = ".".join(str(p) for p in prefix)
    if not isinstance(data, Mapping):
        at = f"{where}: " if where else ""
        raise SpecError(
            f"{source}: {at}expected a mapping of request fields, got {type(data).__name__}; "
            f"{_EXAMPLES}"
        )
    limits = (admission or _DEFAULT_ADMISSION).limits
    try:
        precheck(_request_part(model, data), limits)
    except LimitError as exc:
        raise SpecError(_limit_message(source, prefix, exc)) from None
    try:
        return model.model_validate(dict(data), context=context)
    except ValidationError as exc:
        raise SpecError(f"{source}: {_format(exc, model, prefix, context)}") from None
    except (ValueError, TypeError, KeyError, IndexError, ArithmeticError,
            RecursionError) as exc:
        # a bug of ours, never the user's: still one line, not a traceback
        raise SpecError(f"{source}: the request cannot be validated (internal error "
                        f"{type(exc).__name__}; please report it); {_EXAMPLES}") from None


def _request_part(model: type[BaseModel], data: Mapping[str, Any]) -> Any:
    """The request fields of ``data``: itself, or a trace entry's request."""
    if model is TraceEntry:
        if "request" in data:
            return data["request"]
        return {k: v for k, v in data.items() if k not in ("submit_at", "actual_runtime")}
    return data


def _limit_message(source: str, prefix: Sequence[Any], exc: LimitError) -> str:
    where = ".".join(str(p) for p in (*prefix, *([exc.field] if exc.field else [])))
    return f"{source}: {where + ': ' if where else ''}{exc.message}".replace("\n", " ")


def _read_yaml(path: str | Path, admission: AdmissionConfig | None = None, *,
               many: bool = False) -> Any:
    """The YAML document in the file ``path``, read under ``admission.limits``: at most
    ``max_request_bytes`` for one request (``max_file_bytes`` with ``many``: lists and traces),
    depth and aliases bounded."""
    file = Path(path)
    limits = (admission or _DEFAULT_ADMISSION).limits
    cap = limits.max_file_bytes if many else limits.max_request_bytes
    try:
        if not file.is_file():
            raise SpecError(f"{file}: file not found; check the path (examples in examples/jobs/)")
        size = file.stat().st_size
        if size > cap:  # refused before a byte is read
            setting = "max_file_bytes" if many else "max_request_bytes"
            what = "the file" if many else "a request"
            raise SpecError(f"{file}: {what} of {size:,} bytes is above the limit of {cap:,} "
                            f"(admission.limits.{setting}); make it smaller (split a large "
                            "sweep into several requests, read large inputs from storage)")
        with file.open("rb") as handle:
            raw = handle.read(cap + 1)
    except OSError as exc:
        raise SpecError(f"{file}: cannot read the file ({exc.strerror or exc}); check the path "
                        "and its permissions") from None
    try:
        return load_yaml_text(raw, limits, max_bytes=cap if many else None,
                              what="the file" if many else "a request")
    except LimitError as exc:
        raise SpecError(_limit_message(str(file), (), exc)) from None


def parse_request_text(text: str | bytes, admission: AdmissionConfig | None = None, *,
                       source: str = "request", nodes: Sequence[Any] = ()) -> JobRequest:
    """The one job request in YAML or JSON ``text`` (a file's content, an API body), checked
    against ``admission.limits`` while it is parsed and before anything is expanded, then
    validated against ``admission``.

    Every problem is a ``SpecError("<source>: <field.path>: <problem>; <fix>")`` on one line
    (never another exception, whatever the text): the text too large, nested too deep, aliases
    that expand too far, invalid YAML, a field the rules refuse.
    """
    limits = (admission or _DEFAULT_ADMISSION).limits
    try:
        data = load_yaml_text(text, limits)
    except LimitError as exc:
        raise SpecError(_limit_message(source, (), exc)) from None
    return _request_data(data, admission, source, nodes)


def _request_data(data: Any, admission: AdmissionConfig | None, source: str,
                  nodes: Sequence[Any] = ()) -> JobRequest:
    if isinstance(data, Mapping) and set(data) == {"jobs"}:
        raise SpecError(
            f"{source}: jobs: the file holds a list of requests; submit one request per file "
            "or load the list with load_requests"
        )
    return _validate(JobRequest, data, admission, source, (), nodes)


def load_request(path: str | Path, admission: AdmissionConfig | None = None, *,
                 nodes: Sequence[Any] = ()) -> JobRequest:
    """The one job request in the YAML file ``path``, validated against ``admission`` (the
    file read as :func:`parse_request_text` reads a text)."""
    return _request_data(_read_yaml(path, admission), admission, str(path), nodes)


def load_request_text(text: str | bytes, admission: AdmissionConfig | None = None, *,
                      source: str = "request", nodes: Sequence[Any] = ()) -> JobRequest:
    """The one job request in YAML (or JSON) ``text``, e.g. an API body: the same as
    :func:`parse_request_text` (limits checked while parsing, before any expansion)."""
    return parse_request_text(text, admission, source=source, nodes=nodes)


def load_requests(path: str | Path, admission: AdmissionConfig | None = None, *,
                  nodes: Sequence[Any] = ()) -> list[JobRequest]:
    """The requests in ``path``: one request, or a list of them under ``jobs:``; job names must
    be unique."""
    data = _read_yaml(path, admission, many=True)
    if not (isinstance(data, Mapping) and "jobs" in data):
        return [_validate(JobRequest, data, admission, str(path), (), nodes)]
    jobs = data["jobs"]
    extra = sorted(set(data) - {"jobs"})
    if extra:
        raise SpecError(
            f"{path}: {extra[0]}: unknown top-level field next to jobs; move it into a job or "
            "remove it"
        )
    if not isinstance(jobs, list) or not jobs:
        raise SpecError(f"{path}: jobs: expected a non-empty list of requests; {_EXAMPLES}")
    requests = [
        _validate(JobRequest, job, admission, str(path), ("jobs", i), nodes)
        for i, job in enumerate(jobs)
    ]
    _unique_names([r.name for r in requests], path)
    return requests


def load_trace(path: str | Path, admission: AdmissionConfig | None = None, *,
               nodes: Sequence[Any] = ()) -> list[TraceEntry]:
    """A simulation trace: ``jobs:``, each a request plus ``submit_at`` and ``actual_runtime``;
    returned in submission order (ties keep the file's order)."""
    data = _read_yaml(path, admission, many=True)
    if not isinstance(data, Mapping) or not isinstance(data.get("jobs"), list):
        raise SpecError(
            f"{path}: jobs: a trace file needs a top-level 'jobs:' list of entries; see "
            "data/sample/jobs.yaml"
        )
    entries = [
        _validate(TraceEntry, job, admission, str(path), ("jobs", i), nodes)
        for i, job in enumerate(data["jobs"])
    ]
    _unique_names([e.request.name for e in entries], path)
    return sorted(entries, key=lambda e: e.submit_at)


def _unique_names(names: list[str], path: str | Path) -> None:
    seen: dict[str, int] = {}
    for i, name in enumerate(names):
        if name in seen:
            raise SpecError(
                f"{path}: jobs.{i}.name: {name!r} is already the name of jobs.{seen[name]}; "
                "give every job a unique name"
            )
        seen[name] = i
