"""What the forecast's and the scheduler's halves of ``idlegpu.yaml`` share: the strict base of
their sections, the one loader (file, nesting limits, ``IDLEGPU_*`` overrides) and its
one-line error messages.

``idlegpu.forecast.config`` holds the forecast's sections, ``idlegpu.scheduler.config`` the whole
file; each ``load_config`` is ``load_settings`` with its own model.
"""

from __future__ import annotations

import difflib
import os
import re
import types
import typing
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ConfigDict, ValidationError
from pydantic_settings import BaseSettings
from pydantic_settings.exceptions import SettingsError

from idlegpu.forecast.errors import ConfigError
from idlegpu.forecast.redact import is_secret_field, redact

ENV_PREFIX = "IDLEGPU_"

MAX_CONFIG_DEPTH = 32
"""Deeper than any real configuration; a YAML of thousands of nested brackets would otherwise
exhaust the recursion of the validators (a traceback instead of an error)."""

KUBERNETES_QUANTITY = r"\d+(\.\d+)?(Ki|Mi|Gi|Ti|Pi|Ei|k|K|M|G|T|P|E)?"
"""A Kubernetes quantity as the configuration accepts it (``1Ti``, ``128Gi``, ``500M``)."""

SettingsT = TypeVar("SettingsT", bound=BaseSettings)


class StrictModel(BaseModel):
    """A section of the configuration: unknown fields are mistakes, values never change."""

    model_config = ConfigDict(extra="forbid", frozen=True)


def load_settings(model: type[SettingsT], path: str | Path | None = None, *,
                  data: Mapping[str, Any] | None = None) -> SettingsT:
    """Read ``idlegpu.yaml`` (or ``data``) plus ``IDLEGPU_*`` environment overrides as ``model``."""
    where = str(path) if path is not None else "config"
    if data is None:
        data = _read_yaml(path, where)
    depth = _depth(data)
    if depth > MAX_CONFIG_DEPTH:
        raise ConfigError(f"{where}: nested {depth} levels deep; a configuration is at most "
                          f"{MAX_CONFIG_DEPTH} (look for a runaway [ or {{)")
    try:
        return model(**dict(data))
    except ValidationError as exc:
        raise ConfigError(
            f"{where}: {format_validation_error(exc, model, env=_env_names())}") from exc
    except SettingsError as exc:  # an IDLEGPU_* list or object override that is not JSON
        field = re.search(r'field "([^"]+)"', str(exc))
        name = f"{ENV_PREFIX}{field.group(1).upper()}" if field else f"an {ENV_PREFIX}* variable"
        raise ConfigError(f"{name} (environment): its value is not JSON; a list or object "
                          f"override is written as JSON, e.g. {ENV_PREFIX}API__TRUSTED_PROXIES="
                          "'[\"127.0.0.1/32\"]' (or set the field in the file instead)") from None


def _read_yaml(path: str | Path | None, where: str) -> Mapping[str, Any]:
    if path is None:
        raise ConfigError("no configuration given; pass --config idlegpu.yaml")
    file = Path(path)
    if not file.is_file():
        raise ConfigError(f"config file {file} not found; copy idlegpu.yaml from the repo")
    try:
        text = file.read_text(encoding="utf-8")
        _check_yaml_depth(text, where)
        data = yaml.safe_load(text) or {}
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        at = f" at line {mark.line + 1}" if mark is not None else ""
        raise ConfigError(f"{where}: invalid YAML{at}: {getattr(exc, 'problem', exc)}") from exc
    if not isinstance(data, Mapping):
        raise ConfigError(f"{where}: expected a mapping at the top level")
    return data


def _check_yaml_depth(text: str, where: str) -> None:
    """Refuse YAML nested deeper than ``MAX_CONFIG_DEPTH`` before composing it (PyYAML's
    composer recurses once per level; its parser, read here event by event, does not)."""
    level = 0
    for event in yaml.parse(text, Loader=yaml.SafeLoader):
        if isinstance(event, yaml.MappingStartEvent | yaml.SequenceStartEvent):
            level += 1
            if level > MAX_CONFIG_DEPTH:
                line = event.start_mark.line + 1 if event.start_mark else "?"
                raise ConfigError(f"{where}: nested deeper than {MAX_CONFIG_DEPTH} levels at "
                                  f"line {line}; look for a runaway [ or {{")
        elif isinstance(event, yaml.MappingEndEvent | yaml.SequenceEndEvent):
            level -= 1


