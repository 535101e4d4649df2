"""Checkpoint notices, the workload's side: standard library only, one file.

Before a planned stop the idlegpu daemon writes a deadline into the pod's notice file; the
workload saves, acknowledges, stops training and waits to be stopped (SIGTERM within seconds),
losing nothing. Without a notice nothing changes: every call here is then a cheap no-op.

This file imports nothing outside the standard library and nothing of its package, so an image
can carry it alone, copied as ``idlegpu_checkpoint.py``::

    from idlegpu_checkpoint import acknowledge, notice_pending, report_progress, wait_for_stop

    for step in range(start, steps):
        train_one_step()
        report_progress(step)                  # rate-limited: fine to call every step
        if notice_pending():                   # throttled file read: fine to call every step
            path = save_checkpoint(step)
            acknowledge(step, path)
            wait_for_stop(timeout=600)         # ends the process at SIGTERM; never exit 0 here
            # False: no stop came (the daemon may be down); training goes on

The module-level functions use one :class:`Client` built from the environment that idlegpu's
Job template sets (``IDLEGPU_API_URL``, ``IDLEGPU_UNIT``, ``IDLEGPU_ATTEMPT``,
``IDLEGPU_TOKEN_FILE``, ``IDLEGPU_CA_FILE``, ``IDLEGPU_CHECKPOINT_REQUEST_FILE``); build a
``Client`` yourself for other settings.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import logging
import os
import re
import signal
import ssl
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from datetime import datetime, timedelta, timezone

__all__ = [
    "CheckpointAckError",
    "CheckpointError",
    "Client",
    "acknowledge",
    "checkpoint_requested",
    "default_client",
    "end_on_sigterm",
    "notice_pending",
    "report_progress",
    "wait_for_stop",
]

log = logging.getLogger("idlegpu.checkpoint")

DEFAULT_REQUEST_FILE = "/etc/idlegpu/checkpoint-request"
DEFAULT_TOKEN_FILE = "/var/run/secrets/idlegpu/token"
MAX_BODY_BYTES = 4096
MAX_PATH_CHARS = 1024
# a deadline is a short line; anything longer is not one, and is not read whole
_MAX_NOTICE_BYTES = 4096
_RFC3339 = re.compile(
    r"(\d{4})-(\d{2})-(\d{2})[Tt ](\d{2}):(\d{2}):(\d{2})(?:\.(\d+))?([Zz]|[+-]\d{2}:\d{2})")
_EXIT_BY_SIGTERM = 128 + signal.SIGTERM
# datetime.UTC is 3.11's: an image's Python may be older
_UTC = timezone.utc  # noqa: UP017


class CheckpointError(Exception):
    """Base of this module's errors."""


class CheckpointAckError(CheckpointError):
    """A checkpoint report was refused (4xx: ``status``, ``message``, ``field``) or could not
    be delivered (connection errors or 5xx after the retries: ``status`` is the last 5xx or
    None). The checkpoint itself is saved; only the daemon does not know about it."""

    def __init__(self, message: str, *, status: int | None = None, field: str | None = None):
        super().__init__(message)
        self.message = message
        self.status = status
        self.field = field


class _Retryable(Exception):
    def __init__(self, reason: str, status: int | None = None, retry_after_s: float | None = None):
        super().__init__(reason)
        self.status = status
        self.retry_after_s = retry_after_s


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    # a redirect would resend the bearer token to wherever it points (and turn the POST into
    # a GET): it surfaces as the 3xx it is
    def redirect_request(self, req, fp, code, msg, headers, newurl):
        return None


def parse_deadline(text: str) -> datetime | None:
    """An RFC 3339 time (any offset, any fractional digits) as an aware UTC datetime, or None
    when ``text`` is not one."""
    match = _RFC3339.fullmatch(text.strip())
    if match is None:
        return None
    year, month, day, hour, minute, second = (int(g) for g in match.groups()[:6])
    fraction, offset = match.group(7), match.group(8)
    micro = int((fraction or "0")[:6].ljust(6, "0"))
    try:
        # RFC 3339 allows a leap second (:60), datetime does not
        when = datetime(year, month, day, hour, minute, min(second, 59), micro)
    except ValueError:
        return None
    if offset in ("Z", "z"):
        tz = _UTC
    else:
        hours, minutes = int(offset[1:3]), int(offset[4:6])
        if hours > 23 or minutes > 59:
            return None
        sign = 1 if offset[0] == "+" else -1
        tz = timezone(sign * timedelta(hours=hours, minutes=minutes))
    return when.replace(tzinfo=tz).astimezone(_UTC)


