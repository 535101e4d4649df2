"""The job API (``idlegpu serve``) on a REAL uvicorn server on a loopback port, called with
real HTTP clients: idlegpu tokens, roles and teams from the server, the team's priority cap,
idempotency keys scoped to the caller, JSON errors, the audit log, proxy headers."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml
from api_server import T0, ApiServer, Client, MovableClock, api_settings, job

from idlegpu.scheduler.adapters.store import SCHEMA_VERSION, AuditEntry, JobStore
from idlegpu.scheduler.server import create_server
from idlegpu.scheduler.api.auth import new_token, token_sha256


@dataclass
class Api:
    url: str
    store: JobStore
    clock: MovableClock
    clients: list[Client] = field(default_factory=list)

    def token(self, name: str, team: str = "alignment", role: str = "member",
              expires_in: timedelta | None = timedelta(days=30)) -> str:
        token = new_token()
        expires = self.clock.at + expires_in if expires_in is not None else None
        self.store.create_api_token(name, team, role, token_sha256(token), self.clock.at,
                                    expires, AuditEntry(
                                        at=self.clock.at, actor="test", auth="cli",
                                        role="operator", team=None, action="token.create",
                                        target=name))
        return token

    def client(self, token: str | None = None, **headers: str) -> Client:
        made = Client(self.url, token, headers)
        self.clients.append(made)
        return made

    def as_member(self, name: str, team: str, role: str = "member") -> Client:
        return self.client(self.token(name, team, role))


@pytest.fixture
def start_api(tmp_path: Path) -> Iterator[Callable[..., Api]]:
    """``start(**api_section) -> Api``: a store in a SQLite file, a uvicorn server over it."""
    started: list[tuple[ApiServer, Api]] = []

    def start(**api: Any) -> Api:
        store = JobStore(f"sqlite:///{tmp_path / f'api{len(started)}.db'}")
        clock = MovableClock()
        server = ApiServer(create_server(api_settings(**api), store, clock=clock)).start()
        env = Api(server.url, store, clock)
        started.append((server, env))
        return env

    yield start
    for server, env in started:
        for client in env.clients:
            client.close()
        server.stop()
        env.store.close()


@pytest.fixture
def api(start_api) -> Api:
    return start_api(teams={"alignment": {"max_priority": 5}, "*": {"max_priority": 2}})


def error(response) -> dict[str, Any]:
    body = response.json()
    assert set(body) == {"error"} and set(body["error"]) == {"message", "field"}, body
    assert "\n" not in body["error"]["message"] and "Traceback" not in body["error"]["message"]
    return body["error"]


# --- identities, teams and roles ---------------------------------------------------------


def test_two_teams_submit_and_cancel_their_own_work_and_not_each_others(api):
    alice = api.as_member("alice", "alignment")
    bob = api.as_member("bob", "vision")
    a = alice.post("/v1/requests", json=job("sft-a", "alignment"))
    b = bob.post("/v1/requests", json=job("sft-b", "vision"))
    assert a.status_code == b.status_code == 201, (a.text, b.text)
    ra, rb = a.json(), b.json()
    assert ra["team"] == "alignment" and rb["team"] == "vision"
    # the response names every unit: 1 train + 3 eval sweep members
    assert ra["unit_ids"] == [f"{ra['id']}-0-0", *(f"{ra['id']}-1-{m}" for m in range(3))]
    assert [u["id"] for u in ra["units"]] == ra["unit_ids"]
    assert ra["submitted_by"] == "token:alice"

    # the other team's work: 403, and nothing changes
    for path in (f"/v1/requests/{rb['id']}/cancel", f"/v1/units/{rb['unit_ids'][0]}/cancel"):
        refused = alice.post(path)
        assert refused.status_code == 403
        assert "belongs to team 'vision'" in error(refused)["message"]
    assert bob.post(f"/v1/units/{ra['unit_ids'][1]}/cancel").status_code == 403
    assert {u.state.value for u in api.store.find_units()} == {"queued"}

    # their own: a unit (with what depends on it) and a whole request
    done = alice.post(f"/v1/units/{ra['unit_ids'][0]}/cancel",
                      json={"reason": "wrong learning rate"})
    assert done.status_code == 200, done.text
    assert done.json()["cancelled"] == ra["unit_ids"]  # the eval members depend on it
    assert api.store.unit(ra["unit_ids"][0]).reason == "wrong learning rate"
    done = bob.post(f"/v1/requests/{rb['id']}/cancel")
    assert done.status_code == 200 and sorted(done.json()["cancelled"]) == sorted(rb["unit_ids"])
    assert api.store.unit(rb["unit_ids"][0]).reason == "cancelled by bob"


def test_an_operator_cancels_any_teams_work(api):
    alice = api.as_member("alice", "alignment")
    ops = api.as_member("ops", "platform", "operator")
    submitted = alice.post("/v1/requests", json=job()).json()
    done = ops.post(f"/v1/requests/{submitted['id']}/cancel")
    assert done.status_code == 200 and len(done.json()["cancelled"]) == 4
    assert ops.get("/v1/audit").status_code == 200
    assert error(alice.get("/v1/audit"))["message"] == (
        "role member may not read the audit log: operators only")


def test_a_viewer_reads_but_changes_nothing(api):
    alice = api.as_member("alice", "alignment")
    viewer = api.as_member("dash", "alignment", "viewer")
    submitted = alice.post("/v1/requests", json=job()).json()
    assert viewer.get("/v1/units", params={"scope": "all"}).json()["count"] == 4
    assert viewer.get(f"/v1/requests/{submitted['id']}").status_code == 200
    assert viewer.get(f"/v1/units/{submitted['unit_ids'][0]}").status_code == 200
    for call in (lambda: viewer.post("/v1/requests", json=job("sft-v")),
                 lambda: viewer.post(f"/v1/requests/{submitted['id']}/cancel"),
                 lambda: viewer.post(f"/v1/units/{submitted['unit_ids'][0]}/cancel"),
                 lambda: viewer.get("/v1/audit")):
        response = call()
        assert response.status_code == 403, response.text
        assert "viewer" in error(response)["message"]
    assert len(api.store.find_units()) == 4
    assert {u.state.value for u in api.store.find_units()} == {"queued"}
    assert [e.action for e in api.store.audit_log()] == ["token.create", "token.create",
                                                          "submit"]


def test_no_token_is_401_with_a_bearer_challenge(api):
    anonymous = api.client()
    for response in (anonymous.get("/v1/units"), anonymous.post("/v1/requests", json=job()),
                     anonymous.get("/v1/whoami")):
        assert response.status_code == 401
        assert response.headers["WWW-Authenticate"].startswith("Bearer")
        assert "authentication required" in error(response)["message"]
    for bad in ("Basic YWxpY2U6cHc=", "Bearer", "Bearer igt_forged0000000000000000000000",
                "Bearer some-kubernetes-token"):
        response = api.client(Authorization=bad).get("/v1/whoami")
        assert response.status_code == 401, bad
        assert response.headers["WWW-Authenticate"].startswith("Bearer")
    assert not api.store.find_units()
    # the probes' endpoint needs no token and says nothing but that the store answers
    assert anonymous.get("/healthz").json() == {"status": "ok", "schema_version": SCHEMA_VERSION}


def test_expired_and_revoked_tokens_are_401(api, cli):
    short = api.client(api.token("short", expires_in=timedelta(hours=1)))
    assert short.get("/v1/whoami").status_code == 200
    api.clock.advance(hours=1)  # the server's clock: valid up to, not at, its expiry
    response = short.get("/v1/whoami")
    assert response.status_code == 401
    assert error(response)["message"] == (
        f"token 'short' expired at {(T0 + timedelta(hours=1)).isoformat()}; ask an operator "
        "for a new one")

    # made and revoked with the CLI, on the same store
    code, out, err = cli(["token", "create", "--team", "alignment", "--name", "carol",
                          "--store", api.store.url])
    assert code == 0, err
    token = out.strip().splitlines()[-1]
    assert token.startswith("igt_") and len(token) == 4 + 43
    db = Path(api.store.url.removeprefix("sqlite:///"))
    stored = b"".join(p.read_bytes() for p in db.parent.glob(db.name + "*"))  # with the WAL
    assert token_sha256(token).encode() in stored and token.encode() not in stored
    carol = api.client(token)
    assert carol.get("/v1/whoami").json() == {
        "user": "carol", "auth": "token", "team": "alignment", "role": "member", "groups": [],
        "principal": "token:carol", "address": "127.0.0.1"}
    assert cli(["token", "revoke", "carol", "--store", api.store.url])[0] == 0
    response = carol.get("/v1/whoami")
    assert response.status_code == 401 and "revoked" in error(response)["message"]
    assert carol.post("/v1/requests", json=job()).status_code == 401
    code, out, _ = cli(["token", "list", "--store", api.store.url])
    assert code == 0 and "carol" in out and "revoked" in out and "igt_" not in out


def test_a_request_for_another_team_is_refused(api):
    alice = api.as_member("alice", "alignment")
    response = alice.post("/v1/requests", json=job(team="vision"))
    assert response.status_code == 403
    assert error(response) == {
        "message": "request: team: you act for team 'alignment'; a request for team 'vision' "
                   "is refused (the team of a request is the caller's)",
        "field": "team"}
    assert not api.store.find_units()


def test_a_priority_above_the_teams_cap_is_refused_naming_the_cap(api):
    alice = api.as_member("alice", "alignment")   # alignment: max_priority 5
    bob = api.as_member("bob", "vision")          # "*": max_priority 2
    assert alice.post("/v1/requests", json=job("at-cap", priority=5)).status_code == 201
    response = alice.post("/v1/requests", json=job("above", priority=6))
    assert response.status_code == 422
    assert error(response) == {
        "message": "request: priority: priority 6 is above team alignment's cap of 5 "
                   "(api.teams.alignment.max_priority); use 5 or less",
        "field": "priority"}
    body = job("step-above", "vision")
    body["steps"][1]["priority"] = 3
    response = bob.post("/v1/requests", json=body)
    assert response.status_code == 422
    assert error(response)["field"] == "steps.1.priority"
    assert "cap of 2 (api.teams.*.max_priority)" in error(response)["message"]
    assert [u.priority for u in api.store.find_units()] == [5] * 4  # only the one at the cap


def test_idempotency_keys_are_the_callers_and_a_different_body_is_409(api):
    alice = api.as_member("alice", "alignment")
    alice2 = api.as_member("alice-laptop", "alignment")
    key = {"Idempotency-Key": "nightly-2026-03-02"}
    first = alice.post("/v1/requests", json=job(), headers=key)
    again = alice.post("/v1/requests", json=job(), headers=key)
    assert first.status_code == 201 and again.status_code == 200
    assert again.json()["id"] == first.json()["id"]
    assert again.json()["unit_ids"] == first.json()["unit_ids"]
    # the same request as YAML is the same body
    as_yaml = alice.post("/v1/requests", data=yaml.safe_dump(job()),
                         headers={**key, "Content-Type": "application/yaml"})
    assert as_yaml.status_code == 200 and as_yaml.json()["id"] == first.json()["id"]
    changed = alice.post("/v1/requests", json=job(gpus=8), headers=key)
    assert changed.status_code == 409
    assert error(changed) == {
        "message": f"Idempotency-Key 'nightly-2026-03-02' was used for request "
                   f"{first.json()['id']} with a different body; use a new key for a new "
                   "request",
        "field": "Idempotency-Key"}
    # another caller's key of the same name is another key
    other = alice2.post("/v1/requests", json=job(), headers=key)
    assert other.status_code == 201 and other.json()["id"] != first.json()["id"]
    assert len(api.store.find_units()) == 8


def test_submitted_at_is_the_servers_clock_and_the_body_cannot_set_it(api):
    alice = api.as_member("alice", "alignment")
    api.clock.advance(minutes=7)
    made = alice.post("/v1/requests", json=job()).json()
    assert made["submitted_at"] == (T0 + timedelta(minutes=7)).isoformat()
    assert {u.submitted_at for u in api.store.find_units()} == {T0 + timedelta(minutes=7)}
    response = alice.post("/v1/requests", json=job("sneaky", submitted_at="2020-01-01T00:00Z"))
    assert response.status_code == 422 and error(response)["field"] == "submitted_at"


# --- the queue, a unit, errors -------------------------------------------------------------


def test_the_queue_by_scope_and_state_and_a_unit_with_its_history(api):
    alice = api.as_member("alice", "alignment")
    alice2 = api.as_member("alice-ci", "alignment")
    bob = api.as_member("bob", "vision")
    mine = alice.post("/v1/requests", json=job("a1", checkpoint={"interval": "30m"})).json()
    ours = alice2.post("/v1/requests", json=job("a2")).json()
    theirs = bob.post("/v1/requests", json=job("b1", "vision")).json()

    def ids(client, **params):
        response = client.get("/v1/units", params=params)
        assert response.status_code == 200, response.text
        return [u["id"] for u in response.json()["units"]]

    assert ids(alice, scope="mine") == mine["unit_ids"]
    assert ids(alice) == ids(alice, scope="team") == mine["unit_ids"] + ours["unit_ids"]
    assert ids(alice, scope="all") == mine["unit_ids"] + ours["unit_ids"] + theirs["unit_ids"]
    assert ids(alice, scope="all", limit=2) == mine["unit_ids"][:2]

    # a unit's life, as the daemon records it: admitted, started, checkpointed, preempted
    unit = mine["unit_ids"][0]
    at = T0 + timedelta(hours=1)
    api.store.admit(unit, at, attempt_label="night")
    api.store.started(unit, at + timedelta(minutes=1))
    api.store.checkpointed(unit, at + timedelta(minutes=31), 1800.0)
    api.store.preempted(unit, at + timedelta(minutes=40), reason="traffic came back")
    alice.post(f"/v1/units/{mine['unit_ids'][3]}/cancel")
    assert ids(alice, scope="mine", state="queued") == mine["unit_ids"][:3]
    assert ids(alice, scope="mine", state="cancelled") == [mine["unit_ids"][3]]
    assert ids(alice, scope="mine", state=["cancelled", "queued"]) == mine["unit_ids"]
    assert ids(alice, scope="mine", state="queued,cancelled") == mine["unit_ids"]
    assert ids(alice, scope="mine", state="all") == mine["unit_ids"]
    bad = alice.get("/v1/units", params={"state": "sleeping"})
    assert bad.status_code == 422 and error(bad)["field"] == "state"
    assert alice.get("/v1/units", params={"scope": "everyone"}).status_code == 422

    detail = alice.get(f"/v1/units/{unit}").json()
    assert detail["state"] == "queued" and detail["preemptions"] == 1
    assert detail["work_done_s"] == 1800.0
    (attempt,) = detail["attempt_history"]
    assert attempt["outcome"] == "preempted" and attempt["window"] == "night"
    assert attempt["gpus"] == 4 and attempt["gpu_seconds"] == 4 * 40 * 60
    (preemption,) = detail["preemption_history"]
    assert preemption["reason"] == "traffic came back"
    (checkpoint,) = detail["checkpoints"]
    assert checkpoint["work_done_s"] == 1800.0
    assert detail["spec"]["image"] == "registry.example.com/research/trl-sft:2.1.0"
    assert detail["spec"]["args"] == ["--lr", "2e-5"]


def test_errors_are_json_with_the_field_and_the_clis_one_line_message(api, cli, tmp_path):
    alice = api.as_member("alice", "alignment")
    body = job(gpus=0)
    response = alice.post("/v1/requests", json=body)
    assert response.status_code == 422
    problem = error(response)
    assert problem["field"] == "gpus"
    # the same message as `idlegpu submit` prints for the same file, but for its name
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(body))
    code, _, err = cli(["submit", str(path), "--store", f"sqlite:///{tmp_path / 'cli.db'}"])
    assert code == 2
    (line,) = [x for x in err.splitlines() if x.startswith("error:")]
    assert line.removeprefix(f"error: {path}: ") == problem["message"].removeprefix("request: ")

    step = job()
    step["steps"][0]["gpus"] = 100
    response = alice.post("/v1/requests", json=step)
    assert response.status_code == 422 and error(response)["field"] == "steps.0.gpus"
    assert "64" in error(response)["message"]  # the server's admission.max_gpus_per_job

    cases = [
        (alice.post("/v1/requests", data="{not json", headers={"Content-Type":
                                                              "application/json"}), 400),
        (alice.post("/v1/requests", data="name: [unclosed", headers={"Content-Type":
                                                                    "application/yaml"}), 422),
        (alice.post("/v1/requests", data="<job/>", headers={"Content-Type": "text/xml"}), 415),
        (alice.post("/v1/requests", json=[1, 2]), 422),
        (alice.post("/v1/requests", json=job(image="docker.io/evil/miner:1")), 422),
        (alice.post("/v1/requests", data=b"\xff\xfe", headers={"Content-Type":
                                                              "application/json"}), 400),
        (alice.post("/v1/requests", json=job(), headers={"Idempotency-Key": "x" * 201}), 422),
        (alice.post("/v1/requests", data="x" * 1_000_001,
                    headers={"Content-Type": "application/json"}), 413),
        (alice.get("/v1/units/no-such-unit"), 404),
        (alice.get("/v1/requests/no-such-request"), 404),
        (alice.post("/v1/requests/no-such-request/cancel"), 404),
        (alice.post("/v1/units/x/cancel", data="{", headers={"Content-Type":
                                                             "application/json"}), 400),
        (alice.get("/v1/units", params={"limit": "lots"}), 422),
        (alice.get("/v1/nothing-here"), 404),
    ]
    for response, status in cases:
        assert response.status_code == status, (response.request.url, response.text)
        error(response)
    assert "registry" in error(cases[4][0])["message"] and error(cases[4][0])["field"] == "image"
    assert error(cases[1][0])["message"].startswith("request: invalid YAML at line 1")
    assert not api.store.find_units()


def test_yaml_requests_are_accepted(api):
    alice = api.as_member("alice", "alignment")
    text = (Path(__file__).resolve().parents[1] / "examples/jobs/sft-rl-eval.yaml").read_text()
    data = yaml.safe_load(text)
    alice_team = api.as_member("found", data["team"])
    response = alice_team.post("/v1/requests", data=text,
                               headers={"Content-Type": "application/yaml"})
    assert response.status_code == 201, response.text
    assert response.json()["name"] == data["name"] and response.json()["unit_ids"]
    assert alice.get("/openapi.json").json()["info"]["title"] == "idlegpu job API"
    assert alice.get("/docs").status_code == 200


# --- the audit log -------------------------------------------------------------------------


def test_the_audit_log_records_every_change(api, cli, caplog):
    caplog.set_level(logging.INFO, logger="idlegpu.audit")
    code, out, _ = cli(["token", "create", "--team", "alignment", "--name", "alice",
                        "--role", "member", "--store", api.store.url])
    assert code == 0
    alice = api.client(out.strip().splitlines()[-1])
    ops = api.as_member("ops", "platform", "operator")
    api.clock.advance(minutes=1)
    made = alice.post("/v1/requests", json=job(), headers={"Idempotency-Key": "k1"}).json()
    alice.post("/v1/requests", json=job(), headers={"Idempotency-Key": "k1"})  # a replay: no change
    api.clock.advance(minutes=1)
    alice.post(f"/v1/units/{made['unit_ids'][1]}/cancel")
    api.clock.advance(minutes=1)
    ops.post(f"/v1/requests/{made['id']}/cancel", json={"reason": "maintenance"})
    alice.post("/v1/requests", json=job(team="vision"))  # refused: not a change
    assert cli(["token", "revoke", "alice", "--store", api.store.url])[0] == 0

    log = api.store.audit_log()
    assert [(e.action, e.actor, e.role, e.team) for e in log] == [
        ("token.create", log[0].actor, "operator", None),
        ("token.create", "test", "operator", None),
        ("submit", "alice", "member", "alignment"),
        ("cancel", "alice", "member", "alignment"),
        ("cancel", "ops", "operator", "platform"),
        ("token.revoke", log[0].actor, "operator", None),
    ]
    assert log[0].actor.startswith("cli:") and log[0].target == "alice"
    assert log[0].detail["team"] == "alignment" and log[0].detail["role"] == "member"
    submit, cancel_unit, cancel_request = log[2:5]
    assert submit.target == made["id"] and submit.at == T0 + timedelta(minutes=1)
    assert submit.address == "127.0.0.1" and submit.auth == "token"
    assert submit.detail["units"] == 4 and submit.detail["idempotency_key"] == "k1"
    assert cancel_unit.target == made["unit_ids"][1]
    assert cancel_unit.detail["cancelled"] == [made["unit_ids"][1]]
    assert cancel_request.target == made["id"] and cancel_request.detail["reason"] == "maintenance"
    assert sorted(cancel_request.detail["cancelled"]) == sorted(
        set(made["unit_ids"]) - {made["unit_ids"][1]})
    assert log[5].target == "alice"

    # the same entries through the API (operators) and in the log
    entries = ops.get("/v1/audit").json()["entries"]
    assert [e["action"] for e in entries] == [e.action for e in log]
    assert ops.get("/v1/audit", params={"action": "cancel"}).json()["entries"][0]["actor"] \
        == "alice"
    logged = [json.loads(r.getMessage()) for r in caplog.records if r.name == "idlegpu.audit"]
    assert [e["action"] for e in logged] == [e.action for e in log]
    assert logged[2]["target"] == made["id"] and logged[2]["address"] == "127.0.0.1"


# --- an authenticating proxy ---------------------------------------------------------------

PROXY_IDENTITIES = [
    {"user": "root@corp", "team": "platform", "role": "operator"},
    {"group": "ml-alignment", "team": "alignment", "role": "member"},
    {"group": "ml-readers", "team": "alignment", "role": "viewer"},
]


def test_proxy_headers_are_honoured_from_a_trusted_address(start_api):
    api = start_api(trusted_proxies=["127.0.0.1/32"], identities=PROXY_IDENTITIES)
    alice = api.client(**{"X-Remote-User": "alice@corp", "X-Remote-Group": "staff, ml-alignment",
                          "X-Forwarded-For": "203.0.113.9"})
    who = alice.get("/v1/whoami").json()
    assert who == {"user": "alice@corp", "auth": "proxy", "team": "alignment", "role": "member",
                   "groups": ["staff", "ml-alignment"], "principal": "proxy:alice@corp",
                   "address": "203.0.113.9 via 127.0.0.1"}
    made = alice.post("/v1/requests", json=job())
    assert made.status_code == 201
    assert api.store.audit_log()[-1].address == "203.0.113.9 via 127.0.0.1"
    reader = api.client(**{"X-Remote-User": "dan@corp", "X-Remote-Group": "ml-readers"})
    assert reader.get("/v1/whoami").json()["role"] == "viewer"
    assert reader.post(f"/v1/requests/{made.json()['id']}/cancel").status_code == 403
    root = api.client(**{"X-Remote-User": "root@corp"})
    assert root.get("/v1/whoami").json()["team"] == "platform"
    stranger = api.client(**{"X-Remote-User": "eve@corp", "X-Remote-Group": "staff"})
    response = stranger.get("/v1/whoami")
    assert response.status_code == 403
    assert "no api.identities entry maps it" in error(response)["message"]


def test_proxy_headers_from_an_untrusted_address_are_ignored(start_api):
    # the test client connects from 127.0.0.1, outside the configured proxy range
    api = start_api(trusted_proxies=["10.8.0.0/16"], identities=PROXY_IDENTITIES)
    forged = api.client(**{"X-Remote-User": "root@corp", "X-Remote-Group": "ml-alignment"})
    for response in (forged.get("/v1/whoami"), forged.post("/v1/requests", json=job())):
        assert response.status_code == 401
        assert "authentication required" in error(response)["message"]
    # with a real token the headers change nothing: the token's identity counts
    token = api.token("alice", "alignment")
    both = api.client(token, **{"X-Remote-User": "root@corp"})
    assert both.get("/v1/whoami").json()["user"] == "alice"
    assert not api.store.find_units()


def test_the_queue_shows_kueue_workloads_and_users_jobs_to_their_team(api):
    from idlegpu.scheduler.types import ExternalUnit

    start = api.clock.at + timedelta(hours=3)
    api.store.record_external([
        ExternalUnit(id="kueue/alignment/job-rm-1", origin="kueue", namespace="alignment",
                     name="job-rm-1", team="alignment", gpus=8, state="waiting",
                     reason="waits: needs 8 GPUs for 9.0 h", start_at=start),
        ExternalUnit(id="job/vision/train", origin="job", namespace="vision", name="train",
                     team="vision", gpus=4, state="running", since=api.clock.at),
    ], api.clock.at, ["kueue", "job"])
    alice = api.as_member("alice", "alignment")
    team = alice.get("/v1/units").json()
    (workload,) = team["external"]
    assert workload["origin"] == "kueue-workload" and workload["state"] == "waiting"
    assert workload["reason"] == "waits: needs 8 GPUs for 9.0 h"
    assert datetime.fromisoformat(workload["estimated_start"]) == start
    assert alice.get("/v1/units", params={"scope": "mine"}).json()["external"] == []
    everyone = alice.get("/v1/units", params={"scope": "all"}).json()["external"]
    assert {u["id"] for u in everyone} == {"kueue/alignment/job-rm-1", "job/vision/train"}
