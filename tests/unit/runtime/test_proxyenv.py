"""Which apiserver requests go through a proxy, and what a proxy sees of them.

The environment's proxy is read as client-go (Go's httpproxy) reads it: NO_PROXY's
``*``, domains (themselves and their subdomains), ``.domain`` and ``*.domain``
(subdomains only), an optional port, IPs and CIDRs; loopback never goes through a proxy.
Through a proxy, an https apiserver is reached by CONNECT: the token and the TLS name
check are end to end.
"""

from __future__ import annotations

import base64
import select
import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from tls_server import Pki, TlsApiServer

from himitsu_controller.runtime.client import kubeconfig
from himitsu_controller.runtime.client.rest import (
    Resource,
    RestClient,
    TransportError,
    load_api_client,
)

WIDGETS = Resource("example.io", "v1", "widgets")
PROXY = "http://proxy.test:3128"


@pytest.fixture(autouse=True)
def no_ambient_proxy(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("KUBECONFIG", "HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy",
                 "NO_PROXY", "no_proxy"):
        monkeypatch.delenv(name, raising=False)


def proxy_for(monkeypatch: pytest.MonkeyPatch, server: str, no_proxy: str) -> str | None:
    monkeypatch.setenv("HTTPS_PROXY", PROXY)
    monkeypatch.setenv("HTTP_PROXY", PROXY)
    monkeypatch.setenv("NO_PROXY", no_proxy)
    return kubeconfig.environment_proxy(server)


@pytest.mark.parametrize(("no_proxy", "server"), [
    ("*", "https://api.corp.example:6443"),
    ("corp.example", "https://corp.example:6443"),  # a domain: itself
    ("corp.example", "https://api.corp.example:6443"),  # and its subdomains
    ("*.corp.example", "https://api.corp.example:6443"),  # Go strips the "*"
    (".corp.example", "https://api.corp.example:6443"),
    ("corp.example:6443", "https://api.corp.example:6443"),  # a domain with its port
    ("other.test, API.Corp.Example ", "https://api.corp.example:6443"),  # trimmed, any case
    ("10.0.0.0/8", "https://10.1.2.3:6443"),
    ("10.1.2.3", "https://10.1.2.3:6443"),
    ("10.1.2.3:6443", "https://10.1.2.3:6443"),
    ("fd00::/8", "https://[fd00::1]:6443"),
    ("[fd00::1]:6443", "https://[fd00::1]:6443"),
    ("corp.example:443", "https://api.corp.example"),  # the scheme's default port
    ("corp.example:80", "http://api.corp.example/prefix"),
])
def test_no_proxy_entries_go_understands_bypass_the_proxy(
        monkeypatch: pytest.MonkeyPatch, no_proxy: str, server: str) -> None:
    assert proxy_for(monkeypatch, server, no_proxy) is None


@pytest.mark.parametrize(("no_proxy", "server"), [
    ("", "https://api.corp.example:6443"),
    (".corp.example", "https://corp.example:6443"),  # a leading dot: subdomains only
    ("*.corp.example", "https://corp.example:6443"),
    ("corp.example", "https://notcorp.example:6443"),  # a suffix is not a subdomain
    ("corp.example:443", "https://api.corp.example:6443"),  # another port
    ("10.1.2.3:443", "https://10.1.2.3:6443"),
    ("10.0.0.0/8", "https://11.1.2.3:6443"),
    ("fd00::/8", "https://10.1.2.3:6443"),  # another family
    ("not a cidr/8", "https://10.1.2.3:6443"),
])
def test_other_servers_go_through_the_proxy(monkeypatch: pytest.MonkeyPatch, no_proxy: str,
                                            server: str) -> None:
    assert proxy_for(monkeypatch, server, no_proxy) == PROXY


@pytest.mark.parametrize("server", ["https://127.0.0.1:6443", "https://127.9.8.7:6443",
                                    "https://localhost:6443", "https://LocalHost:6443",
                                    "https://[::1]:6443", "http://127.0.0.1:8080"])
def test_loopback_is_never_proxied(monkeypatch: pytest.MonkeyPatch, server: str) -> None:
    """Go's ProxyFromEnvironment never proxies localhost or a loopback address."""
    assert proxy_for(monkeypatch, server, "") is None


def test_a_proxy_without_a_scheme_is_http(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HTTPS_PROXY", "proxy.test:3128")
    assert kubeconfig.environment_proxy("https://10.1.2.3:6443") == PROXY


# Through a proxy.

def write_config(path: Path, cluster: dict[str, Any], user: dict[str, Any]) -> str:
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "t",
        "clusters": [{"name": "t", "cluster": cluster}],
        "users": [{"name": "t", "user": user}],
        "contexts": [{"name": "t", "context": {"cluster": "t", "user": "t"}}]}))
    return str(path)


