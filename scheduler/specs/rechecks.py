"""The rules on units: applied to every unit at submission (the expansion checks each one)
and again by the daemon on a stored unit with its own config (:func:`recheck_unit`), right
before its Job is created: the store holds whatever a submitter's process accepted under the
submitter's config."""

from __future__ import annotations

import fnmatch
import math
import re
from decimal import Decimal

from idlegpu.scheduler.config import AdmissionConfig
from idlegpu.scheduler.specs.checks import check_image
from idlegpu.scheduler.specs.constants import _LABEL, _NVIDIA_WHY, _OBJECT_NAME, NVIDIA_ENV_PREFIX
from idlegpu.scheduler.specs.errors import SpecError
from idlegpu.scheduler.specs.parts import _check_prefix, _mount_path, _sub_path_problem
from idlegpu.scheduler.specs.quantities import _format_bytes, quantity_bytes
from idlegpu.scheduler.types import REF_KINDS, VOLUME_KINDS, UnitSpec, UnitVolume

RECHECK_PREFIX = "the daemon's admission rules refuse it: "
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
    memory = _bytes_or_none(unit.memory)
    limit = _bytes_or_none(unit.ephemeral_storage_limit)
    return [*_env_problems(unit), *_size_problems(unit, memory, limit),
            *_volume_problems(unit, memory, limit)]


def _env_problems(unit: UnitSpec) -> list[tuple[str, str]]:
    """The unit's environment: no NVIDIA_* variables, references to Secrets and ConfigMaps
    only, ``env_from`` prefixes that make neither NVIDIA_* nor IDLEGPU_* variables."""
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
    return problems


def _size_problems(unit: UnitSpec, memory: Decimal | None,
                   limit: Decimal | None) -> list[tuple[str, str]]:
    """The unit's memory and ephemeral storage (``memory``, ``limit``: their bytes, None when
    not a quantity): quantities, a limit with every request, the request within it."""
    problems: list[tuple[str, str]] = []
    if memory is None:
        problems.append(("memory", (f"{unit.memory!r} is not a memory quantity; use a "
                         "Kubernetes quantity such as 64Gi")))
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
    return problems


def _volume_problems(unit: UnitSpec, memory: Decimal | None,
                     limit: Decimal | None) -> list[tuple[str, str]]:
    """The unit's volumes: known kinds (never hostPath), names and mount paths valid and
    unique, relative sub-paths, and what each kind's source allows (see ``_source_problems``)."""
    problems: list[tuple[str, str]] = []
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
        problems += _source_problems(here, volume, unit, memory, limit)
    return problems


def _source_problems(here: str, volume: UnitVolume, unit: UnitSpec, memory: Decimal | None,
                     limit: Decimal | None) -> list[tuple[str, str]]:
    """The source of ``volume`` (at ``here``): a Kubernetes object's name without empty_dir
    settings, or an empty_dir of a known medium whose size fits the unit's memory (Memory) or
    its ephemeral storage ``limit`` (disk)."""
    problems: list[tuple[str, str]] = []
    if volume.kind != "empty_dir":
        if not re.match(_OBJECT_NAME, volume.source) or len(volume.source) > 253:
            problems.append((f"{here}.{volume.kind}", (f"{volume.source!r} is not the name "
                             "of a Kubernetes object; use lowercase letters, digits, '-' "
                             "and '.'")))
        if volume.medium or volume.size_limit is not None:
            problems.append((f"{here}.empty_dir", ("medium and size_limit are for "
                             "empty_dir volumes only; remove them")))
        return problems
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
        return (f"the cap of {per_gpu} per GPU ({cap} for {gpus} GPU(s), "
                f"admission.{setting}_per_gpu)")
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
    step = spec.gpus_step
    if not isinstance(step, int) or step < 1 or (step > 1 and (
            spec.min_gpus is None or spec.gpus % step or spec.min_gpus % step)):
        problems.append(("gpus_step", (
            f"gpus_step {step!r} does not fit a unit of {spec.gpus} GPUs elastic down to "
            f"{spec.min_gpus}; it is 1, or a whole number dividing both (resubmit it)")))
    if spec.nodes < 1 or spec.gpus % spec.nodes or (spec.nodes > 1 and spec.min_gpus):
        problems.append(("nodes", (
            f"{spec.gpus} GPUs on {spec.nodes} nodes{' elastic' if spec.min_gpus else ''} is "
            "no multi-node unit (whole pods of equal GPUs, not elastic); resubmit it")))
    problems += _structure_problems(spec)
    problems += _admission_problems(spec, team, admission)
    if problems:
        text = " | ".join(f"{field}: {message}" for field, message in problems)
        raise SpecError((RECHECK_PREFIX + text).replace("\n", " "))
