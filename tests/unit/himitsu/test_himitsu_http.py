"""Loopback tests of the Himitsu client's transport: what `responses` cannot simulate.

A tiny http.server on 127.0.0.1 (port 0, stopped by its fixture) trickles bytes, stalls,
resets, over-sends, serves TLS and keeps connections alive, so the overall deadline, the
size cap, error mapping and connection reuse are proven on real sockets. Assertions are
on error types and messages, never on elapsed time; pytest-timeout marks catch a hang.
"""

from __future__ import annotations

import json
import shutil
import socket
import ssl
import struct
import subprocess
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import requests
from fakes import himitsu_clients

from himitsu_controller.himitsu import (
    Fetched,
    HimitsuClient,
    NotModified,
    TransportError,
    Undecodable,
)
from himitsu_controller.himitsu.http import describe_transport_error

TOKEN = "himi_0123456789abcdef_" + "CANARYtokenCANARYtokenCANARYtokenCANARY_-xy"
SECRET = "canary-secret-value-7f3a"
PROJECT = "0b6f8a52-1c3e-4d5f-9a7b-2c4d6e8f0a1b"
ENV = "5d2e1f3a-7b8c-4d9e-8f0a-1b2c3d4e5f60"
PATH = f"/api/v1/projects/{PROJECT}/environments/{ENV}/secrets/runtime"
TRICKLE_INTERVAL = 0.05  # the server's pacing, not a test wait

Behaviour = Callable[[BaseHTTPRequestHandler, threading.Event], None]


@dataclass
class Server:
    url: str
    stop: threading.Event
    clients: list[tuple[str, int]] = field(default_factory=list)
    headers: list[dict[str, str]] = field(default_factory=list)


@contextmanager
def serve(behaviour: Behaviour, *, tls: tuple[Path, Path] | None = None) -> Iterator[Server]:
    stop = threading.Event()
    server: Server | None = None

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive, so connection reuse is observable
        timeout = 5  # an idle kept-alive connection ends on its own

        def do_GET(self) -> None:
            assert server is not None
            server.clients.append(self.client_address[:2])
            server.headers.append(dict(self.headers.items()))
            behaviour(self, stop)

        def log_message(self, *args: Any) -> None:
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    httpd.daemon_threads = True
    httpd.handle_error = lambda *args: None  # type: ignore[method-assign]
    if tls is not None:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(str(tls[0]), str(tls[1]))
        httpd.socket = context.wrap_socket(httpd.socket, server_side=True)
    port = httpd.server_address[1]
    server = Server(url=f"{'https' if tls else 'http'}://127.0.0.1:{port}", stop=stop)
    thread = threading.Thread(target=httpd.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        yield server
    finally:
        stop.set()
        httpd.shutdown()
        httpd.server_close()
        thread.join(timeout=5)


def send_json(handler: BaseHTTPRequestHandler, version: int, secrets: dict[str, str]) -> None:
    body = json.dumps({"data": {"configVersion": version, "secrets": secrets}}).encode()
    handler.send_response(200)
    handler.send_header("Content-Type", "application/json")
    handler.send_header("Content-Length", str(len(body)))
    handler.send_header("X-Himitsu-Config-Version", str(version))
    handler.end_headers()
    handler.wfile.write(body)


def trickle(handler: BaseHTTPRequestHandler, stop: threading.Event, byte: bytes) -> None:
    while not stop.wait(TRICKLE_INTERVAL):
        try:
            handler.wfile.write(byte)
        except OSError:
            break
    handler.close_connection = True


@pytest.fixture(autouse=True)
def no_proxies(monkeypatch: pytest.MonkeyPatch) -> None:
    # The client honours proxy variables (as it should in a cluster); these tests talk
    # to loopback only, so a proxy set in the developer's shell must not reroute them.
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy",
                 "all_proxy"):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def outcomes() -> list[str]:
    return []


