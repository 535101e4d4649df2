"""Pausing admission for the pool and the daemon's status (store schema version 5): the v4 to
v5 migration on SQLite and a REAL PostgreSQL, pause/resume audited and idempotent, the API's
rules on a REAL uvicorn server (the sample pool replayed at Wed 2026-01-28 17:00 in Seoul,
tests/console_browser.py's app), a controller pass on tests/test_controller.py's in-memory
cluster that admits nothing while paused but still stops what the backstop must stop, the
daemon writing its status and `GET /v1/daemon` reading it, and `idlegpu admission` locally and
with `--server`."""

# ruff: noqa: F811 - the fixture imported from test_controller is the tests' parameter

from __future__ import annotations

import logging
import re
from collections.abc import Iterator
from datetime import timedelta

import pytest
import requests
import sqlalchemy as sa
from api_server import ApiServer, MovableClock, api_settings, job
from console_browser import Console, make_console
from test_api_plan import NOW, token
from test_cli_remote import run as run_cli
from test_controller import T0, setup  # noqa: F401 - the fixture
from test_controller import states as unit_states

import idlegpu.scheduler.adapters.store as store_mod
from idlegpu.scheduler.adapters.store import AuditEntry, JobStore
from idlegpu.scheduler.server import create_server
from idlegpu.scheduler.daemon import Daemon
from idlegpu.scheduler.ports import JobPhase
from idlegpu.scheduler.specs import expand_units, validate_request
from idlegpu.scheduler.types import JobState, ServingSignals

V5_TABLES = {"admission_control", "daemon_status", "ended_sessions"}


def entry(actor: str = "olga", action: str = "admission.pause") -> AuditEntry:
    return AuditEntry(at=NOW, actor=actor, auth="token", role="operator", team="platform",
                      action=action, target="pool", address="127.0.0.1")


def run(capsys, *argv: str) -> tuple[int, str, str]:
    """``idlegpu argv``: its exit code, and its output with the lines' wrapping undone."""
    code, out, err = run_cli(capsys, *argv)
    return code, " ".join(out.split()), " ".join(err.split())


# --------------------------------------------------------------------------- the store


@pytest.fixture(params=["sqlite", "postgresql"])
def url(request, tmp_path):
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'jobs.db'}"
    return request.getfixturevalue("fresh_postgres_url")


def tables(url: str) -> dict[str, set[str]]:
    engine = sa.create_engine(url)
    inspector = sa.inspect(engine)
    found = {t: {c["name"] for c in inspector.get_columns(t)}
             for t in inspector.get_table_names()}
    engine.dispose()
    return found


def test_a_v4_store_migrates_to_v5_with_its_data_and_tables_untouched(url, monkeypatch):
    monkeypatch.setattr(store_mod, "MIGRATIONS", store_mod.MIGRATIONS[:4])
    with JobStore(url) as old:
        assert old.schema_version() == 4
        request = validate_request(job("old-job"), api_settings().admission)
        rid = old.submit(request.name, request.team, request.kind, {}, expand_units(request),
                         NOW)
        old.record_audit(entry(action="submit"))
    before = tables(url)
    monkeypatch.undo()
    with JobStore(url) as new:
        assert new.schema_version() == store_mod.SCHEMA_VERSION == 8
        assert [u.state for u in new.request_units(rid)] == [JobState.QUEUED] * 4
        assert [e.action for e in new.audit_log()] == ["submit"]
        state = new.admission()
        assert not state.paused and state.since is None and state.by is None
        assert new.daemon_statuses() == [] and not new.session_ended("nobody")
    after = tables(url)
    assert set(after) - set(before) == V5_TABLES | {  # v5, v7 and v8
        "workload_reports", "external_units", "external_holds"}
    # v6 adds one column to one table; every other table is as it was
    assert after["api_submissions"] - before["api_submissions"] == {"stored_bytes"}
    before["api_submissions"].add("stored_bytes")
    assert {t: after[t] for t in before} == before


