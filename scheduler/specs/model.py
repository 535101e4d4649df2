"""The job request model: :class:`JobRequest` (one step, or a pipeline of ``steps``) and its
:class:`StepSpec`, validated with pydantic against the admission limits of the validation
context (:mod:`idlegpu.scheduler.specs.context`), every unit it expands to included."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import (
    AwareDatetime,
    Field,
    PrivateAttr,
    ValidationInfo,
    field_validator,
    model_validator,
)

from idlegpu.scheduler.limits import brief
from idlegpu.scheduler.specs.checks import (
    _check_env,
    _check_gpus,
    _check_output,
    _check_parameter_names,
    _check_sweep,
    _no_true,
    check_image,
)
from idlegpu.scheduler.specs.constants import _LABEL, MAIN_STEP, MAX_NODES, JobKind
from idlegpu.scheduler.specs.context import _admission, _admission_of, _node_shapes_of
from idlegpu.scheduler.specs.errors import _custom, _RuleError
from idlegpu.scheduler.specs.expansion import _admit_units, _build_units, _grid, _resolve
from idlegpu.scheduler.specs.parts import (
    Capabilities,
    Checkpoint,
    EnvFrom,
    EnvMap,
    EphemeralStorage,
    Volume,
    _Strict,
)
from idlegpu.scheduler.specs.quantities import Cpu, Duration, Memory, Scalar, _to_utc


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
    gpus_step: int | None = None
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
    gpus_step: int | None = None
    """Elastic units: below ``gpus`` it runs on multiples of this many GPUs only, e.g. 8 for
    data-parallel replicas of 8 GPUs (32 GPUs, ``min_gpus: 16``: 32, 24 or 16). ``gpus`` and
    ``min_gpus`` must be multiples of it. Left out: 1, any whole number from ``min_gpus``."""
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
