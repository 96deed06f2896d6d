"""The leader's way out: no release while a write it let through may still land.

A released Lease lets a standby lead at once, with no margin at all. So on SIGTERM the
elector closes the gate, waits (within its release budget) until no write the gate
admitted is in flight, and releases only then; if one is still in flight, or one went
unanswered within a lease duration, it leaves the Lease to expire. And however the
elector's run ends, by an exception too, the gate is closed. The Lease stores whole
seconds, so a lease duration that is not whole seconds is refused, not truncated.
"""

from __future__ import annotations

import http.server
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from test_leaderelection import (
    Callbacks,
    FakeClock,
    FakeLeaseClient,
    FakeLeaseStore,
    elector,
)

from himitsu_controller.runtime.client.rest import (
    ClientConfig,
    HttpClient,
    Resource,
    RestClient,
    new_api_client,
)
from himitsu_controller.runtime.controller import Controller, Result
from himitsu_controller.runtime.leader import election as leaderelection
from himitsu_controller.runtime.leader.election import LeaderElectionConfig, LeaderElector
from himitsu_controller.runtime.leader.writegate import WriteGate
from himitsu_controller.runtime.manager import Manager

WIDGETS = Resource("example.io", "v1", "widgets")
WAIT = 10.0


@pytest.fixture
def store() -> FakeLeaseStore:
    return FakeLeaseStore()


