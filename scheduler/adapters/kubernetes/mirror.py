"""``WatchedList``: a copy of one kind of object kept by the API server's watch, as a
client-go informer keeps its cache, so that a daemon pass reads the copy instead of listing
thousands of objects every time (Kueue's Workloads: ``KueueChecks(watch=True)``).

A thread lists the objects once (paged and bounded as ``ApiCaller._list_all``), then watches
from the list's ``resourceVersion`` with bookmarks, applying ``ADDED``/``MODIFIED``/``DELETED``
as they come. Each watch request ends after ``watch_timeout_s`` and the next one resumes from
the last version seen, as after a stream the server cut once it had been open a while; an
expired version (HTTP 410 Gone) lists again. Any other failure (the
server unreachable, a 403, a bad answer) drops the copy: ``items()`` answers None until a new
list has succeeded, and the caller lists for itself (and fails as it would without the copy),
so a pass never decides on a copy that stopped following the server. Beyond ``most`` objects
the copy is dropped too (a flood of another team's objects is not held in memory) and the
caller's own list says why.

The copy can trail the server by the watch's latency (milliseconds on a healthy server); a
connection that hangs silently is cut by the read timeout (``watch_timeout_s`` plus a margin).
The caller still makes one live call a pass (``KueueChecks`` lists its few AdmissionChecks),
so an API server that vanished stops admission at the next pass, as before.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import kubernetes
import urllib3
from kubernetes.client.exceptions import ApiException

from idlegpu.forecast.errors import IdlegpuError
from idlegpu.scheduler.adapters.kubernetes.calls import ApiCaller

log = logging.getLogger("idlegpu.scheduler.adapters.kubernetes.mirror")

_GONE = 410


def _key(obj: dict[str, Any]) -> tuple[str, str] | None:
    meta = obj.get("metadata")
    if not isinstance(meta, dict) or not isinstance(meta.get("name"), str):
        return None
    return str(meta.get("namespace") or ""), meta["name"]


def _version(obj: dict[str, Any]) -> str | None:
    meta = obj.get("metadata")
    version = meta.get("resourceVersion") if isinstance(meta, dict) else None
    return version if isinstance(version, str) and version else None


class WatchedList:
    """The watch-kept copy of one kind of object (module docstring). ``list_fn`` is the API
    client's list function for it (``CustomObjectsApi.list_cluster_custom_object`` with its
    group, version and plural bound), called paged through ``caller`` and, with ``watch``,
    by the watch."""

    def __init__(self, caller: ApiCaller, list_fn: Callable[..., Any], resource: str, *,
                 page: int = 500, most: int | None = None, too_many: str = "",
                 watch_timeout_s: int = 240, backoff_s: float = 1.0,
                 max_backoff_s: float = 30.0) -> None:
        self.caller = caller
        self.list_fn = list_fn
        self.resource = resource
        self.page = page
        self.most = most
        self.too_many = too_many
        self.watch_timeout_s = int(watch_timeout_s)
        self.backoff_s = backoff_s
        self.max_backoff_s = max_backoff_s
        self.min_stream_s = 1.0
        self._lock = threading.Lock()
        self._objects: dict[tuple[str, str], dict[str, Any]] | None = None
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self._watch: kubernetes.watch.Watch | None = None
        self.lists = 0
        """How many full lists the thread has made (the first, and one after each failure or
        expired version)."""
        self.problem = ""
        """Why the copy was last dropped ("" while it follows the server)."""

    def start(self) -> None:
        """Start following the server (a daemon thread); idempotent."""
        if self._thread is not None:
            return
        self._thread = threading.Thread(target=self._run, name=f"watch {self.resource}",
                                        daemon=True)
        self._thread.start()

    def stop(self, wait_s: float = 5.0) -> None:
        """Stop following: the copy is dropped at once, the thread ends with its request."""
        self._stopping.set()
        with self._lock:
            self._objects = None
        watch = self._watch
        if watch is not None:
            watch.stop()
        if self._thread is not None:
            self._thread.join(wait_s)

    def items(self) -> list[dict[str, Any]] | None:
        """The objects as the watch last saw them, or None while there is no copy to trust
        (not listed yet, or dropped after a failure)."""
        with self._lock:
            return None if self._objects is None else list(self._objects.values())

    def wait_synced(self, timeout_s: float) -> bool:
        """Whether the copy is there within ``timeout_s`` (for tests and a daemon's start)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.items() is not None:
                return True
            if self._stopping.wait(0.05):
                return False
        return self.items() is not None

    # --- the thread ----------------------------------------------------------------------

    def _run(self) -> None:
        failures = 0
        while not self._stopping.is_set():
            try:
                version = self._list()
                failures = 0
                while not self._stopping.is_set():
                    began = time.monotonic()
                    try:
                        version = self._follow(version)
                    except urllib3.exceptions.ProtocolError:
                        # the server cut a stream that had been open a while (a restart, a
                        # proxy's idle limit): resume from the last version, as a reflector
                        # does; a stream cut at once is a failure (below)
                        if time.monotonic() - began < self.min_stream_s:
                            raise
            except _Expired:
                continue  # list again at once: the watch fell too far behind
            except (IdlegpuError, ApiException, urllib3.exceptions.HTTPError, OSError,
                    ValueError, KeyError, TypeError) as exc:
                self._drop(" ".join(f"{type(exc).__name__}: {exc}".split())[:300])
                failures += 1
                pause = min(self.max_backoff_s, self.backoff_s * 2 ** (failures - 1))
                if self._stopping.wait(pause):
                    return

    def _drop(self, problem: str) -> None:
        with self._lock:
            self._objects = None
        if self._stopping.is_set():
            return  # stopped: the cut is ours
        if problem != self.problem:
            log.warning("watch of %s stopped (%s); passes list it until the watch is back",
                        self.resource, problem)
        self.problem = problem

    def _list(self) -> str:
        """List everything (paged, bounded); the copy becomes that list. Returns its version."""
        items, version = self.caller._list_versioned(
            self.list_fn, self.resource, page=self.page, most=self.most,
            too_many=self.too_many)
        objects = {}
        for obj in items:
            key = _key(obj)
            if key is not None:
                objects[key] = obj
        with self._lock:
            if self._stopping.is_set():
                return version
            self._objects = objects
        self.lists += 1
        if self.problem:
            log.info("watch of %s is back", self.resource)
            self.problem = ""
        return version

    def _follow(self, version: str) -> str:
        """One watch request from ``version``: apply its events until the server ends it;
        returns the last version seen."""
        watch = kubernetes.watch.Watch()
        self._watch = watch
        try:
            for event in watch.stream(
                    self.list_fn, resource_version=version, allow_watch_bookmarks=True,
                    timeout_seconds=self.watch_timeout_s, deserialize=False,
                    _request_timeout=(10, self.watch_timeout_s + 30)):
                if self._stopping.is_set():
                    break
                version = self._apply(event, version)
        except ApiException as exc:
            if exc.status == _GONE:
                raise _Expired() from None
            raise
        finally:
            self._watch = None
        return version

    def _apply(self, event: Any, version: str) -> str:
        if not isinstance(event, dict) or not isinstance(event.get("object"), dict):
            raise ValueError("a watch event without an object")  # noqa: TRY004 (one error kind)
        kind, obj = event.get("type"), event["object"]
        seen = _version(obj) or version
        if kind == "BOOKMARK":
            return seen
        key = _key(obj)
        if key is None or kind not in ("ADDED", "MODIFIED", "DELETED"):
            raise ValueError(f"a watch event of type {str(kind)[:40]!r} without a name")
        with self._lock:
            if self._objects is None:
                return seen
            if kind == "DELETED":
                self._objects.pop(key, None)
            else:
                self._objects[key] = obj
                if self.most is not None and len(self._objects) > self.most:
                    raise ValueError(self.too_many or f"more than {self.most:,} "
                                     f"{self.resource}")
        return seen


class _Expired(Exception):
    """The watch's version expired (HTTP 410 Gone): list again."""
