"""The informer (reflector + store) against the fake apiserver's LIST and WATCH."""

from __future__ import annotations

import itertools
import queue
import socket
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from fake_apiserver import Canned, FakeApiServer, WatchSession, status_body, too_large_body
from structlog.testing import capture_logs

from himitsu_controller.runtime.cache.informer import Informer
from himitsu_controller.runtime.cache.store import Store, object_key
from himitsu_controller.runtime.client.rest import (
    ClientConfig,
    HttpClient,
    Resource,
    RestClient,
    new_api_client,
)

WIDGETS = Resource("example.io", "v1", "widgets")
TIMEOUT = 10.0

Event = tuple[str, str, str]  # (kind, key, resourceVersion)


def rv(obj: dict[str, Any]) -> str:
    return str(obj["metadata"]["resourceVersion"])


@dataclass
class Recorder:
    """Handler calls as (kind, key, resourceVersion), in order, waitable."""

    events: queue.Queue[Event] = field(default_factory=queue.Queue)

    def register(self, informer: Informer) -> None:
        informer.add_handler(
            on_add=lambda obj: self.events.put(("add", object_key(obj), rv(obj))),
            on_update=lambda old, new: self.events.put(("update", object_key(new), rv(new))),
            on_delete=lambda obj: self.events.put(("delete", object_key(obj), rv(obj))))

    def take(self, count: int) -> list[Event]:
        return [self.events.get(timeout=TIMEOUT) for _ in range(count)]

    def assert_quiet(self) -> None:
        assert self.events.empty(), list(self.events.queue)


@dataclass
class Running:
    informer: Informer
    recorder: Recorder
    stop: threading.Event
    thread: threading.Thread


@pytest.fixture
def start(api_client: HttpClient) -> Iterator[Callable[..., Running]]:
    started: list[Running] = []

    def _start(**options: Any) -> Running:
        options.setdefault("rng", lambda: 0.0)
        informer = Informer(RestClient(api_client), WIDGETS, namespace="ns", **options)
        recorder = Recorder()
        recorder.register(informer)
        stop = threading.Event()
        thread = threading.Thread(target=informer.run, args=(stop,), daemon=True)
        thread.start()
        running = Running(informer, recorder, stop, thread)
        started.append(running)
        return running

    yield _start
    for running in started:
        running.stop.set()
        running.thread.join(timeout=TIMEOUT)
        assert not running.thread.is_alive(), "informer did not stop"


def synced_watch(server: FakeApiServer, running: Running) -> WatchSession:
    session = server.next_watch()
    assert running.informer.wait_for_sync(TIMEOUT)
    return session


def test_initial_paginated_list_then_watch_from_its_resource_version(
        server: FakeApiServer, start: Callable[..., Running]) -> None:
    for name in "abcde":
        server.put(name)
    running = start(page_size=2)
    session = synced_watch(server, running)
    assert running.recorder.take(5) == [("add", f"ns/{n}", str(101 + i))
                                        for i, n in enumerate("abcde")]
    lists = server.requests_of("GET", watch=False)
    assert [r.query.get("continue") for r in lists] == [None, "2", "4"]
    assert {r.query["limit"] for r in lists} == {"2"}
    assert lists[0].path == "/apis/example.io/v1/namespaces/ns/widgets"
    assert session.query["resourceVersion"] == "105"
    assert session.query["allowWatchBookmarks"] == "true"
    assert 300 <= int(session.query["timeoutSeconds"]) < 600
    assert running.informer.has_synced()
    cached = running.informer.store.get("ns/c")
    assert cached is not None
    assert (cached["kind"], cached["apiVersion"]) == ("Widget", "example.io/v1")
    assert sorted(running.informer.store.keys()) == [f"ns/{n}" for n in "abcde"]


