"""The manager starts things in order (servers, informers, sync, election, workers),
gates workers on leadership, drains before releasing the Lease, exits 1 when leadership
is lost or caches never sync, and its probes follow the state of its threads."""

from __future__ import annotations

import os
import signal
import socket
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator

import pytest
from structlog.testing import capture_logs

from himitsu_controller.runtime.controller import Controller, Result
from himitsu_controller.runtime.manager import WATCH_LIVENESS_TIMEOUT, Manager
from himitsu_controller.runtime.metrics import REGISTRY

WAIT = 10.0


class Journal:
    """What happened, in order, shared by the fakes; waitable."""

    def __init__(self) -> None:
        self.entries: list[str] = []
        self._cond = threading.Condition()

    def add(self, entry: str) -> None:
        with self._cond:
            self.entries.append(entry)
            self._cond.notify_all()

    def wait_for(self, entry: str) -> None:
        with self._cond:
            assert self._cond.wait_for(lambda: entry in self.entries, WAIT), self.entries

    def before(self, first: str, second: str) -> bool:
        return self.entries.index(first) < self.entries.index(second)


class FakeInformer:
    def __init__(self, name: str, journal: Journal, *, synced: bool = True) -> None:
        self.name = name
        self.synced = synced
        self.unhealthy = 0.0
        self.stalled = 0.0
        self.exit_early = False
        self._journal = journal

    def run(self, stop: threading.Event) -> None:
        self._journal.add(f"informer-run:{self.name}")
        if self.exit_early:
            self._journal.add(f"informer-exit:{self.name}")
            return
        stop.wait()
        self._journal.add(f"informer-stopped:{self.name}")

    def has_synced(self) -> bool:
        return self.synced

    def unhealthy_for(self) -> float:
        return self.unhealthy

    def stalled_for(self) -> float:
        return self.stalled


class FakeController:
    def __init__(self, name: str, journal: Journal) -> None:
        self.name = name
        self.started = False
        self.alive = True
        self._journal = journal

    def start(self) -> None:
        self.started = True
        self._journal.add(f"controller-start:{self.name}")

    def stop(self, drain_timeout: float = 30.0) -> bool:
        self._journal.add(f"controller-stop:{self.name}")
        return True

    def workers_alive(self) -> bool:
        return self.alive


class FakeElection:
    """A factory for the manager plus the elector it builds; the test grants or takes
    leadership, the manager's stop event makes it release."""

    def __init__(self, journal: Journal) -> None:
        self._journal = journal
        self._on_started: Callable[[], None] | None = None
        self._on_stopped: Callable[[], None] | None = None
        self._lost = False

    def __call__(
        self, on_started: Callable[[], None], on_stopped: Callable[[], None]
    ) -> FakeElection:
        self._on_started, self._on_stopped = on_started, on_stopped
        return self

    def run(self, stop: threading.Event) -> bool:
        self._journal.add("elector-run")
        stop.wait()
        if self._lost:
            return False
        self._journal.add("elector-release")
        assert self._on_stopped is not None
        self._on_stopped()
        return True

    def is_leader(self) -> bool:
        return not self._lost

    def grant(self) -> None:
        assert self._on_started is not None
        self._on_started()

    def lose(self) -> None:
        assert self._on_stopped is not None
        self._lost = True
        self._journal.add("elector-lost")
        self._on_stopped()


class Running:
    """A manager running on a background thread; always stopped at teardown."""

    def __init__(self, manager: Manager) -> None:
        self.manager = manager
        self.codes: list[int] = []
        self.thread = threading.Thread(target=lambda: self.codes.append(manager.run()))
        self.thread.start()

    def exit_code(self) -> int:
        self.thread.join(WAIT)
        assert self.codes, "manager did not return"
        return self.codes[0]


@pytest.fixture
def journal() -> Journal:
    return Journal()


@pytest.fixture
def start() -> Iterator[Callable[[Manager], Running]]:
    runs: list[Running] = []

    def starter(manager: Manager) -> Running:
        runs.append(Running(manager))
        return runs[-1]

    yield starter
    for run in runs:
        run.manager.request_stop()
        run.thread.join(WAIT)


def manager(**options: object) -> Manager:
    settings: dict[str, object] = {"metrics_bind_address": "0", "health_probe_bind_address": "0"}
    settings.update(options)
    return Manager(**settings)  # type: ignore[arg-type]


def probe(mgr: Manager, path: str) -> tuple[int, str]:
    url = f"http://127.0.0.1:{mgr.probe_port}{path}"
    try:
        with urllib.request.urlopen(url, timeout=10) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()


