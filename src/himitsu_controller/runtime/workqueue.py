"""A rate-limited, delaying work queue of string keys, with client-go's semantics.

* Stingy (a waiting key is not queued twice) and never concurrent per key (a re-add
  while processing is queued again on ``done()``); FIFO within a lane.
* Two lanes: ``add()`` (watch events) goes ahead of keys released by ``add_after`` and
  ``add_rate_limited`` timers, so timed polls never delay event-driven work.
* Delays live in a heap promoted on every operation: no timer thread, fake clocks work.
* After shutdown ``get()`` hands out nothing more (client-go drains the queue).

Design: docs/design/workqueue.md
"""

from __future__ import annotations

import heapq
import itertools
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Protocol

from . import metrics

Clock = Callable[[], float]

# Lane indices: a lower number is served first and wins when a key is asked for in both.
_HIGH, _LOW = 0, 1


class RateLimiter(Protocol):
    """client-go's RateLimiter: ``when`` records a failure and returns its delay (seconds),
    ``forget`` starts a key from the base delay again, ``num_requeues`` counts failures."""

    def when(self, item: str) -> float: ...

    def forget(self, item: str) -> None: ...

    def num_requeues(self, item: str) -> int: ...


class ItemExponentialFailureRateLimiter:
    """Per-key delay ``base * 2**failures``, capped at ``max_delay``."""

    def __init__(self, base: float = 0.005, max_delay: float = 1000.0) -> None:
        self._base = base
        self._max_delay = max_delay
        self._failures: dict[str, int] = {}
        self._lock = threading.Lock()

    def when(self, item: str) -> float:
        with self._lock:
            exponent = self._failures.get(item, 0)
            self._failures[item] = exponent + 1
        # The exponent clamped: 2.0 ** 1024 would raise OverflowError on a key failing forever.
        return min(self._base * 2.0 ** min(exponent, 1023), self._max_delay)

    def forget(self, item: str) -> None:
        with self._lock:
            self._failures.pop(item, None)

    def num_requeues(self, item: str) -> int:
        with self._lock:
            return self._failures.get(item, 0)


class BucketRateLimiter:
    """An overall token bucket (``qps`` refill, ``burst`` capacity) shared by all keys:
    ``when()`` reserves a token and returns how long until it is available."""

    def __init__(self, qps: float = 10.0, burst: int = 100, *, clock: Clock = time.monotonic):
        if qps <= 0 or burst < 1:
            raise ValueError("qps must be positive and burst at least 1")
        self._qps = qps
        self._burst = float(burst)
        self._clock = clock
        self._tokens = float(burst)  # a fresh bucket starts full
        self._last = clock()
        self._lock = threading.Lock()

    def when(self, item: str) -> float:
        with self._lock:
            now = self._clock()
            elapsed = max(0.0, now - self._last)  # a clock going backwards refills nothing
            self._last = now
            self._tokens = min(self._burst, self._tokens + elapsed * self._qps)
            # Reserving may drive the balance negative: later callers queue up behind.
            self._tokens -= 1.0
            return 0.0 if self._tokens >= 0 else -self._tokens / self._qps

    def forget(self, item: str) -> None:
        return  # the bucket is shared: nothing per key

    def num_requeues(self, item: str) -> int:
        return 0


class MaxOfRateLimiter:
    """The longest delay of several limiters (every limiter records the failure)."""

    def __init__(self, *limiters: RateLimiter) -> None:
        self._limiters = limiters

    def when(self, item: str) -> float:
        return max([limiter.when(item) for limiter in self._limiters])

    def forget(self, item: str) -> None:
        for limiter in self._limiters:
            limiter.forget(item)

    def num_requeues(self, item: str) -> int:
        return max(limiter.num_requeues(item) for limiter in self._limiters)


