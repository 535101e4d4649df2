"""Who acts: the caller as the front door established it (the job API's authentication, the
console's session, the local operator of the CLI), and the audit entry of what it changed."""

from __future__ import annotations

import getpass
import hashlib
import secrets
import socket
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol

from idlegpu.scheduler.adapters.store import AuditEntry

MEMBER, OPERATOR, VIEWER = "member", "operator", "viewer"
ROLES = (MEMBER, OPERATOR, VIEWER)
WORKLOAD = "workload"
"""The role of a research pod's own token (pod-bound, from the jobs' namespace): it may
report its unit's checkpoints and progress, nothing else (never one of ``ROLES``)."""
TOKEN_PREFIX = "igt_"
CLI = "cli"
"""How the CLI's local operator is known: whoever reaches the store acts as an operator."""


@dataclass(frozen=True)
class PodRef:
    """The pod a Kubernetes token is bound to, as TokenReview names it."""

    namespace: str
    name: str
    uid: str


@dataclass(frozen=True)
class Identity:
    """The caller, as the server established it."""

    user: str
    auth: str
    """``token``, ``tokenreview``, ``proxy`` (the job API), ``session`` users are the API's;
    ``cli``: the local operator."""
    team: str
    role: str
    groups: tuple[str, ...] = ()
    address: str | None = None
    """Where the call came from (the client's address; behind a proxy ``client via proxy``)."""
    pod: PodRef | None = None
    """A ``workload`` caller's pod."""

    @property
    def principal(self) -> str:
        """Stable id of the caller: what idempotency keys and "mine" are scoped to (the CLI's
        user is already ``cli:<login>``)."""
        return self.user if self.local else f"{self.auth}:{self.user}"

    @property
    def local(self) -> bool:
        """The CLI's operator, on the store itself: the job API's per-team rules (the team
        is the caller's, priority caps, quotas) are not its."""
        return self.auth == CLI

    def may_change(self) -> bool:
        return self.role in (MEMBER, OPERATOR)

    def may_cancel(self, team: str) -> bool:
        return self.role == OPERATOR or (self.role == MEMBER and team == self.team)


def cli_identity(team: str = "") -> Identity:
    """The CLI's caller: ``cli:<login>`` on this host, an operator (acting for ``team``, the
    request's, when it submits)."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = "unknown"
    return Identity(user=f"cli:{user}", auth=CLI, team=team, role=OPERATOR,
                    address=f"local ({socket.gethostname()})")


def audit_entry(who: Identity, action: str, target: str, at: datetime,
                **detail: Any) -> AuditEntry:
    return AuditEntry(at=at, actor=who.user, auth=who.auth, role=who.role,
                      team=None if who.local else who.team, action=action, target=target,
                      address=who.address, detail=detail)


def new_token() -> str:
    """A fresh idlegpu token: ``igt_`` + 43 URL-safe characters (32 random bytes)."""
    return TOKEN_PREFIX + secrets.token_urlsafe(32)


def token_sha256(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


class Authenticates(Protocol):
    """Who a call's headers say the caller is, and whether its address is a trusted proxy's
    (the job API's ``Authenticator``)."""

    def authenticate(self, headers: Mapping[str, str], address: str | None,
                     now: datetime) -> Identity: ...

    def trusted_proxy(self, address: str | None) -> bool: ...
