"""Lease leader election against an in-memory Lease store with resourceVersion conflicts."""

from __future__ import annotations

import copy
import re
import socket
import threading
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from himitsu_controller.runtime.client.errors import ApiError, TransportError
from himitsu_controller.runtime.client.rest import Resource
from himitsu_controller.runtime.leader.election import (
    LEASES,
    LeaderElectionConfig,
    LeaderElector,
    default_identity,
)
from himitsu_controller.runtime.leader.writegate import WriteGate
from himitsu_controller.runtime.metrics import REGISTRY

TIMEOUT = 10.0
MICRO_TIME = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z$")


class FakeLeaseStore:
    """Leases by "namespace/name" with apiserver-like resourceVersion checks."""

    def __init__(self) -> None:
        self.leases: dict[str, dict[str, Any]] = {}
        self.version = 0
        self.lock = threading.Lock()

    def lease(self, name: str = "lock") -> dict[str, Any]:
        with self.lock:
            return copy.deepcopy(self.leases[f"default/{name}"])

    def spec(self, name: str = "lock") -> dict[str, Any]:
        spec: dict[str, Any] = self.lease(name)["spec"]
        return spec

    def touch(self, name: str = "lock") -> None:
        """A change that leaves the spec alone (a label, say): a new resourceVersion."""
        with self.lock:
            self.version += 1
            self.leases[f"default/{name}"]["metadata"]["resourceVersion"] = str(self.version)

    def force(self, name: str, spec: Mapping[str, Any]) -> None:
        """Someone else writes the Lease (create or overwrite), bumping its version."""
        with self.lock:
            self.version += 1
            self.leases[f"default/{name}"] = {
                "metadata": {"name": name, "namespace": "default",
                             "resourceVersion": str(self.version)},
                "spec": {k: v for k, v in spec.items() if v is not None}}


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@dataclass
class FakeLeaseClient:
    """The elector's REST calls on ``store``. On a simulated ``clock`` a request takes
    ``latency`` (the store changes when it is sent, the answer comes after), or, sent from
    ``hang_from`` on, its whole timeout and then fails, like a connection that hangs."""

    store: FakeLeaseStore
    broken: bool = False
    before_update: Callable[[], None] | None = None
    clock: FakeClock | None = None
    latency: float = 0.0
    hang_from: float | None = None
    calls: list[str] = field(default_factory=list)
    sent: list[tuple[str, float, float]] = field(default_factory=list)  # verb, at, timeout
    called: threading.Event = field(default_factory=threading.Event)

    def _check(self, verb: str, resource: Resource, timeout: float) -> None:
        assert resource == LEASES
        self.calls.append(verb)
        self.called.set()
        if self.clock is not None:
            self.sent.append((verb, self.clock.now, timeout))
            if self.hang_from is not None and self.clock.now >= self.hang_from:
                self.clock.now += timeout
                raise TransportError("read timed out")
            if self.latency > timeout:
                self.clock.now += timeout
                raise TransportError("read timed out")
        if self.broken:
            raise TransportError("connection refused")

    def _answer(self, answer: dict[str, Any]) -> dict[str, Any]:
        if self.clock is not None:
            self.clock.now += self.latency
        return answer

    def get(self, resource: Resource, name: str, *, namespace: str | None = None,
            timeout: float = 30.0) -> dict[str, Any]:
        self._check("get", resource, timeout)
        with self.store.lock:
            lease = self.store.leases.get(f"{namespace}/{name}")
            if lease is None:
                raise ApiError(404, "NotFound", f"leases {name!r} not found")
            found = copy.deepcopy(lease)
        return self._answer(found)

    def create(self, resource: Resource, body: Mapping[str, Any], *,
               namespace: str | None = None, timeout: float = 30.0) -> dict[str, Any]:
        self._check("create", resource, timeout)
        key = f"{namespace}/{body['metadata']['name']}"
        with self.store.lock:
            if key in self.store.leases:
                raise ApiError(409, "AlreadyExists", "leases already exists")
            stored = self._store(key, body)
        return self._answer(stored)

    def update(self, resource: Resource, body: Mapping[str, Any], *,
               namespace: str | None = None, timeout: float = 30.0) -> dict[str, Any]:
        self._check("update", resource, timeout)
        if self.before_update is not None:
            hook, self.before_update = self.before_update, None
            hook()
        key = f"{namespace}/{body['metadata']['name']}"
        with self.store.lock:
            current = self.store.leases[key]
            if body["metadata"].get("resourceVersion") != current["metadata"]["resourceVersion"]:
                self._answer({})
                raise ApiError(409, "Conflict", "the object has been modified")
            stored = self._store(key, body)
        return self._answer(stored)

    def _store(self, key: str, body: Mapping[str, Any]) -> dict[str, Any]:
        self.store.version += 1
        stored = copy.deepcopy(dict(body))
        stored["metadata"]["resourceVersion"] = str(self.store.version)
        stored["spec"] = {k: v for k, v in stored["spec"].items() if v is not None}
        self.store.leases[key] = stored
        return copy.deepcopy(stored)


