"""Who calls the job API: identities from the server's own records, never from the request.

Three ways, tried in this order:

1. **an authenticating proxy**: on a connection from an address in ``api.trusted_proxies``, the
   user named by ``api.proxy.user_header`` (``X-Remote-User``) and the groups of
   ``api.proxy.group_header``; from any other address these headers are ignored;
2. **idlegpu tokens** (``Authorization: Bearer igt_...``, made by ``idlegpu token create``):
   looked up by their SHA-256 in the store, with their team, role, expiry and revocation;
3. **Kubernetes TokenReview** (``api.token_review.enabled``): any other bearer token is handed
   to the API server, which says whose it is (a ServiceAccount token, an OIDC token).

Proxy and Kubernetes users become a team and a role through ``api.identities`` (first match
wins); an authenticated user no rule maps is refused (403).

**Token hashing.** A token is ``igt_`` plus 32 random bytes (256 bits, ``secrets``), and the
store keeps only its SHA-256. A slow password hash (scrypt, PBKDF2) defends low-entropy
secrets against guessing once the hashes leak; a 256-bit random secret cannot be guessed
whatever the hash, so one SHA-256 is as safe here, lets the lookup be one indexed equality
(no per-token salt to try), and keeps every request's authentication cheap (an scrypt per
call would make each unauthenticated request cost the server tens of milliseconds and
megabytes: a denial of service on a two-core pod).
"""

from __future__ import annotations

import hashlib
import ipaddress
import logging
import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Protocol

from idlegpu.scheduler.config import ApiConfig, IdentityMapping
from idlegpu.scheduler.service.errors import ServiceError
from idlegpu.scheduler.service.identity import (
    MEMBER,
    OPERATOR,
    ROLES,
    TOKEN_PREFIX,
    VIEWER,
    WORKLOAD,
    Identity,
    PodRef,
    new_token,
    token_sha256,
)

log = logging.getLogger("idlegpu.api")

SERVICE_ACCOUNT_PREFIX = "system:serviceaccount:"


class ApiError(ServiceError):
    """A refusal of the HTTP front door itself (authentication, headers): ``status``,
    one-line ``message``, the ``field`` it is about, extra ``headers``."""


CHALLENGE = {"WWW-Authenticate": 'Bearer realm="idlegpu"'}
BAD_TOKEN = {"WWW-Authenticate": 'Bearer realm="idlegpu", error="invalid_token"'}


def unauthenticated(message: str, *, bad_token: bool = False) -> ApiError:
    return ApiError(401, message, headers=BAD_TOKEN if bad_token else CHALLENGE)


class TokenStore(Protocol):
    def api_token_by_hash(self, token_sha256: str) -> Any: ...


class Reviewer(Protocol):
    def review(self, token: str) -> tuple[bool, str, tuple[str, ...]]:
        """``(authenticated, username, groups)``; an answer with a ``pod`` attribute (a
        ``PodRef``, or None) also says which pod the token is bound to."""


def map_identity(rules: Sequence[IdentityMapping], user: str,
                 groups: Sequence[str]) -> IdentityMapping | None:
    for rule in rules:
        if rule.user is not None and rule.user != user:
            continue
        if rule.group is not None and rule.group not in groups:
            continue
        return rule
    return None


