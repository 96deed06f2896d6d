"""A tiny threaded HTTP server shared by /metrics and the probes.

Why our own instead of ``prometheus_client.start_http_server``: we need the bound port
back (tests bind port 0), a clean ``stop()`` (tests and graceful shutdown), named threads,
and the same bind-address syntax as controller-runtime's flags (":8080", "0" disables).
"""

from __future__ import annotations

import http.server
import socket
import threading
from dataclasses import dataclass, field
from typing import Any

import structlog

log = structlog.get_logger(__name__)


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


class _Server(http.server.ThreadingHTTPServer):
    # Request threads must never keep the process alive or stall shutdown.
    daemon_threads = True
    block_on_close = False
    thread_name = "http"

    def process_request(self, request: Any, client_address: Any) -> None:
        # As ThreadingMixIn does, but with a thread name that says whose request it is.
        thread = threading.Thread(
            target=self.process_request_thread,
            args=(request, client_address),
            name=f"{self.thread_name}-request",
            daemon=True,
        )
        thread.start()


class _IPv6Server(_Server):
    address_family = socket.AF_INET6


@dataclass
class HTTPServerHandle:
    """A running server: its bound ``port`` and a ``stop()`` that waits for the loop."""

    server: http.server.ThreadingHTTPServer
    thread: threading.Thread
    _stopped: bool = field(default=False, init=False)

    @property
    def port(self) -> int:
        return int(self.server.server_address[1])

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
) -> HTTPServerHandle | None:
    """Bind ``addr`` and serve ``handler`` on a named daemon thread; None when disabled."""
    parsed = parse_bind_address(addr)
    if parsed is None:
        return None
    host, port = parsed
    server_cls: type[_Server] = _IPv6Server if ":" in host else _Server
    server = server_cls((host, port), handler)
    server.thread_name = thread_name
    thread = threading.Thread(
        target=server.serve_forever,
        kwargs={"poll_interval": 0.05},
        name=thread_name,
        daemon=True,
    )
    thread.start()
    handle = HTTPServerHandle(server=server, thread=thread)
    log.info("http server listening", server=thread_name, host=host or "*", port=handle.port)
    return handle
