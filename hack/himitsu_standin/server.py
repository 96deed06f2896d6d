"""The HTTP side: a keep-alive HTTP/1.1 server that carries out the core's answers.

Why its own module: sending is where the interesting failures live (a delay before the
status line, a body that trickles, a multi-megabyte body streamed without building it in
memory, a TCP reset instead of an answer), and ``stop()`` must cut all of them short so a
test never waits on a fault it injected.
"""

from __future__ import annotations

import contextlib
import socket
import socketserver
import struct
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, cast

from .control import handle_control
from .core import Himitsu
from .wire import Answer, Inbound, error_answer, is_loopback

_KEEPALIVE_SECONDS = 72.0  # the real server's keep-alive: idle connections close after it
_CHUNK = 64 * 1024


class StandIn(Himitsu):
    """The Himitsu stand-in: the fake backend plus its HTTP server.

    Bound in the constructor (``url`` and ``port`` are known at once), served by
    ``start()`` on a daemon thread, stopped by ``stop()``; also a context manager.
    Binding a non-loopback address needs ``allow_remote=True``.
    """

    def __init__(self, host: str = "127.0.0.1", port: int = 0, *, per_key_limit: int = 120,
                 per_ip_limit: int = 300, window: float = 60.0,
                 clock: Callable[[], float] = time.monotonic, allow_remote: bool = False,
                 allow_remote_control: bool = False, log_limit: int = 100_000) -> None:
        if not allow_remote and not is_loopback(host):
            raise ValueError(f"refusing to bind {host}: not a loopback address "
                             "(allow_remote=True / --allow-remote to override)")
        super().__init__(per_key_limit=per_key_limit, per_ip_limit=per_ip_limit,
                         window=window, clock=clock, log_limit=log_limit)
        self.allow_remote_control = allow_remote_control
        self.stopping = threading.Event()
        self._connections: set[socket.socket] = set()
        self._connections_lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._server = _Server((host, port), self)

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    @property
    def url(self) -> str:
        host = str(self._server.server_address[0])
        return f"http://{f'[{host}]' if ':' in host else host}:{self.port}"

    def start(self) -> StandIn:
        if self._thread is None:
            # A short poll interval: shutdown() waits for the loop to notice it.
            self._thread = threading.Thread(target=self._server.serve_forever,
                                            kwargs={"poll_interval": 0.02},
                                            name="himitsu-standin", daemon=True)
            self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving, cut delayed or trickling answers short, drop idle connections.

        Final: a stopped stand-in cannot be started again. Safe to call twice.
        """
        self.stopping.set()
        if self._thread is not None:
            self._server.shutdown()
            self._thread.join()
            self._thread = None
        self._server.server_close()
        with self._connections_lock:
            connections = list(self._connections)
        for connection in connections:
            with contextlib.suppress(OSError):  # its handler closed it meanwhile
                connection.shutdown(socket.SHUT_RDWR)

    def __enter__(self) -> StandIn:
        return self.start()

    def __exit__(self, *_: object) -> None:
        self.stop()

    def track(self, connection: socket.socket, *, is_open: bool) -> None:
        with self._connections_lock:
            if is_open:
                self._connections.add(connection)
            else:
                self._connections.discard(connection)


class _Server(ThreadingHTTPServer):
    daemon_threads = True  # a stuck client never holds up stop()

    def __init__(self, address: tuple[str, int], standin: StandIn) -> None:
        if ":" in address[0]:
            self.address_family = socket.AF_INET6
        self.standin = standin
        super().__init__(address, _Handler)

    def server_bind(self) -> None:
        # HTTPServer.server_bind does a reverse DNS lookup (getfqdn) we have no use for.
        socketserver.TCPServer.server_bind(self)
        self.server_name, self.server_port = str(self.server_address[0]), self.server_address[1]


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "himitsu-standin"
    timeout = _KEEPALIVE_SECONDS

    @property
    def standin(self) -> StandIn:
        return cast(_Server, self.server).standin

    def setup(self) -> None:
        super().setup()
        self.standin.track(self.connection, is_open=True)

    def finish(self) -> None:
        try:
            super().finish()
        finally:
            self.standin.track(self.connection, is_open=False)

    def do_GET(self) -> None:
        self._dispatch()

    def do_POST(self) -> None:
        self._dispatch()

    def do_PUT(self) -> None:
        self._dispatch()

    def do_DELETE(self) -> None:
        self._dispatch()

    def do_HEAD(self) -> None:
        self._dispatch()

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet: the request log is the record, and access logs are not wanted in tests."""

    def send_error(self, code: int, message: str | None = None,
                   explain: str | None = None) -> None:
        """http.server's own errors (bad request line, ...) also get an error envelope."""
        self.close_connection = True
        self._send(error_answer(code, message or "bad request"))

    def _dispatch(self) -> None:
        if self.headers.get("Transfer-Encoding"):
            self.send_error(411, "send a Content-Length; chunked bodies are not supported")
            return
        try:
            length = int(self.headers.get("Content-Length") or 0)
        except ValueError:
            self.send_error(400, "bad Content-Length")
            return
        body = self.rfile.read(length) if length > 0 else b""
        path, _, query = self.path.partition("?")
        if path == "/_standin" or path.startswith("/_standin/"):
            answer = handle_control(self.standin, method=self.command, path=path, query=query,
                                    body=body, client_ip=self.client_address[0],
                                    allow_remote=self.standin.allow_remote_control)
        else:
            answer = self.standin.serve_api(self._inbound(path, len(body)))
        self._send(answer)

    def _inbound(self, path: str, body_length: int) -> Inbound:
        scheme, _, credential = (self.headers.get("Authorization") or "").partition(" ")
        return Inbound(method=self.command, path=path, client_ip=self.client_address[0],
                       token=credential.strip() if scheme.lower() == "bearer" else None,
                       if_none_match=self.headers.get("If-None-Match"),
                       user_agent=self.headers.get("User-Agent"),
                       content_type=self.headers.get("Content-Type"), body_length=body_length)

    def _send(self, answer: Answer) -> None:
        stopping = self.standin.stopping
        if answer.delay > 0 and stopping.wait(answer.delay):
            self.close_connection = True  # stopping: give up without answering
            return
        if answer.reset:
            self._reset()
            return
        try:
            self.send_response(answer.status)
            for name, value in answer.headers.items():
                self.send_header(name, value)
            if answer.status != 304:  # a 304 has no body and, as Express sends it, no length
                self.send_header("Content-Length", str(answer.length))
            self.end_headers()
            if self.command != "HEAD" and answer.status != 304:
                for chunk in _paced(_chunks(answer), answer.trickle, stopping):
                    self.wfile.write(chunk)
        except OSError:
            self.close_connection = True  # the client went away, or stop() cut a trickle

    def _reset(self) -> None:
        """Close with an RST (SO_LINGER 0): the client sees a reset, not a clean close."""
        self.close_connection = True
        self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.connection.close()


def _chunks(answer: Answer) -> Iterator[bytes]:
    head = answer.body[:len(answer.body) - answer.tail]
    yield head
    left = answer.filler
    while left > 0:
        yield b"x" * min(_CHUNK, left)
        left -= _CHUNK
    if answer.tail:
        yield answer.body[-answer.tail:]


def _paced(chunks: Iterator[bytes], rate: int, stopping: threading.Event) -> Iterator[bytes]:
    """Re-chunk to about ten writes a second at ``rate`` bytes/s; stop() aborts."""
    if rate <= 0:
        yield from chunks
        return
    step, first = max(1, rate // 10), True
    for chunk in chunks:
        for start in range(0, len(chunk), step):
            if not first and stopping.wait(step / rate):
                raise ConnectionAbortedError("stand-in stopping")
            first = False
            yield chunk[start:start + step]
