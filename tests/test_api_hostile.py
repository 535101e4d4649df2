"""A hostile member of another team against a REAL ``idlegpu serve`` (a subprocess on loopback,
its memory read from /proc): bodies far past every route's limit, chunked, to routes with and
without authentication. Each must be refused while it is read (413, or the connection closed),
with the server's peak RSS (``VmHWM``) under +50 MB; before the bounded reader, 400 MiB to
``/login`` took the server from 370 to 1,159 MB.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import requests
from api_server import free_port, wait_healthy

REPO = Path(__file__).resolve().parents[1]
IDLEGPU = [sys.executable, "-c", "from idlegpu.scheduler.cli import main; main()"]
MiB = 1024 * 1024
HUGE = 300 * MiB


@dataclass
class Served:
    url: str
    port: int
    pid: int
    tokens: dict[str, str]  # name -> token

    @property
    def member(self) -> str:
        return self.tokens["mallory"]

    @property
    def viewer(self) -> str:
        return self.tokens["eve"]

    def peak_rss_mb(self) -> float:
        """The server's high-water resident set (VmHWM), in MB."""
        for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
        raise AssertionError("no VmHWM")


def _token(store: str, env: dict[str, str], name: str, role: str) -> str:
    made = subprocess.run([*IDLEGPU, "token", "create", "--team", "alignment", "--name", name,
                           "--role", role, "--store", store], capture_output=True, text=True,
                          env=env, cwd=REPO, check=True)
    return made.stdout.strip()


@contextlib.contextmanager
def serving(store: str, tokens: dict[str, str],
            *extra: str) -> Iterator[tuple[Served, list[str]]]:
    """A real ``idlegpu serve`` on ``store`` (``extra``: more of its options) with tokens
    ``{name: role}`` of team alignment; yields it and, once it has stopped, its whole output
    (the list is filled then)."""
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("IDLEGPU_")},
           "PYTHONUNBUFFERED": "1"}
    made = {name: _token(store, env, name, role) for name, role in tokens.items()}
    port = free_port()
    # its log to a file: a pipe nobody reads while it serves would fill and stop the server
    log = tempfile.TemporaryFile(mode="w+")  # noqa: SIM115 - closed below
    server = subprocess.Popen(
        [*IDLEGPU, "serve", "--config", "idlegpu.yaml", "--store", store, "--port", str(port),
         "--now", "2026-01-28T17:00:00+09:00", *extra],
        cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT, text=True)
    url = f"http://127.0.0.1:{port}"
    output: list[str] = []
    try:
        wait_healthy(url, server)
        yield Served(url, port, server.pid, made), output
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(timeout=30)
        log.seek(0)
        out = log.read()
        log.close()
        output.append(out)
    assert "Traceback" not in out, out[-3000:]


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    store = f"sqlite:///{tmp_path_factory.mktemp('hostile') / 'jobs.db'}"
    with serving(store, {"mallory": "member", "eve": "viewer", "olga": "operator"}) as (
            server, _):
        yield server


def send_chunked(port: int, path: str, total: int, headers: dict[str, str],
                 chunk: int = MiB) -> tuple[int | None, int]:
    """POST ``total`` bytes to ``path`` chunked, until the server answers or closes; return
    its status (None: closed without one) and how many bytes it let us send."""
    piece = b"x" * chunk
    sent = 0
    with socket.create_connection(("127.0.0.1", port), timeout=20) as sock:
        head = [f"POST {path} HTTP/1.1", "Host: 127.0.0.1", "Transfer-Encoding: chunked",
                *(f"{k}: {v}" for k, v in headers.items()), "", ""]
        sock.sendall("\r\n".join(head).encode())
        sock.setblocking(False)
        answer = b""
        try:
            while sent < total:
                try:
                    answer += sock.recv(65536)
                    if answer:
                        break
                except BlockingIOError:
                    pass
                frame = f"{chunk:x}\r\n".encode() + piece + b"\r\n"
                view = memoryview(frame)
                while view:
                    try:
                        n = sock.send(view)
                        view = view[n:]
                    except BlockingIOError:
                        try:
                            answer += sock.recv(65536)
                        except BlockingIOError:
                            time.sleep(0.001)
                        if answer:
                            break
                if answer:
                    break
                sent += chunk
            sock.setblocking(True)
            sock.settimeout(20)
            while b"\r\n" not in answer:
                more = sock.recv(65536)
                if not more:
                    break
                answer += more
        except (BrokenPipeError, ConnectionResetError):
            pass
    if not answer.startswith(b"HTTP/1.1 "):
        return None, sent
    return int(answer.split()[1]), sent


