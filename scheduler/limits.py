"""What one job request may cost, checked before anything is expanded or rendered.

Two stages, both linear in the input:

* :func:`load_yaml_text` reads YAML (or JSON: JSON is YAML) under ``admission.limits``: the text's
  size, the nesting depth and the nodes and characters that aliases add are counted while the
  document is composed, so a billion-laughs file or 3,000 nested ``[`` are refused after reading
  a few hundred bytes of them, and no expanded value ever reaches an error message;
* :func:`precheck` walks the parsed mapping of one request: every string's length, the number of
  parameters, sweep values (per parameter and the cartesian product), steps and units, the
  description, and an upper bound of every rendered string and of the rendered units (the
  template's length plus the longest value of each placeholder in it), computed *before*
  anything is rendered.

Problems are ``(field path, problem; fix)`` pairs; :mod:`idlegpu.scheduler.specs` turns them into
``SpecError("<source>: <field>: <problem>; <fix>")``.
"""

from __future__ import annotations

import re
import string
from collections.abc import Mapping, Sequence
from typing import Any

import yaml

from idlegpu.scheduler.config import RequestLimits

__all__ = ["SURROGATE_PROBLEM", "LimitError", "brief", "has_surrogate", "load_yaml_text", "precheck"]

_SETTING = "admission.limits."
_FORMATTER = string.Formatter()
# room for the fixed parts of a unit (IDLEGPU_* variables, resources, names, JSON syntax)
_UNIT_OVERHEAD = 1024
_PER_ENTRY = 24  # JSON quoting and separators of one env variable or parameter


class LimitError(Exception):
    """A limit refused the input: ``field`` (may be empty) and a one-line ``message``."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}" if field else message)
        self.field = field
        self.message = message


def brief(value: Any, limit: int = 60) -> str:
    """A short description of a user's value for an error message: strings and numbers
    clipped to ``limit`` characters, containers named but never written out."""
    if isinstance(value, str):
        if len(value) <= limit:
            return repr(value)
        return repr(value[:limit]) + f"... ({len(value):,} characters)"
    if isinstance(value, bool) or value is None:
        return repr(value)
    if isinstance(value, int):
        if value.bit_length() > 200:
            return f"a number of about {value.bit_length() * 30103 // 100000 + 1} digits"
        return str(value)
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, Mapping):
        return "a mapping"
    if isinstance(value, list | tuple):
        return "a list"
    return type(value).__name__


# --------------------------------------------------------------------------------------------
# YAML under limits


_Loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
"""libyaml's safe loader when PyYAML has it (a request parses in milliseconds), else PyYAML's
own; both build the same values."""


def _line(event: Any) -> str:
    mark = getattr(event, "start_mark", None)
    return f" (line {mark.line + 1})" if mark is not None else ""


def _scan(text: str, limits: RequestLimits) -> None:
    """Read the events of ``text`` (nothing is built) and refuse nesting deeper than
    ``max_depth`` or aliases repeating more than ``max_alias_nodes`` values or
    ``max_alias_bytes`` characters: every alias counts all that the node it names holds. One
    pass; each node's size is known when its end event arrives."""
    stack: list[list[Any]] = []  # per open collection: [nodes, characters, anchor]
    sizes: dict[str, tuple[int, int]] = {}
    open_anchors: set[str] = set()
    alias_nodes = alias_chars = 0
    for event in yaml.parse(text, Loader=_Loader):
        if isinstance(event, yaml.ScalarEvent):
            size = (1, len(event.value))
            if event.anchor is not None:
                sizes[event.anchor] = size
        elif isinstance(event, yaml.SequenceStartEvent | yaml.MappingStartEvent):
            if len(stack) >= limits.max_depth:
                raise LimitError(
                    "", f"lists and mappings nest deeper than {limits.max_depth} "
                    f"levels{_line(event)} ({_SETTING}max_depth); a request nests about 6 "
                    "deep: flatten it")
            stack.append([1, 0, event.anchor])
            if event.anchor is not None:
                open_anchors.add(event.anchor)
            continue
        elif isinstance(event, yaml.SequenceEndEvent | yaml.MappingEndEvent):
            nodes, chars, anchor = stack.pop()
            size = (nodes, chars)
            if anchor is not None:
                sizes[anchor] = size
                open_anchors.discard(anchor)
        elif isinstance(event, yaml.AliasEvent):
            # an alias (``*name``) always names an anchor: both parsers give it as a string
            assert event.anchor is not None
            if event.anchor in open_anchors:
                raise LimitError("", f"an alias refers to the collection it is in{_line(event)}; "
                                     "a request cannot contain itself: write the value out")
            size = sizes.get(event.anchor, (1, 0))  # undefined: the loader says so
            alias_nodes += size[0]
            alias_chars += size[1]
            if alias_nodes > limits.max_alias_nodes or alias_chars > limits.max_alias_bytes:
                raise LimitError(
                    "", f"YAML aliases{_line(event)} would repeat more than "
                    f"{limits.max_alias_nodes:,} values or {limits.max_alias_bytes:,} "
                    f"characters ({_SETTING}max_alias_nodes, max_alias_bytes); write the "
                    "values out, or use fewer aliases")
        else:
            continue
        if stack:
            stack[-1][0] += size[0]
            stack[-1][1] += size[1]


