"""The metrics and probe servers cannot be starved: each holds at most its cap of
connections, answers the excess 503 at once, and cuts every connection at its deadline,
so a flood of half-sent requests neither grows threads without bound nor silences probes."""

from __future__ import annotations

import http.server
import socket
import threading
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


def request_threads() -> int:
    return sum(t.name == "metrics-server-request" for t in threading.enumerate())


@pytest.fixture
def flood_sockets() -> Iterator[list[socket.socket]]:
    socks: list[socket.socket] = []
    yield socks
    for sock in socks:
        sock.close()


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
            lambda c: c.active == cap and c.refused == FLOOD - cap, WAIT)
        assert held, (metrics_server.connections.active, metrics_server.connections.refused)
        assert request_threads() == cap  # one thread per held connection, none more
        # The excess was answered at once, not queued: the last one reads its 503.
        flood_sockets[-1].settimeout(WAIT)
        assert flood_sockets[-1].recv(64).startswith(b"HTTP/1.1 503")
        # The kubelet's probes have a server (and a cap) of their own.
        url = f"http://127.0.0.1:{probes.port}/healthz"
        with urllib.request.urlopen(url, timeout=WAIT) as resp:
            assert (resp.status, resp.read()) == (200, b"ok")
        for sock in flood_sockets:
            sock.close()
        assert metrics_server.connections.wait_until(lambda c: c.active == 0, WAIT)
        scrape = f"http://127.0.0.1:{metrics_server.port}/metrics"
        with urllib.request.urlopen(scrape, timeout=WAIT) as resp:
            assert resp.status == 200
    finally:
        metrics_server.stop()
        probes.stop()


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
        flood_sockets.extend(half_sent(handle.port, 1))
        assert handle.connections.wait_until(lambda c: c.refused == 1, WAIT)
        clock.now += 9.9
        flood_sockets.extend(half_sent(handle.port, 1))  # still full: refused too
        assert handle.connections.wait_until(lambda c: c.refused == 2, WAIT)
        assert handle.connections.cut == 0
        clock.now += 0.1  # the first two reach their deadline
        assert handle.connections.wait_until(lambda c: c.active == 0, WAIT)
        assert handle.connections.cut == 2
        for sock in flood_sockets[:2]:  # closed on them, nothing answered
            sock.settimeout(WAIT)
            assert sock.recv(64) == b""
        with urllib.request.urlopen(f"http://127.0.0.1:{handle.port}/", timeout=WAIT) as resp:
            assert resp.read() == b"ok"
    finally:
        handle.stop()
