"""RestClient's request path: what goes on the wire, credentials over time, the pool, TLS.

The transport builds headers and credentials once per refresh period and sends through
the HttpClient's one pool for the apiserver, so these tests pin what that must not lose:
the exact body bytes and content type, a rotated token showing up after the period (and
at once after a 401), 429/Retry-After, the TLS settings (checked end to end against a
TLS server that requires a client certificate: the CA is verified, the certificate is
presented), a path prefix in the host URL, and the ProxyManager behind a proxy.
"""

from __future__ import annotations

import base64
import json
import socket
import ssl
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import urllib3
from fake_apiserver import TOKEN, Canned, FakeApiServer, status_body
from fakes import SleepClock
from tls_server import Pki, TlsApiServer

from himitsu_controller.runtime.client.config import Auth
from himitsu_controller.runtime.client.rest import (
    APPLY_PATCH,
    ApiError,
    ClientConfig,
    HttpClient,
    Resource,
    RestClient,
    TransportError,
    bearer,
    load_api_client,
    new_api_client,
)
from himitsu_controller.runtime.client.transport import encode_body

WIDGETS = Resource("example.io", "v1", "widgets")


class Issued:
    """Credentials that hand out a new token each time ``issue`` says so; records calls."""

    def __init__(self, token: str, *, on_current: Callable[[], None] | None = None) -> None:
        self.token = token
        self.on_current = on_current
        self.calls = 0
        self.refused_tokens: list[str | None] = []

    def current(self) -> Auth:
        self.calls += 1
        if self.on_current is not None:
            self.on_current()
        return Auth(f"Bearer {self.token}")

    def refused(self, auth: Auth) -> None:
        self.refused_tokens.append(auth.authorization)


def client_with(server: FakeApiServer, credentials: Any) -> HttpClient:
    return new_api_client(ClientConfig(server.url, credentials=credentials), pool_maxsize=8)


@pytest.fixture(autouse=True)
def no_environment_proxy(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "KUBECONFIG"):
        monkeypatch.delenv(name, raising=False)


def sent_tokens(server: FakeApiServer) -> list[str]:
    return [r.headers["authorization"].removeprefix("Bearer ") for r in server.requests]


# What goes on the wire.

def test_a_merge_patch_is_compact_json_with_its_content_type(
        server: FakeApiServer, api_client: HttpClient) -> None:
    rest = RestClient(api_client, user_agent="himitsu-test/2")
    rest.patch(WIDGETS, "a", {"status": {"ready": True, "note": "é"}}, namespace="ns",
               subresource="status")
    (request,) = server.requests
    assert (request.method, request.path) == ("PATCH",
                                              "/apis/example.io/v1/namespaces/ns/widgets/a/status")
    assert request.body == b'{"status":{"ready":true,"note":"\\u00e9"}}'
    assert request.headers["content-type"] == "application/merge-patch+json"
    assert request.headers["content-length"] == str(len(request.body))
    assert request.headers["accept"] == "application/json"
    assert request.headers["user-agent"] == "himitsu-test/2"
    assert request.headers["authorization"] == f"Bearer {TOKEN}"


def test_bodies_and_content_types_of_the_other_verbs(server: FakeApiServer,
                                                     api_client: HttpClient) -> None:
    rest = RestClient(api_client)
    rest.create(WIDGETS, {"metadata": {"name": "a", "namespace": "ns"}})
    rest.patch(WIDGETS, "a", "kind: Widget\n", namespace="ns", content_type=APPLY_PATCH)
    rest.delete(WIDGETS, "a", namespace="ns")
    create, apply, delete = server.requests
    assert (create.body, create.headers["content-type"]) == (
        b'{"metadata":{"name":"a","namespace":"ns"}}', "application/json")
    assert (apply.body, apply.headers["content-type"]) == (b"kind: Widget\n", APPLY_PATCH)
    assert delete.body == b""
    assert "content-type" not in delete.headers


