"""No HimitsuSecret ever stops being polled (issue 11, item 2).

The promise: every reconcile of an object with refreshInterval > 0 schedules a wake no
later than one refreshInterval ahead (a failure: its backoff), and never one of 0 or
less, which a work queue may read as "done". A late timed poll that shares an answer
older than ~0.9 of an interval used to compute its next due time in the past and return
``requeue_after=0.0``: the object stayed Ready with a frozen lastSyncTime, unpolled.

The reconciler runs for real on a simulated clock; Himitsu is either a fake behind the
real ``SharedPoller`` or a fetcher that answers with any answer the reconciler's
``max_age`` allows (a shared poller may legally give the oldest one).
"""

from __future__ import annotations

from datetime import timedelta

from fakes import FakeKube, b64
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from reconcile_world import NS, T0, TARGET, TOKEN, Clock, World, make_hsec, values

from himitsu_controller import himitsu
from himitsu_controller.runtime.controller import Result
from himitsu_controller.sync.polling import schedule
from himitsu_controller.sync.polling.polls import LocallyRateLimited, SharedPoller
from himitsu_controller.sync.reconciler import HimitsuSecretReconciler

INTERVAL = 60.0


class CountingHimitsu:
    """One environment at version 5; 304 when asked at 5. Counts requests."""

    def __init__(self) -> None:
        self.requests = 0

    def fetch(
        self, *, api_url: str, project_id: str, environment_id: str, token: str,
        known_version: int | None,
    ) -> himitsu.FetchResult:
        self.requests += 1
        if known_version == 5:
            return himitsu.NotModified(version=5)
        return himitsu.Fetched(version=5, secrets=values())


def shared_world(*names: str) -> tuple[FakeKube, Clock, CountingHimitsu, HimitsuSecretReconciler]:
    kube, clock, server = FakeKube(), Clock(), CountingHimitsu()
    kube.put_secret({"metadata": {"namespace": NS, "name": "himitsu-token"},
                     "data": {"token": b64(TOKEN)}})
    for name in names:
        obj = make_hsec()
        obj["metadata"]["name"] = name
        obj["spec"]["target"]["name"] = f"{name}-secrets"
        kube.add_himitsu_secret(obj)

    def epoch() -> float:
        return clock.now.timestamp()

    poller = SharedPoller(server, clock=epoch, rng=lambda: 0.0)
    reconciler = HimitsuSecretReconciler(kube, poller, now=clock, rng=lambda: 0.0)
    return kube, clock, server, reconciler


def at(clock: Clock, seconds: float) -> None:
    clock.now = T0 + timedelta(seconds=seconds)


def assert_wake_scheduled(result: Result, *, within: float) -> None:
    assert result.requeue_after is not None, f"no wake scheduled: {result}"
    assert 0 < result.requeue_after <= within, f"wake out of (0, {within}]: {result}"


def test_a_late_timed_poll_sharing_an_old_answer_still_schedules_its_next_poll() -> None:
    kube, clock, server, reconciler = shared_world("early", "late", "newcomer")
    assert reconciler.reconcile(f"{NS}/early").error is None  # t=0: request 1, due at 60
    assert reconciler.reconcile(f"{NS}/late").error is None  # t=0: shares it, due at 60
    at(clock, 35)
    assert reconciler.reconcile(f"{NS}/newcomer").error is None  # request 2 at t=35
    at(clock, 60)
    assert_wake_scheduled(reconciler.reconcile(f"{NS}/early"), within=INTERVAL)
    # "late"'s poll, due at 60, runs 40 s late (a backlog). The newest answer is 65 s
    # old; its next poll would be due at 95, already past.
    at(clock, 100)
    result = reconciler.reconcile(f"{NS}/late")
    assert result.error is None
    assert_wake_scheduled(result, within=INTERVAL)
    # ... and what it holds is recent enough that the wake keeps the lag promise.
    last_sync = kube.status(NS, "late")["lastSyncTime"]
    assert last_sync >= (clock.now - timedelta(seconds=(1 - schedule.JITTER) * INTERVAL)
                         ).strftime("%Y-%m-%dT%H:%M:%SZ")
    assert server.requests == 3


def test_a_last_sync_time_ahead_of_the_clock_waits_at_most_an_interval() -> None:
    # After a restart the first poll is deferred to lastSyncTime + refreshInterval; a
    # lastSyncTime from a replica whose clock ran ahead must not push it further out.
    world = World()
    world.sync(5)
    world.clock.advance(-600)  # this replica's clock is ten minutes behind the writer's
    world.restart()
    assert_wake_scheduled(world.reconcile(), within=INTERVAL)


