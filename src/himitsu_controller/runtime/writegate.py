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
        self._lock = threading.Lock()

    def open_until(self, until: float) -> None:
        """Allow writes until ``until`` (a reading of the gate's clock)."""
        with self._lock:
            self._until = until

    def close(self) -> None:
        with self._lock:
            self._until = float("-inf")

    def remaining(self) -> float:
        """Seconds writes are still allowed for; <= 0 when closed."""
        with self._lock:
            until = self._until
        return until - self._clock()

    def is_open(self) -> bool:
        return self.remaining() > 0