def load_yaml_text(text: str | bytes, limits: RequestLimits, *, max_bytes: int | None = None,
                   what: str = "a request") -> Any:
    """The YAML (or JSON) document in ``text``, parsed under ``limits``; ``LimitError`` for a
    text too large (``max_bytes``, default ``limits.max_request_bytes``), nested too deep,
    aliases expanding too far, or anything that is not one valid YAML document."""
    cap = limits.max_request_bytes if max_bytes is None else max_bytes
    setting = "max_request_bytes" if max_bytes is None else "max_file_bytes"
    if isinstance(text, bytes | bytearray | memoryview):
        raw = bytes(text)
        if len(raw) > cap:
            raise _too_large(len(raw), cap, setting, what)
        try:
            text = raw.decode("utf-8-sig")
        except UnicodeDecodeError as exc:
            raise LimitError("", f"not UTF-8 text (byte {exc.start}); save it as UTF-8") from None
    elif not isinstance(text, str):
        raise LimitError("", f"expected text, got {type(text).__name__}")
    else:
        if len(text) > cap:
            raise _too_large(len(text), cap, setting, what)
        try:
            size = len(text.encode("utf-8"))
        except UnicodeEncodeError:
            raise LimitError("", "the text holds characters that are not valid Unicode (lone "
                                 "surrogates); save it as UTF-8") from None
        if size > cap:
            raise _too_large(size, cap, setting, what)
        text = text.removeprefix("\ufeff")
    try:
        _scan(text, limits)
        return yaml.load(text, Loader=_Loader)
    except LimitError:
        raise
    except yaml.YAMLError as exc:
        exc = _pure_error(text, exc)
        mark = getattr(exc, "problem_mark", None)
        at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = (getattr(exc, "problem", None) or getattr(exc, "reason", None)
                   or type(exc).__name__)
        if "nesting depth" in str(problem):  # libyaml's own bound (1,000) met first
            raise LimitError("", f"lists and mappings nest deeper than {limits.max_depth} "
                                 f"levels{at.replace(' at', ' (at', 1) + ')' if at else ''} "
                                 f"({_SETTING}max_depth); a request nests about 6 deep: "
                                 "flatten it") from None
        raise LimitError("", f"invalid YAML{at}: {_clip(str(problem))}; check the indentation "
                             "and quoting there (quote values containing ': ' or starting with "
                             "'{')") from None
    except Exception as exc:  # noqa: BLE001
        # a value the YAML reader cannot build: a 5,000-digit integer, 2025-02-30, a bad offset,
        # an empty "!!int " (IndexError inside PyYAML)
        text = str(exc) or type(exc).__name__
        if "integer string conversion" in text:
            text = "a number with more than 4,300 digits"
        raise LimitError("", f"a value cannot be read ({_clip(text)}); quote it to make it a "
                             "string, or fix it") from None


_PURE_ERRORS_UP_TO = 64 * 1024
_PURE_FLOW_UP_TO = 200


def _pure_error(text: str, exc: yaml.YAMLError) -> yaml.YAMLError:
    """PyYAML's own error for a syntax error of libyaml, which names the place and what was
    expected a little better ("expected ',' or ']', but got '<stream end>'" at the end of the
    line rather than "did not find expected ',' or ']'" on the next one); its parser is pure
    Python, so only for texts a person wrote (up to 64 KiB)."""
    if (_Loader is yaml.SafeLoader or len(text) > _PURE_ERRORS_UP_TO
            or not isinstance(exc, yaml.scanner.ScannerError | yaml.parser.ParserError)
            or "nesting depth" in str(exc)
            # PyYAML's scanner is quadratic in the nesting of flow collections
            or text.count("[") + text.count("{") > _PURE_FLOW_UP_TO):
        return exc
    try:
        for _ in yaml.parse(text, Loader=yaml.SafeLoader):
            pass
    except yaml.YAMLError as pure:
        return pure
    except Exception:  # noqa: BLE001 (libyaml's error stands)
        return exc
    return exc


