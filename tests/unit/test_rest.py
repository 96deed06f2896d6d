"""RestClient, WatchStream and the configuration loader against a fake apiserver."""

from __future__ import annotations

import json
import socket
import threading
from pathlib import Path
from typing import Any

import pytest
from fake_apiserver import TOKEN, Canned, FakeApiServer, status_body
from fakes import SleepClock
from kubernetes import client as k8s

from himitsu_controller.runtime import kubeconfig
from himitsu_controller.runtime.rest import (
    APPLY_PATCH,
    JSON_PATCH,
    ApiError,
    ConfigError,
    Resource,
    RestClient,
    TokenBucket,
    TransportError,
    load_api_client,
)

WIDGETS = Resource("example.io", "v1", "widgets")
CONFIGMAPS = Resource("", "v1", "configmaps")




@pytest.fixture
def rest(api_client: k8s.ApiClient, clock: SleepClock) -> RestClient:
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
        server: FakeApiServer, api_client: k8s.ApiClient) -> None:
    stored = server.put("a", data={"k": "v"})
    rest = RestClient(api_client, user_agent="himitsu-test/1")
    assert rest.get(WIDGETS, "a", namespace="ns") == stored
    (request,) = server.requests_of("GET")
    assert request.path == "/apis/example.io/v1/namespaces/ns/widgets/a"
    assert request.headers["authorization"] == f"Bearer {TOKEN}"
    assert request.headers["accept"] == "application/json"
    assert request.headers["user-agent"] == "himitsu-test/1"


def test_auth_is_applied_through_the_refresh_hook(
        server: FakeApiServer, api_client: k8s.ApiClient, rest: RestClient) -> None:
    # The in-cluster loader rotates tokens through this hook (how often: test_rest_transport).
    server.tokens = {"rotated"}
    configuration = api_client.configuration

    def refresh(cfg: k8s.Configuration) -> None:
        cfg.api_key["BearerToken"] = "rotated"

    configuration.refresh_api_key_hook = refresh
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


def test_429_retries_are_bounded(server: FakeApiServer, api_client: k8s.ApiClient,
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
    configuration = k8s.Configuration(host=f"http://127.0.0.1:{port}")
    configuration.retries = 0
    configuration.proxy = None
    with k8s.ApiClient(configuration) as api_client:
        rest = RestClient(api_client)
        with pytest.raises(TransportError):
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
    # The client's REST layer would silently send it as a strategic-merge patch.
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
        server: FakeApiServer, api_client: k8s.ApiClient, clock: SleepClock) -> None:
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


# Loading configuration.

KUBECONFIG_TEMPLATE = """
apiVersion: v1
kind: Config
current-context: test
clusters:
- name: test
  cluster: {{server: "{server}"}}
users:
- name: test
  user: {{token: "{token}"}}
contexts:
- name: test
  context: {{cluster: test, user: test}}
"""


def write_kubeconfig(path: Path, server: str, token: str = "kubeconfig-token") -> str:  # noqa: S107
    path.write_text(KUBECONFIG_TEMPLATE.format(server=server, token=token))
    return str(path)


@pytest.fixture
def no_ambient_config(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """No KUBECONFIG, not in a pod, an empty HOME: every source must come from the test."""
    monkeypatch.delenv("KUBECONFIG", raising=False)
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.delenv("KUBERNETES_SERVICE_PORT", raising=False)
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setattr(kubeconfig, "SERVICE_ACCOUNT_TOKEN_PATH", str(tmp_path / "no-token"))
    return home


def test_explicit_kubeconfig_wins_and_pool_size_is_applied(
        no_ambient_config: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KUBECONFIG", write_kubeconfig(tmp_path / "env", "http://127.0.0.2:1"))
    explicit = write_kubeconfig(tmp_path / "explicit", "http://127.0.0.3:1")
    default_before = k8s.Configuration._default
    api_client = load_api_client(explicit, pool_maxsize=7)
    assert api_client.configuration.host == "http://127.0.0.3:1"
    assert api_client.configuration.connection_pool_maxsize == 7
    assert api_client.rest_client.pool_manager.connection_pool_kw["maxsize"] == 7
    assert k8s.Configuration._default is default_before  # global state untouched


def test_a_kubeconfig_refresh_hook_runs_at_most_every_few_seconds(
        no_ambient_config: Path, tmp_path: Path) -> None:
    configuration = load_api_client(write_kubeconfig(tmp_path / "k", "http://127.0.0.3:1"),
                                    ).configuration
    assert isinstance(configuration.refresh_api_key_hook, kubeconfig.ThrottledRefresh)
    assert configuration.auth_settings()["BearerToken"]["value"] == "Bearer kubeconfig-token"

    # Like the client's loader, the hook re-installs a fresh hook of its own on each run.
    runs: list[float] = []
    now = [100.0]

    def loader_hook(config: Any) -> None:
        runs.append(now[0])
        config.refresh_api_key_hook = loader_hook

    config: Any = k8s.Configuration()
    config.refresh_api_key_hook = loader_hook
    kubeconfig.ThrottledRefresh.install(config, every=5.0, clock=lambda: now[0])
    for t in (100.0, 101.0, 104.9, 105.0, 105.1, 200.0):
        now[0] = t
        config.refresh_api_key_hook(config)
        assert isinstance(config.refresh_api_key_hook, kubeconfig.ThrottledRefresh)
    assert runs == [100.0, 105.0, 200.0]


def test_kubeconfig_env_var_then_default_file(no_ambient_config: Path, tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    kube_dir = no_ambient_config / ".kube"
    kube_dir.mkdir()
    write_kubeconfig(kube_dir / "config", "http://127.0.0.4:1")
    assert load_api_client().configuration.host == "http://127.0.0.4:1"
    monkeypatch.setenv("KUBECONFIG", write_kubeconfig(tmp_path / "env", "http://127.0.0.2:1"))
    assert load_api_client().configuration.host == "http://127.0.0.2:1"


def test_in_cluster_before_default_file_with_token_refresh(
        no_ambient_config: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    kube_dir = no_ambient_config / ".kube"
    kube_dir.mkdir()
    write_kubeconfig(kube_dir / "config", "http://127.0.0.4:1")
    token_file = tmp_path / "token"
    token_file.write_text("sa-token")
    ca_file = tmp_path / "ca.crt"
    ca_file.write_text("not really a certificate")
    monkeypatch.setattr(kubeconfig, "SERVICE_ACCOUNT_TOKEN_PATH", str(token_file))
    monkeypatch.setattr(kubeconfig, "SERVICE_ACCOUNT_CA_PATH", str(ca_file))
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.0.0.1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", "443")
    configuration = load_api_client().configuration
    assert configuration.host == "https://10.0.0.1:443"
    assert configuration.ssl_ca_cert == str(ca_file)
    assert configuration.refresh_api_key_hook is not None
    assert configuration.auth_settings()["BearerToken"]["value"] == "bearer sa-token"


def test_no_configuration_anywhere(no_ambient_config: Path) -> None:
    with pytest.raises(ConfigError, match="no Kubernetes configuration"):
        load_api_client()


def test_broken_kubeconfig_is_a_one_line_config_error(no_ambient_config: Path,
                                                      tmp_path: Path) -> None:
    broken = tmp_path / "broken"
    broken.write_text("apiVersion: v1\nusers:\n- name: u\n  user: {token: hunter2-secret}\n")
    with pytest.raises(ConfigError) as info:
        load_api_client(str(broken))
    message = str(info.value)
    assert str(broken) in message
    assert "\n" not in message
    assert "hunter2" not in message
