"""RestClient and WatchStream against a fake apiserver (the loader: test_kubeconfig)."""

from __future__ import annotations

import json
import socket
import threading
from typing import Any

import pytest
from fake_apiserver import TOKEN, Canned, FakeApiServer, status_body
from fakes import SleepClock

from himitsu_controller.runtime.client.config import Auth
from himitsu_controller.runtime.client.rest import (
    APPLY_PATCH,
    JSON_PATCH,
    ApiError,
    ClientConfig,
    HttpClient,
    Resource,
    RestClient,
    TokenBucket,
    TransportError,
    new_api_client,
)

WIDGETS = Resource("example.io", "v1", "widgets")
CONFIGMAPS = Resource("", "v1", "configmaps")




@pytest.fixture
def rest(api_client: HttpClient, clock: SleepClock) -> RestClient:
    return RestClient(api_client, clock=clock, sleep=clock.sleep)


# Resource paths.

def test_resource_paths() -> None:
    assert CONFIGMAPS.path() == "/api/v1/configmaps"
    assert CONFIGMAPS.path("ns") == "/api/v1/namespaces/ns/configmaps"
    assert CONFIGMAPS.path("ns", "a") == "/api/v1/namespaces/ns/configmaps/a"
    assert WIDGETS.path("ns", "w", "status") == "/apis/example.io/v1/namespaces/ns/widgets/w/status"
    nodes = Resource("", "v1", "nodes", namespaced=False)
    assert nodes.path(name="n1") == "/api/v1/nodes/n1"
    with pytest.raises(ValueError, match="cluster-scoped"):
        nodes.path("ns")
    with pytest.raises(ValueError, match="subresource"):
        WIDGETS.path("ns", subresource="status")
    # "" would turn a GET into a LIST; urllib3 resolves "." and ".." as dot segments.
    for bad in ("", ".", ".."):
        with pytest.raises(ValueError, match="not a namespace or object name"):
            CONFIGMAPS.path(bad)
        with pytest.raises(ValueError, match="not a namespace or object name"):
            CONFIGMAPS.path("ns", bad)


# Requests, auth, errors.

def test_get_returns_json_and_sends_auth_accept_and_user_agent(
        server: FakeApiServer, api_client: HttpClient) -> None:
    stored = server.put("a", data={"k": "v"})
    rest = RestClient(api_client, user_agent="himitsu-test/1")
    assert rest.get(WIDGETS, "a", namespace="ns") == stored
    (request,) = server.requests_of("GET")
    assert request.path == "/apis/example.io/v1/namespaces/ns/widgets/a"
    assert request.headers["authorization"] == f"Bearer {TOKEN}"
    assert request.headers["accept"] == "application/json"
    assert request.headers["user-agent"] == "himitsu-test/1"


def test_auth_comes_from_the_credentials(server: FakeApiServer) -> None:
    # A token file or a plugin rotates tokens this way (how often: test_rest_transport).
    server.tokens = {"rotated"}

    class Rotated:
        def current(self) -> Auth:
            return Auth("Bearer rotated")

        def refused(self, auth: Auth) -> None:
            pass

    rest = RestClient(new_api_client(ClientConfig(server.url, credentials=Rotated())))
    server.put("a")
    assert rest.get(WIDGETS, "a", namespace="ns")["metadata"]["name"] == "a"


def test_query_values_are_encoded(server: FakeApiServer, rest: RestClient) -> None:
    rest.list(WIDGETS, namespace="ns", query={"labelSelector": "a=b,c in (x,y)",
                                              "allowWatchBookmarks": True, "limit": 5,
                                              "continue": None})
    (request,) = server.requests_of("GET")
    assert request.query == {"labelSelector": "a=b,c in (x,y)", "allowWatchBookmarks": "true",
                             "limit": "5"}


def test_status_error_carries_reason_and_message_never_the_request_body(
        server: FakeApiServer, rest: RestClient) -> None:
    message = 'Secret "a" is invalid: data: Invalid value'
    server.canned.append(Canned(422, status_body(422, "Invalid", message)))
    with pytest.raises(ApiError) as info:
        rest.create(WIDGETS, {"metadata": {"name": "a", "namespace": "ns"},
                              "data": {"password": "s3cr3t-value"}})
    error = info.value
    assert (error.status, error.reason, error.message) == (422, "Invalid", message)
    assert "s3cr3t-value" not in str(error)
    (request,) = server.requests_of("POST")
    assert request.path == "/apis/example.io/v1/namespaces/ns/widgets"


