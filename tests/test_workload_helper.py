"""The workload's checkpoint-notice helper (idlegpu.scheduler.workload.checkpoint) and the plain
training loop of examples/workloads/train_loop.py.

``RecordingApi`` below stands in for the job API only to check the helper's side of the
protocol (what it sends, how it takes each kind of answer); the real API is tested end to end
elsewhere, with the same training loop."""

from __future__ import annotations

import ast
import json
import logging
import os
import queue
import shutil
import signal
import ssl
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from idlegpu.scheduler.workload import checkpoint
from idlegpu.scheduler.workload.checkpoint import CheckpointAckError, Client

REPO = Path(__file__).resolve().parents[1]
HELPER = REPO / "scheduler" / "workload" / "checkpoint.py"
TRAIN_LOOP = REPO / "examples" / "workloads" / "train_loop.py"


class RecordingApi:
    """A stand-in for the job API's ``POST /v1/units/{unit}/checkpoint``: it records every
    request and answers from a script (``answers``: (status, body) pairs, used up in order),
    then 200 with a body like the real one's."""

    def __init__(self, *, tls: tuple[Path, Path] | None = None) -> None:
        self.requests: list[dict] = []
        self.answers: list[tuple[int, object]] = []
        self._changed = threading.Condition()
        api = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length)
                with api._changed:
                    api.requests.append({"path": self.path, "headers": dict(self.headers),
                                         "body": json.loads(raw or b"null")})
                    status, body = api.answers.pop(0) if api.answers else (200, None)
                    api._changed.notify_all()
                if body is None:
                    sent = api.requests[-1]["body"] or {}
                    body = {"unit": self.path.split("/")[3], "attempt": sent.get("attempt"),
                            "kind": sent.get("kind"), "recorded": True,
                            "stop": "within seconds" if sent.get("kind") == "checkpoint"
                            else None}
                data = body if isinstance(body, bytes) else json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, format: str, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        scheme = "http"
        if tls is not None:
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            context.load_cert_chain(*tls)
            self.server.socket = context.wrap_socket(self.server.socket, server_side=True)
            scheme = "https"
        self.url = f"{scheme}://127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, args=(0.05,),
                                        daemon=True)
        self._thread.start()

    def wait_for(self, kind: str, *, timeout: float = 30.0) -> dict:
        """The first request of ``kind`` (``checkpoint`` or ``progress``), waiting for it."""
        end = time.monotonic() + timeout
        with self._changed:
            while True:
                for request in self.requests:
                    if (request["body"] or {}).get("kind") == kind:
                        return request
                left = end - time.monotonic()
                if left <= 0:
                    raise AssertionError(f"no {kind} request in {timeout} s: {self.requests}")
                self._changed.wait(left)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def api() -> Iterator[RecordingApi]:
    server = RecordingApi()
    yield server
    server.close()


@pytest.fixture
def token_file(tmp_path: Path) -> Path:
    path = tmp_path / "token"
    path.write_text("token-one\n")
    return path


def make_client(tmp_path: Path, api_url: str | None, **settings: object) -> Client:
    defaults = {"api_url": api_url, "unit": "unit-abc-1", "attempt": 2,
                "token_file": tmp_path / "token", "request_file": tmp_path / "notice",
                "check_every_s": 0.0, "timeout_s": 5.0, "backoff_s": 0.05}
    return Client(**{**defaults, **settings})


def closed_port_url() -> str:
    server = ThreadingHTTPServer(("127.0.0.1", 0), BaseHTTPRequestHandler)
    port = server.server_address[1]
    server.server_close()
    return f"http://127.0.0.1:{port}"


# ------------------------------------------------------------------------------------------
# The notice file


@pytest.mark.parametrize(("content", "expected"), [
    ("2026-12-03T14:20:00Z", datetime(2026, 12, 3, 14, 20, tzinfo=UTC)),
    ("  2026-12-03T14:20:00Z\n", datetime(2026, 12, 3, 14, 20, tzinfo=UTC)),
    ("2026-12-03t14:20:00z", datetime(2026, 12, 3, 14, 20, tzinfo=UTC)),
    ("2026-12-03T23:20:00+09:00", datetime(2026, 12, 3, 14, 20, tzinfo=UTC)),
    ("2026-12-03T13:50:00-00:30", datetime(2026, 12, 3, 14, 20, tzinfo=UTC)),
    ("2026-12-03T14:20:00.123456789Z", datetime(2026, 12, 3, 14, 20, 0, 123456, tzinfo=UTC)),
    ("2026-12-03T14:20:00.5+00:00", datetime(2026, 12, 3, 14, 20, 0, 500000, tzinfo=UTC)),
])
def test_a_notice_reads_as_its_deadline_in_utc(tmp_path, content, expected):
    (tmp_path / "notice").write_text(content)
    deadline = make_client(tmp_path, None).checkpoint_requested()
    assert deadline == expected
    assert deadline.utcoffset() == timedelta(0)


