"""Shutdown fits the Deployment's grace period: one budget, every step bounded, in order.

Order: workers drain, Events are flushed, the Lease is released, informers stop. Each
step gets its share of ``graceful_shutdown_timeout``; a part that is stuck (a reconcile
that never returns, an informer deaf to its stop, a release that hangs, an Event POST
that hangs) uses up its share and no more, and the shutdown goes on without it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import yaml

from himitsu_controller import cli
from himitsu_controller.runtime.controller import Controller, Result
from himitsu_controller.runtime.manager import Manager
from himitsu_controller.runtime.shutdown import Budget

WAIT = 10.0
MANIFEST = Path(__file__).resolve().parents[3] / "deploy" / "manager" / "manager.yaml"
# What the kubelet's SIGKILL must never cut short: time for the signal to arrive and for
# the interpreter to exit after the manager returns.
GRACE_MARGIN = 5.0
STEPS = ["workers", "events", "lease", "informers"]


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_the_budget_never_hands_out_more_than_its_total() -> None:
    clock = Clock()
    budget = Budget(30.0, clock=clock)

    def stuck(seconds: float) -> bool:
        clock.now += seconds  # uses all it was given, then gives up
        return False

    budget.run("workers", stuck, keep=7.0)
    for name, cap in (("events", 2.0), ("lease", 3.0), ("informers", 2.0)):
        budget.run(name, stuck, cap=cap)
    assert [(s.name, s.allowed, s.finished) for s in budget.steps] == [
        ("workers", 23.0, False), ("events", 2.0, False), ("lease", 3.0, False),
        ("informers", 2.0, False)]
    assert budget.allowed == clock.now == 30.0
    assert budget.run("late", stuck, cap=5.0) is False
    assert budget.steps[-1].allowed == 0.0  # nothing is left past the total


class Blocker:
    """Everything a stuck part waits on; released at teardown."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.journal: list[str] = []
        self._lock = threading.Condition()

    def note(self, entry: str) -> None:
        with self._lock:
            self.journal.append(entry)
            self._lock.notify_all()

    def wait_for(self, condition: Callable[[], bool]) -> bool:
        with self._lock:
            return self._lock.wait_for(condition, WAIT)


class DeafInformer:
    """Synced at once; ignores its stop until released (stuck in a LIST, say)."""

    name = "deaf"

    def __init__(self, blocker: Blocker) -> None:
        self._blocker = blocker

    def run(self, stop: threading.Event) -> None:
        stop.wait()
        self._blocker.note("informer-stop-asked")
        self._blocker.release.wait()

    def has_synced(self) -> bool:
        return True

    def unhealthy_for(self) -> float:
        return 0.0

    def stalled_for(self) -> float:
        return 0.0


class HangingRelease:
    """A leader whose release request hangs."""

    def __init__(self, blocker: Blocker) -> None:
        self._blocker = blocker
        self.leading = threading.Event()
        self._on_started: Callable[[], None] | None = None

    def __call__(self, on_started: Callable[[], None],
                 on_stopped: Callable[[], None]) -> HangingRelease:
        self._on_started = on_started
        return self

    def run(self, stop: threading.Event) -> bool:
        assert self._on_started is not None
        self._on_started()
        self.leading.set()
        stop.wait()
        self._blocker.note("release-asked")
        self._blocker.release.wait()
        return True

    def is_leader(self) -> bool:
        return self.leading.is_set()


class HangingEvents:
    """An Event recorder whose POST hangs: its stop waits its timeout, then gives up."""

    def __init__(self, blocker: Blocker) -> None:
        self._blocker = blocker
        self.given: list[float] = []

    def start(self) -> None:
        self._blocker.note("events-started")

    def stop(self, timeout: float = 2.0) -> bool:
        self.given.append(timeout)
        self._blocker.note("events-flush-asked")
        return self._blocker.release.wait(timeout)


@pytest.fixture
def blocker() -> Iterator[Blocker]:
    found = Blocker()
    yield found
    found.release.set()


def test_stuck_parts_cannot_stretch_shutdown_past_its_budget(blocker: Blocker) -> None:
    started = threading.Event()

    def reconcile(key: str) -> Result:
        started.set()
        blocker.release.wait()  # never returns while the test runs
        return Result()

    ctrl = Controller("stuck", reconcile, workers=1)
    election = HangingRelease(blocker)
    events = HangingEvents(blocker)
    mgr = Manager(metrics_bind_address="0", health_probe_bind_address="0",
                  leader_election=election, graceful_shutdown_timeout=1.0, events=events)
    mgr.add_informer(DeafInformer(blocker))
    mgr.add_controller(ctrl)
    codes: list[int] = []
    runner = threading.Thread(target=lambda: codes.append(mgr.run()), daemon=True)
    runner.start()
    assert election.leading.wait(WAIT)
    ctrl.enqueue("ns/a")
    assert started.wait(WAIT)
    mgr.request_stop()
    runner.join(WAIT)
    assert codes == [1]  # the drain did not finish: said so in the exit code
    steps = mgr.shutdown_steps
    assert [s.name for s in steps] == STEPS
    assert not any(s.finished for s in steps)  # every part was stuck, and left behind
    assert sum(s.allowed for s in steps) <= 1.0
    assert events.given == [steps[1].allowed]
    # Every part was asked to stop (each notes it on its own thread, maybe a moment
    # after the manager moved on without it).
    asked = ["events-flush-asked", "events-started", "informer-stop-asked", "release-asked"]
    assert blocker.wait_for(lambda: sorted(blocker.journal) == asked), blocker.journal


def test_a_clean_shutdown_flushes_events_before_it_releases_the_lease(
        blocker: Blocker) -> None:
    blocker.release.set()  # nothing is stuck
    election = HangingRelease(blocker)
    events = HangingEvents(blocker)
    mgr = Manager(metrics_bind_address="0", health_probe_bind_address="0",
                  leader_election=election, events=events)
    mgr.add_informer(DeafInformer(blocker))
    codes: list[int] = []
    runner = threading.Thread(target=lambda: codes.append(mgr.run()), daemon=True)
    runner.start()
    assert election.leading.wait(WAIT)
    mgr.request_stop()
    runner.join(WAIT)
    assert codes == [0]
    assert [(s.name, s.finished) for s in mgr.shutdown_steps] == [(n, True) for n in STEPS]
    assert blocker.journal.index("events-flush-asked") < blocker.journal.index(
        "release-asked")


def test_the_default_shutdown_fits_the_deployments_grace_period() -> None:
    documents = list(yaml.safe_load_all(MANIFEST.read_text()))
    (deployment,) = [d for d in documents if d and d.get("kind") == "Deployment"]
    grace = deployment["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
    args = cli.build_parser().parse_args([])
    bound = Manager(graceful_shutdown_timeout=args.graceful_shutdown_timeout,
                    metrics_bind_address="0", health_probe_bind_address="0").shutdown_bound()
    assert bound + GRACE_MARGIN <= grace, (
        f"a shutdown may take {bound} s; the kubelet kills the pod after {grace} s")
