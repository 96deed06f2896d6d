"""A periodic resync: every key is queued again every ``period``, whatever happened.

controller-runtime's ``SyncPeriod`` (10 hours by default): a safety net, not a schedule.
A reconciler that loses track of an object (a bug, a requeue that never came back)
would otherwise leave it alone until something else touched it; the resync bounds that
at one period. It costs what a reconcile of an object with nothing to do costs, so the
reconciler must make that nothing (here: cache reads, no request).

The keys go in through ``add_after(key, 0)``, the work queue's low lane, so watch events
still go first, and a key already queued is not queued twice. Each period is shortened
by up to 10% at random (client-go's jittered resync), so replicas restarted together
do not resync in step. Leader-only: a standby has no workers to feed.
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
        count = 0
        for key in list(self._keys()):
            self._enqueue_after(key, 0.0)
            count += 1
        log.info("periodic resync", keys=count)
        return count