def test_a_v5_store_measures_its_api_requests_once_when_it_migrates_to_v6(url, monkeypatch):
    monkeypatch.setattr(store_mod, "MIGRATIONS", store_mod.MIGRATIONS[:5])
    request = validate_request(job("old-job"), api_settings().admission)
    units, raw = expand_units(request), request.model_dump(mode="json")
    with JobStore(url) as old:
        assert old.schema_version() == 5
        with old._tx(write=True) as conn:  # a submission as v5 stored it: no stored_bytes
            old._insert_request(conn, "old-1", request.name, request.team, request.kind,
                                raw, units, NOW, None)
            conn.execute(sa.text("INSERT INTO api_submissions (request_id, principal, "
                                 "body_sha256) VALUES ('old-1', 'token:mallory', 'x')"))
    monkeypatch.undo()
    with JobStore(url) as new:
        assert new.schema_version() == 8
        measured = new.quota_use("token:mallory", NOW)
        assert measured["live_units"] == 4
        # what the migration measured is what the store holds (the database's own text of it)
        with new._tx(write=False) as conn:
            held = conn.execute(sa.text(
                "SELECT (SELECT SUM(LENGTH(CAST(spec AS TEXT))) FROM units WHERE request_id = "
                "'old-1') + (SELECT LENGTH(CAST(raw AS TEXT)) FROM requests WHERE id = 'old-1')"
            )).scalar()
        assert measured["stored_bytes"] == held > 1000


def test_pause_and_resume_are_audited_and_idempotent(url):
    with JobStore(url) as store:
        first = store.pause_admission(NOW, "  node\nupgrade  ", entry("olga"))
        assert first.changed and first.state.paused
        assert (first.state.by, first.state.since, first.state.reason) == (
            "olga", NOW, "node upgrade")  # one line
        later = NOW + timedelta(minutes=5)
        again = store.pause_admission(later, "another reason", entry("oscar"))
        assert not again.changed  # the first pause stands
        assert (again.state.by, again.state.since, again.state.reason) == (
            "olga", NOW, "node upgrade")
        assert store.admission() == again.state
        resumed = store.resume_admission(later, entry("oscar", "admission.resume"))
        assert resumed.changed and not resumed.state.paused
        assert (resumed.state.changed_by, resumed.state.changed_at) == ("oscar", later)
        assert not store.resume_admission(later, entry("oscar", "admission.resume")).changed
        log = store.audit_log()
        assert [(e.action, e.actor, e.detail["changed"]) for e in log] == [
            ("admission.pause", "olga", True), ("admission.pause", "oscar", False),
            ("admission.resume", "oscar", True), ("admission.resume", "oscar", False)]
        assert log[1].detail["paused_by"] == "olga"  # who held the pause the second one met
        assert [e.actor for e in store.audit_log(actor="oscar", limit=2, offset=1)] == [
            "oscar", "oscar"]  # the newest skipped, the two before it
        with pytest.raises(store_mod.InvalidRequestError, match="needs a reason"):
            store.pause_admission(NOW, " \n ", entry())
        with pytest.raises(store_mod.InvalidRequestError, match="over the limit of 500"):
            store.pause_admission(NOW, "x" * 501, entry())
        assert not store.admission().paused and len(store.audit_log()) == 4


def test_replica_statuses_and_ended_sessions(url):
    from idlegpu.scheduler.adapters.store import DaemonStatus

    with JobStore(url) as store:
        for minute in (0, 1):  # inserted, then updated in place
            store.record_daemon_status(DaemonStatus(
                identity="pod-a", host="node-1", pid=7, role="leader",
                updated_at=NOW + timedelta(minutes=minute), last_reconcile_at=NOW,
                admitted=minute, signals_age_s=None))
        store.record_daemon_status(DaemonStatus(identity="pod-b", host="node-2", pid=8,
                                                role="standby", updated_at=NOW))
        assert [(s.identity, s.admitted) for s in store.daemon_statuses()] == [
            ("pod-a", 1), ("pod-b", 0)]  # the most recent report first
        # a replica silent for a day is forgotten at the next write
        store.record_daemon_status(DaemonStatus(identity="pod-a", host="node-1", pid=7,
                                                role="leader",
                                                updated_at=NOW + timedelta(days=1, hours=1)))
        assert [s.identity for s in store.daemon_statuses()] == ["pod-a"]
        store.end_session("s1", NOW + timedelta(hours=8), NOW)
        store.end_session("s1", NOW + timedelta(hours=8), NOW)  # twice: no error
        assert store.session_ended("s1") and not store.session_ended("s2")
        store.end_session("s2", NOW + timedelta(days=1), NOW + timedelta(hours=9))
        assert not store.session_ended("s1")  # expired anyway: forgotten
        assert store.session_ended("s2")


