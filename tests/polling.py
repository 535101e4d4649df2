"""Waiting for a real server to get somewhere: ``wait_for(what, probe)`` polls ``probe()``
until it returns something true (and returns it), or fails naming ``what``."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any


def wait_for(what: str, probe: Callable[[], Any], timeout: float = 30.0,
             every: float = 0.2) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = probe()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(every)
