"""The names, prefixes, defaults and ceilings every part of a request's handling shares."""

from __future__ import annotations

import re
import typing
from typing import Literal

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
DEFAULT_CPU_PER_GPU = 8.0
DEFAULT_MEMORY_GI_PER_GPU = 64
MAX_SWEEP_MEMBERS = 256
MAX_UNITS = 1024
UNITS_CEILING = 4096
"""No request expands to more units than this, whatever ``admission.limits.max_units`` says."""
MAIN_STEP = "main"
MAX_NODES = 1024
"""No unit spans more nodes than this (an Indexed Job's completions)."""

_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_OBJECT_NAME = r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$"
_KEY = r"^[-._a-zA-Z0-9]+$"
