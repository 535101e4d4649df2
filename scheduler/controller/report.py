"""What one pass of the controller saw and did."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

from idlegpu.scheduler.types import NodeView, Plan, ServingSignals


@dataclass
class PassReport:
    """What one pass saw and did (for logs, metrics and tests)."""

    now: datetime
    plan: Plan = field(default_factory=Plan)
    started: list[str] = field(default_factory=list)
    finished: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)
    released: list[str] = field(default_factory=list)
    recreated: list[str] = field(default_factory=list)
    created: list[str] = field(default_factory=list)
    shrunk: list[str] = field(default_factory=list)
    """Units whose stopped Job was followed by an attempt on fewer GPUs."""
    stopped: list[str] = field(default_factory=list)
    noticed: list[str] = field(default_factory=list)
    """Jobs given a checkpoint notice this pass (their stop comes at the answer or deadline)."""
    notices_closed: list[tuple[str, str]] = field(default_factory=list)
    """``(unit, outcome)`` of the notices that ended this pass (answered, missed, cut, ended)."""
    deleted: list[str] = field(default_factory=list)
    refused: list[tuple[str, str]] = field(default_factory=list)
    """``(unit, why)`` of users' Jobs refused this pass (the rules a request is held to)."""
    checks_written: list[tuple[str, str]] = field(default_factory=list)
    """``(Kueue Workload unit, state)`` of the admission-check entries written this pass."""
    errors: list[str] = field(default_factory=list)
    signals: ServingSignals | None = None
    nodes: NodeView | None = None
    """The node view admission used (None: none read, the pool as one bin)."""
    nodes_read_s: float | None = None
    """Seconds the node view took to read."""
