"""The job store: transitions and their accounting, dependency gating, cancel, idempotent
submission, compare-and-set refusals, crash safety, schema versions, and a state machine.

Runs on SQLite files. Set ``IDLEGPU_TEST_POSTGRES_URL`` (e.g.
``postgresql+psycopg://postgres@127.0.0.1:5432/idlegpu_test``, an empty scratch database) to
run the store tests on PostgreSQL too."""

from __future__ import annotations

import itertools
import os
import threading
from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest
import sqlalchemy as sa
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from idlegpu.forecast.errors import PermanentError, TemporaryError
from idlegpu.scheduler.adapters import store as store_mod
from idlegpu.scheduler.adapters.store import (
    METADATA,
    SCHEMA_VERSION,
    SCHEMA_VERSION_TABLE,
    AttemptOutcome,
    InvalidRequestError,
    JobStore,
    SchemaVersionError,
    StaleStateError,
    StoreError,
    TransitionRefusedError,
    UnknownJobError,
    spec_from_json,
    spec_to_json,
)
from idlegpu.scheduler.types import EventKind, JobState, UnitSpec

T0 = datetime(2026, 1, 28, 11, 0, tzinfo=UTC)
H = timedelta(hours=1)
M = timedelta(minutes=1)
EST = 3 * 3600.0
PG_URL = os.environ.get("IDLEGPU_TEST_POSTGRES_URL")


def spec(step_index: int = 0, member: int = 0, *, step: str = "train", gpus: int = 4,
         checkpointable: bool = True, depends_on=(), deadline=None, **kw) -> UnitSpec:
    values = {
        "step": step, "step_index": step_index, "member": member,
        "image": "registry.example.com/research/sft:v1.3", "command": ("python", "-m", "train"),
        "args": ("--lr", "0.0001"), "env": (("WANDB_MODE", "offline"),),
        "parameters": (("lr", "0.0001"), ("epochs", "2")), "gpus": gpus, "cpu": 16.0, "memory": "128Gi",
        "runtime_estimate_s": EST, "checkpointable": checkpointable,
        "checkpoint_interval_s": 1800.0 if checkpointable else None,
        "resume_args": ("--resume",) if checkpointable else (), "priority": 0, "deadline": deadline,
        "max_preemptions": 5, "output": "s3://bucket/out", "depends_on": tuple(depends_on),
    }
    values.update(kw)
    return UnitSpec(**values)


def pipeline() -> list[UnitSpec]:
    """data (2 sweep members) -> train -> eval."""
    return [
        spec(0, 0, step="data", gpus=1, checkpointable=False),
        spec(0, 1, step="data", gpus=1, checkpointable=False),
        spec(1, 0, step="train", gpus=8, depends_on=[(0, 0), (0, 1)]),
        spec(2, 0, step="eval", gpus=2, checkpointable=False, depends_on=[(1, 0)]),
    ]


def estimate(row) -> float:
    return EST


def _reset_postgres(url: str) -> None:
    engine = sa.create_engine(url)
    with engine.begin() as conn:
        METADATA.drop_all(conn)
        SCHEMA_VERSION_TABLE.drop(conn, checkfirst=True)
        store_mod.STORE_META.drop(conn, checkfirst=True)
    engine.dispose()


@pytest.fixture(params=["sqlite", "postgresql"])
def url(request, tmp_path) -> str:
    """Every store test on SQLite and on a real PostgreSQL server (tests/pg_server.py: a fresh
    database per test), or on ``IDLEGPU_TEST_POSTGRES_URL`` (wiped first) when set."""
    if request.param == "postgresql":
        if PG_URL:
            _reset_postgres(PG_URL)
            return PG_URL
        return request.getfixturevalue("fresh_postgres_url")
    return f"sqlite:///{tmp_path / 'idlegpu.db'}"


@pytest.fixture
def store(url):
    with JobStore(url) as s:
        yield s


def submit(store: JobStore, units=None, *, name="llama-sft", team="nlp", at=T0, **kw) -> str:
    units = pipeline() if units is None else units
    return store.submit(name, team, "pipeline", {"name": name, "steps": len(units)}, units, at,
                        **kw)


# --------------------------------------------------------------------------- submission


