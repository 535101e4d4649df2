"""The console's sessions: a signed cookie, checked on every request.

**Design.** The cookie ``idlegpu_session`` is ``base64url(JSON payload) . HMAC-SHA256`` under a
server secret: ``api.session_secret`` when the config has one (every replica behind a load
balancer must share it), else ``IDLEGPU_SESSION_SECRET`` from the environment, else 32 random
bytes made at start (then sessions end when the server restarts). The payload holds who the
login established (user, auth, team, role), a random session id, the session's CSRF token and
its expiry (``SESSION_HOURS``, wall clock). The bearer token itself is never in the cookie: a
token session keeps the token's SHA-256 and every request looks it up again, so a revoked or
expired token ends its sessions at once. Logout clears the cookie and remembers the session id
as ended until it would have expired, in this process and in the job store
(``ended_sessions``, schema version 5): a copy of the cookie taken before logout stops working
on every ``idlegpu serve`` replica sharing the store and the secret.

The cookie is ``HttpOnly``, ``SameSite=Strict``, ``Path=/`` and ``Secure`` when the request
came over https (or ``X-Forwarded-Proto: https`` from a trusted proxy). **CSRF**: every form
carries the session's token in a hidden ``csrf`` field and every POST is refused (403) unless it
matches; the console's scripts send the same token as ``X-CSRF-Token`` when they call the
``/v1`` API with the cookie (a cookie-authenticated ``/v1`` call that changes anything without
it is refused too).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import os
import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

COOKIE = "idlegpu_session"
SESSION_HOURS = 8.0
CSRF_HEADER = "x-csrf-token"


LOGIN_NONCE = "login-nonce:"  # what a login nonce's signature covers besides it (never a cookie)


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


@dataclass(frozen=True)
class Session:
    id: str
    user: str
    auth: str
    team: str
    role: str
    csrf: str
    expires: float
    token_sha256: str | None = None
    groups: tuple[str, ...] = ()


class Sessions:
    """Issues and checks signed session cookies (see the module)."""

    def __init__(self, secret: Any = None, *, hours: float = SESSION_HOURS,
                 store: Any = None, now: Callable[[], float] = time.time) -> None:
        """``secret``: str, bytes or a pydantic ``SecretStr`` (``api.session_secret``);
        ``store``: the job store that remembers logouts for every replica (None: this
        process only); ``now``: the server's clock in epoch seconds (the one that judges
        token expiry, so a replayed server ages sessions as it ages tokens)."""
        if hasattr(secret, "get_secret_value"):
            secret = secret.get_secret_value() or None
        if secret is None:
            secret = os.environ.get("IDLEGPU_SESSION_SECRET") or None
        if secret is None:
            secret = secrets.token_bytes(32)
        self.key = secret.encode("utf-8") if isinstance(secret, str) else secret
        self.hours = hours
        self._ended: dict[str, float] = {}
        self._lock = threading.Lock()
        self.store = store
        self._now = now

    def _sign(self, body: str) -> str:
        return _b64(hmac.new(self.key, body.encode("ascii"), hashlib.sha256).digest())

    def issue(self, *, user: str, auth: str, team: str, role: str,
              token_sha256: str | None = None, groups: tuple[str, ...] = ()
              ) -> tuple[Session, str]:
        session = Session(id=secrets.token_urlsafe(16), user=user, auth=auth, team=team,
                          role=role, csrf=secrets.token_urlsafe(32),
                          expires=self._now() + self.hours * 3600,
                          token_sha256=token_sha256, groups=tuple(groups))
        payload = {"i": session.id, "u": user, "a": auth, "t": team, "r": role,
                   "c": session.csrf, "e": round(session.expires), "h": token_sha256,
                   "g": list(groups)}
        body = _b64(json.dumps(payload, separators=(",", ":")).encode("utf-8"))
        return session, f"{body}.{self._sign(body)}"

    def read(self, cookie: str | None) -> Session | None:
        """The session of a cookie, or None (absent, forged, expired or logged out)."""
        if not cookie or len(cookie) > 4096 or "." not in cookie:
            return None
        body, _, signature = cookie.rpartition(".")
        if not hmac.compare_digest(signature, self._sign(body)):
            return None
        try:
            data: dict[str, Any] = json.loads(_unb64(body))
            session = Session(id=str(data["i"]), user=str(data["u"]), auth=str(data["a"]),
                              team=str(data["t"]), role=str(data["r"]), csrf=str(data["c"]),
                              expires=float(data["e"]), token_sha256=data.get("h"),
                              groups=tuple(data.get("g") or ()))
        except (ValueError, KeyError, TypeError):
            return None
        if self._now() >= session.expires:
            return None
        with self._lock:
            if session.id in self._ended:
                return None
        if self.store is not None and self.store.session_ended(session.id):
            return None  # logged out on another replica
        return session

    def end(self, session: Session) -> None:
        now = self._now()
        with self._lock:
            self._ended = {k: v for k, v in self._ended.items() if v > now}
            self._ended[session.id] = session.expires
        if self.store is not None:
            self.store.end_session(session.id, datetime.fromtimestamp(session.expires, UTC),
                                   datetime.fromtimestamp(now, UTC))

    def login_nonce(self, now: float | None = None) -> str:
        """A login form's CSRF nonce: random, stamped and signed with the session secret, so
        only this server (or a replica sharing its secret) can make one: a cookie and a form
        field that a client chose together are refused."""
        body = f"{secrets.token_urlsafe(18)}.{int(self._now() if now is None else now)}"
        return f"{body}.{self._sign(LOGIN_NONCE + body)}"

    def login_nonce_ok(self, nonce: str | None, max_age_s: float = 3600,
                       now: float | None = None) -> bool:
        """True for a nonce ``login_nonce`` made within ``max_age_s``."""
        if not nonce or len(nonce) > 200 or not nonce.isascii():
            return False
        body, _, signature = nonce.rpartition(".")
        if not body or not hmac.compare_digest(signature, self._sign(LOGIN_NONCE + body)):
            return False
        stamp = body.rpartition(".")[2]
        if not stamp.isdigit():
            return False
        age = (self._now() if now is None else now) - int(stamp)
        return 0 <= age <= max_age_s

    @staticmethod
    def csrf_ok(session: Session, presented: str | None) -> bool:
        return bool(presented) and hmac.compare_digest(session.csrf, presented or "")