def _clip(text: str, limit: int = 160) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[:limit] + "..."


def _too_large(size: int, cap: int, setting: str, what: str) -> LimitError:
    return LimitError("", f"{what} of {size:,} bytes is above the limit of {cap:,} "
                          f"({_SETTING}{setting}); make it smaller (split a large sweep into "
                          "several requests, read large inputs from storage)")


# --------------------------------------------------------------------------------------------
# The structure of one request, before validation


def _text_len(value: Any) -> int:
    """Characters ``value`` takes when written into args and env (0 for a non-scalar)."""
    if isinstance(value, bool):
        return 5
    if isinstance(value, str):
        return len(value)
    if isinstance(value, int):
        return (value.bit_length() * 30103) // 100000 + 2  # digits, without making the string
    if isinstance(value, float):
        return 24
    return 0


_SURROGATE = re.compile("[\ud800-\udfff]")
SURROGATE_PROBLEM = ("holds a lone UTF-16 surrogate (an escape such as \\ud800 without its "
                     "pair), which is no character; send valid Unicode text")


def has_surrogate(text: str) -> bool:
    """True when ``text`` holds a code point of the surrogate range (a JSON or YAML escape such
    as ``"\\ud800"`` makes one): it cannot be written as UTF-8, to the store or a log."""
    return _SURROGATE.search(text) is not None


def _walk(data: Any, limits: RequestLimits) -> None:
    """Every string (keys too) within ``max_string_bytes``, nesting within ``max_depth`` and at
    most a request's worth of values (for mappings that did not come through the YAML reader,
    e.g. an API body parsed elsewhere). Iterative, so nothing here can recurse too deep."""
    budget = limits.max_request_bytes + limits.max_alias_nodes
    stack: list[tuple[Any, int, tuple[Any, ...]]] = [(data, 0, ())]
    seen = 0
    while stack:
        value, depth, path = stack.pop()
        seen += 1
        if seen > budget:
            raise LimitError("", f"the request holds more than {budget:,} values; a request "
                                 f"is at most {limits.max_request_bytes:,} bytes "
                                 f"({_SETTING}max_request_bytes): make it smaller")
        if isinstance(value, str):
            if len(value) > limits.max_string_bytes:
                raise LimitError(_dotted(path), _long_string(len(value), limits))
            if has_surrogate(value):
                raise LimitError(_dotted(path), SURROGATE_PROBLEM)
            continue
        if isinstance(value, Mapping | list | tuple):
            if depth >= limits.max_depth:
                raise LimitError(_dotted(path), f"nested deeper than {limits.max_depth} levels "
                                                f"({_SETTING}max_depth); flatten it")
            if isinstance(value, Mapping):
                for key, item in value.items():
                    if isinstance(key, str) and len(key) > limits.max_string_bytes:
                        raise LimitError(_dotted(path), "a field name of "
                                         f"{len(key):,} characters; use a short name")
                    if isinstance(key, str) and has_surrogate(key):
                        raise LimitError(_dotted(path), f"a field name: {SURROGATE_PROBLEM}")
                    stack.append((item, depth + 1, (*path, key)))
            else:
                stack.extend((item, depth + 1, (*path, i)) for i, item in enumerate(value))


def _dotted(path: Sequence[Any]) -> str:
    return ".".join(str(p) if isinstance(p, int) and not isinstance(p, bool)
                    else p if isinstance(p, str) and len(p) <= 40 else brief(p, 40)
                    for p in path)


def _long_string(length: int, limits: RequestLimits) -> str:
    return (f"a string of {length:,} characters is above the limit of "
            f"{limits.max_string_bytes:,} ({_SETTING}max_string_bytes); read large inputs from "
            "a file or storage instead of writing them into the request")


def _mapping(value: Any) -> Mapping[Any, Any]:
    return value if isinstance(value, Mapping) else {}


def _strings(value: Any) -> list[str]:
    return [v for v in value if isinstance(v, str)] if isinstance(value, list) else []


