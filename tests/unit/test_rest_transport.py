"""RestClient's lean request path: what goes on the wire, credentials over time, the pool.

The lean path builds headers and credentials once per refresh period and sends through
the ApiClient's own pool for the apiserver, so these tests pin what that must not lose:
the exact body bytes and content type, a rotated token showing up after the period (and
at once after a 401), 429/Retry-After, the client's TLS settings (checked end to end
against a TLS server that requires a client certificate), a path prefix in the host URL,
and the client's own path behind a proxy.
"""

from __future__ import annotations

import base64
import http.server
import json
import shutil
import socket
import ssl
import subprocess
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import urllib3
from fake_apiserver import TOKEN, Canned, FakeApiServer, status_body
from fakes import SleepClock
from kubernetes import client as k8s

from himitsu_controller.runtime.rest import (
    APPLY_PATCH,
    ApiError,
    Resource,
    RestClient,
    TransportError,
    load_api_client,
    new_api_client,
)
from himitsu_controller.runtime.transport import apiserver_pool, encode_body

WIDGETS = Resource("example.io", "v1", "widgets")




def sent_tokens(server: FakeApiServer) -> list[str]:
    return [r.headers["authorization"].removeprefix("Bearer ") for r in server.requests]


# What goes on the wire.

def test_a_merge_patch_is_compact_json_with_its_content_type(
        server: FakeApiServer, api_client: k8s.ApiClient) -> None:
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
                                                     api_client: k8s.ApiClient) -> None:
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


def test_the_lean_path_goes_through_the_api_clients_pool(server: FakeApiServer,
                                                         api_client: k8s.ApiClient) -> None:
    pool = apiserver_pool(api_client)
    assert pool is not None
    assert api_client.rest_client.pool_manager.connection_from_url(server.url) is pool
    rest = RestClient(api_client)
    server.put("a")
    for _ in range(3):
        rest.get(WIDGETS, "a", namespace="ns")
    assert pool.num_requests == 3
    assert pool.num_connections == 1  # kept alive


def test_a_path_prefix_in_the_host_is_kept(server: FakeApiServer) -> None:
    configuration = k8s.Configuration(host=server.url + "/k8s/clusters/c1")
    configuration.api_key = {"BearerToken": TOKEN}
    configuration.api_key_prefix = {"BearerToken": "Bearer"}
    configuration.proxy = None
    api_client = new_api_client(configuration)
    RestClient(api_client).list(WIDGETS, namespace="ns", query={"limit": 1})
    (request,) = server.requests
    assert request.path == "/k8s/clusters/c1/apis/example.io/v1/namespaces/ns/widgets"
    assert request.query == {"limit": "1"}
    FakeApiServer.close_client(api_client)


def test_requests_still_work_after_the_api_client_was_closed(
        server: FakeApiServer, api_client: k8s.ApiClient) -> None:
    rest = RestClient(api_client)
    server.put("a")
    rest.get(WIDGETS, "a", namespace="ns")
    FakeApiServer.close_client(api_client)  # closes its pools; it reopens them on demand
    assert rest.get(WIDGETS, "a", namespace="ns")["metadata"]["name"] == "a"


def test_behind_a_proxy_the_clients_own_path_is_used(server: FakeApiServer) -> None:
    # The fake apiserver doubles as the proxy: it is sent absolute URIs for a host that
    # is never contacted itself.
    configuration = k8s.Configuration(host="http://127.0.0.2:9")
    configuration.api_key = {"BearerToken": TOKEN}
    configuration.api_key_prefix = {"BearerToken": "Bearer"}
    configuration.proxy = server.url
    configuration.no_proxy = None
    api_client = new_api_client(configuration)
    assert apiserver_pool(api_client) is None
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
        configuration = k8s.Configuration(host=f"http://127.0.0.1:{listener.getsockname()[1]}")
        configuration.proxy = None
        api_client = new_api_client(configuration)
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
        server: FakeApiServer, api_client: k8s.ApiClient, clock: SleepClock) -> None:
    server.tokens = {"t1", "t2", "t3"}
    issued = iter(["t1", "t2", "t3"])
    calls: list[float] = []

    def rotate(configuration: k8s.Configuration) -> None:  # as the in-cluster loader does
        calls.append(clock.now)
        configuration.api_key["BearerToken"] = next(issued)

    api_client.configuration.refresh_api_key_hook = rotate
    rest = RestClient(api_client, credentials_refresh=2.0, clock=clock, sleep=clock.sleep)
    server.put("a")
    for step in (0.0, 0.5, 1.4, 0.1, 2.0, 0.0):
        clock.now += step
        rest.get(WIDGETS, "a", namespace="ns")
    assert sent_tokens(server) == ["t1", "t1", "t1", "t2", "t3", "t3"]
    assert calls == [1000.0, 1002.0, 1004.0]


