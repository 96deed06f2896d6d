"""The work queue keeps client-go's promises: stingy, fair, never concurrent per key,
delays with "earliest wins", rate limiting math, and shutdown/drain; and its two lanes
let added (event-driven) keys go ahead of keys released by timers."""

from __future__ import annotations

import random
import sys
import threading
from collections.abc import Iterator

import pytest

from himitsu_controller.runtime import metrics
from himitsu_controller.runtime.workqueue import (
    BucketRateLimiter,
    ItemExponentialFailureRateLimiter,
    MaxOfRateLimiter,
    RateLimitingQueue,
    default_controller_rate_limiter,
)


class FakeClock:
    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def drain_ready(queue: RateLimitingQueue) -> list[str]:
    """Take (and finish) every key that is ready right now, in order."""
    taken: list[str] = []
    while True:
        key, shutdown = queue.get(timeout=0)
        if key is None or shutdown:
            return taken
        taken.append(key)
        queue.done(key)


def new_queue(clock: FakeClock | None = None) -> RateLimitingQueue:
    return RateLimitingQueue("test-wq", clock=clock or FakeClock())


# -- stingy, fair, per-key exclusive ------------------------------------------------


def test_a_queued_key_is_not_added_twice() -> None:
    queue = new_queue()
    for key in ["a", "b", "a", "a", "b"]:
        queue.add(key)
    assert len(queue) == 2
    assert drain_ready(queue) == ["a", "b"]


def test_keys_come_out_in_fifo_order() -> None:
    queue = new_queue()
    for key in ["c", "a", "d", "b"]:
        queue.add(key)
    assert drain_ready(queue) == ["c", "a", "d", "b"]


def test_get_times_out_with_none_when_empty() -> None:
    assert new_queue().get(timeout=0) == (None, False)


def test_readd_while_processing_is_deferred_to_done() -> None:
    queue = new_queue()
    queue.add("a")
    key, _ = queue.get(timeout=0)
    assert key == "a"
    queue.add("a")
    queue.add("a")
    # Not handed to a second worker while the first still holds it.
    assert len(queue) == 0
    assert queue.get(timeout=0) == (None, False)
    queue.done("a")
    assert len(queue) == 1
    assert drain_ready(queue) == ["a"]  # once, however many re-adds


def test_done_without_readd_does_not_requeue() -> None:
    queue = new_queue()
    queue.add("a")
    queue.get(timeout=0)
    queue.done("a")
    assert len(queue) == 0
    queue.done("a")  # a stray second done is harmless
    assert len(queue) == 0


def test_deferred_key_goes_behind_keys_added_before_done() -> None:
    queue = new_queue()
    queue.add("a")
    queue.get(timeout=0)
    queue.add("a")
    queue.add("b")
    queue.done("a")
    assert drain_ready(queue) == ["b", "a"]


def test_blocked_get_wakes_on_add_from_another_thread() -> None:
    queue = new_queue()
    got: list[tuple[str | None, bool]] = []
    waiter = threading.Thread(target=lambda: got.append(queue.get(timeout=10)))
    waiter.start()
    queue.add("x")
    waiter.join(10)
    assert got == [("x", False)]


# -- delays -----------------------------------------------------------------------------


def test_add_after_releases_keys_in_ready_time_order() -> None:
    clock = FakeClock()
    queue = new_queue(clock)
    queue.add_after("a", 5)
    queue.add_after("b", 2)
    queue.add_after("c", 10)
    clock.advance(1.9)
    assert drain_ready(queue) == []
    clock.advance(0.1)
    assert drain_ready(queue) == ["b"]
    clock.advance(20)
    assert drain_ready(queue) == ["a", "c"]


def test_add_after_earliest_ready_time_wins() -> None:
    clock = FakeClock()
    queue = new_queue(clock)
    queue.add_after("a", 10)
    queue.add_after("a", 2)  # earlier: replaces
    queue.add_after("a", 30)  # later: ignored
    clock.advance(2)
    assert drain_ready(queue) == ["a"]
    clock.advance(100)
    assert drain_ready(queue) == []  # the superseded entries never fire


def test_add_after_non_positive_delay_adds_now() -> None:
    queue = new_queue()
    queue.add_after("a", 0)
    queue.add_after("b", -1)
    assert drain_ready(queue) == ["a", "b"]


def test_delayed_key_already_queued_is_not_duplicated() -> None:
    clock = FakeClock()
    queue = new_queue(clock)
    queue.add("a")
    queue.add_after("a", 1)
    clock.advance(1)
    assert len(queue) == 1
    assert drain_ready(queue) == ["a"]


