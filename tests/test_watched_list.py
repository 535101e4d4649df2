"""``WatchedList``'s loop under the failures a real API server will not produce on demand (a
watch cut mid-stream, an expired version, a bad event): scripted here, each step a fake of
the server's answer. That the copy follows a real server is tests/test_kueue_real.py's."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from idlegpu.scheduler.adapters.kubernetes.mirror import WatchedList, _Expired


def _obj(name: str, version: str, namespace: str = "research") -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": namespace, "resourceVersion": version}}


class Scripted(WatchedList):
    """The list and each watch request answer from a script; the test steps it."""

    def __init__(self, script: list[Any]) -> None:
        super().__init__(None, lambda **kw: None, "workloads.test",  # type: ignore[arg-type]
                         backoff_s=0.01, max_backoff_s=0.01, most=3, too_many="more than 3")
        self.script = script
        self.step = threading.Semaphore(0)
        self.done: list[str] = []

    def _next(self) -> Any:
        self.step.acquire()
        action = self.script.pop(0)
        self.done.append(action[0])
        return action

    def _list(self) -> str:
        kind, items = self._next()
        assert kind == "list"
        with self._lock:
            self._objects = {("research", o["metadata"]["name"]): o for o in items}
        self.lists += 1
        self.problem = ""
        return "1"

    def _follow(self, version: str) -> str:
        kind, payload = self._next()
        if kind == "events":
            for event in payload:
                version = self._apply(event, version)
            return version
        raise payload


def _until(watched: Scripted, steps: int) -> None:
    """Let the thread run ``steps`` more script steps and wait until it has."""
    target = len(watched.done) + steps
    for _ in range(steps):
        watched.step.release()
    for _ in range(400):
        if len(watched.done) >= target:
            threading.Event().wait(0.05)  # the step's effect applied
            return
        threading.Event().wait(0.01)
    raise AssertionError(f"the thread stopped at {watched.done}")


def test_the_copy_follows_events_is_dropped_on_a_cut_and_relisted_after():
    watched = Scripted([
        ("list", [_obj("a", "1")]),
        ("events", [{"type": "ADDED", "object": _obj("b", "2")},
                    {"type": "MODIFIED", "object": _obj("a", "3")},
                    {"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": "4"}}}]),
        ("cut", ConnectionResetError("the watch's connection was reset")),
        ("list", [_obj("b", "5")]),
        ("gone", _Expired()),
        ("list", [_obj("c", "6")]),
        ("events", [{"type": "DELETED", "object": _obj("c", "7")}]),
        ("events", [{"type": "ADDED", "object": {"metadata": {}}}]),
    ])
    watched.start()
    try:
        assert watched.items() is None  # nothing listed yet: no copy to trust
        _until(watched, 1)
        assert [o["metadata"]["name"] for o in watched.items()] == ["a"]
        _until(watched, 1)
        assert sorted((o["metadata"]["name"], o["metadata"]["resourceVersion"])
                      for o in watched.items()) == [("a", "3"), ("b", "2")]
        _until(watched, 1)  # the cut: the copy is dropped until the next list
        assert watched.items() is None and "ConnectionResetError" in watched.problem
        _until(watched, 1)
        assert [o["metadata"]["name"] for o in watched.items()] == ["b"]
        assert watched.problem == ""
        _until(watched, 2)  # an expired version lists again at once, without dropping
        assert [o["metadata"]["name"] for o in watched.items()] == ["c"]
        _until(watched, 1)
        assert watched.items() == []
        _until(watched, 1)  # an event without a name: dropped, not guessed at
        assert watched.items() is None and "without a name" in watched.problem
        assert watched.lists == 3
    finally:
        watched.script.clear()
        watched.stop(wait_s=0)


def test_a_stream_cut_after_a_while_resumes_and_one_cut_at_once_drops_the_copy():
    import urllib3

    cut = urllib3.exceptions.ProtocolError("Response ended prematurely")
    watched = Scripted([("list", [_obj("a", "1")]), ("cut", cut),
                        ("events", [{"type": "ADDED", "object": _obj("b", "2")}]),
                        ("cut", cut)])
    watched.min_stream_s = 0.0  # every stream counts as open a while
    watched.start()
    try:
        _until(watched, 3)  # the cut resumes the watch: the copy is kept, not listed again
        assert sorted(o["metadata"]["name"] for o in watched.items()) == ["a", "b"]
        assert watched.lists == 1 and watched.problem == ""
        watched.min_stream_s = 60.0  # a stream cut at once is a failure
        _until(watched, 1)
        assert watched.items() is None and "ProtocolError" in watched.problem
    finally:
        watched.script.clear()
        watched.stop(wait_s=0)


def test_a_flood_beyond_most_drops_the_copy():
    watched = Scripted([("list", [_obj("a", "1")]),
                        ("events", [{"type": "ADDED", "object": _obj(n, str(i))}
                                    for i, n in enumerate("bcd", 2)])])
    watched.start()
    try:
        _until(watched, 2)
        assert watched.items() is None and watched.problem.endswith("more than 3")
    finally:
        watched.script.clear()
        watched.stop(wait_s=0)


@pytest.mark.parametrize("event", [None, {"type": "ADDED"}, {"type": "ERROR", "object": {}}])
def test_a_malformed_event_is_refused(event):
    watched = WatchedList(caller=None, list_fn=lambda **kw: None,  # type: ignore[arg-type]
                          resource="workloads.test")
    with pytest.raises(ValueError):
        watched._apply(event, "1")
