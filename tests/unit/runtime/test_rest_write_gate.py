"""The write gate of RestClient, and clients with no hidden retries.

A replica that can no longer vouch for its Lease must not send a write: the gate is
asked immediately before each write leaves (after the rate limiter's wait, before a
429 retry), reads go on, and a write the gate let through is sent once. The leader
elector's client retries nothing on its own: each retry would get a whole timeout again.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator

import pytest
from fake_apiserver import Canned, FakeApiServer, status_body
from fakes import SleepClock

from himitsu_controller.runtime.client.rest import (
    ApiError,
    ClientConfig,
    HttpClient,
    Resource,
    RestClient,
    TransportError,
    WriteRefused,
    new_api_client,
)
from himitsu_controller.runtime.leader.writegate import WriteGate

WIDGETS = Resource("example.io", "v1", "widgets")
WAIT = 10.0


def gated(api_client: HttpClient, clock: SleepClock, *, qps: float = 50.0,
          burst: int = 100) -> tuple[RestClient, WriteGate]:
    gate = WriteGate(clock=clock)
    rest = RestClient(api_client, write_gate=gate, qps=qps, burst=burst,
                      clock=clock, sleep=clock.sleep)
    return rest, gate


def writes(server: FakeApiServer) -> int:
    return sum(len(server.requests_of(m)) for m in ("POST", "PUT", "PATCH", "DELETE"))


def write_everything(rest: RestClient) -> None:
    """One of each write verb; each must be refused."""
    body = {"metadata": {"name": "a", "namespace": "ns"}}
    with pytest.raises(WriteRefused):
        rest.create(WIDGETS, body)
    with pytest.raises(WriteRefused):
        rest.update(WIDGETS, body)
    with pytest.raises(WriteRefused):
        rest.patch(WIDGETS, "a", {"x": 1}, namespace="ns")
    with pytest.raises(WriteRefused):
        rest.delete(WIDGETS, "a", namespace="ns")


def test_writes_stop_when_the_gate_closes_and_reads_go_on(
        server: FakeApiServer, api_client: HttpClient, clock: SleepClock) -> None:
    server.put("a")
    rest, gate = gated(api_client, clock)
    write_everything(rest)  # closed until the elector opens it
    assert writes(server) == 0
    gate.open_until(clock.now + 5.0)
    rest.patch(WIDGETS, "a", {"x": 1}, namespace="ns")
    clock.now += 5.0  # the validity ran out: no renewal came
    write_everything(rest)
    assert rest.get(WIDGETS, "a", namespace="ns")["metadata"]["name"] == "a"
    assert writes(server) == 1
    assert rest.request_counts == {"patch": 1, "get": 1}  # refused writes were not sent
    gate.open_until(clock.now + 5.0)
    gate.close()  # the elector gave up or released: at once, whatever time is left
    write_everything(rest)
    assert writes(server) == 1


def test_the_gate_is_asked_after_the_rate_limiters_wait(
        server: FakeApiServer, api_client: HttpClient, clock: SleepClock) -> None:
    rest, gate = gated(api_client, clock, qps=1.0, burst=1)
    gate.open_until(clock.now + 0.5)
    rest.patch(WIDGETS, "a", {"x": 1}, namespace="ns")
    with pytest.raises(WriteRefused):  # it waited 1 s for a token; the gate closed meanwhile
        rest.patch(WIDGETS, "a", {"x": 2}, namespace="ns")
    assert clock.slept == pytest.approx([1.0])
    assert writes(server) == 1


def test_the_gate_is_asked_again_before_a_429_retry(
        server: FakeApiServer, api_client: HttpClient, clock: SleepClock) -> None:
    rest, gate = gated(api_client, clock)
    gate.open_until(clock.now + 1.0)
    server.canned.append(Canned(429, status_body(429, "TooManyRequests", "slow down"),
                                {"Retry-After": "2"}))
    with pytest.raises(WriteRefused):
        rest.patch(WIDGETS, "a", {"x": 1}, namespace="ns")
    assert clock.slept == [2.0]
    assert writes(server) == 1


@pytest.fixture
def silent_server() -> Iterator[tuple[str, list[socket.socket]]]:
    """Accepts connections, reads nothing and never answers: a hung apiserver."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    accepted: list[socket.socket] = []
    done = threading.Event()

    def accept() -> None:
        while not done.is_set():
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            accepted.append(conn)

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{listener.getsockname()[1]}", accepted
    done.set()
    listener.shutdown(socket.SHUT_RDWR)  # wakes the accept() (close alone does not)
    listener.close()
    thread.join(WAIT)
    for conn in accepted:
        conn.close()


def silent_client(url: str, *, retries: int) -> HttpClient:
    return new_api_client(ClientConfig(url), pool_maxsize=2, retries=retries)


def test_a_write_the_gate_let_through_is_sent_once(
        silent_server: tuple[str, list[socket.socket]], connects: list[tuple[str, int]],
        ) -> None:
    url, _ = silent_server
    api_client = silent_client(url, retries=3)
    try:
        gate = WriteGate()
        gate.open_until(float("inf"))
        rest = RestClient(api_client, write_gate=gate)
        body = {"metadata": {"name": "a", "namespace": "ns"}}
        with pytest.raises(TransportError):  # PUT is idempotent: urllib3 would resend it
            rest.update(WIDGETS, body, timeout=0.2)
        assert len(connects) == 1  # counted by the client: no race with the accept thread
    finally:
        api_client.close()


def test_a_client_built_with_no_retries_sends_a_hung_request_once(
        silent_server: tuple[str, list[socket.socket]], connects: list[tuple[str, int]],
        ) -> None:
    url, _ = silent_server
    api_client = silent_client(url, retries=0)
    try:
        with pytest.raises(TransportError):
            RestClient(api_client).get(WIDGETS, "a", namespace="ns", timeout=0.2)
        assert len(connects) == 1
    finally:
        api_client.close()


def test_max_retries_0_does_not_sleep_on_429(
        server: FakeApiServer, api_client: HttpClient, clock: SleepClock) -> None:
    rest = RestClient(api_client, max_retries=0, clock=clock, sleep=clock.sleep)
    server.canned.append(Canned(429, status_body(429, "TooManyRequests", "slow down"),
                                {"Retry-After": "5"}))
    with pytest.raises(ApiError):
        rest.get(WIDGETS, "a", namespace="ns")
    assert clock.slept == []
    assert len(server.requests_of("GET")) == 1
