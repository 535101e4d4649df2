"""The vocabulary of admission: job states and events, what the policy sees, what it decides.

Frozen dataclasses and enums only: no I/O, no clock. Times are timezone-aware UTC datetimes;
durations are seconds.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from enum import StrEnum
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from idlegpu.forecast.config import NodeShape

NIGHT_HOURS = (20, 8)
"""The fixed night of the original operator, local ``[start, end)`` hours: the ``night``
policy of the simulator and the daemon's ``night-only`` mode."""


class JobState(StrEnum):
    """Life of one job unit (a pipeline step or sweep member).

    QUEUED -> ADMITTED -> RUNNING -> SUCCEEDED | FAILED; RUNNING -> QUEUED again when preempted
    (a checkpointable job resumes later); CANCELLED from any non-terminal state.
    """

    QUEUED = "queued"
    ADMITTED = "admitted"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"

    def is_terminal(self) -> bool:
        return self in (JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED)

    def holds_gpus(self) -> bool:
        return self in (JobState.ADMITTED, JobState.RUNNING)


class EventKind(StrEnum):
    """Entries of the accounting log (what reports read)."""

    SUBMITTED = "submitted"
    ADMITTED = "admitted"
    STARTED = "started"
    CHECKPOINTED = "checkpointed"
    PREEMPTED = "preempted"
    FINISHED = "finished"
    FAILED = "failed"
    CANCELLED = "cancelled"
    NOTICE = "notice"
    """A checkpoint notice ended: answered in time, missed (stopped at its deadline), or cut
    short by the service's need (``detail["outcome"]``)."""


class NoticeOutcome(StrEnum):
    ANSWERED = "answered"
    """Acknowledged before its deadline: stopped at the acknowledgement."""
    MISSED = "missed"
    """No acknowledgement by the deadline: stopped then, blind."""
    CUT = "cut"
    """The service needed the GPUs before the answer: stopped at once, blind."""
    ENDED = "ended"
    """The attempt ended otherwise first (finished, failed, cancelled, its Job lost)."""


class Action(StrEnum):
    ADMIT = "admit"
    PREEMPT = "preempt"
    DEFER = "defer"
    SHRINK = "shrink"
    """An elastic running job checkpoints and restarts on fewer GPUs (``Decision.gpus``)."""
    RENEW = "renew"
    """A running job whose window closes runs on into a new one (``Decision.stop_by``; None:
    to its end): the pass would have stopped it and admitted it again on the same GPUs."""


def _elastic_min(job: WaitingJob | RunningJob) -> None:
    """``min_gpus`` defaults to ``gpus`` (not elastic); never above it. ``gpus_step`` is at
    least 1."""
    least = job.gpus if job.min_gpus is None else min(int(job.min_gpus), job.gpus)
    object.__setattr__(job, "min_gpus", max(1, least) if job.gpus > 0 else job.gpus)
    object.__setattr__(job, "gpus_step", max(1, int(job.gpus_step)))


