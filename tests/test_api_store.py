"""The job API's part of the store (schema version 4) on SQLite and a REAL PostgreSQL: a v3
store migrates without touching its tables, and a caller's idempotency key admits one request
under concurrent submissions."""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest
import sqlalchemy as sa
from api_server import T0, api_settings, job

import idlegpu.scheduler.adapters.store as store_mod
from idlegpu.scheduler.adapters.store import AuditEntry, JobStore
from idlegpu.scheduler.specs import expand_units, validate_request
from idlegpu.scheduler.types import JobState


@pytest.fixture(params=["sqlite", "postgresql"])
def url(request, tmp_path):
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'jobs.db'}"
    return request.getfixturevalue("fresh_postgres_url")


def entry(action: str = "submit", target: str = "") -> AuditEntry:
    return AuditEntry(at=T0, actor="alice", auth="token", role="member", team="alignment",
                      action=action, target=target, address="127.0.0.1")


def submit(store: JobStore, key: str | None, body: dict | None = None,
           principal: str = "token:alice"):
    request = validate_request(body or job(), api_settings().admission)
    return store.submit_from_api(
        principal=principal, idempotency_key=key, body_sha256="h" * 64,
        request_name=request.name, team=request.team, kind=request.kind,
        raw=request.model_dump(mode="json"), units=expand_units(request), now=T0,
        audit=entry())


def test_a_v3_store_migrates_to_v4_with_its_data_and_tables_untouched(url, monkeypatch):
    monkeypatch.setattr(store_mod, "MIGRATIONS", store_mod.MIGRATIONS[:3])
    with JobStore(url) as old:
        assert old.schema_version() == 3
        rid = old.submit("old-job", "alignment", "sft", {}, expand_units(validate_request(
            job("old-job"), api_settings().admission)), T0)
    engine = sa.create_engine(url)
    before = {t: {c["name"] for c in sa.inspect(engine).get_columns(t)}
              for t in sa.inspect(engine).get_table_names()}
    engine.dispose()
    monkeypatch.undo()
    monkeypatch.setattr(store_mod, "MIGRATIONS", store_mod.MIGRATIONS[:4])
    with JobStore(url) as new:
        assert new.schema_version() == 4  # (v5: tests/test_admission_pause.py)
        assert [u.state for u in new.request_units(rid)] == [JobState.QUEUED] * 4
        assert new.submitted_by(rid) is None  # not submitted through the API
        assert new.api_tokens() == [] and new.audit_log() == []
    engine = sa.create_engine(url)
    inspector = sa.inspect(engine)
    after = {t: {c["name"] for c in inspector.get_columns(t)} for t in inspector.get_table_names()}
    engine.dispose()
    assert set(after) - set(before) == {"api_tokens", "api_submissions", "audit_log"}
    assert {t: after[t] for t in before} == before


def test_one_request_per_callers_key_under_concurrent_submissions(url):
    with JobStore(url) as store:
        results, errors = [], []
        barrier = threading.Barrier(6)

        def go(principal: str) -> None:
            barrier.wait()
            try:
                results.append((principal, submit(store, "same-key", principal=principal)))
            except Exception as exc:  # noqa: BLE001 - reported below
                errors.append(exc)

        threads = [threading.Thread(target=go, args=(p,))
                   for p in ["token:alice"] * 4 + ["token:bob"] * 2]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert not errors, errors
        by = {p: {r.request_id for q, r in results if q == p} for p in ("token:alice",
                                                                         "token:bob")}
        assert len(by["token:alice"]) == len(by["token:bob"]) == 1
        assert sum(r.created for _, r in results) == 2
        assert len(store.find_units()) == 8
        assert [e.action for e in store.audit_log()] == ["submit", "submit"]


def test_tokens_are_stored_by_hash_with_expiry_and_revocation(url):
    with JobStore(url) as store:
        store.create_api_token("ci", "alignment", "member", "a" * 64, T0,
                               T0 + timedelta(days=1), entry("token.create", "ci"))
        with pytest.raises(store_mod.StoreError, match="a token named 'ci' already exists"):
            store.create_api_token("ci", "vision", "member", "b" * 64, T0, None,
                                   entry("token.create", "ci"))
        row = store.api_token_by_hash("a" * 64)
        assert row.name == "ci" and row.valid_at(T0) and not row.valid_at(T0 + timedelta(days=1))
        assert store.revoke_api_token("ci", T0, entry("token.revoke", "ci")).revoked_at == T0
        assert not store.api_token_by_hash("a" * 64).valid_at(T0)
        with pytest.raises(store_mod.StoreError, match="no token named 'nope'"):
            store.revoke_api_token("nope", T0, entry("token.revoke", "nope"))
        assert [e.action for e in store.audit_log()] == ["token.create", "token.revoke"]


def test_concurrent_submissions_never_both_pass_a_quota(url):
    """Six submissions of one caller at once, each of 4 units, against a quota of 8 live
    units: exactly two get in, whatever the backend (PostgreSQL: a per-caller lock in the
    submission's transaction)."""
    from idlegpu.scheduler.adapters.store import QuotaExceededError, SubmitQuota

    quota = SubmitQuota(live_units=8, requests_per_hour=100, stored_bytes=10**9)
    with JobStore(url) as store:
        created, refused, errors = [], [], []
        barrier = threading.Barrier(6)

        def go(i: int) -> None:
            request = validate_request(job(f"q{i}"), api_settings().admission)
            barrier.wait()
            try:
                created.append(store.submit_from_api(
                    principal="token:alice", idempotency_key=None, body_sha256="h" * 64,
                    request_name=request.name, team=request.team, kind=request.kind,
                    raw=request.model_dump(mode="json"), units=expand_units(request), now=T0,
                    audit=entry(), quota=quota))
            except QuotaExceededError as exc:
                refused.append(exc)
            except Exception as exc:  # noqa: BLE001 - reported below
                errors.append(exc)

        threads = [threading.Thread(target=go, args=(i,)) for i in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert not errors, errors
        assert len(created) == 2 and len(refused) == 4
        assert all(e.quota == "live_units" and e.limit == 8 for e in refused)
        assert len(store.find_units()) == 8
        assert store.quota_use("token:alice", T0)["live_units"] == 8