def test_add_update_delete_events_reach_store_and_handlers(
        server: FakeApiServer, start: Callable[..., Running]) -> None:
    running = start()
    session = synced_watch(server, running)
    session.send({"type": "ADDED", "object": server.put("a", data={"v": "1"})})
    session.send({"type": "MODIFIED", "object": server.put("a", data={"v": "2"})})
    session.send({"type": "DELETED", "object": server.remove("a")})
    assert running.recorder.take(3) == [("add", "ns/a", "101"), ("update", "ns/a", "102"),
                                        ("delete", "ns/a", "103")]
    assert running.informer.store.get("ns/a") is None
    assert running.informer.last_sync_resource_version == "103"


def test_update_with_an_unchanged_resource_version_is_skipped(
        server: FakeApiServer, start: Callable[..., Running]) -> None:
    server.put("a")
    running = start()
    session = synced_watch(server, running)
    assert running.recorder.take(1) == [("add", "ns/a", "101")]
    session.send({"type": "MODIFIED", "object": server.objects["ns/a"]})
    session.send({"type": "MODIFIED", "object": server.put("a", data={"v": "2"})})
    assert running.recorder.take(1) == [("update", "ns/a", "102")]


def test_clean_close_rewatches_from_the_last_resource_version_without_relisting(
        server: FakeApiServer, start: Callable[..., Running]) -> None:
    running = start()
    session = synced_watch(server, running)
    session.send({"type": "ADDED", "object": server.put("a")})
    session.close()
    rewatch = server.next_watch()
    assert rewatch.query["resourceVersion"] == "101"
    assert len(server.requests_of("GET", watch=False)) == 1
    assert running.recorder.take(1) == [("add", "ns/a", "101")]


def test_bookmarks_move_the_resource_version_without_events(
        server: FakeApiServer, start: Callable[..., Running]) -> None:
    running = start()
    session = synced_watch(server, running)
    session.send({"type": "BOOKMARK", "object": {"kind": "Widget", "apiVersion": "example.io/v1",
                                                 "metadata": {"resourceVersion": "500"}}})
    session.close()
    assert server.next_watch().query["resourceVersion"] == "500"
    running.recorder.assert_quiet()
    assert running.informer.store.keys() == []


def test_expired_watch_relists_and_synthesises_deletes(
        server: FakeApiServer, start: Callable[..., Running]) -> None:
    for name in "abc":
        server.put(name)
    now = [1000.0]
    running = start(clock=lambda: now[0])
    session = synced_watch(server, running)
    assert len(running.recorder.take(3)) == 3
    # A watch that has worked for a while (a bookmark, a minute) expires: relist at once.
    session.send({"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": "103"}}})
    assert wait_until(lambda: running.informer._delivered_since_list == 1)
    now[0] += 60
    # While the watch is behind, "a" vanishes, "b" changes, "d" appears, "c" stays.
    server.remove("a")
    server.put("b", data={"v": "2"})
    server.put("d")
    with capture_logs() as logs:
        session.send({"type": "ERROR", "object": status_body(410, "Expired", "too old")})
        rewatch = server.next_watch()
    # Said in the log, as for a refused watch: an operator sees why a relist happened.
    assert {"event": "resource version too old, relisting", "informer": "widgets",
            "log_level": "info"} in logs
    assert running.recorder.take(3) == [("update", "ns/b", "105"), ("add", "ns/d", "106"),
                                        ("delete", "ns/a", "101")]
    assert sorted(running.informer.store.keys()) == ["ns/b", "ns/c", "ns/d"]
    assert rewatch.query["resourceVersion"] == "106"
    assert len(server.requests_of("GET", watch=False)) == 2


def test_watch_refused_with_410_relists(server: FakeApiServer,
                                        start: Callable[..., Running]) -> None:
    now = [1000.0]
    waits: list[float] = []
    running = start(clock=lambda: now[0], sleep=lambda stop, seconds: waits.append(seconds))
    session = synced_watch(server, running)
    session.send({"type": "ADDED", "object": server.put("a")})
    assert running.recorder.take(1) == [("add", "ns/a", "101")]
    now[0] += 60
    server.canned.append(Canned(410, status_body(410, "Gone", "too old")))
    session.close()
    server.next_watch()
    lists = server.requests_of("GET", watch=False)
    assert len(lists) == 2
    assert waits == []  # the first 410 after a working watch relists at once
    running.recorder.assert_quiet()  # nothing changed: the relist announces nothing