class FakeWallClock:
    def __init__(self, start: datetime) -> None:
        self.now = start

    def __call__(self) -> datetime:
        return self.now


@dataclass
class Callbacks:
    started: threading.Event = field(default_factory=threading.Event)
    stopped: threading.Event = field(default_factory=threading.Event)
    stopped_calls: int = 0
    when_stopped: Callable[[], None] | None = None

    def on_started(self) -> None:
        self.started.set()

    def on_stopped(self) -> None:
        self.stopped_calls += 1
        if self.when_stopped is not None:
            self.when_stopped()
        self.stopped.set()


STEP_CONFIG = {"lease_duration": 15.0, "renew_deadline": 10.0, "retry_period": 2.0}
FAST_CONFIG = {"lease_duration": 2.0, "renew_deadline": 1.0, "retry_period": 0.05}


def elector(client: FakeLeaseClient, identity: str, *, lease: str = "lock",
            callbacks: Callbacks | None = None, timing: Mapping[str, float] = STEP_CONFIG,
            **options: Any) -> LeaderElector:
    callbacks = callbacks or Callbacks()
    config = LeaderElectionConfig(namespace="default", name=lease, identity=identity,
                                  **timing)
    return LeaderElector(client, config, on_started_leading=callbacks.on_started,
                         on_stopped_leading=callbacks.on_stopped, rng=lambda: 0.0, **options)


@pytest.fixture
def store() -> FakeLeaseStore:
    return FakeLeaseStore()


@dataclass
class Running:
    elector: LeaderElector
    callbacks: Callbacks
    stop: threading.Event
    thread: threading.Thread
    result: list[bool]


@pytest.fixture
def run_elector() -> Iterator[Callable[..., Running]]:
    running: list[Running] = []

    def _run(client: FakeLeaseClient, identity: str, lease: str) -> Running:
        callbacks = Callbacks()
        candidate = elector(client, identity, lease=lease, callbacks=callbacks,
                            timing=FAST_CONFIG)
        stop = threading.Event()
        result: list[bool] = []
        thread = threading.Thread(target=lambda: result.append(candidate.run(stop)),
                                  daemon=True)
        thread.start()
        running.append(Running(candidate, callbacks, stop, thread, result))
        return running[-1]

    yield _run
    for item in running:
        item.stop.set()
        item.thread.join(TIMEOUT)
        assert not item.thread.is_alive()


def master_status(lease: str) -> float | None:
    return REGISTRY.get_sample_value("leader_election_master_status", {"name": lease})


# One attempt at a time, on injected clocks.

def test_two_candidates_one_leader(store: FakeLeaseStore) -> None:
    a = elector(FakeLeaseClient(store), "a")
    b = elector(FakeLeaseClient(store), "b")
    assert a.try_acquire_or_renew()
    assert not b.try_acquire_or_renew()
    spec = store.spec()
    assert (spec["holderIdentity"], spec["leaseDurationSeconds"], spec["leaseTransitions"]) == (
        "a", 15, 0)
    assert MICRO_TIME.match(spec["acquireTime"])
    assert spec["acquireTime"] == spec["renewTime"]


def test_leader_renews_in_place_keeping_acquire_time(store: FakeLeaseStore) -> None:
    wall = FakeWallClock(datetime(2030, 1, 1, tzinfo=UTC))
    client = FakeLeaseClient(store)
    a = elector(client, "a", wall_clock=wall)
    assert a.try_acquire_or_renew()
    wall.now += timedelta(seconds=2, microseconds=5)
    assert a.try_acquire_or_renew()
    spec = store.spec()
    assert spec["acquireTime"] == "2030-01-01T00:00:00.000000Z"
    assert spec["renewTime"] == "2030-01-01T00:00:02.000005Z"
    assert spec["leaseTransitions"] == 0
    # The renewal is one optimistic update of the Lease we last wrote, no read.
    assert client.calls == ["get", "create", "update"]


