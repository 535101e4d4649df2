"""The job API's identities (schema version 4): its tokens (by their SHA-256), who
submitted what (API submissions, checked against the caller's quota) and the audit log of
every change made through the API or ``idlegpu token``."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import uuid
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import sqlalchemy as sa
from sqlalchemy import exc as sa_exc
from sqlalchemy.engine import Connection

from idlegpu.scheduler.adapters.store.base import StoreBase
from idlegpu.scheduler.adapters.store.codec import (
    _aware,
    _aware_opt,
    _check_units,
    _iso,
    _jsonable,
    _short,
    _slug,
    spec_to_json,
)
from idlegpu.scheduler.adapters.store.errors import (
    InvalidRequestError,
    QuotaExceededError,
    StoreError,
    UnknownJobError,
)
from idlegpu.scheduler.adapters.store.rows import (
    ApiSubmission,
    ApiTokenRow,
    AuditEntry,
    CancelResult,
    SubmitQuota,
)
from idlegpu.scheduler.adapters.store.schema import (
    _TERMINAL,
    API_SUBMISSIONS,
    API_TOKENS,
    AUDIT_LOG,
    REQUESTS,
    UNITS,
)
from idlegpu.scheduler.adapters.store.transitions import TransitionsMixin
from idlegpu.scheduler.adapters.store.units import UnitsMixin
from idlegpu.scheduler.types import UnitSpec

AUDIT_LOGGER = "idlegpu.audit"


class AuditMixin(StoreBase):
    """``JobStore``'s audit log: every change made through the job API, ``idlegpu token`` or
    the operators' controls, in the change's own transaction and on the ``idlegpu.audit``
    logger."""

    @staticmethod
    def _insert_audit(conn: Connection, entry: AuditEntry) -> None:
        _aware(entry.at, "at")
        conn.execute(sa.insert(AUDIT_LOG).values(
            at=entry.at, actor=entry.actor, auth=entry.auth, role=entry.role, team=entry.team,
            action=entry.action, target=entry.target, address=entry.address,
            detail=_jsonable(dict(entry.detail)),
        ))

    @staticmethod
    def _log_audit(entry: AuditEntry) -> None:
        logging.getLogger(AUDIT_LOGGER).info(
            "%s", json.dumps({
                "at": _iso(entry.at), "actor": entry.actor, "auth": entry.auth,
                "role": entry.role, "team": entry.team, "action": entry.action,
                "target": entry.target, "address": entry.address,
                "detail": _jsonable(dict(entry.detail)),
            }, sort_keys=True))

    def record_audit(self, entry: AuditEntry) -> None:
        """Append ``entry`` to the audit log (and the ``idlegpu.audit`` logger)."""
        with self._tx(write=True) as conn:
            self._insert_audit(conn, entry)
        self._log_audit(entry)

    def audit_log(self, since: datetime | None = None, *, limit: int = 1000,
                  team: str | None = None, action: str | None = None,
                  actor: str | None = None, offset: int = 0) -> list[AuditEntry]:
        """The audit log, oldest first (``at >= since``), at most ``limit`` entries (the
        newest ones, after skipping the ``offset`` newest: pages from the newest back)."""
        where = []
        if since is not None:
            where.append(AUDIT_LOG.c.at >= _aware(since, "since"))
        if team is not None:
            where.append(AUDIT_LOG.c.team == team)
        if action is not None:
            where.append(AUDIT_LOG.c.action == action)
        if actor is not None:
            where.append(AUDIT_LOG.c.actor == actor)
        with self._tx(write=False) as conn:
            rows = conn.execute(sa.select(AUDIT_LOG).where(*where)
                                .order_by(AUDIT_LOG.c.id.desc()).offset(max(0, offset))
                                .limit(limit)).all()
        return [AuditEntry(at=r.at, actor=r.actor, auth=r.auth, role=r.role, team=r.team,
                           action=r.action, target=r.target, address=r.address,
                           detail=dict(r.detail or {}), id=r.id) for r in reversed(rows)]


class IdentitiesMixin(AuditMixin, UnitsMixin, TransitionsMixin):
    """``JobStore``'s job API: tokens, submissions through the API with their quota, audited
    cancels."""

    @staticmethod
    def _token_row(r: Any) -> ApiTokenRow:
        return ApiTokenRow(name=r.name, team=r.team, role=r.role, created_at=r.created_at,
                           expires_at=r.expires_at, revoked_at=r.revoked_at,
                           created_by=r.created_by)

    def create_api_token(self, name: str, team: str, role: str, token_sha256: str,
                         now: datetime, expires_at: datetime | None,
                         audit: AuditEntry) -> ApiTokenRow:
        """Store a new token of the job API by its SHA-256 (the token itself is never stored),
        with ``audit`` in the same transaction. Names are unique, revoked ones included."""
        _aware(now)
        _aware_opt(expires_at, "expires_at")
        try:
            with self._tx(write=True) as conn:
                if conn.execute(sa.select(API_TOKENS.c.name)
                                .where(API_TOKENS.c.name == name)).scalar() is not None:
                    raise StoreError(f"a token named {name!r} already exists (revoked tokens "
                                     "keep their name); choose another name")
                conn.execute(sa.insert(API_TOKENS).values(
                    name=name, token_sha256=token_sha256, team=team, role=role,
                    created_at=now, expires_at=expires_at, revoked_at=None,
                    created_by=audit.actor))
                self._insert_audit(conn, audit)
        except sa_exc.IntegrityError as exc:
            raise StoreError(f"cannot store token {name!r}: {_short(exc)}") from exc
        self._log_audit(audit)
        return ApiTokenRow(name, team, role, now, expires_at, None, audit.actor)

    def api_token_by_hash(self, token_sha256: str) -> ApiTokenRow | None:
        with self._tx(write=False) as conn:
            r = conn.execute(sa.select(API_TOKENS)
                             .where(API_TOKENS.c.token_sha256 == token_sha256)).one_or_none()
        return None if r is None else self._token_row(r)

    def api_tokens(self) -> list[ApiTokenRow]:
        with self._tx(write=False) as conn:
            rows = conn.execute(sa.select(API_TOKENS).order_by(API_TOKENS.c.name)).all()
        return [self._token_row(r) for r in rows]

    def revoke_api_token(self, name: str, now: datetime, audit: AuditEntry) -> ApiTokenRow:
        """Revoke the token ``name`` (from now on it authenticates nobody); revoking it again
        changes nothing but is audited too."""
        _aware(now)
        with self._tx(write=True) as conn:
            r = conn.execute(sa.select(API_TOKENS)
                             .where(API_TOKENS.c.name == name)).one_or_none()
            if r is None:
                raise StoreError(f"no token named {name!r}; `idlegpu token list` lists them")
            if r.revoked_at is None:
                conn.execute(sa.update(API_TOKENS).where(API_TOKENS.c.name == name)
                             .values(revoked_at=now))
            self._insert_audit(conn, audit)
            r = conn.execute(sa.select(API_TOKENS).where(API_TOKENS.c.name == name)).one()
        self._log_audit(audit)
        return self._token_row(r)

    def submit_from_api(
        self, *, principal: str, idempotency_key: str | None, body_sha256: str,
        request_name: str, team: str, kind: str, raw: Mapping[str, Any],
        units: Sequence[UnitSpec], now: datetime, audit: AuditEntry,
        address: str | None = None, quota: SubmitQuota | None = None,
    ) -> ApiSubmission:
        """``submit`` for a caller of the job API, in one transaction with who submitted it
        and its audit entry. An ``idempotency_key`` is the caller's own (``principal``): when
        the caller used it before, nothing is stored and the earlier request is returned
        (``created=False``, with its body hash for the caller to compare). With ``quota``, a
        submission past it raises ``QuotaExceededError`` and stores nothing."""
        _aware(now)
        if not request_name.strip():
            raise InvalidRequestError("a request needs a name")
        _check_units(units)
        raw_json = _jsonable(raw)
        asked_bytes = (len(json.dumps(raw_json, separators=(",", ":")))
                       + sum(len(json.dumps(spec_to_json(u), separators=(",", ":")))
                             for u in units))

        def earlier(conn: Connection) -> ApiSubmission | None:
            if idempotency_key is None:
                return None
            r = conn.execute(sa.select(API_SUBMISSIONS.c.request_id,
                                       API_SUBMISSIONS.c.body_sha256).where(
                API_SUBMISSIONS.c.principal == principal,
                API_SUBMISSIONS.c.idempotency_key == idempotency_key)).one_or_none()
            return None if r is None else ApiSubmission(r.request_id, False, r.body_sha256)

        for attempt in range(5):
            rid = f"{_slug(request_name)}-{uuid.uuid4().hex[:8]}"
            entry = dataclasses.replace(audit, target=rid)
            try:
                with self._tx(write=True) as conn:
                    found = earlier(conn)
                    if found is not None:
                        return found
                    if quota is not None:
                        self._check_quota(conn, principal, quota, len(units), asked_bytes, now)
                    self._insert_request(conn, rid, request_name, team, kind, raw_json, units,
                                         now, None)
                    conn.execute(sa.insert(API_SUBMISSIONS).values(
                        request_id=rid, principal=principal, idempotency_key=idempotency_key,
                        body_sha256=body_sha256, address=address, stored_bytes=asked_bytes))
                    self._insert_audit(conn, entry)
                self._log_audit(entry)
                return ApiSubmission(rid, True, body_sha256)
            except sa_exc.IntegrityError as exc:
                with self._tx(write=False) as conn:
                    found = earlier(conn)
                if found is not None:
                    return found
                if attempt == 4:
                    raise StoreError(f"cannot store request {request_name}: {_short(exc)}"
                                     ) from exc
        raise AssertionError("unreachable")

    def quota_use(self, principal: str, now: datetime) -> dict[str, Any]:
        """What ``principal`` holds against its quota: live units, bytes of their stored specs
        (and their requests'), requests in the hour before ``now`` and the oldest of them."""
        _aware(now)
        with self._tx(write=False) as conn:
            return self._quota_use(conn, principal, now)

    def _quota_use(self, conn: Connection, principal: str, now: datetime) -> dict[str, Any]:
        sub = API_SUBMISSIONS
        mine = sa.select(sub.c.request_id).where(sub.c.principal == principal)
        live = UNITS.c.state.notin_(_TERMINAL)
        units = conn.execute(sa.select(sa.func.count()).select_from(UNITS).join(
            sub, sub.c.request_id == UNITS.c.request_id).where(
            sub.c.principal == principal, live)).scalar_one()
        stored = conn.execute(sa.select(sa.func.coalesce(sa.func.sum(sub.c.stored_bytes), 0))
                              .where(sub.c.principal == principal, sa.exists().where(
                                  UNITS.c.request_id == sub.c.request_id, live))).scalar_one()
        recent, oldest = conn.execute(sa.select(
            sa.func.count(), sa.func.min(REQUESTS.c.submitted_at)).where(
            REQUESTS.c.id.in_(mine), REQUESTS.c.submitted_at > now - timedelta(hours=1))).one()
        if isinstance(oldest, datetime) and oldest.tzinfo is None:  # func.min drops the type
            oldest = oldest.replace(tzinfo=UTC)
        elif isinstance(oldest, str):
            oldest = datetime.fromisoformat(oldest).replace(tzinfo=UTC)
        return {"live_units": int(units), "stored_bytes": int(stored),
                "requests_last_hour": int(recent), "oldest_in_hour": oldest}

    def _check_quota(self, conn: Connection, principal: str, quota: SubmitQuota, units: int,
                     asked_bytes: int, now: datetime) -> None:
        if conn.dialect.name == "postgresql":
            # one submission of a caller at a time until its transaction ends, so two cannot
            # both pass the check (SQLite's write transactions are one at a time already)
            key = int.from_bytes(hashlib.sha256(b"idlegpu-quota:" + principal.encode())
                                 .digest()[:8], "big", signed=True)
            conn.execute(sa.select(sa.func.pg_advisory_xact_lock(key)))
        use = self._quota_use(conn, principal, now)
        where = f"({quota.setting})"
        if use["requests_last_hour"] + 1 > quota.requests_per_hour:
            frees = use["oldest_in_hour"] + timedelta(hours=1)
            wait = max(1.0, (frees - now).total_seconds())
            raise QuotaExceededError(
                f"quota requests_per_hour {where}: {use['requests_last_hour']} requests in the "
                f"last hour, the limit is {quota.requests_per_hour}; the next one frees at "
                f"{frees.isoformat(timespec='seconds')} (in {wait:.0f} s)",
                quota="requests_per_hour", limit=quota.requests_per_hour,
                used=use["requests_last_hour"], asked=1, retry_after_s=wait)
        if use["live_units"] + units > quota.live_units:
            raise QuotaExceededError(
                f"quota live_units {where}: you hold {use['live_units']} live units and this "
                f"request adds {units}, over the limit of {quota.live_units}; it frees as your "
                "units end or as you cancel some (or ask an operator to raise it)",
                quota="live_units", limit=quota.live_units, used=use["live_units"],
                asked=units, retry_after_s=None)
        if use["stored_bytes"] + asked_bytes > quota.stored_bytes:
            raise QuotaExceededError(
                f"quota stored_bytes {where}: your live units' specs hold "
                f"{use['stored_bytes']:,} bytes and this request adds {asked_bytes:,}, over the "
                f"limit of {quota.stored_bytes:,}; pass large values once (a file in storage) "
                "instead of templating them into every unit; it frees as your units end",
                quota="stored_bytes", limit=quota.stored_bytes, used=use["stored_bytes"],
                asked=asked_bytes, retry_after_s=None)

    def submitted_by(self, request_id: str) -> str | None:
        """The job API caller (principal) who submitted ``request_id`` (None: not through the
        API)."""
        with self._tx(write=False) as conn:
            return conn.execute(sa.select(API_SUBMISSIONS.c.principal).where(
                API_SUBMISSIONS.c.request_id == request_id)).scalar()

    def cancel_audited(self, id_or_request_id: str, now: datetime, audit: AuditEntry,
                       reason: str = "cancelled by user") -> CancelResult:
        """``cancel`` with its audit entry in the same transaction."""
        _aware(now)
        with self._tx(write=True) as conn:
            is_unit = conn.execute(
                sa.select(UNITS.c.id).where(UNITS.c.id == id_or_request_id)).scalar()
            if is_unit is not None:
                targets = [id_or_request_id, *self._dependants(conn, [id_or_request_id])]
            else:
                targets = list(conn.execute(
                    sa.select(UNITS.c.id).where(UNITS.c.request_id == id_or_request_id)
                    .order_by(UNITS.c.step_index, UNITS.c.member)).scalars())
                if not targets:
                    raise UnknownJobError(
                        f"no job request or unit {id_or_request_id!r}; `idlegpu queue` lists them")
            result = self._cancel_units(conn, targets, now, reason)
            entry = dataclasses.replace(audit, detail={
                **dict(audit.detail), "reason": reason, "cancelled": list(result.cancelled),
                "to_stop": list(result.to_stop)})
            self._insert_audit(conn, entry)
        self._log_audit(entry)
        return result
