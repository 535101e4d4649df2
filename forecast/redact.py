"""Credentials never leave in a message: one ``redact`` for every text that may carry a URL or a
token (source errors, the daemon's log lines, config errors, the CLI's error line), and one
warning of ours, once per process and server, for a server whose TLS certificate is not checked.

``redact`` replaces, wherever they appear in a text:

* a URL's userinfo (``https://user:password@host`` -> ``https://***@host``; a token alone as the
  user, ``https://TOKEN@host``, is a secret too);
* the credentials of an ``Authorization`` header or a ``Bearer``/``Basic``/``Token`` scheme;
* the value of a parameter or field whose name says it is a secret (``token=``,
  ``access_token=``, ``password=``, ``sslpassword=``, ``passfile=``, ``api_key=``,
  ``bearer_token: ...``, ``'secret': '...'``): so a database URL's ``?password=`` too.

It works on the text alone (no list of known secrets to keep in sync), so it is safe to apply
twice and to any message. ``RedactingFilter`` applies it to log records.
"""

from __future__ import annotations

import logging
import re
import threading
import warnings
from urllib.parse import urlsplit

__all__ = ["MASK", "RedactingFilter", "is_secret_field", "redact", "warn_unverified_tls"]

MASK = "***"

# scheme://userinfo@ : everything up to the last "@" before the path (a password may hold "@")
_USERINFO = re.compile(r"(?i)\b([a-z][a-z0-9+.\-]*://)([^/?#\s'\"<>]+)@")
_AUTH_HEADER = re.compile(
    r"(?i)(\bauthorization['\"]?\s*[:=]\s*['\"]?)((?:[A-Za-z]+\s+)?[^'\",}\s]+)")
# the schemes as headers write them; 8+ characters, so "Bearer tokens" in a sentence stays
_AUTH_SCHEME = re.compile(r"\b(Bearer|Basic)(\s+)([A-Za-z0-9\-._~+/]{8,}=*)")
# a field or parameter whose name says it holds a secret: `name=value` (query strings, keyword
# reprs) or a quoted value after `name:` (JSON, dict reprs); "bearer_token: Input should be..."
# (a field named in an error) stays
_SECRET_NAME = (r"[A-Za-z0-9_\-]*(?:token|passw(?:or)?d|passfile|pwd|secret|credentials?|signature"
                r"|(?:api|secret|private|access|auth)[_\-]?key|apikey)")
_SECRET_VALUE = re.compile(
    rf"(?i)(\b{_SECRET_NAME}\b['\"]?(?:\s*=\s*|\s*:\s*(?=['\"])))"
    rf"('[^']*'|\"[^\"]*\"|[^\s&,;'\"}}\])]+)"
)
_SECRET_FIELD = re.compile(rf"(?i)^{_SECRET_NAME}$")


def redact(text: object) -> str:
    """``text`` (as ``str``) with every credential it carries replaced by ``***``."""
    out = str(text)
    if not out:
        return out
    out = _USERINFO.sub(lambda m: f"{m.group(1)}{MASK}@", out)
    out = _AUTH_HEADER.sub(lambda m: m.group(1) + MASK, out)
    out = _AUTH_SCHEME.sub(lambda m: m.group(1) + m.group(2) + MASK, out)
    return _SECRET_VALUE.sub(lambda m: m.group(1) + _masked(m.group(2)), out)


def _masked(value: str) -> str:
    if value[:1] in "'\"" and value[-1:] == value[:1] and len(value) >= 2:
        return value[0] + MASK + value[0]
    return MASK


def is_secret_field(name: str) -> bool:
    """True for a field whose name says it holds a secret (``bearer_token``, ``password``...):
    its value is never shown, not even in an error about it."""
    return bool(_SECRET_FIELD.match(name))


class RedactingFilter(logging.Filter):
    """A log filter that redacts the record's formatted message (and its exception text)."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        clean = redact(message)
        if clean != message:
            record.msg, record.args = clean, None
        if record.exc_info and record.exc_info[1] is not None:
            exc = record.exc_info[1]
            if redact(exc) != str(exc):  # a traceback would repeat the message: keep its type
                record.exc_info = None
                record.exc_text = None
                record.msg = f"{record.msg} ({type(exc).__name__}: {redact(exc)})"
        return True


# --------------------------------------------------------------------------- verify_tls: false

_warned: set[str] = set()
_lock = threading.Lock()
_log = logging.getLogger("idlegpu.tls")


def warn_unverified_tls(url: str) -> None:
    """Say once per process that ``url``'s certificate is not checked, and silence urllib3's
    ``InsecureRequestWarning`` (one per request) for that host only: other code's unverified
    requests to other hosts still warn."""
    from urllib3.exceptions import InsecureRequestWarning  # here: redact stays light to import

    parts = urlsplit(url)
    host = parts.hostname or ""
    with _lock:
        if host in _warned:
            return
        _warned.add(host)
        warnings.filterwarnings(
            "ignore",
            message=rf"Unverified HTTPS request is being made to host '{re.escape(host)}'",
            category=InsecureRequestWarning,
        )
    if parts.scheme == "https":
        _log.warning(
            "%s: TLS certificates are not verified (prometheus.verify_tls: false): anyone on "
            "the path can read and change the answers; trust its CA instead "
            "(REQUESTS_CA_BUNDLE) and set verify_tls: true", redact(url))