def _depth(data: Any) -> int:
    """How deeply ``data`` nests lists and mappings (iteratively: the input may be hostile)."""
    deepest, stack = 0, [(data, 1)]
    while stack:
        value, level = stack.pop()
        if isinstance(value, Mapping | list | tuple):
            deepest = max(deepest, level)
            if level > MAX_CONFIG_DEPTH:
                return level
            children = value.values() if isinstance(value, Mapping) else value
            stack.extend((child, level + 1) for child in children)
    return deepest


def _env_names() -> dict[str, str]:
    """The ``IDLEGPU_*`` variables set, by their config path in lower case (``pool.total_gpus``
    for ``IDLEGPU_POOL__TOTAL_GPUS``): an error in a value from the environment names the
    variable, not the file."""
    return {key[len(ENV_PREFIX):].lower().replace("__", "."): key for key in os.environ
            if key.startswith(ENV_PREFIX)}


def model_fields_at(root: type[BaseModel], loc: Sequence[Any]) -> list[str]:
    """Field names of the model reached by following ``loc`` (a pydantic error location, the
    field's own name excluded) from ``root``: what a misspelt field could have meant. At the
    top, the sections a model leaves to another (its ``other_sections``) count too."""
    current: type[BaseModel] | None = root
    for part in loc:
        if current is None:
            return []
        if isinstance(part, int) or part not in current.model_fields:
            continue  # a list index or a dict key: the same model's items
        current = _model_in(current.model_fields[part].annotation)
    if current is None:
        return []
    others = getattr(current, "other_sections", ()) if current is root else ()
    return [*current.model_fields, *others]


def _model_in(annotation: Any) -> type[BaseModel] | None:
    """The pydantic model in an annotation such as ``list[ServiceConfig]`` or ``X | None``."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    if isinstance(annotation, types.UnionType) or typing.get_origin(annotation) is not None:
        for arg in typing.get_args(annotation):
            found = _model_in(arg)
            if found is not None:
                return found
    return None


def unknown_field(root: type[BaseModel], loc: Sequence[Any]) -> str:
    """The problem of the unknown field at ``loc``: "unknown field; did you mean 'gpus'?", or
    the fields it may be."""
    known = model_fields_at(root, loc[:-1])
    close = difflib.get_close_matches(str(loc[-1]), known, n=1, cutoff=0.6)
    fix = f"did you mean {close[0]!r}?" if close else (
        f"remove it or use one of: {', '.join(known)}" if known else "remove it")
    return f"unknown field; {fix}"


def format_validation_error(exc: ValidationError, root: type[BaseModel], *,
                            env: Mapping[str, str] | None = None) -> str:
    """All problems of a pydantic error of model ``root`` on one line, each naming its field
    (or, for a value from the environment, its variable: ``env`` maps config paths to variable
    names). The value of a secret field (``bearer_token``, a password...) is never shown, and
    credentials in any other value (a URL's password) are masked."""
    parts = []
    for err in exc.errors():
        loc = ".".join(str(p) for p in err["loc"]) or "(top level)"
        if env and loc.lower() in env:
            loc = f"{env[loc.lower()]} (environment)"
        msg = err["msg"].removeprefix("Value error, ")
        if err["type"] == "extra_forbidden":
            msg = unknown_field(root, err["loc"])
        elif err["type"] == "missing":
            msg = "required field is missing"
        got = err.get("input")
        scalar = not isinstance(got, dict | list)
        shown = (f" (got {got!r})"
                 if scalar and err["type"] not in ("missing", "extra_forbidden") else "")
        if shown and any(is_secret_field(str(p)) for p in err["loc"]):
            shown = " (the value is not shown: it is a secret)"
        parts.append(redact(f"{loc}: {msg}{shown}"))
    return "; ".join(parts)
