"""Loading: request files, lists of requests, trace files and texts (an API body, YAML or
JSON) read under ``admission.limits`` and validated, every problem one :class:`SpecError` whose
message reads ``<file>: <field.path>: <problem>; <fix>``."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

from idlegpu.forecast.settings_base import unknown_field
from idlegpu.scheduler.config import AdmissionConfig
from idlegpu.scheduler.limits import LimitError, brief, load_yaml_text, precheck
from idlegpu.scheduler.specs.constants import KINDS
from idlegpu.scheduler.specs.context import _DEFAULT_ADMISSION, admission_context
from idlegpu.scheduler.specs.errors import SpecError
from idlegpu.scheduler.specs.model import JobRequest
from idlegpu.scheduler.specs.parts import _ENV_TAGS
from idlegpu.scheduler.specs.trace import TraceEntry

_EXAMPLES = "see examples/jobs/ for valid requests"
_HINTS = {
    "gpus": "use a whole number of GPUs from 1 to {max_gpus}",
    "min_gpus": "use a whole number of GPUs from 1 to the unit's gpus, or leave it out",
    "gpus_step": "use a whole number of GPUs (one replica) dividing gpus and min_gpus, or "
                 "leave it out",
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