def test_timed_key_that_became_ready_earlier_goes_first() -> None:
    clock = FakeClock()
    queue = new_queue(clock)
    queue.add_after("late", 1)
    clock.advance(2)
    queue.add_after("now", 0)  # same (low) lane: FIFO by the time each became ready
    assert drain_ready(queue) == ["late", "now"]


def test_blocked_get_wakes_when_a_delayed_key_is_due() -> None:
    queue = RateLimitingQueue("test-wq-real-clock")
    queue.add_after("soon", 0.02)
    assert queue.get(timeout=10) == ("soon", False)


def test_earlier_add_after_rewakes_a_sleeping_get() -> None:
    queue = RateLimitingQueue("test-wq-real-clock")
    queue.add_after("far", 3600)
    got: list[tuple[str | None, bool]] = []
    waiter = threading.Thread(target=lambda: got.append(queue.get(timeout=10)))
    waiter.start()
    queue.add_after("near", 0.01)
    waiter.join(10)
    assert got == [("near", False)]


# -- lanes: add() goes ahead of timed keys ---------------------------------------------


def adds_total(name: str) -> float:
    value = metrics.REGISTRY.get_sample_value(
        "workqueue_adds_total", {"name": name, "controller": name}
    )
    assert value is not None
    return value


def test_added_keys_go_ahead_of_timed_keys() -> None:
    clock = FakeClock()
    queue = new_queue(clock)
    queue.add_after("poll-1", 1)
    queue.add_after("poll-2", 2)
    queue.add_after("retry", 0)  # ready at once, still the low lane
    clock.advance(5)
    queue.add("event-1")
    queue.add("event-2")
    assert drain_ready(queue) == ["event-1", "event-2", "retry", "poll-1", "poll-2"]


def test_rate_limited_keys_use_the_low_lane() -> None:
    clock = FakeClock()
    queue = RateLimitingQueue(
        "test-wq", rate_limiter=ItemExponentialFailureRateLimiter(1.0, 60.0), clock=clock
    )
    queue.add_rate_limited("failing")
    clock.advance(1)
    queue.add("event")
    assert drain_ready(queue) == ["event", "failing"]


def test_timed_keys_keep_time_order_behind_added_keys() -> None:
    clock = FakeClock()
    queue = new_queue(clock)
    queue.add_after("c", 3)
    queue.add_after("a", 1)
    queue.add_after("b", 2)
    queue.add("event-1")
    clock.advance(3)
    queue.add("event-2")
    assert drain_ready(queue) == ["event-1", "event-2", "a", "b", "c"]


def test_waiting_timed_key_that_is_added_moves_up_once() -> None:
    clock = FakeClock()
    queue = RateLimitingQueue("test-wq-promote", clock=clock)
    for key in ["a", "b", "c"]:
        queue.add_after(key, 1)
    clock.advance(1)
    assert len(queue) == 3  # releases the timed keys (counted as adds)
    adds_before = adds_total("test-wq-promote")
    queue.add("b")
    queue.add("b")
    assert len(queue) == 3
    assert adds_total("test-wq-promote") == adds_before  # a move is not a new add
    assert drain_ready(queue) == ["b", "a", "c"]  # "b" once, the others in order
    assert drain_ready(queue) == []


def test_stale_low_slot_of_a_moved_key_is_never_served() -> None:
    """A moved key's old low-lane slot must stay dead even after the key is taken and
    queued into the low lane again: it must come out in its new place, once."""
    clock = FakeClock()
    queue = new_queue(clock)
    queue.add_after("a", 1)
    queue.add_after("b", 2)
    clock.advance(1)
    queue.add("a")  # moves up, leaving a stale slot ahead of where "b" will go
    assert drain_ready(queue) == ["a"]
    clock.advance(1)  # "b" is ready now
    queue.add_after("a", 0)  # "a" queued in the low lane again, behind "b"
    assert len(queue) == 2
    assert drain_ready(queue) == ["b", "a"]


def test_readd_while_processing_keeps_the_best_lane() -> None:
    clock = FakeClock()
    queue = new_queue(clock)
    for first, second in [("add", "add_after"), ("add_after", "add")]:
        queue.add_after("busy", 0)
        assert queue.get(timeout=0) == ("busy", False)
        queue.add_after("poll", 0)
        for how in (first, second):
            if how == "add":
                queue.add("busy")
            else:
                queue.add_after("busy", 0)
        queue.done("busy")
        # The event-driven re-add wins whichever came first: "busy" skips the poll.
        assert drain_ready(queue) == ["busy", "poll"], (first, second)


