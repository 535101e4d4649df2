"""Expansion: a request into its runnable units, one per step and sweep member.

A request's steps are resolved first (``_Step``: the job-level defaults applied, each field's
request path kept for the errors), then every member's templates are filled
(:func:`render`), its size laid out over nodes and its unit checked against the rules of
:mod:`idlegpu.scheduler.specs.rechecks`. :func:`resize_unit` and :func:`memory_per_node` are
what an elastic unit and a gang's pods get of a unit's size.
"""

from __future__ import annotations

import itertools
import math
import string
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from decimal import Decimal
from typing import Any, Protocol

from idlegpu.scheduler.config import AdmissionConfig
from idlegpu.scheduler.specs.constants import (
    _IDENT,
    DEFAULT_CPU_PER_GPU,
    DEFAULT_MEMORY_GI_PER_GPU,
    MAIN_STEP,
    PARAM_ENV_PREFIX,
    UNITS_CEILING,
)
from idlegpu.scheduler.specs.errors import SpecError, _RuleError
from idlegpu.scheduler.specs.parts import Checkpoint, EnvFrom, EphemeralStorage, ValueFrom, Volume
from idlegpu.scheduler.specs.quantities import _format_bytes, quantity_bytes, scalar_text
from idlegpu.scheduler.specs.rechecks import _admission_problems, _structure_problems
from idlegpu.scheduler.types import (
    EnvFromSource,
    EnvKeyRef,
    UnitSpec,
    UnitVolume,
    smaller_sizes,
)


class _StepFields(Protocol):
    """What the expansion reads of one of a request's ``steps`` (a ``StepSpec``) besides the
    fields it shares with the request (``_STEP_FIELDS``, read by name)."""

    @property
    def name(self) -> str: ...

    @property
    def parameters(self) -> Mapping[str, Any]: ...

    @property
    def env(self) -> Mapping[str, Any]: ...

    @property
    def sweep(self) -> dict[str, list[Any]] | None: ...


class ExpandableRequest(_StepFields, Protocol):
    """What the expansion reads of a request: a validated ``JobRequest``: a step's fields,
    its team, steps and node shapes, besides the fields its steps inherit (``_STEP_FIELDS``,
    read by name). The model expands itself while it is validated, so it imports this
    module, not the other way round."""

    @property
    def team(self) -> str: ...

    @property
    def steps(self) -> Sequence[_StepFields] | None: ...

    @property
    def _node_shapes(self) -> tuple[tuple[int, float | None, int | None], ...]: ...


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
    gpus_step: int | None
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
    "kind", "image", "command", "args", "gpus", "min_gpus", "gpus_step", "nodes",
    "gpus_per_node", "cpu", "memory", "runtime_estimate",
    "checkpoint", "priority", "deadline", "max_preemptions", "output", "volumes", "env_from",
    "ephemeral_storage",
)


def _step(index: int, name: str, value: Mapping[str, Any], parameters: dict[str, Any],
          env: dict[str, Any], sweep: dict[str, list[Any]] | None, where: dict[str, str],
          env_where: dict[str, str]) -> _Step:
    return _Step(
        index=index, name=name, kind=value["kind"], image=value["image"],
        command=list(value["command"]), args=list(value["args"]), parameters=parameters,
        env=env, gpus=value["gpus"], min_gpus=value["min_gpus"],
        gpus_step=value["gpus_step"], nodes=value["nodes"],
        gpus_per_node=value["gpus_per_node"], cpu=value["cpu"],
        memory=value["memory"],
        runtime=value["runtime_estimate"], checkpoint=value["checkpoint"],
        priority=value["priority"], deadline=value["deadline"],
        max_preemptions=value["max_preemptions"], output=value["output"],
        volumes=list(value["volumes"] or ()), env_from=list(value["env_from"] or ()),
        ephemeral_storage=value["ephemeral_storage"], sweep=sweep, where=where,
        env_where=env_where,
    )


def _resolve(req: ExpandableRequest) -> list[_Step]:
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
                req: ExpandableRequest) -> str:
    try:
        return render(template, values)
    except ValueError as exc:
        raise _RuleError(where, _in_step(exc, where, step, req)) from None


def _render_all(templates: Sequence[str], values: Mapping[str, str], where: str, step: _Step,
                req: ExpandableRequest) -> tuple[str, ...]:
    return tuple(
        _render_one(t, values, f"{where}.{i}", step, req) for i, t in enumerate(templates)
    )


def _in_step(exc: ValueError, where: str, step: _Step, req: ExpandableRequest) -> str:
    inherited = req.steps and not where.startswith("steps.")
    return f"in step {step.name!r}: {exc}" if inherited else str(exc)


def _in_step_text(message: str, where: str, step: _Step, req: ExpandableRequest) -> str:
    inherited = req.steps and not where.startswith("steps.")
    return f"in step {step.name!r}: {message}" if inherited else message