@pytest.mark.parametrize("content", [None, "", "  \n"])
def test_a_missing_or_empty_file_is_no_notice(tmp_path, content):
    if content is not None:
        (tmp_path / "notice").write_text(content)
    client = make_client(tmp_path, None)
    assert client.checkpoint_requested() is None
    assert client.notice_pending() is None


@pytest.mark.parametrize("content", ["soon", "2026-13-03T14:20:00Z", "2026-12-03T14:20:00",
                                     "\x00\xff garbage"])
def test_garbage_is_a_notice_due_now_with_one_warning(tmp_path, caplog, content):
    (tmp_path / "notice").write_bytes(content.encode("latin-1"))
    client = make_client(tmp_path, None)
    with caplog.at_level(logging.WARNING, logger="idlegpu.checkpoint"):
        before = datetime.now(UTC)
        first = client.checkpoint_requested()
        again = [client.checkpoint_requested() for _ in range(3)]
    assert first is not None and before <= first <= datetime.now(UTC)
    assert again == [first] * 3
    warnings = [r for r in caplog.records if "not an RFC 3339 deadline" in r.getMessage()]
    assert len(warnings) == 1


def test_the_file_is_read_at_most_once_per_interval(tmp_path):
    notice = tmp_path / "notice"
    client = make_client(tmp_path, None, check_every_s=0.5)
    assert client.checkpoint_requested() is None
    notice.write_text("2026-12-03T14:20:00Z")
    assert client.checkpoint_requested() is None  # within the interval: the last reading
    time.sleep(0.6)
    assert client.checkpoint_requested() == datetime(2026, 12, 3, 14, 20, tzinfo=UTC)
    notice.write_text("")
    time.sleep(0.6)
    assert client.checkpoint_requested() is None


def test_an_acknowledged_notice_is_no_longer_pending_and_a_new_one_is(tmp_path, api,
                                                                       token_file):
    notice = tmp_path / "notice"
    notice.write_text("2026-12-03T14:20:00Z")
    client = make_client(tmp_path, api.url)
    assert client.notice_pending() is not None
    previous = signal.getsignal(signal.SIGTERM)
    try:
        client.acknowledge(5, "/ckpt/5")
        assert client.checkpoint_requested() is not None
        assert client.notice_pending() is None
        notice.write_text("2026-12-03T15:00:00Z")
        assert client.notice_pending() == datetime(2026, 12, 3, 15, tzinfo=UTC)
    finally:
        signal.signal(signal.SIGTERM, previous)


# ------------------------------------------------------------------------------------------
# Reports


def test_an_acknowledgement_posts_the_protocols_body(tmp_path, api, token_file):
    client = make_client(tmp_path, api.url + "/", unit="unit-abc-1")
    saved_at = datetime(2026, 12, 3, 23, 19, 30, 250000).astimezone(UTC)
    answer = client.acknowledge(12, tmp_path / "ckpt" / "step-12", saved_at=saved_at)
    assert answer == {"unit": "unit-abc-1", "attempt": 2, "kind": "checkpoint",
                      "recorded": True, "stop": "within seconds"}
    (request,) = api.requests
    assert request["path"] == "/v1/units/unit-abc-1/checkpoint"
    assert request["headers"]["Authorization"] == "Bearer token-one"
    assert request["headers"]["Content-Type"] == "application/json"
    assert request["body"] == {"kind": "checkpoint", "step": 12,
                               "path": str(tmp_path / "ckpt" / "step-12"),
                               "saved_at": saved_at.strftime("%Y-%m-%dT%H:%M:%S.250Z"),
                               "attempt": 2}


