"""Start and stop everything in the one order that is safe, and report it on probes.

* Start: metrics and probes, then informers (nothing reconciles before every cache has
  synced), then leader election; workers run only while leading.
* Stop: drain workers, flush Events, then release the Lease (never before our last
  writes), then informers and servers, all within ``graceful_shutdown_timeout``.
* Lost leadership: stop workers at once and return 1 (the pod restarts).
* The elector is built by a factory the manager hands its callbacks to.

Design: docs/design/manager.md
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import structlog

from .healthz import Check, ProbeServer
from .httpserver import HTTPServerHandle
from .metrics import scrape_time, start_metrics_server
from .metricsauth import SecureServing
from .parts import (
    ControllerLike,
    EventFlusher,
    InformerLike,
    LeaderElectionFactory,
    LeaderElectorLike,
)
from .shutdown import Budget, Step, StopSignals, join_all

log = structlog.get_logger(__name__)

UNHEALTHY_WATCH_THRESHOLD = 30.0  # a watch failing to reconnect this long: unready
# An apiserver that answers but gives no working watch this long: /healthz fails so the
# pod restarts (an unreachable one does not count; see docs/design/manager.md).
WATCH_LIVENESS_TIMEOUT = 300.0
_SYNC_POLL_INTERVAL = 0.1
_SIGNAL_POLL_INTERVAL = 0.5
# Caps of the shutdown steps after the drain (seconds; all within the one budget).
EVENT_FLUSH_TIMEOUT = 2.0  # Events still queued get this long to reach the apiserver
LEASE_RELEASE_TIMEOUT = 3.0  # the elector: 1 s for admitted writes to settle, 2 s to release
INFORMER_STOP_TIMEOUT = 2.0
SHUTDOWN_RESERVE = EVENT_FLUSH_TIMEOUT + LEASE_RELEASE_TIMEOUT + INFORMER_STOP_TIMEOUT
# Stopping the HTTP servers, outside the budget: each returns within a poll interval.
SERVER_STOP_SECONDS = 1.0


class Manager:
    """Owns the process's informers, controllers, elector, servers and their lifecycle."""

    def __init__(
        self,
        *,
        metrics_bind_address: str = ":8080",
        health_probe_bind_address: str = ":8081",
        leader_election: LeaderElectionFactory | None = None,
        graceful_shutdown_timeout: float = 30.0,
        cache_sync_timeout: float = 120.0,
        events: EventFlusher | None = None,
        watch_liveness_timeout: float = WATCH_LIVENESS_TIMEOUT,
        metrics_secure: SecureServing | None = None,
    ) -> None:
        """``events`` is started with the manager and flushed on its way out;
        ``metrics_secure``: /metrics over HTTPS to authorized scrapers only."""
        self._metrics_address = metrics_bind_address
        self._metrics_secure = metrics_secure
        self._events = events
        self.shutdown_steps: list[Step] = []  # what the last shutdown's steps were given
        self._leader_election = leader_election
        self._graceful_shutdown_timeout = graceful_shutdown_timeout
        self._cache_sync_timeout = cache_sync_timeout
        self._informers: list[InformerLike] = []
        self._controllers: list[ControllerLike] = []
        # name -> (fn, need_leader_election)
        self._runnables: dict[str, tuple[Callable[[threading.Event], None], bool]] = {}
        self._probes = ProbeServer(health_probe_bind_address)
        self._metrics_server: HTTPServerHandle | None = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._informer_stop = threading.Event()
        self._elector_stop = threading.Event()
        self._runnable_stop = threading.Event()
        self._caches_synced = threading.Event()
        self._stopping = False
        self._leading = False
        self._lost_leadership = False
        self._signals = StopSignals(self.request_stop)
        self._informer_threads: dict[str, threading.Thread] = {}
        self._runnable_threads: dict[str, threading.Thread] = {}
        self._elector_thread: threading.Thread | None = None
        self._probes.add_healthz("workers", self._check_workers)
        self._probes.add_healthz("informers", self._check_informer_threads)
        if watch_liveness_timeout > 0:
            self._probes.add_healthz("watches", self._watches_over(
                lambda i: i.stalled_for(), watch_liveness_timeout,
                "apiserver answers but no watch works"))
        self._probes.add_readyz("caches-synced", self._check_caches_synced)
        self._probes.add_readyz("watches", self._watches_over(
            lambda i: i.unhealthy_for(), UNHEALTHY_WATCH_THRESHOLD,
            "watches failing to reconnect"))

    def add_informer(self, informer: InformerLike) -> None:
        if any(existing.name == informer.name for existing in self._informers):
            raise ValueError(f"an informer named {informer.name!r} is already added")
        self._informers.append(informer)
        scrape_time.add_informer(informer)

    def add_controller(self, controller: ControllerLike) -> None:
        self._controllers.append(controller)

    def add_runnable(self, name: str, fn: Callable[[threading.Event], None], *,
                     need_leader_election: bool = True) -> None:
        """Run ``fn(stop)`` on its own thread until ``stop`` is set: with the workers, or
        (``need_leader_election=False``) once caches have synced."""
        if name in self._runnables:
            raise ValueError(f"a runnable named {name!r} is already added")
        self._runnables[name] = (fn, need_leader_election)

    def add_readyz_check(self, name: str, check: Check) -> None:
        self._probes.add_readyz(name, check)

    def request_stop(self) -> None:
        self._stop.set()

    @property
    def metrics_port(self) -> int | None:
        return None if self._metrics_server is None else self._metrics_server.port

    @property
    def probe_port(self) -> int | None:
        try:
            return self._probes.port
        except RuntimeError:
            return None

    def is_leading(self) -> bool:
        with self._lock:
            return self._leading

    def shutdown_bound(self) -> float:
        """The longest a shutdown can take, stuck workers and informers included."""
        return self._graceful_shutdown_timeout + SERVER_STOP_SECONDS

    def run(self, stop: threading.Event | None = None) -> int:
        """Run until stopped; the exit code for the process (0 clean, 1 failure). ``stop``
        (if given) is the manager's stop event: set by the caller, or by the manager."""
        if stop is not None:
            self._stop = stop
        restore_signals = self._signals.install()
        try:
            return self._run()
        finally:
            restore_signals()

    def _run(self) -> int:
        try:
            self._metrics_server = start_metrics_server(self._metrics_address,
                                                       secure=self._metrics_secure)
            self._probes.start()
        except (OSError, ValueError) as exc:
            log.error("cannot start metrics/probe servers", error=str(exc))
            self._stop_servers()
            return 1
        if self._events is not None:
            self._events.start()
        self._start_informers()
        outcome = self._wait_for_caches()
        code = 1 if outcome == "failed" else 0
        if outcome == "synced":
            self._start_runnables(leader_only=False)
            self._start_leading_or_campaign()
            # Bounded waits: a signal the kernel delivers to another thread only runs
            # its Python handler once the main thread executes bytecode again.
            while not self._stop.wait(_SIGNAL_POLL_INTERVAL):
                pass
            if self._signals.received is not None:
                log.info("signal received, shutting down", signal=self._signals.received)
            code = 1 if self._lost_leadership else 0
        return max(code, self._shutdown())

    def _start_informers(self) -> None:
        for informer in self._informers:
            self._informer_threads[informer.name] = _spawn(
                f"informer-{informer.name}", self._run_informer, informer)

    def _run_informer(self, informer: InformerLike) -> None:
        _run_logged("informer crashed", informer.run, self._informer_stop,
                    informer=informer.name)
        if not self._informer_stop.is_set():
            log.error("informer stopped unexpectedly", informer=informer.name)

    def _wait_for_caches(self) -> str:
        """"synced", "stopped" (stop requested meanwhile) or "failed"."""
        deadline = time.monotonic() + self._cache_sync_timeout
        while True:
            pending = [i.name for i in self._informers if not i.has_synced()]
            if not pending:
                self._caches_synced.set()
                log.info("caches synced", informers=[i.name for i in self._informers])
                return "synced"
            dead = self._dead(self._informer_threads)
            if dead:
                log.error("informer stopped before its cache synced", informers=dead)
                return "failed"
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                log.error("timed out waiting for caches to sync", informers=pending,
                          timeout_seconds=self._cache_sync_timeout)
                return "failed"
            if self._stop.wait(min(_SYNC_POLL_INTERVAL, remaining)):
                return "stopped"

    def _start_leading_or_campaign(self) -> None:
        if self._leader_election is None:
            self._on_started_leading()
            return
        elector = self._leader_election(self._on_started_leading, self._on_stopped_leading)
        self._elector_thread = _spawn("leader-election", self._run_elector, elector)

    def _run_elector(self, elector: LeaderElectorLike) -> None:
        _run_logged("leader election crashed", elector.run, self._elector_stop)
        if not self._elector_stop.is_set():
            # Run only returns early when leadership was lost (or never kept): restart.
            self._lose_leadership("leader election ended")

    def _on_started_leading(self) -> None:
        # Under the lock so that _shutdown, once it has set _stopping, knows no worker
        # or runnable can still be starting behind its back.
        with self._lock:
            if self._stopping:
                return
            self._leading = True
            log.info("leading: starting workers", controllers=[c.name for c in self._controllers])
            for controller in self._controllers:
                controller.start()
            self._start_runnables(leader_only=True)

    def _on_stopped_leading(self) -> None:
        with self._lock:
            stopping, self._leading = self._stopping, False
        if stopping:
            log.info("leadership released")
        else:
            self._lose_leadership("leadership lost")

    def _lose_leadership(self, why: str) -> None:
        with self._lock:
            if self._stopping or self._lost_leadership:
                return
            self._lost_leadership = True
            self._leading = False
        log.error("stopping workers and exiting so the pod restarts", reason=why)
        self._stop.set()

    def _start_runnables(self, *, leader_only: bool) -> None:
        for name, (fn, need_leader_election) in self._runnables.items():
            if need_leader_election == leader_only:
                self._runnable_threads[name] = _spawn(
                    f"runnable-{name}", _run_logged, "runnable crashed", fn,
                    self._runnable_stop, runnable=name)

    def _shutdown(self) -> int:
        """Stop in order within one budget; 1 if the workers did not drain in their share.
        After lost leadership there is no drain (docs/design/manager.md)."""
        with self._lock:
            self._stopping = True
            lost = self._lost_leadership
        self._stop.set()
        budget = Budget(self._graceful_shutdown_timeout)
        reserve = min(SHUTDOWN_RESERVE, budget.total / 2)
        drained = budget.run("workers", self._stop_workers, cap=0.0 if lost else None,
                             keep=reserve)
        if lost:
            log.info("leadership lost: not waiting for in-flight reconciles", drained=drained)
        elif not drained:
            log.error("workers did not finish within the graceful shutdown timeout",
                      timeout_seconds=self._graceful_shutdown_timeout)
        # Events before the release: once the Lease is released the write gate is shut.
        budget.run("events", self._flush_events, cap=EVENT_FLUSH_TIMEOUT)
        budget.run("lease", self._release_lease, cap=LEASE_RELEASE_TIMEOUT)
        budget.run("informers", self._stop_informers, cap=INFORMER_STOP_TIMEOUT)
        self._stop_servers()
        self.shutdown_steps = budget.steps
        unfinished = [step.name for step in budget.steps if not step.finished]
        log.info("manager stopped", unfinished=unfinished or None)
        return 0 if drained else 1

    def _stop_workers(self, seconds: float) -> bool:
        deadline = time.monotonic() + seconds
        drained = True
        for controller in self._controllers:
            remaining = max(0.0, deadline - time.monotonic())
            drained = controller.stop(drain_timeout=remaining) and drained
        self._runnable_stop.set()
        return join_all(self._runnable_threads.values(),
                        max(0.0, deadline - time.monotonic())) and drained

    def _flush_events(self, seconds: float) -> bool:
        return self._events is None or self._events.stop(seconds)

    def _release_lease(self, seconds: float) -> bool:
        # The elector closes the gate, waits for writes it let through, then releases.
        self._elector_stop.set()
        return join_all([self._elector_thread] if self._elector_thread else [], seconds)

    def _stop_informers(self, seconds: float) -> bool:
        self._informer_stop.set()
        return join_all(self._informer_threads.values(), seconds)

    def _stop_servers(self) -> None:
        if self._metrics_server is not None:
            self._metrics_server.stop()
            self._metrics_server = None
        self._probes.stop()

    def _dead(self, threads: dict[str, threading.Thread]) -> list[str]:
        with self._lock:
            if self._stopping:
                return []
        return [name for name, thread in threads.items() if not thread.is_alive()]

    def _check_workers(self) -> str | None:
        dead = [c.name for c in self._controllers if not c.workers_alive()]
        dead += [f"runnable {name}" for name in self._dead(self._runnable_threads)]
        return f"dead worker threads in: {', '.join(dead)}" if dead else None

    def _check_informer_threads(self) -> str | None:
        dead = self._dead(self._informer_threads)
        return f"informer threads stopped: {', '.join(dead)}" if dead else None

    def _check_caches_synced(self) -> str | None:
        if self._caches_synced.is_set():
            return None
        pending = [i.name for i in self._informers if not i.has_synced()]
        return f"waiting for caches: {', '.join(pending) or 'starting'}"

    def _watches_over(self, seconds_of: Callable[[InformerLike], float], threshold: float,
                      what: str) -> Check:
        """A check failing with ``what`` while an informer's ``seconds_of`` is over
        ``threshold``."""
        def check() -> str | None:
            seconds = [(i.name, seconds_of(i)) for i in self._informers]
            over = ", ".join(f"{name} ({s:.0f}s)" for name, s in seconds if s > threshold)
            return f"{what}: {over}" if over else None

        return check


def _spawn(name: str, target: Callable[..., object], *args: object, **kwargs: object,
           ) -> threading.Thread:
    thread = threading.Thread(target=target, args=args, kwargs=kwargs, name=name, daemon=True)
    thread.start()
    return thread


def _run_logged(crashed: str, run: Callable[[threading.Event], object], stop: threading.Event,
                **fields: str) -> None:
    try:
        run(stop)
    except Exception as exc:  # reported by /healthz; the log says why
        log.error(crashed, **fields, error_type=type(exc).__name__, error=str(exc))
