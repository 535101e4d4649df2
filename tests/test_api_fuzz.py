"""Random and adversarial request bodies through the REAL job API (uvicorn on loopback), as
JSON and as YAML: every answer is a clean 4xx with the JSON error shape (or a 201 for a valid
request), never a 500 or a traceback; and the limits' worst cases are refused quickly."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import requests
from api_server import ApiServer, MovableClock, api_settings
from hypothesis import HealthCheck, given, settings
from test_limits import request_texts

from idlegpu.scheduler.adapters.store import AuditEntry, JobStore
from idlegpu.scheduler.server import create_server
from idlegpu.scheduler.api.auth import new_token, token_sha256


@pytest.fixture(scope="module")
def api(tmp_path_factory):
    path: Path = tmp_path_factory.mktemp("fuzz") / "api.db"
    store = JobStore(f"sqlite:///{path}")
    clock = MovableClock()
    server = ApiServer(create_server(api_settings(), store, clock=clock)).start()
    token = new_token()
    store.create_api_token("fuzz", "alignment", "member", token_sha256(token), clock.at, None,
                           AuditEntry(at=clock.at, actor="test", auth="cli", role="operator",
                                      team=None, action="token.create", target="fuzz"))
    session = requests.Session()
    session.headers["Authorization"] = f"Bearer {token}"
    yield server.url, session, store
    session.close()
    server.stop()
    store.close()


def _post(url: str, session: requests.Session, body: str | bytes, kind: str):
    data = body.encode("utf-8", "surrogatepass") if isinstance(body, str) else body
    return session.post(f"{url}/v1/requests", data=data, timeout=30,
                        headers={"Content-Type": kind})


def _clean(response) -> None:
    assert response.status_code in (201, 400, 403, 409, 413, 415, 422), (
        response.status_code, response.text[:500])
    if response.status_code != 201:
        error = response.json()["error"]
        assert set(error) == {"message", "field"}
        message = error["message"]
        assert "\n" not in message and "Traceback" not in message
        assert "internal error" not in message and len(message) < 4000


@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
@given(request_texts())
def test_random_and_adversarial_bodies_get_a_clean_answer(api, body):
    url, session, _ = api
    for kind in ("application/json", "application/yaml"):
        _clean(_post(url, session, body, kind))


@pytest.mark.parametrize("body", [
    "[" * 3000 + "]" * 3000,                                  # deep nesting
    '{"name": "x", "priority": ' + "9" * 5000 + "}",          # an int longer than Python reads
    '{"a": ' * 2000 + "1" + "}" * 2000,
])
def test_pathological_json_is_a_400_or_422_quickly(api, body):
    url, session, _ = api
    began = time.perf_counter()
    response = _post(url, session, body, "application/json")
    assert response.status_code in (400, 413, 422), response.text[:300]
    _clean(response)
    assert time.perf_counter() - began < 2.0


def test_billion_laughs_and_a_million_sweep_values_are_refused_and_store_nothing(api):
    url, session, store = api
    before = len(store.find_units(states=None, team=None, principal=None, limit=None))
    laughs = "a: &a [x, x, x, x, x, x, x, x, x, x]\n" + "".join(
        f"{chr(98 + i)}: &{chr(98 + i)} [*{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}, "
        f"*{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}, "
        f"*{chr(97 + i)}, *{chr(97 + i)}]\n" for i in range(8))
    sweep = ('{"name": "s", "team": "alignment", "kind": "eval", "image": '
             '"registry.example.com/research/x:1", "gpus": 1, "runtime_estimate": "1h", '
             '"args": ["{v}"], "sweep": {"v": [' + ",".join(str(i) for i in range(10**6))
             + "]}}")
    for body, kind in ((laughs, "application/yaml"), (sweep, "application/json")):
        began = time.perf_counter()
        response = _post(url, session, body, kind)
        assert response.status_code in (413, 422), response.text[:300]
        _clean(response)
        assert time.perf_counter() - began < 2.0
    assert len(store.find_units(states=None, team=None, principal=None, limit=None)) == before