FORM = {"Content-Type": "application/x-www-form-urlencoded"}


@pytest.mark.parametrize("route, who", [
    ("/login", None), ("/logout", None), ("/units/u-1/cancel", None),
    ("/v1/units/u-1/cancel", "viewer"), ("/v1/requests/r-1/cancel", "viewer"),
    ("/v1/requests", "member"), ("/v1/admission/pause", "viewer"),
])
def test_a_huge_chunked_body_is_refused_while_it_is_read(served: Served, route: str,
                                                         who: str | None) -> None:
    headers = dict(FORM) if who is None else {
        "Authorization": f"Bearer {getattr(served, who)}", "Content-Type": "application/json"}
    before = served.peak_rss_mb()
    status, sent = send_chunked(served.port, route, HUGE, headers)
    grew = served.peak_rss_mb() - before
    assert status in (413, 403, 401, None), status  # refused, never read whole
    assert sent < 64 * MiB, f"{route}: the server read {sent / MiB:.0f} MiB"
    assert grew < 50, f"{route}: peak RSS +{grew:.0f} MB"
    assert requests.get(f"{served.url}/healthz", timeout=5).status_code == 200


def test_a_signed_in_member_s_huge_console_forms_are_refused_too(served: Served) -> None:
    # signed in (a session cookie): the forms are read for their CSRF token, under the limit
    web = requests.Session()
    web.get(f"{served.url}/login", timeout=10)  # the server's signed nonce, as a browser gets it
    nonce = web.cookies.get("idlegpu_login_csrf")
    signed = web.post(f"{served.url}/login", data={"csrf": nonce, "token": served.member,
                                                   "next": "/"}, allow_redirects=False,
                      timeout=10)
    assert signed.status_code == 303, signed.text
    cookie = "; ".join(f"{c.name}={c.value}" for c in web.cookies if c.name != "idlegpu_login_csrf")
    for route in ("/logout", "/units/u-1/cancel", "/submit", "/operators/pause"):
        before = served.peak_rss_mb()
        status, sent = send_chunked(served.port, route, HUGE, {**FORM, "Cookie": cookie})
        grew = served.peak_rss_mb() - before
        assert status in (413, 403, None), (route, status)
        assert sent < 64 * MiB and grew < 50, (route, sent / MiB, grew)


def test_a_declared_length_over_the_limit_is_refused_before_a_byte_is_read(
        served: Served) -> None:
    with socket.create_connection(("127.0.0.1", served.port), timeout=10) as sock:
        sock.sendall(b"POST /login HTTP/1.1\r\nHost: x\r\nContent-Type: application/"
                     b"x-www-form-urlencoded\r\nContent-Length: 314572800\r\n\r\n")
        sock.settimeout(5)
        answer = b""
        while more := sock.recv(65536):  # until the server closes it: nothing more is read
            answer += more
    assert answer.startswith(b"HTTP/1.1 413 "), answer
    assert b"connection: close" in answer.lower()
    assert b"16384 bytes" in answer  # the login form's limit, named


def test_a_body_within_the_limit_still_works(served: Served) -> None:
    response = requests.post(f"{served.url}/v1/units/u-none/cancel",
                             json={"reason": "r" * 400},
                             headers={"Authorization": f"Bearer {served.member}"}, timeout=10)
    assert response.status_code == 404 and "u-none" in response.text
    response = requests.post(f"{served.url}/v1/units/u-none/cancel", data=b"r" * 20_000,
                             headers={"Authorization": f"Bearer {served.member}",
                                      "Content-Type": "application/json"}, timeout=10)
    assert response.status_code == 413
    assert "over the server's limit of 16384 bytes" in response.json()["error"]["message"]