def test_standby_takes_over_only_after_lease_duration_on_its_own_clock(
        store: FakeLeaseStore) -> None:
    # The leader's wall clock is decades behind: its renewTime looks ancient. The standby
    # must not trust it, only how long the record has stayed unchanged under its own eyes.
    wall_a = FakeWallClock(datetime(2000, 1, 1, tzinfo=UTC))
    a = elector(FakeLeaseClient(store), "a", wall_clock=wall_a)
    clock_b = FakeClock()
    b = elector(FakeLeaseClient(store), "b", clock=clock_b)
    assert a.try_acquire_or_renew()
    assert not b.try_acquire_or_renew()  # first sight of the record at t=0
    clock_b.now = 14.0
    assert not b.try_acquire_or_renew()
    wall_a.now += timedelta(seconds=14)
    assert a.try_acquire_or_renew()  # the leader renews: the record changes
    clock_b.now = 16.0
    assert not b.try_acquire_or_renew()  # the timer restarted at 16
    clock_b.now = 30.0
    assert not b.try_acquire_or_renew()
    clock_b.now = 31.5  # the leader stopped renewing 15.5 s ago by b's clock
    assert b.try_acquire_or_renew()
    spec = store.spec()
    assert (spec["holderIdentity"], spec["leaseTransitions"]) == ("b", 1)
    assert spec["acquireTime"].startswith("20") and not spec["acquireTime"].startswith("2000")


def test_concurrent_takeover_conflict_leaves_one_leader(store: FakeLeaseStore) -> None:
    store.force("lock", {"holderIdentity": "gone", "leaseDurationSeconds": 15})
    clock = FakeClock()
    b = elector(FakeLeaseClient(store), "b", clock=clock)
    c_client = FakeLeaseClient(store)
    c = elector(c_client, "c", clock=clock)
    assert not b.try_acquire_or_renew()
    assert not c.try_acquire_or_renew()
    clock.now = 16.0

    def b_takes_over() -> None:
        assert b.try_acquire_or_renew()

    # c has read the expired Lease; b takes it over before c's update lands.
    c_client.before_update = b_takes_over
    assert not c.try_acquire_or_renew()  # 409 Conflict
    assert store.spec()["holderIdentity"] == "b"
    assert store.spec()["leaseTransitions"] == 1
    assert not c.try_acquire_or_renew()  # and c now sees b's fresh record


def test_released_lease_is_acquired_at_once(store: FakeLeaseStore) -> None:
    store.force("lock", {"leaseDurationSeconds": 1, "leaseTransitions": 4,
                         "acquireTime": "2030-01-01T00:00:00.000000Z"})
    b = elector(FakeLeaseClient(store), "b", clock=FakeClock())
    assert b.try_acquire_or_renew()
    assert (store.spec()["holderIdentity"], store.spec()["leaseTransitions"]) == ("b", 5)


def test_unreadable_lease_is_not_acquired(store: FakeLeaseStore) -> None:
    assert not elector(FakeLeaseClient(store, broken=True), "a").try_acquire_or_renew()
    assert store.leases == {}


# The renew deadline is one deadline, on a simulated clock.

def simulated_wait(clock: FakeClock) -> Callable[[threading.Event, float], bool]:
    """The elector's pauses, passing in simulated time only."""
    def wait(stop: threading.Event, seconds: float) -> bool:
        clock.now += seconds
        return stop.is_set()

    return wait


def test_one_attempt_shares_one_deadline_across_its_requests(store: FakeLeaseStore) -> None:
    clock = FakeClock()
    client = FakeLeaseClient(store, clock=clock)
    a = elector(client, "a", clock=clock)
    assert a.try_acquire_or_renew()
    store.touch()  # the optimistic update will conflict: the attempt needs all three requests
    client.latency = 4.0  # each request takes 4 s of a 10 s deadline
    client.sent.clear()
    started = clock.now
    assert not a.try_acquire_or_renew(timeout=10.0)
    # Each request was given what was left, not the whole 10 s again; the third ran out.
    assert [(verb, at - started, timeout) for verb, at, timeout in client.sent] == [
        ("update", 0.0, 10.0), ("get", 4.0, 6.0), ("update", 8.0, 2.0)]
    assert clock.now - started == 10.0