def test_encode_body() -> None:
    assert encode_body(None, "application/json") is None
    assert encode_body(b"raw", "application/json") == b"raw"
    assert encode_body({"a": [1, None]}, None) == b'{"a":[1,null]}'
    assert encode_body("text", APPLY_PATCH) == b"text"
    assert encode_body("text", "application/merge-patch+json") == b'"text"'  # as the client


def test_requests_go_through_the_clients_one_pool(server: FakeApiServer,
                                                  api_client: HttpClient) -> None:
    pool, manager = api_client.connection()
    assert pool is not None
    assert manager is None
    rest = RestClient(api_client)
    server.put("a")
    for _ in range(3):
        rest.get(WIDGETS, "a", namespace="ns")
    assert pool.num_requests == 3
    assert pool.num_connections == 1  # kept alive


def test_a_path_prefix_in_the_host_is_kept(server: FakeApiServer) -> None:
    api_client = new_api_client(ClientConfig(server.url + "/k8s/clusters/c1/",
                                             credentials=bearer(TOKEN)))
    RestClient(api_client).list(WIDGETS, namespace="ns", query={"limit": 1})
    (request,) = server.requests
    assert request.path == "/k8s/clusters/c1/apis/example.io/v1/namespaces/ns/widgets"
    assert request.query == {"limit": "1"}
    FakeApiServer.close_client(api_client)


def test_requests_still_work_after_the_api_client_was_closed(
        server: FakeApiServer, api_client: HttpClient) -> None:
    rest = RestClient(api_client)
    server.put("a")
    rest.get(WIDGETS, "a", namespace="ns")
    FakeApiServer.close_client(api_client)  # closes its pools; it reopens them on demand
    assert rest.get(WIDGETS, "a", namespace="ns")["metadata"]["name"] == "a"


def test_behind_a_proxy_requests_go_through_the_proxy_manager(server: FakeApiServer) -> None:
    # The fake apiserver doubles as the proxy: it is sent absolute URIs for a host that
    # is never contacted itself.
    api_client = new_api_client(ClientConfig("http://127.0.0.2:9", credentials=bearer(TOKEN),
                                             proxy=server.url))
    pool, manager = api_client.connection()
    assert pool is None
    assert isinstance(manager, urllib3.ProxyManager)
    echoed = RestClient(api_client).patch(WIDGETS, "a", {"x": 1}, namespace="ns")
    assert (echoed["path"], echoed["body"]) == ("/apis/example.io/v1/namespaces/ns/widgets/a",
                                                {"x": 1})
    (request,) = server.requests
    assert request.headers["host"] == "127.0.0.2:9"
    assert request.headers["authorization"] == f"Bearer {TOKEN}"
    FakeApiServer.close_client(api_client)


def test_the_clients_retry_policy_covers_broken_connections() -> None:
    # A listener that hangs up on every connection before answering.
    accepted: list[int] = []
    stop = threading.Event()
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)
        listener.settimeout(0.05)

        def hang_up() -> None:
            while not stop.is_set():
                try:
                    connection, _ = listener.accept()
                except TimeoutError:
                    continue
                accepted.append(1)
                connection.close()

        thread = threading.Thread(target=hang_up, daemon=True)
        thread.start()
        api_client = new_api_client(ClientConfig(f"http://127.0.0.1:{listener.getsockname()[1]}"))
        try:
            with pytest.raises(TransportError, match="Connection aborted"):
                RestClient(api_client).get(WIDGETS, "a", namespace="ns", timeout=5.0)
        finally:
            stop.set()
            thread.join(timeout=5)
            FakeApiServer.close_client(api_client)
    assert len(accepted) == 4  # the first try and new_api_client's 3 retries


# Credentials over time.

