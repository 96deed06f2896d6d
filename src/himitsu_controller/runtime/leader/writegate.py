"""Until when this replica may write: the leader's own, conservative view of its Lease.

Why a gate of its own: a leader learns that it lost its Lease only from the apiserver,
and a leader whose connections hang learns nothing. Meanwhile a standby takes the Lease
one lease duration after it last saw the record change, by its own clock, and starts
writing. Stopping the workers when the elector gives up is not enough: reconciles in
flight (a Himitsu answer may take 30 s) would still write next to the new leader. So
every write request of the reconcilers' client (and of the Event recorder's) asks this
gate first, immediately before it is sent, and the gate answers from a clock, not from
the network:

* the elector opens it, after each successful acquire or renewal, until
  ``sent + renew_deadline``, where ``sent`` is when that write was *sent*. The apiserver
  stored the record no sooner, so no standby saw it change sooner, so none may take the
  Lease before ``sent + lease_duration`` (client-go's rule, measured on the standby's
  own clock). The gate closes ``lease_duration - renew_deadline`` (5 s by default)
  before that: the margin for a write's way to the apiserver and for clocks that run at
  slightly different rates (not for skew in wall time, which no one compares);
* it closes at once when the elector gives up, finds another holder, or releases.

A write the gate lets through (``admit``) is told how long it may take in all: until
``sent + renew_deadline + (lease_duration - renew_deadline) / 2`` (``open_until``'s
``writes_end``), half the margin left for a write's last bytes on the wire and for the
watchdog (``deadline.py``) that aborts it then. The gate counts the writes in flight
(``done`` when each is over), so a leader that releases its Lease on shutdown can first
wait for them (``settle``): a release is a standby's signal to take over at once.

Standbys never open it; without leader election there is no gate at all.
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
            until = self._until
        return until - self._clock()

    def is_open(self) -> bool:
        return self.remaining() > 0

    def admit(self) -> float | None:
        """Let one write through now: the seconds it may take in all, or None (closed).

        An admitted write is in flight until ``done``; ``close`` and ``settle`` see it.
        """
        with self._cond:
            now = self._clock()
            if self._until - now <= 0:
                return None
            self._in_flight += 1
            return self._writes_end - now

    def done(self, *, answered: bool) -> None:
        """An admitted write is over; ``answered``: the apiserver's answer came back (not
        answered: it may still be on its way, or be carried out, after we gave up)."""
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
