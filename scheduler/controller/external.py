"""Units that live outside the job store, in the controller's passes: Kueue's Workloads that
wait on idlegpu's admission checks (``controller/kueue.py``) and users' own suspended Jobs
(``controller/native.py``). Each is offered to the same ``decide()`` as the stored units; its
decisions go back to where it lives (a check entry, a Job's ``suspend``), never to the store.

Ids are ``kueue/<namespace>/<name>`` and ``job/<namespace>/<name>``: a stored unit's id never
holds a ``/``, so the three never meet.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from datetime import datetime
from typing import Protocol, TypeVar

from idlegpu.forecast.errors import IdlegpuError
from idlegpu.scheduler.controller.report import PassReport
from idlegpu.scheduler.types import ExternalUnit, Plan, RunningJob, WaitingJob

log = logging.getLogger("idlegpu.controller")


class _Unit(Protocol):
    @property
    def id(self) -> str: ...


U = TypeVar("U", bound=_Unit)


def planned_seconds(units: Iterable[U], cache: dict[str, float],
                    runtime: Callable[[U], float]) -> dict[str, float]:
    """Each unit's planned runtime (``runtime(unit)``, cached by id in ``cache``: a unit's
    fields do not change while it waits); a unit whose runtime cannot be had is left out
    (logged), so it is never planned blind."""
    out: dict[str, float] = {}
    for unit in units:
        seconds = cache.get(unit.id)
        if seconds is None:
            try:
                seconds = float(runtime(unit))
            except (IdlegpuError, ValueError) as exc:
                log.warning("no runtime for %s: %s", unit.id, exc)
                continue
            cache[unit.id] = seconds
        out[unit.id] = seconds
    return out


class UnitsOfAPass:
    """A source's units for one reading at one ``now``, computed once: a pass asks for its
    queue and then for its running units, of the same reading."""

    def __init__(self) -> None:
        self._of: tuple[object, datetime, list[WaitingJob], list[RunningJob]] | None = None

    def get(self, reading: object, now: datetime,
            compute: Callable[[], tuple[list[WaitingJob], list[RunningJob]]]
            ) -> tuple[list[WaitingJob], list[RunningJob]]:
        if self._of is None or self._of[0] is not reading or self._of[1] != now:
            waiting, running = compute()
            self._of = (reading, now, waiting, running)
        return list(self._of[2]), list(self._of[3])


def is_external(unit_id: str) -> bool:
    """Whether a unit id is an external unit's (Kueue Workload or user's Job)."""
    return "/" in unit_id


class ExternalUnits(Protocol):
    """One source of external units, pass by pass."""

    origin: str
    """``kueue`` or ``job`` (``types.EXTERNAL_ORIGINS``)."""

    def read(self, report: PassReport) -> bool:
        """Read the source (reconcile passes); False: unreadable this pass (reported), so
        none of its units is admitted and what runs stays as last read."""

    def units(self, now: datetime) -> tuple[list[WaitingJob], list[RunningJob]]:
        """Its waiting and running units, from the last reading."""

    def holding(self, stopping: Mapping[str, int]) -> int:
        """GPUs its running units hold, those told to stop included until they are gone."""

    def settle(self, stopping: dict[str, int]) -> None:
        """Forget the stops whose GPUs are back."""

    def apply(self, plan: Plan, report: PassReport, stopping: dict[str, int]) -> None:
        """Carry out the plan's decisions about its units; a stop goes into ``stopping``."""

    def activate(self, active: tuple[bool, str, str], report: PassReport) -> None:
        """Say whether idlegpu can decide now (``check_active``), where the source shows it."""

    def views(self, plan: Plan, stopping: Mapping[str, int]) -> list[ExternalUnit]:
        """Its units as the queue views show them: state, why they wait (the plan's
        reasons), estimated starts and planned stops."""