@pytest.fixture
def make_client(outcomes: list[str]) -> Iterator[Callable[..., HimitsuClient]]:
    with himitsu_clients(observer=outcomes.append) as make:
        yield make


def fetch(client: HimitsuClient, url: str, known: int | None = None) -> Any:
    return client.fetch(api_url=url, project_id=PROJECT, environment_id=ENV, token=TOKEN,
                        known_version=known)


@pytest.mark.timeout(20)
def test_body_trickle_cannot_outlast_the_deadline(
    make_client: Callable[..., HimitsuClient], outcomes: list[str],
) -> None:
    def behaviour(handler: BaseHTTPRequestHandler, stop: threading.Event) -> None:
        handler.send_response(200)
        handler.send_header("Content-Length", "100000")
        handler.end_headers()
        handler.wfile.write(f'{{"data": {{"secrets": {{"A": "{SECRET}'.encode())
        trickle(handler, stop, b"x")

    with serve(behaviour) as server, pytest.raises(TransportError, match="deadline") as caught:
        fetch(make_client(deadline=0.5), server.url)
    assert SECRET not in str(caught.value)
    assert len(server.clients) == 1
    assert outcomes == ["transport_error"]


@pytest.mark.timeout(20)
def test_header_trickle_cannot_outlast_the_deadline(
    make_client: Callable[..., HimitsuClient],
) -> None:
    def behaviour(handler: BaseHTTPRequestHandler, stop: threading.Event) -> None:
        handler.wfile.write(b"HTTP/1.1 200 OK\r\nX-Slow: ")
        trickle(handler, stop, b"a")

    with serve(behaviour) as server, pytest.raises(TransportError, match="deadline"):
        fetch(make_client(deadline=0.5), server.url)


@pytest.mark.timeout(20)
def test_deadline_holds_on_a_reused_pooled_connection(
    make_client: Callable[..., HimitsuClient],
) -> None:
    def behaviour(handler: BaseHTTPRequestHandler, stop: threading.Event) -> None:
        if handler.headers.get("If-None-Match") is None:
            send_json(handler, 3, {"A": "1"})
            return
        handler.send_response(200)
        handler.send_header("Content-Length", "100000")
        handler.end_headers()
        trickle(handler, stop, b"x")

    with serve(behaviour) as server:
        client = make_client(deadline=0.5)
        assert fetch(client, server.url) == Fetched(version=3, secrets={"A": "1"})
        with pytest.raises(TransportError, match="deadline"):
            fetch(client, server.url, known=3)
    assert len(server.clients) == 2 and len(set(server.clients)) == 1  # the same socket


@pytest.mark.timeout(20)
def test_silent_server_trips_the_read_timeout(make_client: Callable[..., HimitsuClient]) -> None:
    def behaviour(handler: BaseHTTPRequestHandler, stop: threading.Event) -> None:
        stop.wait(10)

    with serve(behaviour) as server, pytest.raises(TransportError, match="timed out"):
        fetch(make_client(read_timeout=0.2), server.url)


@pytest.mark.timeout(20)
def test_declared_oversize_is_refused_before_reading(
    make_client: Callable[..., HimitsuClient],
) -> None:
    def behaviour(handler: BaseHTTPRequestHandler, stop: threading.Event) -> None:
        handler.send_response(200)
        handler.send_header("Content-Length", str(10**9))
        handler.end_headers()
        trickle(handler, stop, b"x")

    with serve(behaviour) as server:
        with pytest.raises(TransportError, match="larger than 4096 bytes"):
            fetch(make_client(max_response_bytes=4096), server.url)
        assert len(server.clients) == 1


