"""Overall request deadlines: a write the gate let through, and the elector's requests.

A write the gate admitted must be over by the time the gate gave it (what it had left
plus half the margin before a standby may lead), however its connection hangs: after
its request was written (a pooled connection, no connect to cap), in a send blocked on
a full buffer (whose queued bytes must then never be delivered), or behind a proxy,
where urllib3 must not send it again. The elector's requests keep to their timeout as
a whole, not per socket operation, even against an answer that trickles in.

Servers here are raw sockets on 127.0.0.1; every wait is on a condition with a
deadline, and each test tells apart "aborted at its deadline" from "ran its course"
by what happened (an error and a reset versus an answer), never by the clock.
"""

from __future__ import annotations

import contextlib
import socket
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from himitsu_controller import cli
from himitsu_controller.runtime.client.rest import (
    ClientConfig,
    HttpClient,
    Resource,
    RestClient,
    TransportError,
    load_client_config,
    new_api_client,
)
from himitsu_controller.runtime.leader.writegate import WriteGate

WIDGETS = Resource("example.io", "v1", "widgets")
LEASES = Resource("coordination.k8s.io", "v1", "leases")
WAIT = 10.0  # how long a server holds what it holds: far past every deadline below
START = 120.0  # how long a child Python may take to import and reach its server (a loaded machine)
OK = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}"


def read_request(conn: socket.socket) -> bytes:
    """One HTTP request (headers and Content-Length body), or what came before EOF."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = conn.recv(65536)
        if not chunk:
            return data
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value)
    while len(body) < length:
        chunk = conn.recv(65536)
        if not chunk:
            break
        body += chunk
    return head + b"\r\n\r\n" + body


class RawServer:
    """Serves each accepted connection with ``serve(conn, index)`` in a thread of its own."""

    def __init__(self, serve: Callable[[socket.socket, int], None], *,
                 rcvbuf: int | None = None) -> None:
        self.listener = socket.socket()
        if rcvbuf is not None:
            self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(16)
        self.release = threading.Event()
        self.conns: list[socket.socket] = []
        self._serve = serve
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.listener.getsockname()[1]}"

    def _accept(self) -> None:
        index = 0
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            self.conns.append(conn)
            threading.Thread(target=self._run, args=(conn, index), daemon=True).start()
            index += 1

    def _run(self, conn: socket.socket, index: int) -> None:
        with contextlib.suppress(OSError):
            self._serve(conn, index)

    def stop(self) -> None:
        self.release.set()
        self.listener.shutdown(socket.SHUT_RDWR)
        self.listener.close()
        for conn in self.conns:
            conn.close()


@pytest.fixture
def servers() -> Iterator[list[RawServer]]:
    started: list[RawServer] = []
    yield started
    for server in started:
        server.stop()


def api_client(url: str, *, proxy: str | None = None, retries: int = 3) -> HttpClient:
    return new_api_client(ClientConfig(url, proxy=proxy), pool_maxsize=2, retries=retries)


def gated_client(url: str, **kwargs: Any) -> tuple[RestClient, WriteGate, HttpClient]:
    gate = WriteGate()
    client = api_client(url, **kwargs)
    return RestClient(client, write_gate=gate), gate, client


def open_gate(gate: WriteGate, *, for_seconds: float, writes_for: float) -> None:
    now = gate._clock()
    gate.open_until(now + for_seconds, writes_end=now + writes_for)


BODY = {"metadata": {"name": "a", "namespace": "ns"}}


def test_a_gated_write_on_a_pooled_connection_that_hangs_is_aborted_by_its_deadline(
        servers: list[RawServer]) -> None:
    """The first write is answered (its connection is pooled); the second is read by the
    server, which then answers nothing for WAIT seconds: with the 30 s timeout kube.py
    gives writes it would wait for that answer. It must be aborted when the gate says,
    its connection reset then and there."""
    outcome: dict[str, bytes] = {}
    ended = threading.Event()

    def serve(conn: socket.socket, index: int) -> None:
        if read_request(conn):
            conn.sendall(OK)
        read_request(conn)  # the second write, on the same (pooled) connection
        conn.settimeout(WAIT)
        try:
            outcome["after"] = conn.recv(1)  # b"": the client gave up on it
        except ConnectionResetError:
            outcome["after"] = b"reset"
        except TimeoutError:
            conn.sendall(OK)  # the answer the client would have waited for
        ended.set()

    servers.append(server := RawServer(serve))
    rest, gate, client = gated_client(server.url)
    try:
        open_gate(gate, for_seconds=60.0, writes_for=60.0)
        rest.update(WIDGETS, BODY, timeout=30.0)
        open_gate(gate, for_seconds=0.2, writes_for=0.4)
        with pytest.raises(TransportError, match="connection aborted"):
            rest.update(WIDGETS, BODY, timeout=30.0)
        assert ended.wait(WAIT)
        # Reset at once, by the watchdog: not a FIN now and a reset whenever the socket
        # happens to be closed (till then a real network would keep retransmitting).
        assert outcome.get("after") == b"reset", f"not reset: {outcome}"
        assert gate.in_flight == 0
        assert gate.unanswered_within(60.0)  # its fate is unknown: it counts as unanswered
    finally:
        client.close()


def test_a_gated_write_blocked_in_send_is_reset_and_its_queued_bytes_never_arrive(
        servers: list[RawServer]) -> None:
    """The server reads nothing until the client is done (a path that takes no more bytes):
    the send blocks with bytes queued in our socket buffers. Aborted, the connection is
    reset (linger 0), so what was still queued is dropped, not delivered later."""
    done = threading.Event()
    seen: dict[str, Any] = {}
    request_size = 16 << 20

    def serve(conn: socket.socket, index: int) -> None:
        done.wait(WAIT)  # the network comes back only once the client gave up (or not)
        total, reset = 0, False
        conn.settimeout(WAIT)
        try:
            while total < request_size:
                chunk = conn.recv(1 << 20)
                if not chunk:
                    break
                total += len(chunk)
            conn.sendall(OK)
        except ConnectionResetError:
            reset = True
        except OSError:
            pass
        seen.update(total=total, reset=reset)

    servers.append(server := RawServer(serve, rcvbuf=4096))
    rest, gate, client = gated_client(server.url)
    body = {"metadata": {"name": "a", "namespace": "ns"}, "data": "x" * request_size}
    try:
        open_gate(gate, for_seconds=5.0, writes_for=5.5)  # encoding 16 MiB takes a while
        with pytest.raises(TransportError, match="connection aborted"):
            rest.update(WIDGETS, body, timeout=30.0)
        done.set()
        assert wait_until(lambda: "total" in seen)
        assert seen["reset"], f"not reset: the server read {seen['total']} bytes and EOF"
        assert seen["total"] < request_size
    finally:
        done.set()
        client.close()


def test_behind_a_proxy_a_gated_write_is_sent_once_and_over_by_its_deadline(
        servers: list[RawServer], connects: list[tuple[str, int]]) -> None:
    """HTTPS_PROXY / a kubeconfig's proxy-url: urllib3's Retry(total=3) re-sends a PUT
    whose answer timed out; a gated write must go once, and end when the gate says."""

    def serve(conn: socket.socket, index: int) -> None:  # a forward proxy that hangs
        read_request(conn)
        conn.settimeout(WAIT)
        try:
            conn.recv(1)
        except TimeoutError:
            conn.sendall(OK)

    servers.append(proxy := RawServer(serve))
    rest, gate, client = gated_client("http://apiserver.invalid:6443", proxy=proxy.url)
    try:
        open_gate(gate, for_seconds=0.2, writes_for=0.4)
        with pytest.raises(TransportError, match="connection aborted"):
            rest.update(WIDGETS, BODY, timeout=30.0)
        assert len(connects) == 1, connects
        assert gate.in_flight == 0
    finally:
        client.close()


EXITING_WRITER = """
import sys, threading
from himitsu_controller.runtime.client.rest import (
    ClientConfig, Resource, RestClient, new_api_client)