def b64(path: Path) -> str:
    return base64.b64encode(path.read_bytes()).decode()


class ConnectProxy:
    """An HTTP CONNECT proxy on 127.0.0.1 that records each request head it reads."""

    def __init__(self) -> None:
        self.heads: list[bytes] = []
        self._sock = socket.create_server(("127.0.0.1", 0))
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._sock.getsockname()[1]}"

    def _serve(self) -> None:
        while True:
            try:
                client, _ = self._sock.accept()
            except OSError:
                return
            threading.Thread(target=self._handle, args=(client,), daemon=True).start()

    def _handle(self, client: socket.socket) -> None:
        head = b""
        while b"\r\n\r\n" not in head:
            chunk = client.recv(4096)
            if not chunk:
                client.close()
                return
            head += chunk
        self.heads.append(head)
        line = head.split(b"\r\n", 1)[0].split()
        if line[0] != b"CONNECT":
            client.sendall(b"HTTP/1.1 403 Forbidden\r\nContent-Length: 0\r\n\r\n")
            client.close()
            return
        host, port = line[1].decode().rsplit(":", 1)
        upstream = socket.create_connection((host, int(port)))
        client.sendall(b"HTTP/1.1 200 Connection established\r\n\r\n")
        pair = {client: upstream, upstream: client}
        try:
            while True:
                ready, _, _ = select.select(list(pair), [], [], 5)
                if not ready:
                    return
                for s in ready:
                    data = s.recv(65536)
                    if not data:
                        return
                    pair[s].sendall(data)
        except OSError:
            return
        finally:
            client.close()
            upstream.close()

    def stop(self) -> None:
        self._sock.close()


@pytest.fixture
def proxy() -> Iterator[ConnectProxy]:
    p = ConnectProxy()
    yield p
    p.stop()


def test_through_a_proxy_the_token_is_tunnelled_and_tls_server_name_is_checked(
        tls_server: TlsApiServer, pki: Pki, tmp_path: Path, proxy: ConnectProxy) -> None:
    user = {"token": "secret-bearer-42", "client-certificate-data": b64(pki.client_cert),
            "client-key-data": b64(pki.client_key)}
    good = write_config(tmp_path / "good", {
        "server": tls_server.url, "certificate-authority-data": b64(pki.ca),
        "tls-server-name": "kubernetes.default.svc", "proxy-url": proxy.url}, user)
    answer = RestClient(load_api_client(good, retries=0)).get(WIDGETS, "a", namespace="n")
    assert answer["auth"] == "Bearer secret-bearer-42"
    bad = write_config(tmp_path / "bad", {
        "server": tls_server.url, "certificate-authority-data": b64(pki.ca),
        "proxy-url": proxy.url}, user)
    with pytest.raises(TransportError):
        RestClient(load_api_client(bad, retries=0)).get(WIDGETS, "a", namespace="n",
                                                        timeout=5.0)
    assert proxy.heads and all(h.startswith(b"CONNECT ") for h in proxy.heads)
    assert not any(b"secret-bearer-42" in h for h in proxy.heads)