def _raw_size(value: Any) -> int:
    """Characters of the scalars in ``value`` plus a little per entry (iterative; the input's
    depth and size are already bounded)."""
    total, stack = 0, [value]
    while stack:
        item = stack.pop()
        if isinstance(item, Mapping):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list | tuple):
            stack.extend(item)
        else:
            total += _text_len(item) + 4
    return total


def _bound(template: str, lengths: Mapping[str, int]) -> int:
    """The most characters ``template`` can render to with values of at most ``lengths``."""
    total = len(template)
    if "{" not in template:
        return total
    try:
        for _, field, _, _ in _FORMATTER.parse(template):
            if field:
                total += lengths.get(field, 0)
    except ValueError:
        pass  # unbalanced braces: refused by the rendering, with its fix
    return total


def _check_sweep(sweep: Any, where: str, limits: RequestLimits) -> int:
    """Members of ``sweep`` (1 without one), or ``LimitError`` past the limits."""
    if not isinstance(sweep, Mapping):
        return 1
    if len(sweep) > limits.max_parameters:
        raise LimitError(where, f"{len(sweep):,} swept parameters is above the limit of "
                                f"{limits.max_parameters} ({_SETTING}max_parameters); sweep fewer")
    members = 1
    for key, values in sweep.items():
        if not isinstance(values, list):
            continue
        if len(values) > limits.max_sweep_values:
            raise LimitError(f"{where}.{_dotted([key])}",
                             f"{len(values):,} values is above the limit of "
                             f"{limits.max_sweep_values} per swept parameter "
                             f"({_SETTING}max_sweep_values); sweep fewer values or split the "
                             "request")
        members *= max(1, len(values))
        if members > limits.max_sweep_members:
            raise LimitError(where, f"the sweep has more than {limits.max_sweep_members} grid "
                                    f"points ({_SETTING}max_sweep_members); sweep fewer values "
                                    "or split the request")
    return members


def precheck(data: Any, limits: RequestLimits) -> None:
    """``LimitError`` at the first field of the request mapping ``data`` that costs more than
    ``limits`` allow; nothing for a request within them. Fields of the wrong type are left to
    the validation, which names them with their fix."""
    if not isinstance(data, Mapping):
        return
    description = data.get("description")
    if isinstance(description, str) and len(description) > limits.max_description_bytes:
        raise LimitError("description", f"{len(description):,} characters is above the limit "
                                        f"of {limits.max_description_bytes:,} "
                                        f"({_SETTING}max_description_bytes); shorten it")
    raw_steps = data.get("steps")
    if isinstance(raw_steps, list) and len(raw_steps) > limits.max_steps:
        raise LimitError("steps", f"{len(raw_steps):,} steps is above the limit of "
                                  f"{limits.max_steps} ({_SETTING}max_steps); split the pipeline "
                                  "into several requests")
    job_params = _mapping(data.get("parameters"))
    if len(job_params) > limits.max_parameters:
        raise LimitError("parameters", _too_many_parameters(len(job_params), limits))
    steps: list[tuple[str, Mapping[Any, Any]]]
    if isinstance(raw_steps, list) and raw_steps:
        steps = [(f"steps.{i}", s) for i, s in enumerate(raw_steps) if isinstance(s, Mapping)]
        sweeps = [(f"{here}.sweep", s.get("sweep")) for here, s in steps]
    else:
        steps = [("", {})]
        sweeps = [("sweep", data.get("sweep"))]
    members = [_check_sweep(sweep, where, limits) for where, sweep in sweeps]
    units = sum(members)
    if units > limits.max_units:
        raise LimitError("steps" if raw_steps else "sweep",
                         f"the request expands to {units:,} units, above the limit of "
                         f"{limits.max_units} ({_SETTING}max_units); sweep fewer values or "
                         "split it into several requests")
    _walk(data, limits)

    total = 0
    for (here, step), count in zip(steps, members, strict=True):
        total += count * _unit_bound(data, here, step, count, job_params, limits)
        if total > limits.max_request_expanded_bytes:
            raise LimitError(here or "(top level)",
                             f"the request's units would hold more than "
                             f"{limits.max_request_expanded_bytes:,} characters together "
                             f"({_SETTING}max_request_expanded_bytes); pass large values once "
                             "(a file in storage) instead of templating them into every unit, "
                             "or sweep fewer values")