def test_without_an_attempt_the_body_leaves_it_out(tmp_path, api, token_file):
    client = make_client(tmp_path, api.url, attempt=None)
    client.acknowledge(1, "p")
    assert client.report_progress(1, every_s=0)
    assert [sorted(r["body"]) for r in api.requests] == [
        ["kind", "path", "saved_at", "step"], ["at", "kind", "step"]]
    env = {"IDLEGPU_API_URL": api.url, "IDLEGPU_UNIT": "u", "IDLEGPU_ATTEMPT": ""}
    assert Client.from_env(env).attempt is None
    assert Client.from_env({**env, "IDLEGPU_ATTEMPT": "3"}).attempt == 3
    with pytest.raises(checkpoint.CheckpointError, match="IDLEGPU_ATTEMPT='x'"):
        Client.from_env({**env, "IDLEGPU_ATTEMPT": "x"})


def test_the_unit_is_quoted_into_the_path_and_odd_answers_are_empty_dicts(tmp_path, api,
                                                                          token_file):
    api.answers = [(200, b"not json"), (200, b"[1, 2]")]
    client = make_client(tmp_path, api.url, unit="a/b c")
    assert client.acknowledge(0, "p") == {}
    assert client.acknowledge(0, "p") == {}
    assert api.requests[0]["path"] == "/v1/units/a%2Fb%20c/checkpoint"


def test_https_verifies_the_api_against_the_ca_file(tmp_path, token_file):
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
                    "-keyout", str(key), "-out", str(cert), "-subj", "/CN=127.0.0.1",
                    "-addext", "subjectAltName=IP:127.0.0.1"],
                   check=True, capture_output=True, timeout=60)
    api = RecordingApi(tls=(cert, key))
    try:
        with pytest.raises(CheckpointAckError, match="does not verify.*IDLEGPU_CA_FILE"):
            make_client(tmp_path, api.url, ack_tries=5).acknowledge(1, "p")
        with pytest.raises(CheckpointAckError, match="cannot load the CA bundle"):
            make_client(tmp_path, api.url, ca_file=tmp_path / "absent.pem").acknowledge(1, "p")
        assert api.requests == []  # not retried, and nothing sent
        assert make_client(tmp_path, api.url, ca_file=cert).acknowledge(1, "p")["recorded"]
        assert len(api.requests) == 1
    finally:
        api.close()


def test_the_token_is_read_fresh_for_every_request(tmp_path, api, token_file):
    client = make_client(tmp_path, api.url)
    client.acknowledge(1, "p1")
    token_file.write_text("token-two")  # the kubelet rotated it
    assert client.report_progress(2, every_s=0)
    assert [r["headers"]["Authorization"] for r in api.requests] == [
        "Bearer token-one", "Bearer token-two"]


def test_a_4xx_raises_its_message_and_field_without_retrying(tmp_path, api, token_file):
    api.answers = [(422, {"error": {"message": "must be at least 0", "field": "step"}})]
    with pytest.raises(CheckpointAckError, match="must be at least 0") as raised:
        make_client(tmp_path, api.url).acknowledge(3, "p")
    assert (raised.value.status, raised.value.field) == (422, "step")
    assert "(field step)" in str(raised.value) and "422" in str(raised.value)
    assert len(api.requests) == 1


def test_5xx_answers_are_retried_with_backoff_until_one_succeeds(tmp_path, api, token_file):
    api.answers = [(503, {"error": {"message": "store unavailable"}}), (500, b"oops")]
    started = time.monotonic()
    answer = make_client(tmp_path, api.url, backoff_s=0.1).acknowledge(7, "p")
    assert answer["recorded"] is True
    assert len(api.requests) == 3
    assert time.monotonic() - started >= 0.1 + 0.2  # the backoff doubled


def test_lasting_5xx_give_up_after_the_tries_and_a_dead_api_within_the_budget(
        tmp_path, api, token_file):
    api.answers = [(503, {"error": {"message": "store unavailable"}})] * 10
    with pytest.raises(CheckpointAckError, match="after 3 tries.*store unavailable") as raised:
        make_client(tmp_path, api.url, ack_tries=3).acknowledge(7, "p")
    assert raised.value.status == 503 and len(api.requests) == 3

    started = time.monotonic()
    with pytest.raises(CheckpointAckError, match="failed after"):
        make_client(tmp_path, closed_port_url(), ack_tries=100, ack_budget_s=1.0,
                    backoff_s=0.2).acknowledge(7, "p")
    assert time.monotonic() - started < 3.0