def test_a_watch_that_keeps_expiring_relists_only_after_growing_backoffs(
        server: FakeApiServer, api_client: HttpClient) -> None:
    # Every watch is refused with 410 (e.g. a watch cache behind the version its LIST
    # answers with): client-go backs off each relist; no LIST loop.
    for name in "abc":
        server.put(name)
    server.watch_refusal = Canned(410, status_body(410, "Expired", "too old resource version"))
    stop = threading.Event()
    waits: list[tuple[float, int]] = []  # (backoff, LISTs sent before it)

    def sleep(_: threading.Event, seconds: float) -> None:
        waits.append((seconds, len(server.requests_of("GET", watch=False))))
        if len(waits) == 6:
            stop.set()

    informer = Informer(RestClient(api_client), WIDGETS, namespace="ns", rng=lambda: 0.0,
                        clock=lambda: 1000.0, sleep=sleep)
    thread = threading.Thread(target=informer.run, args=(stop,), daemon=True)
    thread.start()
    thread.join(TIMEOUT)
    assert not thread.is_alive()
    assert [lists for _, lists in waits] == [1, 2, 3, 4, 5, 6]  # one LIST per backoff
    assert len(server.requests_of("GET", watch=False)) == 6
    assert [seconds for seconds, _ in waits] == pytest.approx([0.8, 1.6, 3.2, 6.4, 12.8, 25.6])


def test_a_410_soon_after_a_relist_backs_off_even_after_events(
        server: FakeApiServer, start: Callable[..., Running]) -> None:
    waits: list[float] = []
    now = [1000.0]
    running = start(clock=lambda: now[0], sleep=lambda stop, seconds: waits.append(seconds))
    session = synced_watch(server, running)
    expired = {"type": "ERROR", "object": status_body(410, "Expired", "too old")}
    session.send({"type": "ADDED", "object": server.put("a")})
    session.send(expired)  # the first 410, after a watch that worked: at once
    session = server.next_watch()
    assert waits == []
    session.send({"type": "ADDED", "object": server.put("b")})
    assert running.recorder.take(2) == [("add", "ns/a", "101"), ("add", "ns/b", "102")]
    now[0] += 10  # under RELIST_AT_ONCE_AFTER since that relist: a repeat
    session.send(expired)
    server.next_watch()
    assert waits == [pytest.approx(0.8)]
    assert len(server.requests_of("GET", watch=False)) == 3


def test_expired_continue_token_restarts_the_list_in_one_page(
        server: FakeApiServer, start: Callable[..., Running]) -> None:
    for name in "abcde":
        server.put(name)
    server.expire_continue = 1
    running = start(page_size=2)
    synced_watch(server, running)
    assert sorted(running.informer.store.keys()) == [f"ns/{n}" for n in "abcde"]
    lists = server.requests_of("GET", watch=False)
    assert [(r.query.get("limit"), r.query.get("continue")) for r in lists] == [
        ("2", None), ("2", "2"), (None, None)]
    assert len(running.recorder.take(5)) == 5


# Where lists are served from (client-go's reflector resourceVersion rules).

def list_params(server: FakeApiServer) -> list[tuple[str | None, str | None, str | None]]:
    return [(r.query.get("resourceVersion"), r.query.get("limit"), r.query.get("continue"))
            for r in server.requests_of("GET", watch=False)]