def eventually(condition: Callable[[], bool]) -> None:
    """Wait for a condition the manager reaches on its own schedule, with a deadline."""
    deadline = time.monotonic() + WAIT
    pause = threading.Event()
    while not condition():
        assert time.monotonic() < deadline, "condition not reached"
        pause.wait(0.01)


# -- order and leadership ---------------------------------------------------------------


def test_start_order_and_workers_gated_by_leadership(
    journal: Journal, start: Callable[[Manager], Running]
) -> None:
    informer = FakeInformer("things", journal, synced=False)
    ctrl = FakeController("ctrl", journal)
    election = FakeElection(journal)
    mgr = manager(leader_election=election)
    mgr.add_informer(informer)
    mgr.add_controller(ctrl)
    run = start(mgr)
    journal.wait_for("informer-run:things")
    assert "elector-run" not in journal.entries  # no campaign on an unsynced cache
    informer.synced = True
    journal.wait_for("elector-run")
    assert not ctrl.started  # standby: caches warm, workers idle
    election.grant()
    journal.wait_for("controller-start:ctrl")
    assert mgr.is_leading()
    mgr.request_stop()
    assert run.exit_code() == 0
    assert journal.before("controller-stop:ctrl", "elector-release")
    assert journal.before("elector-release", "informer-stopped:things")


def test_without_leader_election_workers_start_once_caches_sync(
    journal: Journal, start: Callable[[Manager], Running]
) -> None:
    informers = [FakeInformer("a", journal), FakeInformer("b", journal, synced=False)]
    ctrl = FakeController("ctrl", journal)
    mgr = manager()
    for informer in informers:
        mgr.add_informer(informer)
    mgr.add_controller(ctrl)
    run = start(mgr)
    journal.wait_for("informer-run:b")
    assert not ctrl.started
    informers[1].synced = True
    journal.wait_for("controller-start:ctrl")
    mgr.request_stop()
    assert run.exit_code() == 0
    assert journal.before("controller-stop:ctrl", "informer-stopped:a")


def test_lost_leadership_stops_workers_and_exits_1(
    journal: Journal, start: Callable[[Manager], Running]
) -> None:
    ctrl = FakeController("ctrl", journal)
    election = FakeElection(journal)
    mgr = manager(leader_election=election)
    mgr.add_controller(ctrl)
    run = start(mgr)
    journal.wait_for("elector-run")
    election.grant()
    journal.wait_for("controller-start:ctrl")
    with capture_logs() as logs:
        election.lose()
        assert run.exit_code() == 1
    assert journal.before("elector-lost", "controller-stop:ctrl")
    assert "elector-release" not in journal.entries
    assert any(entry.get("reason") == "leadership lost" for entry in logs)


def test_runnables_start_with_their_gate_and_see_stop(
    journal: Journal, start: Callable[[Manager], Running]
) -> None:
    def runnable(name: str) -> Callable[[threading.Event], None]:
        def loop(stop: threading.Event) -> None:
            journal.add(f"runnable-start:{name}")
            stop.wait()
            journal.add(f"runnable-stop:{name}")

        return loop

    election = FakeElection(journal)
    mgr = manager(leader_election=election)
    mgr.add_runnable("leader-loop", runnable("leader-loop"))
    mgr.add_runnable("any-loop", runnable("any-loop"), need_leader_election=False)
    run = start(mgr)
    journal.wait_for("elector-run")
    journal.wait_for("runnable-start:any-loop")
    assert "runnable-start:leader-loop" not in journal.entries
    election.grant()
    journal.wait_for("runnable-start:leader-loop")
    mgr.request_stop()
    assert run.exit_code() == 0
    assert journal.before("runnable-stop:leader-loop", "elector-release")


# -- failing to start -------------------------------------------------------------------


def test_cache_sync_timeout_exits_1_with_a_clear_log(journal: Journal) -> None:
    ctrl = FakeController("ctrl", journal)
    mgr = manager(cache_sync_timeout=0.0)
    mgr.add_informer(FakeInformer("slow", journal, synced=False))
    mgr.add_controller(ctrl)
    with capture_logs() as logs:
        assert mgr.run() == 1
    assert not ctrl.started
    timeouts = [e for e in logs if e["event"] == "timed out waiting for caches to sync"]
    assert timeouts[0]["informers"] == ["slow"]
    assert "informer-stopped:slow" in journal.entries


def test_informer_dying_before_sync_exits_1(journal: Journal) -> None:
    informer = FakeInformer("broken", journal, synced=False)
    informer.exit_early = True
    mgr = manager()
    mgr.add_informer(informer)
    assert mgr.run() == 1


def test_bind_failure_exits_1() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert manager(health_probe_bind_address=f"127.0.0.1:{port}").run() == 1


