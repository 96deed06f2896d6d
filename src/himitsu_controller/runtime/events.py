"""Kubernetes Events, recorded fire-and-forget, the way client-go's EventRecorder does it.

* ``event()`` builds the body and queues it (bounded; a full queue drops, counted); one
  background thread sends in order: a reconcile never waits for an Event.
* A spam filter per (object, reason): client-go's burst 25, then one every five minutes.
* A failed POST is retried only when a retry can help; logs never carry the message.
* ``stop(timeout)`` sends what it can in time, then gives up.

Design: docs/design/events.md
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import Any, Protocol

import structlog

from himitsu_controller.runtime.client.errors import ApiError, TransportError, WriteRefused
from himitsu_controller.runtime.client.rest import Resource

from . import metrics
from .parts import Requester

log = structlog.get_logger(__name__)

EVENTS = Resource("", "v1", "events")

MAX_MESSAGE = 1024  # characters; the body's message is cut to this
MAX_INSTANCE = 128  # reportingInstance is validated to at most 128 characters
SPAM_BURST = 25  # client-go's defaultSpamBurst
SPAM_REFILL_SECONDS = 300.0  # client-go's defaultSpamQPS is 1/300
SPAM_CACHE_SIZE = 4096  # client-go's maxLruCacheEntries
MAX_ATTEMPTS = 3
RETRY_DELAY = 1.0  # seconds before the 2nd attempt; doubles after that
REQUEST_TIMEOUT = 10.0
DROP_LOG_INTERVAL = 60.0
DEFAULT_NAMESPACE = "default"  # where Events about cluster-scoped objects go


class EventSink(Protocol):
    """Where callers hand Events: ``EventRecorder`` in production, a fake in tests."""

    def event(self, obj: Mapping[str, Any], *, type: str, reason: str, message: str) -> None: ...


def build_event(obj: Mapping[str, Any], *, type: str, reason: str, message: str,
                component: str, reporting_controller: str, instance: str, now: datetime,
                ) -> dict[str, Any]:
    """A core/v1 Event about ``obj`` (its apiVersion, kind and metadata name it)."""
    meta = obj.get("metadata") or {}
    namespace = str(meta.get("namespace") or "")
    name = meta.get("name")
    stamp = now.strftime("%Y-%m-%dT%H:%M:%SZ")
    return {
        "apiVersion": "v1", "kind": "Event",
        "metadata": {"generateName": f"{name or 'object'}.",
                     "namespace": namespace or DEFAULT_NAMESPACE},
        "involvedObject": {"apiVersion": obj.get("apiVersion"), "kind": obj.get("kind"),
                           "namespace": namespace, "name": name, "uid": meta.get("uid"),
                           "resourceVersion": meta.get("resourceVersion")},
        "type": type, "reason": reason, "message": message[:MAX_MESSAGE],
        "source": {"component": component},
        "reportingComponent": reporting_controller,
        "reportingInstance": instance[:MAX_INSTANCE],
        "firstTimestamp": stamp, "lastTimestamp": stamp, "count": 1,
    }


class EventRecorder:
    """A bounded queue of Events and the one thread that sends them, in order."""

    def __init__(
        self, rest: Requester, *, component: str, reporting_controller: str, instance: str,
        queue_size: int = 1000, clock: Callable[[], float] = time.monotonic,
        max_attempts: int = MAX_ATTEMPTS, retry_delay: float = RETRY_DELAY,
    ) -> None:
        self._rest = rest
        self._source = {"component": component, "reporting_controller": reporting_controller,
                        "instance": instance}
        self._queue_size = queue_size
        self._clock = clock
        self._max_attempts = max_attempts
        self._retry_delay = retry_delay
        # (namespace, name, uid, reason) -> (tokens, last refill): client-go's spam filter,
        # an LRU; an evicted key starts again with a full bucket (errs towards showing).
        self._spam: OrderedDict[tuple[str, ...], tuple[float, float]] = OrderedDict()
        self._queue: deque[dict[str, Any]] = deque()
        self._cond = threading.Condition()
        self._closing = False
        self._abandon = threading.Event()  # stop() gave up: drop the rest, skip retry waits
        self._thread: threading.Thread | None = None
        self._sending = False  # the sender holds an Event it has not finished with
        self._counts = {"sent": 0, "dropped": 0, "filtered": 0, "failed": 0}
        self._dropped_unlogged = 0
        self._last_drop_log: float | None = None

    def event(self, obj: Mapping[str, Any], *, type: str, reason: str, message: str) -> None:
        """Queue an Event about ``obj``; returns at once and never raises."""
        try:
            meta = obj.get("metadata") or {}
            spam_key = (str(meta.get("namespace") or ""), str(meta.get("name") or ""),
                        str(meta.get("uid") or ""), reason)
            body = build_event(obj, type=type, reason=reason, message=message,
                               now=datetime.now(UTC), **self._source)
        except Exception as exc:  # a malformed object must not fail the caller's work
            log.warning("event not recorded", reason=reason, error=exc.__class__.__name__)
            return
        with self._cond:
            if self._closing or len(self._queue) >= self._queue_size:
                self._count_locked("dropped")
                self._note_drop_locked()
            elif not self._spam_allows_locked(spam_key):
                self._count_locked("filtered")
            else:
                self._queue.append(body)
                self._cond.notify()

    def _spam_allows_locked(self, key: tuple[str, ...]) -> bool:
        now = self._clock()
        tokens, last = self._spam.pop(key, (float(SPAM_BURST), now))
        tokens = min(SPAM_BURST, tokens + (now - last) / SPAM_REFILL_SECONDS)
        allowed = tokens >= 1.0
        self._spam[key] = (tokens - 1.0 if allowed else tokens, now)
        if len(self._spam) > SPAM_CACHE_SIZE:
            self._spam.popitem(last=False)
        return allowed

    def _count_locked(self, outcome: str, n: int = 1) -> None:
        self._counts[outcome] += n
        metrics.events_total.labels(outcome).inc(n)

    def _note_drop_locked(self) -> None:
        """Log drops at most once per DROP_LOG_INTERVAL, with how many since the last line."""
        self._dropped_unlogged += 1
        now = self._clock()
        if self._last_drop_log is not None and now - self._last_drop_log < DROP_LOG_INTERVAL:
            return
        log.warning("event queue full or closed, dropping events",
                    dropped=self._dropped_unlogged, dropped_total=self._counts["dropped"],
                    queue_size=self._queue_size)
        self._last_drop_log = now
        self._dropped_unlogged = 0

    @property
    def counts(self) -> dict[str, int]:
        """Events sent, dropped (queue full or closed), filtered (spam) and failed so far."""
        with self._cond:
            return dict(self._counts)

    @property
    def pending(self) -> int:
        """Events queued and not yet taken by the sender."""
        with self._cond:
            return len(self._queue)

    @property
    def closed(self) -> bool:
        """True once ``stop`` has begun: new Events are dropped from then on."""
        with self._cond:
            return self._closing

    def start(self) -> None:
        """Start the sender thread (once). Events queued before start are sent then."""
        with self._cond:
            if self._thread is not None:
                return
            self._thread = threading.Thread(target=self._run, name="event-recorder", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 2.0) -> bool:
        """Refuse new Events, send the queued ones for up to ``timeout`` seconds, then
        drop the rest. True when every queued Event was handled in time."""
        with self._cond:
            self._closing = True
            self._cond.notify_all()
            thread = self._thread
        if thread is not None:
            thread.join(timeout)
        with self._cond:
            if not self._queue and not self._sending:
                return True  # the sender may still be on its way out: nothing is lost
            self._abandon.set()
            abandoned = len(self._queue)
            self._queue.clear()
            self._count_locked("dropped", abandoned)
            in_flight = self._sending
        log.warning("gave up sending events at shutdown", abandoned=abandoned,
                    in_flight=in_flight, timeout_seconds=timeout)
        return False

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._queue and not self._closing:
                    self._cond.wait()
                if not self._queue:
                    return
                body = self._queue.popleft()
                self._sending = True
            try:
                outcome = self._send(body)
            except Exception as exc:  # never let the sender die: later Events still matter
                outcome = "failed"
                _log_failure(body, exc, attempts=1)
            with self._cond:
                self._count_locked(outcome)
                self._sending = False

    def _send(self, body: dict[str, Any]) -> str:
        """POST with a few retries for transient failures; "sent" or "failed"."""
        delay = self._retry_delay
        for attempt in range(1, self._max_attempts + 1):
            try:
                self._rest.request("POST", EVENTS.path(body["metadata"]["namespace"]),
                                   body=body, timeout=REQUEST_TIMEOUT)
                return "sent"
            except (ApiError, TransportError) as exc:
                last_try = attempt == self._max_attempts or not _transient(exc)
                # stop() gave up on us: no waiting, no further attempt.
                if last_try or self._abandon.wait(delay):
                    _log_failure(body, exc, attempts=attempt)
                    return "failed"
                delay *= 2
        raise AssertionError("unreachable: the last attempt returns")


def _log_failure(body: dict[str, Any], exc: Exception, *, attempts: int) -> None:
    # Neither the message nor str(exc): the apiserver's answer may quote the body.
    log.warning("event not recorded", namespace=body["metadata"]["namespace"],
                name=body["involvedObject"]["name"], reason=body["reason"],
                status=exc.status if isinstance(exc, ApiError) else None,
                error=type(exc).__name__, attempts=attempts)


def _transient(exc: ApiError | TransportError) -> bool:
    """Worth another try: unreachable, overloaded or failing; anything else (forbidden,
    namespace gone, invalid, no longer leading) would be refused again."""
    if isinstance(exc, WriteRefused):
        return False
    return isinstance(exc, TransportError) or exc.status == 429 or exc.status >= 500
