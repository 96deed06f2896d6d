"""An overall deadline for one HTTP request: a watchdog that aborts its connection.

Why: urllib3's timeouts bound each socket operation, not the request. A connection that
hangs after the request was written, an apiserver (or proxy) that trickles its answer a
byte at a time, a send blocked on a full buffer: each keeps a request going long past
its "timeout". For the leader that matters twice: a write the write gate let through
must be over before a standby may take the Lease, and an elector's request must end
within the renew deadline. So such a request runs under a ``Deadline``; when it passes,
one watchdog thread aborts every connection the request used:

* the connection is reset at once, by the watchdog itself: on Linux ``connect`` with
  ``AF_UNSPEC`` (the kernel's tcp_disconnect: a reset goes out and whatever our socket
  buffers still hold is dropped), so bytes not yet acknowledged are never delivered
  later when the network comes back, and the blocked thread wakes with an error
  (whatever it was doing: TLS handshake, send, receive). Not waiting for that thread to
  close the socket matters: a close can be put off while a response object still holds
  the socket, and meanwhile the kernel would keep retransmitting. Elsewhere:
  ``SO_LINGER`` 0 and ``shutdown``, and the reset comes with the close. Bytes already
  acknowledged (by the apiserver, or a proxy in between) are beyond recall;
* a connection made after the deadline passed is aborted as soon as it is made: the
  request is never written on it.

* when the process exits (``atexit``), every request still running is aborted the same
  way: the kernel would otherwise close its socket gracefully and go on retransmitting
  what it holds, for minutes, on behalf of a process that is gone.

How the watchdog finds the connection: ``track(pool)`` wraps the pool's ``_get_conn``
(urllib3 2.x; the connection's ``sock`` is the socket, set before the TLS handshake), so
a request running under a deadline in this thread records each connection it takes.
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
from collections.abc import Callable, Iterator
from typing import Any

__all__ = ["Deadline", "DeadlineExceeded", "track", "within"]

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


def _abort(sock: socket.socket) -> None:
    with contextlib.suppress(OSError, ValueError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _LINGER_0)
    with contextlib.suppress(OSError, ValueError):
        if _reset_now(sock):
            return
    with contextlib.suppress(OSError, ValueError):
        # The plain socket's shutdown, also for an SSLSocket: its own drops the SSL
        # object under the thread that is using it.
        socket.socket.shutdown(sock, socket.SHUT_RDWR)


class Deadline:
    """One request's deadline (a ``time.monotonic`` reading) and its connections."""

    def __init__(self, at: float) -> None:
        self.at = at
        self._lock = threading.Lock()
        self._conns: list[Any] = []
        self._expired = False
        self._finished = False

    @property
    def expired(self) -> bool:
        return self._expired

    def attach(self, conn: Any) -> None:
        with self._lock:
            if not self._finished:
                self._conns.append(conn)

    def check(self, conn: Any) -> None:
        """Right after a connection was made: abort it if the deadline passed meanwhile."""
        if time.monotonic() >= self.at:
            with self._lock:
                self._expired = True
            sock = getattr(conn, "sock", None)
            if sock is not None:
                _abort(sock)
            raise DeadlineExceeded("connected after the request's deadline")

    def fire(self) -> bool:
        """Abort every connection in use; True if the request is still running."""
        with self._lock:
            if self._finished:
                return False
            self._expired = True
            for conn in self._conns:
                sock = getattr(conn, "sock", None)
                if sock is not None:
                    _abort(sock)
            return True

    def finish(self) -> bool:
        """The request is over: the watchdog leaves it alone. True if it fired.

        A request that ends at or past its deadline without the watchdog having fired
        (its thread starved on a loaded machine) is aborted here, so a connection still
        holding its bytes is reset rather than left to deliver them later.
        """
        with self._lock:
            self._finished = True
            if not self._expired and time.monotonic() >= self.at:
                self._expired = True
                for conn in self._conns:
                    sock = getattr(conn, "sock", None)
                    if sock is not None:
                        _abort(sock)
            self._conns.clear()
            return self._expired


class _Watchdog:
    """One daemon thread firing deadlines in order (started on first use)."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._heap: list[tuple[float, int, Deadline]] = []
        self._seq = itertools.count()
        self._thread: threading.Thread | None = None

    def arm(self, deadline: Deadline) -> None:
        self._push(deadline.at, deadline)

    def _push(self, at: float, deadline: Deadline) -> None:
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
                self._push(time.monotonic() + _RECHECK, deadline)


_WATCHDOG = _Watchdog()
atexit.register(_WATCHDOG.abort_all)


def track(pool: Any) -> None:
    """Let requests on ``pool`` (an urllib3 connection pool) run under a deadline."""
    if getattr(pool, "_himitsu_tracked", False):
        return
    get_conn: Callable[..., Any] = pool._get_conn

    def tracked_get_conn(*args: Any, **kwargs: Any) -> Any:
        conn = get_conn(*args, **kwargs)
        deadline: Deadline | None = getattr(_local, "deadline", None)
        if deadline is not None:
            deadline.attach(conn)
            _check_on_connect(conn)
        return conn

    pool._get_conn = tracked_get_conn
    pool._himitsu_tracked = True


def _check_on_connect(conn: Any) -> None:
    """Wrap the connection's connect (once) so a late one sends nothing."""
    if getattr(conn, "_himitsu_checked", False):
        return
    connect: Callable[[], None] = conn.connect

    def checked_connect() -> None:
        connect()
        deadline: Deadline | None = getattr(_local, "deadline", None)
        if deadline is not None:
            deadline.check(conn)

    conn.connect = checked_connect
    conn._himitsu_checked = True


@contextlib.contextmanager
def within(seconds: float) -> Iterator[Deadline]:
    """Run the block's requests (on tracked pools) under one deadline ``seconds`` from
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