def test_timed_readd_while_processing_stays_in_the_low_lane() -> None:
    queue = new_queue()
    queue.add("busy")
    assert queue.get(timeout=0) == ("busy", False)
    queue.add_after("busy", 0)
    queue.add_after("poll", 0)
    queue.done("busy")
    queue.add("event")
    assert drain_ready(queue) == ["event", "poll", "busy"]


def test_many_moves_of_starved_timed_keys_keep_memory_bounded() -> None:
    """Events keep moving timed keys up while the low lane is never reached: the stale
    slots left behind must be reclaimed, not pile up with every move."""
    queue = new_queue()
    keys = [f"ns/key-{i}" for i in range(100)]
    for _ in range(20):
        for key in keys:
            queue.add_after(key, 0)
        for key in keys:
            queue.add(key)
        assert drain_ready(queue) == keys
    # White-box: the low lane's backing deque (live plus stale slots) stays small.
    assert len(queue._lanes[1]) <= 2 * len(keys) + 64
    queue.add_after("last", 0)
    assert drain_ready(queue) == ["last"]


def test_moves_interleaved_with_reclaiming_keep_every_live_key() -> None:
    queue = new_queue()
    keys = [f"ns/key-{i:03}" for i in range(300)]
    for key in keys:
        queue.add_after(key, 0)
    moved = keys[::2] + keys[1:200:2]  # 250 moves: enough to reclaim stale slots
    for key in moved:
        queue.add(key)
    left = [key for key in keys if key not in set(moved)]
    assert len(queue) == len(keys)
    assert drain_ready(queue) == moved + left


# -- rate limiters ----------------------------------------------------------------------


def test_exponential_limiter_doubles_per_failure_and_caps() -> None:
    limiter = ItemExponentialFailureRateLimiter(0.005, 0.04)
    assert [limiter.when("a") for _ in range(6)] == [0.005, 0.01, 0.02, 0.04, 0.04, 0.04]
    assert limiter.num_requeues("a") == 6
    assert limiter.when("b") == 0.005  # per key
    limiter.forget("a")
    assert limiter.num_requeues("a") == 0
    assert limiter.when("a") == 0.005


def test_exponential_limiter_survives_endless_failures() -> None:
    limiter = ItemExponentialFailureRateLimiter(0.005, 1000.0)
    delays = [limiter.when("a") for _ in range(3000)]
    assert delays[-1] == 1000.0
    assert max(delays) == 1000.0


def test_bucket_limiter_allows_a_burst_then_spaces_reservations() -> None:
    clock = FakeClock()
    limiter = BucketRateLimiter(qps=2.0, burst=3, clock=clock)
    assert [limiter.when(str(i)) for i in range(3)] == [0.0, 0.0, 0.0]
    assert limiter.when("x") == pytest.approx(0.5)
    assert limiter.when("y") == pytest.approx(1.0)  # reservations queue up
    clock.advance(1.0)  # refills two tokens: balance -2 -> 0, then reserve one
    assert limiter.when("z") == pytest.approx(0.5)
    clock.advance(3600)  # refill is capped at the burst
    assert [limiter.when(str(i)) for i in range(4)][-1] == pytest.approx(0.5)
    assert limiter.num_requeues("x") == 0


def test_max_of_limiter_takes_the_longest_delay_and_forgets_everywhere() -> None:
    clock = FakeClock()
    limiter = MaxOfRateLimiter(
        ItemExponentialFailureRateLimiter(1.0, 100.0),
        BucketRateLimiter(qps=1.0, burst=1, clock=clock),
    )
    assert limiter.when("a") == 1.0  # exponential 1.0, bucket 0
    assert limiter.when("b") == 1.0  # exponential 1.0, bucket 1.0
    assert limiter.when("a") == 2.0  # exponential 2.0, bucket 2.0
    assert limiter.when("c") == 3.0  # exponential 1.0, bucket 3.0
    assert limiter.num_requeues("a") == 2
    limiter.forget("a")
    assert limiter.num_requeues("a") == 0


def test_default_controller_rate_limiter_matches_client_go() -> None:
    clock = FakeClock()
    limiter = default_controller_rate_limiter(clock=clock)
    assert limiter.when("k") == 0.005
    assert limiter.when("k") == 0.01
    # 98 more distinct keys use up the burst of 100: the 10 qps bucket then dominates.
    delays = [limiter.when(f"other-{i}") for i in range(100)]
    assert delays[97] == 0.005
    assert delays[98] == pytest.approx(0.1)
    assert delays[99] == pytest.approx(0.2)


