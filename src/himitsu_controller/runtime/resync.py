"""A periodic resync: every key is queued again every ``period``, whatever happened.

* controller-runtime's ``SyncPeriod``: a safety net, not a schedule; a reconcile with
  nothing to do must cost no request.
* Keys go in through ``add_after(key, 0)`` (the low lane); each period is shortened by up
  to 10% at random; leader-only.

Design: docs/design/workqueue.md
"""

from __future__ import annotations

import random
import threading
from collections.abc import Callable, Iterable

import structlog

log = structlog.get_logger(__name__)

JITTER = 0.1
DEFAULT_PERIOD = 10 * 3600.0


class Resync:
    """``run(stop)`` calls ``enqueue_after(key, 0)`` for each of ``keys()`` every period."""

    def __init__(
        self, keys: Callable[[], Iterable[str]], enqueue_after: Callable[[str, float], None],
        *, period: float = DEFAULT_PERIOD, rng: Callable[[], float] = random.random,
    ) -> None:
        if period <= 0:
            raise ValueError("a resync period must be positive")
        self._keys = keys
        self._enqueue_after = enqueue_after
        self.period = period
        self._rng = rng

    def next_wait(self) -> float:
        return self.period * (1.0 - JITTER * self._rng())

    def run(self, stop: threading.Event) -> None:
        while not stop.wait(self.next_wait()):
            self.tick()

    def tick(self) -> int:
        """Queue every key once; returns how many."""
        keys = list(self._keys())
        for key in keys:
            self._enqueue_after(key, 0.0)
        log.info("periodic resync", keys=len(keys))
        return len(keys)