# --------------------------------------------------------------------------- no secret shown


def test_a_store_password_in_the_url_query_is_never_shown(postgres_url: str) -> None:
    # libpq takes the password as a query key too; SQLAlchemy's hide_password leaves it there
    secret = "hunter2-" + "x" * 8
    store = postgres_url + ("&" if "?" in postgres_url else "?") + f"password={secret}"
    tokens = {"mallory": "member", "olga": "operator"}
    with serving(store, tokens) as (server, output):
        seen = {}
        for name in tokens:
            answer = requests.get(f"{server.url}/v1/daemon", timeout=10, headers={
                "Authorization": f"Bearer {server.tokens[name]}"})
            assert answer.status_code == 200, answer.text
            assert secret not in answer.text
            seen[name] = answer.json()["store"]["location"]
    assert seen["mallory"] is None  # where the store is: operators only
    assert seen["olga"] is not None and "password=***" in seen["olga"]
    (log,) = output
    assert "password=***" in log and secret not in log  # the start-up banner


# --------------------------------------------------------------------------- input hygiene


def test_a_login_nonce_the_client_chose_is_refused(served: Served) -> None:
    web = requests.Session()
    web.cookies.set("idlegpu_login_csrf", "n0nce", path="/login")
    chosen = web.post(f"{served.url}/login", data={"csrf": "n0nce", "token": served.member},
                      allow_redirects=False, timeout=10)
    assert chosen.status_code == 403 and "CSRF" in chosen.text
    assert "idlegpu_session" not in chosen.cookies
    web.cookies.set("idlegpu_login_csrf", "\u00e9t\u00e9", path="/login")  # not even ASCII
    assert web.post(f"{served.url}/login", data={"csrf": "x", "token": served.member},
                    allow_redirects=False, timeout=10).status_code == 403


@pytest.mark.parametrize("body, field", [
    ({"description": "\ud800"}, "description"),
    ({"steps": [{"name": "train", "args": ["--lr", "\ud800"]}]}, "steps.0.args.1"),
    ({"env": {"FOO": "\udfff"}}, "env.FOO"),
])
def test_a_lone_surrogate_is_a_422_naming_the_field(served: Served, body: dict,
                                                    field: str) -> None:
    from api_server import job

    data = job(team="alignment", **body)
    # json.dumps writes "\ud800" as the escape a hostile client would send
    answer = requests.post(f"{served.url}/v1/requests", data=json.dumps(data), timeout=10,
                           headers={"Authorization": f"Bearer {served.member}",
                                    "Content-Type": "application/json"})
    assert answer.status_code == 422, answer.text
    error = answer.json()["error"]
    assert error["field"] == field and "surrogate" in error["message"]


def test_a_lone_surrogate_in_a_reason_is_a_422(served: Served) -> None:
    answer = requests.post(f"{served.url}/v1/units/u-1/cancel", timeout=10,
                           data='{"reason": "\\ud800"}',
                           headers={"Authorization": f"Bearer {served.member}",
                                    "Content-Type": "application/json"})
    assert answer.status_code == 422 and answer.json()["error"]["field"] == "reason"


def test_integer_parameters_past_what_the_store_holds_are_422_not_500(served: Served) -> None:
    answer = requests.get(f"{served.url}/v1/audit?offset=9223372036854775808", timeout=10,
                          headers={"Authorization": f"Bearer {served.member}"})
    assert answer.status_code == 422 and answer.json()["error"]["field"] == "offset"
    assert requests.get(f"{served.url}/healthz", timeout=5).status_code == 200


@pytest.mark.parametrize("body, field", [
    ({"env": {"FOO\n": "x"}}, "env"),
    ({"env_from": [{"config_map": "wandb", "prefix": "NVIDIA"}]}, "env_from.0.prefix"),
    ({"env_from": [{"secret": "wandb", "prefix": "N"}]}, "env_from.0.prefix"),
])
def test_names_are_matched_whole_and_no_prefix_can_make_nvidia_variables(
        served: Served, body: dict, field: str) -> None:
    from api_server import job

    answer = requests.post(f"{served.url}/v1/requests/validate", json=job(**body), timeout=10,
                           headers={"Authorization": f"Bearer {served.member}"})
    assert answer.status_code == 422, answer.text
    assert answer.json()["error"]["field"].startswith(field), answer.json()