def test_submit_stores_request_units_and_events(store):
    rid = submit(store, deadline_units := [spec(0, 0, deadline=T0 + 24 * H)])
    assert rid.startswith("llama-sft-")
    unit_id = f"{rid}-0-0"
    row = store.unit(unit_id)
    assert row.state is JobState.QUEUED and row.request_id == rid and row.team == "nlp"
    assert (row.attempts, row.preemptions, row.work_done_s) == (0, 0, 0.0)
    assert row.spec == deadline_units[0]  # the UnitSpec round-trips, datetimes included
    assert row.submitted_at == T0 and row.family == "registry.example.com/research/sft#train"
    req = store.request(rid)
    assert req.raw == {"name": "llama-sft", "steps": 1} and req.team == "nlp"
    [event] = store.events()
    assert (event.kind, event.unit_id, event.request_id, event.gpus) == (
        EventKind.SUBMITTED, unit_id, rid, 4)


def test_unit_ids_and_dependencies_are_deterministic(store):
    rid = submit(store, request_id="req-7")
    assert rid == "req-7"
    rows = store.queue()
    assert [r.id for r in rows] == ["req-7-0-0", "req-7-0-1", "req-7-1-0", "req-7-2-0"]
    assert rows[2].depends_on == ("req-7-0-0", "req-7-0-1")
    assert rows[3].depends_on == ("req-7-1-0",)
    assert [e.kind for e in store.events()] == [EventKind.SUBMITTED] * 4
    with pytest.raises(InvalidRequestError, match="already taken"):
        submit(store, request_id="req-7")


def test_idempotent_submission(store):
    first = submit(store, idempotency_key="ci-run-1234")
    again = submit(store, idempotency_key="ci-run-1234", at=T0 + H)
    assert again == first
    other = submit(store, idempotency_key="ci-run-1235")
    assert other != first
    assert len(store.queue()) == 8 and len(store.events()) == 8


@pytest.mark.parametrize(
    "units, message",
    [
        ([], "at least one unit"),
        ([spec(0, 0), spec(0, 0)], "repeat"),
        ([spec(1, 0, depends_on=[(0, 0)])], "does not have"),
        ([spec(0, 0, depends_on=[(1, 0)]), spec(1, 0, depends_on=[(0, 0)])], "cycle"),
        ([spec(0, 0, gpus=0)], "0 GPUs"),
    ],
)
def test_inconsistent_submissions_are_refused(store, units, message):
    with pytest.raises(InvalidRequestError, match=message):
        submit(store, units)
    assert store.queue() == [] and store.events() == []


def test_times_must_be_aware(store):
    with pytest.raises(ValueError, match="timezone-aware"):
        submit(store, at=datetime(2026, 1, 1))


def test_spec_json_round_trip():
    s = spec(2, 3, deadline=datetime(2026, 2, 1, 9, tzinfo=UTC), depends_on=[(1, 0)])
    data = spec_to_json(s)
    assert data["depends_on"] == [[1, 0]] and data["deadline"] == "2026-02-01T09:00:00+00:00"
    assert spec_from_json({**data, "from_a_newer_writer": 1}) == s


# --------------------------------------------------------------------------- transitions


