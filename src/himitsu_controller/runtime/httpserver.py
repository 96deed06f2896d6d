"""A threaded HTTP(S) server for /metrics and the probes that a flood cannot starve.

* Our own rather than ``prometheus_client.start_http_server``: the bound port back, a
  clean ``stop()``, controller-runtime's bind addresses (":8080"; "0" disables), TLS.
* Limits: a request head of at most MAX_HEAD_BYTES (else 431 unread); at most
  ``max_connections`` connections, a new one taking the slot of the oldest still waiting
  for its request; every connection cut ``request_timeout`` after it was accepted.

Design: docs/design/metrics.md
"""

from __future__ import annotations

import contextlib
import http.server
import io
import socket
import ssl
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast

import structlog

log = structlog.get_logger(__name__)

MAX_CONNECTIONS = 16
REQUEST_TIMEOUT = 10.0
MAX_HEAD_BYTES = 64 * 1024  # request line and headers; Go's servers allow 1 MiB
_TOO_LARGE = (b"HTTP/1.1 431 Request Header Fields Too Large\r\nContent-Length: 0\r\n"
              b"Connection: close\r\n\r\n")
_BUSY = (b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\n"
         b"Connection: close\r\nRetry-After: 1\r\n\r\n")


def parse_bind_address(addr: str) -> tuple[str, int] | None:
    """(host, port) of ":8080", "127.0.0.1:0" or "[::1]:9000"; None for "0" or "" (disabled)."""
    addr = addr.strip()
    if addr in ("", "0"):
        return None
    host, sep, port = addr.rpartition(":")
    if not sep or not port.isdigit() or int(port) > 65535:
        raise ValueError(f"bind address {addr!r} is not HOST:PORT or :PORT (port 0..65535)")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    return host, int(port)


@dataclass(eq=False)
class _Connection:
    sock: socket.socket
    deadline: float
    request_read: bool = False  # its request head is in: being served, never evicted
    evicted: bool = False  # its slot was given to a newer connection


class Connections:
    """The open connections of one server: capped, evicted while idle, cut at their deadline
    (refused only when every slot is serving a request)."""

    def __init__(self, limit: int, timeout: float, clock: Callable[[], float]) -> None:
        self.limit = limit
        self.timeout = timeout
        self._clock = clock
        self._open: dict[_Connection, None] = {}  # oldest first; evicted ones until they end
        self.refused = 0  # connections closed at once: every slot was serving a request
        self.evicted = 0  # connections closed to give their slot to a newer one
        self.cut = 0  # connections closed at their deadline
        self._changed = threading.Condition()

    @property
    def active(self) -> int:
        """Connections holding a slot."""
        with self._changed:
            return sum(not c.evicted for c in self._open)

    @property
    def running(self) -> int:
        """Connections with a thread, evicted ones included until their thread ends."""
        with self._changed:
            return len(self._open)

    def admit(self, sock: socket.socket) -> _Connection | None:
        with self._changed:
            holding = [c for c in self._open if not c.evicted]
            if len(holding) >= self.limit:
                waiting = [c for c in holding if not c.request_read]
                if not waiting:
                    self.refused += 1
                    self._changed.notify_all()
                    return None
                victim = waiting[0]
                victim.evicted = True
                self.evicted += 1
                _shutdown(victim.sock)  # under the lock: never a socket it just replaced
            conn = _Connection(sock, self._clock() + self.timeout)
            self._open[conn] = None
            self._changed.notify_all()
            return conn

    def replace_socket(self, conn: _Connection, sock: socket.socket) -> bool:
        """``conn`` now speaks through ``sock`` (TLS); False if it was evicted meanwhile."""
        with self._changed:
            conn.sock = sock
            return not conn.evicted

    def request_read(self, conn: _Connection) -> bool:
        """``conn`` has its request: it keeps its slot; False if it was evicted first."""
        with self._changed:
            conn.request_read = not conn.evicted
            return conn.request_read

    def release(self, conn: _Connection) -> None:
        with self._changed:
            self._open.pop(conn, None)
            self._changed.notify_all()

    def cut_overdue(self) -> None:
        """Shut down every connection past its deadline: its blocked read or write returns."""
        now = self._clock()
        with self._changed:
            overdue = [c for c in self._open if c.deadline <= now]
            self.cut += len(overdue)
            for conn in overdue:
                _shutdown(conn.sock)

    def wait_until(self, predicate: Callable[[Connections], bool], timeout: float) -> bool:
        """Wait (bounded) until ``predicate(self)`` holds; for tests and diagnostics."""
        with self._changed:
            return self._changed.wait_for(lambda: predicate(self), timeout)