@pytest.mark.timeout(20)
def test_undeclared_oversize_is_cut_while_streaming(
    make_client: Callable[..., HimitsuClient],
) -> None:
    def behaviour(handler: BaseHTTPRequestHandler, stop: threading.Event) -> None:
        handler.send_response(200)
        handler.send_header("Connection", "close")  # no Content-Length: read until close
        handler.end_headers()
        for _ in range(1024):
            if stop.is_set():
                break
            try:
                handler.wfile.write(b"x" * 4096)
            except OSError:
                break
        handler.close_connection = True

    with serve(behaviour) as server, pytest.raises(TransportError, match="larger than 65536"):
        fetch(make_client(max_response_bytes=65536), server.url)


@pytest.mark.timeout(20)
def test_truncated_body_is_a_transport_error(
    make_client: Callable[..., HimitsuClient], outcomes: list[str],
) -> None:
    def behaviour(handler: BaseHTTPRequestHandler, stop: threading.Event) -> None:
        handler.send_response(200)
        handler.send_header("Content-Length", "500")
        handler.end_headers()
        handler.wfile.write(f'{{"data": {{"configVersion": 1, "secrets": {{"A": "{SECRET}'.encode())
        handler.close_connection = True

    with serve(behaviour) as server:
        with pytest.raises(TransportError, match="before it was complete") as caught:
            fetch(make_client(), server.url)
        assert len(server.clients) == 1
    assert SECRET not in str(caught.value)
    assert outcomes == ["transport_error"]


@pytest.mark.timeout(20)
def test_connection_reset_is_a_transport_error(make_client: Callable[..., HimitsuClient]) -> None:
    def behaviour(handler: BaseHTTPRequestHandler, stop: threading.Event) -> None:
        # SO_LINGER 0 turns close() into a TCP RST.
        handler.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        handler.connection.close()
        handler.close_connection = True

    with serve(behaviour) as server, pytest.raises(TransportError) as caught:
        fetch(make_client(), server.url)
    assert "127.0.0.1" in str(caught.value)


@pytest.mark.timeout(20)
def test_connection_refused_is_a_transport_error(
    make_client: Callable[..., HimitsuClient], outcomes: list[str],
) -> None:
    with socket.socket() as unused:  # bound, never listening: connects are refused
        unused.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{unused.getsockname()[1]}"
        with pytest.raises(TransportError, match="connection refused"):
            fetch(make_client(), url)
    assert outcomes == ["transport_error"]


@pytest.mark.timeout(20)
def test_garbage_instead_of_http_is_a_transport_error(
    make_client: Callable[..., HimitsuClient],
) -> None:
    def behaviour(handler: BaseHTTPRequestHandler, stop: threading.Event) -> None:
        handler.wfile.write(b"\x00\x01 this is not HTTP\r\n\r\n")
        handler.close_connection = True

    with serve(behaviour) as server, pytest.raises(TransportError, match="not answer with HTTP"):
        fetch(make_client(), server.url)


@pytest.mark.timeout(20)
def test_connections_are_reused_and_headers_are_sent(
    make_client: Callable[..., HimitsuClient], outcomes: list[str],
) -> None:
    def behaviour(handler: BaseHTTPRequestHandler, stop: threading.Event) -> None:
        if handler.headers.get("If-None-Match") == '"himi-config-4"':
            handler.send_response(304)
            handler.send_header("X-Himitsu-Config-Version", "4")
            handler.send_header("Content-Length", "0")
            handler.end_headers()
            return
        send_json(handler, 4, {"A": SECRET})

    with serve(behaviour) as server:
        client = make_client()
        assert fetch(client, server.url) == Fetched(version=4, secrets={"A": SECRET})
        assert fetch(client, server.url, known=4) == NotModified(version=4)
        assert fetch(client, server.url + "/") == Fetched(version=4, secrets={"A": SECRET})
    assert len(server.clients) == 3
    assert len(set(server.clients)) == 1  # one TCP connection served all three
    first = server.headers[0]
    assert first["Authorization"] == f"Bearer {TOKEN}"
    assert "Content-Type" not in first
    assert "If-None-Match" not in first
    assert outcomes == ["200", "304", "200"]