class HoldingServer:
    """Receives every write and answers it only once ``release`` is set (a slow webhook)."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.received = threading.Event()
        self.committed = threading.Event()
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def do_PUT(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                outer.received.set()
                outer.release.wait(WAIT)
                outer.committed.set()
                self.send_response(200)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"{}")

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        threading.Thread(target=self.httpd.serve_forever, args=(0.05,), daemon=True).start()

    def api_client(self) -> HttpClient:
        url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        return new_api_client(ClientConfig(url), pool_maxsize=4)


@pytest.fixture
def holding() -> Iterator[HoldingServer]:
    server = HoldingServer()
    yield server
    server.release.set()
    server.httpd.shutdown()
    server.httpd.server_close()


def test_sigterm_does_not_release_the_lease_while_a_gated_write_is_in_flight(
        store: FakeLeaseStore, holding: HoldingServer) -> None:
    """The drain budget runs out with a write at the apiserver: the Lease must still be
    held when the manager is done, so the standby cannot lead before that write lands."""
    gate = WriteGate()
    api_client = holding.api_client()
    rest = RestClient(api_client, write_gate=gate)
    config = LeaderElectionConfig(namespace="default", name="lock", identity="a",
                                  lease_duration=15.0, renew_deadline=10.0, retry_period=0.1)

    def factory(started: Any, stopped: Any) -> LeaderElector:
        return LeaderElector(FakeLeaseClient(store), config, on_started_leading=started,
                             on_stopped_leading=stopped, gate=gate)

    def reconcile(key: str) -> Result:
        rest.update(WIDGETS, {"metadata": {"name": "a", "namespace": "ns"}}, timeout=WAIT)
        return Result()

    ctrl = Controller("w", reconcile, workers=1)
    mgr = Manager(metrics_bind_address="0", health_probe_bind_address="0",
                  leader_election=factory, graceful_shutdown_timeout=1.0)
    mgr.add_controller(ctrl)
    runner = threading.Thread(target=mgr.run, daemon=True)
    runner.start()
    try:
        assert wait_until(gate.is_open)
        ctrl.enqueue("ns/a")
        assert holding.received.wait(WAIT)  # the write passed the gate, is at the server
        mgr.request_stop()  # SIGTERM
        runner.join(WAIT)
        assert not runner.is_alive()
        assert not holding.committed.is_set()
        assert store.spec().get("holderIdentity") == "a", "released with a write in flight"
        b = elector(FakeLeaseClient(store), "b")
        assert not b.try_acquire_or_renew()  # the standby's next retry: still held
    finally:
        holding.release.set()
        api_client.close()


def test_a_write_that_went_unanswered_keeps_the_lease_from_being_released(
        store: FakeLeaseStore) -> None:
    clock = FakeClock()
    stop = threading.Event()
    gate = WriteGate(clock=clock)

    def wait(event: threading.Event, seconds: float) -> bool:
        assert gate.admit() is not None  # a write goes out while leading...
        gate.done(answered=False)  # ...and its answer never comes (aborted, reset)
        stop.set()
        return True

    a = elector(FakeLeaseClient(store, clock=clock), "a", clock=clock, gate=gate, wait=wait)
    assert a.run(stop) is True
    assert store.spec()["holderIdentity"] == "a"  # left to expire
    assert not gate.is_open()


def test_an_answered_write_does_not_keep_the_lease_from_being_released(
        store: FakeLeaseStore) -> None:
    clock = FakeClock()
    stop = threading.Event()
    gate = WriteGate(clock=clock)

    def wait(event: threading.Event, seconds: float) -> bool:
        assert gate.admit() is not None
        gate.done(answered=True)
        stop.set()
        return True

    a = elector(FakeLeaseClient(store, clock=clock), "a", clock=clock, gate=gate, wait=wait)
    assert a.run(stop) is True
    assert "holderIdentity" not in store.spec()  # released


def test_the_gate_closes_when_the_electors_run_raises(store: FakeLeaseStore) -> None:
    clock = FakeClock()
    gate = WriteGate(clock=clock)

    def wait(event: threading.Event, seconds: float) -> bool:
        raise RuntimeError("a bug in the renew loop")

    callbacks = Callbacks()
    a = elector(FakeLeaseClient(store, clock=clock), "a", clock=clock, gate=gate, wait=wait,
                callbacks=callbacks)
    with pytest.raises(RuntimeError):
        a.run(threading.Event())
    assert callbacks.started.is_set()  # it led, its gate was open...
    assert not gate.is_open()  # ...and is closed now, not at the end of its validity


def test_a_write_may_run_half_the_margin_past_the_gate_never_to_the_takeover(
        store: FakeLeaseStore) -> None:
    clock = FakeClock()
    a = elector(FakeLeaseClient(store, clock=clock), "a", clock=clock)
    assert a.try_acquire_or_renew()  # sent at 0: lease 15, renew deadline 10
    clock.now = 9.0
    allowed = a.gate.admit()
    assert allowed is not None
    # over by 12.5: after the gate closes (10), before a standby may take over (15)
    assert 9.0 + allowed == pytest.approx(12.5)
    a.gate.done(answered=True)


def test_a_lease_duration_that_is_not_whole_seconds_is_refused() -> None:
    """leaseDurationSeconds is an integer: 3.5 s stored as 3 would let a standby lead
    0.5 s sooner than the gate (from 3.5 s) assumes."""
    with pytest.raises(ValueError, match="whole seconds"):
        LeaderElectionConfig("ns", "l", "id", lease_duration=3.5, renew_deadline=3.2,
                             retry_period=1.0)
    LeaderElectionConfig("ns", "l", "id", lease_duration=4.0, renew_deadline=3.2,
                         retry_period=1.0)


def wait_until(condition: Any) -> bool:
    pause = threading.Event()
    for _ in range(int(WAIT / 0.01)):
        if condition():
            return True
        pause.wait(0.01)
    return False


def test_the_term_end_is_logged_before_the_release_write(
        store: FakeLeaseStore, monkeypatch: pytest.MonkeyPatch) -> None:
    """A standby may lead as soon as the release lands, before "released the lease" is
    logged: so a line logged before that write, with the gate closed, ends the term
    (tests/e2e/kind_watch.py's one-leader-at-a-time check reads it)."""
    clock = FakeClock()
    stop = threading.Event()
    gate = WriteGate(clock=clock)
    seen: list[tuple[str, object, bool]] = []

    class Recorder:
        def __getattr__(self, level: str) -> Any:
            def record(event: str, *args: Any, **kwargs: Any) -> None:
                try:
                    holder = store.spec().get("holderIdentity")
                except KeyError:  # no Lease yet
                    holder = None
                seen.append((event, holder, gate.is_open()))
            return record

    monkeypatch.setattr(leaderelection, "log", Recorder())

    def wait(event: threading.Event, seconds: float) -> bool:
        stop.set()
        return True

    a = elector(FakeLeaseClient(store, clock=clock), "a", clock=clock, gate=gate, wait=wait)
    assert a.run(stop) is True
    assert "holderIdentity" not in store.spec()  # released
    events = [event for event, _, _ in seen]
    assert "releasing the lease" in events
    at = events.index("releasing the lease")
    assert seen[at][1:] == ("a", False)  # still ours, the gate already closed
    assert events.index("released the lease") > at