def test_lifecycle_accounting_by_hand(store):
    rid = submit(store, [spec(0, 0, gpus=8)])
    u = f"{rid}-0-0"
    assert store.admit(u, T0, stop_by=T0 + 8 * H, attempt_label="night 1") == 1
    assert store.unit(u).state is JobState.ADMITTED
    [running] = store.running(T0, estimate)
    assert running.started_at == T0 and running.remaining_s == EST
    assert running.stop_by == T0 + 8 * H
    store.started(u, T0 + 2 * M)
    store.checkpointed(u, T0 + 62 * M, 3600.0)
    [running] = store.running(T0 + 92 * M, estimate)
    assert running.last_checkpoint_at == T0 + 62 * M
    assert running.remaining_s == pytest.approx(EST - 3600 - 1800)
    # its spec checkpoints every 30 min: the policy expects one at 92 min, 8 minutes later
    # it would lose 8 (the store's own accounting below counts the reported checkpoint)
    assert running.checkpoint_interval_s == 1800
    assert running.unsaved_work_s(T0 + 92 * M) == 0
    assert running.unsaved_work_s(T0 + 100 * M) == 8 * 60
    assert replace(running, checkpoint_interval_s=None).unsaved_work_s(T0 + 92 * M) == 1800
    # preempted 30 minutes after the checkpoint: 8 GPUs x 92 min held, 8 x 30 min lost
    assert store.preempted(u, T0 + 92 * M, reason="traffic back") is JobState.QUEUED
    row = store.unit(u)
    assert (row.state, row.preemptions, row.work_done_s, row.current_attempt) == (
        JobState.QUEUED, 1, 3600.0, None)
    [waiting] = store.waiting(T0 + 2 * H, estimate)
    assert waiting.runtime_s == EST - 3600 and waiting.preemptions == 1
    # second attempt finishes the remaining 2 hours
    assert store.admit(u, T0 + 10 * H, attempt_label="night 2") == 2
    store.started(u, T0 + 10 * H + M)
    assert store.finished(u, T0 + 12 * H + M) == 8 * (2 * 3600 + 60)
    a1, a2 = store.attempts(u)
    assert (a1.outcome, a1.gpu_seconds, a1.lost_gpu_seconds) == (
        AttemptOutcome.PREEMPTED, 8 * 92 * 60, 8 * 30 * 60)
    assert (a1.window_label, a1.stop_by, a1.started_at) == ("night 1", T0 + 8 * H, T0 + 2 * M)
    assert (a2.outcome, a2.gpu_seconds, a2.work_done_at_start_s) == (
        AttemptOutcome.SUCCEEDED, 8 * 7260, 3600.0)
    assert store.unit(u).state is JobState.SUCCEEDED
    events = store.events(unit_id=u)
    assert [e.kind for e in events] == [
        EventKind.SUBMITTED, EventKind.ADMITTED, EventKind.STARTED, EventKind.CHECKPOINTED,
        EventKind.PREEMPTED, EventKind.ADMITTED, EventKind.STARTED, EventKind.FINISHED,
    ]
    assert events[4].gpu_seconds == 8 * 92 * 60
    assert events[4].detail["lost_gpu_seconds"] == 8 * 30 * 60
    assert events[4].detail["reason"] == "traffic back"
    assert events[7].gpu_seconds == 8 * 7260
    assert store.running(T0 + 13 * H, estimate) == [] and store.queue() == []
    assert [r.id for r in store.queue(include_terminal=True)] == [u]


def test_preempting_a_job_without_checkpoints_loses_everything(store):
    rid = submit(store, [spec(0, 0, gpus=2, checkpointable=False)])
    u = f"{rid}-0-0"
    store.admit(u, T0)
    store.started(u, T0)
    with pytest.raises(TransitionRefusedError, match="not checkpointable"):
        store.checkpointed(u, T0 + H, 100.0)
    store.preempted(u, T0 + H)
    [attempt] = store.attempts(u)
    assert attempt.gpu_seconds == attempt.lost_gpu_seconds == 2 * 3600
    [waiting] = store.waiting(T0 + H, estimate)
    assert waiting.runtime_s == EST  # starts over


def test_dependency_gating(store):
    rid = submit(store)
    a, b, train, ev = (f"{rid}-{k}" for k in ("0-0", "0-1", "1-0", "2-0"))
    assert [w.id for w in store.waiting(T0, estimate)] == [a, b]
    assert store.waiting(T0 - M, estimate) == []  # not submitted yet at that time
    with pytest.raises(TransitionRefusedError, match="waits for"):
        store.admit(train, T0)
    for u in (a, b):
        store.admit(u, T0)
        store.started(u, T0)
    store.finished(a, T0 + H)
    assert store.waiting(T0 + H, estimate) == []  # train still waits for b
    store.finished(b, T0 + 2 * H)
    [w] = store.waiting(T0 + 2 * H, estimate)
    assert (w.id, w.gpus, w.checkpointable, w.team) == (train, 8, True, "nlp")
    assert store.unit(ev).state is JobState.QUEUED


def test_failure_cancels_dependants_transitively(store):
    rid = submit(store)
    a, b, train, ev = (f"{rid}-{k}" for k in ("0-0", "0-1", "1-0", "2-0"))
    store.admit(a, T0)
    store.started(a, T0)
    cancelled = store.failed(a, T0 + H, "OOMKilled")
    assert cancelled == (train, ev)
    assert store.unit(a).state is JobState.FAILED and store.unit(a).reason == "OOMKilled"
    for u in (train, ev):
        row = store.unit(u)
        assert row.state is JobState.CANCELLED
        assert row.reason == f"dependency {a} failed: OOMKilled"
    assert store.unit(b).state is JobState.QUEUED  # a sibling is not a dependant
    failed = [e for e in store.events() if e.kind is EventKind.FAILED]
    assert failed[0].gpu_seconds == 3600 and failed[0].detail["reason"] == "OOMKilled"
    assert [e.unit_id for e in store.events() if e.kind is EventKind.CANCELLED] == [train, ev]


