"""The job store's errors: what it refuses (``StoreError`` and its kinds) and when it cannot
be reached (``StoreUnavailableError``, temporary)."""

from __future__ import annotations

from collections.abc import Sequence

from idlegpu.forecast.errors import PermanentError, TemporaryError
from idlegpu.scheduler.types import JobState


class StoreError(PermanentError):
    """The job store refused a call or cannot be used as it is (bad URL, newer schema, ...)."""


class SchemaVersionError(StoreError):
    """The database was written by a newer idlegpu than this one."""


class UnknownJobError(StoreError):
    """No request or unit has the id given."""


class InvalidRequestError(StoreError):
    """A submission is inconsistent (no units, duplicate units, unknown or cyclic dependencies)."""


class TransitionRefusedError(StoreError):
    """A transition does not apply to the unit as it is now."""


class QuotaExceededError(StoreError):
    """A submission past its caller's ``SubmitQuota``: ``quota`` (its name), ``limit``,
    ``used`` (before this one), ``asked`` (what this one adds) and ``retry_after_s`` (when it
    frees, if the store can tell: requests per hour; None: as units end)."""

    def __init__(self, message: str, *, quota: str, limit: int, used: int, asked: int,
                 retry_after_s: float | None) -> None:
        super().__init__(message)
        self.quota, self.limit, self.used, self.asked = quota, limit, used, asked
        self.retry_after_s = retry_after_s


class StaleStateError(TransitionRefusedError):
    """The unit is not in the state the caller expected: another process (or an earlier try of
    the same call) moved it first. Nothing was written; reload the unit and decide again."""

    def __init__(
        self, unit_id: str, action: str, expected: Sequence[JobState], actual: JobState | None
    ) -> None:
        wanted = " or ".join(s.value for s in expected)
        now = actual.value if actual is not None else "gone"
        super().__init__(
            f"cannot {action} unit {unit_id}: it is {now}, not {wanted} "
            "(another process changed it first; reload it and retry)"
        )
        self.unit_id = unit_id
        self.action = action
        self.expected = tuple(expected)
        self.actual = actual


class StoreUnavailableError(TemporaryError):
    """The database could not be reached or stayed locked past the busy timeout."""