# -- stopping ---------------------------------------------------------------------------


def blocking_controller(journal: Journal, release: threading.Event) -> Controller:
    def reconcile(key: str) -> Result:
        journal.add(f"reconcile-start:{key}")
        release.wait(WAIT)
        journal.add(f"reconcile-done:{key}")
        return Result()

    return Controller("blocking", reconcile, workers=1)


def test_stop_drains_workers_before_releasing_the_lease(
    journal: Journal, start: Callable[[Manager], Running]
) -> None:
    release = threading.Event()
    ctrl = blocking_controller(journal, release)
    election = FakeElection(journal)
    mgr = manager(leader_election=election)
    mgr.add_controller(ctrl)
    run = start(mgr)
    journal.wait_for("elector-run")
    election.grant()
    ctrl.enqueue("ns/a")
    journal.wait_for("reconcile-start:ns/a")
    mgr.request_stop()
    eventually(ctrl.queue.shutting_down)  # the manager is now draining
    assert "elector-release" not in journal.entries
    release.set()
    assert run.exit_code() == 0
    assert journal.before("reconcile-done:ns/a", "elector-release")


def test_lost_leadership_exits_without_waiting_for_in_flight_reconciles(
    journal: Journal, start: Callable[[Manager], Running]
) -> None:
    # Another replica may lead soon after: a reconcile that finished now would write
    # next to it. The grace period is for requested stops only.
    release = threading.Event()
    ctrl = blocking_controller(journal, release)
    election = FakeElection(journal)
    mgr = manager(leader_election=election, graceful_shutdown_timeout=WAIT * 2)
    mgr.add_controller(ctrl)
    run = start(mgr)
    journal.wait_for("elector-run")
    election.grant()
    ctrl.enqueue("ns/slow")
    journal.wait_for("reconcile-start:ns/slow")
    try:
        election.lose()
        assert run.exit_code() == 1
        assert "reconcile-done:ns/slow" not in journal.entries
    finally:
        release.set()


def test_drain_past_the_grace_period_exits_1(
    journal: Journal, start: Callable[[Manager], Running]
) -> None:
    release = threading.Event()
    ctrl = blocking_controller(journal, release)
    mgr = manager(graceful_shutdown_timeout=0.0)
    mgr.add_controller(ctrl)
    run = start(mgr)
    ctrl.enqueue("ns/stuck")
    journal.wait_for("reconcile-start:ns/stuck")
    mgr.request_stop()
    try:
        assert run.exit_code() == 1
    finally:
        release.set()


def test_sigterm_stops_cleanly_and_restores_handlers(journal: Journal) -> None:
    previous = signal.getsignal(signal.SIGTERM)
    ctrl = FakeController("ctrl", journal)
    mgr = manager()
    mgr.add_controller(ctrl)

    def send_sigterm() -> None:
        journal.wait_for("controller-start:ctrl")
        os.kill(os.getpid(), signal.SIGTERM)

    killer = threading.Thread(target=send_sigterm)
    killer.start()
    assert mgr.run() == 0  # from the main thread: signal handlers installed
    killer.join(WAIT)
    assert "controller-stop:ctrl" in journal.entries
    assert signal.getsignal(signal.SIGTERM) is previous


# -- probes and metrics -----------------------------------------------------------------


def test_probes_follow_sync_watch_health_and_worker_liveness(
    journal: Journal, start: Callable[[Manager], Running]
) -> None:
    informer = FakeInformer("things", journal, synced=False)
    ctrl = FakeController("ctrl", journal)
    mgr = manager(health_probe_bind_address="127.0.0.1:0")
    mgr.add_informer(informer)
    mgr.add_controller(ctrl)
    mgr.add_readyz_check("custom", lambda: None)
    start(mgr)
    journal.wait_for("informer-run:things")
    status, body = probe(mgr, "/readyz")
    assert status == 500
    assert "[-]caches-synced failed: waiting for caches: things" in body
    assert probe(mgr, "/healthz") == (200, "ok")  # alive while caches fill
    informer.synced = True
    journal.wait_for("controller-start:ctrl")
    assert probe(mgr, "/readyz") == (200, "ok")
    informer.unhealthy = 31.0
    status, body = probe(mgr, "/readyz")
    assert status == 500
    assert "things (31s)" in body
    informer.unhealthy = 29.0
    assert probe(mgr, "/readyz") == (200, "ok")
    ctrl.alive = False
    status, body = probe(mgr, "/healthz")
    assert status == 500
    assert "[-]workers failed: dead worker threads in: ctrl" in body