# --------------------------------------------------------------------------- the API


@pytest.fixture(scope="module")
def pool(tmp_path_factory) -> Iterator[Console]:
    """tests/console_browser.py's app (the sample pool at Wed 17:00, four queued requests),
    with a second operator."""
    console, server = make_console(tmp_path_factory.mktemp("admission"))
    console.tokens["oscar"] = token(console.store, "oscar", "platform", "operator")
    yield console
    server.stop()
    console.store.close()


def call(pool: Console, user: str, method: str, route: str, **kwargs) -> requests.Response:
    return requests.request(method, f"{pool.url}/v1/{route}", timeout=60,
                            headers={"Authorization": f"Bearer {pool.tokens[user]}"}, **kwargs)


def test_only_operators_pause_and_resume_and_everyone_reads_the_state(pool):
    for user in ("alice", "victor"):
        refused = call(pool, user, "POST", "admission/pause", json={"reason": "mine"})
        assert refused.status_code == 403
        role = "member" if user == "alice" else "viewer"
        assert refused.json()["error"]["message"] == (
            f"role {role} may not pause admission: operators only")
        assert call(pool, user, "POST", "admission/resume").status_code == 403
        state = call(pool, user, "GET", "admission")
        assert state.status_code == 200 and state.json()["paused"] is False
    assert requests.get(f"{pool.url}/v1/admission", timeout=30).status_code == 401
    for body, problem in (({}, "needs a reason"), ({"reason": "  "}, "needs a reason"),
                          ({"reason": "x" * 501}, "over the limit of 500"),
                          ({"reason": 5}, "use a string")):
        bad = call(pool, "olga", "POST", "admission/pause", json=body)
        assert bad.status_code == 422 and problem in bad.json()["error"]["message"], body
        assert bad.json()["error"]["field"] == "reason"
    assert not pool.store.admission().paused and not pool.store.audit_log(
        action="admission.pause")


def test_a_pause_is_audited_idempotent_and_every_waiting_unit_says_so(pool):
    before = call(pool, "alice", "GET", "plan").json()
    planned = {u["id"] for u in before["units"] if u["state"] == "planned"}
    assert pool.units["fits-tonight"] in planned
    paused = call(pool, "olga", "POST", "admission/pause", json={"reason": "node upgrade"})
    assert paused.status_code == 200, paused.text
    answer = paused.json()
    assert answer["changed"] and answer["paused"] and answer["by"] == "olga"
    assert answer["since"] == NOW.isoformat()
    text = "admission is paused by olga since Wed 28 Jan 17:00 KST: node upgrade"
    assert answer["text"] == text
    try:
        again = call(pool, "oscar", "POST", "admission/pause", json={"reason": "other"}).json()
        assert not again["changed"] and again["by"] == "olga" and again["reason"] == "node upgrade"
        assert "already paused by olga" in again["message"]
        # the plan: nothing starts, every queued unit waits with who paused it and why
        plan = call(pool, "alice", "GET", "plan").json()
        queued = {u["id"]: u for u in plan["units"]}
        assert set(pool.units.values()) <= set(queued)
        assert all(u["state"] == "waiting" and u["start_at"] is None and u["reason"] == text
                   for u in queued.values()), queued
        assert plan["starting"] == 0 and plan["waiting"] == len(queued)
        unit = call(pool, "alice", "GET", f"units/{pool.units['fits-tonight']}").json()
        assert unit["plan"]["reason"] == text
        audit = call(pool, "olga", "GET", "audit",
                     params={"action": "admission.pause", "actor": "olga"}).json()["entries"]
        assert [(e["actor"], e["role"], e["target"], e["detail"]["reason"]) for e in audit] == [
            ("olga", "operator", "pool", "node upgrade")]
    finally:
        resumed = call(pool, "oscar", "POST", "admission/resume").json()
    assert resumed["changed"] and not resumed["paused"] and resumed["text"] == "admission is open"
    after = call(pool, "alice", "GET", "plan").json()
    assert {u["id"] for u in after["units"] if u["state"] == "planned"} == planned
    actions = [(e.action, e.actor) for e in pool.store.audit_log(since=NOW)
               if e.action.startswith("admission.")]
    assert actions == [("admission.pause", "olga"), ("admission.pause", "oscar"),
                       ("admission.resume", "oscar")]


