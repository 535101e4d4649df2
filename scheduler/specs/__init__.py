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

and falls back to the defaults of :class:`idlegpu.scheduler.config.AdmissionConfig` without it.
Files are read with :func:`load_request`, :func:`load_requests` and :func:`load_trace`, texts
(an API body, YAML or JSON) with :func:`parse_request_text`; every problem is a
:class:`SpecError` whose message reads ``<file>: <field.path>: <problem>; <fix>``. All of them,
and :func:`validate_request`, apply ``admission.limits`` (:mod:`idlegpu.scheduler.limits`:
sizes, depth, aliases, parameters, sweeps, steps, units, rendered sizes) before anything is
expanded or rendered.

The package's modules, each importing only those before it: :mod:`~.errors`, :mod:`~.constants`
and :mod:`~.quantities` (durations, memory and storage quantities, CPU counts, times,
parameter values); :mod:`~.parts` (checkpoint, volumes, env references, ephemeral storage);
:mod:`~.context` (the validation context) and :mod:`~.checks` (what a request and its steps
share); :mod:`~.rechecks` (the rules on units), :mod:`~.expansion` (requests into units),
:mod:`~.model` (:class:`JobRequest`, :class:`StepSpec`), :mod:`~.trace` (:class:`TraceEntry`)
and :mod:`~.loading`. Import everything from ``idlegpu.scheduler.specs`` itself.
"""

from __future__ import annotations

from idlegpu.scheduler.specs.checks import check_image
from idlegpu.scheduler.specs.constants import (
    BUILTIN_PLACEHOLDERS,
    DEFAULT_CPU_PER_GPU,
    DEFAULT_MEMORY_GI_PER_GPU,
    KINDS,
    MAIN_STEP,
    MAX_NODES,
    MAX_SWEEP_MEMBERS,
    MAX_UNITS,
    NVIDIA_ENV_PREFIX,
    PARAM_ENV_PREFIX,
    RESERVED_ENV_PREFIX,
    UNITS_CEILING,
    JobKind,
)
from idlegpu.scheduler.specs.context import admission_context
from idlegpu.scheduler.specs.errors import SpecError
from idlegpu.scheduler.specs.expansion import (
    GANG_MAX_ATTEMPTS_DIGITS,
    expand_units,
    memory_per_node,
    render,
    resize_unit,
)
from idlegpu.scheduler.specs.loading import (
    load_request,
    load_request_text,
    load_requests,
    load_trace,
    parse_request_text,
    validate_request,
)
from idlegpu.scheduler.specs.model import JobRequest, StepSpec
from idlegpu.scheduler.specs.parts import (
    Capabilities,
    Checkpoint,
    EmptyDir,
    EnvFrom,
    EnvMap,
    EnvValue,
    EphemeralStorage,
    KeyRef,
    ObjectName,
    ValueFrom,
    Volume,
)
from idlegpu.scheduler.specs.quantities import (
    EARLIEST,
    LATEST,
    MAX_DURATION_S,
    Cpu,
    Duration,
    Memory,
    Scalar,
    format_duration,
    parse_duration,
    parse_memory,
    quantity_bytes,
    scalar_text,
)
from idlegpu.scheduler.specs.rechecks import RECHECK_PREFIX, recheck_unit
from idlegpu.scheduler.specs.trace import TraceEntry

__all__ = [
    "BUILTIN_PLACEHOLDERS",
    "DEFAULT_CPU_PER_GPU",
    "DEFAULT_MEMORY_GI_PER_GPU",
    "EARLIEST",
    "GANG_MAX_ATTEMPTS_DIGITS",
    "KINDS",
    "LATEST",
    "MAIN_STEP",
    "MAX_DURATION_S",
    "MAX_NODES",
    "MAX_SWEEP_MEMBERS",
    "MAX_UNITS",
    "NVIDIA_ENV_PREFIX",
    "PARAM_ENV_PREFIX",
    "RECHECK_PREFIX",
    "RESERVED_ENV_PREFIX",
    "UNITS_CEILING",
    "Capabilities",
    "Checkpoint",
    "Cpu",
    "Duration",
    "EmptyDir",
    "EnvFrom",
    "EnvMap",
    "EnvValue",
    "EphemeralStorage",
    "JobKind",
    "JobRequest",
    "KeyRef",
    "Memory",
    "ObjectName",
    "Scalar",
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
    "load_request_text",
    "load_requests",
    "load_trace",
    "memory_per_node",
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