def test_first_list_and_relists_are_served_from_the_watch_cache(
        server: FakeApiServer, start: Callable[..., Running]) -> None:
    server.watch_cache = True
    for name in "abcde":
        server.put(name)
    running = start(page_size=2)
    session = synced_watch(server, running)
    assert len(running.recorder.take(5)) == 5
    session.send({"type": "ADDED", "object": server.put("f")})
    server.remove("a")
    session.send({"type": "ERROR", "object": status_body(410, "Expired", "too old")})
    assert server.next_watch().query["resourceVersion"] == "107"
    assert running.recorder.take(2) == [("add", "ns/f", "106"), ("delete", "ns/a", "101")]
    # The first list: resourceVersion=0 (the server ignores its limit); the relist: the
    # last resourceVersion seen, unpaginated. Neither read every object from etcd.
    assert list_params(server) == [("0", "2", None), ("106", None, None)]
    assert server.list_sources == ["cache", "cache"]


def test_without_a_watch_cache_lists_keep_paginating(
        server: FakeApiServer, start: Callable[..., Running]) -> None:
    for name in "abcde":
        server.put(name)  # watch_cache is off: resourceVersion=0 comes back in pages
    running = start(page_size=2)
    session = synced_watch(server, running)
    session.send({"type": "ERROR", "object": status_body(410, "Expired", "too old")})
    server.next_watch()
    assert list_params(server) == [("0", "2", None), (None, "2", "2"), (None, "2", "4"),
                                   ("105", "2", None), (None, "2", "2"), (None, "2", "4")]


def test_relist_at_a_too_large_resource_version_lists_at_the_latest(
        server: FakeApiServer, start: Callable[..., Running]) -> None:
    server.watch_cache = True
    for name in "abc":
        server.put(name)
    running = start(page_size=2)
    session = synced_watch(server, running)
    assert len(running.recorder.take(3)) == 3
    # etcd restored from an older backup: "c" and the versions after 102 never happened.
    server.resource_version = 102
    server.objects.pop("ns/c")
    session.send({"type": "ERROR", "object": too_large_body(103, 102)})
    rewatch = server.next_watch()
    assert running.recorder.take(1) == [("delete", "ns/c", "103")]
    assert list_params(server)[1:] == [("103", None, None), (None, "2", None)]
    assert server.list_sources[1:] == ["etcd"]  # the 504 is answered before any read
    assert rewatch.query["resourceVersion"] == "102"


@pytest.mark.parametrize("status", [
    status_body(500, "InternalError", "etcd leader changed"),
    status_body(403, "Forbidden", "widgets is forbidden"),
    too_large_body(200, 100),
    {"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": 504,
     "reason": "Timeout", "message": "Too large resource version: 200, current: 100"},
], ids=["500", "403", "504-too-large", "504-too-large-before-1.18"])
def test_watch_error_events_relist_like_client_gos_reflector(
        server: FakeApiServer, start: Callable[..., Running], status: dict[str, Any]) -> None:
    server.put("a")
    running = start()
    session = synced_watch(server, running)
    running.recorder.take(1)
    server.put("a", data={"v": "2"})  # a change the broken watch never delivers
    session.send({"type": "ERROR", "object": status})
    server.next_watch()
    assert running.recorder.take(1) == [("update", "ns/a", "102")]
    assert len(server.requests_of("GET", watch=False)) == 2


def test_a_throttled_watch_backs_off_and_rewatches_without_relisting(
        server: FakeApiServer, start: Callable[..., Running]) -> None:
    running = start()
    session = synced_watch(server, running)
    session.send({"type": "ADDED", "object": server.put("a")})
    session.send({"type": "ERROR", "object": status_body(429, "TooManyRequests", "slow")})
    assert server.next_watch().query["resourceVersion"] == "101"
    assert len(server.requests_of("GET", watch=False)) == 1