def test_non_status_error_body_is_not_echoed(server: FakeApiServer, rest: RestClient) -> None:
    server.canned.append(Canned(409, b"<html>proxy says s3cr3t-value</html>"))
    with pytest.raises(ApiError) as info:
        rest.get(WIDGETS, "a", namespace="ns")
    assert (info.value.status, info.value.reason) == (409, "Conflict")
    assert "s3cr3t" not in str(info.value)


def test_not_found_from_the_server(rest: RestClient) -> None:
    with pytest.raises(ApiError) as info:
        rest.get(WIDGETS, "missing", namespace="ns")
    assert (info.value.status, info.value.reason) == (404, "NotFound")
    assert "missing" in info.value.message


def test_429_with_retry_after_is_retried_after_the_delay(
        server: FakeApiServer, rest: RestClient, clock: SleepClock) -> None:
    server.put("a")
    throttled = status_body(429, "TooManyRequests", "slow down")
    server.canned.extend([Canned(429, throttled, {"Retry-After": "2"}),
                          Canned(429, throttled, {"Retry-After": "3"})])
    assert rest.get(WIDGETS, "a", namespace="ns")["metadata"]["name"] == "a"
    assert clock.slept == [2.0, 3.0]
    assert rest.request_counts == {"get": 3}


def test_429_retries_are_bounded(server: FakeApiServer, api_client: HttpClient,
                                 clock: SleepClock) -> None:
    rest = RestClient(api_client, max_retries=2, clock=clock, sleep=clock.sleep)
    throttled = status_body(429, "TooManyRequests", "slow down")
    server.canned.extend(Canned(429, throttled, {"Retry-After": "1"}) for _ in range(5))
    with pytest.raises(ApiError) as info:
        rest.get(WIDGETS, "a", namespace="ns")
    assert info.value.status == 429
    assert info.value.retry_after == 1.0
    assert len(server.requests_of("GET")) == 3


def test_429_without_retry_after_is_not_retried(server: FakeApiServer, rest: RestClient,
                                                clock: SleepClock) -> None:
    server.canned.append(Canned(429, status_body(429, "TooManyRequests", "no")))
    with pytest.raises(ApiError):
        rest.get(WIDGETS, "a", namespace="ns")
    assert clock.slept == []


def test_connection_refused_is_a_transport_error() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    rest = RestClient(new_api_client(ClientConfig(f"http://127.0.0.1:{port}"), retries=0))
    with pytest.raises(TransportError, match="Connection refused"):
        rest.get(WIDGETS, "a", namespace="ns", timeout=2.0)


# Writes and patch content types.

def test_update_and_delete_paths_and_verbs(server: FakeApiServer, rest: RestClient) -> None:
    body = {"metadata": {"name": "a", "namespace": "ns", "resourceVersion": "7"}}
    echoed = rest.update(WIDGETS, body)
    assert (echoed["method"], echoed["path"]) == ("PUT",
                                                  "/apis/example.io/v1/namespaces/ns/widgets/a")
    assert echoed["body"] == body
    assert echoed["contentType"] == "application/json"
    deleted = rest.delete(CONFIGMAPS, "c", namespace="ns")
    assert (deleted["method"], deleted["path"]) == ("DELETE", "/api/v1/namespaces/ns/configmaps/c")
    assert rest.request_counts == {"update": 1, "delete": 1}


def test_merge_patch_is_the_default(rest: RestClient) -> None:
    echoed = rest.patch(WIDGETS, "a", {"metadata": {"labels": {"x": "y"}}}, namespace="ns")
    assert echoed["contentType"] == "application/merge-patch+json"
    assert echoed["body"] == {"metadata": {"labels": {"x": "y"}}}


def test_json_patch_sends_the_operation_list(rest: RestClient) -> None:
    ops = [{"op": "remove", "path": "/data/old"}]
    echoed = rest.patch(WIDGETS, "a", ops, namespace="ns", content_type=JSON_PATCH)
    assert echoed["contentType"] == JSON_PATCH
    assert echoed["body"] == ops


def test_json_patch_that_is_not_a_list_is_refused(server: FakeApiServer, rest: RestClient) -> None:
    # The kubernetes client's REST layer silently sent it as a strategic-merge patch.
    with pytest.raises(ValueError, match="list"):
        rest.patch(WIDGETS, "a", {"op": "remove"}, namespace="ns", content_type=JSON_PATCH)
    assert server.requests == []