def test_a_slow_refresh_does_not_hold_up_other_requests(
        server: FakeApiServer, api_client: k8s.ApiClient, clock: SleepClock) -> None:
    # A kubeconfig credential plugin can take seconds: meanwhile the others keep going.
    server.tokens = {TOKEN, "t2"}
    rest = RestClient(api_client, clock=clock, sleep=clock.sleep)
    server.put("a")
    rest.get(WIDGETS, "a", namespace="ns")
    entered, release = threading.Event(), threading.Event()

    def slow_plugin(configuration: k8s.Configuration) -> None:
        entered.set()
        assert release.wait(10)
        configuration.api_key["BearerToken"] = "t2"

    api_client.configuration.refresh_api_key_hook = slow_plugin
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
                                               api_client: k8s.ApiClient,
                                               clock: SleepClock) -> None:
    rest = RestClient(api_client, clock=clock, sleep=clock.sleep)
    server.put("a")
    rest.get(WIDGETS, "a", namespace="ns")
    server.tokens = {"renewed"}  # the old token was revoked and a new one issued
    api_client.configuration.api_key["BearerToken"] = "renewed"
    with pytest.raises(ApiError) as info:
        rest.get(WIDGETS, "a", namespace="ns")
    assert info.value.status == 401
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
    api_client.configuration.proxy = None
    api_client.rest_client.pool_manager = urllib3.PoolManager(  # drop any environment proxy
        **api_client.rest_client.pool_manager.connection_pool_kw)
    server.put("a")
    assert RestClient(api_client).get(WIDGETS, "a", namespace="ns")["metadata"]["name"] == "a"
    assert sent_tokens(server) == [TOKEN]
    FakeApiServer.close_client(api_client)


def test_429_with_retry_after_on_a_patch(server: FakeApiServer, api_client: k8s.ApiClient,
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

def test_the_pool_carries_the_clients_tls_settings() -> None:
    configuration = k8s.Configuration(host="https://127.0.0.1:6443/prefix")
    configuration.ssl_ca_cert = "/etc/ca.crt"
    configuration.cert_file = "/etc/client.crt"
    configuration.key_file = "/etc/client.key"
    configuration.assert_hostname = False
    configuration.tls_server_name = "kubernetes.default.svc"
    configuration.proxy = None
    api_client = new_api_client(configuration, pool_maxsize=5)
    pool = apiserver_pool(api_client)
    assert isinstance(pool, urllib3.HTTPSConnectionPool)
    assert (pool.host, pool.port) == ("127.0.0.1", 6443)
    assert (pool.ca_certs, pool.cert_file, pool.key_file) == (
        "/etc/ca.crt", "/etc/client.crt", "/etc/client.key")
    assert pool.cert_reqs == ssl.CERT_REQUIRED
    assert pool.assert_hostname is False
    assert pool.conn_kw["server_hostname"] == "kubernetes.default.svc"
    assert pool.pool.maxsize == 5  # type: ignore[union-attr]
    assert pool.retries is configuration.retries
    configuration.verify_ssl = False
    unverified = apiserver_pool(new_api_client(configuration))
    assert unverified is not None
    assert unverified.cert_reqs == ssl.CERT_NONE  # type: ignore[attr-defined]


@dataclass
class Pki:
    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    """A CA, a server certificate for kubernetes.default.svc only, a client certificate."""
    if shutil.which("openssl") is None:
        pytest.skip("needs the openssl command")
    base = tmp_path_factory.mktemp("pki")
    curve = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]

    def openssl(*args: str | Path) -> None:
        subprocess.run(["openssl", *map(str, args)], check=True, capture_output=True,
                       timeout=30)

    openssl("req", "-x509", *curve, "-keyout", base / "ca.key", "-out", base / "ca.crt",
            "-days", "1", "-subj", "/CN=test-ca")
    for name, extension in (("server", "subjectAltName=DNS:kubernetes.default.svc"),
                            ("client", "extendedKeyUsage=clientAuth")):
        (base / f"{name}.ext").write_text(extension + "\n")
        openssl("req", *curve, "-keyout", base / f"{name}.key", "-out", base / f"{name}.csr",
                "-subj", f"/CN=himitsu-{name}")
        openssl("x509", "-req", "-in", base / f"{name}.csr", "-CA", base / "ca.crt",
                "-CAkey", base / "ca.key", "-CAcreateserial", "-days", "1",
                "-out", base / f"{name}.crt", "-extfile", base / f"{name}.ext")
    return Pki(base / "ca.crt", base / "server.crt", base / "server.key",
               base / "client.crt", base / "client.key")