def _unit_volume(volume: Volume, values: Mapping[str, str], where: str, step: _Step,
                 req: ExpandableRequest) -> UnitVolume:
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


def _admit_units(req: ExpandableRequest, units: Sequence[UnitSpec],
                 admission: AdmissionConfig) -> None:
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


@dataclass(frozen=True)
class _StepUnits:
    """What every unit of one step shares: the points of its sweep's grid, the parameters it
    does not sweep, its size (GPUs and nodes, the elastic minimum, CPU cores and memory in
    all) and whether it checkpoints."""

    members: list[dict[str, Any]]
    base: dict[str, Any]
    gpus: int
    nodes: int
    min_gpus: int | None
    gpus_step: int
    cpu: float
    memory: str
    checkpointable: bool

    @property
    def per_node(self) -> int:
        return self.gpus // self.nodes


def _build_units(req: ExpandableRequest, max_units: int = UNITS_CEILING,
                 shapes: Sequence[tuple[int, float | None, int | None]] = ()) -> list[UnitSpec]:
    steps = _resolve(req)
    _check_steps(req, steps)
    units: list[UnitSpec] = []
    outputs: dict[str, tuple[str, int]] = {}
    previous: tuple[tuple[int, int], ...] = ()
    for step in steps:
        shared = _step_units(step, req, shapes)
        this_step: list[tuple[int, int]] = []
        for member, point in enumerate(shared.members):
            units.append(_unit(req, step, shared, member, point, outputs, previous))
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


def _check_steps(req: ExpandableRequest, steps: Sequence[_Step]) -> None:
    """``_RuleError`` for a request whose steps cannot expand: a step name used twice, a sweep
    next to ``steps``, a step without an image or a GPU count."""
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


def _step_units(step: _Step, req: ExpandableRequest,
                shapes: Sequence[tuple[int, float | None, int | None]]) -> _StepUnits:
    """What the units of ``step`` share, or ``_RuleError`` at the field: parameters that
    would make the same environment variable, a node layout, elastic minimum or gang name
    that does not work."""
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
    gpus_step = _check_gpus_step(step, gpus, min_gpus, req)
    if nodes > 1:
        _check_gang_name(req, step, len(members) - 1, nodes)
    # with nodes given, cpu and memory are per node; a split plain request shares its own
    cpu_total, memory_total = _gang_resources(step, gpus, nodes, split)
    return _StepUnits(members=members, base=base, gpus=gpus, nodes=nodes, min_gpus=min_gpus,
                      gpus_step=gpus_step,
                      cpu=cpu_total, memory=memory_total, checkpointable=checkpointable)


def _unit(req: ExpandableRequest, step: _Step, shared: _StepUnits, member: int,
          point: Mapping[str, Any], outputs: dict[str, tuple[str, int]],
          previous: tuple[tuple[int, int], ...]) -> UnitSpec:
    """Member ``member`` (the sweep's grid ``point``) of ``step``, its templates filled;
    ``_RuleError`` at the field of a template that does not render or an output that
    another unit writes to (``outputs``: where each unit so far writes)."""
    # the step's checkpointing when it is enabled (shared.checkpointable), else None
    checkpoint = step.checkpoint if shared.checkpointable else None
    params = {**shared.base, **point}
    values = {k: scalar_text(v) for k, v in params.items()}
    values.update(
        name=req.name, team=req.team, step=step.name, member=str(member),
        gpus=str(shared.per_node),
    )
    output = _unit_output(req, step, values, member, outputs)
    if output is not None:
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
    if checkpoint is not None:
        resume = _render_all(checkpoint.resume_args, values, step.where["resume_args"], step, req)
    return UnitSpec(
        step=step.name,
        step_index=step.index,
        member=member,
        image=step.image,  # type: ignore[arg-type]
        command=tuple(step.command),
        args=args,
        env=_unit_env(req, step, env_user, params, member, shared, output),
        parameters=tuple((k, scalar_text(params[k])) for k in sorted(params)),
        gpus=shared.gpus,
        min_gpus=shared.min_gpus,
        gpus_step=shared.gpus_step,
        nodes=shared.nodes,
        cpu=shared.cpu,
        memory=shared.memory,
        runtime_estimate_s=step.runtime,
        checkpointable=shared.checkpointable,
        checkpoint_interval_s=checkpoint.interval if checkpoint is not None else None,
        saves_on_stop=checkpoint is not None and checkpoint.saves_on_stop,
        answers_notice=checkpoint is not None and checkpoint.notice,
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
    )


def _unit_output(req: ExpandableRequest, step: _Step, values: Mapping[str, str], member: int,
                 outputs: dict[str, tuple[str, int]]) -> str | None:
    """The unit's rendered ``output`` (None without one), added to ``outputs``; ``_RuleError``
    when an earlier unit of the request writes there too."""
    if step.output is None:
        return None
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
    return output