def test_apply_patch_with_field_manager(rest: RestClient) -> None:
    intent = {"apiVersion": "example.io/v1", "kind": "Widget", "metadata": {"name": "a"}}
    echoed = rest.patch(WIDGETS, "a", intent, namespace="ns", content_type=APPLY_PATCH,
                        query={"fieldManager": "himitsu", "force": True})
    assert echoed["contentType"] == APPLY_PATCH
    assert echoed["body"] == intent  # JSON is YAML
    assert echoed["query"] == {"fieldManager": "himitsu", "force": "true"}
    yaml_text = "apiVersion: example.io/v1\nkind: Widget\n"
    echoed = rest.patch(WIDGETS, "a", yaml_text, namespace="ns", content_type=APPLY_PATCH)
    assert echoed["body"] == yaml_text


# Client-side rate limiting.

def test_token_bucket_allows_a_burst_then_paces_at_qps(clock: SleepClock) -> None:
    bucket = TokenBucket(10.0, 2, clock=clock, sleep=clock.sleep)
    assert [bucket.reserve() for _ in range(4)] == pytest.approx([0.0, 0.0, 0.1, 0.2])
    clock.now += 10.0  # long idle: refills to the burst, not beyond
    assert [bucket.reserve() for _ in range(3)] == pytest.approx([0.0, 0.0, 0.1])


def test_requests_wait_for_the_limiter_but_watches_do_not(
        server: FakeApiServer, api_client: HttpClient, clock: SleepClock) -> None:
    server.put("a")
    rest = RestClient(api_client, qps=1.0, burst=1, clock=clock, sleep=clock.sleep)
    rest.get(WIDGETS, "a", namespace="ns")
    rest.get(WIDGETS, "a", namespace="ns")
    assert clock.slept == pytest.approx([1.0])
    with rest.watch(WIDGETS.path("ns")) as stream:
        server.next_watch().close()
        assert list(stream) == []
    assert clock.slept == pytest.approx([1.0])
    assert rest.request_counts == {"get": 2, "watch": 1}


# Watch streams.

def test_watch_yields_events_split_across_chunks(server: FakeApiServer, rest: RestClient) -> None:
    stream = rest.watch(WIDGETS.path("ns"), query={"resourceVersion": "5"}, read_timeout=10)
    session = server.next_watch()
    assert session.query["watch"] == "true"
    assert session.query["resourceVersion"] == "5"
    first = {"type": "ADDED", "object": {"metadata": {"name": "a"}}}
    encoded = (json.dumps(first) + "\n").encode()
    session.send_raw(encoded[:10])
    session.send_raw(encoded[10:] + b'{"type": "BOOKMARK", "object": {}}\n')
    session.close()
    with stream:
        assert [event["type"] for event in stream] == ["ADDED", "BOOKMARK"]


def test_watch_error_status_at_open(server: FakeApiServer, rest: RestClient) -> None:
    server.canned.append(Canned(410, status_body(410, "Expired", "too old resource version")))
    with pytest.raises(ApiError) as info:
        rest.watch(WIDGETS.path("ns"))
    assert (info.value.status, info.value.reason) == (410, "Expired")


def test_watch_broken_mid_stream_is_a_transport_error(server: FakeApiServer,
                                                      rest: RestClient) -> None:
    with rest.watch(WIDGETS.path("ns")) as stream:
        session = server.next_watch()
        session.send({"type": "ADDED", "object": {"metadata": {"name": "a"}}})
        session.send_raw(b'{"type": "MODIF')
        session.abort()
        assert next(stream)["type"] == "ADDED"
        with pytest.raises(TransportError):
            next(stream)


def test_watch_read_timeout_is_a_transport_error(server: FakeApiServer,
                                                 rest: RestClient) -> None:
    with rest.watch(WIDGETS.path("ns"), read_timeout=0.2) as stream:
        server.next_watch()  # and never write anything
        with pytest.raises(TransportError):
            next(stream)


def test_close_from_another_thread_ends_a_hanging_watch(server: FakeApiServer,
                                                        rest: RestClient) -> None:
    stream = rest.watch(WIDGETS.path("ns"), read_timeout=300)
    server.next_watch()  # hangs: no event, no close
    events: list[dict[str, Any]] = []
    reader = threading.Thread(target=lambda: events.extend(stream))
    reader.start()
    stream.close()
    reader.join(timeout=10)
    assert not reader.is_alive()
    assert events == []
    assert stream.closed
