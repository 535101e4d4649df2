"""`idlegpu submit / queue / cancel --server URL` against a REAL uvicorn job API on loopback:
the token from IDLEGPU_TOKEN, a token file or the kubeconfig; the server's answers printed as
plain text; a lost answer retried with the same idempotency key (queued once)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import requests
import yaml
from api_server import ApiServer, MovableClock, api_settings, job

from idlegpu.forecast.errors import PermanentError
from idlegpu.scheduler.adapters.api_client import (
    ApiClient,
    ApiRefused,
    ApiUnavailable,
    Credential,
    find_credential,
)
from idlegpu.scheduler.adapters.store import AuditEntry, JobStore
from idlegpu.scheduler.server import create_server
from idlegpu.scheduler.api.auth import new_token, token_sha256
from idlegpu.scheduler.cli import main


@pytest.fixture
def server(tmp_path: Path):
    store = JobStore(f"sqlite:///{tmp_path / 'api.db'}")
    clock = MovableClock()
    api = ApiServer(create_server(api_settings(teams={"*": {"max_priority": 3}}), store,
                               clock=clock)).start()

    def token(name: str, team: str, role: str = "member") -> str:
        secret = new_token()
        store.create_api_token(name, team, role, token_sha256(secret), clock.at, None,
                               AuditEntry(at=clock.at, actor="test", auth="cli",
                                          role="operator", team=None, action="token.create",
                                          target=name))
        return secret

    api.token = token
    api.store = store
    yield api
    api.stop()
    store.close()


def request_file(tmp_path: Path, name: str = "sft-a", team: str = "alignment", **fields) -> Path:
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(job(name, team, **fields)), encoding="utf-8")
    return path


def run(capsys, *argv: str) -> tuple[int, str, str]:
    try:
        main(list(argv))
        code = 0
    except SystemExit as exc:
        code = exc.code or 0
    out, err = capsys.readouterr()
    return code, out, err


def test_a_team_submits_lists_and_cancels_its_own_work_and_not_anothers(server, tmp_path,
                                                                         capsys, monkeypatch):
    alice = server.token("alice", "alignment")
    bob = server.token("bob", "pretraining")
    monkeypatch.setenv("IDLEGPU_TOKEN", alice)
    code, out, err = run(capsys, "submit", str(request_file(tmp_path)), "--server", server.url)
    assert code == 0, err
    assert "queued sft-a (team alignment, by token:alice)" in " ".join(out.split())
    (request,) = server.store.find_units(states=None, team="alignment", principal=None,
                                         limit=10)[:1]
    request_id = request.request_id

    code, out, _ = run(capsys, "queue", "--server", server.url, "--scope", "mine")
    assert code == 0 and out.count("alignment") >= 4 and "4 unit(s)" in out
    code, out, _ = run(capsys, "queue", "--server", server.url, "--scope", "mine", "-o", "json")
    units = json.loads(out)  # stdout: the JSON alone, full ids, ISO times with the offset
    assert code == 0 and len(units) == 4 and {u["request"] for u in units} == {request_id}
    assert all(u["unit"].startswith(request_id) and u["submitted"][-6] in "+-" for u in units)

    monkeypatch.setenv("IDLEGPU_TOKEN", bob)
    code, out, err = run(capsys, "cancel", request_id, "--server", server.url)
    assert code == 2 and "belongs to team 'alignment'" in " ".join(err.split())
    code, out, _ = run(capsys, "queue", "--server", server.url)
    assert "the queue is empty for scope team" in out  # bob's team sees none of it

    monkeypatch.setenv("IDLEGPU_TOKEN", alice)
    code, out, err = run(capsys, "cancel", request_id, "--server", server.url)
    assert code == 0, err
    assert "cancelled 4 queued unit(s)" in out
    assert {u.state.value for u in server.store.request_units(request_id)} == {"cancelled"}


def test_a_unit_id_is_cancelled_through_the_unit_route(server, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("IDLEGPU_TOKEN", server.token("alice", "alignment"))
    run(capsys, "submit", str(request_file(tmp_path)), "--server", server.url)
    units = server.store.find_units(states=None, team="alignment", principal=None, limit=10)
    last = max(u.id for u in units)
    code, out, err = run(capsys, "cancel", last, "--server", server.url)
    assert code == 0, err
    assert f"cancelled 1 queued unit(s): {last}" in out


def test_the_team_and_cap_are_the_servers(server, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("IDLEGPU_TOKEN", server.token("alice", "alignment"))
    other = request_file(tmp_path, "sft-b", team="pretraining")
    code, _, err = run(capsys, "submit", str(other), "--server", server.url)
    assert code == 2 and "a request for team 'pretraining' is refused" in " ".join(err.split())
    greedy = request_file(tmp_path, "sft-c", priority=9)
    code, _, err = run(capsys, "submit", str(greedy), "--server", server.url)
    assert code == 2 and "cap of 3" in err
    assert server.store.find_units(states=None, team=None, principal=None, limit=10) == []


def test_a_viewer_and_a_bad_token_change_nothing(server, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("IDLEGPU_TOKEN", server.token("vera", "alignment", "viewer"))
    code, _, err = run(capsys, "submit", str(request_file(tmp_path)), "--server", server.url)
    assert code == 2 and "viewer" in err
    monkeypatch.setenv("IDLEGPU_TOKEN", "idlegpu_" + "x" * 40)
    code, _, err = run(capsys, "queue", "--server", server.url)
    assert code == 2 and "(credentials from IDLEGPU_TOKEN)" in " ".join(err.split())
    assert "x" * 40 not in err  # the token itself is never printed


def test_the_token_comes_from_a_file_and_markup_is_printed_as_text(server, tmp_path, capsys,
                                                                   monkeypatch):
    monkeypatch.delenv("IDLEGPU_TOKEN", raising=False)
    token_file = tmp_path / "token"
    token_file.write_text(server.token("alice", "alignment") + "\n", encoding="utf-8")
    path = request_file(tmp_path, "sft-a", description="[bold red]x[/] [/]")
    code, out, err = run(capsys, "submit", str(path), "--server", server.url,
                         "--token-file", str(token_file))
    assert code == 0, err
    assert "queued sft-a" in out
    code, _, err = run(capsys, "cancel", "[/]", "--server", server.url,
                         "--token-file", str(token_file))
    assert code == 2 and "[/]" in err and "Traceback" not in err


def test_no_credentials_is_one_line(monkeypatch, tmp_path):
    monkeypatch.delenv("IDLEGPU_TOKEN", raising=False)
    with pytest.raises(PermanentError, match="no credentials for the job API"):
        find_credential(None, environ={}, kubeconfig=lambda: None)
    assert find_credential(None, environ={}, kubeconfig=lambda: "abc").source == (
        "the current kubeconfig context")
    empty = tmp_path / "empty"
    empty.write_text("\n")
    with pytest.raises(PermanentError, match="is empty"):
        find_credential(empty, environ={})


def test_a_lost_answer_is_retried_with_the_same_key_and_queued_once(server, tmp_path):
    token = server.token("alice", "alignment")
    keys: list[str] = []

    class LosesTheFirstAnswer(requests.Session):
        def request(self, method, url, **kw):
            response = super().request(method, url, **kw)
            if method == "POST":
                keys.append(kw["headers"]["Idempotency-Key"])
                if len(keys) == 1:  # the server queued it; the answer never arrives
                    raise requests.ConnectionError("connection reset")
            return response

    client = ApiClient(server.url, Credential(token, "test"), session=LosesTheFirstAnswer(),
                       sleep=lambda s: None)
    created, request = client.submit(request_file(tmp_path).read_text())
    assert len(keys) == 2 and keys[0] == keys[1]
    assert not created  # the retry found the first submission
    assert len(server.store.find_units(states=None, team=None, principal=None, limit=20)) == 4
    assert len(request["unit_ids"]) == 4


def test_an_unreachable_server_is_exit_1_with_what_to_do(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("IDLEGPU_TOKEN", "t")
    from api_server import free_port

    url = f"http://127.0.0.1:{free_port()}"
    client = ApiClient(url, Credential("t", "test"), sleep=lambda s: None, timeout_s=2)
    with pytest.raises(ApiUnavailable, match="after 3 tries"):
        client.units()
    monkeypatch.setattr("idlegpu.scheduler.adapters.api_client.time.sleep", lambda s: None)
    code, _, err = run(capsys, "submit", str(request_file(tmp_path)), "--server", url)
    assert code == 1 and "--idempotency-key" in err


def test_refusals_carry_the_status_and_field(server):
    client = ApiClient(server.url, Credential(server.token("alice", "alignment"), "test"))
    with pytest.raises(ApiRefused) as refused:
        client.submit("name: x\n")
    assert refused.value.status == 422 and "\n" not in str(refused.value)
    with pytest.raises(PermanentError, match="use an http"):
        ApiClient("idlegpu-api:8080", Credential("t", "test"))
