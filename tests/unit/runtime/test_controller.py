"""The controller turns reconcile outcomes into controller-runtime's queue operations,
counts them, survives exceptions, never runs one key twice at once, and drains on stop."""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable, Iterator

import pytest
from structlog.testing import capture_logs

from himitsu_controller.runtime.controller import Controller, Result
from himitsu_controller.runtime.metrics import REGISTRY
from himitsu_controller.runtime.workqueue import (
    ItemExponentialFailureRateLimiter,
    RateLimitingQueue,
)

WAIT = 10.0
_names = itertools.count()


class FakeClock:
    def __init__(self) -> None:
        self.now = 500.0

    def __call__(self) -> float:
        return self.now


class RecordingQueue(RateLimitingQueue):
    """A real queue that also records the controller's calls and signals each done()."""

    def __init__(self, name: str, clock: FakeClock) -> None:
        super().__init__(
            name, rate_limiter=ItemExponentialFailureRateLimiter(1.0, 60.0), clock=clock
        )
        self.calls: list[tuple[str, str, float | None]] = []
        self.done_count = 0
        self.done_cond = threading.Condition()

    def forget(self, item: str) -> None:
        self.calls.append(("forget", item, None))
        super().forget(item)

    def add_after(self, item: str, delay: float) -> None:
        self.calls.append(("add_after", item, delay))
        super().add_after(item, delay)

    def add_rate_limited(self, item: str) -> None:
        self.calls.append(("add_rate_limited", item, None))
        super().add_rate_limited(item)

    def done(self, item: str) -> None:
        super().done(item)
        with self.done_cond:
            self.done_count += 1
            self.done_cond.notify_all()

    def wait_done(self, count: int) -> None:
        with self.done_cond:
            assert self.done_cond.wait_for(lambda: self.done_count >= count, WAIT)