def test_an_added_informers_failing_watch_is_a_metric(journal: Journal) -> None:
    """informer_watch_failing_seconds{name}: what /readyz checks, for an alert, read at
    scrape time from each informer the manager was given."""
    informer = FakeInformer(f"watched-{id(journal)}", journal)
    manager().add_informer(informer)

    def seconds() -> float | None:
        return REGISTRY.get_sample_value("informer_watch_failing_seconds",
                                         {"name": informer.name})

    assert seconds() == 0.0
    informer.unhealthy = 42.0
    assert seconds() == 42.0


def test_process_cpu_and_memory_are_exported() -> None:
    assert (REGISTRY.get_sample_value("process_resident_memory_bytes") or 0) > 0
    assert REGISTRY.get_sample_value("process_cpu_seconds_total") is not None


def test_healthz_fails_once_the_apiserver_answers_without_a_working_watch_for_minutes(
    journal: Journal, start: Callable[[Manager], Running]
) -> None:
    informer = FakeInformer("things", journal)
    mgr = manager(health_probe_bind_address="127.0.0.1:0")
    mgr.add_informer(informer)
    start(mgr)
    journal.wait_for("informer-run:things")
    informer.unhealthy = informer.stalled = WATCH_LIVENESS_TIMEOUT - 1  # unready, not dead
    assert probe(mgr, "/readyz")[0] == 500
    assert probe(mgr, "/healthz") == (200, "ok")
    informer.unhealthy = informer.stalled = WATCH_LIVENESS_TIMEOUT + 1
    status, body = probe(mgr, "/healthz")
    assert status == 500
    seconds = f"{WATCH_LIVENESS_TIMEOUT + 1:.0f}s"
    assert f"[-]watches failed: apiserver answers but no watch works: things ({seconds})" in body
    informer.unhealthy = informer.stalled = 0.0  # a watch works again
    assert probe(mgr, "/healthz") == (200, "ok")


def test_an_unreachable_apiserver_makes_replicas_unready_but_never_restarts_them(
    journal: Journal, start: Callable[[Manager], Running]
) -> None:
    # The apiserver has refused connections for an hour (a control-plane outage): the
    # cache is stale (unready), but a restart cannot fix that; it would restart every
    # replica and then crash-loop on the way up.
    informer = FakeInformer("things", journal)
    mgr = manager(health_probe_bind_address="127.0.0.1:0")
    mgr.add_informer(informer)
    start(mgr)
    journal.wait_for("informer-run:things")
    informer.unhealthy, informer.stalled = 3600.0, 0.0
    assert probe(mgr, "/readyz")[0] == 500
    assert probe(mgr, "/healthz") == (200, "ok")


def test_watch_liveness_timeout_is_configurable_and_0_disables_it(
    journal: Journal, start: Callable[[Manager], Running]
) -> None:
    short, off = FakeInformer("short", journal), FakeInformer("off", journal)
    short.stalled = off.stalled = 61.0
    mgr_short = manager(health_probe_bind_address="127.0.0.1:0", watch_liveness_timeout=60.0)
    mgr_off = manager(health_probe_bind_address="127.0.0.1:0", watch_liveness_timeout=0.0)
    mgr_short.add_informer(short)
    mgr_off.add_informer(off)
    start(mgr_short)
    start(mgr_off)
    journal.wait_for("informer-run:short")
    journal.wait_for("informer-run:off")
    assert probe(mgr_short, "/healthz")[0] == 500
    assert probe(mgr_off, "/healthz") == (200, "ok")


def test_healthz_fails_when_an_informer_thread_dies(
    journal: Journal, start: Callable[[Manager], Running]
) -> None:
    informer = FakeInformer("things", journal)
    informer.exit_early = True
    mgr = manager(health_probe_bind_address="127.0.0.1:0", cache_sync_timeout=WAIT)
    mgr.add_informer(informer)
    start(mgr)
    journal.wait_for("informer-exit:things")
    eventually(lambda: probe(mgr, "/healthz")[0] == 500)
    assert "informer threads stopped: things" in probe(mgr, "/healthz")[1]


def test_metrics_served_while_running(
    journal: Journal, start: Callable[[Manager], Running]
) -> None:
    mgr = manager(metrics_bind_address="127.0.0.1:0")
    mgr.add_informer(FakeInformer("things", journal))
    start(mgr)
    journal.wait_for("informer-run:things")
    url = f"http://127.0.0.1:{mgr.metrics_port}/metrics"
    with urllib.request.urlopen(url, timeout=10) as resp:
        assert b"# TYPE workqueue_depth gauge" in resp.read()


def test_duplicate_names_are_refused(journal: Journal) -> None:
    mgr = manager()
    mgr.add_informer(FakeInformer("x", journal))
    with pytest.raises(ValueError, match="already added"):
        mgr.add_informer(FakeInformer("x", journal))
