"""The metrics and probe servers cannot be starved: each holds at most its cap of
connections, gives the slot of the oldest one still waiting for its request to a new one
(refusing only when every slot serves a request), cuts every connection at its deadline,
and refuses a request head beyond MAX_HEAD_BYTES unread; so a flood of half-sent requests
or huge headers grows neither threads nor memory without bound, nor silences probes."""

from __future__ import annotations

import http.server
import socket
import threading
import tracemalloc
import urllib.error
import urllib.request
from collections.abc import Iterator

import pytest

from himitsu_controller.runtime import httpserver, metrics
from himitsu_controller.runtime.healthz import ProbeServer
from himitsu_controller.runtime.httpserver import HTTPServerHandle, serve

HALF_SENT = b"GET /metrics HTTP/1.1\r\nHost: operator\r\n"  # no blank line: never complete
FLOOD = 300
WAIT = 20.0


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class _Hello(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"ok")

    def log_message(self, format: str, *args: object) -> None:
        return


def half_sent(port: int, count: int) -> list[socket.socket]:
    socks = []
    for _ in range(count):
        sock = socket.create_connection(("127.0.0.1", port), timeout=WAIT)
        sock.sendall(HALF_SENT)
        socks.append(sock)
    return socks


@pytest.fixture
def flood_sockets() -> Iterator[list[socket.socket]]:
    socks: list[socket.socket] = []
    yield socks
    for sock in socks:
        sock.close()


@pytest.fixture
def probes() -> Iterator[ProbeServer]:
    server = ProbeServer("127.0.0.1:0")
    server.add_healthz("ping", lambda: None)
    server.start()
    yield server
    server.stop()


def status_of(port: int, request: bytes) -> str:
    """The status line answered to ``request``, or "closed" when the server hung up
    (reset or EOF) before answering: a refusal as good as a 431."""
    with socket.create_connection(("127.0.0.1", port), timeout=WAIT) as sock:
        try:
            sock.sendall(request)
            head = sock.recv(64)
        except (ConnectionResetError, BrokenPipeError):
            return "closed"
    return head.split(b"\r\n", 1)[0].decode() if head else "closed"