def sample(metric: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(metric, labels) or 0.0


@pytest.fixture
def name() -> str:
    return f"test-ctrl-{next(_names)}"


@pytest.fixture
def stop_after() -> Iterator[list[Controller]]:
    controllers: list[Controller] = []
    yield controllers
    for controller in controllers:
        controller.stop(drain_timeout=WAIT)


def make(
    name: str, reconcile: Callable[[str], Result], stop_after: list[Controller], workers: int = 1
) -> tuple[Controller, RecordingQueue]:
    queue = RecordingQueue(name, FakeClock())
    controller = Controller(name, reconcile, workers=workers, queue=queue)
    stop_after.append(controller)
    return controller, queue


def run_once(
    name: str, result: Result | Exception, stop_after: list[Controller]
) -> RecordingQueue:
    def reconcile(key: str) -> Result:
        if isinstance(result, Exception):
            raise result
        return result

    controller, queue = make(name, reconcile, stop_after)
    controller.enqueue("ns/obj")
    controller.start()
    queue.wait_done(1)
    return queue


def test_success_forgets_and_counts(name: str, stop_after: list[Controller]) -> None:
    queue = run_once(name, Result(), stop_after)
    assert queue.calls == [("forget", "ns/obj", None)]
    assert sample("controller_runtime_reconcile_total", controller=name, result="success") == 1
    assert sample("controller_runtime_reconcile_time_seconds_count", controller=name) == 1
    assert len(queue) == 0


def test_requeue_after_forgets_then_adds_after(name: str, stop_after: list[Controller]) -> None:
    queue = run_once(name, Result(requeue_after=30.0), stop_after)
    assert queue.calls == [("forget", "ns/obj", None), ("add_after", "ns/obj", 30.0)]
    total = sample("controller_runtime_reconcile_total", controller=name, result="requeue_after")
    assert total == 1


def test_requeue_is_rate_limited(name: str, stop_after: list[Controller]) -> None:
    queue = run_once(name, Result(requeue=True), stop_after)
    assert queue.calls[0] == ("add_rate_limited", "ns/obj", None)
    assert queue.num_requeues("ns/obj") == 1
    assert sample("controller_runtime_reconcile_total", controller=name, result="requeue") == 1


def test_reported_error_is_counted_and_rate_limited(
    name: str, stop_after: list[Controller]
) -> None:
    queue = run_once(name, Result(error="fetch failed: 503"), stop_after)
    assert queue.calls[0] == ("add_rate_limited", "ns/obj", None)
    assert ("forget", "ns/obj", None) not in queue.calls
    assert sample("controller_runtime_reconcile_errors_total", controller=name) == 1
    assert sample("controller_runtime_reconcile_total", controller=name, result="error") == 1
    assert sample("controller_runtime_reconcile_panics_total", controller=name) == 0


def test_reported_error_with_requeue_after_keeps_the_failure_count(
    name: str, stop_after: list[Controller]
) -> None:
    queue = run_once(name, Result(error="rate limited", requeue_after=12.0), stop_after)
    assert queue.calls == [("add_after", "ns/obj", 12.0)]  # no forget
    assert sample("controller_runtime_reconcile_errors_total", controller=name) == 1


def test_exception_is_logged_counted_and_rate_limited(
    name: str, stop_after: list[Controller]
) -> None:
    with capture_logs() as logs:
        queue = run_once(name, RuntimeError("boom in ns/obj"), stop_after)
    assert queue.calls[0] == ("add_rate_limited", "ns/obj", None)
    assert sample("controller_runtime_reconcile_panics_total", controller=name) == 1
    assert sample("controller_runtime_reconcile_errors_total", controller=name) == 1
    assert sample("controller_runtime_reconcile_total", controller=name, result="error") == 1
    errors = [entry for entry in logs if entry["log_level"] == "error"]
    assert errors[0]["key"] == "ns/obj"
    assert errors[0]["error_type"] == "RuntimeError"
    assert errors[0]["error"] == "boom in ns/obj"


def test_worker_survives_exceptions(name: str, stop_after: list[Controller]) -> None:
    seen: list[str] = []

    def reconcile(key: str) -> Result:
        seen.append(key)
        if key == "bad":
            raise ValueError("bad key")
        return Result()

    controller, queue = make(name, reconcile, stop_after, workers=1)
    controller.enqueue("bad")
    controller.enqueue("good")
    controller.start()
    queue.wait_done(2)
    assert seen == ["bad", "good"]  # the single worker went on after the exception
    assert controller.workers_alive()


def test_same_key_never_reconciled_concurrently(name: str, stop_after: list[Controller]) -> None:
    release = threading.Event()
    entered = threading.Event()
    lock = threading.Lock()
    active: list[str] = []
    overlaps: list[str] = []
    calls: list[str] = []

    def reconcile(key: str) -> Result:
        with lock:
            if key in active:
                overlaps.append(key)
            active.append(key)
            calls.append(key)
        entered.set()
        release.wait(WAIT)
        with lock:
            active.remove(key)
        return Result()

    controller, queue = make(name, reconcile, stop_after, workers=4)
    controller.enqueue("k")
    controller.start()
    assert entered.wait(WAIT)
    controller.enqueue("k")  # arrives mid-reconcile: must wait for the first to finish
    assert len(queue) == 0
    release.set()
    queue.wait_done(2)
    assert calls == ["k", "k"]
    assert overlaps == []


def test_active_workers_and_max_concurrency_gauges(name: str, stop_after: list[Controller]) -> None:
    release = threading.Event()
    entered = threading.Event()

    def reconcile(key: str) -> Result:
        entered.set()
        release.wait(WAIT)
        return Result()

    controller, queue = make(name, reconcile, stop_after, workers=3)
    assert sample("controller_runtime_max_concurrent_reconciles", controller=name) == 3
    controller.enqueue("k")
    controller.start()
    assert entered.wait(WAIT)
    assert sample("controller_runtime_active_workers", controller=name) == 1
    release.set()
    queue.wait_done(1)
    assert sample("controller_runtime_active_workers", controller=name) == 0


def test_start_is_idempotent_and_threads_are_named(name: str, stop_after: list[Controller]) -> None:
    controller, _ = make(name, lambda key: Result(), stop_after, workers=2)
    assert not controller.started
    controller.start()
    controller.start()
    assert controller.started
    workers = [t.name for t in threading.enumerate() if t.name.startswith(f"{name}-worker-")]
    assert sorted(workers) == [f"{name}-worker-0", f"{name}-worker-1"]


def test_stop_drains_the_reconcile_in_flight(name: str, stop_after: list[Controller]) -> None:
    release = threading.Event()
    entered = threading.Event()
    finished: list[str] = []

    def reconcile(key: str) -> Result:
        entered.set()
        release.wait(WAIT)
        finished.append(key)
        return Result()

    controller, _ = make(name, reconcile, stop_after)
    controller.enqueue("busy")
    controller.enqueue("queued")
    controller.start()
    assert entered.wait(WAIT)
    assert controller.stop(drain_timeout=0) is False  # still busy
    results: list[bool] = []
    stopper = threading.Thread(target=lambda: results.append(controller.stop(WAIT)))
    stopper.start()
    release.set()
    stopper.join(WAIT)
    assert results == [True]
    assert finished == ["busy"]  # finished before stop returned; "queued" never started
    assert not any(t.name.startswith(f"{name}-worker-") for t in threading.enumerate())


def test_stop_before_start_is_clean(name: str, stop_after: list[Controller]) -> None:
    controller, _ = make(name, lambda key: Result(), stop_after)
    assert controller.stop(drain_timeout=0) is True
    controller.start()  # a stopped controller does not come back
    assert not controller.started


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_workers_alive_turns_false_when_a_worker_dies(
    name: str, stop_after: list[Controller]
) -> None:
    def reconcile(key: str) -> Result:
        raise SystemExit  # not an Exception: the one way a worker thread can end

    controller, queue = make(name, reconcile, stop_after)
    assert controller.workers_alive()  # not started: nothing has died
    controller.enqueue("k")
    controller.start()
    queue.wait_done(1)
    for thread in threading.enumerate():
        if thread.name == f"{name}-worker-0":
            thread.join(WAIT)
    assert not controller.workers_alive()


def test_enqueue_after_delays_the_key(name: str, stop_after: list[Controller]) -> None:
    controller, queue = make(name, lambda key: Result(), stop_after)
    controller.enqueue_after("later", 5.0)
    assert queue.calls == [("add_after", "later", 5.0)]
    assert len(queue) == 0


def test_requeue_after_key_is_reconciled_again_when_due(
    name: str, stop_after: list[Controller]
) -> None:
    clock = FakeClock()
    queue = RecordingQueue(name, clock)
    calls: list[str] = []

    def reconcile(key: str) -> Result:
        calls.append(key)
        return Result(requeue_after=60.0) if len(calls) == 1 else Result()

    controller = Controller(name, reconcile, workers=1, queue=queue)
    stop_after.append(controller)
    controller.enqueue("k")
    controller.start()
    queue.wait_done(1)
    clock.now += 60.0
    queue.add("poke")  # any queue operation promotes keys that are due
    queue.wait_done(3)
    # "k" became due before "poke" was added, but an add() (an event) goes ahead of timed
    # requeues; the due requeue still runs right after.
    assert calls == ["k", "poke", "k"]


@pytest.mark.parametrize("delay", [0.0, -2.5])
def test_requeue_after_zero_or_less_is_a_requeue_never_a_success(
    name: str, stop_after: list[Controller], delay: float,
) -> None:
    # "Due 2.5 s ago" means poll now. controller-runtime reads a zero RequeueAfter as
    # unset and forgets the key; here None is unset, so the key must come back
    # (rate-limited, so a reconciler that keeps saying "now" backs off instead of spinning).
    clock = FakeClock()
    queue = RecordingQueue(name, clock)
    calls: list[str] = []

    def reconcile(key: str) -> Result:
        calls.append(key)
        return Result(requeue_after=delay) if len(calls) == 1 else Result()

    controller = Controller(name, reconcile, workers=1, queue=queue)
    stop_after.append(controller)
    controller.enqueue("k")
    controller.start()
    queue.wait_done(1)
    assert queue.calls[0] == ("add_rate_limited", "k", None)
    assert ("forget", "k", None) not in queue.calls
    assert sample("controller_runtime_reconcile_total", controller=name, result="success") == 0
    assert sample("controller_runtime_reconcile_total", controller=name, result="requeue") == 1
    clock.now += 1.0  # the rate limiter's first step (1 s in RecordingQueue)
    queue.add("poke")
    queue.wait_done(3)
    assert calls.count("k") == 2


@pytest.mark.parametrize("delay", [0.0, -1.0])
def test_a_reported_error_with_requeue_after_zero_or_less_is_rate_limited(
    name: str, stop_after: list[Controller], delay: float,
) -> None:
    queue = run_once(name, Result(error="boom", requeue_after=delay), stop_after)
    assert queue.calls[0] == ("add_rate_limited", "ns/obj", None)
    assert queue.num_requeues("ns/obj") == 1