@pytest.mark.timeout(20)
def test_encoded_body_is_refused(make_client: Callable[..., HimitsuClient]) -> None:
    def behaviour(handler: BaseHTTPRequestHandler, stop: threading.Event) -> None:
        handler.send_response(200)
        handler.send_header("Content-Encoding", "gzip")
        handler.send_header("Content-Length", "4")
        handler.end_headers()
        handler.wfile.write(b"\x1f\x8b\x08\x00")

    with serve(behaviour) as server, pytest.raises(Undecodable):
        fetch(make_client(), server.url)


@pytest.fixture(scope="module")
def certificate(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    openssl = shutil.which("openssl")
    if openssl is None:
        pytest.skip("openssl is needed to make a test certificate")
    folder = tmp_path_factory.mktemp("tls")
    cert, key = folder / "cert.pem", folder / "key.pem"
    subprocess.run(
        [openssl, "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
         "-nodes", "-keyout", str(key), "-out", str(cert), "-days", "1",
         "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1"],
        check=True, capture_output=True, timeout=60,
    )
    return cert, key


@pytest.mark.timeout(30)
def test_tls_uses_the_ca_file_and_explains_an_untrusted_certificate(
    make_client: Callable[..., HimitsuClient], certificate: tuple[Path, Path],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("REQUESTS_CA_BUNDLE", raising=False)
    monkeypatch.delenv("CURL_CA_BUNDLE", raising=False)

    def behaviour(handler: BaseHTTPRequestHandler, stop: threading.Event) -> None:
        send_json(handler, 2, {"A": "1"})

    with serve(behaviour, tls=certificate) as server:
        with pytest.raises(TransportError, match="TLS certificate verification failed"):
            fetch(make_client(), server.url)
        trusted = make_client(ca_file=str(certificate[0]))
        assert fetch(trusted, server.url) == Fetched(version=2, secrets={"A": "1"})
        monkeypatch.setenv("REQUESTS_CA_BUNDLE", str(certificate[0]))
        assert fetch(make_client(), server.url) == Fetched(version=2, secrets={"A": "1"})


@pytest.mark.timeout(30)
def test_deadline_holds_under_tls_too(
    make_client: Callable[..., HimitsuClient], certificate: tuple[Path, Path],
) -> None:
    def behaviour(handler: BaseHTTPRequestHandler, stop: threading.Event) -> None:
        handler.send_response(200)
        handler.send_header("Content-Length", "100000")
        handler.end_headers()
        trickle(handler, stop, b" ")

    client = make_client(ca_file=str(certificate[0]), deadline=0.5)
    with serve(behaviour, tls=certificate) as server:
        with pytest.raises(TransportError, match="deadline"):
            fetch(client, server.url)
        assert len(server.clients) == 1


def _wrapped(inner: BaseException) -> requests.RequestException:
    outer = requests.ConnectionError(f"HTTPConnectionPool(host='x'): {SECRET}")
    outer.__cause__ = inner
    return outer


@pytest.mark.parametrize(("exc", "reason"), [
    (_wrapped(socket.gaierror(-2, SECRET)), "the host name could not be resolved"),
    (requests.ConnectTimeout(SECRET), "timed out connecting"),
    (requests.ReadTimeout(SECRET), "timed out waiting for the response"),
    (requests.exceptions.ProxyError(SECRET), "the proxy refused or failed the connection"),
    (_wrapped(ssl.SSLError(1, SECRET)), "TLS handshake failed"),
    (_wrapped(ConnectionRefusedError(111, SECRET)), "connection refused"),
    (_wrapped(ConnectionResetError(104, SECRET)), "connection reset by the server"),
    (requests.ConnectionError(SECRET), "the connection failed"),
])
def test_transport_reasons_are_ours(exc: BaseException, reason: str) -> None:
    assert describe_transport_error(exc) == reason