@pytest.mark.parametrize("refusal", [
    Canned(504, status_body(504, "Timeout", "Too large resource version: 101, current: 100")),
    Canned(500, status_body(500, "InternalError", "etcd down")),
], ids=["504", "500"])
def test_a_watch_refused_with_an_error_relists(
        server: FakeApiServer, start: Callable[..., Running], refusal: Canned) -> None:
    running = start()
    session = synced_watch(server, running)
    session.send({"type": "ADDED", "object": server.put("a")})
    assert running.recorder.take(1) == [("add", "ns/a", "101")]
    server.canned.append(refusal)
    session.close()  # the rewatch is refused
    server.next_watch()
    assert len(server.requests_of("GET", watch=False)) == 2


class RefusedOnce(RestClient):
    """Once told to, the next watch meets a port where nothing listens (apiserver down)."""

    resume_refused = False
    refused = False

    def watch(self, path: str, **options: Any) -> Any:
        if self.resume_refused and not self.refused:
            self.refused = True
            with socket.socket() as probe:
                probe.bind(("127.0.0.1", 0))
                port = probe.getsockname()[1]
            down = new_api_client(ClientConfig(f"http://127.0.0.1:{port}"), pool_maxsize=1)
            return RestClient(down).watch(path)
        return super().watch(path, **options)


def test_a_refused_connection_backs_off_and_rewatches_without_relisting(
        server: FakeApiServer, api_client: HttpClient) -> None:
    rest = RefusedOnce(api_client)
    informer = Informer(rest, WIDGETS, namespace="ns", rng=lambda: 0.0)
    stop = threading.Event()
    thread = threading.Thread(target=informer.run, args=(stop,), daemon=True)
    thread.start()
    try:
        session = synced_watch(server, Running(informer, Recorder(), stop, thread))
        session.send({"type": "ADDED", "object": server.put("a")})
        assert wait_until(lambda: informer.last_sync_resource_version == "101")
        rest.resume_refused = True
        session.close()
        assert server.next_watch().query["resourceVersion"] == "101"
        assert rest.refused
        assert len(server.requests_of("GET", watch=False)) == 1
    finally:
        stop.set()
        thread.join(TIMEOUT)


def test_a_stream_of_garbage_relists(server: FakeApiServer,
                                     start: Callable[..., Running]) -> None:
    running = start()
    session = synced_watch(server, running)
    session.send({"type": "ADDED", "object": server.put("a")})
    session.send_raw(b"<html>proxy error</html>\n")
    server.next_watch()
    assert len(server.requests_of("GET", watch=False)) == 2


def test_a_very_short_watch_relists(server: FakeApiServer,
                                    start: Callable[..., Running]) -> None:
    running = start(clock=lambda: 1000.0)  # no time passes: every watch is "very short"
    session = synced_watch(server, running)
    session.close()
    server.next_watch()
    assert len(server.requests_of("GET", watch=False)) == 2


def test_unhealthy_while_lists_work_but_every_watch_fails(
        server: FakeApiServer, start: Callable[..., Running]) -> None:
    now = [1000.0]
    running = start(clock=lambda: now[0])
    failure = status_body(500, "InternalError", "watch broken")
    session = synced_watch(server, running)
    session.send({"type": "ERROR", "object": failure})
    assert wait_until(lambda: running.informer.unhealthy_for() == 0.0 and
                      len(server.requests_of("GET", watch=False)) == 2)
    now[0] = 1400.0
    # The relist succeeded, the next watch is accepted and fails at once again: still no
    # working watch since the first failure at 1000.
    server.next_watch().send({"type": "ERROR", "object": failure})
    assert wait_until(lambda: running.informer.unhealthy_for() == 400.0)
    session = server.next_watch()
    session.send({"type": "ADDED", "object": server.put("a")})  # this one works
    assert running.recorder.take(1) == [("add", "ns/a", "101")]
    assert running.informer.unhealthy_for() == 0.0