def _shutdown(sock: socket.socket) -> None:
    # socket.socket's own shutdown: an SSLSocket's would drop its TLS state; an OSError:
    # its thread closed it meanwhile.
    with contextlib.suppress(OSError):
        socket.socket.shutdown(sock, socket.SHUT_RDWR)


class _HeadFirst:
    """A connection as its handler sees it: reading gives the request head already read
    (our servers answer one GET per connection, HTTP/1.0, so nothing follows it)."""

    def __init__(self, sock: socket.socket, head: bytes) -> None:
        self._sock = sock
        self._head = head

    def makefile(self, mode: str, buffering: int | None = None) -> io.BytesIO:
        return io.BytesIO(self._head)  # "rb": handlers write through sendall (wbufsize 0)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._sock, name)


class HTTPServerHandle(http.server.HTTPServer):
    """A running server: its bound ``port``, its ``connections`` and ``stop()``."""

    # Room for a burst of connections while the loop accepts them (socketserver's 5 would
    # leave clients in SYN retries, seconds each).
    request_queue_size = 128
    thread_name = "http"
    connections: Connections
    tls: Callable[[], ssl.SSLContext] | None = None
    thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        return int(self.server_address[1])

    def stop(self) -> None:
        """Stop serving and close the socket; safe to call twice."""
        thread, self.thread = self.thread, None
        if thread is not None:
            self.shutdown()
            self.server_close()
            thread.join()

    def process_request(self, request: Any, client_address: Any) -> None:
        conn = self.connections.admit(request)
        if conn is None:
            if self.tls is None:  # on the HTTPS port, no plaintext: the peer sees a close
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
                tls_sock = self.tls().wrap_socket(sock, server_side=True,
                                                  do_handshake_on_connect=False)
                sock = tls_sock
                if not self.connections.replace_socket(conn, tls_sock):
                    return
                tls_sock.do_handshake()
            head = _read_head(sock)
            if head is not None and self.connections.request_read(conn):
                self.finish_request(cast(socket.socket, _HeadFirst(sock, head)),
                                    client_address)
        except (OSError, ValueError) as exc:  # a peer gone, cut, or failing its handshake
            log.debug("connection dropped", server=self.thread_name,
                      error_type=type(exc).__name__)
        except Exception:
            log.exception("request failed", server=self.thread_name)
        finally:
            self.shutdown_request(sock)
            self.connections.release(conn)

    def service_actions(self) -> None:
        # Called by serve_forever on every poll interval.
        self.connections.cut_overdue()

    def handle_error(self, request: Any, client_address: Any) -> None:
        log.debug("connection error", server=self.thread_name)


def _read_head(sock: socket.socket) -> bytes | None:
    """The request line and headers (with what came after them), at most MAX_HEAD_BYTES;
    None when the peer left first. A longer head is answered 431 unread."""
    head = bytearray()
    while True:
        chunk = sock.recv(MAX_HEAD_BYTES + 1 - len(head))
        if not chunk:
            return None
        start = max(0, len(head) - 3)
        head += chunk
        if head.find(b"\r\n\r\n", start) >= 0 or head.find(b"\n\n", start) >= 0:
            return bytes(head)
        if len(head) > MAX_HEAD_BYTES:
            sock.sendall(_TOO_LARGE)
            return None


class _IPv6Server(HTTPServerHandle):
    address_family = socket.AF_INET6


class Handler(http.server.BaseHTTPRequestHandler):
    """Answers with ``reply``; logs nothing (the kubelet and Prometheus call every few s)."""

    def reply(self, status: int, body: bytes, content_type: str = "text/plain; charset=utf-8",
              ) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("X-Content-Type-Options", "nosniff")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        return


def serve(addr: str, handler: type[http.server.BaseHTTPRequestHandler], *, thread_name: str,
          max_connections: int = MAX_CONNECTIONS, request_timeout: float = REQUEST_TIMEOUT,
          tls: Callable[[], ssl.SSLContext] | None = None,
          clock: Callable[[], float] = time.monotonic) -> HTTPServerHandle | None:
    """Bind ``addr`` and serve ``handler`` on a named daemon thread; None when disabled.
    ``tls``: serve HTTPS, each handshake with the context it returns then."""
    parsed = parse_bind_address(addr)
    if parsed is None:
        return None
    host, port = parsed
    server = (_IPv6Server if ":" in host else HTTPServerHandle)((host, port), handler)
    server.thread_name = thread_name
    server.connections = Connections(max_connections, request_timeout, clock)
    server.tls = tls
    server.thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05},
                                     name=thread_name, daemon=True)
    server.thread.start()
    log.info("http server listening", server=thread_name, host=host or "*", port=server.port,
             tls=tls is not None, max_connections=max_connections)
    return server