@dataclass
class Authenticator:
    """Turns a call's headers and peer address into an ``Identity`` (or an ``ApiError``)."""

    config: ApiConfig
    store: TokenStore
    reviewer: Reviewer | None = None
    workload_namespace: str | None = None
    """The research Jobs' namespace: a token bound to a pod there is that pod's ``workload``
    identity (its unit's checkpoint reports only), never mapped to a team."""
    _proxies: list[Any] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._proxies = [ipaddress.ip_network(c, strict=False)
                         for c in self.config.trusted_proxies]
        if self.config.token_review.enabled and self.reviewer is None:
            raise ValueError("api.token_review.enabled needs a reviewer")

    def trusted_proxy(self, address: str | None) -> bool:
        if not address or not self._proxies:
            return False
        try:
            ip = ipaddress.ip_address(address)
        except ValueError:
            return False
        return any(ip in net for net in self._proxies)

    def authenticate(self, headers: Mapping[str, str], address: str | None,
                     now: datetime, *, workload: bool = False) -> Identity:
        """The caller; ``workload``: a research pod's own token is accepted (the checkpoint
        route only: everywhere else it is refused with 403)."""
        proxy = self.config.proxy
        user_header = headers.get(proxy.user_header.lower())
        if user_header is not None:
            if self.trusted_proxy(address):
                return self._from_proxy(headers, user_header, address)
            log.warning("ignored %s from %s: not in api.trusted_proxies", proxy.user_header,
                        address)
        authorization = headers.get("authorization")
        if not authorization:
            raise unauthenticated(
                "authentication required: send 'Authorization: Bearer <token>' (a token from "
                "`idlegpu token create`" + (", or a Kubernetes token" if
                                            self.config.token_review.enabled else "") + ")")
        scheme, _, token = authorization.strip().partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not token:
            raise unauthenticated("the Authorization header must be 'Bearer <token>'")
        if token.startswith(TOKEN_PREFIX) and self.config.tokens:
            return self._from_token(token, address, now)
        if self.config.token_review.enabled and self.reviewer is not None:
            return self._from_review(token, address, workload=workload)
        raise unauthenticated("unknown token (not an idlegpu token, and Kubernetes "
                              "TokenReview is off: api.token_review.enabled)", bad_token=True)

    def _from_token(self, token: str, address: str | None, now: datetime) -> Identity:
        row = self.store.api_token_by_hash(token_sha256(token))
        if row is None:
            raise unauthenticated("unknown token", bad_token=True)
        if row.revoked_at is not None:
            raise unauthenticated(f"token {row.name!r} was revoked", bad_token=True)
        if row.expires_at is not None and now >= row.expires_at:
            raise unauthenticated(
                f"token {row.name!r} expired at {row.expires_at.isoformat()}; ask an operator "
                "for a new one", bad_token=True)
        return Identity(user=row.name, auth="token", team=row.team, role=row.role,
                        address=address)

    def _mapped(self, user: str, groups: tuple[str, ...], auth: str,
                address: str | None) -> Identity:
        rule = map_identity(self.config.identities, user, groups)
        if rule is None:
            raise ApiError(403, f"{user!r} is authenticated but no api.identities entry maps "
                                "it (or its groups) to a team and role; ask an operator")
        return Identity(user=user, auth=auth, team=rule.team, role=rule.role, groups=groups,
                        address=address)

    def _from_review(self, token: str, address: str | None, *,
                     workload: bool = False) -> Identity:
        answer = self.reviewer.review(token)  # type: ignore[union-attr]
        ok, user, groups = answer[0], answer[1], tuple(answer[2])
        if not ok:
            raise unauthenticated("the Kubernetes API server does not accept this token",
                                  bad_token=True)
        pod = getattr(answer, "pod", None)
        if pod is not None and self.workload_namespace and pod.namespace == (
                self.workload_namespace):
            if not workload:
                raise ApiError(403, f"a token of research pod {pod.namespace}/{pod.name} may "
                                    "only report its own unit's checkpoints and progress "
                                    "(POST /v1/units/<unit>/checkpoint)")
            return Identity(user=user, auth="pod", team="", role=WORKLOAD, groups=groups,
                            address=address, pod=pod)
        return self._mapped(user, groups, "tokenreview", address)

    def _from_proxy(self, headers: Mapping[str, str], user: str,
                    address: str | None) -> Identity:
        user = user.strip()
        if not user:
            raise unauthenticated(f"empty {self.config.proxy.user_header} from the proxy")
        name = self.config.proxy.group_header.lower()
        getlist = getattr(headers, "getlist", None)
        values = getlist(name) if getlist is not None else [headers.get(name, "")]
        groups = tuple(g.strip() for v in values for g in v.split(",") if g.strip())
        forwarded = self.forwarded_client(headers.get("x-forwarded-for", ""))
        where = f"{forwarded} via {address}" if forwarded else address
        return self._mapped(user, groups, "proxy", where)

    def forwarded_client(self, forwarded_for: str) -> str | None:
        """The client an ``X-Forwarded-For`` chain names, read from the right: each trusted
        proxy appends the address it got the call from, so the rightmost address that is not
        one of ``api.trusted_proxies`` is the last one a proxy of ours vouches for; everything
        left of it is the client's own words. None when the chain names no such address."""
        hops = [hop.strip() for hop in forwarded_for[-4096:].split(",")][-32:]  # the right end
        for hop in reversed(hops):
            if not hop:
                continue
            try:
                ipaddress.ip_address(hop)
            except ValueError:
                return None  # not an address: nothing a proxy of ours wrote
            if not self.trusted_proxy(hop):
                return hop
        return None
