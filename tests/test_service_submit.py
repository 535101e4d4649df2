"""One submit behind every front door (``idlegpu.scheduler.service``): the same request
submitted through the CLI, the job API and the web console's form is stored the same way (its
units and their specs, team, kind, the validated request) with one audit row each, by the one
function that checks, stores and audits (``service.submissions.submit``); the console calls
the services, never the API's routes in-process; a refusal reads the same everywhere."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import requests
import yaml
from api_server import ApiServer, MovableClock
from test_api_plan import NOW, request, settings_for, token

from idlegpu.scheduler.adapters.store import JobStore, spec_to_json
from idlegpu.scheduler.server import create_server

REPO = Path(__file__).resolve().parents[1]
SCHEDULER = REPO / "scheduler"


def console_session(url: str, secret: str) -> tuple[requests.Session, str]:
    """A browser's session, logged in through the console's form; the session's CSRF token."""
    browser = requests.Session()
    form = browser.get(url + "/login", timeout=30).text
    nonce = re.search(r'name="csrf" value="([^"]+)"', form).group(1)
    answer = browser.post(url + "/login", data={"csrf": nonce, "next": "/", "token": secret},
                          timeout=30, allow_redirects=False)
    assert answer.status_code == 303, answer.text
    page = browser.get(url + "/submit", timeout=30).text
    return browser, re.search(r'name="csrf" value="([^"]+)"', page).group(1)


def imported(source: str) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.append(node.module)
    return found


def stored(store: JobStore, request_id: str) -> dict:
    row = store.request(request_id)
    units = store.request_units(request_id)
    return {"name": row.name, "team": row.team, "kind": row.kind, "raw": row.raw,
            "submitted_at": row.submitted_at,
            "units": [(u.state, u.gpus, u.priority, spec_to_json(u.spec)) for u in units]}


def test_the_same_request_submitted_three_ways_is_stored_and_audited_alike(tmp_path, cli):
    body = request("three-ways", "alignment", 8)
    path = tmp_path / "three-ways.yaml"
    path.write_text(yaml.safe_dump(body), encoding="utf-8")
    url = f"sqlite:///{tmp_path / 'jobs.db'}"
    store = JobStore(url)
    secret = token(store, "alice", "alignment", "member")
    server = ApiServer(create_server(settings_for(tmp_path / "reports"), store,
                                     clock=MovableClock(NOW))).start()
    try:
        code, out, err = cli(["submit", str(path), "--config", str(REPO / "idlegpu.yaml"),
                              "--store", url, "--now", NOW.isoformat()])
        assert code == 0, err
        by_cli = out.split(" as ")[1].split(":")[0].strip()
        answer = requests.post(server.url + "/v1/requests", json=body, timeout=30,
                               headers={"Authorization": f"Bearer {secret}"})
        assert answer.status_code == 201, answer.text
        by_api = answer.json()["id"]
        browser, csrf = console_session(server.url, secret)
        answer = browser.post(server.url + "/submit", timeout=30, allow_redirects=False,
                              data={"csrf": csrf, "action": "submit",
                                    "request": yaml.safe_dump(body)})
        assert answer.status_code == 303, answer.text
        by_console = answer.headers["location"].split("/requests/")[1].split("?")[0]
    finally:
        server.stop()
    ids = (by_cli, by_api, by_console)
    assert len(set(ids)) == 3
    first = stored(store, by_cli)
    assert first["team"] == "alignment" and len(first["units"]) == 1
    for other in ids[1:]:
        assert stored(store, other) == first
    audit = sorted((e for e in store.audit_log() if e.action == "submit"),
                   key=lambda e: ids.index(e.target))
    assert [e.target for e in audit] == list(ids)
    assert [(e.actor.split(":")[0], e.auth, e.role) for e in audit] == [
        ("cli", "cli", "operator"), ("alice", "token", "member"), ("alice", "token", "member")]
    assert all(e.detail["request"] == "three-ways" and e.detail["units"] == 1 for e in audit)
    assert [store.submitted_by(i) for i in ids] == [audit[0].actor, "token:alice",
                                                    "token:alice"]
    store.close()


def test_a_refusal_reads_the_same_through_the_api_and_the_console(tmp_path):
    store = JobStore(f"sqlite:///{tmp_path / 'jobs.db'}")
    secret = token(store, "alice", "alignment", "member")
    server = ApiServer(create_server(settings_for(tmp_path / "reports"), store,
                                     clock=MovableClock(NOW))).start()
    try:
        other_team = yaml.safe_dump(request("not-mine", "vision", 8))
        answer = requests.post(server.url + "/v1/requests", data=other_team, timeout=30,
                               headers={"Authorization": f"Bearer {secret}",
                                        "Content-Type": "application/yaml"})
        assert answer.status_code == 403
        said = answer.json()["error"]
        browser, csrf = console_session(server.url, secret)
        page = browser.post(server.url + "/submit", timeout=30,
                            data={"csrf": csrf, "action": "submit", "request": other_team})
        assert page.status_code == 422
        assert said["field"] == "team" and said["message"].startswith("request: team: you act")
        # the console shows the field, then the same words
        assert '<strong class="field">team</strong>: ' in page.text
        assert said["message"].split("team: ", 1)[1].replace("'", "&#39;") in page.text
    finally:
        server.stop()
    assert store.audit_log() and not [e for e in store.audit_log() if e.action == "submit"]
    store.close()


def test_one_function_stores_a_submission_and_the_console_makes_no_http_call_to_itself():
    sources = {p: p.read_text(encoding="utf-8") for p in SCHEDULER.rglob("*.py")}
    callers = sorted(str(p.relative_to(REPO)) for p, text in sources.items()
                     if ".submit_from_api(" in text)
    assert callers == ["scheduler/service/submissions.py"]
    console = "\n".join(t for p, t in sources.items() if "console" in p.parts)
    for sign in ("call_api", '"type": "http"', "http.response.start", "/v1/requests"):
        assert sign not in console, sign
    # the API and the console sit side by side: neither imports the other
    for side, other in (("api", "console"), ("console", "api")):
        for path, text in sources.items():
            if side in path.relative_to(SCHEDULER).parts:
                assert not [m for m in imported(text) if m.startswith(f"idlegpu.scheduler.{other}")
                            ], path
