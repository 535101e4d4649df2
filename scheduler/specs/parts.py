"""The parts of a request that are models of their own: checkpointing, Linux capabilities,
volumes, environment variables read from Secrets and ConfigMaps, node-local disk."""

from __future__ import annotations

import posixpath
from collections.abc import Mapping
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Discriminator,
    Field,
    Tag,
    field_validator,
    model_validator,
)

from idlegpu.scheduler.specs.constants import (
    _KEY,
    _LABEL,
    _NVIDIA_WHY,
    _OBJECT_NAME,
    NVIDIA_ENV_PREFIX,
    RESERVED_ENV_PREFIX,
)
from idlegpu.scheduler.specs.errors import _custom
from idlegpu.scheduler.specs.quantities import Duration, Memory, _env_value, quantity_bytes
from idlegpu.scheduler.types import VOLUME_KINDS

ObjectName = Annotated[str, Field(max_length=253, pattern=_OBJECT_NAME)]
"""The name of a PersistentVolumeClaim, Secret or ConfigMap in the jobs' namespace."""


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