def test_a_month_with_a_trailing_newline_is_no_month(served: Served) -> None:
    answer = requests.get(f"{served.url}/v1/reports/2026-01%0A", timeout=10,
                          headers={"Authorization": f"Bearer {served.member}"})
    assert answer.status_code in (404, 422), answer.text
    assert "2026-01\n" not in answer.text


# --------------------------------------------------------------------------- quotas


def _amplifying(i: int) -> dict:
    """About 10 KB of JSON that the store keeps 256 times: a 5 kB parameter templated into the
    args of each of 4 steps x 64 sweep members."""
    from api_server import IMAGE

    return {"name": f"amp-{i}", "team": "alignment", "kind": "sft", "image": IMAGE,
            "gpus": 1, "runtime_estimate": "1h", "parameters": {"blob": "b" * 5000},
            "steps": [{"name": f"s{k}", "args": ["{blob}", "{seed}"],
                       "sweep": {"seed": list(range(64))}} for k in range(4)]}


@pytest.mark.slow  # long (over 15 s): scripts/test.sh and CI run it, a plain pytest does not
def test_a_members_amplifying_requests_stop_at_the_quota(tmp_path) -> None:
    store = tmp_path / "jobs.db"
    with serving(f"sqlite:///{store}", {"mallory": "member", "vera": "member"}) as (server, _):
        headers = {"Authorization": f"Bearer {server.tokens['mallory']}"}
        codes, refusal = [], None
        for i in range(12):
            answer = requests.post(f"{server.url}/v1/requests", json=_amplifying(i),
                                   headers=headers, timeout=60)
            codes.append(answer.status_code)
            if answer.status_code == 429:
                refusal = answer.json()["error"]
                break
            assert answer.status_code == 201, answer.text
        assert refusal is not None, codes
        assert refusal["quota"]["name"] in ("stored_bytes", "live_units")
        assert refusal["quota"]["used"] + refusal["quota"]["asked"] > refusal["quota"]["limit"]
        assert "api.teams" in refusal["message"] and "frees" in refusal["message"]
        grown = store.stat().st_size / 1e6
        assert grown < 100, f"the store grew to {grown:.0f} MB"
        # another member of the same team is not held by mallory's use
        other = requests.post(f"{server.url}/v1/requests", json=_amplifying(99),
                              headers={"Authorization": f"Bearer {server.tokens['vera']}"},
                              timeout=60)
        assert other.status_code == 201, other.text


def test_requests_per_hour_and_a_users_override(tmp_path) -> None:
    """An operator's override (``api.users``) for one member; the refusal's Retry-After is
    when the oldest request of the hour leaves it."""
    from api_server import ApiServer, MovableClock, job
    from test_api_plan import settings_for, token

    from idlegpu.scheduler.adapters.store import JobStore
    from idlegpu.scheduler.config import ApiQuota
    from idlegpu.scheduler.server import create_server

    base = settings_for(tmp_path / "reports")
    settings = base.model_copy(update={"api": base.api.model_copy(update={
        "users": {"mallory": ApiQuota(requests_per_hour=3)}})})
    store = JobStore(f"sqlite:///{tmp_path / 'jobs.db'}")
    clock = MovableClock()
    server = ApiServer(create_server(settings, store, clock=clock)).start()
    try:
        mallory = {"Authorization": f"Bearer {token(store, 'mallory', 'alignment', 'member')}"}
        vera = {"Authorization": f"Bearer {token(store, 'vera', 'alignment', 'member')}"}
        for i in range(3):
            clock.advance(minutes=10)
            answer = requests.post(f"{server.url}/v1/requests", json=job(f"r{i}"),
                                   headers=mallory, timeout=30)
            assert answer.status_code == 201, answer.text
        refused = requests.post(f"{server.url}/v1/requests", json=job("r3"), headers=mallory,
                                timeout=30)
        assert refused.status_code == 429
        error = refused.json()["error"]
        assert error["quota"] == {"name": "requests_per_hour", "limit": 3, "used": 3,
                                  "asked": 1, "retry_after_s": 2400.0}
        assert refused.headers["retry-after"] == "2400"  # the first (at +10 min) leaves at +70
        assert "api.users.mallory" in error["message"]
        # vera keeps the team's default; mallory is free again once the first leaves the hour
        assert requests.post(f"{server.url}/v1/requests", json=job("v0"), headers=vera,
                             timeout=30).status_code == 201
        clock.advance(minutes=41)
        assert requests.post(f"{server.url}/v1/requests", json=job("r4"), headers=mallory,
                             timeout=30).status_code == 201
    finally:
        server.stop()
        store.close()