def test_a_missing_token_or_api_raises_a_clear_error(tmp_path, api):
    with pytest.raises(CheckpointAckError, match="cannot read the token file"):
        make_client(tmp_path, api.url).acknowledge(1, "p")
    with pytest.raises(CheckpointAckError, match="IDLEGPU_API_URL"):
        make_client(tmp_path, None).acknowledge(1, "p")
    assert api.requests == []


def test_bad_arguments_are_refused_before_sending(tmp_path, api, token_file):
    client = make_client(tmp_path, api.url)
    for step in (-1, 1.5, True):
        with pytest.raises(ValueError, match="step"):
            client.acknowledge(step, "p")
    with pytest.raises(ValueError, match="at most 1024"):
        client.acknowledge(1, "x" * 1025)
    with pytest.raises(ValueError, match="4096"):
        client.acknowledge(1, "\U0001f600" * 1024)
    assert api.requests == []


def test_progress_is_rate_limited(tmp_path, api, token_file):
    client = make_client(tmp_path, api.url)
    assert client.report_progress(1, every_s=0.5) is True
    assert [client.report_progress(s, every_s=0.5) for s in (2, 3, 4)] == [False] * 3
    time.sleep(0.6)
    assert client.report_progress(5, every_s=0.5) is True
    assert [r["body"]["step"] for r in api.requests] == [1, 5]
    body = api.requests[0]["body"]
    assert body["kind"] == "progress" and body["attempt"] == 2
    assert datetime.fromisoformat(body["at"]) <= datetime.now(UTC)


def test_a_failing_progress_report_returns_false_and_never_raises(tmp_path, api, token_file,
                                                                   caplog):
    api.answers = [(500, b"")] * 2 + [(400, {"error": {"message": "no", "field": "at"}})]
    client = make_client(tmp_path, api.url)
    with caplog.at_level(logging.WARNING, logger="idlegpu.checkpoint"):
        assert client.report_progress(1, every_s=0) is False  # 2 tries, both 500
        assert client.report_progress(2, every_s=0) is False  # 400
        assert make_client(tmp_path, closed_port_url()).report_progress(3, every_s=0) is False
        token_file.unlink()
        assert client.report_progress(4, every_s=0) is False
        assert make_client(tmp_path, None).report_progress(5, every_s=0) is False
    assert len(api.requests) == 3
    assert any("no (field at)" in r.getMessage() for r in caplog.records)


# ------------------------------------------------------------------------------------------
# The stop


def run_python(code: str, tmp_path: Path) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", code], cwd=tmp_path, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def wait_line(process: subprocess.Popen, expected: str, timeout: float = 30) -> None:
    lines: queue.Queue[str] = queue.Queue()
    threading.Thread(target=lambda: lines.put(process.stdout.readline()), daemon=True).start()
    assert lines.get(timeout=timeout).strip() == expected


def test_wait_for_stop_returns_false_when_no_stop_comes(tmp_path):
    previous = signal.getsignal(signal.SIGTERM)
    started = time.monotonic()
    assert make_client(tmp_path, None).wait_for_stop(timeout=0.3) is False
    assert 0.3 <= time.monotonic() - started < 2
    assert signal.getsignal(signal.SIGTERM) is previous


@pytest.mark.parametrize("their_handler", [
    "",
    # a framework's that would swallow it, or turn it into exit 0 as Lightning's does
    "signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))\n",
])
def test_sigterm_ends_the_waiting_process_by_the_signal(tmp_path, their_handler):
    process = run_python(
        "import signal, sys\n"
        "from idlegpu.scheduler.workload.checkpoint import wait_for_stop\n"
        f"{their_handler}"
        "print('waiting', flush=True)\n"
        "print('unflushed line')\n"
        "wait_for_stop()\n"
        "sys.exit(0)\n", tmp_path)
    wait_line(process, "waiting")
    time.sleep(0.3)
    process.send_signal(signal.SIGTERM)
    assert process.wait(timeout=30) == -signal.SIGTERM
    # through the stream that read the first line: communicate() would skip what it buffered
    assert process.stdout.read() == "unflushed line\n"


