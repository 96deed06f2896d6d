"""One overall deadline for an HTTP request, for every client: the apiserver's and Himitsu's.

* urllib3's timeouts bound each socket operation, never a whole request (a trickle, a
  hung connection, a send on a full buffer outlive any "timeout").
* ``within(seconds)`` runs the block's requests, on ``POOL_CLASSES`` pools, under one
  ``Deadline``; when it passes, a watchdog thread resets their connections.
* A leaf: it imports nothing of the package, so every layer may use it.

Design: docs/design/deadlines.md
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import heapq
import itertools
import socket
import struct
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

from urllib3.connection import HTTPConnection, HTTPSConnection
from urllib3.connectionpool import HTTPConnectionPool, HTTPSConnectionPool

# After firing, connections still being made are looked at again this often.
_RECHECK = 0.05
_LINGER_0 = struct.pack("ii", 1, 0)
_local = threading.local()


class DeadlineExceeded(TimeoutError):
    """A connection was made after the request's overall deadline: nothing was sent."""


class _SockAddr(ctypes.Structure):
    _fields_ = [("family", ctypes.c_ushort), ("data", ctypes.c_char * 14)]


_LIBC = ctypes.CDLL(None, use_errno=True) if sys.platform.startswith("linux") else None
_UNSPEC = _SockAddr(socket.AF_UNSPEC)


def _reset_now(sock: socket.socket) -> bool:
    """Linux: dissolve the connection (a reset, queues dropped, waiters woken)."""
    if _LIBC is None:
        return False
    fd = sock.fileno()
    if fd < 0:
        return False
    return int(_LIBC.connect(fd, ctypes.byref(_UNSPEC), ctypes.sizeof(_UNSPEC))) == 0


def _abort(*conns: Any) -> None:
    for sock in (getattr(conn, "sock", None) for conn in conns):
        if sock is None:
            continue
        with contextlib.suppress(OSError, ValueError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _LINGER_0)
        with contextlib.suppress(OSError, ValueError):
            if _reset_now(sock):
                continue
        with contextlib.suppress(OSError, ValueError):
            # The plain socket's shutdown, also for an SSLSocket: its own drops the SSL
            # object under the thread that is using it.
            socket.socket.shutdown(sock, socket.SHUT_RDWR)


class Deadline:
    """One request's deadline (a ``time.monotonic`` reading) and its connections."""

    def __init__(self, at: float) -> None:
        self.at = at
        self.expired = False  # the watchdog (or finish) aborted the request
        self._lock = threading.Lock()
        self._conns: list[Any] = []
        self._finished = False

    def attach(self, conn: Any) -> None:
        with self._lock:
            if not self._finished:
                self._conns.append(conn)

    def check(self, conn: Any) -> None:
        """Right after a connection was made: abort it if the deadline passed meanwhile."""
        if time.monotonic() >= self.at:
            with self._lock:
                self.expired = True
            _abort(conn)
            raise DeadlineExceeded("connected after the request's deadline")

    def fire(self) -> bool:
        """Abort every connection in use; True if the request is still running."""
        with self._lock:
            if self._finished:
                return False
            self.expired = True
            _abort(*self._conns)
            return True

    def finish(self) -> bool:
        """The request is over: the watchdog leaves it alone. True if it fired. One past its
        deadline that the watchdog missed (starved) is aborted here all the same."""
        with self._lock:
            self._finished = True
            if not self.expired and time.monotonic() >= self.at:
                self.expired = True
                _abort(*self._conns)
            self._conns.clear()
            return self.expired


class _Watchdog:
    """One daemon thread firing deadlines in order (started on first use)."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._heap: list[tuple[float, int, Deadline]] = []
        self._seq = itertools.count()
        self._thread: threading.Thread | None = None

    def arm(self, deadline: Deadline, at: float | None = None) -> None:
        at = deadline.at if at is None else at
        with self._cond:
            heapq.heappush(self._heap, (at, next(self._seq), deadline))
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="request-deadlines",
                                                daemon=True)
                self._thread.start()
            if self._heap[0][2] is deadline:
                self._cond.notify()

    def abort_all(self) -> None:
        """Abort every request still running, whatever its deadline (process exit)."""
        with self._cond:
            pending = [deadline for _, _, deadline in self._heap]
        for deadline in pending:
            deadline.fire()

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._heap or self._heap[0][0] > time.monotonic():
                    wait = self._heap[0][0] - time.monotonic() if self._heap else None
                    self._cond.wait(wait)
                _, _, deadline = heapq.heappop(self._heap)
            if deadline.fire():  # a connection may still be in the making: look again
                self.arm(deadline, time.monotonic() + _RECHECK)


_WATCHDOG = _Watchdog()
atexit.register(_WATCHDOG.abort_all)


def _current() -> Deadline | None:
    deadline: Deadline | None = getattr(_local, "deadline", None)
    return deadline


class _DeadlineConnection(HTTPConnection):
    def connect(self) -> None:
        super().connect()  # the socket, then (HTTPS) the TLS handshake
        deadline = _current()
        if deadline is not None:  # connected too late: abort, send nothing
            deadline.check(self)


class _DeadlineHTTPSConnection(_DeadlineConnection, HTTPSConnection):
    pass


class DeadlineHTTPConnectionPool(HTTPConnectionPool):
    """A pool whose connections join the deadline of the request that takes them."""

    ConnectionCls = _DeadlineConnection

    def _get_conn(self, timeout: float | None = None) -> Any:
        conn = super()._get_conn(timeout)
        deadline = _current()
        if deadline is not None:
            deadline.attach(conn)
        return conn


class DeadlineHTTPSConnectionPool(DeadlineHTTPConnectionPool, HTTPSConnectionPool):
    ConnectionCls = _DeadlineHTTPSConnection


# For a PoolManager's (or ProxyManager's) ``pool_classes_by_scheme``.
POOL_CLASSES = {"http": DeadlineHTTPConnectionPool, "https": DeadlineHTTPSConnectionPool}


@contextlib.contextmanager
def within(seconds: float) -> Iterator[Deadline]:
    """Run the block's requests (on ``POOL_CLASSES`` pools) under one deadline ``seconds`` from
    now; the block may ask the ``Deadline`` whether it expired (the watchdog aborted)."""
    deadline = Deadline(time.monotonic() + max(0.0, seconds))
    _WATCHDOG.arm(deadline)
    previous = getattr(_local, "deadline", None)
    _local.deadline = deadline
    try:
        yield deadline
    finally:
        _local.deadline = previous
        deadline.finish()