def default_controller_rate_limiter(*, clock: Clock = time.monotonic) -> MaxOfRateLimiter:
    """client-go's DefaultControllerRateLimiter: per-key 5 ms..1000 s, overall 10 qps/100."""
    return MaxOfRateLimiter(
        ItemExponentialFailureRateLimiter(0.005, 1000.0),
        BucketRateLimiter(10.0, 100, clock=clock),
    )


class RateLimitingQueue:
    """Work queue with delays and per-key rate limiting; see the module docstring."""

    def __init__(self, name: str, *, controller: str | None = None,
                 rate_limiter: RateLimiter | None = None, clock: Clock = time.monotonic,
                 ) -> None:
        self.name = name
        self._rate_limiter = rate_limiter or default_controller_rate_limiter(clock=clock)
        self._clock = clock
        self._lock = threading.Lock()
        # Two conditions on one lock: workers wait for items, drainers for idleness;
        # a single condition could hand a worker's wake-up to a drainer.
        self._item_ready = threading.Condition(self._lock)
        self._idle = threading.Condition(self._lock)
        # The keys waiting in each lane, oldest first; a key is in one lane at most.
        self._lanes: tuple[OrderedDict[str, None], ...] = (OrderedDict(), OrderedDict())
        self._dirty: dict[str, int] = {}  # key to (re)queue -> best lane asked for
        self._processing: dict[str, float] = {}  # key -> processing start (clock)
        self._added_at: dict[str, float] = {}  # key -> first add while dirty (clock)
        self._waiting: list[tuple[float, int, str]] = []  # heap of (ready_at, seq, key)
        self._waiting_entry: dict[str, tuple[float, int]] = {}  # key -> its live heap entry
        self._seq = itertools.count()
        self._shutting_down = False
        self.metrics_labels = labels = (name, controller or name)
        self._depth = metrics.workqueue_depth.labels(*labels, "")
        self._adds = metrics.workqueue_adds_total.labels(*labels)
        self._retries = metrics.workqueue_retries_total.labels(*labels)
        self._latency = metrics.workqueue_queue_duration_seconds.labels(*labels)
        self._work_duration = metrics.workqueue_work_duration_seconds.labels(*labels)
        self._depth.set(0)
        metrics.scrape_time.add_queue(self)

    def add(self, item: str) -> None:
        """Queue ``item`` in the HIGH lane unless it is already there (deferred if it
        is processing); a key waiting in the LOW lane moves up."""
        with self._lock:
            now = self._clock()
            self._promote_ready(now)
            self._add_locked(item, now, _HIGH)

    def add_after(self, item: str, delay: float) -> None:
        """Queue ``item`` in the LOW lane after ``delay`` seconds; an earlier pending
        time for it wins."""
        with self._lock:
            if self._shutting_down:
                return
            self._retries.inc()  # client-go counts every delayed add as a retry
            now = self._clock()
            self._promote_ready(now)
            if delay <= 0:
                self._add_locked(item, now, _LOW)
                return
            ready_at = now + delay
            existing = self._waiting_entry.get(item)
            if existing is not None and existing[0] <= ready_at:
                return
            seq = next(self._seq)
            # A superseded heap entry stays in the heap and is skipped when popped.
            self._waiting_entry[item] = (ready_at, seq)
            heapq.heappush(self._waiting, (ready_at, seq, item))
            if self._waiting[0][1] == seq:
                # The earliest deadline moved closer: sleeping getters must re-time.
                self._item_ready.notify_all()

    def add_rate_limited(self, item: str) -> None:
        """Queue ``item`` after the delay its rate limiter assigns (one more failure)."""
        if self.shutting_down():
            return
        self.add_after(item, self._rate_limiter.when(item))

    def forget(self, item: str) -> None:
        """Reset ``item``'s failure count (call after a success)."""
        self._rate_limiter.forget(item)

    def num_requeues(self, item: str) -> int:
        return self._rate_limiter.num_requeues(item)

    def get(self, timeout: float | None = None) -> tuple[str | None, bool]:
        """Take the next key: ``(key, False)``, ``(None, False)`` on timeout, or
        ``(None, True)`` once the queue is shutting down. Call ``done(key)`` after."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._lock:
            while True:
                if self._shutting_down:
                    return None, True
                now = self._clock()
                self._promote_ready(now)
                if self._lanes[_HIGH] or self._lanes[_LOW]:
                    return self._take_locked(now), False
                if deadline is not None and time.monotonic() >= deadline:
                    return None, False
                # Sleep until the caller's deadline or the next delayed key, if any.
                waits = [self._waiting[0][0] - now] if self._waiting else []
                if deadline is not None:
                    waits.append(deadline - time.monotonic())
                self._item_ready.wait(min(waits, default=None))

    def done(self, item: str) -> None:
        """Finish processing ``item``; if it was re-added meanwhile, queue it again."""
        with self._lock:
            started = self._processing.pop(item, None)
            if started is None:
                return
            self._work_duration.observe(max(0.0, self._clock() - started))
            lane = self._dirty.get(item)
            if lane is not None:
                self._enqueue_locked(item, lane)
            if not self._processing:
                self._idle.notify_all()

    def shut_down(self) -> None:
        """Refuse new keys, drop delayed ones, and release every waiting ``get()``."""
        with self._lock:
            self._shutting_down = True
            self._waiting.clear()
            self._waiting_entry.clear()
            self._item_ready.notify_all()
            self._idle.notify_all()

    def shut_down_with_drain(self, timeout: float | None = None) -> bool:
        """Shut down, then wait until no key is processing; False if ``timeout`` hit."""
        self.shut_down()
        with self._lock:
            return self._idle.wait_for(lambda: not self._processing, timeout)

    def shutting_down(self) -> bool:
        with self._lock:
            return self._shutting_down

    def __len__(self) -> int:
        """Keys ready to be handed out (not those processing or still delayed)."""
        with self._lock:
            self._promote_ready(self._clock())
            return len(self._lanes[_HIGH]) + len(self._lanes[_LOW])

    def in_flight_seconds(self) -> list[float]:
        with self._lock:
            now = self._clock()
            return [max(0.0, now - started) for started in self._processing.values()]

    # Below: the lock is held.

    def _add_locked(self, item: str, now: float, lane: int) -> None:
        if self._shutting_down:
            return
        current = self._dirty.get(item)
        if current is not None:
            if lane < current:  # asked for a better lane: upgrade, never downgrade
                self._dirty[item] = lane
                if item in self._lanes[current]:  # waiting (not processing): move it up now
                    del self._lanes[current][item]
                    self._enqueue_locked(item, lane)
            return
        self._adds.inc()
        self._dirty[item] = lane
        self._added_at.setdefault(item, now)
        self._depth.set(len(self._dirty))
        if item in self._processing:
            return  # done() queues it, so no two workers ever hold the same key
        self._enqueue_locked(item, lane)

    def _enqueue_locked(self, item: str, lane: int) -> None:
        self._lanes[lane][item] = None
        self._item_ready.notify()

    def _take_locked(self, now: float) -> str:
        """Pop the oldest key, HIGH lane first (callers ensure there is one)."""
        item, _ = (self._lanes[_HIGH] or self._lanes[_LOW]).popitem(last=False)
        del self._dirty[item]
        self._depth.set(len(self._dirty))
        self._processing[item] = now
        self._latency.observe(max(0.0, now - self._added_at.pop(item)))
        return item

    def _promote_ready(self, now: float) -> None:
        while self._waiting and self._waiting[0][0] <= now:
            ready_at, seq, item = heapq.heappop(self._waiting)
            if self._waiting_entry.get(item) != (ready_at, seq):
                continue  # superseded by an earlier add_after for the same key
            del self._waiting_entry[item]
            self._add_locked(item, now, _LOW)
