"""Leader election (``idlegpu.scheduler.adapters.lease``) on a REAL kube-apiserver's Leases.

Short timings keep it quick: a 3 s lease, a 2 s renew deadline, a 0.5 s retry period (the
daemon's defaults are 15/10/2; the algorithm is the same)."""

from __future__ import annotations

import json
import threading
import time
from datetime import UTC, datetime, timedelta

import pytest

from idlegpu.scheduler.adapters.lease import LeaderElector

DURATION, DEADLINE, RETRY = 3.0, 2.0, 0.5
JITTERED = RETRY * 2.2  # the longest wait between a candidate's tries


@pytest.fixture
def candidates(kube_control_plane, kube_namespace):
    """``make(identity, name="lease") -> LeaderElector`` (not started); all stopped after."""
    made: list[LeaderElector] = []
    clients = []

    def make(identity: str, name: str = "idlegpu", **kw) -> LeaderElector:
        client = kube_control_plane.api_client()
        clients.append(client)
        options = {"lease_duration_s": DURATION, "renew_deadline_s": DEADLINE,
                   "retry_period_s": RETRY, **kw}
        elector = LeaderElector(client, namespace=kube_namespace, name=name,
                                identity=identity, **options)
        made.append(elector)
        return elector

    yield make
    for elector in made:
        elector.stop(release=False)
    for client in clients:
        client.close()


def lease_spec(cp, namespace, name="idlegpu"):
    from kubernetes import client

    with cp.api_client() as api:
        raw = client.CoordinationV1Api(api).read_namespaced_lease(
            name, namespace, _preload_content=False)
        return json.loads(raw.data)["spec"]


def wait_for(predicate, timeout, step=0.02):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if predicate():
            return time.monotonic()
        time.sleep(step)
    return None


class Watch:
    """Samples who leads every 20 ms in a thread: the most leaders seen at one instant."""

    def __init__(self, electors):
        self.electors = electors
        self.max_at_once = 0
        self.leaders: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        while not self._stop.is_set():
            now = [e.identity for e in self.electors if e.is_leader()]
            self.max_at_once = max(self.max_at_once, len(now))
            for who in now:
                if not self.leaders or self.leaders[-1] != who:
                    self.leaders.append(who)
            time.sleep(0.02)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()


def test_one_leader_among_two_candidates(candidates, kube_control_plane, kube_namespace):
    a, b = candidates("replica-a"), candidates("replica-b")
    with Watch([a, b]) as watch:
        a.start()
        b.start()
        assert wait_for(lambda: a.is_leader() or b.is_leader(), 10)
        time.sleep(3 * DURATION)  # several lease periods of renewals
    assert watch.max_at_once == 1 and len(watch.leaders) == 1, watch.leaders
    leader = watch.leaders[0]
    spec = lease_spec(kube_control_plane, kube_namespace)
    assert spec["holderIdentity"] == leader and spec["leaseDurationSeconds"] == DURATION
    assert spec["leaseTransitions"] == 0  # created by its first holder, renewed since
    assert spec["acquireTime"] < spec["renewTime"]  # renewals move renewTime only
    standby = b if leader == "replica-a" else a
    assert standby.holder == leader and not standby.is_leader()


def test_a_candidate_takes_over_only_after_the_lease_duration(candidates, kube_control_plane,
                                                              kube_namespace):
    a, b = candidates("replica-a"), candidates("replica-b")
    a.start()
    assert wait_for(a.is_leader, 10)
    b.start()
    assert wait_for(lambda: b.holder == "replica-a", 5)
    time.sleep(DURATION)  # b has watched a renew for a whole lease period, never taking over
    assert not b.is_leader()
    with Watch([a, b]) as watch:
        a.stop(release=False)  # a dies: it stops renewing, releases nothing
        killed = time.monotonic()
        took = wait_for(b.is_leader, DURATION + 10)
    assert took is not None
    takeover = took - killed
    print(f"\ntakeover after the leader stopped renewing: {takeover:.2f} s "
          f"(lease {DURATION:g} s, retry {RETRY:g} s)")
    # a's last renewal was at most one retry period before it stopped; b waits out a whole
    # lease from when it saw that renewal, and notices within its (jittered) retry period
    assert DURATION - RETRY - 0.1 <= takeover <= DURATION + 2 * JITTERED + 1.0, takeover
    assert watch.max_at_once == 1
    spec = lease_spec(kube_control_plane, kube_namespace)
    assert spec["holderIdentity"] == "replica-b" and spec["leaseTransitions"] == 1


