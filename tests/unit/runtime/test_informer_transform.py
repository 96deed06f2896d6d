"""Informer transforms: every object is reduced before the store or a handler sees it.

On every path an object can arrive by: the paginated first LIST, watch ADDED, MODIFIED
and DELETED, and a relist after an expired watch; managedFields always go, and a
BOOKMARK never reaches the store or the transform.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from fake_apiserver import FakeApiServer, WatchSession, status_body
from structlog.testing import capture_logs

from himitsu_controller.runtime.cache.informer import Informer
from himitsu_controller.runtime.cache.store import drop_managed_fields
from himitsu_controller.runtime.client.rest import HttpClient, Resource, RestClient

WIDGETS = Resource("example.io", "v1", "widgets")
TIMEOUT = 10.0
SECRET = "VALUE-THAT-MUST-NOT-BE-CACHED"
MANAGED_FIELDS = [{"manager": "kubectl", "operation": "Update", "fieldsType": "FieldsV1",
                   "fieldsV1": {"f:data": {"f:v": {}}}}]


def reduce(obj: dict[str, Any]) -> dict[str, Any]:
    """A transform as a Secret's: the data's keys only, never its values."""
    meta = obj["metadata"]
    return {"metadata": {k: meta[k] for k in ("name", "namespace", "resourceVersion")},
            "keys": sorted(obj.get("data") or {})}


class Seen:
    """What the transform was given, and what each handler got (transformed or not)."""

    def __init__(self) -> None:
        self.transformed: list[str] = []
        self.handled: list[tuple[str, dict[str, Any]]] = []
        self._lock = threading.Lock()

    def transform(self, obj: dict[str, Any]) -> dict[str, Any]:
        assert "managedFields" not in obj["metadata"]  # dropped before any transform
        with self._lock:
            self.transformed.append(obj["metadata"]["name"])
        return reduce(obj)

    def register(self, informer: Informer) -> None:
        informer.add_handler(
            on_add=lambda obj: self.handled.append(("add", obj)),
            on_update=lambda old, new: self.handled.extend([("old", old), ("update", new)]),
            on_delete=lambda obj: self.handled.append(("delete", obj)))


@pytest.fixture
def run(api_client: HttpClient) -> Iterator[Callable[..., tuple[Informer, Seen]]]:
    stops: list[tuple[threading.Event, threading.Thread]] = []

    def _run(**options: Any) -> tuple[Informer, Seen]:
        seen = Seen()
        options.setdefault("transform", seen.transform)
        informer = Informer(RestClient(api_client), WIDGETS, namespace="ns",
                            rng=lambda: 0.0, **options)
        seen.register(informer)
        stop = threading.Event()
        thread = threading.Thread(target=informer.run, args=(stop,), daemon=True)
        thread.start()
        stops.append((stop, thread))
        return informer, seen

    yield _run
    for stop, thread in stops:
        stop.set()
        thread.join(timeout=TIMEOUT)


def put(server: FakeApiServer, name: str, value: str = SECRET) -> dict[str, Any]:
    """An object with a value and managedFields, as the apiserver serves it."""
    obj = server.put(name, data={"v": value})
    server.objects[f"ns/{name}"]["metadata"]["managedFields"] = MANAGED_FIELDS
    obj["metadata"]["managedFields"] = MANAGED_FIELDS
    return obj


def assert_reduced(informer: Informer, seen: Seen) -> None:
    """No value and no managedFields in the store or in anything a handler got."""
    for obj in [*informer.store.list(), *(obj for _, obj in seen.handled)]:
        assert SECRET not in repr(obj)
        assert "managedFields" not in obj["metadata"]
        assert obj["keys"] == ["v"]


def wait_until(predicate: Callable[[], bool]) -> bool:
    done = threading.Event()
    for _ in range(int(TIMEOUT / 0.01)):
        if predicate():
            return True
        done.wait(0.01)
    return predicate()


def synced(server: FakeApiServer, informer: Informer) -> WatchSession:
    session = server.next_watch()
    assert informer.wait_for_sync(TIMEOUT)
    return session


def test_every_listed_object_is_transformed_page_by_page(
        server: FakeApiServer, run: Callable[..., tuple[Informer, Seen]]) -> None:
    for name in "abcde":
        put(server, name)
    informer, seen = run(page_size=2)
    synced(server, informer)
    assert sorted(seen.transformed) == list("abcde")
    assert sorted(informer.store.keys()) == [f"ns/{n}" for n in "abcde"]
    assert len(seen.handled) == 5
    assert_reduced(informer, seen)


def test_watch_added_modified_and_deleted_objects_are_transformed(
        server: FakeApiServer, run: Callable[..., tuple[Informer, Seen]]) -> None:
    informer, seen = run()
    session = synced(server, informer)
    session.send({"type": "ADDED", "object": put(server, "a")})
    session.send({"type": "MODIFIED", "object": put(server, "a", SECRET + "-2")})
    deleted = server.remove("a")
    deleted["metadata"]["managedFields"] = MANAGED_FIELDS
    session.send({"type": "DELETED", "object": deleted})
    assert wait_until(lambda: [k for k, _ in seen.handled] == ["add", "old", "update",
                                                                 "delete"])
    assert seen.transformed == ["a", "a", "a"]
    assert_reduced(informer, seen)
    assert informer.store.list() == []


def test_a_relist_transforms_what_it_lists(
        server: FakeApiServer, run: Callable[..., tuple[Informer, Seen]]) -> None:
    put(server, "a")
    now = [1000.0]
    informer, seen = run(clock=lambda: now[0])
    session = synced(server, informer)
    session.send({"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": "101"}}})
    assert wait_until(lambda: informer._delivered_since_list == 1)
    now[0] += 60
    put(server, "a", SECRET + "-changed")  # while the watch is behind
    put(server, "b")
    session.send({"type": "ERROR", "object": status_body(410, "Expired", "too old")})
    server.next_watch()
    assert wait_until(lambda: sorted(informer.store.keys()) == ["ns/a", "ns/b"])
    stored = informer.store.get("ns/a")
    assert stored is not None and stored["metadata"]["resourceVersion"] == "102"
    assert seen.transformed == ["a", "a", "b"]  # the first list, then the relist
    assert_reduced(informer, seen)


def test_a_bookmark_reaches_neither_the_transform_nor_the_store(
        server: FakeApiServer, run: Callable[..., tuple[Informer, Seen]]) -> None:
    informer, seen = run()
    session = synced(server, informer)
    session.send({"type": "BOOKMARK", "object": {"kind": "Widget", "apiVersion": "example.io/v1",
                                                 "metadata": {"resourceVersion": "500"}}})
    session.close()
    assert server.next_watch().query["resourceVersion"] == "500"
    assert seen.transformed == [] and informer.store.keys() == [] and seen.handled == []


def test_managed_fields_are_dropped_without_a_transform(
        server: FakeApiServer, run: Callable[..., tuple[Informer, Seen]]) -> None:
    put(server, "a")
    informer, _ = run(transform=None)
    session = synced(server, informer)
    session.send({"type": "MODIFIED", "object": put(server, "a", "other")})
    assert wait_until(lambda: (informer.store.get("ns/a") or {}).get("data") == {"v": "other"})
    stored = informer.store.get("ns/a")
    assert stored is not None and "managedFields" not in stored["metadata"]


def test_an_object_the_transform_fails_on_is_not_cached_whole(
        server: FakeApiServer, run: Callable[..., tuple[Informer, Seen]]) -> None:
    put(server, "bad")
    put(server, "good")

    def picky(obj: dict[str, Any]) -> dict[str, Any]:
        if obj["metadata"]["name"] == "bad":
            raise ValueError("cannot reduce")
        return reduce(obj)

    with capture_logs() as logs:
        informer, seen = run(transform=picky)
        synced(server, informer)
    assert informer.store.keys() == ["ns/good"]
    assert_reduced(informer, seen)
    assert any(e["event"] == "informer transform failed; object not cached"
               and e["name"] == "bad" for e in logs)


def test_a_watch_event_the_transform_fails_on_drops_the_cached_object_as_a_deletion(
        server: FakeApiServer, run: Callable[..., tuple[Informer, Seen]]) -> None:
    # As on the list path, an object the transform refuses is not cached: neither is the
    # version cached before (a MODIFIED), nor does a refused DELETED keep it; handlers
    # hear of it as a deletion (of what they were last given), never of the raw object.
    put(server, "a")
    put(server, "b")

    def picky(obj: dict[str, Any]) -> dict[str, Any]:
        if (obj.get("data") or {}).get("v") == "bad":
            raise ValueError("cannot reduce")
        return reduce(obj)

    informer, seen = run(transform=picky)
    session = synced(server, informer)
    listed = {key: informer.store.get(key) for key in ("ns/a", "ns/b")}
    session.send({"type": "MODIFIED", "object": put(server, "a", "bad")})
    put(server, "b", "bad")
    session.send({"type": "DELETED", "object": server.remove("b")})
    put(server, "never-cached", "bad")
    session.send({"type": "DELETED", "object": server.remove("never-cached")})
    session.send({"type": "ADDED", "object": put(server, "c")})
    assert wait_until(lambda: informer.store.get("ns/c") is not None)
    assert informer.store.keys() == ["ns/c"]
    after_list = seen.handled[2:]
    assert after_list[:2] == [("delete", listed["ns/a"]), ("delete", listed["ns/b"])]
    assert [kind for kind, _ in after_list[2:]] == ["add"]
    assert_reduced(informer, seen)


def test_drop_managed_fields_leaves_the_rest() -> None:
    obj = {"metadata": {"name": "a", "managedFields": MANAGED_FIELDS}, "data": {"v": "x"}}
    assert drop_managed_fields(obj) == {"metadata": {"name": "a"}, "data": {"v": "x"}}
    assert drop_managed_fields({"kind": "Widget"}) == {"kind": "Widget"}