def test_cancel_queued_and_running_units(store):
    rid = submit(store)
    a, b, train, ev = (f"{rid}-{k}" for k in ("0-0", "0-1", "1-0", "2-0"))
    store.admit(a, T0)
    store.started(a, T0)
    result = store.cancel(rid, T0 + H)
    assert result.cancelled == (b, train, ev) and result.to_stop == (a,)
    assert store.unit(a).state is JobState.RUNNING  # still holds its GPUs until stopped
    assert [r.id for r in store.to_stop()] == [a]
    assert [j.id for j in store.running(T0 + H, estimate)] == [a]
    again = store.cancel(rid, T0 + H + M)  # idempotent
    assert again.cancelled == () and again.to_stop == (a,) and again.unchanged == (b, train, ev)
    assert store.preempted(a, T0 + H + 5 * M) is JobState.CANCELLED
    row = store.unit(a)
    assert row.state is JobState.CANCELLED and row.preemptions == 0
    assert row.cancel_requested_at == T0 + H and row.reason == "cancelled by user"
    last = store.events()[-1]
    assert (last.kind, last.unit_id, last.gpu_seconds) == (EventKind.CANCELLED, a, 65 * 60)
    assert store.attempts(a)[0].outcome is AttemptOutcome.CANCELLED
    assert store.to_stop() == [] and store.queue() == []


def test_cancel_a_unit_cancels_its_dependants_only(store):
    rid = submit(store)
    a, b, train, ev = (f"{rid}-{k}" for k in ("0-0", "0-1", "1-0", "2-0"))
    result = store.cancel(b, T0, reason="bad shard")
    assert result.cancelled == (b, train, ev)
    assert store.unit(a).state is JobState.QUEUED
    assert store.unit(ev).reason == "bad shard"
    with pytest.raises(UnknownJobError, match="no job request or unit 'nope'"):
        store.cancel("nope", T0)


def test_finishing_after_a_cancel_request_counts_as_success(store):
    rid = submit(store, [spec(0, 0)])
    u = f"{rid}-0-0"
    store.admit(u, T0)
    store.cancel(u, T0 + M)
    store.finished(u, T0 + H)
    assert store.unit(u).state is JobState.SUCCEEDED and store.to_stop() == []


# --------------------------------------------------------------------------- compare-and-set


def test_compare_and_set_refusals_write_nothing(store):
    rid = submit(store, [spec(0, 0)])
    u = f"{rid}-0-0"
    store.admit(u, T0)
    before = (store.unit(u), store.attempts(u), store.events())
    with pytest.raises(StaleStateError, match=f"cannot admit unit {u}: it is admitted, not queued"):
        store.admit(u, T0 + M)
    with pytest.raises(StaleStateError, match="not running"):
        store.checkpointed(u, T0 + M, 10.0)
    store.started(u, T0 + M)
    with pytest.raises(StaleStateError, match="not admitted"):
        store.started(u, T0 + 2 * M)
    with pytest.raises(StaleStateError):
        store.requeue_admitted(u, T0 + 2 * M)
    store.checkpointed(u, T0 + H, 3000.0)
    with pytest.raises(TransitionRefusedError, match="below"):
        store.checkpointed(u, T0 + 2 * H, 2000.0)
    store.finished(u, T0 + 2 * H)
    for call in (lambda: store.finished(u, T0 + 3 * H), lambda: store.preempted(u, T0 + 3 * H),
                 lambda: store.failed(u, T0 + 3 * H, "late"), lambda: store.admit(u, T0 + 3 * H)):
        with pytest.raises(StaleStateError, match="it is succeeded"):
            call()
    assert len(store.attempts(u)) == 1 and len(before[1]) == 1
    with pytest.raises(UnknownJobError):
        store.started("nope-0-0", T0)
    assert isinstance(StaleStateError(u, "x", [JobState.QUEUED], None), PermanentError)


def test_version_guard_refuses_a_decision_made_on_an_old_read(store):
    """The UPDATE is guarded by the row's version, not only its state: a checkpoint (state
    unchanged) between the read and the write is caught."""
    rid = submit(store, [spec(0, 0)])
    u = f"{rid}-0-0"
    store.admit(u, T0)
    store.started(u, T0)
    with store._tx(write=False) as conn:
        old = store._load(conn, u)
    store.checkpointed(u, T0 + H, 100.0)
    with pytest.raises(StaleStateError, match="another process"), store._tx(write=True) as conn:
        store._cas(conn, old, "preempt", (JobState.RUNNING,), state="queued")
    assert store.unit(u).state is JobState.RUNNING