class TlsApiServer:
    """Answers every GET with who the client certificate names; requires one."""

    def __init__(self, pki: Pki) -> None:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(pki.server_cert, pki.server_key)
        context.load_verify_locations(pki.ca)
        context.verify_mode = ssl.CERT_REQUIRED

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                peer: Any = self.connection.getpeercert()
                subject = dict(item for rdn in peer["subject"] for item in rdn)
                raw = json.dumps({"client": subject["commonName"],
                                  "auth": self.headers.get("Authorization")}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(raw)))
                self.end_headers()
                self.wfile.write(raw)

        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._server.socket = context.wrap_socket(self._server.socket, server_side=True)
        self._thread = threading.Thread(target=self._server.serve_forever, args=(0.05,),
                                        daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self._server.server_address[1]}"

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)


@pytest.fixture
def tls_server(pki: Pki) -> Iterator[TlsApiServer]:
    server = TlsApiServer(pki)
    yield server
    server.stop()


def tls_rest(url: str, pki: Pki, **settings: Any) -> RestClient:
    configuration = k8s.Configuration(host=url)
    configuration.api_key = {"BearerToken": TOKEN}
    configuration.api_key_prefix = {"BearerToken": "Bearer"}
    configuration.proxy = None
    configuration.cert_file = str(pki.client_cert)
    configuration.key_file = str(pki.client_key)
    for name, value in settings.items():
        setattr(configuration, name, value)
    return RestClient(new_api_client(configuration, pool_maxsize=2))


def test_tls_with_ca_client_certificate_and_server_name(tls_server: TlsApiServer,
                                                        pki: Pki) -> None:
    rest = tls_rest(tls_server.url, pki, ssl_ca_cert=str(pki.ca),
                    tls_server_name="kubernetes.default.svc")
    answer = rest.get(WIDGETS, "a", namespace="ns")
    assert answer == {"client": "himitsu-client", "auth": f"Bearer {TOKEN}"}
    pool = apiserver_pool(rest.api_client)
    assert pool is not None
    assert pool.num_requests == 1  # the lean path, not the client's own


def test_tls_settings_that_must_make_the_handshake_fail(tls_server: TlsApiServer,
                                                        pki: Pki) -> None:
    unknown_ca = tls_rest(tls_server.url, pki, tls_server_name="kubernetes.default.svc")
    with pytest.raises(TransportError, match="CERTIFICATE_VERIFY_FAILED"):
        unknown_ca.get(WIDGETS, "a", namespace="ns", timeout=5.0)
    wrong_name = tls_rest(tls_server.url, pki, ssl_ca_cert=str(pki.ca))  # 127.0.0.1
    with pytest.raises(TransportError, match="IP address mismatch"):
        wrong_name.get(WIDGETS, "a", namespace="ns", timeout=5.0)


@pytest.mark.filterwarnings("ignore::urllib3.exceptions.InsecureRequestWarning")
def test_tls_verify_off_and_hostname_check_off(tls_server: TlsApiServer, pki: Pki) -> None:
    unverified = tls_rest(tls_server.url, pki, verify_ssl=False)
    assert unverified.get(WIDGETS, "a", namespace="ns")["client"] == "himitsu-client"
    any_name = tls_rest(tls_server.url, pki, ssl_ca_cert=str(pki.ca), assert_hostname=False)
    assert any_name.get(WIDGETS, "a", namespace="ns")["client"] == "himitsu-client"


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
    api_client.rest_client.pool_manager = urllib3.PoolManager(  # drop any environment proxy
        **api_client.rest_client.pool_manager.connection_pool_kw)
    answer = RestClient(api_client).get(WIDGETS, "a", namespace="ns")
    assert answer == {"client": "himitsu-client", "auth": None}
    FakeApiServer.close_client(api_client)