def test_no_request_of_an_attempt_is_sent_after_its_deadline(store: FakeLeaseStore) -> None:
    clock = FakeClock()
    client = FakeLeaseClient(store, clock=clock)
    a = elector(client, "a", clock=clock)
    assert a.try_acquire_or_renew()
    client.hang_from = clock.now  # every request now takes its whole timeout, then fails
    client.sent.clear()
    started = clock.now
    assert not a.try_acquire_or_renew(timeout=10.0)
    assert [(verb, timeout) for verb, _, timeout in client.sent] == [("update", 10.0)]
    assert clock.now - started == 10.0


def test_a_leader_whose_connection_hangs_stops_renew_deadline_after_its_last_renewal(
        store: FakeLeaseStore) -> None:
    clock = FakeClock()
    client = FakeLeaseClient(store, clock=clock, latency=0.25, hang_from=7.0)
    callbacks = Callbacks()
    a = elector(client, "a", clock=clock, callbacks=callbacks, wait=simulated_wait(clock))
    stopped_at: list[float] = []
    callbacks.when_stopped = lambda: stopped_at.append(clock.now)
    assert a.run(threading.Event()) is False  # leadership lost, on simulated time
    config = a.config
    last_success = max(at for verb, at, _ in client.sent if at < 7.0 and verb != "get")
    # Nothing was sent, and nothing was waited for, past renew_deadline after the last
    # renewal was sent: the standby's takeover (lease_duration after it) comes later.
    assert all(at + timeout <= last_success + config.renew_deadline
               for _, at, timeout in client.sent)
    assert stopped_at == [pytest.approx(last_success + config.renew_deadline)]
    assert not a.gate.is_open()


def test_the_write_gate_closes_before_a_standby_may_take_the_lease(
        store: FakeLeaseStore) -> None:
    # The answer to the leader's acquire takes 6 s (more than lease_duration minus
    # renew_deadline) while the standby sees the new record the moment it is stored.
    clock = FakeClock()
    b = elector(FakeLeaseClient(store, clock=clock), "b", clock=clock)
    a_client = FakeLeaseClient(store, clock=clock, latency=6.0)
    a = elector(a_client, "a", clock=clock)
    assert not a.gate.is_open()  # closed until a first acquire
    assert a.try_acquire_or_renew(timeout=10.0)
    assert not b.try_acquire_or_renew()  # b's clock for a's record starts now, at 6 s
    assert a.gate.is_open()
    clock.now = 9.999
    assert a.gate.is_open()
    clock.now = 10.0  # renew_deadline after the acquire was *sent*, whenever it was stored
    assert not a.gate.is_open()
    while not b.try_acquire_or_renew():
        clock.now += 0.5
    # b took the Lease no sooner than lease_duration after a's record could change, and
    # a stopped writing lease_duration - renew_deadline before that.
    assert clock.now >= 15.0
    assert a.gate.remaining() <= -(a.config.lease_duration - a.config.renew_deadline)


def test_the_gate_opens_on_acquire_and_closes_on_release(
        store: FakeLeaseStore) -> None:
    clock = FakeClock()
    stop = threading.Event()
    callbacks = Callbacks()
    seen: list[bool] = []
    gate = WriteGate(clock=clock)

    def wait(event: threading.Event, seconds: float) -> bool:
        seen.append(gate.is_open())  # the first pause while leading: then stop
        stop.set()
        return True

    a = elector(FakeLeaseClient(store, clock=clock), "a", clock=clock, callbacks=callbacks,
                gate=gate, wait=wait)
    callbacks.when_stopped = lambda: seen.append(a.gate.is_open())
    assert a.run(stop) is True
    assert seen == [True, False]  # open while leading; closed before on_stopped
    assert "holderIdentity" not in store.spec()


# The run loop, on the real clock with short periods.

