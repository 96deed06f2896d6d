"""Lists in pages on servers whose watch cache serves paginated lists (kube-apiserver 1.34+).

``resourceVersion=0`` is answered in one page whatever the ``limit`` (measured on the
local control plane's v1.36.3: 1,100 Secrets for ``limit=2``), so a restart decoded its
first lists whole before the transform reduced them. With list snapshots every list is
paginated and still the watch cache's; a listing holds one page whole at a time.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Iterator, Mapping
from typing import Any

import pytest
from fake_apiserver import FakeApiServer, status_body

from himitsu_controller.runtime.cache.informer import Informer
from himitsu_controller.runtime.cache.pager import Listing, Pager, lists_from_snapshots
from himitsu_controller.runtime.client.rest import HttpClient, Resource, RestClient

WIDGETS = Resource("example.io", "v1", "widgets")
TIMEOUT = 10.0


def list_params(server: FakeApiServer) -> list[tuple[str | None, ...]]:
    return [(r.query.get("resourceVersion"), r.query.get("resourceVersionMatch"),
             r.query.get("limit"), r.query.get("continue"))
            for r in server.requests_of("GET", watch=False)]


@pytest.fixture
def informer(api_client: HttpClient, server: FakeApiServer) -> Iterator[Informer]:
    server.watch_cache = server.list_snapshots = True
    for name in "abcde":
        server.put(name)
    made = Informer(RestClient(api_client), WIDGETS, namespace="ns", page_size=2,
                    list_snapshots=True, rng=lambda: 0.0)
    stop = threading.Event()
    thread = threading.Thread(target=made.run, args=(stop,), daemon=True)
    thread.start()
    yield made
    stop.set()
    thread.join(timeout=TIMEOUT)
    assert not thread.is_alive()


def test_the_first_list_and_a_relist_come_in_pages_from_the_watch_cache(
        server: FakeApiServer, informer: Informer) -> None:
    session = server.next_watch()
    assert informer.wait_for_sync(TIMEOUT)
    assert session.query["resourceVersion"] == "105"  # the list's (its last page's)
    session.send({"type": "ADDED", "object": server.put("f")})
    server.remove("a")
    session.send({"type": "ERROR", "object": status_body(410, "Expired", "too old")})
    assert server.next_watch().query["resourceVersion"] == "107"
    assert list_params(server) == [
        (None, None, "2", None), (None, None, "2", "2"), (None, None, "2", "4"),
        ("106", "NotOlderThan", "2", None), (None, None, "2", "2"), (None, None, "2", "4")]
    assert server.list_sources == ["cache"] * 6  # nothing read from etcd
    assert sorted(informer.store.keys()) == [f"ns/{n}" for n in "bcdef"]


def _list_five_in_pages(server: FakeApiServer, api_client: HttpClient, *,
                        expiring_continues: int) -> Listing | None:
    """Five objects listed in pages of 2 from list snapshots, the first
    ``expiring_continues`` continue tokens answered 410."""
    server.watch_cache = server.list_snapshots = True
    for name in "abcde":
        server.put(name)
    server.expire_continue = expiring_continues
    pager = Pager(RestClient(api_client), WIDGETS, namespace="ns", selectors={},
                  page_size=2, name="widgets", snapshots=True)
    return pager.list("", threading.Event())


def test_an_expired_continue_token_starts_the_list_over_in_pages(
        server: FakeApiServer, api_client: HttpClient) -> None:
    listed = _list_five_in_pages(server, api_client, expiring_continues=1)
    assert listed is not None
    items, version = listed
    assert sorted(items) == [f"ns/{n}" for n in "abcde"] and version == "105"
    assert list_params(server) == [
        (None, None, "2", None), (None, None, "2", "2"),  # 410
        (None, None, "2", None), (None, None, "2", "2"), (None, None, "2", "4")]


def test_a_continue_token_that_keeps_expiring_ends_in_one_page(
        server: FakeApiServer, api_client: HttpClient) -> None:
    listed = _list_five_in_pages(server, api_client, expiring_continues=2)
    assert listed is not None and sorted(listed[0]) == [f"ns/{n}" for n in "abcde"]
    assert list_params(server)[-1] == (None, None, None, None)  # no third start


class _Whole(dict[str, Any]):
    """A listed object as decoded (weakly referable, so the test sees when it is gone)."""

    __hash__ = object.__hash__  # type: ignore[assignment]  # identity, for the WeakSet


class _PagedRest:
    """A RestClient's ``list`` serving ``count`` objects in pages, recording how many
    objects of earlier pages were still alive whole when each page was asked for."""

    def __init__(self, count: int) -> None:
        self.count = count
        self.alive: weakref.WeakSet[_Whole] = weakref.WeakSet()
        self.alive_at_request: list[int] = []

    def list(self, resource: Resource, *, namespace: str | None = None,
             query: Mapping[str, Any] | None = None, timeout: float = 60.0) -> dict[str, Any]:
        query = query or {}
        self.alive_at_request.append(len(self.alive))
        start = int(query.get("continue") or 0)
        end = min(self.count, start + int(query["limit"]))
        items = []
        for i in range(start, end):
            item = _Whole(metadata={"name": f"w{i}", "namespace": "ns",
                                    "resourceVersion": str(i + 1)}, data={"v": "x" * 100})
            self.alive.add(item)
            items.append(item)
        meta: dict[str, Any] = {"resourceVersion": "900"}
        if end < self.count:
            meta["continue"] = str(end)
        return {"kind": "WidgetList", "apiVersion": "example.io/v1", "metadata": meta,
                "items": items}


def _summary(obj: dict[str, Any]) -> dict[str, Any]:
    return {"metadata": dict(obj["metadata"]), "keys": sorted(obj.get("data") or {})}


def test_a_listing_holds_one_page_whole_at_a_time() -> None:
    rest = _PagedRest(10)
    pager = Pager(rest, WIDGETS, namespace="ns", selectors={},  # type: ignore[arg-type]
                  page_size=3, name="widgets", transform=_summary, snapshots=True)
    listed = pager.list("", threading.Event())
    assert listed is not None and len(listed[0]) == 10 and listed[1] == "900"
    # Every page after the first was asked for with no whole object of the ones before
    # still alive: each was reduced by the transform, and its page let go, first.
    assert rest.alive_at_request == [0, 0, 0, 0]
    assert len(rest.alive) == 0


@pytest.mark.parametrize(("answer", "expected"), [
    ({"major": "1", "minor": "36", "gitVersion": "v1.36.3"}, True),
    ({"major": "1", "minor": "34+", "gitVersion": "v1.34.2-eks-1"}, True),
    ({"major": "1", "minor": "33", "gitVersion": "v1.33.5"}, False),
    ({"major": "", "minor": ""}, False),
    (None, False),  # /version not answered (404)
])
def test_paginated_lists_from_the_cache_are_known_by_the_servers_version(
        server: FakeApiServer, api_client: HttpClient,
        answer: dict[str, str] | None, expected: bool) -> None:
    server.version = answer
    assert lists_from_snapshots(RestClient(api_client)) is expected


def test_without_list_snapshots_the_first_list_is_the_watch_caches_one_page(
        server: FakeApiServer, api_client: HttpClient) -> None:
    # Older servers: resourceVersion=0 spares etcd (its limit is ignored).
    server.watch_cache = True
    for name in "abcde":
        server.put(name)
    pager = Pager(RestClient(api_client), WIDGETS, namespace="ns", selectors={},
                  page_size=2, name="widgets")
    assert pager.list("", threading.Event()) is not None
    assert list_params(server) == [("0", None, "2", None)]
    assert server.list_sources == ["cache"]


def test_a_server_that_gives_only_its_git_version_still_gets_lists_in_pages(
        server: FakeApiServer, api_client: HttpClient) -> None:
    server.version = {"major": "", "minor": "", "gitVersion": "v1.35.1-gke.100"}
    assert lists_from_snapshots(RestClient(api_client)) is True


def test_list_pages_off_keeps_every_list_in_the_watch_cache_of_a_server_without_snapshots(
        server: FakeApiServer, api_client: HttpClient) -> None:
    # A 1.36 server with ListFromCacheSnapshot off (or behind a load balancer spreading
    # pages over apiservers): continue pages would be etcd's. ``off`` asks nothing and
    # keeps the one-page rules: the first list and a relist are the cache's.
    server.version = {"major": "1", "minor": "36", "gitVersion": "v1.36.3"}
    server.watch_cache = True
    server.list_snapshots = False
    for name in "abcde":
        server.put(name)
    rest = RestClient(api_client)
    snapshots = lists_from_snapshots(rest, pages="off")
    assert snapshots is False
    assert not [r for r in server.requests if r.path == "/version"]
    pager = Pager(rest, WIDGETS, namespace="ns", selectors={}, page_size=2,
                  name="widgets", snapshots=snapshots)
    listing = pager.list("", threading.Event())
    assert listing is not None
    assert pager.list(listing[1], threading.Event()) is not None  # a relist
    assert server.list_sources == ["cache", "cache"]
