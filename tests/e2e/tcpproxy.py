"""A TCP proxy on 127.0.0.1 that can make one process's connections hang.

Why: "the leader's connection hangs" is the fault leader election must survive, and it
cannot be made by stopping the apiserver (the standby must keep working) or by a
refused connection (that fails fast). A process whose kubeconfig points here reaches
the apiserver through this proxy; the test can then

* ``freeze()``: stop forwarding, in both directions, on every connection, open or new
  (a new one is accepted and then left unanswered, TLS handshake and all). Nothing is
  closed: the process sees requests that never get an answer;
* ``cut()``: reset every connection accepted so far (their peers see a reset; what was
  sent into them while frozen never reaches the apiserver, as after a partition that
  outlived the connections) and forward new connections again;
* ``thaw()``: the network comes back, nothing is reset. What a side sent while frozen
  stands for bytes a real partition left unacknowledged in the sender's buffers: they
  are delivered now (TCP retransmits them), unless the sender reset the connection
  meanwhile (a close with linger 0 drops them), in which case the pair is reset. The
  proxy cannot stop its kernel from accepting those bytes, so it decides on thaw: it
  drains them, and forwards them only if no reset came after.

Bytes are relayed as they are (TLS passes through end to end). Loopback only; every
thread is a daemon and ``stop()`` closes every socket.
"""

from __future__ import annotations

import contextlib
import select
import socket
import struct
import threading

POLL = 0.05
CHUNK = 65536


class _Pair:
    """One client connection and its upstream connection."""

    def __init__(self, client: socket.socket, upstream: socket.socket, *,
                 frozen: bool) -> None:
        self.client = client
        self.upstream = upstream
        self.frozen = frozen
        self.closed = threading.Event()

    def close(self, *, reset: bool = False) -> None:
        if self.closed.is_set():
            return
        self.closed.set()
        for sock in (self.client, self.upstream):
            with contextlib.suppress(OSError):
                if reset:  # linger 0: close sends RST, unsent data is dropped
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                sock.close()

    def pump(self, src: socket.socket, dst: socket.socket) -> None:
        held = False  # frozen since the last read: what waits was sent while frozen
        while not self.closed.is_set():
            if self.frozen:  # read nothing: the sender's bytes wait in socket buffers
                held = True
                self.closed.wait(POLL)
                continue
            if held:
                held = False
                if not self._deliver_held(src, dst):
                    break
                continue
            try:
                ready, _, _ = select.select([src], [], [], POLL)
                if not ready or self.frozen:
                    continue
                data = src.recv(CHUNK)
                if not data:
                    break
                dst.sendall(data)
            except (OSError, ValueError):  # closed under us
                break
        self.close()


    def _deliver_held(self, src: socket.socket, dst: socket.socket) -> bool:
        """Forward what ``src`` sent while frozen, unless it reset the connection since
        (then reset the pair); False when the pump is done."""
        data, reset, eof = b"", False, False
        try:
            src.setblocking(False)
            while True:
                try:
                    chunk = src.recv(CHUNK)
                except BlockingIOError:
                    break
                if not chunk:
                    eof = True
                    break
                data += chunk
            # A reset after a FIN leaves no error to recv: it shows in SO_ERROR.
            reset = src.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) != 0
            src.settimeout(None)
        except (OSError, ValueError):
            reset = True
        if reset:
            self.close(reset=True)
            return False
        try:
            if data:
                dst.sendall(data)
        except (OSError, ValueError):
            self.close(reset=True)
            return False
        return not eof


class FreezableProxy:
    """Listens on 127.0.0.1 (a free port) and relays to ``upstream``."""

    def __init__(self, upstream: tuple[str, int]) -> None:
        self._upstream = upstream
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._listener.settimeout(POLL)
        self._lock = threading.Lock()
        self._pairs: list[_Pair] = []
        self._frozen = False
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._accept, name="tcpproxy", daemon=True)

    @property
    def port(self) -> int:
        return int(self._listener.getsockname()[1])

    @property
    def connections(self) -> int:
        """Connections accepted so far."""
        with self._lock:
            return len(self._pairs)

    def start(self) -> FreezableProxy:
        self._thread.start()
        return self

    def freeze(self) -> None:
        with self._lock:
            self._frozen = True
            for pair in self._pairs:
                pair.frozen = True

    def thaw(self) -> None:
        with self._lock:
            self._frozen = False
            for pair in self._pairs:
                pair.frozen = False

    def cut(self) -> None:
        with self._lock:
            self._frozen = False
            pairs = list(self._pairs)
        for pair in pairs:
            pair.close(reset=True)

    def stop(self) -> None:
        self._stopped.set()
        self._thread.join(timeout=10)
        self._listener.close()
        with self._lock:
            pairs = list(self._pairs)
        for pair in pairs:
            pair.close(reset=True)

    def _accept(self) -> None:
        while not self._stopped.is_set():
            try:
                client, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            try:
                upstream = socket.create_connection(self._upstream, timeout=5)
            except OSError:
                client.close()
                continue
            client.settimeout(None)
            upstream.settimeout(None)
            with self._lock:
                pair = _Pair(client, upstream, frozen=self._frozen)
                self._pairs.append(pair)
            for src, dst in ((client, upstream), (upstream, client)):
                threading.Thread(target=pair.pump, args=(src, dst), name="tcpproxy-pump",
                                 daemon=True).start()