def closed_port_client() -> RestClient:
    """A client of an apiserver that is down: nothing listens on its port."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    return RestClient(new_api_client(ClientConfig(f"http://127.0.0.1:{port}"), pool_maxsize=1))


def test_an_unreachable_apiserver_is_unhealthy_but_never_stalled() -> None:
    # Refused connections for over five minutes: the cache is stale (unready), but a
    # restart cannot fix an apiserver that is down: liveness must not count it.
    now = [1000.0]
    stop = threading.Event()
    waits: list[float] = []

    def sleep(_: threading.Event, seconds: float) -> None:
        waits.append(seconds)
        now[0] += seconds
        if now[0] > 1000.0 + 400:
            stop.set()

    informer = Informer(closed_port_client(), WIDGETS, namespace="ns", rng=lambda: 0.0,
                        clock=lambda: now[0], sleep=sleep)
    informer.run(stop)
    assert informer.unhealthy_for() > 400
    assert informer.stalled_for() == 0.0


def test_lists_work_but_watches_are_refused_is_stalled(server: FakeApiServer,
                                                       api_client: HttpClient) -> None:
    # The apiserver answers (lists work) but refuses every watch with a status: a
    # restart may help (and is what is left), so this counts towards liveness.
    now = [1000.0]
    stop = threading.Event()

    def sleep(_: threading.Event, seconds: float) -> None:
        now[0] += seconds
        if now[0] > 1000.0 + 400:
            stop.set()

    server.watch_refusal = Canned(403, status_body(403, "Forbidden", "watch denied"))
    informer = Informer(RestClient(api_client), WIDGETS, namespace="ns", rng=lambda: 0.0,
                        clock=lambda: now[0], sleep=sleep)
    informer.run(stop)
    assert len(server.requests_of("GET", watch=False)) > 1  # the lists worked
    assert informer.stalled_for() == informer.unhealthy_for() > 400


def test_read_timeout_rewatches_from_the_last_resource_version(
        server: FakeApiServer, start: Callable[..., Running]) -> None:
    running = start(watch_read_timeout=0.3)
    session = synced_watch(server, running)
    session.send({"type": "ADDED", "object": server.put("a")})
    # ...then the connection goes silent (half-open): the client read timeout trips.
    rewatch = server.next_watch()
    assert rewatch.query["resourceVersion"] == "101"
    assert len(server.requests_of("GET", watch=False)) == 1


def test_stop_ends_run_promptly_while_a_watch_hangs(
        server: FakeApiServer, start: Callable[..., Running]) -> None:
    running = start(watch_read_timeout=300.0)
    synced_watch(server, running)  # the session never sends anything
    running.stop.set()
    running.thread.join(timeout=TIMEOUT)  # far below the read timeout
    assert not running.thread.is_alive()


def test_selectors_are_sent_on_list_and_watch(server: FakeApiServer,
                                              start: Callable[..., Running]) -> None:
    running = start(label_selector="himitsu.io/managed=true", field_selector="type=Opaque")
    session = synced_watch(server, running)
    (listing,) = server.requests_of("GET", watch=False)
    for query in (listing.query, session.query):
        assert query["labelSelector"] == "himitsu.io/managed=true"
        assert query["fieldSelector"] == "type=Opaque"


def test_a_failing_handler_does_not_stop_the_informer(
        server: FakeApiServer, start: Callable[..., Running]) -> None:
    running = start()

    def explode(obj: dict[str, Any]) -> None:
        raise RuntimeError("handler bug")

    running.informer.add_handler(on_add=explode)
    session = synced_watch(server, running)
    session.send({"type": "ADDED", "object": server.put("a")})
    session.send({"type": "ADDED", "object": server.put("b")})
    assert running.recorder.take(2) == [("add", "ns/a", "101"), ("add", "ns/b", "102")]
    assert running.thread.is_alive()


def test_a_late_handler_gets_the_cache_replayed(server: FakeApiServer,
                                                start: Callable[..., Running]) -> None:
    server.put("a")
    running = start()
    synced_watch(server, running)
    late = Recorder()
    late.register(running.informer)
    assert late.take(1) == [("add", "ns/a", "101")]


def wait_until(predicate: Callable[[], bool], timeout: float = TIMEOUT) -> bool:
    """Deadline polling, for state that has no event to wait on."""
    pause = threading.Event()
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            return False
        pause.wait(0.005)
    return True


def test_list_failure_backs_off_and_reports_unhealthy_until_it_recovers(
        server: FakeApiServer, start: Callable[..., Running]) -> None:
    ticks = itertools.count(start=1000)
    failure = Canned(500, status_body(500, "InternalError", "etcd down"))
    server.canned.extend([failure, failure])  # unhealthy for two backoffs (0.8 s + 1.6 s)
    running = start(clock=lambda: float(next(ticks)))
    assert wait_until(lambda: running.informer.unhealthy_for() > 0)
    assert not running.informer.has_synced()
    session = server.next_watch()  # a retry after the backoff succeeded
    assert session.query["resourceVersion"] == "100"
    assert running.informer.has_synced()
    assert wait_until(lambda: running.informer.unhealthy_for() == 0.0)  # the watch works
    assert len(server.requests_of("GET", watch=False)) == 3


def test_indexers_follow_adds_updates_and_deletes(server: FakeApiServer,
                                                  start: Callable[..., Running]) -> None:
    def by_colour(obj: dict[str, Any]) -> list[str]:
        return [str(obj["data"]["colour"])] if "colour" in obj["data"] else []

    server.put("a", data={"colour": "red"})
    running = start(indexers={"colour": by_colour})
    session = synced_watch(server, running)
    store = running.informer.store
    assert [object_key(o) for o in store.by_index("colour", "red")] == ["ns/a"]
    session.send({"type": "MODIFIED", "object": server.put("a", data={"colour": "blue"})})
    session.send({"type": "ADDED", "object": server.put("b", data={"colour": "blue"})})
    running.recorder.take(3)
    assert store.by_index("colour", "red") == []
    assert [object_key(o) for o in store.by_index("colour", "blue")] == ["ns/a", "ns/b"]
    session.send({"type": "DELETED", "object": server.remove("a")})
    running.recorder.take(1)
    assert [object_key(o) for o in store.by_index("colour", "blue")] == ["ns/b"]


# The store on its own.

def widget(name: str, version: str, **data: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": "ns", "resourceVersion": version},
            "data": dict(data)}


def test_store_replace_reports_the_diff() -> None:
    store = Store()
    store.upsert("ns/a", widget("a", "1"))
    store.upsert("ns/b", widget("b", "1"))
    store.upsert("ns/d", widget("d", "1"))
    changed, deleted = store.replace({"ns/b": widget("b", "2"), "ns/c": widget("c", "1"),
                                      "ns/d": widget("d", "1")})
    assert [(old and rv(old), object_key(new), rv(new)) for old, new in changed] == [
        ("1", "ns/b", "2"), (None, "ns/c", "1")]  # "d" is unchanged: not reported
    assert [object_key(o) for o in deleted] == ["ns/a"]
    assert sorted(store.keys()) == ["ns/b", "ns/c", "ns/d"]


def test_store_indexer_added_later_files_existing_objects() -> None:
    store = Store()
    store.upsert("ns/a", widget("a", "1", target="s1"))
    store.add_indexer("target", lambda o: [o["data"]["target"]])
    assert [object_key(o) for o in store.by_index("target", "s1")] == ["ns/a"]
    with pytest.raises(KeyError):
        store.by_index("missing", "x")


def test_store_survives_a_failing_index_function() -> None:
    store = Store({"target": lambda o: [o["data"]["target"]]})
    store.upsert("ns/a", widget("a", "1"))  # no "target": the index function raises
    assert store.get("ns/a") is not None
    assert store.by_index("target", "s1") == []


def test_object_key_for_cluster_scoped_objects() -> None:
    assert object_key({"metadata": {"name": "n1"}}) == "n1"
    assert object_key({"metadata": {"name": "a", "namespace": "ns"}}) == "ns/a"