def test_expiry_is_timed_on_the_candidates_clock_not_the_servers_timestamps(
        candidates, kube_control_plane, kube_namespace):
    """A record whose renewTime says it expired an hour ago still gets a whole lease duration
    from when this candidate first saw it (clock skew between machines does not matter)."""
    from kubernetes import client

    long_ago = (datetime.now(UTC) - timedelta(hours=1)).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    with kube_control_plane.api_client() as api:
        client.CoordinationV1Api(api).create_namespaced_lease(kube_namespace, {
            "metadata": {"name": "idlegpu"},
            "spec": {"holderIdentity": "ghost", "leaseDurationSeconds": int(DURATION),
                     "acquireTime": long_ago, "renewTime": long_ago, "leaseTransitions": 4}})
    b = candidates("replica-b")
    first = time.monotonic()
    assert not b.run_once()  # sees the record: held by ghost, just observed
    took = wait_for(b.run_once, DURATION + 5, step=RETRY)
    assert took is not None and took - first >= DURATION, took - first
    spec = lease_spec(kube_control_plane, kube_namespace)
    assert spec["holderIdentity"] == "replica-b" and spec["leaseTransitions"] == 5
    assert spec["acquireTime"] == spec["renewTime"] > long_ago


def test_release_hands_over_at_once(candidates, kube_control_plane, kube_namespace):
    a, b = candidates("replica-a"), candidates("replica-b")
    a.start()
    assert wait_for(a.is_leader, 10)
    b.start()
    assert wait_for(lambda: b.holder == "replica-a", 5)
    with Watch([a, b]) as watch:
        released = time.monotonic()
        a.stop(release=True)  # SIGTERM: holder cleared, duration 1 s
        assert not a.is_leader()
        took = wait_for(b.is_leader, DURATION)
    assert took is not None
    handover = took - released
    print(f"\nhand-over after a release: {handover:.2f} s (lease {DURATION:g} s)")
    assert handover < JITTERED + 0.5 < DURATION, handover
    assert watch.max_at_once == 1
    spec = lease_spec(kube_control_plane, kube_namespace)
    assert spec["holderIdentity"] == "replica-b" and spec["leaseTransitions"] == 1


def test_the_leader_steps_down_when_it_cannot_renew_before_anyone_takes_over(
        candidates, kube_control_plane, kube_namespace):
    from kubernetes.client.exceptions import ApiException

    a, b = candidates("replica-a"), candidates("replica-b")
    a.start()
    assert wait_for(a.is_leader, 10)
    b.start()
    assert wait_for(lambda: b.holder == "replica-a", 5)

    def unavailable(*args, **kwargs):
        raise ApiException(status=503, reason="Service Unavailable")

    with Watch([a, b]) as watch:
        cut = time.monotonic()
        a.api.read_namespaced_lease = unavailable  # a loses the API server
        stepped = wait_for(lambda: not a.is_leader(), DEADLINE + 2)
        took = wait_for(b.is_leader, DURATION + 10)
    assert stepped is not None and took is not None
    assert stepped - cut <= DEADLINE + 0.1  # within the renew deadline of its last renewal
    assert stepped < took  # never two leaders: a stepped down before b could take over
    assert watch.max_at_once == 1, watch.leaders


@pytest.mark.parametrize("preheld", [False, True], ids=["new-lease", "expired-lease"])
def test_racing_candidates_elect_exactly_one(candidates, kube_control_plane, kube_namespace,
                                             preheld):
    """Six candidates at once, on a missing Lease (one create wins, the rest get 409) or on
    an expired one (one resourceVersion-guarded update wins)."""
    from kubernetes import client

    if preheld:
        with kube_control_plane.api_client() as api:
            client.CoordinationV1Api(api).create_namespaced_lease(kube_namespace, {
                "metadata": {"name": "idlegpu"},
                "spec": {"holderIdentity": "ghost", "leaseDurationSeconds": 1,
                         "leaseTransitions": 0}})
    electors = [candidates(f"replica-{i}") for i in range(6)]
    if preheld:  # all have seen ghost's record; it expires for all at about the same time
        for e in electors:
            e.run_once()
        time.sleep(1.1)
    barrier = threading.Barrier(len(electors))
    results: dict[str, bool] = {}

    def race(e):
        barrier.wait()
        results[e.identity] = e.run_once()

    threads = [threading.Thread(target=race, args=(e,)) for e in electors]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    winners = [who for who, won in results.items() if won]
    assert len(winners) == 1, results
    with Watch(electors) as watch:
        for e in electors:
            e.start()
        time.sleep(2 * DURATION)
    assert watch.max_at_once == 1 and watch.leaders == winners, watch.leaders
    spec = lease_spec(kube_control_plane, kube_namespace)
    assert spec["holderIdentity"] == winners[0]
    assert spec["leaseTransitions"] == (1 if preheld else 0)
