"""What the Kubernetes adapter writes on its objects and reads back: the labels, annotations,
environment variables and other fixed names of its Jobs, the deterministic Job names and label
values (DNS-1123 safe, hashed when lossy), and the RFC 3339 times in annotations. Pure: no
client, no I/O."""

from __future__ import annotations

import hashlib
import re
from datetime import UTC, datetime
from typing import Any

MANAGED_BY = "app.kubernetes.io/managed-by"
MANAGER = "idlegpu"
SELECTOR = f"{MANAGED_BY}={MANAGER}"
LABEL_UNIT = "idlegpu.io/unit"
LABEL_TEAM = "idlegpu.io/team"
LABEL_ATTEMPT = "idlegpu.io/attempt"
ANN_UNIT_ID = "idlegpu.io/unit-id"
ANN_TEAM = "idlegpu.io/team"
ANN_STOP_BY = "idlegpu.io/stop-by"
ANN_CREATED_AT = "idlegpu.io/created-at"
ANN_STOP_REASON = "idlegpu.io/stop-reason"
ANN_STOP_KIND = "idlegpu.io/stop-kind"
ANN_STOPPED_AT = "idlegpu.io/stopped-at"
LABEL_INSTANCE = "idlegpu.io/instance"
JOB_NAME_LABELS = ("batch.kubernetes.io/job-name", "job-name")  # set on pods by the Job controller
ANN_STEP = "idlegpu.io/step"
ANN_CHECKPOINT_REQUEST = "idlegpu.io/checkpoint-request"  # the notice's deadline, RFC 3339
ANN_CHECKPOINT_REASON = "idlegpu.io/checkpoint-reason"
NOTICE_DIR = "/etc/idlegpu"
NOTICE_FILE = "checkpoint-request"  # the kubelet projects the annotation here
TOKEN_DIR = "/var/run/secrets/idlegpu"
NOTICE_VOLUME = "idlegpu-notice"
TOKEN_VOLUME = "idlegpu-token"
NOTICE_FILE_ENV = "IDLEGPU_CHECKPOINT_REQUEST_FILE"
TOKEN_FILE_ENV = "IDLEGPU_TOKEN_FILE"
API_URL_ENV = "IDLEGPU_API_URL"
GPU_RESOURCE = "nvidia.com/gpu"
RESUME_ENV = "IDLEGPU_RESUME"
ATTEMPT_ENV = "IDLEGPU_ATTEMPT"
UNIT_ENV = "IDLEGPU_UNIT"
OUTPUT_ENV = "IDLEGPU_OUTPUT"
CONTAINER_NAME = "job"
INDEX_ANNOTATION = "batch.kubernetes.io/job-completion-index"  # set on an Indexed Job's pods
JOB_NAME_LABEL = JOB_NAME_LABELS[0]
RENDEZVOUS_PORT = 29500  # torch.distributed's default
JOBSET_GROUP = "jobset.x-k8s.io"

_MAX_NAME = 63
_MAX_LABEL = 63
DISRUPTION_REASON = "StoppedByIdlegpu"  # the DisruptionTarget reason of the pods we stop


def _digest(text: str, n: int = 8) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:n]


def _dns_part(text: str) -> str:
    """Lower-case ``text`` into DNS-1123 label characters, runs of others to one ``-``."""
    return re.sub(r"-+", "-", re.sub(r"[^a-z0-9-]", "-", text.lower())).strip("-")


def job_name(unit_id: str, attempt: int) -> str:
    """``idlegpu-{unit}-a{attempt}``, a DNS-1123 label of at most 63 characters.

    When the unit id is not already DNS-safe (upper case, ``_``, ``/``...) or the name would be
    too long, an 8-hex hash of the exact unit id is added, so distinct ids never share a name.
    """
    if attempt < 1:
        raise ValueError(f"attempt must be >= 1, not {attempt}")
    part = _dns_part(unit_id)
    suffix = f"-a{attempt}"
    name = f"idlegpu-{part}{suffix}"
    if part == unit_id and len(name) <= _MAX_NAME:
        return name
    tail = f"-{_digest(unit_id)}{suffix}"
    room = _MAX_NAME - len("idlegpu-") - len(tail)
    part = part[:room].rstrip("-")
    return f"idlegpu-{part}{tail}" if part else f"idlegpu{tail}"


def label_value(text: str) -> str:
    """``text`` as a valid label value (<= 63 chars of ``[A-Za-z0-9._-]``, alphanumeric ends);
    lossy values get an 8-hex hash of the original so they stay distinct."""
    clean = re.sub(r"[^A-Za-z0-9._-]", "-", text)
    if clean == text and len(text) <= _MAX_LABEL and re.fullmatch(r"([A-Za-z0-9].*)?", text) \
            and (not text or text[-1].isalnum()):
        return text
    tail = f"-{_digest(text)}"
    head = clean[: _MAX_LABEL - len(tail)].strip("-_.")
    return f"{head}{tail}" if head else _digest(text)


def _iso(when: datetime) -> str:
    """A time in an object we write, as Kubernetes writes its own (``creationTimestamp``):
    RFC 3339 in UTC, ``Z``, whatever zone the daemon's clock (a replay's ``--now``) is in."""
    return when.astimezone(UTC).isoformat().replace("+00:00", "Z")


def _parse_time(value: Any) -> datetime | None:
    if value is None or value == "":
        return None
    if isinstance(value, datetime):
        return value
    text = str(value)
    if text.endswith("Z"):
        text = text[:-1] + "+00:00"
    try:
        return datetime.fromisoformat(text)
    except ValueError:
        return None
