"""Worker threads that drain a work queue into a reconcile function.

* Outcomes as controller-runtime's ``reconcileHandler``: an exception or
  ``Result(error=...)`` is counted and retried with rate limiting, ``requeue_after``
  forgets then adds after, ``requeue=True`` is a rate-limited requeue, ``Result()`` forgets.
* One difference: ``requeue_after`` <= 0 is a requeue ("now"), never a success.

Design: docs/design/workqueue.md
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import structlog

from . import metrics
from .shutdown import join_all
from .workqueue import RateLimitingQueue

log = structlog.get_logger(__name__)


@dataclass(frozen=True)
class Result:
    """What a reconcile asks the controller to do next (see the module docstring)."""

    requeue_after: float | None = None
    requeue: bool = False
    error: str | None = None


Reconcile = Callable[[str], Result]


class Controller:
    """``workers`` threads taking keys from ``queue`` and reconciling them one at a time."""

    def __init__(self, name: str, reconcile: Reconcile, *, workers: int = 4,
                 queue: RateLimitingQueue | None = None) -> None:
        self.name = name
        self.queue = queue if queue is not None else RateLimitingQueue(name, controller=name)
        self._reconcile = reconcile
        self._workers = workers
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()
        self._stopping = False
        self._log = log.bind(controller=name)
        self._total = {r: metrics.reconcile_total.labels(name, r) for r in metrics.RESULTS}
        self._errors = metrics.reconcile_errors_total.labels(name)
        self._panics = metrics.reconcile_panics_total.labels(name)
        self._time = metrics.reconcile_time_seconds.labels(name)
        self._active = metrics.active_workers.labels(name)
        metrics.max_concurrent_reconciles.labels(name).set(workers)
        self._active.set(0)

    @property
    def started(self) -> bool:
        with self._lock:
            return bool(self._threads)

    def enqueue(self, key: str) -> None:
        self.queue.add(key)

    def enqueue_after(self, key: str, delay: float) -> None:
        self.queue.add_after(key, delay)

    def start(self) -> None:
        """Spawn the worker threads (daemons: a stuck reconcile must not block exit)."""
        with self._lock:
            if self._threads or self._stopping:
                return
            self._threads = [threading.Thread(target=self._worker, daemon=True,
                                              name=f"{self.name}-worker-{index}")
                             for index in range(self._workers)]
            for thread in self._threads:
                thread.start()
        self._log.info("starting workers", workers=self._workers)

    def stop(self, drain_timeout: float = 30.0) -> bool:
        """Stop handing out keys, wait for in-flight reconciles, join the workers; False
        when reconciles were still running after ``drain_timeout``."""
        deadline = time.monotonic() + drain_timeout
        with self._lock:
            self._stopping = True
        drained = self.queue.shut_down_with_drain(drain_timeout)
        stopped = join_all(self._threads, deadline - time.monotonic()) and drained
        if stopped:
            self._log.info("workers stopped")
        else:
            self._log.warning("workers still busy after drain timeout", timeout=drain_timeout)
        return stopped

    def workers_alive(self) -> bool:
        """False when a worker thread has exited while the controller was not stopping
        (one never started has no dead workers)."""
        with self._lock:
            return self._stopping or all(thread.is_alive() for thread in self._threads)

    def _worker(self) -> None:
        while True:
            key, _ = self.queue.get()
            if key is None:  # shutting down
                return
            self._active.inc()
            try:
                self._process(key)
            except Exception as exc:  # defence in depth: never lose a worker
                self._log.error(
                    "worker failed outside reconcile", key=key, error_type=type(exc).__name__
                )
            finally:
                self._active.dec()
                self.queue.done(key)

    def _process(self, key: str) -> None:
        started = time.monotonic()
        result: Result | None
        try:
            result = self._reconcile(key)
        except Exception as exc:  # a reconcile bug must not kill the worker
            self._panics.inc()
            # Reconcilers guarantee their exception strings carry no secrets.
            self._log.error(
                "reconcile raised", key=key, error_type=type(exc).__name__, error=str(exc)
            )
            result = None
        self._time.observe(time.monotonic() - started)
        delay = 0.0 if result is None else result.requeue_after
        if result is None or result.error is not None:
            self._errors.inc()
            self._total["error"].inc()
            if result is not None:
                # The reconciler has reported it (status, Event); debug keeps one line per key.
                self._log.debug("reconcile reported an error", key=key, error=result.error)
            if delay is not None and delay > 0:
                self.queue.add_after(key, delay)
            else:
                self.queue.add_rate_limited(key)
        elif delay is not None and delay > 0:
            self.queue.forget(key)
            self.queue.add_after(key, delay)
            self._total["requeue_after"].inc()
        elif result.requeue or delay is not None:
            self.queue.add_rate_limited(key)
            self._total["requeue"].inc()
        else:
            self.queue.forget(key)
            self._total["success"].inc()