def _too_many_parameters(count: int, limits: RequestLimits) -> str:
    return (f"{count:,} parameters is above the limit of {limits.max_parameters} "
            f"({_SETTING}max_parameters); pass them in a file instead")


def _unit_bound(data: Mapping[Any, Any], here: str, step: Mapping[Any, Any], members: int,
                job_params: Mapping[Any, Any], limits: RequestLimits) -> int:
    """The most characters one unit of ``step`` can hold once rendered; ``LimitError`` when a
    rendered string or the unit would be above the limits."""
    prefix = f"{here}." if here else ""

    def pick(field: str) -> tuple[Any, str]:
        if here and step.get(field) is not None:
            return step[field], f"{prefix}{field}"
        return data.get(field), field

    step_params = _mapping(step.get("parameters"))
    params = {**job_params, **step_params}
    if len(params) > limits.max_parameters:
        raise LimitError(f"{prefix}parameters", _too_many_parameters(len(params), limits))
    lengths: dict[str, int] = {str(k): _text_len(v) for k, v in params.items()}
    sweep = step.get("sweep") if here else data.get("sweep")
    for key, values in _mapping(sweep).items():
        if isinstance(values, list):
            lengths[str(key)] = max((_text_len(v) for v in values), default=0)
    gpus, _ = pick("gpus")
    lengths.update(name=_text_len(data.get("name")), team=_text_len(data.get("team")),
                   step=_text_len(step.get("name")) if here else 4,
                   member=len(str(max(0, members - 1))),
                   gpus=_text_len(gpus) if isinstance(gpus, int) else 0)

    templates: list[tuple[str, str]] = []
    output, output_at = pick("output")
    if isinstance(output, str):
        lengths["output"] = _bound(output, lengths)
        templates.append((output_at, output))
    args, args_at = pick("args")
    templates += [(f"{args_at}.{i}", t) for i, t in enumerate(args)
                  if isinstance(t, str)] if isinstance(args, list) else []
    job_env, step_env = _mapping(data.get("env")), _mapping(step.get("env")) if here else {}
    for key, value in {**job_env, **step_env}.items():
        at = f"{prefix}env.{key}" if key in step_env else f"env.{key}"
        if isinstance(value, str):
            templates.append((at, value))
    checkpoint, checkpoint_at = pick("checkpoint")
    resume = _mapping(checkpoint).get("resume_args")
    if isinstance(resume, list):
        templates += [(f"{checkpoint_at}.resume_args.{i}", t) for i, t in enumerate(resume)
                      if isinstance(t, str)]
    volumes, volumes_at = pick("volumes")
    if isinstance(volumes, list):
        templates += [(f"{volumes_at}.{i}.sub_path", v["sub_path"]) for i, v in enumerate(volumes)
                      if isinstance(v, Mapping) and isinstance(v.get("sub_path"), str)]

    size = _UNIT_OVERHEAD
    for at, template in templates:
        rendered = _bound(template, lengths)
        if rendered > limits.max_string_bytes:
            raise LimitError(at, f"renders to up to {rendered:,} characters, above the limit of "
                                 f"{limits.max_string_bytes:,} ({_SETTING}max_string_bytes); "
                                 "template fewer or shorter values into it")
        size += rendered + _PER_ENTRY
    # parameters are kept as they are and again as IDLEGPU_PARAM_<NAME> variables
    size += sum(2 * (len(k) + n + _PER_ENTRY) for k, n in lengths.items() if k in params
                or k in _mapping(sweep))
    size += sum(len(k) for k in {**job_env, **step_env} if isinstance(k, str))
    command, _ = pick("command")
    size += sum(len(t) + _PER_ENTRY for t in _strings(command))
    # copied into every unit as written: volumes (sub_path counted again: an upper bound),
    # env_from, value_from references
    size += _raw_size(pick("volumes")[0]) + _raw_size(pick("env_from")[0])
    size += _raw_size([v for v in {**job_env, **step_env}.values() if not isinstance(v, str)])
    image, _ = pick("image")
    size += _text_len(image)
    if size > limits.max_unit_bytes:
        what = f"each unit of step {step.get('name')!r}" if here else "each unit"
        what = what if len(what) < 80 else "each unit of this step"
        raise LimitError(here or "(top level)",
                         f"{what} would hold up to {size:,} characters once rendered, above "
                         f"the limit of {limits.max_unit_bytes:,} ({_SETTING}max_unit_bytes); "
                         "template fewer or shorter values into args and env, or read large "
                         "inputs from storage")
    return size