def test_wait_for_stop_can_hand_the_stop_back_to_the_caller(tmp_path):
    process = run_python(
        "import sys\n"
        "from idlegpu.scheduler.workload.checkpoint import wait_for_stop\n"
        "print('waiting', flush=True)\n"
        "sys.exit(3 if wait_for_stop(timeout=60, exit_on_stop=False) else 4)\n", tmp_path)
    wait_line(process, "waiting")
    time.sleep(0.3)
    process.send_signal(signal.SIGTERM)
    process.communicate(timeout=30)
    assert process.returncode == 3


def test_after_acknowledging_a_notice_sigterm_ends_the_process_at_once(tmp_path, api,
                                                                       token_file):
    (tmp_path / "notice").write_text("2026-12-03T14:20:00Z")
    env = {**os.environ, "IDLEGPU_API_URL": api.url, "IDLEGPU_UNIT": "u1",
           "IDLEGPU_ATTEMPT": "1", "IDLEGPU_TOKEN_FILE": str(token_file),
           "IDLEGPU_CHECKPOINT_REQUEST_FILE": str(tmp_path / "notice")}
    code = ("import signal, sys, time\n"
            "from idlegpu.scheduler.workload import checkpoint\n"
            "signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))  # as Lightning's would\n"
            "assert checkpoint.notice_pending()\n"
            "checkpoint.acknowledge(3, '/ckpt/3')\n"
            "print('acknowledged', flush=True)\n"
            "time.sleep(60)  # still tearing the training down: no wait_for_stop yet\n")
    process = subprocess.Popen([sys.executable, "-c", code], cwd=tmp_path, env=env, text=True,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    wait_line(process, "acknowledged")
    process.send_signal(signal.SIGTERM)
    process.communicate(timeout=30)
    assert process.returncode == -signal.SIGTERM


# ------------------------------------------------------------------------------------------
# One file, standard library only


def test_the_helper_alone_imports_only_the_standard_library(tmp_path):
    shutil.copy(HELPER, tmp_path / "idlegpu_checkpoint.py")
    probe = (
        "import sys\n"
        f"sys.path[:] = [{str(tmp_path)!r}] + [p for p in sys.path if 'site-packages' not in p]\n"
        "import idlegpu_checkpoint as helper\n"
        "outside = sorted(m for m in sys.modules if m.split('.')[0] not in\n"
        "                 sys.stdlib_module_names | {'__main__', 'idlegpu_checkpoint'})\n"
        "assert not outside, outside\n"
        "assert helper.Client.from_env({}).checkpoint_requested() is None\n"
        "print('ok')\n")
    ran = subprocess.run([sys.executable, "-I", "-S", "-c", probe], cwd=tmp_path,
                         capture_output=True, text=True, timeout=60, check=False)
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout == "ok\n"


def test_the_installed_helper_pulls_in_nothing_outside_the_standard_library(tmp_path):
    probe = (
        "import sys\n"
        "before = set(sys.modules)\n"
        "import idlegpu.scheduler.workload.checkpoint\n"
        "outside = sorted(m for m in set(sys.modules) - before if m.split('.')[0] not in\n"
        "                 sys.stdlib_module_names | {'idlegpu'})\n"
        "print(outside)\n")
    ran = subprocess.run([sys.executable, "-c", probe], cwd=tmp_path, capture_output=True,
                         text=True, timeout=60, check=False)
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout == "[]\n"


def test_the_helper_has_no_imports_of_its_package():
    tree = ast.parse(HELPER.read_text(encoding="utf-8"))
    imported = [node.module or "" for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)]
    imported += [a.name for node in ast.walk(tree) if isinstance(node, ast.Import)
                 for a in node.names]
    assert all(name.split(".")[0] in sys.stdlib_module_names | {"__future__"}
               for name in imported), imported
    assert not [n for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.level]


# ------------------------------------------------------------------------------------------
# examples/workloads/train_loop.py


class Lines:
    """A process's stdout, line by line, with a timeout on each wait."""

    def __init__(self, process: subprocess.Popen) -> None:
        self.process = process
        self.seen: list[str] = []
        self._queue: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        for line in self.process.stdout:
            self._queue.put(line.rstrip("\n"))
        self._queue.put(None)

    def expect(self, prefix: str, timeout: float = 30) -> str:
        end = time.monotonic() + timeout
        while True:
            try:
                line = self._queue.get(timeout=max(0.0, end - time.monotonic()))
            except queue.Empty:
                raise AssertionError(f"no {prefix!r} line in {timeout} s: {self.seen}") from None
            if line is None:
                raise AssertionError(f"the process ended before a {prefix!r} line: {self.seen}"
                                     f"\n{self.process.stderr.read()}")
            self.seen.append(line)
            if line.startswith(prefix):
                return line