def test_stop_while_leading_releases_then_calls_on_stopped(
        store: FakeLeaseStore, run_elector: Callable[..., Running]) -> None:
    a = run_elector(FakeLeaseClient(store), "a", "release")
    assert a.callbacks.started.wait(TIMEOUT)
    assert a.elector.is_leader()
    assert master_status("release") == 1.0
    a.stop.set()
    a.thread.join(TIMEOUT)
    assert a.result == [True]
    assert a.callbacks.stopped_calls == 1
    assert not a.elector.is_leader()
    assert master_status("release") == 0.0
    spec = store.spec("release")
    assert "holderIdentity" not in spec
    assert (spec["leaseDurationSeconds"], spec["leaseTransitions"]) == (1, 0)
    # A standby that saw the Lease held a moment ago acquires it on its very next try.
    b = elector(FakeLeaseClient(store), "b", lease="release", clock=FakeClock())
    assert b.try_acquire_or_renew()


def test_two_running_candidates_one_leader_and_handover_on_stop(
        store: FakeLeaseStore, run_elector: Callable[..., Running]) -> None:
    first = run_elector(FakeLeaseClient(store), "a", "pair")
    assert first.callbacks.started.wait(TIMEOUT)
    second_client = FakeLeaseClient(store)
    second = run_elector(second_client, "b", "pair")
    assert second_client.called.wait(TIMEOUT)
    assert not second.elector.is_leader()
    first.stop.set()
    first.thread.join(TIMEOUT)
    assert first.result == [True]
    # Released: the standby takes over on its next retry, long before a lease duration.
    assert second.callbacks.started.wait(TIMEOUT)
    assert store.spec("pair")["holderIdentity"] == "b"
    assert store.spec("pair")["leaseTransitions"] == 1


def test_renew_failures_past_the_deadline_lose_leadership(
        store: FakeLeaseStore, run_elector: Callable[..., Running]) -> None:
    client = FakeLeaseClient(store)
    a = run_elector(client, "a", "lost")
    assert a.callbacks.started.wait(TIMEOUT)
    client.broken = True
    assert a.callbacks.stopped.wait(TIMEOUT)
    a.thread.join(TIMEOUT)
    assert a.result == [False]
    assert a.callbacks.stopped_calls == 1
    assert not a.elector.is_leader()
    assert master_status("lost") == 0.0
    assert store.spec("lost")["holderIdentity"] == "a"  # nothing released on a loss


def test_leader_that_finds_another_holder_stops_leading(
        store: FakeLeaseStore, run_elector: Callable[..., Running]) -> None:
    a = run_elector(FakeLeaseClient(store), "a", "stolen")
    assert a.callbacks.started.wait(TIMEOUT)
    store.force("stolen", {"holderIdentity": "intruder", "leaseDurationSeconds": 3600})
    a.thread.join(TIMEOUT)
    assert a.result == [False]
    assert a.callbacks.stopped_calls == 1
    assert store.spec("stolen")["holderIdentity"] == "intruder"


def test_stop_while_campaigning_returns_without_callbacks(
        store: FakeLeaseStore, run_elector: Callable[..., Running]) -> None:
    store.force("held", {"holderIdentity": "other", "leaseDurationSeconds": 3600})
    client = FakeLeaseClient(store)
    b = run_elector(client, "b", "held")
    assert client.called.wait(TIMEOUT)  # b made its first attempt and now waits to retry
    b.stop.set()
    b.thread.join(TIMEOUT)
    assert b.result == [True]
    assert not b.callbacks.started.is_set()
    assert b.callbacks.stopped_calls == 0
    assert master_status("held") == 0.0


# Configuration.

def test_config_rejects_unsafe_timings() -> None:
    with pytest.raises(ValueError, match="greater than the renew deadline"):
        LeaderElectionConfig("ns", "l", "id", lease_duration=10.0, renew_deadline=10.0)
    with pytest.raises(ValueError, match="retry period"):
        LeaderElectionConfig("ns", "l", "id", renew_deadline=2.0, retry_period=2.0)
    with pytest.raises(ValueError, match="identity"):
        LeaderElectionConfig("ns", "l", "")


def test_default_identity_is_hostname_and_uuid() -> None:
    first, second = default_identity(), default_identity()
    host, _, suffix = first.rpartition("_")
    assert host == socket.gethostname()
    assert re.fullmatch(r"[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[0-9a-f]{4}-[0-9a-f]{12}", suffix)
    assert first != second
