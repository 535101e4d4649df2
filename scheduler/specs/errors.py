"""The errors of a job request: :class:`SpecError` for the caller, and how a rule's problem
reaches it (``_RuleError`` from the expansion, ``_custom`` through pydantic's validation)."""

from __future__ import annotations

from pydantic_core import PydanticCustomError

from idlegpu.forecast.errors import PermanentError


class SpecError(PermanentError):
    """A job request (or trace) file is invalid; the message names the file, field and fix."""


class _RuleError(Exception):
    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


def _custom(field: str, message: str) -> PydanticCustomError:
    return PydanticCustomError(
        "idlegpu_spec", "{idlegpu_msg}", {"idlegpu_msg": message, "idlegpu_field": field}
    )