def test_a_wall_clock_stepped_back_never_parks_a_poll_longer_than_the_interval() -> None:
    # Due times are on the wall clock, the work queue's waits on the monotonic one: NTP
    # stepping the node's clock back an hour must not add an hour to the wait.
    world = World()
    world.sync(5)  # next poll due at t=60 by the wall clock
    world.clock.advance(-3600)
    result = world.reconcile()  # any wake: the target's echo, the periodic resync
    assert_wake_scheduled(result, within=INTERVAL)
    world.clock.advance(result.requeue_after or 0.0)
    assert world.reconcile(himitsu.NotModified(5)).error is None  # that wake is the poll
    assert world.fetcher.known_versions == [None, 5]


# -- the invariant, for any sequence of answer ages, lateness, failures and restarts ----


class AnyAnswer:
    """A ``Fetcher`` that answers with an answer of any age ``max_age`` allows (drawn by
    the test), conditional when the reconciler sent a version, like the shared poller."""

    def __init__(self) -> None:
        self.next_age = 0.0  # fraction of max_age
        self.next_error: Exception | None = None
        self.jitter: float | None = None

    def fetch(
        self, *, api_url: str, project_id: str, environment_id: str, token: str,
        known_version: int | None, max_age: float = 0.0, reader: str | None = None,
    ) -> himitsu.FetchResult:
        error, self.next_error = self.next_error, None
        if error is not None:
            raise error
        age = self.next_age * max(0.0, max_age)
        if known_version == 5:
            return himitsu.NotModified(version=5, age=age, jitter=self.jitter)
        return himitsu.Fetched(version=5, secrets=values(), age=age, jitter=self.jitter)

    def remembered(
        self, *, api_url: str, project_id: str, environment_id: str, token: str,
    ) -> himitsu.Fetched | None:
        return None  # holds nothing

    def release(self, reader: str) -> None:
        pass


STEP = st.tuples(
    st.sampled_from(["due", "early", "fail", "429", "paced", "restart", "delete-target",
                     "clock-back"]),
    st.floats(0.0, 3.0),  # lateness (or, for "early", the fraction of the wait slept)
    st.floats(0.0, 1.0),  # the answer's age, as a fraction of the max_age allowed
    st.one_of(st.none(), st.floats(0.0, 0.999)),  # the answer's jitter draw
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(interval=st.sampled_from([1.0, 10.0, 60.0, 3600.0]),
       rng=st.floats(0.0, 0.999), steps=st.lists(STEP, min_size=1, max_size=25))
def test_every_reconcile_schedules_a_wake_within_the_interval_or_the_backoff_cap(
    interval: float, rng: float, steps: list[tuple[str, float, float, float | None]],
) -> None:
    fetcher = AnyAnswer()
    world = World(rng=rng, refreshInterval=f"{interval:g}s")
    world.fetcher = fetcher  # type: ignore[assignment]
    world.restart()
    result = world.reconciler.reconcile(f"{NS}/app-config")
    wait = check(result, interval, retry_after=0.0)
    for kind, late, age, jitter in steps:
        fetcher.next_age, fetcher.jitter = age, jitter
        retry_after = 0.0
        if kind == "early":
            world.clock.advance(wait * min(late, 1.0) * 0.99)
        else:
            world.clock.advance(wait + late * interval)
        if kind == "fail":
            fetcher.next_error = himitsu.ServerError("the Himitsu API answered 503", status=503)
        elif kind == "429":
            retry_after = late * interval + 1.0
            fetcher.next_error = himitsu.RateLimited("429", retry_after=retry_after)
        elif kind == "paced":
            fetcher.next_error = LocallyRateLimited("paced", retry_after=late * interval / 3)
        elif kind == "restart":
            world.restart()
        elif kind == "delete-target":
            world.kube.secrets.pop((NS, TARGET), None)
        elif kind == "clock-back":  # NTP steps the wall clock back, up to 30 intervals
            world.clock.advance(-10 * late * interval - wait)
        result = world.reconciler.reconcile(f"{NS}/app-config")
        wait = check(result, interval, retry_after=retry_after)


def check(result: Result, interval: float, *, retry_after: float) -> float:
    """The invariant; returns the wait the result asked for."""
    assert result.requeue_after is not None, f"no wake scheduled: {result}"
    bound = interval
    if result.error is not None:
        bound = max(schedule.backoff(30, interval), retry_after)
    assert 0 < result.requeue_after <= bound + 1e-6, (result, bound)
    return result.requeue_after