def _unit_env(req: ExpandableRequest, step: _Step, env_user: Mapping[str, str],
              params: Mapping[str, Any], member: int, shared: _StepUnits,
              output: str | None) -> tuple[tuple[str, str], ...]:
    """The unit's environment: the request's own variables (rendered), then ``IDLEGPU_JOB``,
    ``_TEAM``, ``_STEP``, ``_MEMBER``, ``_GPUS`` (of one pod), ``_NODES`` (of a gang),
    ``_OUTPUT`` (with an output) and ``IDLEGPU_PARAM_<NAME>`` for every parameter."""
    env = list(env_user.items())
    env += [
        ("IDLEGPU_JOB", req.name), ("IDLEGPU_TEAM", req.team),
        ("IDLEGPU_STEP", step.name), ("IDLEGPU_MEMBER", str(member)),
        ("IDLEGPU_GPUS", str(shared.per_node)),
    ]
    if shared.nodes > 1:
        env.append(("IDLEGPU_NODES", str(shared.nodes)))
    if output is not None:
        env.append(("IDLEGPU_OUTPUT", output))
    env += [(PARAM_ENV_PREFIX + k.upper(), scalar_text(params[k])) for k in sorted(params)]
    return tuple(env)


def _refusal(step: _Step, field: str, req: ExpandableRequest) -> Callable[[str], _RuleError]:
    """A ``_RuleError`` at ``field`` of ``step``, its message said of that step."""
    where = step.where[field]

    def refuse(message: str) -> _RuleError:
        return _RuleError(where, _in_step_text(message, where, step, req))

    return refuse


def _check_min_gpus(step: _Step, gpus: int, checkpointable: bool,
                    req: ExpandableRequest) -> int | None:
    """The unit's ``min_gpus`` (None: not elastic), or ``_RuleError`` at the field."""
    if step.min_gpus is None:
        return None
    least = int(step.min_gpus)
    refuse = _refusal(step, "min_gpus", req)
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


def _check_gpus_step(step: _Step, gpus: int, min_gpus: int | None,
                     req: ExpandableRequest) -> int:
    """The unit's ``gpus_step`` (1 when left out), or ``_RuleError`` at the field."""
    if step.gpus_step is None:
        return 1
    size = int(step.gpus_step)
    refuse = _refusal(step, "gpus_step", req)
    if size < 1:
        raise refuse(f"gpus_step must be at least 1 (got {size}); set it to the GPUs of one "
                     "replica of the unit, or leave it out")
    if min_gpus is None:
        if size == 1:
            return 1
        raise refuse(f"gpus_step {size} only applies to an elastic unit, which this is not; "
                     f"add min_gpus (a multiple of {size} below gpus), or remove gpus_step")
    if gpus % size or min_gpus % size:
        common = math.gcd(gpus, min_gpus)
        fits = max(d for d in range(1, min(size, common, 4096) + 1) if common % d == 0)
        raise refuse(f"gpus {gpus} and min_gpus {min_gpus} must both be multiples of "
                     f"gpus_step {size} (the unit runs on whole steps); use a gpus_step that "
                     f"divides both, e.g. {fits}, or change gpus and min_gpus")
    return size


def _node_layout(step: _Step, req: ExpandableRequest,
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


def _check_gang_name(req: ExpandableRequest, step: _Step, last_member: int, nodes: int) -> None:
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


def resize_unit(spec: UnitSpec, gpus: int) -> UnitSpec:
    """An elastic unit as it runs on ``gpus`` GPUs (``min_gpus`` to ``spec.gpus``): CPU and
    memory scaled to the same share of the full size (so the per-GPU caps still hold) and
    ``IDLEGPU_GPUS`` set to ``gpus``; the rest (image, args, output, checkpoint) unchanged."""
    full = int(spec.gpus)
    gpus = int(gpus)
    if gpus == full:
        return spec
    least = spec.min_gpus or full
    if gpus not in smaller_sizes(full, least, spec.gpus_step):
        steps = f" in steps of {spec.gpus_step}" if spec.gpus_step > 1 else ""
        raise ValueError(f"unit {spec.step}/{spec.member} runs on {least} to {full} "
                         f"GPUs{steps}, not {gpus}")
    memory = quantity_bytes(spec.memory) * gpus / full
    mib = max(1, int((memory / 2**20).to_integral_value(rounding="ROUND_CEILING")))
    env = tuple((k, str(gpus) if k == "IDLEGPU_GPUS" else v) for k, v in spec.env)
    return replace(spec, gpus=gpus, cpu=round(spec.cpu * gpus / full, 3),
                   memory=f"{mib // 1024}Gi" if mib % 1024 == 0 else f"{mib}Mi", env=env)


def expand_units(request: ExpandableRequest) -> list[UnitSpec]:
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
