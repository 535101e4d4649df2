"""Replay a pool history and a job trace through ``decide()`` to measure admission policies.

The simulated cluster follows the real pool's service usage step by step (the replica counts
of the history) and the service always wins: when it needs GPUs that jobs hold, those jobs are
evicted and get their grace period, and the service waits for it (counted as service delay).
Jobs progress while they run; a checkpointable job saves its progress every checkpoint
interval (and, when its workload saves on stop or answers a notice, at a planned stop); a stop
loses what was not saved, and a job that cannot checkpoint loses everything (it has nothing to
save, so it gets no grace period: its GPUs come back at once). A job that resumes from a
checkpoint first reloads it (``admission.restart_cost_seconds``): it holds its GPUs for that
long and does no work, and its checkpoints count from the end of the reload; that reload is
lost work, of its own cause. A fresh start's load is part of the job's runtime.

Policies, all driven by the same ``decide()``:

* ``night``: the fixed 20:00-08:00 local window of the original operator: whatever is free when
  a job is considered is assumed free until 08:00;
* ``reactive``: start whenever GPUs are free now, assuming they stay free; the live backstop
  preempts when the service needs them;
* ``forecast``: ours: the free-GPU profile of the ``auto`` forecaster at the configured
  confidence, refreshed every evening from the history before that moment only;
* ``oracle``: ours with perfect knowledge: the actual future replicas in place of the
  forecast, and every unit's true runtime in place of its estimate. It plans as ``forecast``
  does (a unit starts only where it fits), so it is no upper bound: admitting more and
  stopping often can harvest more;
* ``clairvoyant``: the reference that bounds them: it knows the true replicas and runtimes and
  **checkpoints at will**: any unit, stopped at any step, saves all it has done in its grace
  period, and resumes from it without a reload (restarts cost it nothing). Its own plan reads the true future as the oracle does, sees every unit as one that
  checkpoints (any window of a step worth using), and stops the units in the service's way a
  grace period before the service needs their GPUs, so it loses nothing and never delays the
  service. It plays the best of three plans by the work done: that one, reactive's admissions
  with its stops, and the oracle's (it may follow either), so it is never below the oracle.
  ``work_gpu_hours`` is the work done and kept; useful GPU-hours (held minus lost, the
  report's definition) count a planned stop's grace period as held, so where a trace runs dry
  a policy that stops more often can be credited more useful, never more work, and
  ``physical_limit_gpu_hours`` bounds the work.

**Gaps** in the replica history (a metrics outage) are treated as the daemon treats missing
live signals: no signals, so no admission, and every job that can checkpoint stops once they
have been missing for ``missing_signals_preempt_after`` (the night and reactive baselines stop
every job; ``PolicySettings.whole_units_through_outages``); the oracle's future has holes there (nothing is admitted
into them). Gap hours never count as idle (``unobserved_hours`` reports them); through a gap the
simulated cluster assumes the service stays where it was last seen.

**Elastic jobs** (``min_gpus`` below ``gpus``) may be admitted on fewer GPUs and shrunk
while they run: a shrink is a stop and a restart (the work since the last periodic checkpoint
is lost, as at any stop, unless ``saves_on_stop``), holds its GPUs through the grace
period, then runs on at the smaller size. A job on ``n`` of its ``gpus`` GPUs does
``n / gpus`` seconds of work per second (linear scaling), so useful and lost GPU-hours are
counted in GPU-seconds whatever the size (``shrinks`` counts the shrinks).

**Overruns**: a unit running past its estimate is given the remaining work of
``Overruns.remaining_s`` (learnt online from the units that finished so far), not one step.

**Placement** (``placement``): ``pool`` (the default) counts GPUs for the pool as one bin, as
above. ``spread`` and ``binpack`` put the cluster on the nodes of ``pool.nodes``: the
services' replicas are placed step by step by ``idlegpu.forecast.nodes.ServicePlacement`` (the
kube-scheduler's ``LeastAllocated`` or ``MostAllocated`` scoring for scale-ups, the ReplicaSet
controller's ranking for scale-downs; the state carries over, replicas never move), every
policy gets a ``NodeView`` of the simulated nodes each step and ``decide(..., nodes=view)``
places units on the nodes really free, and a unit bigger than the largest node that splits
into whole nodes is a multi-node (gang) unit of that many pods. Every unit's pods are pinned
to the nodes ``decide()`` counted on (``Decision.nodes``, as the daemon's Jobs are), so the
whole nodes it reserves for a gang stay free for it. A scale-up lands where jobs
are not; where no node has room, the replica evicts jobs on one node (kube-scheduler
preemption) and waits for their grace period, nominated there: its GPUs count as service
delay, as a pool-level shortfall does. A replica no node could hold even without jobs is not
delay (``service_unplaced_gpu_hours``). Evicting one pod of a multi-node unit stops the
whole unit.
"""

from __future__ import annotations

from idlegpu.scheduler.simulate.choices import PLACEMENTS, POLICIES
from idlegpu.scheduler.simulate.engine import simulate
from idlegpu.scheduler.simulate.jobs import (  # noqa: F401
    SimJob,
    _Job,
    _stop,
    shifted_jobs,
    trace_jobs,
)
from idlegpu.scheduler.simulate.profiles import forecast_profiles_for, pool_profiles_for
from idlegpu.scheduler.simulate.results import (
    CAUSE_NAMES,
    SimResult,
    _Run,  # noqa: F401
    delay_events,
    lost_work,
)
from idlegpu.scheduler.simulate.sweeps import (
    FRONTIER_METRICS,
    SWEEP_CONFIDENCES,
    simulate_policies,
    sweep,
)
# the private parts of a run (and the night policy's hours) that the tests read here
from idlegpu.scheduler.simulate.timeline import _steps_until_morning  # noqa: F401
from idlegpu.scheduler.types import NIGHT_HOURS  # noqa: F401

__all__ = ["CAUSE_NAMES", "FRONTIER_METRICS", "PLACEMENTS", "POLICIES", "SWEEP_CONFIDENCES",
           "SimJob", "SimResult", "delay_events", "forecast_profiles_for", "lost_work",
           "pool_profiles_for", "shifted_jobs", "simulate", "simulate_policies", "sweep",
           "trace_jobs"]