def test_credentials_are_reread_once_per_refresh_period(
        server: FakeApiServer, clock: SleepClock) -> None:
    server.tokens = {"t1", "t2", "t3"}
    issued = iter(["t1", "t2", "t3"])
    calls: list[float] = []

    def rotate() -> None:  # as a token file re-read or a plugin run
        calls.append(clock.now)
        credentials.token = next(issued)

    credentials = Issued("t0", on_current=rotate)
    rest = RestClient(client_with(server, credentials), credentials_refresh=2.0, clock=clock,
                      sleep=clock.sleep)
    server.put("a")
    for step in (0.0, 0.5, 1.4, 0.1, 2.0, 0.0):
        clock.now += step
        rest.get(WIDGETS, "a", namespace="ns")
    assert sent_tokens(server) == ["t1", "t1", "t1", "t2", "t3", "t3"]
    assert calls == [1000.0, 1002.0, 1004.0]


def test_a_slow_refresh_does_not_hold_up_other_requests(
        server: FakeApiServer, clock: SleepClock) -> None:
    # A kubeconfig credential plugin can take seconds: meanwhile the others keep going.
    server.tokens = {TOKEN, "t2"}
    credentials = Issued(TOKEN)
    rest = RestClient(client_with(server, credentials), clock=clock, sleep=clock.sleep)
    server.put("a")
    rest.get(WIDGETS, "a", namespace="ns")
    entered, release = threading.Event(), threading.Event()

    def slow_plugin() -> None:
        entered.set()
        assert release.wait(10)
        credentials.token = "t2"

    credentials.on_current = slow_plugin
    clock.now += 1.0
    refreshing = threading.Thread(target=rest.get, args=(WIDGETS, "a"), kwargs={"namespace": "ns"})
    refreshing.start()
    try:
        assert entered.wait(10)
        rest.get(WIDGETS, "a", namespace="ns")  # would block here if it waited for the plugin
        assert sent_tokens(server) == [TOKEN, TOKEN]
    finally:
        release.set()
        refreshing.join(timeout=10)
    assert sent_tokens(server) == [TOKEN, TOKEN, "t2"]


def test_a_401_rereads_the_credentials_at_once(server: FakeApiServer,
                                               clock: SleepClock) -> None:
    credentials = Issued(TOKEN)
    rest = RestClient(client_with(server, credentials), clock=clock, sleep=clock.sleep)
    server.put("a")
    rest.get(WIDGETS, "a", namespace="ns")
    server.tokens = {"renewed"}  # the old token was revoked and a new one issued
    credentials.token = "renewed"
    with pytest.raises(ApiError) as info:
        rest.get(WIDGETS, "a", namespace="ns")
    assert info.value.status == 401
    assert credentials.refused_tokens == [f"Bearer {TOKEN}"]  # told which one was refused
    rest.get(WIDGETS, "a", namespace="ns")  # the clock has not moved
    assert sent_tokens(server) == [TOKEN, TOKEN, "renewed"]


def test_a_kubeconfig_token_reaches_the_wire(server: FakeApiServer, tmp_path: Path) -> None:
    kubeconfig = tmp_path / "config"
    kubeconfig.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "c", "cluster": {"server": server.url}}],
        "users": [{"name": "u", "user": {"token": TOKEN}}],
        "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}]}))
    api_client = load_api_client(str(kubeconfig))
    server.put("a")
    assert RestClient(api_client).get(WIDGETS, "a", namespace="ns")["metadata"]["name"] == "a"
    assert sent_tokens(server) == [TOKEN]
    FakeApiServer.close_client(api_client)


def test_429_with_retry_after_on_a_patch(server: FakeApiServer, api_client: HttpClient,
                                         clock: SleepClock) -> None:
    rest = RestClient(api_client, clock=clock, sleep=clock.sleep)
    throttled = status_body(429, "TooManyRequests", "slow down")
    server.canned.append(Canned(429, throttled, {"retry-after": "4"}))  # any header case
    echoed = rest.patch(WIDGETS, "a", {"x": 1}, namespace="ns")
    assert echoed["body"] == {"x": 1}
    assert clock.slept == [4.0]
    assert [r.body for r in server.requests] == [b'{"x":1}', b'{"x":1}']
    assert rest.request_counts == {"patch": 2}


# TLS settings.

