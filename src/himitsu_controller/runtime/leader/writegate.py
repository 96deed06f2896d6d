"""Until when this replica may write: the leader's own, conservative view of its Lease.

* Every gated write asks ``admit`` right before it is sent: answered from a clock.
* The elector opens it until ``sent + renew_deadline`` after each renewal and closes it
  on a loss or a release; an admitted write is told how long it may take.
* Writes in flight are counted (``done``), so a release can wait for them (``settle``).

Design: docs/design/leader-election.md
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

__all__ = ["WriteGate"]


class WriteGate:
    """A monotonic "valid until": closed until opened, closed again on ``close``."""

    def __init__(self, *, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._until = float("-inf")
        self._writes_end = float("-inf")
        self._in_flight = 0
        self._unanswered_at = float("-inf")
        self._cond = threading.Condition()

    def open_until(self, until: float, *, writes_end: float | None = None) -> None:
        """Allow writes until ``until`` (a reading of the gate's clock); each must be over
        by ``writes_end`` (default, and at least, ``until``)."""
        with self._cond:
            self._until = until
            self._writes_end = until if writes_end is None else max(until, writes_end)

    def close(self) -> None:
        with self._cond:
            self._until = float("-inf")

    def remaining(self) -> float:
        """Seconds writes are still allowed for; <= 0 when closed."""
        with self._cond:
            return self._until - self._clock()

    def is_open(self) -> bool:
        return self.remaining() > 0

    def admit(self) -> float | None:
        """Let one write through now (in flight until ``done``): the seconds it may take
        in all, or None (closed)."""
        with self._cond:
            now = self._clock()
            if self._until - now <= 0:
                return None
            self._in_flight += 1
            return self._writes_end - now

    def done(self, *, answered: bool) -> None:
        """An admitted write is over; not ``answered``: it may still land after we gave up."""
        with self._cond:
            self._in_flight -= 1
            if not answered:
                self._unanswered_at = self._clock()
            self._cond.notify_all()

    @property
    def in_flight(self) -> int:
        with self._cond:
            return self._in_flight

    def unanswered_within(self, seconds: float) -> bool:
        """Whether an admitted write ended without an answer in the last ``seconds``."""
        with self._cond:
            return self._clock() - self._unanswered_at < seconds

    def settle(self, timeout: float) -> bool:
        """Wait (at most ``timeout`` real seconds) until no admitted write is in flight."""
        deadline = time.monotonic() + max(0.0, timeout)
        with self._cond:
            while self._in_flight > 0:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(left)
            return True