def probe(port: int) -> int:
    """The kubelet's probe, as it sends it; 503 is a failed probe (200-399 pass)."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=WAIT) as resp:
            return int(resp.status)
    except urllib.error.HTTPError as err:
        return err.code


@pytest.mark.timeout(120)
def test_a_flood_of_half_sent_requests_is_held_within_the_cap_and_probes_still_answer(
        flood_sockets: list[socket.socket]) -> None:
    metrics_server = metrics.start_metrics_server("127.0.0.1:0")
    probes = ProbeServer("127.0.0.1:0")
    probes.start()
    assert metrics_server is not None
    cap = httpserver.MAX_CONNECTIONS
    try:
        flood_sockets.extend(half_sent(metrics_server.port, FLOOD))
        held = metrics_server.connections.wait_until(
            lambda c: c.active == cap and c.evicted == FLOOD - cap, WAIT)
        assert held, (metrics_server.connections.active, metrics_server.connections.evicted)
        # One thread per held connection: the evicted ones' end.
        assert metrics_server.connections.wait_until(lambda c: c.running == cap, WAIT)
        assert metrics_server.connections.refused == 0
        # The oldest were closed on, unanswered, to make room.
        flood_sockets[0].settimeout(WAIT)
        assert flood_sockets[0].recv(64) == b""
        # The kubelet's probes have a server (and a cap) of their own.
        url = f"http://127.0.0.1:{probes.port}/healthz"
        with urllib.request.urlopen(url, timeout=WAIT) as resp:
            assert (resp.status, resp.read()) == (200, b"ok")
        # And a scrape, a complete request, is served while the flood holds every slot.
        scrape = f"http://127.0.0.1:{metrics_server.port}/metrics"
        with urllib.request.urlopen(scrape, timeout=WAIT) as resp:
            assert resp.status == 200
        for sock in flood_sockets:
            sock.close()
        assert metrics_server.connections.wait_until(lambda c: c.running == 0, WAIT)
    finally:
        metrics_server.stop()
        probes.stop()


@pytest.mark.timeout(60)
def test_the_probes_answer_while_their_own_port_is_held_by_a_flood(
        probes: ProbeServer, flood_sockets: list[socket.socket]) -> None:
    # Anyone reaching :8081 (no NetworkPolicy by default) can hold its every slot.
    for _ in range(3):  # each probe takes the slot of the oldest silent peer
        flood_sockets.extend(half_sent(probes.port, httpserver.MAX_CONNECTIONS))
        handle = probes._handle
        assert handle is not None
        assert handle.connections.wait_until(
            lambda c: c.active == httpserver.MAX_CONNECTIONS, WAIT)
        assert probe(probes.port) == 200


@pytest.mark.timeout(60)
def test_a_request_with_megabytes_of_headers_is_refused_unread_in_bounded_memory(
        probes: ProbeServer) -> None:
    line = b"X-Pad: " + b"a" * 64_000 + b"\r\n"
    # ~2 MiB in 32 lines, under http.server's 100 header lines of 64 KiB each.
    request = b"GET /healthz HTTP/1.1\r\nHost: x\r\n" + line * 32 + b"\r\n"
    tracemalloc.start()
    try:
        statuses = [status_of(probes.port, request) for _ in range(4)]
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert all(s in ("HTTP/1.1 431 Request Header Fields Too Large", "closed")
               for s in statuses), statuses
    # The server read at most MAX_HEAD_BYTES of each (parsed, 2 MiB is held twice over).
    assert peak < 8 * httpserver.MAX_HEAD_BYTES, peak
    # A request head just under the bound is served.
    fits = b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Pad: " + b"a" * 60_000 + b"\r\n\r\n"
    assert status_of(probes.port, fits) == "HTTP/1.0 200 OK"


class _Held(http.server.BaseHTTPRequestHandler):
    """Holds every request until ``release`` is set: each holds its slot, serving."""

    release = threading.Event()
    serving = threading.Semaphore(0)  # one per request whose head is in

    def do_GET(self) -> None:
        self.serving.release()
        self.release.wait(WAIT)
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: object) -> None:
        return


@pytest.mark.timeout(60)
def test_a_connection_is_refused_503_only_when_every_slot_serves_a_request(
        flood_sockets: list[socket.socket]) -> None:
    handle = serve("127.0.0.1:0", _Held, thread_name="held", max_connections=2)
    assert isinstance(handle, HTTPServerHandle)
    _Held.release.clear()
    _Held.serving = threading.Semaphore(0)
    try:
        for _ in range(2):
            sock = socket.create_connection(("127.0.0.1", handle.port), timeout=WAIT)
            sock.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            flood_sockets.append(sock)
        # Both slots serve a request (its head read), not merely hold a connection: one
        # still waiting for its head would be evicted, not refused.
        assert all(_Held.serving.acquire(timeout=WAIT) for _ in range(2))
        with socket.create_connection(("127.0.0.1", handle.port), timeout=WAIT) as refused:
            assert refused.recv(64).startswith(b"HTTP/1.1 503")
        assert (handle.connections.refused, handle.connections.evicted) == (1, 0)
        _Held.release.set()
        for sock in flood_sockets:  # the requests held were served, not cut
            assert sock.recv(64).startswith(b"HTTP/1.0 200")
    finally:
        _Held.release.set()
        handle.stop()


@pytest.mark.timeout(60)
def test_a_connection_is_cut_at_its_deadline_and_its_slot_serves_again(
        flood_sockets: list[socket.socket]) -> None:
    clock = FakeClock()
    handle = serve("127.0.0.1:0", _Hello, thread_name="limited", max_connections=2,
                   request_timeout=10.0, clock=clock)
    assert isinstance(handle, HTTPServerHandle)
    try:
        flood_sockets.extend(half_sent(handle.port, 2))
        assert handle.connections.wait_until(lambda c: c.active == 2, WAIT)
        clock.now += 9.9
        assert handle.connections.cut == 0
        clock.now += 0.1  # both reach their deadline
        assert handle.connections.wait_until(lambda c: c.running == 0, WAIT)
        assert handle.connections.cut == 2
        for sock in flood_sockets[:2]:  # closed on them, nothing answered
            sock.settimeout(WAIT)
            assert sock.recv(64) == b""
        with urllib.request.urlopen(f"http://127.0.0.1:{handle.port}/", timeout=WAIT) as resp:
            assert resp.read() == b"ok"
    finally:
        handle.stop()
