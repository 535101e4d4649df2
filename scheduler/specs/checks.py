"""The checks shared by a request and its steps: the image (allowed registry, pinned tag or
digest), GPU counts, parameter and environment names, sweeps, output locations, and the pod
settings that are refused on the shared pool."""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Sequence
from typing import Any

from pydantic import ValidationInfo, field_validator

from idlegpu.scheduler.limits import brief
from idlegpu.scheduler.specs.constants import (
    _IDENT,
    _NVIDIA_WHY,
    BUILTIN_PLACEHOLDERS,
    MAX_SWEEP_MEMBERS,
    NVIDIA_ENV_PREFIX,
    RESERVED_ENV_PREFIX,
)
from idlegpu.scheduler.specs.context import _admission
from idlegpu.scheduler.specs.errors import _custom
from idlegpu.scheduler.specs.quantities import scalar_text

_IMAGE_REPO = re.compile(
    r"^[a-z0-9]+(?:[._-][a-z0-9]+)*(?::[0-9]+)?(?:/[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*)+$"
)
_IMAGE_TAG = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$")
_IMAGE_DIGEST = re.compile(r"^sha256:[0-9a-f]{64}$")
_STORAGE_URI = re.compile(r"^[a-z][a-z0-9+.-]*://\S+$")


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