def _signed_in(served: Served, name: str) -> requests.Session:
    web = requests.Session()
    web.get(f"{served.url}/login", timeout=10)
    signed = web.post(f"{served.url}/login", allow_redirects=False, timeout=10, data={
        "csrf": web.cookies.get("idlegpu_login_csrf"), "token": served.tokens[name]})
    assert signed.status_code == 303, signed.text
    return web


def test_the_operators_page_bounds_its_page_and_shows_no_banner_from_the_address(
        served: Served) -> None:
    web = _signed_in(served, "olga")
    page = web.get(f"{served.url}/operators?page=99999999999999999999999", timeout=10)
    assert page.status_code == 200, page.text[-500:]
    forged = web.get(f"{served.url}/operators?notice=Your+token+expired%3A+paste+it+at+evil",
                     timeout=10)
    assert forged.status_code == 200 and "evil" not in forged.text
    real = web.get(f"{served.url}/operators?notice=paused", timeout=10)
    assert 'id="notice">admission paused<' in real.text
    for answer in (page, forged, real):  # every HTML answer: the policy and nosniff
        assert "frame-ancestors 'none'" in answer.headers["content-security-policy"]
        assert answer.headers["x-content-type-options"] == "nosniff"


def test_every_html_answer_gets_the_policy_and_json_gets_nosniff() -> None:
    import asyncio

    from idlegpu.scheduler.web.headers import CSP, SecurityHeaders

    def app_answering(kind: bytes, extra: list[tuple[bytes, bytes]]):
        async def app(scope, receive, send):
            await send({"type": "http.response.start", "status": 200,
                        "headers": [(b"content-type", kind), *extra]})
            await send({"type": "http.response.body", "body": b"x"})
        return app

    def headers_of(app) -> dict[bytes, bytes]:
        sent = []

        async def send(message):
            sent.append(message)

        async def receive():
            return {"type": "http.disconnect"}

        asyncio.run(SecurityHeaders(app)({"type": "http"}, receive, send))
        return dict(sent[0]["headers"])

    html = headers_of(app_answering(b"text/html; charset=utf-8", []))  # e.g. format=html
    assert html[b"content-security-policy"] == CSP.encode()
    assert html[b"x-content-type-options"] == b"nosniff"
    own = headers_of(app_answering(b"text/html", [(b"content-security-policy", b"mine")]))
    assert own[b"content-security-policy"] == b"mine"  # a route's own policy stands
    data = headers_of(app_answering(b"application/json", []))
    assert data[b"x-content-type-options"] == b"nosniff"
    assert b"content-security-policy" not in data


def test_the_client_behind_trusted_proxies_is_read_from_the_right() -> None:
    from idlegpu.scheduler.api.auth import Authenticator
    from idlegpu.scheduler.config import ApiConfig

    auth = Authenticator(ApiConfig(trusted_proxies=["10.8.0.0/16", "127.0.0.1/32"]), None)
    # the client wrote "1.2.3.4" itself; our ingress (10.8.0.7) saw 203.0.113.9 connect
    assert auth.forwarded_client("1.2.3.4, 203.0.113.9, 10.8.0.7") == "203.0.113.9"
    assert auth.forwarded_client("203.0.113.9") == "203.0.113.9"
    assert auth.forwarded_client("10.8.0.1, 10.8.0.7") is None  # only our own hops
    assert auth.forwarded_client("evil, 10.8.0.7") is None  # not an address: no client
    assert auth.forwarded_client(", ".join(["9.9.9.9"] * 10_000)) == "9.9.9.9"  # bounded