def test_the_pool_carries_the_tls_settings(pki: Pki) -> None:
    config = ClientConfig("https://127.0.0.1:6443/prefix", ca_file=str(pki.ca),
                          cert_file=str(pki.client_cert), key_file=str(pki.client_key),
                          tls_server_name="kubernetes.default.svc")
    api_client = new_api_client(config, pool_maxsize=5)
    pool, _ = api_client.connection()
    assert isinstance(pool, urllib3.HTTPSConnectionPool)
    assert (pool.host, pool.port, api_client.prefix) == ("127.0.0.1", 6443, "/prefix")
    assert pool.cert_reqs == ssl.CERT_REQUIRED
    assert pool.conn_kw["server_hostname"] == "kubernetes.default.svc"
    context = pool.conn_kw["ssl_context"]
    assert isinstance(context, ssl.SSLContext)
    assert context.check_hostname
    assert pool.pool.maxsize == 5  # type: ignore[union-attr]
    assert pool.retries is api_client.retries
    assert (pool.retries.total, pool.retries.redirect, pool.retries.status) == (3, 0, 0)
    unverified, _ = new_api_client(ClientConfig(config.host, verify=False)).connection()
    assert isinstance(unverified, urllib3.HTTPSConnectionPool)
    assert unverified.cert_reqs == ssl.CERT_NONE


def tls_rest(url: str, pki: Pki, **settings: Any) -> RestClient:
    config = ClientConfig(url, credentials=bearer(TOKEN), cert_file=str(pki.client_cert),
                          key_file=str(pki.client_key), **settings)
    return RestClient(new_api_client(config, pool_maxsize=2))


def test_tls_with_ca_client_certificate_and_server_name(tls_server: TlsApiServer,
                                                        pki: Pki) -> None:
    rest = tls_rest(tls_server.url, pki, ca_file=str(pki.ca),
                    tls_server_name="kubernetes.default.svc")
    answer = rest.get(WIDGETS, "a", namespace="ns")
    assert answer == {"client": "himitsu-client", "auth": f"Bearer {TOKEN}"}
    pool, _ = rest.api_client.connection()
    assert pool is not None
    assert pool.num_requests == 1


def test_tls_settings_that_must_make_the_handshake_fail(tls_server: TlsApiServer,
                                                        pki: Pki) -> None:
    unknown_ca = tls_rest(tls_server.url, pki, tls_server_name="kubernetes.default.svc")
    with pytest.raises(TransportError, match="CERTIFICATE_VERIFY_FAILED"):
        unknown_ca.get(WIDGETS, "a", namespace="ns", timeout=5.0)
    with pytest.raises(TransportError, match="CERTIFICATE_VERIFY_FAILED"):
        unknown_ca.watch(WIDGETS.path("ns"), read_timeout=5.0)  # a watch says so too
    wrong_name = tls_rest(tls_server.url, pki, ca_file=str(pki.ca))  # 127.0.0.1
    with pytest.raises(TransportError, match="IP address mismatch"):
        wrong_name.get(WIDGETS, "a", namespace="ns", timeout=5.0)
    other_ca = tls_rest(tls_server.url, pki, ca_file=str(pki.client_cert),  # not the CA
                        tls_server_name="kubernetes.default.svc")
    with pytest.raises(TransportError, match="CERTIFICATE_VERIFY_FAILED"):
        other_ca.get(WIDGETS, "a", namespace="ns", timeout=5.0)


def test_without_a_client_certificate_the_server_refuses(tls_server: TlsApiServer,
                                                         pki: Pki) -> None:
    config = ClientConfig(tls_server.url, ca_file=str(pki.ca),
                          tls_server_name="kubernetes.default.svc")
    with pytest.raises(TransportError):
        RestClient(new_api_client(config, retries=0)).get(WIDGETS, "a", namespace="ns",
                                                           timeout=5.0)


@pytest.mark.filterwarnings("ignore::urllib3.exceptions.InsecureRequestWarning")
def test_tls_verify_off(tls_server: TlsApiServer, pki: Pki) -> None:
    unverified = tls_rest(tls_server.url, pki, verify=False)  # insecure-skip-tls-verify
    assert unverified.get(WIDGETS, "a", namespace="ns")["client"] == "himitsu-client"