def _rfc3339(when: datetime) -> str:
    # a naive time is taken as local time, as datetime.astimezone does
    utc = when.astimezone(_UTC)
    return utc.strftime("%Y-%m-%dT%H:%M:%S.") + f"{utc.microsecond // 1000:03d}Z"


def _check_step(step: object) -> int:
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise ValueError(f"step must be an integer >= 0, not {step!r}")
    return step


class Client:
    """The settings of one workload (unit, attempt, API address, token and notice files) and
    what it remembers between calls: the last notice read, the notices answered, the time of
    the last progress report.

    ``check_every_s`` throttles reads of the notice file (the kubelet refreshes it about once
    a minute anyway); ``timeout_s`` bounds each HTTP request; an acknowledgement is tried up
    to ``ack_tries`` times within ``ack_budget_s`` seconds, a progress report up to
    ``progress_tries`` within ``progress_budget_s`` (it blocks the training loop meanwhile).
    """

    def __init__(
        self,
        *,
        api_url: str | None = None,
        unit: str | None = None,
        attempt: int | None = None,
        token_file: str = DEFAULT_TOKEN_FILE,
        request_file: str = DEFAULT_REQUEST_FILE,
        ca_file: str | None = None,
        check_every_s: float = 1.0,
        timeout_s: float = 10.0,
        ack_tries: int = 5,
        ack_budget_s: float = 60.0,
        progress_tries: int = 2,
        progress_budget_s: float = 5.0,
        backoff_s: float = 0.5,
    ):
        if api_url is not None and not api_url.startswith(("http://", "https://")):
            raise CheckpointError(f"the API address {api_url!r} must start with http:// or "
                                  "https://")
        self.api_url = api_url.rstrip("/") if api_url else None
        self.unit = unit or None
        self.attempt = int(attempt) if attempt is not None else None
        self.token_file = str(token_file)
        self.request_file = str(request_file)
        self.ca_file = str(ca_file) if ca_file else None
        self.check_every_s = float(check_every_s)
        self.timeout_s = float(timeout_s)
        self.ack_tries = max(1, int(ack_tries))
        self.ack_budget_s = float(ack_budget_s)
        self.progress_tries = max(1, int(progress_tries))
        self.progress_budget_s = float(progress_budget_s)
        self.backoff_s = float(backoff_s)
        self._lock = threading.Lock()
        self._read_at: float | None = None
        self._notice_text = ""
        self._notice: datetime | None = None
        self._answered: set[datetime] = set()
        self._warned: set[str] = set()
        self._progress_at: float | None = None
        self._opener: urllib.request.OpenerDirector | None = None

    @classmethod
    def from_env(cls, environ: dict[str, str] | None = None, **overrides: object) -> Client:
        """A client from idlegpu's Job environment; ``overrides`` replace any setting."""
        env = os.environ if environ is None else environ
        attempt_text = env.get("IDLEGPU_ATTEMPT", "").strip()
        try:
            attempt = int(attempt_text) if attempt_text else None
        except ValueError:
            raise CheckpointError(f"IDLEGPU_ATTEMPT={attempt_text!r} is not an integer") from None
        settings: dict[str, object] = {
            "api_url": env.get("IDLEGPU_API_URL") or None,
            "unit": env.get("IDLEGPU_UNIT") or None,
            "attempt": attempt,
            "token_file": env.get("IDLEGPU_TOKEN_FILE") or DEFAULT_TOKEN_FILE,
            "request_file": env.get("IDLEGPU_CHECKPOINT_REQUEST_FILE") or DEFAULT_REQUEST_FILE,
            "ca_file": env.get("IDLEGPU_CA_FILE") or None,
        }
        settings.update(overrides)
        return cls(**settings)  # type: ignore[arg-type]

    # ---------------------------------------------------------------------------------------
    # The notice

    def checkpoint_requested(self) -> datetime | None:
        """The deadline of the current notice (aware, UTC), or None without one.

        Reads the file at most once per ``check_every_s``. Content that is not an RFC 3339
        time is still a notice (the safe reading: checkpoint now); its deadline is then the
        moment it was first read, and a warning is logged once."""
        with self._lock:
            now = time.monotonic()
            if self._read_at is not None and now - self._read_at < self.check_every_s:
                return self._notice
            self._read_at = now
            text = self._read_notice_file()
            if text != self._notice_text:
                self._notice_text = text
                self._notice = self._deadline_of(text)
            return self._notice

    def notice_pending(self) -> datetime | None:
        """The deadline of a notice this process has not answered yet (no
        :meth:`acknowledge` since it appeared), or None."""
        deadline = self.checkpoint_requested()
        return None if deadline is None or deadline in self._answered else deadline

    def _read_notice_file(self) -> str:
        try:
            with open(self.request_file, "rb") as notice:
                raw = notice.read(_MAX_NOTICE_BYTES)
        except FileNotFoundError:
            return ""
        except OSError as exc:
            # unknowable is not a notice: stopping a healthy training on a permission error
            # would lose more than it saves
            self._warn_once(f"read:{exc.errno}", "cannot read the checkpoint notice file %s "
                            "(%s); going on as if there were no notice", self.request_file, exc)
            return ""
        return raw.decode("utf-8", errors="replace").strip()

    def _deadline_of(self, text: str) -> datetime | None:
        if not text:
            return None
        deadline = parse_deadline(text)
        if deadline is None:
            deadline = datetime.now(_UTC)
            self._warn_once(f"garbage:{text}", "the checkpoint notice file %s holds %r, not an "
                            "RFC 3339 deadline; checkpointing now to be safe",
                            self.request_file, text[:80])
        return deadline

    def _warn_once(self, key: str, message: str, *args: object) -> None:
        if key not in self._warned:
            self._warned.add(key)
            log.warning(message, *args)

    # ---------------------------------------------------------------------------------------
    # Reports

    def acknowledge(self, step: int, path: str | os.PathLike[str],
                    saved_at: datetime | None = None) -> dict:
        """Report a saved checkpoint: the answer to a notice, or a plain periodic report.

        Returns the API's answer (every field optional; ``"stop": "within seconds"`` when a
        stop follows). Raises :class:`CheckpointAckError` when the API refuses it (4xx, not
        retried) or cannot be reached (5xx and connection errors, retried with backoff
        within ``ack_budget_s``). Either way the current notice counts as answered, so a
        caller that goes on training does not checkpoint for it again on every step.

        Once a notice is acknowledged, SIGTERM ends the process at once (see
        :func:`end_on_sigterm`): the work is saved, and a framework's own handler would only
        save again or, as Lightning's does, exit 0."""
        step = _check_step(step)
        path = os.fspath(path)
        if not isinstance(path, str) or not path:
            raise ValueError(f"path must be a non-empty string, not {path!r}")
        if len(path) > MAX_PATH_CHARS:
            raise ValueError(f"path is {len(path)} characters long; the API takes at most "
                             f"{MAX_PATH_CHARS}")
        notice = self.checkpoint_requested()
        body = {"kind": "checkpoint", "step": step, "path": path,
                "saved_at": _rfc3339(saved_at or datetime.now(_UTC))}
        try:
            answer = self._post(body, tries=self.ack_tries, budget_s=self.ack_budget_s)
        finally:
            if notice is not None:
                self._answered.add(notice)
        if notice is not None:
            end_on_sigterm()
        return answer

    def acknowledge_or_warn(self, step: int, path: str | os.PathLike[str], *,
                            raise_on_error: bool = False) -> tuple[dict | None,
                                                                   CheckpointAckError | None]:
        """:meth:`acknowledge`, for callers that train on when it fails (the stop comes at
        the deadline, blind): ``(answer, None)``, or ``(None, error)`` with a warning logged;
        ``raise_on_error`` raises instead."""
        try:
            return self.acknowledge(step, path), None
        except CheckpointAckError as exc:
            if raise_on_error:
                raise
            log.warning("checkpoint notice: saved %s but could not acknowledge it (%s); "
                        "training on", os.fspath(path), exc)
            return None, exc

    def report_progress(self, step: int, *, every_s: float = 60.0) -> bool:
        """Report the training step at most once per ``every_s`` seconds; True when a report
        went out and was accepted. Never raises for the API's sake: a failure is logged and
        returns False (the next report is due ``every_s`` later all the same)."""
        try:
            step = _check_step(step)
        except ValueError as exc:
            self._warn_once("progress:step", "progress report skipped: %s", exc)
            return False
        now = time.monotonic()
        if self._progress_at is not None and now - self._progress_at < every_s:
            return False
        self._progress_at = now
        if self.api_url is None or self.unit is None:
            self._warn_once("progress:unset", "no IDLEGPU_API_URL/IDLEGPU_UNIT: progress "
                            "reports are off (fine outside idlegpu)")
            return False
        body = {"kind": "progress", "step": step, "at": _rfc3339(datetime.now(_UTC))}
        try:
            self._post(body, tries=self.progress_tries, budget_s=self.progress_budget_s)
        except CheckpointAckError as exc:
            log.warning("progress report for step %d failed: %s", step, exc)
            return False
        except Exception as exc:  # noqa: BLE001 - training never dies of a progress report
            log.warning("progress report for step %d failed unexpectedly: %r", step, exc)
            return False
        return True

    def _post(self, body: dict, *, tries: int, budget_s: float) -> dict:
        if self.api_url is None or self.unit is None:
            raise CheckpointAckError("IDLEGPU_API_URL and IDLEGPU_UNIT must both be set to "
                                     "report a checkpoint")
        if self.attempt is not None:
            # the API checks it against the pod's own attempt; left out, it takes the pod's
            body["attempt"] = self.attempt
        data = json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
        if len(data) > MAX_BODY_BYTES:
            raise ValueError(f"the report is {len(data)} bytes; the API takes at most "
                             f"{MAX_BODY_BYTES} (shorten the path)")
        url = f"{self.api_url}/v1/units/{urllib.parse.quote(self.unit, safe='')}/checkpoint"
        started = time.monotonic()
        delay = self.backoff_s
        tried = 0
        last = _Retryable("no time left to send it")
        while tried < tries:
            remaining = budget_s - (time.monotonic() - started)
            if remaining <= 0:
                break
            tried += 1
            try:
                return self._send(url, data, timeout_s=min(self.timeout_s, remaining))
            except _Retryable as exc:
                last = exc
            wait = max(delay, last.retry_after_s or 0.0)
            if tried == tries or time.monotonic() - started + wait >= budget_s:
                break
            log.info("%s report: %s; retrying in %.1f s", body["kind"], last, wait)
            time.sleep(wait)
            delay *= 2
        elapsed = time.monotonic() - started
        raise CheckpointAckError(
            f"{body['kind']} report to {url} failed after {tried} tries in {elapsed:.1f} s: "
            f"{last}", status=last.status)

    def _send(self, url: str, data: bytes, *, timeout_s: float) -> dict:
        try:
            token = self._token()
        except OSError as exc:
            raise CheckpointAckError(f"cannot read the token file {self.token_file}: "
                                     f"{exc.strerror or exc}") from None
        opener = self._opener_once()
        request = urllib.request.Request(url, data=data, method="POST", headers={
            "Authorization": f"Bearer {token}", "Content-Type": "application/json",
            "Accept": "application/json"})
        try:
            with opener.open(request, timeout=timeout_s) as answer:
                raw = answer.read(1 << 20)
        except urllib.error.HTTPError as exc:
            raw = exc.read(1 << 16) if exc.fp is not None else b""
            exc.close()
            message, field = _error_of(raw, exc.reason)
            if exc.code >= 500:
                raise _Retryable(f"{exc.code} {message}", exc.code,
                                 _retry_after(exc.headers.get("Retry-After"))) from None
            # idlegpu's messages start with the field already ("step: ...")
            where = f" (field {field})" if field and field not in message else ""
            raise CheckpointAckError(f"the API refused the report ({exc.code}): {message}"
                                     f"{where}", status=exc.code, field=field) from None
        except (OSError, http.client.HTTPException) as exc:
            # URLError, timeouts, refused and reset connections, malformed answers
            reason = getattr(exc, "reason", None) or exc
            if isinstance(reason, ssl.SSLCertVerificationError):
                raise CheckpointAckError(
                    f"the API's certificate does not verify ({reason.verify_message}); set "
                    "IDLEGPU_CA_FILE to the CA bundle that signed it") from None
            raise _Retryable(f"{type(reason).__name__}: {reason}") from None
        try:
            answer_body = json.loads(raw.decode("utf-8")) if raw.strip() else {}
        except ValueError:
            return {}
        return answer_body if isinstance(answer_body, dict) else {}

    def _token(self) -> str:
        # the kubelet rotates the projected token: read it on every request, never cache it
        with open(self.token_file, encoding="utf-8") as token_file:
            token = token_file.read(64 * 1024).strip()
        if not token:
            raise OSError("the file is empty")
        return token

    def _opener_once(self) -> urllib.request.OpenerDirector:
        if self._opener is None:
            try:
                context = ssl.create_default_context(cafile=self.ca_file)
            except (OSError, ssl.SSLError) as exc:
                raise CheckpointAckError(f"cannot load the CA bundle {self.ca_file} "
                                         f"(IDLEGPU_CA_FILE): {exc}") from None
            self._opener = urllib.request.build_opener(
                urllib.request.HTTPSHandler(context=context), _NoRedirect())
        return self._opener

    # ---------------------------------------------------------------------------------------
    # The stop

    def wait_for_stop(self, timeout: float | None = None, *, exit_on_stop: bool = True) -> bool:
        """Wait for the daemon's SIGTERM after an acknowledgement, without exiting 0 (that
        would make the Job Succeeded: the unit would count as finished).

        At SIGTERM the process ends as SIGTERM ends it by default (status 143), whatever
        handler was installed before; stdout and stderr are flushed first. With
        ``exit_on_stop=False`` it returns True instead, and the caller must end the process
        with a non-zero status itself. Returns False after ``timeout`` seconds without a
        stop: the stop did not come (the daemon may be down), the caller may go on training.
        Called outside the main thread it cannot take over SIGTERM: it only waits out the
        timeout, and whatever handles SIGTERM (by default: the end of the process) still
        does."""
        deadline = None if timeout is None else time.monotonic() + max(0.0, timeout)
        if threading.current_thread() is not threading.main_thread():
            threading.Event().wait(None if deadline is None else deadline - time.monotonic())
            return False
        stopped = threading.Event()

        def on_sigterm(signum: int, frame: object) -> None:
            if exit_on_stop:
                _end_by_sigterm()
            stopped.set()

        previous = signal.signal(signal.SIGTERM, on_sigterm)
        try:
            while not stopped.is_set():
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return False
                # short sleeps: the handler runs between them, as soon as SIGTERM arrives
                time.sleep(0.2 if left is None else min(0.2, left))
            return True
        finally:
            # None: a handler set outside Python, which cannot be put back
            if previous is not None:
                signal.signal(signal.SIGTERM, previous)