def test_concurrent_admitters_admit_once(url):
    with JobStore(url) as setup:
        u = f"{submit(setup, [spec(0, 0)])}-0-0"
    stores = [JobStore(url), JobStore(url)]
    outcomes: list[str] = []
    barrier = threading.Barrier(8)

    def admit(i: int) -> None:
        barrier.wait()
        try:
            stores[i % 2].admit(u, T0, attempt_label=f"admitter {i}")
            outcomes.append("admitted")
        except StaleStateError:
            outcomes.append("stale")

    threads = [threading.Thread(target=admit, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(outcomes) == ["admitted"] + ["stale"] * 7
    assert len(stores[0].attempts(u)) == 1
    assert [e.kind for e in stores[1].events()].count(EventKind.ADMITTED) == 1
    for s in stores:
        s.close()


# --------------------------------------------------------------------------- crash safety


@pytest.mark.parametrize("reconcile", ["started", "requeue"])
def test_crash_between_admit_and_start_neither_loses_nor_duplicates(url, reconcile):
    daemon = JobStore(url)
    rid = submit(daemon, [spec(0, 0, gpus=8)])
    u = f"{rid}-0-0"
    assert daemon.admit(u, T0, stop_by=T0 + 6 * H, attempt_label="night") == 1
    daemon.close()  # the daemon dies before it creates the Kubernetes Job / calls started

    with JobStore(url) as after:
        row = after.unit(u)
        assert row.state is JobState.ADMITTED and row.attempts == 1
        [attempt] = after.attempts(u)
        assert attempt.open and attempt.admitted_at == T0
        assert [r.id for r in after.queue()] == [u]
        assert after.waiting(T0 + M, estimate) == []  # not offered for admission again
        assert [j.id for j in after.running(T0 + M, estimate)] == [u]
        with pytest.raises(StaleStateError):  # a retried admit of the same decision
            after.admit(u, T0 + M, stop_by=T0 + 6 * H, attempt_label="night")
        assert len(after.attempts(u)) == 1
        assert [e.kind for e in after.events()].count(EventKind.ADMITTED) == 1

        # the reconciler looks at Kubernetes: the Job exists (started) or not (requeue)
        if reconcile == "started":
            after.started(u, T0 + 5 * M)
            assert after.unit(u).state is JobState.RUNNING
        else:
            assert after.requeue_admitted(u, T0 + 5 * M) is JobState.QUEUED
            row = after.unit(u)
            assert row.state is JobState.QUEUED and row.preemptions == 0
            [attempt] = after.attempts(u)
            assert attempt.outcome is AttemptOutcome.REQUEUED
            assert attempt.gpu_seconds == 8 * 300
            [w] = after.waiting(T0 + 5 * M, estimate)
            assert w.id == u
            assert after.admit(u, T0 + 10 * M) == 2


def test_a_failed_transition_leaves_nothing_behind(store, monkeypatch):
    """The event insert fails after the state UPDATE: the transaction rolls back whole."""
    rid = submit(store, [spec(0, 0)])
    u = f"{rid}-0-0"

    def boom(*args, **kwargs):
        raise RuntimeError("crash in the middle of admit")

    monkeypatch.setattr(JobStore, "_event", staticmethod(boom))
    with pytest.raises(RuntimeError):
        store.admit(u, T0)
    monkeypatch.undo()
    assert store.unit(u).state is JobState.QUEUED and store.unit(u).attempts == 0
    assert store.attempts(u) == []
    assert store.admit(u, T0) == 1


# --------------------------------------------------------------------------- schema


def test_schema_is_versioned(url):
    with JobStore(url) as s:
        assert s.schema_version() == SCHEMA_VERSION
        submit(s, [spec(0, 0)])
    with JobStore(url) as s:  # reopening applies nothing twice
        assert s.schema_version() == SCHEMA_VERSION and len(s.queue()) == 1


def test_each_store_has_its_own_lasting_id(url, tmp_path):
    with JobStore(url) as s:
        first = s.store_id()
    with JobStore(url) as s:  # reopening keeps it
        assert s.store_id() == first
    with JobStore(f"sqlite:///{tmp_path / 'other.db'}") as other:
        assert other.store_id() != first
    assert len(first) == 8 and int(first, 16) >= 0


def test_a_newer_database_is_refused(url):
    JobStore(url).close()
    engine = sa.create_engine(url)
    with engine.begin() as conn:
        conn.execute(sa.insert(SCHEMA_VERSION_TABLE).values(version=SCHEMA_VERSION + 1,
                                                            name="from the future"))
    engine.dispose()
    with pytest.raises(SchemaVersionError, match=f"schema version {SCHEMA_VERSION + 1}, newer"):
        JobStore(url)


def test_migrations_upgrade_in_order_and_roll_back_on_failure(url, monkeypatch):
    with JobStore(url) as s:
        rid = submit(s, [spec(0, 0)])

    def add_note(conn):
        conn.execute(sa.text("ALTER TABLE units ADD COLUMN note TEXT"))

    def broken(conn):
        conn.execute(sa.text("CREATE TABLE half_done (id INTEGER)"))
        raise sa.exc.ProgrammingError("ALTER", {}, Exception("syntax error"))

    monkeypatch.setattr(store_mod, "MIGRATIONS",
                        [*store_mod.MIGRATIONS, ("unit notes", add_note), ("broken", broken)])
    with pytest.raises(StoreError, match=rf"schema version {SCHEMA_VERSION + 2} \(broken\)"):
        JobStore(url)
    engine = sa.create_engine(url)
    inspector = sa.inspect(engine)
    assert "half_done" not in inspector.get_table_names()  # all pending migrations rolled back
    assert "note" not in {c["name"] for c in inspector.get_columns("units")}
    engine.dispose()
    monkeypatch.setattr(store_mod, "MIGRATIONS", store_mod.MIGRATIONS[:-1])
    with JobStore(url) as s:
        assert s.schema_version() == SCHEMA_VERSION + 1
        assert s.unit(f"{rid}-0-0").state is JobState.QUEUED


def test_sqlite_is_opened_in_wal_mode_with_foreign_keys(tmp_path):
    url = f"sqlite:///{tmp_path / 'wal.db'}"
    with JobStore(url) as s, s._engine.connect() as conn:
        assert conn.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
        assert conn.exec_driver_sql("PRAGMA foreign_keys").scalar() == 1
        assert conn.exec_driver_sql("PRAGMA busy_timeout").scalar() == 30000


def test_store_errors_are_one_line_and_classified(tmp_path):
    with pytest.raises(StoreError, match="does not exist"):
        JobStore(f"sqlite:///{tmp_path / 'missing' / 'x.db'}")
    with pytest.raises(StoreError, match="invalid store URL"):
        JobStore("not a url")
    with pytest.raises(StoreError, match="driver"):
        JobStore("postgresql+nosuchdriver://u@localhost/db")
    (tmp_path / "junk.db").write_bytes(b"this is not a database" * 100)
    with pytest.raises(StoreError, match="not a database"):
        JobStore(f"sqlite:///{tmp_path / 'junk.db'}")


def test_a_locked_database_is_a_temporary_error(tmp_path):
    url = f"sqlite:///{tmp_path / 'locked.db'}"
    with JobStore(url) as first, JobStore(url, busy_timeout_s=0.1) as second:
        rid = submit(first, [spec(0, 0)])
        with first._tx(write=True), pytest.raises(TemporaryError, match="unavailable"):
            second.admit(f"{rid}-0-0", T0)  # the first store holds the write lock
        assert second.admit(f"{rid}-0-0", T0) == 1


def test_schema_and_queries_compile_for_postgresql():
    from sqlalchemy.dialects import postgresql

    dialect = postgresql.dialect()
    ddl = [str(sa.schema.CreateTable(t).compile(dialect=dialect))
           for t in METADATA.sorted_tables]
    assert any("BIGSERIAL" in d for d in ddl) and any("JSON" in d for d in ddl)
    with JobStore("sqlite://") as s:
        query = s._unit_query([store_mod.UNITS.c.state == "queued"])
    assert "LEFT OUTER JOIN attempts" in str(query.compile(dialect=dialect))


# --------------------------------------------------------------------------- fair share


def test_team_gpu_hours_clip_attempts_to_the_window(store):
    r1 = submit(store, [spec(0, 0, gpus=8), spec(0, 1, gpus=2)], team="nlp")
    r2 = submit(store, [spec(0, 0, gpus=4)], team="vision", name="vit")
    store.admit(f"{r1}-0-0", T0 - 10 * H)  # 8 GPUs, 10 h before T0 ... 2 h before T0
    store.finished(f"{r1}-0-0", T0 - 2 * H)
    store.admit(f"{r1}-0-1", T0 - H)  # 2 GPUs, still running
    store.admit(f"{r2}-0-0", T0 - 30 * H)  # 4 GPUs, ended before the window
    store.preempted(f"{r2}-0-0", T0 - 29 * H)
    hours = store.team_gpu_hours(T0, window_s=4 * 3600)  # window: T0-4h .. T0
    assert hours == pytest.approx({"nlp": 8 * 2 + 2 * 1})
    assert store.team_gpu_hours(T0, window_s=48 * 3600) == pytest.approx(
        {"nlp": 8 * 8 + 2 * 1, "vision": 4 * 1})


def test_events_between_times(store):
    rid = submit(store, [spec(0, 0)])
    u = f"{rid}-0-0"
    store.admit(u, T0 + H)
    store.started(u, T0 + 2 * H)
    assert [e.kind for e in store.events(since=T0 + H, until=T0 + 2 * H)] == [EventKind.ADMITTED]
    assert [e.kind for e in store.events(since=T0 + H)] == [EventKind.ADMITTED, EventKind.STARTED]
    assert [e.kind for e in store.events(until=T0 + H)] == [EventKind.SUBMITTED]


# --------------------------------------------------------------------------- state machine


class StoreMachine(RuleBasedStateMachine):
    """Random sequences of transitions, valid or not, against a model of the rules."""

    KEYS = ("0-0", "0-1", "1-0", "2-0")

    def __init__(self) -> None:
        super().__init__()
        self.store = JobStore("sqlite://")
        self.now = T0
        self.rid = submit(self.store)
        self.ids = {k: f"{self.rid}-{k}" for k in self.KEYS}
        self.state = {k: JobState.QUEUED for k in self.KEYS}
        self.cancel_requested: set[str] = set()
        self.work = {k: 0.0 for k in self.KEYS}
        self.deps = {"0-0": (), "0-1": (), "1-0": ("0-0", "0-1"), "2-0": ("1-0",)}
        self.checkpointable = {"0-0": False, "0-1": False, "1-0": True, "2-0": False}

    def teardown(self) -> None:
        self.store.close()

    def dependants(self, key: str) -> list[str]:
        out = [k for k, deps in self.deps.items() if key in deps]
        for k in list(out):
            out += [d for d in self.dependants(k) if d not in out]
        return out

    def cancel_model(self, keys: list[str]) -> None:
        for k in keys:
            if self.state[k] is JobState.QUEUED:
                self.state[k] = JobState.CANCELLED
            elif self.state[k].holds_gpus():
                self.cancel_requested.add(k)

    def expect(self, ok: bool, call) -> object:
        if ok:
            return call()
        with pytest.raises(TransitionRefusedError):
            call()
        return None

    keys = st.sampled_from(KEYS)

    @rule(minutes=st.integers(0, 240))
    def tick(self, minutes):
        self.now += timedelta(minutes=minutes)

    @rule(k=keys)
    def admit(self, k):
        ok = self.state[k] is JobState.QUEUED and all(
            self.state[d] is JobState.SUCCEEDED for d in self.deps[k])
        if self.expect(ok, lambda: self.store.admit(self.ids[k], self.now)) is not None:
            self.state[k] = JobState.ADMITTED

    @rule(k=keys)
    def start(self, k):
        ok = self.state[k] is JobState.ADMITTED
        self.expect(ok, lambda: self.store.started(self.ids[k], self.now))
        if ok:
            self.state[k] = JobState.RUNNING

    @rule(k=keys, progress=st.integers(0, 3600))
    def checkpoint(self, k, progress):
        ok = self.state[k] is JobState.RUNNING and self.checkpointable[k]
        work = self.work[k] + progress
        self.expect(ok, lambda: self.store.checkpointed(self.ids[k], self.now, work))
        if ok:
            self.work[k] = work

    def _release(self, k: str) -> None:
        if k in self.cancel_requested:
            self.state[k] = JobState.CANCELLED
        else:
            self.state[k] = JobState.QUEUED
            if not self.checkpointable[k]:
                self.work[k] = 0.0

    @rule(k=keys)
    def preempt(self, k):
        ok = self.state[k].holds_gpus()
        self.expect(ok, lambda: self.store.preempted(self.ids[k], self.now))
        if ok:
            self._release(k)

    @rule(k=keys)
    def requeue(self, k):
        ok = self.state[k] is JobState.ADMITTED
        self.expect(ok, lambda: self.store.requeue_admitted(self.ids[k], self.now))
        if ok:
            self._release(k)

    @rule(k=keys)
    def finish(self, k):
        ok = self.state[k].holds_gpus()
        self.expect(ok, lambda: self.store.finished(self.ids[k], self.now))
        if ok:
            self.state[k] = JobState.SUCCEEDED

    @rule(k=keys)
    def fail(self, k):
        ok = not self.state[k].is_terminal()
        self.expect(ok, lambda: self.store.failed(self.ids[k], self.now, "boom"))
        if ok:
            self.state[k] = JobState.FAILED
            self.cancel_model(self.dependants(k))

    @rule(k=st.sampled_from((*KEYS, "request")))
    def cancel(self, k):
        target = self.rid if k == "request" else self.ids[k]
        self.store.cancel(target, self.now)
        self.cancel_model(list(self.KEYS) if k == "request" else [k, *self.dependants(k)])

    @invariant()
    def one_state_per_unit_and_consistent_attempts(self):
        rows = {r.id: r for r in self.store.queue(include_terminal=True)}
        assert len(rows) == len(self.KEYS)
        total_attempt_s = 0.0
        for k, uid in self.ids.items():
            row = rows[uid]
            assert row.state is self.state[k], (k, row.state, self.state[k])
            assert row.work_done_s == self.work[k]
            attempts = self.store.attempts(uid)
            open_ = [a for a in attempts if a.open]
            assert len(attempts) == row.attempts
            if row.state.holds_gpus():
                assert len(open_) == 1 and row.current_attempt == open_[0].id
            else:  # queued or terminal: no GPUs held
                assert open_ == [] and row.current_attempt is None
            for a, b in itertools.pairwise(attempts):
                assert a.ended_at is not None and a.ended_at <= b.admitted_at
            for a in attempts:
                if a.ended_at is not None:
                    assert a.gpu_seconds == a.gpus * (a.ended_at - a.admitted_at).total_seconds()
                    assert 0 <= a.lost_gpu_seconds <= a.gpu_seconds if a.lost_gpu_seconds else 1
                    total_attempt_s += a.gpu_seconds
        waiting = {w.id for w in self.store.waiting(self.now, estimate)}
        running = {j.id for j in self.store.running(self.now, estimate)}
        assert not waiting & running
        assert running == {self.ids[k] for k, s in self.state.items() if s.holds_gpus()}
        assert waiting <= {self.ids[k] for k, s in self.state.items() if s is JobState.QUEUED}
        logged = sum(e.gpu_seconds or 0.0 for e in self.store.events()
                     if e.kind in (EventKind.PREEMPTED, EventKind.FINISHED, EventKind.FAILED,
                                   EventKind.CANCELLED))
        assert logged == pytest.approx(total_attempt_s)


StoreMachine.TestCase.settings = settings(
    max_examples=40, stateful_step_count=25, deadline=None, database=None,
    suppress_health_check=[HealthCheck.too_slow],
)
test_store_state_machine = StoreMachine.TestCase


# --------------------------------------------------------------------------- overruns


def test_a_unit_past_its_estimate_has_work_left_from_the_overruns(store):
    from idlegpu.scheduler.types import Overruns

    rid = submit(store, [spec(0, m, gpus=2, checkpointable=False) for m in range(7)])
    # six finished units ran twice their 3 h estimate: 2 h admitted, then 6 h
    for m in range(6):
        u = f"{rid}-0-{m}"
        store.admit(u, T0)
        store.started(u, T0 + 10 * M)
        store.finished(u, T0 + 10 * M + 2 * EST * timedelta(seconds=1))
    runs = store.finished_runs()
    assert len(runs) == 6 and all(work == pytest.approx(2 * EST) for _, work in runs)
    overruns = store.overruns(estimate)
    assert overruns.ratios == pytest.approx((2.0,) * 6)
    last = f"{rid}-0-6"
    store.admit(last, T0)
    store.started(last, T0)
    # 4 h into a 3 h estimate: those that ran past 4/3 of theirs ran 2x, so 2 h are left
    [running] = store.running(T0 + 4 * H, estimate, overruns)
    assert running.remaining_s == pytest.approx(2 * 3600)
    # nothing learnt: as long again as its overrun so far (1 h), at least a quarter (45 min)
    [alone] = store.running(T0 + 4 * H, estimate)
    assert alone.remaining_s == pytest.approx(3600)
    [early] = store.running(T0 + 3 * H + 10 * M, estimate, Overruns())
    assert early.remaining_s == pytest.approx(EST / 4)


def test_a_checkpointed_unit_past_its_estimate_waits_with_work_left(store):
    rid = submit(store, [spec(0, 0, gpus=4)])
    u = f"{rid}-0-0"
    store.admit(u, T0)
    store.started(u, T0)
    store.checkpointed(u, T0 + 4 * H, 4 * 3600.0)
    store.preempted(u, T0 + 4 * H + 5 * M, lost_gpu_seconds=0.0)
    [waiting] = store.waiting(T0 + 5 * H, estimate)
    assert waiting.runtime_s == pytest.approx(3600)  # not 0: it has overrun 1 h so far