def test_tls_from_a_kubeconfig_with_embedded_credentials(tls_server: TlsApiServer, pki: Pki,
                                                         tmp_path: Path) -> None:
    def data(path: Path) -> str:
        return base64.b64encode(path.read_bytes()).decode()

    kubeconfig = tmp_path / "config"
    kubeconfig.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "c", "cluster": {
            "server": tls_server.url, "certificate-authority-data": data(pki.ca),
            "tls-server-name": "kubernetes.default.svc"}}],
        "users": [{"name": "u", "user": {"client-certificate-data": data(pki.client_cert),
                                         "client-key-data": data(pki.client_key)}}],
        "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}]}))
    api_client = load_api_client(str(kubeconfig))
    answer = RestClient(api_client).get(WIDGETS, "a", namespace="ns")
    assert answer == {"client": "himitsu-client", "auth": None}
    FakeApiServer.close_client(api_client)


# A header value http.client refuses; watches and the pool; redirects.

def test_an_invalid_header_value_is_a_transport_error_without_the_token(
        server: FakeApiServer) -> None:
    """http.client's ValueError quotes the header value: a credential with a line break
    (from a source that did not trim it) must fail as a TransportError naming no token."""
    client = new_api_client(ClientConfig(server.url,
                                         credentials=bearer("secret-tok-0123456789\n")),
                            retries=0)
    server.put("a")
    with pytest.raises(TransportError, match="a request header is invalid") as info:
        RestClient(client, max_retries=0).get(WIDGETS, "a", namespace="ns", timeout=5.0)
    assert "secret-tok" not in repr(info.value) + str(info.value)
    assert server.requests == []


def small_client(url: str, pool_maxsize: int) -> HttpClient:
    return new_api_client(ClientConfig(url, credentials=bearer(TOKEN)),
                          pool_maxsize=pool_maxsize, retries=0)


def test_a_watch_closed_early_leaves_a_usable_pool(server: FakeApiServer) -> None:
    """One connection, no urllib3 retry: a half-read watch connection put back in the
    pool would make the next request fail (or read the watch's bytes)."""
    client = small_client(server.url, 1)
    rest = RestClient(client)
    server.put("a")
    for _ in range(3):
        with rest.watch(WIDGETS.path("ns")) as stream:
            session = server.next_watch()
            session.send({"type": "ADDED", "object": {"metadata": {"name": "x"}}})
            session.send({"type": "ADDED", "object": {"metadata": {"name": "y"}}})
            assert next(stream)["type"] == "ADDED"
        assert rest.get(WIDGETS, "a", namespace="ns", timeout=5.0)["metadata"]["name"] == "a"
    client.close()


def test_more_watches_than_the_pool_holds_all_stream_and_requests_still_go(
        server: FakeApiServer) -> None:
    client = small_client(server.url, 2)
    rest = RestClient(client)
    server.put("a")
    streams = [rest.watch(WIDGETS.path("ns")) for _ in range(4)]
    sessions = [server.next_watch() for _ in streams]
    for session in sessions:
        session.send({"type": "ADDED", "object": {"metadata": {"name": "x"}}})
    assert all(next(s)["type"] == "ADDED" for s in streams)
    assert rest.get(WIDGETS, "a", namespace="ns", timeout=5.0)["metadata"]["name"] == "a"
    for stream, session in zip(streams, sessions, strict=True):
        session.close()
        stream.close()
    client.close()


def test_a_redirect_to_another_host_is_not_followed(server: FakeApiServer) -> None:
    other = FakeApiServer().start()
    try:
        other.put("a")
        server.canned.append(Canned(302, None, {"Location": other.url + WIDGETS.path("ns")
                                                + "/a"}))
        client = small_client(server.url, 1)
        with pytest.raises((ApiError, TransportError)):
            RestClient(client, max_retries=0).get(WIDGETS, "a", namespace="ns", timeout=5.0)
        assert other.requests == []
        client.close()
    finally:
        other.stop()