def smaller_sizes(gpus: int, min_gpus: int, gpus_step: int = 1) -> range:
    """The sizes below ``gpus`` an elastic unit runs on, largest first: the multiples of
    ``gpus_step`` from ``min_gpus`` up (a data-parallel unit grows and shrinks by whole
    replicas of ``gpus_step`` GPUs). Empty when it is not elastic."""
    step = max(1, gpus_step)
    top = (gpus - 1) // step * step
    bottom = -(-max(1, min_gpus) // step) * step
    return range(top, bottom - 1, -step)


def fitting_size(gpus: int, min_gpus: int, gpus_step: int, room: float) -> int:
    """The most GPUs a unit of ``gpus`` (elastic down to ``min_gpus`` by ``gpus_step``) runs
    on within ``room`` GPUs: its size, else its largest smaller size that fits, else 0."""
    if room >= gpus:
        return gpus
    sizes = smaller_sizes(gpus, min_gpus, gpus_step)
    if not sizes or not room >= sizes[-1]:  # NaN (no forecast) is no room
        return 0
    step = -sizes.step
    return min(sizes[0], int(room) // step * step)


@dataclass(frozen=True)
class WaitingJob:
    """A queued job unit whose dependencies are met, as the policy needs it."""

    id: str
    team: str
    gpus: int
    runtime_s: float
    """Remaining runtime at the configured quantile (after checkpoints already made)."""
    checkpointable: bool
    priority: int
    submitted_at: datetime
    deadline: datetime | None = None
    preemptions: int = 0
    max_preemptions: int | None = None
    kind: str = "job"
    min_gpus: int | None = None
    """An elastic job may start on as few as this many GPUs, its runtime then scaled
    linearly (``runtime_s * gpus / granted``); None (the default) becomes ``gpus``: not
    elastic."""
    gpus_step: int = 1
    """An elastic job runs on multiples of this many GPUs below ``gpus`` (its replicas)."""
    cpu: float | None = None
    """CPU cores its pod requests (None: unknown, not checked against the nodes)."""
    memory: int | None = None
    """Bytes of memory its pod requests (None: unknown, not checked against the nodes)."""
    nodes: int = 1
    """Pods of a multi-node (gang) unit, one per node, each with ``gpus // nodes`` GPUs and
    ``cpu`` and ``memory`` (those are per pod); all start together or none. 1: one pod."""
    checkpoint_interval_s: float | None = None
    """Seconds between its periodic checkpoints (None: unknown). A segment shorter than one
    interval would save nothing of its own, so none is offered."""
    reload_s: float = 0.0
    """Of ``runtime_s``, the reload of its checkpoint a resume begins with: it does no work
    in it, so a segment must outlast it by a checkpoint interval to save anything."""

    def __post_init__(self) -> None:
        _elastic_min(self)
        if self.nodes < 1 or self.gpus % self.nodes:
            raise ValueError(f"unit {self.id}: {self.gpus} GPUs do not split into "
                             f"{self.nodes} equal nodes")

    @property
    def elastic(self) -> bool:
        # __post_init__ (_elastic_min) always sets min_gpus
        assert self.min_gpus is not None
        return self.min_gpus < self.gpus

    @property
    def sizes(self) -> tuple[int, ...]:
        """The GPUs it may start on, largest first: ``gpus``, then its smaller sizes."""
        assert self.min_gpus is not None
        return (self.gpus, *smaller_sizes(self.gpus, self.min_gpus, self.gpus_step))

    @property
    def gpus_per_node(self) -> int:
        return self.gpus // self.nodes


OVERRUN_MIN_SAMPLES = 5
"""Finished units beyond a unit's own overrun needed before their distribution is used."""


@dataclass(frozen=True)
class Overruns:
    """How long units run past their estimate: the ratios ``runtime / estimate`` of units that
    finished (sorted), learnt from what really ran (the simulator online, the daemon from the
    store's finished attempts).

    ``remaining_s(estimate_s, done_s)`` is the one rule for the work left of a unit that has
    done ``done_s`` seconds of work on an estimate of ``estimate_s``: before the estimate, what
    the estimate leaves; past it (own ratio ``rho = done_s / estimate_s``), the ``quantile`` of
    the finished ratios beyond ``rho``, less ``rho``, times the estimate; with fewer than
    ``min_samples`` such ratios, as long again as its overrun so far, at least a quarter of
    its estimate. Never "it ends within a step": a unit past its estimate often runs on."""

    ratios: tuple[float, ...] = ()
    quantile: float = 0.9
    min_samples: int = OVERRUN_MIN_SAMPLES

    @classmethod
    def of(cls, ratios: Iterable[float], quantile: float = 0.9,
           min_samples: int = OVERRUN_MIN_SAMPLES) -> Overruns:
        """From any iterable of ratios (non-finite and non-positive ones dropped)."""
        kept = sorted(float(r) for r in ratios if np.isfinite(r) and r > 0)
        return cls(tuple(kept), quantile, min_samples)

    def with_ratio(self, ratio: float) -> Overruns:
        if not (np.isfinite(ratio) and ratio > 0):
            return self
        at = bisect.bisect_right(self.ratios, ratio)
        return replace(self, ratios=self.ratios[:at] + (float(ratio),) + self.ratios[at:])

    def remaining_s(self, estimate_s: float, done_s: float) -> float:
        estimate, done = float(estimate_s), max(0.0, float(done_s))
        if not estimate > 0:
            return 0.0
        if done < estimate:
            return estimate - done
        rho = done / estimate
        tail = self.ratios[bisect.bisect_right(self.ratios, rho):]
        if len(tail) >= max(1, self.min_samples):
            return (_quantile(tail, self.quantile) - rho) * estimate
        return max(done - estimate, 0.25 * estimate)


def _quantile(values: tuple[float, ...], q: float) -> float:
    """numpy's default (linear) quantile of sorted ``values``, without numpy's overhead."""
    pos = q * (len(values) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(values) - 1)
    return values[lo] + (values[hi] - values[lo]) * (pos - lo)


@dataclass(frozen=True)
class RunningJob:
    """A job unit holding GPUs now."""

    id: str
    team: str
    gpus: int
    priority: int
    started_at: datetime
    checkpointable: bool
    remaining_s: float
    """Estimated seconds of work left (``Overruns.remaining_s``: past its estimate, from how
    long units that finished overran theirs)."""
    last_checkpoint_at: datetime | None = None
    stop_by: datetime | None = None
    """When the admitter planned to checkpoint and stop it (end of its window), if ever."""
    kind: str = "job"
    min_gpus: int | None = None
    """An elastic job may be shrunk to as few as this many GPUs (a checkpoint, then a restart
    on fewer GPUs); None (the default) becomes ``gpus``: not elastic. ``gpus`` and
    ``remaining_s`` are what it holds and needs at its current size."""
    gpus_step: int = 1
    """An elastic job shrinks to multiples of this many GPUs (whole replicas)."""
    max_gpus: int | None = None
    """The GPUs it asks for (None: ``gpus``): an elastic unit running on fewer may be
    stopped to restart on more where they come free (``policy.growth``)."""
    deadline: datetime | None = None
    """Its request's deadline, if any: past it, a stopped unit is not admitted again, so it
    is never stopped to grow."""
    preemptions: int = 0
    max_preemptions: int | None = None
    """Its stops so far and its request's limit on them, if any (past the limit it runs only
    whole): a stop to grow spends one of them, so it is made only where at least one more is
    left for the service."""
    nodes: tuple[str, ...] = ()
    """The nodes its pods hold GPUs on (one per pod, its GPUs split evenly), when known: with a
    node view, ``decide()`` counts them back on these nodes when it ends, for a reservation
    of whole nodes."""
    cpu: float | None = None
    """CPU cores each of its pods requests (None: unknown; counted as none coming back)."""
    memory: int | None = None
    """Bytes of memory each of its pods requests (None: unknown)."""
    checkpoint_interval_s: float | None = None
    """Seconds between its periodic checkpoints (None: unknown): with it, a checkpoint is
    expected every interval from its last known one (or its start), and a planned stop is
    timed just after one (``decide()``)."""
    saves_on_stop: bool = False
    """It saves all it has done when told to stop, within its grace period
    (``checkpoint.saves_on_stop``): a planned stop loses it nothing, whenever it comes, so it
    is neither stopped early for a checkpoint nor spared as the costlier victim."""
    notice_s: float = 0.0
    """Seconds of notice it gets before a planned stop, to checkpoint in and acknowledge
    (the cooperative checkpoint; 0: none, a blind SIGTERM): its planned stops are decided
    this much earlier and, like those of a unit that saves on stop, lose nothing. It is still
    stopped early, just after a checkpoint, where the need comes before its next one (a
    blind unit's rule): that costs it nothing, and on the real pools the margin it gives
    the service was measured to keep the service's delay down (docs/benchmarks.md, "Checkpoint
    notices")."""

    def __post_init__(self) -> None:
        _elastic_min(self)

    @property
    def keeps_work_when_planned(self) -> bool:
        """A planned stop loses it nothing: it saves on stop, or checkpoints at a notice."""
        return self.checkpointable and (self.saves_on_stop or self.notice_s > 0)

    @property
    def elastic(self) -> bool:
        # __post_init__ (_elastic_min) always sets min_gpus
        assert self.min_gpus is not None
        return self.min_gpus < self.gpus and self.checkpointable

    def shrunk_size(self, room: float) -> int:
        """The most GPUs below its own it can shrink to within ``room`` (0: none)."""
        assert self.min_gpus is not None
        if not self.elastic:
            return 0
        return fitting_size(self.gpus, self.min_gpus, self.gpus_step, min(room, self.gpus - 1))

    def last_checkpoint(self, now: datetime) -> datetime:
        """Its latest checkpoint by ``now``: the last known one (or its start), advanced by
        whole checkpoint intervals when the interval is known."""
        since = self.last_checkpoint_at or self.started_at
        interval = self.checkpoint_interval_s
        if interval and interval > 0 and now > since:
            since += timedelta(seconds=interval * ((now - since).total_seconds() // interval))
        return since

    def next_checkpoint(self, now: datetime) -> datetime | None:
        """Its next checkpoint after ``now`` (None: the interval is unknown)."""
        interval = self.checkpoint_interval_s
        if not interval or interval <= 0:
            return None
        return self.last_checkpoint(now) + timedelta(seconds=interval)

    def unsaved_work_s(self, now: datetime, *, planned: bool = False) -> float:
        """Seconds of work a stop now would lose (since the last checkpoint or start): a
        stop's SIGTERM is no checkpoint, only the periodic ones count; except a planned stop
        of a unit that saves on stop or checkpoints at a notice, which loses nothing."""
        if planned and self.keeps_work_when_planned:
            return 0.0
        if not self.checkpointable:
            return (now - self.started_at).total_seconds()
        return max(0.0, (now - self.last_checkpoint(now)).total_seconds())


@dataclass(frozen=True)
class FreeProfile:
    """Free GPUs for research jobs over time, promised with ``confidence``.

    ``free[i]`` holds from ``start + i * step_s`` to the next step: the pool minus headroom minus
    the services' forecast usage, before any research job.
    """

    start: datetime
    step_s: int
    free: np.ndarray
    confidence: float
    made_at: datetime
    likely: np.ndarray | None = None
    """The median free GPUs on the same steps (never below ``free``), where the forecast has
    them: what is likely beside what is promised (None: only the promise is known)."""

    def index_at(self, when: datetime) -> int:
        """Step holding ``when`` (negative before the start, >= len after the end)."""
        return int((when - self.start).total_seconds() // self.step_s)

    def time_at(self, index: int) -> datetime:
        return self.start + timedelta(seconds=index * self.step_s)

    @property
    def end(self) -> datetime:
        return self.time_at(len(self.free))


@dataclass(frozen=True)
class ServingSignals:
    """Live signals of the inference services (vLLM and the autoscaler)."""

    observed_at: datetime | None
    """When the signals were read; None when they could not be read at all."""
    requests_waiting_per_replica: float = 0.0
    kv_cache_usage: float = 0.0
    gpus_short: int = 0
    """GPUs the services want now beyond what they hold and what is idle (pending replicas)."""
    idle_gpus: int | None = None
    """GPUs nobody holds right now; queue or KV pressure preempts only what these cannot
    cover (None: unknown, assume none)."""
    service_gpus: int | None = None
    """GPUs the services hold now (their replicas times GPUs per replica; None: unknown). With
    the pool's size it gives the GPUs free for jobs now, whoever holds them (``nowcast``)."""
    missing_since: datetime | None = None
    """With ``observed_at`` None: since when the signals have been missing, when that is known
    (e.g. since the daemon started and found the source down). None: for as long as can be."""

    def age_s(self, now: datetime) -> float | None:
        return None if self.observed_at is None else (now - self.observed_at).total_seconds()

    def missing_for_s(self, now: datetime) -> float | None:
        """How long nothing newer than ``observed_at`` was read (None: unknown, forever)."""
        since = self.observed_at or self.missing_since
        return None if since is None else max(0.0, (now - since).total_seconds())


@dataclass(frozen=True)
class PolicySettings:
    """The admission knobs the policy needs (from ``admission`` in idlegpu.yaml)."""

    grace_s: float = 600.0
    min_segment_s: float = 1800.0
    kv_cache_pressure: float = 0.95
    waiting_pressure: float = 8.0
    max_signal_age_s: float = 120.0
    missing_signals_preempt_after_s: float | None = 900.0
    max_forecast_age_s: float = 26 * 3600.0
    pressure_gpus: int = 4
    """GPUs to free on queue/KV pressure when the autoscaler names no figure (one replica)."""
    headroom_gpus: int = 0
    """GPUs always left to the service (the pool's headroom)."""
    restart_cost_s: float = 600.0
    """What stopping a job costs beyond its unsaved work, in seconds per GPU (restart, reload,
    warm-up): victims are chosen to free the need with the least unsaved work plus this."""
    runtimes_known: bool = False
    """Trust every running job's ``remaining_s`` within the grace period (only the
    simulator's oracle, which knows the true runtimes, may): a job about to finish is not
    stopped for a ramp that comes after it ends."""
    pool_gpus: int = 0
    """The pool's GPUs (``pool.total_gpus``; 0: unknown, no live correction)."""
    nowcast_half_life_s: float = 0.0
    """Correct the forecast by the live pool (``nowcast``): the gap between the GPUs free now
    and the promise for now, halving every this many seconds ahead (0: no correction)."""
    stop_after_checkpoint: bool = True
    """Time planned stops of checkpointable units with a known interval just after a
    checkpoint (``decide()``); False: stop when the need comes within the grace period."""
    whole_units_through_outages: bool = True
    """A unit that cannot checkpoint is not stopped when the live signals stay missing
    (``missing_signals_preempt_after_s``): the stop would lose all it did, and the cluster's
    own preemption (the best-effort PriorityClass) still puts the service first; the units
    that can checkpoint are told and stopped. False: every unit stops (the simulator's night
    and reactive baselines keep that rule, as defined and measured)."""
    whole_units_into_headroom: bool = True
    """A unit that cannot checkpoint runs into the headroom until the service needs its GPUs
    (``decide()``, 2); False: it is stopped as soon as the service eats into the headroom,
    as a unit that can checkpoint is (the simulator's night and reactive baselines keep that
    rule, the one they were defined and measured with)."""
    checkpointable_on_likely: bool = True
    """Checkpointable units are admitted, given their windows, backfilled and stopped for the
    forecast on the profile's median (``FreeProfile.likely``), units that cannot checkpoint
    on the promise (``decide()``, "Two curves"). False, or a profile without a median: every
    unit on the promise."""
    early_stop_only_if_likely: bool = False
    """True: a unit that has just checkpointed is stopped early, before the promise's
    shortfall, only if the profile's median (``FreeProfile.likely``) also falls short before
    its next checkpoint (an early stop saves work only when the shortfall comes, and costs
    the run it would have had when it does not). False (the default; and a profile without a
    median): whenever the promise falls short. Measured on the real pools
    (docs/admission.md): more harvest on ServeGen in 4 of 6 variants, but more service delay in 3 and
    more lost work on the real pool, so it is off."""
    node_reservation_s: float = 14400.0
    """With a node view, whole nodes are reserved for the first unit the nodes refuse only
    where they free up within this many seconds (0: never)."""
    grow_window_s: float = 7200.0
    """An elastic unit running on fewer GPUs than it asks is stopped just after a checkpoint
    to restart on more where at least one more step of them is free now and stays free on the
    promise for this long, with work left for that long (``policy.growth``); 0: never."""
    live_cap_s: float = 3600.0
    """For this long, new jobs get no more than the GPUs idle right now (minus headroom), even
    where the forecast promises more: a service above its forecast (an unplanned spike) tends
    to stay there a while, and starting jobs into it would only have them evicted."""


STOP_CAUSES = ("window", "forecast", "live", "signals", "grow")


@dataclass(frozen=True)
class Decision:
    action: Action
    job_id: str
    gpus: int
    """ADMIT: the GPUs granted (an elastic job may get fewer than it asks); SHRINK: the GPUs it
    keeps (it frees the rest); PREEMPT and DEFER: the GPUs it holds or asks for."""
    reason: str
    stop_by: datetime | None = None
    """For admissions, shrinks and renewals: when the job (on the GPUs granted or kept) must
    checkpoint and stop (end of its window), if before it would finish."""
    start_at: datetime | None = None
    """For deferrals with a reservation: when the job is expected to start."""
    planned: bool = False
    """For preemptions and shrinks: a proactive stop with the full lead time (its window
    closes, or the forecast ramp comes within the grace period), so the job checkpoints and
    stops cleanly; False when a live need or missing signals force it."""
    node: str | None = None
    """For admissions with a node view: the node it was fitted on (best fit; a multi-node
    unit: the node of its first pod). A one-pod Job does not pin it (the kube-scheduler
    places the pod); it is what the admission counted on."""
    nodes: tuple[str, ...] = ()
    """For admissions with a node view: every node counted on, one per pod, in pod order (a
    one-pod unit: ``(node,)``); a multi-node unit's pods are pinned to exactly these."""
    cause: str = ""
    """For preemptions and shrinks, what made it (``STOP_CAUSES``): ``window`` (its window
    closes), ``forecast`` (the forecast needs its GPUs within the grace period), ``live``
    (the live signals say the service needs them now: the backstop), ``signals`` (the live
    signals are missing too long) or ``grow`` (an elastic unit stops to restart on more
    GPUs, ``policy.growth``)."""


@dataclass(frozen=True)
class Plan:
    """Everything ``decide`` returns, in a deterministic order."""

    decisions: tuple[Decision, ...] = field(default_factory=tuple)

    def of(self, action: Action) -> list[Decision]:
        return [d for d in self.decisions if d.action is action]


def reload_s(checkpointable: bool, saved_work_s: float, restart_cost_s: float) -> float:
    """Seconds an attempt spends reloading before it works: ``restart_cost_s`` when it
    resumes from a checkpoint (it checkpoints and has saved work); 0 for a fresh start, whose
    load is part of its runtime, and for a unit that cannot checkpoint (it always starts
    afresh)."""
    return restart_cost_s if checkpointable and saved_work_s > 0 else 0.0


def family_of(image: str, step: str) -> str:
    """The runtime-estimate family of an image and step: image without its tag, ``#``, step."""
    return f"{image.rsplit(':', 1)[0]}#{step}"


VOLUME_KINDS: tuple[str, ...] = ("persistent_volume_claim", "empty_dir", "config_map", "secret")
"""The volume sources a unit may mount (never ``host_path``)."""
REF_KINDS: tuple[str, ...] = ("secret", "config_map")
"""What ``env_from`` and ``value_from`` may reference."""


@dataclass(frozen=True)
class UnitVolume:
    """One volume of a unit, mounted into its container at ``mount_path``.

    ``kind`` is one of :data:`VOLUME_KINDS`; ``source`` names the PersistentVolumeClaim,
    ConfigMap or Secret (empty for an ``empty_dir``). ``medium`` (``""``: the node's disk, or
    ``"Memory"``: tmpfs, e.g. ``/dev/shm``) and ``size_limit`` apply to an ``empty_dir`` only.
    """

    name: str
    kind: str
    mount_path: str
    source: str = ""
    read_only: bool = False
    sub_path: str | None = None
    medium: str = ""
    size_limit: str | None = None


@dataclass(frozen=True)
class EnvFromSource:
    """Every key of a Secret or ConfigMap (``kind`` in :data:`REF_KINDS`) as environment
    variables, each name preceded by ``prefix``."""

    kind: str
    name: str
    prefix: str = ""
    optional: bool = False


@dataclass(frozen=True)
class EnvKeyRef:
    """The environment variable ``name`` set from ``key`` of the Secret or ConfigMap
    ``source`` (``kind`` in :data:`REF_KINDS`): the value itself never enters the spec."""

    name: str
    kind: str
    source: str
    key: str
    optional: bool = False


@dataclass(frozen=True)
class UnitSpec:
    """One runnable unit of a job request: a pipeline step, or one member of a step's sweep.

    Everything a Kubernetes Job needs, already templated (parameters filled into args, env and
    volume ``sub_path``); volumes, ``env_from`` and ``env_refs`` name Secrets and ConfigMaps,
    never their contents.
    ``depends_on`` lists ``(step_index, member)`` units of the same request that must have
    succeeded first (a step waits for every member of the step before it).
    """

    step: str
    step_index: int
    member: int
    image: str
    command: tuple[str, ...]
    args: tuple[str, ...]
    env: tuple[tuple[str, str], ...]
    parameters: tuple[tuple[str, str], ...]
    gpus: int
    cpu: float
    memory: str
    runtime_estimate_s: float | None
    checkpointable: bool
    checkpoint_interval_s: float | None
    resume_args: tuple[str, ...]
    priority: int
    deadline: datetime | None
    max_preemptions: int | None
    output: str | None
    depends_on: tuple[tuple[int, int], ...]
    kind: str = "job"
    volumes: tuple[UnitVolume, ...] = ()
    env_from: tuple[EnvFromSource, ...] = ()
    env_refs: tuple[EnvKeyRef, ...] = ()
    """Environment variables whose values come from Secrets or ConfigMaps (after ``env``)."""
    ephemeral_storage_request: str | None = None
    ephemeral_storage_limit: str | None = None
    """Node-local disk (container writable layer, logs, disk ``empty_dir``s) as Kubernetes
    quantities; None: not set."""
    min_gpus: int | None = None
    """Elastic: the fewest GPUs it can run on (below ``gpus``, checkpointable); None: it runs
    on ``gpus`` only. An attempt on fewer GPUs is ``specs.resize_unit(spec, n)``."""
    gpus_step: int = 1
    """Elastic: below ``gpus`` it runs on multiples of this many GPUs (its data-parallel
    replicas); ``gpus`` and ``min_gpus`` are multiples of it."""
    nodes: int = 1
    """A multi-node (gang) unit: this many pods, one per node, started together or not at
    all (an Indexed Job). ``gpus``, ``cpu`` and ``memory`` are the unit's totals; each pod
    gets ``gpus_per_node`` GPUs and the same share of CPU and memory. 1: one pod."""
    saves_on_stop: bool = False
    """Its workload saves its state when told to stop (the request's
    ``checkpoint.saves_on_stop``): a planned stop keeps all its work, not only what the
    periodic checkpoints saved."""
    answers_notice: bool = False
    """Its workload carries the idlegpu helper (the request's ``checkpoint.notice``): a
    planned stop first annotates its pods with a checkpoint notice, and the stop comes at its
    acknowledgement or at the notice's deadline, whichever is first."""

    @property
    def gpus_per_node(self) -> int:
        return self.gpus // max(1, self.nodes)

    @property
    def cpu_per_node(self) -> float:
        return self.cpu / max(1, self.nodes)

    @property
    def family(self) -> str:
        """Runs of the same image and step are one family for runtime estimates."""
        return family_of(self.image, self.step)


@dataclass(frozen=True)
class NodeState:
    """One GPU node as admission sees it: what it can hold (allocatable) and what the pods
    bound to it request now (service replicas, research jobs, anything else). CPU in cores,
    memory in bytes."""

    name: str
    gpus: int
    cpu: float = 0.0
    memory: int = 0
    gpus_requested: int = 0
    cpu_requested: float = 0.0
    memory_requested: int = 0
    labels: tuple[tuple[str, str], ...] = ()
    schedulable: bool = True
    """False when cordoned (``spec.unschedulable``)."""
    ready: bool = True
    """The kubelet reports ``Ready=True``."""

    @property
    def usable(self) -> bool:
        return self.schedulable and self.ready

    @property
    def free_gpus(self) -> int:
        return max(0, self.gpus - self.gpus_requested) if self.usable else 0

    @property
    def free_cpu(self) -> float:
        return max(0.0, self.cpu - self.cpu_requested) if self.usable else 0.0

    @property
    def free_memory(self) -> int:
        return max(0, self.memory - self.memory_requested) if self.usable else 0


@dataclass(frozen=True)
class NodeView:
    """The pool's nodes now (the Kubernetes adapter's ``nodes()``, or the shapes of
    ``pool.nodes`` for planning); ``decide()`` admits a unit only where one node holds it (a
    multi-node unit: where N distinct nodes hold a pod each)."""

    nodes: tuple[NodeState, ...] = ()
    observed_at: datetime | None = None
    bound_jobs: frozenset[str] = frozenset()
    """Names of the Jobs whose pods are bound to these nodes (their requests are counted)."""
    bound_at: frozenset[tuple[str, str]] = frozenset()
    """``(Job name, node)`` of every pod bound to these nodes (a gang's pods bind one by
    one)."""

    @property
    def free_gpus(self) -> int:
        return sum(node.free_gpus for node in self.nodes)

    @property
    def max_free_gpus(self) -> int:
        return max((node.free_gpus for node in self.nodes), default=0)

    @classmethod
    def of_shapes(cls, shapes: Iterable[NodeShape],
                  observed_at: datetime | None = None) -> NodeView:
        """Empty nodes of the shapes of ``pool.nodes`` (``NodeShape``: gpus, cpu, memory,
        labels, count), named ``node-<i>`` (for the simulator and planning)."""
        nodes: list[NodeState] = []
        for shape in shapes:
            for _ in range(shape.count):
                nodes.append(NodeState(
                    name=f"node-{len(nodes)}", gpus=shape.gpus, cpu=float(shape.cpu or 0.0),
                    memory=int(shape.memory_bytes or 0),
                    labels=tuple(sorted(shape.labels.items()))))
        return cls(tuple(nodes), observed_at=observed_at)

    def claiming(self, claims: Mapping[str, tuple[int, float, int]]) -> NodeView:
        """This view with ``claims`` (``{node: (gpus, cpu, memory)}``: what admissions counted
        on whose pods are not bound yet) added to what those nodes have requested."""
        if not claims:
            return self
        nodes = []
        for node in self.nodes:
            gpus, cpu, memory = claims.get(node.name, (0, 0.0, 0))
            nodes.append(replace(node, gpus_requested=node.gpus_requested + gpus,
                                 cpu_requested=node.cpu_requested + cpu,
                                 memory_requested=node.memory_requested + memory)
                         if (gpus or cpu or memory) else node)
        return replace(self, nodes=tuple(nodes))


EXTERNAL_ORIGINS: tuple[str, ...] = ("kueue", "job")
"""Where a unit outside the store comes from: a Kueue Workload, a user's own Job."""
EXTERNAL_STATES: tuple[str, ...] = ("waiting", "admitted", "running", "stopping", "refused",
                                    "ended")
"""``admitted``: idlegpu said yes, the Workload has not started (Kueue, or another check)."""


@dataclass(frozen=True)
class ExternalUnit:
    """A unit that lives outside the job store (a Kueue Workload on idlegpu's admission check,
    a user's own suspended Job) as the daemon's last pass saw it: what ``idlegpu queue``, the
    job API and the console list beside the stored units, and what the monthly report counts
    (the store keeps when each held its GPUs)."""

    id: str
    """``kueue/<namespace>/<name>`` or ``job/<namespace>/<name>``."""
    origin: str
    """One of ``EXTERNAL_ORIGINS``."""
    namespace: str
    name: str
    team: str
    gpus: int
    state: str
    """One of ``EXTERNAL_STATES``."""
    reason: str = ""
    """Why it waits (or was refused, or stopped), as the policy or Kueue says it."""
    start_at: datetime | None = None
    """A waiting unit's estimated start, when the policy has one."""
    stop_by: datetime | None = None
    """A running unit's planned stop (its window's end), when it has one."""
    since: datetime | None = None
    """When a running unit was admitted."""