def _error_of(raw: bytes, reason: object) -> tuple[str, str | None]:
    """The message and field of an error answer: idlegpu's ``{"error": {"message",
    "field"}}``, FastAPI's ``{"detail": ...}``, or the start of whatever text came."""
    try:
        parsed = json.loads(raw.decode("utf-8"))
    except ValueError:
        parsed = None
    if isinstance(parsed, dict):
        error = parsed.get("error")
        if isinstance(error, dict) and error.get("message"):
            field = error.get("field")
            return str(error["message"]), (str(field) if field not in (None, "") else None)
        detail = parsed.get("detail")
        if isinstance(detail, str):
            return detail, None
        if isinstance(detail, list) and detail and isinstance(detail[0], dict):
            first = detail[0]
            loc = first.get("loc") or []
            field = str(loc[-1]) if loc else None
            return str(first.get("msg", detail)), field
    text = raw.decode("utf-8", errors="replace").strip()
    return (text[:200] or str(reason)), None


def _retry_after(value: str | None) -> float | None:
    try:
        return max(0.0, float(value)) if value else None
    except ValueError:
        return None


def end_on_sigterm() -> bool:
    """From now on SIGTERM ends the process at once, as its default action does (status
    143), replacing any handler (a framework's that would save again, or exit 0). For after
    an acknowledgement; :meth:`Client.acknowledge` calls it itself when it answers a notice.
    False when it cannot (only the main thread may set signal handlers)."""
    try:
        signal.signal(signal.SIGTERM, lambda signum, frame: _end_by_sigterm())
    except ValueError:
        return False
    return True


