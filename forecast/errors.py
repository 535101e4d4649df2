"""The error hierarchy of idlegpu.

Every error a user can fix (a bad file, a bad config, an unreachable server) is an
``IdlegpuError``; the CLI prints its message on one line and exits non-zero. Errors that may go
away on their own (a server briefly down) are ``TemporaryError`` so callers can retry them;
``PermanentError`` means retrying the same call cannot help.
"""

from __future__ import annotations


class IdlegpuError(Exception):
    """Base of all errors meant for the user: the message says what happened and what to do."""


class PermanentError(IdlegpuError):
    """Retrying the same call will fail the same way (bad input, bad config)."""


class TemporaryError(IdlegpuError):
    """The call may succeed later (server down, timeout); ``delay`` hints when to retry, in s."""

    def __init__(self, message: str, *, delay: float = 30.0) -> None:
        super().__init__(message)
        self.delay = delay


class ConfigError(PermanentError):
    """The configuration file or its environment overrides are invalid."""


class HistoryError(PermanentError):
    """A history frame or file does not follow the ``unique_id, ds, y`` format."""


class SourceUnavailableError(TemporaryError):
    """A metrics source (Prometheus) could not be reached or answered with a server error."""