def test_add_rate_limited_delays_by_the_limiter_and_forget_resets() -> None:
    clock = FakeClock()
    queue = RateLimitingQueue(
        "test-wq", rate_limiter=ItemExponentialFailureRateLimiter(1.0, 60.0), clock=clock
    )
    queue.add_rate_limited("a")
    queue.add_rate_limited("a")  # second failure: 2 s, but the 1 s entry wins
    assert queue.num_requeues("a") == 2
    clock.advance(0.5)
    assert drain_ready(queue) == []
    clock.advance(0.5)
    assert drain_ready(queue) == ["a"]
    queue.forget("a")
    assert queue.num_requeues("a") == 0


# -- shutdown -----------------------------------------------------------------------------


def test_shut_down_releases_getters_and_refuses_new_keys() -> None:
    queue = new_queue()
    got: list[tuple[str | None, bool]] = []
    waiter = threading.Thread(target=lambda: got.append(queue.get()))
    waiter.start()
    queue.shut_down()
    waiter.join(10)
    assert got == [(None, True)]
    queue.add("a")
    queue.add_after("b", 0)
    queue.add_rate_limited("c")
    assert len(queue) == 0
    assert queue.shutting_down()
    assert queue.num_requeues("c") == 0


def test_shut_down_stops_handing_out_queued_keys() -> None:
    queue = new_queue()
    queue.add("a")
    queue.shut_down()
    assert queue.get(timeout=0) == (None, True)


def test_drain_waits_for_in_flight_keys() -> None:
    queue = new_queue()
    queue.add("busy")
    queue.add("queued")
    assert queue.get(timeout=0) == ("busy", False)
    assert queue.shut_down_with_drain(timeout=0) is False  # "busy" still in flight
    results: list[bool] = []
    drainer = threading.Thread(target=lambda: results.append(queue.shut_down_with_drain()))
    drainer.start()
    assert queue.get(timeout=0) == (None, True)  # "queued" is not started any more
    assert results == []
    queue.done("busy")
    drainer.join(10)
    assert results == [True]


def test_drain_with_nothing_in_flight_returns_at_once() -> None:
    queue = new_queue()
    queue.add("a")
    assert queue.shut_down_with_drain(timeout=0) is True


# -- concurrency ----------------------------------------------------------------------------


@pytest.fixture
def eager_thread_switching() -> Iterator[None]:
    """Switch threads far more often than every 5 ms, so workers get preempted mid-key
    and races the queue must prevent actually get a chance to happen."""
    previous = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)
    try:
        yield
    finally:
        sys.setswitchinterval(previous)


@pytest.mark.usefixtures("eager_thread_switching")
def test_stress_no_key_processed_twice_at_once_and_none_lost() -> None:
    """Producers bump a per-key version and add; workers record the version they saw.

    A worker reads the version after get() returned, as a reconciler reads the latest
    state; any add after that read must lead to another processing, so in the end
    every key's last seen version must equal its final version.
    """
    queue = RateLimitingQueue("test-wq-stress")
    keys = [f"ns/key-{i}" for i in range(40)]
    lock = threading.Condition()
    version = dict.fromkeys(keys, 0)
    seen = dict.fromkeys(keys, 0)
    in_flight: set[str] = set()
    violations: list[str] = []

    def produce(seed: int) -> None:
        rng = random.Random(seed)
        for _ in range(1000):
            key = rng.choice(keys)
            with lock:
                version[key] += 1
                if rng.random() < 0.1:
                    queue.add_after(key, rng.random() / 500)
                else:
                    queue.add(key)

    def work() -> None:
        while True:
            key, shutdown = queue.get()
            if shutdown:
                return
            assert key is not None
            with lock:
                if key in in_flight:
                    violations.append(key)
                in_flight.add(key)
                seen[key] = version[key]
            sum(range(random.randrange(200)))  # a little work, so re-adds land mid-flight
            with lock:
                in_flight.discard(key)
                lock.notify_all()
            queue.done(key)

    workers = [threading.Thread(target=work, name=f"w{i}") for i in range(4)]
    producers = [threading.Thread(target=produce, args=(i,)) for i in range(4)]
    for thread in workers + producers:
        thread.start()
    for thread in producers:
        thread.join(30)
    with lock:
        caught_up = lock.wait_for(lambda: seen == version, timeout=10)
    queue.shut_down()
    for thread in workers:
        thread.join(30)
    assert violations == []
    assert caught_up, {k: (seen[k], version[k]) for k in keys if seen[k] != version[k]}