def _end_by_sigterm() -> None:
    for stream in (sys.stdout, sys.stderr):
        # a closed or broken stream must not keep the process alive
        with contextlib.suppress(OSError, ValueError, AttributeError):
            stream.flush()
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    os.kill(os.getpid(), signal.SIGTERM)
    # still here: PID 1 of a container, which the kernel does not end by a default action
    time.sleep(1.0)
    os._exit(_EXIT_BY_SIGTERM)


# -------------------------------------------------------------------------------------------
# The module-level shortcuts, on one client from the environment

_default: Client | None = None
_default_lock = threading.Lock()


def default_client() -> Client:
    """The client of the module-level functions, built from the environment on first use."""
    global _default
    with _default_lock:
        if _default is None:
            _default = Client.from_env()
        return _default


def checkpoint_requested() -> datetime | None:
    """See :meth:`Client.checkpoint_requested`."""
    return default_client().checkpoint_requested()


def notice_pending() -> datetime | None:
    """See :meth:`Client.notice_pending`."""
    return default_client().notice_pending()


def acknowledge(step: int, path: str | os.PathLike[str], saved_at: datetime | None = None) -> dict:
    """See :meth:`Client.acknowledge`."""
    return default_client().acknowledge(step, path, saved_at)


def report_progress(step: int, *, every_s: float = 60.0) -> bool:
    """See :meth:`Client.report_progress`."""
    return default_client().report_progress(step, every_s=every_s)


def wait_for_stop(timeout: float | None = None, *, exit_on_stop: bool = True) -> bool:
    """See :meth:`Client.wait_for_stop`."""
    return default_client().wait_for_stop(timeout, exit_on_stop=exit_on_stop)
