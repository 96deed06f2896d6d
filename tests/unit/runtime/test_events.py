"""Tests for runtime/events.py: Events are recorded without ever holding up the caller.

Against a fake RestClient the test can block, make fail, and read back, and an
injectable clock for the spam filter and the drop log: ``event()`` returns at once
while the sender is stuck, Events arrive in the order they were made, a full queue
drops (and says so, not too often), a hot object is capped at 25 Events then one per
five minutes, ``stop`` flushes within its timeout and gives up after it, failures are
retried only when a retry can help, and no log line ever carries an Event's message.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from structlog.testing import capture_logs

from himitsu_controller.runtime.client.errors import ApiError, TransportError, WriteRefused
from himitsu_controller.runtime.events import (
    DROP_LOG_INTERVAL,
    MAX_INSTANCE,
    MAX_MESSAGE,
    SPAM_BURST,
    SPAM_REFILL_SECONDS,
    EventRecorder,
)
from himitsu_controller.runtime.metrics import REGISTRY

TIMEOUT = 10.0
CANARY = "CANARY-event-message-7Qz"


class FakeRest:
    """Records POSTs; ``gate`` (open by default) holds the sender inside ``request``;
    ``failures`` are raised, in order, by the next calls."""

    def __init__(self) -> None:
        self.gate = threading.Event()
        self.gate.set()
        self.calls = 0
        self.sent: list[tuple[str, str, dict[str, Any]]] = []
        self.failures: list[BaseException] = []
        self._cond = threading.Condition()

    def request(self, method: str, path: str, *, body: Any = None,
                timeout: float = 30.0) -> dict[str, Any]:
        with self._cond:
            self.calls += 1
            self._cond.notify_all()
        assert self.gate.wait(TIMEOUT), "the test never opened the gate"
        with self._cond:
            failure = self.failures.pop(0) if self.failures else None
            if failure is None:
                self.sent.append((method, path, body))
            self._cond.notify_all()
        if failure is not None:
            raise failure
        return {}

    def wait_calls(self, n: int) -> None:
        with self._cond:
            assert self._cond.wait_for(lambda: self.calls >= n, TIMEOUT), self.calls

    def reasons(self) -> list[str]:
        with self._cond:
            return [body["reason"] for _, _, body in self.sent]


class Clock:
    def __init__(self) -> None:
        self.now = 5000.0

    def __call__(self) -> float:
        return self.now


def wait_for(predicate: Callable[[], bool], what: str) -> None:
    """Poll ``predicate`` until it holds, failing after TIMEOUT (never a paced sleep)."""
    deadline = time.monotonic() + TIMEOUT
    pause = threading.Event()
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        pause.wait(0.002)


def obj(name: str = "app", *, namespace: str = "apps", uid: str | None = None) -> dict[str, Any]:
    return {"apiVersion": "example.io/v1", "kind": "Widget",
            "metadata": {"namespace": namespace, "name": name, "uid": uid or f"uid-{name}",
                         "resourceVersion": "7"}}


@pytest.fixture
def rest() -> FakeRest:
    return FakeRest()


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def recorders() -> Iterator[list[EventRecorder]]:
    made: list[EventRecorder] = []
    yield made
    for recorder in made:
        recorder.stop(TIMEOUT)


def recorder_for(rest: FakeRest, clock: Clock, made: list[EventRecorder],
                 **options: Any) -> EventRecorder:
    options.setdefault("retry_delay", 0.0)
    recorder = EventRecorder(rest, component="widget-operator",
                             reporting_controller="example.io/widget-operator",
                             instance="pod-1", clock=clock, **options)
    made.append(recorder)
    return recorder


def emit(recorder: EventRecorder, reason: str, target: dict[str, Any] | None = None,
         message: str = "something happened") -> None:
    recorder.event(target or obj(), type="Normal", reason=reason, message=message)


def emit_in_thread(recorder: EventRecorder, reasons: list[str]) -> None:
    """``event()`` calls from another thread, which must all return while the sender is
    stuck: a blocking ``event()`` fails this check instead of hanging the test."""
    def call() -> None:
        for reason in reasons:
            emit(recorder, reason)

    caller = threading.Thread(target=call, daemon=True)
    caller.start()
    caller.join(TIMEOUT)
    assert not caller.is_alive(), "event() blocked while the sender was stuck"


# --- never blocking, ordering, the body ---------------------------------------------------


def test_event_returns_at_once_while_the_sender_is_blocked(
    rest: FakeRest, clock: Clock, recorders: list[EventRecorder],
) -> None:
    recorder = recorder_for(rest, clock, recorders)
    rest.gate.clear()
    recorder.start()
    emit(recorder, "First")
    rest.wait_calls(1)  # the sender is now stuck inside its POST
    emit_in_thread(recorder, ["Second", "Third"])
    assert recorder.pending == 2
    rest.gate.set()
    wait_for(lambda: recorder.counts["sent"] == 3, "three Events sent")
    assert rest.reasons() == ["First", "Second", "Third"]


def test_events_are_sent_in_the_order_they_were_made(
    rest: FakeRest, clock: Clock, recorders: list[EventRecorder],
) -> None:
    recorder = recorder_for(rest, clock, recorders)
    reasons = [f"Reason{i}" for i in range(40)]
    for i, reason in enumerate(reasons):
        emit(recorder, reason, obj(f"app-{i % 3}"))
    recorder.start()
    wait_for(lambda: recorder.counts["sent"] == 40, "forty Events sent")
    assert rest.reasons() == reasons


def test_the_event_body(rest: FakeRest, clock: Clock, recorders: list[EventRecorder]) -> None:
    recorder = EventRecorder(rest, component="widget-operator",
                             reporting_controller="example.io/widget-operator",
                             instance="i" * 300, clock=clock)
    recorders.append(recorder)
    recorder.event(obj("app", uid="u-9"), type="Warning", reason="Broken", message="m" * 5000)
    recorder.event({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "node-1"}},
                   type="Normal", reason="Seen", message="cluster-scoped")
    recorder.start()
    wait_for(lambda: recorder.counts["sent"] == 2, "two Events sent")
    (method, path, body), (_, node_path, node_body) = rest.sent
    assert (method, path) == ("POST", "/api/v1/namespaces/apps/events")
    assert body["metadata"] == {"generateName": "app.", "namespace": "apps"}
    assert body["involvedObject"] == {
        "apiVersion": "example.io/v1", "kind": "Widget", "namespace": "apps", "name": "app",
        "uid": "u-9", "resourceVersion": "7"}
    assert (body["type"], body["reason"]) == ("Warning", "Broken")
    assert body["message"] == "m" * MAX_MESSAGE
    assert body["source"] == {"component": "widget-operator"}
    assert body["reportingComponent"] == "example.io/widget-operator"
    assert body["reportingInstance"] == "i" * MAX_INSTANCE
    assert body["firstTimestamp"] == body["lastTimestamp"]
    assert body["firstTimestamp"].endswith("Z")
    assert body["count"] == 1
    # An Event about a cluster-scoped object lives in "default", as client-go puts it.
    assert node_path == "/api/v1/namespaces/default/events"
    assert node_body["involvedObject"]["namespace"] == ""


def test_event_never_raises_on_a_malformed_object(
    rest: FakeRest, clock: Clock, recorders: list[EventRecorder],
) -> None:
    recorder = recorder_for(rest, clock, recorders)
    with capture_logs() as logs:
        recorder.event({"metadata": "not a mapping"}, type="Normal", reason="Odd",
                       message=CANARY)
    assert recorder.pending == 0
    assert [entry["event"] for entry in logs] == ["event not recorded"]
    assert CANARY not in json.dumps(logs, default=str)


# --- a full queue -------------------------------------------------------------------------


def test_a_full_queue_drops_new_events_and_logs_at_most_once_a_minute(
    rest: FakeRest, clock: Clock, recorders: list[EventRecorder],
) -> None:
    recorder = recorder_for(rest, clock, recorders, queue_size=3)
    rest.gate.clear()
    recorder.start()
    emit(recorder, "InFlight")
    rest.wait_calls(1)
    with capture_logs() as logs:
        emit_in_thread(recorder, ["Q1", "Q2", "Q3", "Dropped1", "Dropped2"])
        clock.now += DROP_LOG_INTERVAL
        emit(recorder, "Dropped3")
    assert recorder.counts["dropped"] == 3
    drops = [entry for entry in logs if entry["event"].startswith("event queue full")]
    assert [(d["dropped"], d["dropped_total"]) for d in drops] == [(1, 1), (2, 3)]
    rest.gate.set()
    wait_for(lambda: recorder.counts["sent"] == 4, "the queued Events sent")
    assert rest.reasons() == ["InFlight", "Q1", "Q2", "Q3"]


# --- the spam filter ----------------------------------------------------------------------


def test_spam_filter_caps_a_hot_object_at_25_then_one_per_five_minutes(
    rest: FakeRest, clock: Clock, recorders: list[EventRecorder],
) -> None:
    recorder = recorder_for(rest, clock, recorders)  # not started: everything stays queued
    for _ in range(SPAM_BURST + 5):
        emit(recorder, "Flapping")
    assert (recorder.pending, recorder.counts["filtered"]) == (SPAM_BURST, 5)
    # The bucket is per (object, reason): other reasons and other objects are untouched.
    emit(recorder, "Other")
    emit(recorder, "Flapping", obj("neighbour"))
    assert recorder.pending == SPAM_BURST + 2
    clock.now += SPAM_REFILL_SECONDS - 1
    emit(recorder, "Flapping")
    assert recorder.counts["filtered"] == 6
    clock.now += 1
    emit(recorder, "Flapping")
    emit(recorder, "Flapping")
    assert (recorder.pending, recorder.counts["filtered"]) == (SPAM_BURST + 3, 7)
    # A long quiet spell refills the bucket to the burst, never beyond it.
    clock.now += SPAM_REFILL_SECONDS * SPAM_BURST * 10
    for _ in range(SPAM_BURST + 1):
        emit(recorder, "Flapping")
    assert (recorder.pending, recorder.counts["filtered"]) == (2 * SPAM_BURST + 3, 8)


def test_same_name_new_uid_is_a_new_object(
    rest: FakeRest, clock: Clock, recorders: list[EventRecorder],
) -> None:
    recorder = recorder_for(rest, clock, recorders)
    for _ in range(SPAM_BURST + 1):
        emit(recorder, "Flapping", obj("app", uid="first"))
    emit(recorder, "Flapping", obj("app", uid="recreated"))
    assert (recorder.pending, recorder.counts["filtered"]) == (SPAM_BURST + 1, 1)


# --- stopping -----------------------------------------------------------------------------


def test_stop_sends_what_is_queued_and_refuses_later_events(
    rest: FakeRest, clock: Clock, recorders: list[EventRecorder],
) -> None:
    recorder = recorder_for(rest, clock, recorders)
    rest.gate.clear()
    recorder.start()
    for i in range(5):
        emit(recorder, f"Reason{i}")
    rest.wait_calls(1)
    result: list[bool] = []
    stopper = threading.Thread(target=lambda: result.append(recorder.stop(TIMEOUT)))
    stopper.start()
    wait_for(lambda: recorder.closed, "stop() to begin")
    assert recorder.pending == 4  # stop began with four Events still queued
    rest.gate.set()
    stopper.join(TIMEOUT)
    assert result == [True]
    assert rest.reasons() == [f"Reason{i}" for i in range(5)]
    emit(recorder, "TooLate")
    assert (recorder.counts["dropped"], recorder.pending) == (1, 0)


def test_stop_gives_up_after_its_timeout(
    rest: FakeRest, clock: Clock, recorders: list[EventRecorder],
) -> None:
    recorder = recorder_for(rest, clock, recorders)
    rest.gate.clear()
    recorder.start()
    for reason in ("Stuck", "Queued1", "Queued2"):
        emit(recorder, reason)
    rest.wait_calls(1)
    with capture_logs() as logs:
        assert recorder.stop(0.01) is False
    assert recorder.counts["dropped"] == 2
    assert [e["abandoned"] for e in logs if e["event"] == "gave up sending events at shutdown"] \
        == [2]
    rest.gate.set()  # the in-flight POST ends; nothing after it is sent
    wait_for(lambda: recorder.counts["sent"] == 1, "the in-flight POST to finish")
    assert rest.reasons() == ["Stuck"]


def test_giving_up_cuts_a_retry_wait_short(
    rest: FakeRest, clock: Clock, recorders: list[EventRecorder],
) -> None:
    recorder = recorder_for(rest, clock, recorders, retry_delay=3600.0)
    rest.failures = [TransportError("connection refused")] * 3
    recorder.start()
    emit(recorder, "Unlucky")
    rest.wait_calls(1)
    assert recorder.stop(0.01) is False
    wait_for(lambda: recorder.counts["failed"] == 1, "the retry wait to end")
    assert rest.calls == 1


# --- failures -----------------------------------------------------------------------------


def test_a_refused_post_is_logged_once_and_dropped(
    rest: FakeRest, clock: Clock, recorders: list[EventRecorder],
) -> None:
    recorder = recorder_for(rest, clock, recorders)
    rest.failures = [ApiError(403, "Forbidden", "events is forbidden")]
    recorder.start()
    with capture_logs() as logs:
        emit(recorder, "Refused")
        emit(recorder, "Fine")
        wait_for(lambda: recorder.counts["sent"] == 1, "the next Event sent")
    assert rest.calls == 2  # a 403 is not retried
    assert recorder.counts["failed"] == 1
    (failure,) = [entry for entry in logs if entry["event"] == "event not recorded"]
    assert (failure["reason"], failure["status"], failure["attempts"]) == ("Refused", 403, 1)
    assert (failure["namespace"], failure["name"]) == ("apps", "app")
    assert rest.reasons() == ["Fine"]


def test_an_event_the_write_gate_refuses_is_dropped_without_retries(
    rest: FakeRest, clock: Clock, recorders: list[EventRecorder],
) -> None:
    # The replica no longer leads: waiting and trying again would only delay shutdown.
    recorder = recorder_for(rest, clock, recorders, max_attempts=3, retry_delay=3600.0)
    rest.failures = [WriteRefused("POST events: not sent, this replica is not leading")]
    recorder.start()
    emit(recorder, "Late")
    emit(recorder, "Next")
    wait_for(lambda: recorder.counts["sent"] == 1, "the next Event sent")
    assert (rest.calls, recorder.counts["failed"]) == (2, 1)


@pytest.mark.parametrize("transient", [
    TransportError("connection refused"), ApiError(503, "ServiceUnavailable", "busy"),
    ApiError(429, "TooManyRequests", "slow down"),
])
def test_transient_failures_are_retried_a_few_times_only(
    rest: FakeRest, clock: Clock, recorders: list[EventRecorder], transient: Exception,
) -> None:
    recorder = recorder_for(rest, clock, recorders, max_attempts=3)
    rest.failures = [transient] * 5
    recorder.start()
    emit(recorder, "GivenUp")
    wait_for(lambda: recorder.counts["failed"] == 1, "three attempts")
    assert rest.calls == 3
    emit(recorder, "Recovered")  # two failures left: retried through them
    wait_for(lambda: recorder.counts["sent"] == 1, "the retried Event sent")
    assert rest.calls == 6
    assert rest.reasons() == ["Recovered"]


def test_the_sender_survives_an_unexpected_exception(
    rest: FakeRest, clock: Clock, recorders: list[EventRecorder],
) -> None:
    recorder = recorder_for(rest, clock, recorders)
    rest.failures = [RuntimeError("a bug")]
    recorder.start()
    emit(recorder, "Boom")
    emit(recorder, "After")
    wait_for(lambda: recorder.counts["sent"] == 1, "the next Event sent")
    assert (recorder.counts["failed"], rest.reasons()) == (1, ["After"])


def test_canary_a_message_never_reaches_a_log_line(
    rest: FakeRest, clock: Clock, recorders: list[EventRecorder],
) -> None:
    recorder = recorder_for(rest, clock, recorders, max_attempts=2)
    # The apiserver's answer may quote what it refused; the exceptions carry it too.
    rest.failures = [
        ApiError(422, "Invalid", f"message: Invalid value: {CANARY!r}"),
        TransportError(f"POST /api/v1/namespaces/apps/events: {CANARY}"),
        TransportError(f"again {CANARY}"),
        RuntimeError(CANARY),
    ]
    with capture_logs() as logs:
        recorder.start()
        for reason in ("Invalid", "Unreachable", "Bug"):
            emit(recorder, reason, message=f"the message {CANARY}")
        wait_for(lambda: recorder.counts["failed"] == 3, "three failures")
        rest.gate.clear()  # the shutdown and drop lines too
        emit(recorder, "Stuck", message=CANARY)
        emit(recorder, "Queued", message=CANARY)
        rest.wait_calls(5)
        recorder.stop(0)
        emit(recorder, "Late", message=CANARY)
        rest.gate.set()
    failures = [entry for entry in logs if entry["event"] == "event not recorded"]
    assert [f["reason"] for f in failures] == ["Invalid", "Unreachable", "Bug"]
    assert CANARY not in json.dumps(logs, default=str)


def test_outcomes_are_counted_in_the_metrics_registry(
    rest: FakeRest, clock: Clock, recorders: list[EventRecorder],
) -> None:
    def sample(outcome: str) -> float:
        return REGISTRY.get_sample_value(
            "event_recorder_events_total", {"outcome": outcome}) or 0.0

    before = {o: sample(o) for o in ("sent", "filtered")}
    recorder = recorder_for(rest, clock, recorders)
    for _ in range(SPAM_BURST + 2):
        emit(recorder, "Flapping")
    recorder.start()
    wait_for(lambda: recorder.counts["sent"] == SPAM_BURST, "the allowed Events sent")
    assert sample("sent") - before["sent"] == SPAM_BURST
    assert sample("filtered") - before["filtered"] == 2