def test_idlegpu_admission_locally_and_through_the_api(pool, tmp_path, capsys, monkeypatch):
    store = f"sqlite:///{tmp_path / 'local.db'}"
    code, out, err = run(capsys, "admission", "pause", "--reason", "storage migration",
                         "--store", store)
    assert code == 0, err
    assert out.startswith("admission is paused by cli:") and ": storage migration" in out
    assert "the daemon admits no unit from its next reconcile pass" in out
    code, out, _ = run(capsys, "admission", "status", "--store", store)
    assert code == 0 and ": storage migration" in out
    code, out, _ = run(capsys, "admission", "resume", "--store", store)
    assert code == 0 and out.startswith("admission is open")
    code, _, err = run(capsys, "admission", "pause", "--reason", " ", "--store", store)
    assert code == 2 and err.endswith("error: reason: a pause needs a reason (who reads the "
                                      "queue sees it), e.g. 'node upgrade'")
    with JobStore(store) as local:
        assert [e.action for e in local.audit_log()] == ["admission.pause", "admission.resume"]
        assert local.audit_log()[0].auth == "cli"
    # through the API: the server's operators only, audited there as the token's user
    monkeypatch.setenv("IDLEGPU_TOKEN", pool.tokens["alice"])
    code, _, err = run(capsys, "admission", "pause", "--reason", "x", "--server", pool.url)
    assert code == 2 and "role member may not pause admission: operators only" in err
    code, out, _ = run(capsys, "admission", "status", "--server", pool.url)
    assert code == 0 and out.startswith("admission is open")
    monkeypatch.setenv("IDLEGPU_TOKEN", pool.tokens["olga"])
    try:
        code, out, err = run(capsys, "admission", "pause", "--reason", "[red]rack 3[/]",
                             "--server", pool.url)
        assert code == 0, err
        assert ("admission is paused by olga since Wed 28 Jan 17:00 KST: [red]rack 3[/] "
                f"({pool.url})") in out  # the reason as written, never markup
        code, out, _ = run(capsys, "admission", "pause", "--reason", "again", "--server",
                           pool.url)
        assert code == 0 and "already paused by olga" in out and "[red]rack 3[/]" in out
        assert pool.store.admission().reason == "[red]rack 3[/]"
    finally:
        code, out, _ = run(capsys, "admission", "resume", "--server", pool.url)
    assert code == 0 and out.startswith("admission is open")
    assert not pool.store.admission().paused


# --------------------------------------------------------------------------- the daemon


def test_a_paused_pass_admits_nothing_but_stops_go_on(setup, caplog):
    store, cluster, signals, controller, _ = setup
    caplog.set_level(logging.INFO, logger="idlegpu.controller")
    store.pause_admission(T0, "node upgrade", entry())
    for minute in range(3):  # logged once, not every pass
        report = controller.reconcile_once(T0 + timedelta(minutes=minute))
        assert not report.created and not cluster.jobs
    assert unit_states(store) == ["queued", "queued"]
    lines = [r.getMessage() for r in caplog.records if "admission paused" in r.getMessage()]
    assert lines == [f"admission paused by olga since {T0.isoformat()}: node upgrade"]
    store.resume_admission(T0, entry(action="admission.resume"))
    signals.value = ServingSignals(observed_at=T0 + timedelta(minutes=3))
    report = controller.reconcile_once(T0 + timedelta(minutes=3))
    assert len(report.created) == 2
    assert any(r.getMessage() == "admission resumed by olga" for r in caplog.records)
    for name in cluster.created:
        cluster.set_phase(name, JobPhase.RUNNING, T0 + timedelta(minutes=3))
    signals.value = ServingSignals(observed_at=T0 + timedelta(minutes=4))
    controller.reconcile_once(T0 + timedelta(minutes=4))
    assert unit_states(store) == ["running", "running"]
    # paused again: the services need 4 GPUs back, the backstop stops one job all the same
    store.pause_admission(T0 + timedelta(minutes=5), "node upgrade", entry())
    signals.value = ServingSignals(observed_at=T0 + timedelta(minutes=5), gpus_short=4)
    report = controller.backstop_once(T0 + timedelta(minutes=5))
    assert len(report.stopped) == 1
    # the reconcile pass still records the stop, but readmits nothing, pressure gone or not
    signals.value = ServingSignals(observed_at=T0 + timedelta(minutes=6))
    report = controller.reconcile_once(T0 + timedelta(minutes=6))
    assert len(report.released) == 1 and not report.created
    assert unit_states(store) == ["queued", "running"]
    assert len(cluster.created) == 2