def fields(line: str) -> dict[str, str]:
    return dict(part.split("=", 1) for part in line.split() if "=" in part)


def train_loop(tmp_path: Path, api: RecordingApi, *args: str) -> tuple[subprocess.Popen, Lines]:
    env = {**os.environ, "IDLEGPU_API_URL": api.url, "IDLEGPU_UNIT": "sft-7b-u3",
           "IDLEGPU_ATTEMPT": "2", "IDLEGPU_TOKEN_FILE": str(tmp_path / "token"),
           "IDLEGPU_CHECKPOINT_REQUEST_FILE": str(tmp_path / "notice")}
    process = subprocess.Popen(
        [sys.executable, str(TRAIN_LOOP), "--checkpoint-dir", str(tmp_path / "ckpt"), *args],
        cwd=tmp_path, env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    return process, Lines(process)


def test_the_training_loop_saves_acknowledges_is_stopped_and_resumes(tmp_path, api,
                                                                     token_file):
    process, lines = train_loop(tmp_path, api, "--steps", "1000", "--step-seconds", "0.02",
                                "--progress-every", "0.2")
    try:
        lines.expect("started step=0")
        lines.expect("progress step=")
        api.wait_for("progress")
        deadline = datetime.now(UTC).replace(microsecond=0) + timedelta(minutes=2)
        (tmp_path / "notice").write_text(deadline.strftime("%Y-%m-%dT%H:%M:%SZ"))
        assert datetime.fromisoformat(fields(lines.expect("notice"))["deadline"]) == deadline
        saved = fields(lines.expect("saved step="))
        assert fields(lines.expect("acknowledged step="))["step"] == saved["step"]
        lines.expect("waiting for stop")
        ack = api.wait_for("checkpoint")["body"]
        assert (ack["step"], ack["path"], ack["attempt"]) == (int(saved["step"]), saved["path"],
                                                              2)
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=30)
    finally:
        process.kill()
    assert process.returncode == -signal.SIGTERM
    step = int(saved["step"])
    assert json.loads(Path(saved["path"]).read_text())["step"] == step
    assert [p.name for p in (tmp_path / "ckpt").iterdir()] == ["checkpoint.json"]

    (tmp_path / "notice").write_text("")  # the next attempt starts without a notice
    process, lines = train_loop(tmp_path, api, "--resume", saved["path"], "--steps",
                                str(step + 5), "--step-seconds", "0.01")
    assert lines.expect("resumed") == f"resumed step={step} path={saved['path']}"
    assert lines.expect("done") == f"done step={step + 5}"
    assert process.wait(timeout=30) == 0


def test_the_training_loop_trains_on_when_no_stop_comes(tmp_path, api, token_file):
    (tmp_path / "notice").write_text("2026-12-03T14:20:00Z")
    process, lines = train_loop(tmp_path, api, "--steps", "20", "--step-seconds", "0.01",
                                "--stop-timeout", "0.3", "--checkpoint-every", "5")
    lines.expect("acknowledged step=1")
    lines.expect("no stop came: training on")
    assert lines.expect("done") == "done step=20"
    assert process.wait(timeout=30) == 0
    kinds = [(r["body"]["kind"], r["body"]["step"]) for r in api.requests
             if r["body"]["kind"] == "checkpoint"]
    # the notice answered once, then the periodic checkpoints reported
    assert kinds == [("checkpoint", 1), ("checkpoint", 5), ("checkpoint", 10),
                     ("checkpoint", 15), ("checkpoint", 20)]
    assert len([line for line in lines.seen if line.startswith("notice")]) == 1


def test_the_training_loop_without_idlegpu_just_trains(tmp_path):
    ran = subprocess.run([sys.executable, str(TRAIN_LOOP), "--steps", "3", "--step-seconds",
                          "0", "--checkpoint-dir", str(tmp_path / "c"), "--checkpoint-every",
                          "2"], cwd=tmp_path, capture_output=True, text=True, timeout=60,
                         check=False,
                         env={k: v for k, v in os.environ.items()
                              if not k.startswith("IDLEGPU_")})
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.splitlines()[0] == "started step=0"
    assert ran.stdout.splitlines()[-1] == "done step=3"
    assert "saved step=2" in ran.stdout
