"""The Kubernetes adapter's errors: an API server out of reach (``ClusterUnavailableError``, a
``TemporaryError``), a missing RBAC grant (``ClusterPermissionError``), a request the server
refused (``ClusterRejectedError``, naming the fields), a Job name taken by someone else
(``JobConflictError``) and a manifest breaking the pod security rules
(``UnsafeManifestError``). No client import: the pure manifest building raises them too."""

from __future__ import annotations

from idlegpu.forecast.errors import PermanentError, TemporaryError
from idlegpu.scheduler.ports import JobRejectedError


class ClusterUnavailableError(TemporaryError):
    """The Kubernetes API could not be reached, timed out or kept answering 5xx/429."""


class ClusterPermissionError(PermanentError):
    """The API server answered 403: the service account lacks an RBAC permission."""


class ClusterRejectedError(JobRejectedError):
    """The API server rejected a request (422 Invalid, 400, ...); ``fields`` names the culprits."""

    def __init__(self, message: str, *, status: int, fields: tuple[str, ...] = ()) -> None:
        super().__init__(message)
        self.status = status
        self.fields = fields


class JobConflictError(JobRejectedError):
    """A Job with the attempt's name exists but belongs to another unit or to someone else."""


class UnsafeManifestError(JobRejectedError):
    """A manifest breaks the pod security rules (privileged, host namespaces, hostPath...)."""


class _NotFound(Exception):
    pass


class _Conflict(Exception):
    pass