def test_the_daemon_writes_its_status_and_the_api_reads_it(setup, caplog):
    store, cluster, _, controller, _ = setup
    clock = {"now": T0}
    daemon = Daemon(controller, reconcile_seconds=60, backstop_seconds=15,
                    clock=lambda: clock["now"], identity="idlegpu-daemon-0")
    daemon.forecast_made = T0 - timedelta(minutes=30)
    daemon.reconcile()
    (status,) = store.daemon_statuses()
    assert (status.last_pass, status.admitted, status.stopped) == ("reconcile", 2, 0)
    clock["now"] = T0 + timedelta(seconds=15)
    daemon.backstop()
    (status,) = store.daemon_statuses()
    assert (status.identity, status.role, status.last_pass) == ("idlegpu-daemon-0", "single",
                                                                "backstop")
    assert status.last_reconcile_at == T0 and status.last_backstop_at == clock["now"]
    assert (status.admitted, status.stopped, status.errors) == (0, 0, 0)  # the backstop's
    assert status.forecast_made_at == T0 - timedelta(minutes=30)
    assert status.signals_age_s == 15.0  # the scripted signals were read at T0
    api_clock = MovableClock(T0 + timedelta(minutes=1))
    api = ApiServer(create_server(api_settings(), store, clock=api_clock)).start()
    tokens = {user: token(store, user, "platform", role)
              for user, role in (("olga", "operator"), ("mia", "member"), ("vic", "viewer"))}
    try:
        def read(user: str) -> requests.Response:
            return requests.get(f"{api.url}/v1/daemon", timeout=30,
                                headers={"Authorization": f"Bearer {tokens[user]}"})

        answer = read("mia").json()
        assert answer["leader"] == "idlegpu-daemon-0" and answer["healthy"]
        (replica,) = answer["replicas"]
        assert replica["last_reconcile_age_s"] == 60.0 and replica["last_backstop_age_s"] == 45.0
        assert replica["forecast_age_s"] == 1860.0 and replica["stale_after_s"] == 180
        assert answer["store"]["schema_version"] == 8 and answer["store"]["answers"]
        assert answer["store"]["location"] is None  # where the store is: operators only
        assert read("olga").json()["store"]["location"] == store.location
        assert answer["admission"]["paused"] is False
        refused = read("vic")
        assert refused.status_code == 403 and refused.json()["error"]["message"] == (
            "role viewer may not read the daemon's status: operators and members only")
        api_clock.advance(minutes=3)  # over three reconcile periods since the last pass
        late = read("olga").json()
        assert not late["healthy"] and not late["replicas"][0]["healthy"]
    finally:
        api.stop()
    # the status cannot be written: logged, and the pass stands
    def broken(status):
        raise store_mod.StoreUnavailableError("job store unavailable: disk I/O error")

    store.record_daemon_status = broken
    clock["now"] = T0 + timedelta(minutes=1)
    report = daemon.reconcile()
    assert report is not None and daemon.last_pass == clock["now"]
    assert len(cluster.created) == 2
    assert any("could not write this replica's status" in r.getMessage()
               for r in caplog.records)


def test_a_paused_run_once_admits_nothing_and_says_why(tmp_path, capsys):
    from test_api_plan import CONFIG, HISTORY

    store = f"sqlite:///{tmp_path / 'once.db'}"
    request = str(CONFIG.parent / "examples/jobs/pretrain.yaml")
    code, _, err = run(capsys, "submit", request, "--store", store, "-c", str(CONFIG),
                       "--now", "2026-01-28T17:00:00+09:00")
    assert code == 0, err
    run(capsys, "admission", "pause", "--reason", "rack 3 maintenance", "--store", store)
    code, out, err = run(capsys, "run", "--once", "--dry-run", "--now",
                         "2026-01-28T20:00:00+09:00", "--history", str(HISTORY), "--store",
                         store, "-c", str(CONFIG))
    assert code == 0, err
    assert out == ""  # no manifest: nothing admitted (unpaused, the README's recipe admits it)
    assert "0 Job(s) would be created" in err
    assert re.search(r"warning: admission is paused by cli:\S+ since .* KST: rack 3 "
                     r"maintenance; `idlegpu admission resume` resumes", err), err
