"""A tiny threaded HTTP(S) server shared by /metrics and the probes, that cannot be starved.

Why our own instead of ``prometheus_client.start_http_server``: we need the bound port
back (tests bind port 0), a clean ``stop()``, named threads, controller-runtime's
bind-address syntax (":8080", "0" disables), and limits: each server holds at most
``max_connections`` connections (one thread each; more are answered 503 and closed at
once), and every connection is cut ``request_timeout`` after it was accepted, however
slowly its peer sends or reads. Each server has its own cap, so a flood of half-sent
requests to /metrics never keeps the kubelet's probes from being answered.
"""

from __future__ import annotations

import contextlib
import http.server
import socket
import ssl
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import structlog

log = structlog.get_logger(__name__)

MAX_CONNECTIONS = 16
REQUEST_TIMEOUT = 10.0
_BUSY = (b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\n"
         b"Connection: close\r\nRetry-After: 1\r\n\r\n")


def parse_bind_address(addr: str) -> tuple[str, int] | None:
    """Parse a controller-runtime style bind address; None means "disabled".

    ":8080" binds every interface, "127.0.0.1:0" picks a free port, "[::1]:9000" is
    IPv6, and "0" (or the empty string) disables the server as in controller-runtime.
    """
    addr = addr.strip()
    if addr in ("", "0"):
        return None
    host, sep, port_text = addr.rpartition(":")
    if not sep:
        raise ValueError(f"bind address {addr!r} must look like HOST:PORT or :PORT")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    try:
        port = int(port_text)
    except ValueError:
        raise ValueError(f"bind address {addr!r} has a non-numeric port") from None
    if not 0 <= port <= 65535:
        raise ValueError(f"bind address {addr!r} has a port outside 0..65535")
    return host, port


@dataclass(eq=False)
class _Connection:
    sock: socket.socket
    deadline: float


class Connections:
    """The open connections of one server: counted, capped, and cut at their deadline."""

    def __init__(self, limit: int, timeout: float, clock: Callable[[], float]) -> None:
        self.limit = limit
        self.timeout = timeout
        self._clock = clock
        self._open: set[_Connection] = set()
        self.refused = 0  # connections answered 503 because the cap was reached
        self.cut = 0  # connections closed at their deadline
        self._changed = threading.Condition()

    @property
    def active(self) -> int:
        with self._changed:
            return len(self._open)

    def admit(self, sock: socket.socket) -> _Connection | None:
        with self._changed:
            if len(self._open) >= self.limit:
                self.refused += 1
                self._changed.notify_all()
                return None
            conn = _Connection(sock, self._clock() + self.timeout)
            self._open.add(conn)
            self._changed.notify_all()
            return conn

    def release(self, conn: _Connection) -> None:
        with self._changed:
            self._open.discard(conn)
            self._changed.notify_all()

    def cut_overdue(self) -> None:
        """Shut down every connection past its deadline: its blocked read or write returns."""
        now = self._clock()
        with self._changed:
            overdue = [c for c in self._open if c.deadline <= now]
            self.cut += len(overdue)
        for conn in overdue:
            # socket.socket's own shutdown: an SSLSocket's would drop its TLS state; an
            # OSError: its thread closed it meanwhile.
            with contextlib.suppress(OSError):
                socket.socket.shutdown(conn.sock, socket.SHUT_RDWR)

    def wait_until(self, predicate: Callable[[Connections], bool], timeout: float) -> bool:
        """Wait (bounded) until ``predicate(self)`` holds; for tests and diagnostics."""
        with self._changed:
            return self._changed.wait_for(lambda: predicate(self), timeout)


class _Server(http.server.HTTPServer):
    # Room for a burst of connections while the loop accepts them (socketserver's 5 would
    # leave clients in SYN retries, seconds each).
    request_queue_size = 128
    thread_name = "http"
    connections: Connections
    tls: ssl.SSLContext | None = None
    tls_refresh: Callable[[], None] | None = None

    def process_request(self, request: Any, client_address: Any) -> None:
        conn = self.connections.admit(request)
        if conn is None:
            # A fresh socket's send buffer takes this at once; never wait for it.
            with contextlib.suppress(OSError):
                request.setblocking(False)
                request.send(_BUSY)
            self.shutdown_request(request)
            return
        try:
            threading.Thread(target=self._serve_one, args=(conn, client_address),
                             name=f"{self.thread_name}-request", daemon=True).start()
        except RuntimeError:  # no thread to be had: the connection goes, its slot too
            self.connections.release(conn)
            raise

    def _serve_one(self, conn: _Connection, client_address: Any) -> None:
        sock = conn.sock
        try:
            sock.settimeout(self.connections.timeout)
            if self.tls is not None:  # the handshake too runs here, under the deadline
                if self.tls_refresh is not None:
                    self.tls_refresh()
                sock = conn.sock = self.tls.wrap_socket(sock, server_side=True)
            self.finish_request(sock, client_address)
        except (OSError, ValueError) as exc:  # a peer gone, cut, or failing its handshake
            log.debug("connection dropped", server=self.thread_name,
                      error_type=type(exc).__name__)
        except Exception:
            log.exception("request failed", server=self.thread_name)
        finally:
            self.connections.release(conn)
            self.shutdown_request(sock)

    def service_actions(self) -> None:
        # Called by serve_forever on every poll interval.
        self.connections.cut_overdue()

    def handle_error(self, request: Any, client_address: Any) -> None:
        log.debug("connection error", server=self.thread_name)


class _IPv6Server(_Server):
    address_family = socket.AF_INET6


@dataclass
class HTTPServerHandle:
    """A running server: its bound ``port`` and a ``stop()`` that waits for the loop."""

    server: _Server
    thread: threading.Thread
    _stopped: bool = field(default=False, init=False)

    @property
    def port(self) -> int:
        return int(self.server.server_address[1])

    @property
    def connections(self) -> Connections:
        return self.server.connections

    def stop(self) -> None:
        """Stop serving and close the socket; safe to call twice."""
        if self._stopped:
            return
        self._stopped = True
        self.server.shutdown()
        self.server.server_close()
        self.thread.join()


def serve(
    addr: str,
    handler: type[http.server.BaseHTTPRequestHandler],
    *,
    thread_name: str,
    max_connections: int = MAX_CONNECTIONS,
    request_timeout: float = REQUEST_TIMEOUT,
    tls: ssl.SSLContext | None = None,
    tls_refresh: Callable[[], None] | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> HTTPServerHandle | None:
    """Bind ``addr`` and serve ``handler`` on a named daemon thread; None when disabled.

    ``tls``: serve HTTPS with this context (``tls_refresh`` runs before each handshake,
    e.g. to load a renewed certificate)."""
    parsed = parse_bind_address(addr)
    if parsed is None:
        return None
    host, port = parsed
    server_cls: type[_Server] = _IPv6Server if ":" in host else _Server
    server = server_cls((host, port), handler)
    server.thread_name = thread_name
    server.connections = Connections(max_connections, request_timeout, clock)
    server.tls, server.tls_refresh = tls, tls_refresh
    thread = threading.Thread(
        target=server.serve_forever,
        kwargs={"poll_interval": 0.05},
        name=thread_name,
        daemon=True,
    )
    thread.start()
    handle = HTTPServerHandle(server=server, thread=thread)
    log.info("http server listening", server=thread_name, host=host or "*", port=handle.port,
             tls=tls is not None, max_connections=max_connections)
    return handle