from himitsu_controller.runtime.leader.writegate import WriteGate
gate = WriteGate()
gate.open_until(gate._clock() + 60.0)
rest = RestClient(new_api_client(ClientConfig(sys.argv[1]), pool_maxsize=2), write_gate=gate)
body = {"metadata": {"name": "a", "namespace": "ns"}}
writer = threading.Thread(target=rest.update, args=(Resource("x.io", "v1", "ws"), body),
                          daemon=True)
writer.start()
while gate.in_flight == 0 and writer.is_alive():
    writer.join(0.01)
sys.stdin.readline()  # the test says when: the request is at the server by then
"""


def test_a_gated_write_still_running_when_the_process_exits_is_reset(
        servers: list[RawServer]) -> None:
    """A leader exits (lost leadership: no drain) with a write in flight whose deadline is
    still ahead. The kernel would close its socket gracefully and keep retransmitting
    what it holds after the process is gone: the connection must be reset instead."""
    received = threading.Event()
    outcome: dict[str, bytes] = {}

    def serve(conn: socket.socket, index: int) -> None:
        read_request(conn)
        received.set()
        conn.settimeout(WAIT)
        try:
            outcome["after"] = conn.recv(1)
        except ConnectionResetError:
            outcome["after"] = b"reset"

    servers.append(server := RawServer(serve))
    proc = subprocess.Popen([sys.executable, "-c", EXITING_WRITER, server.url],
                            stdin=subprocess.PIPE)
    try:
        assert received.wait(START)
        assert proc.stdin is not None
        proc.stdin.write(b"exit\n")
        proc.stdin.close()
        assert proc.wait(START) == 0
        assert wait_until(lambda: "after" in outcome)
        assert outcome["after"] == b"reset", f"closed, not reset: {outcome}"
    finally:
        proc.kill()
        proc.wait(WAIT)


def test_the_electors_client_keeps_to_a_timeout_against_an_answer_that_trickles(
        servers: list[RawServer], tmp_path: Path) -> None:
    """Each byte comes before the per-operation timeout, the whole answer long after."""
    answer = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n" + b"X-Pad: " + b"p" * 200 + \
        b"\r\n\r\n{}"

    def serve(conn: socket.socket, index: int) -> None:
        read_request(conn)
        for byte in answer:
            if server.release.wait(0.05):
                return
            conn.sendall(bytes([byte]))

    servers.append(server := RawServer(serve))
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        "apiVersion: v1\nkind: Config\n"
        f"clusters: [{{name: c, cluster: {{server: '{server.url}'}}}}]\n"
        "users: [{name: u, user: {token: t}}]\n"
        "contexts: [{name: c, context: {cluster: c, user: u}}]\ncurrent-context: c\n")
    rest = cli.elector_client(load_client_config(str(kubeconfig)))
    try:
        with pytest.raises(TransportError):
            rest.get(LEASES, "lock", namespace="ns", timeout=0.3)
    finally:
        rest.api_client.close()


def wait_until(condition: Callable[[], bool]) -> bool:
    pause = threading.Event()
    for _ in range(int(WAIT / 0.01)):
        if condition():
            return True
        pause.wait(0.01)
    return condition()
