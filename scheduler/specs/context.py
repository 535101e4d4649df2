"""The validation context: what pydantic's validators read of the admission config (its
limits, allowed registries, GPUs per job) and of the pool (its node shapes).

Validation takes it through pydantic's validation context, built by
:func:`admission_context`; without one the validators fall back to the defaults of
:class:`idlegpu.scheduler.config.AdmissionConfig`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from pydantic import ValidationInfo

from idlegpu.scheduler.config import AdmissionConfig

_DEFAULT_ADMISSION = AdmissionConfig()


def admission_context(admission: AdmissionConfig | None = None,
                      nodes: Sequence[Any] = ()) -> dict[str, Any]:
    """The validation context carrying ``admission``'s limits (defaults when None) and the
    pool's node shapes (``pool.nodes``: ``NodeShape``s; empty: not described)."""
    admission = admission or _DEFAULT_ADMISSION
    return {
        "admission": admission,
        "allowed_registries": list(admission.allowed_registries),
        "max_gpus_per_job": admission.max_gpus_per_job,
        "node_shapes": tuple((int(n.gpus), None if n.cpu is None else float(n.cpu),
                              n.memory_bytes) for n in nodes or ()),
    }


def _admission_of(context: Any) -> AdmissionConfig:
    """The admission limits of a validation context: its ``admission`` (an
    ``AdmissionConfig``, else the defaults), with ``allowed_registries`` and
    ``max_gpus_per_job`` overridden when the context names them."""
    if not isinstance(context, Mapping):
        return _DEFAULT_ADMISSION
    base = context.get("admission")
    base = base if isinstance(base, AdmissionConfig) else _DEFAULT_ADMISSION
    update: dict[str, Any] = {}
    if "allowed_registries" in context:
        update["allowed_registries"] = list(context["allowed_registries"])
    if "max_gpus_per_job" in context:
        update["max_gpus_per_job"] = int(context["max_gpus_per_job"])
    return base.model_copy(update=update) if update else base


def _admission(info: ValidationInfo) -> tuple[list[str], int]:
    admission = _admission_of(info.context)
    return list(admission.allowed_registries), int(admission.max_gpus_per_job)


def _node_shapes_of(context: Any) -> tuple[tuple[int, float | None, int | None], ...]:
    """``(gpus, cpu, memory bytes)`` of each node shape a validation context names."""
    if not isinstance(context, Mapping):
        return ()
    return tuple(context.get("node_shapes") or ())
