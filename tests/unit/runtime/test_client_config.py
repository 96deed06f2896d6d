"""The configuration: its sources in kubectl's order, the in-cluster account, a kubeconfig.

In-cluster is ours: the service's address, the CA, the token file re-read as it rotates.
A kubeconfig goes through the ``kubernetes`` package's loader: what it hands over (the
token, client certificates, the CA, tls-server-name, insecure-skip-tls-verify, a proxy)
must reach the wire, and failures are one line naming the source, never a credential.
"""

from __future__ import annotations

import base64
import sys
from pathlib import Path
from typing import Any

import pytest
import urllib3
import yaml
from fake_apiserver import FakeApiServer
from tls_server import Pki, TlsApiServer

from himitsu_controller.runtime.client import config as kubeconfig
from himitsu_controller.runtime.client.config import TokenFile
from himitsu_controller.runtime.client.rest import (
    ApiError,
    ClientConfig,
    ConfigError,
    Resource,
    RestClient,
    TransportError,
    load_api_client,
    load_client_config,
    new_api_client,
)

WIDGETS = Resource("example.io", "v1", "widgets")
SECRETISH = "hunter2-secret-0123456789abcdef"


@pytest.fixture(autouse=True)
def no_ambient_config(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """No KUBECONFIG, not in a pod, an empty HOME, no proxy: every source is the test's."""
    for name in ("KUBECONFIG", "KUBERNETES_SERVICE_HOST", "KUBERNETES_SERVICE_PORT",
                 "HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "NO_PROXY",
                 "no_proxy"):
        monkeypatch.delenv(name, raising=False)
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setattr(kubeconfig, "SERVICE_ACCOUNT_TOKEN_PATH", str(tmp_path / "no-token"))
    return home


def write_config(path: Path, *, server: str = "http://127.0.0.1:1", cluster: Any = None,
                 user: Any = None, context: str = "test", names: str = "test") -> str:
    """A kubeconfig with one cluster, user and context (all named ``names``)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    document = {
        "apiVersion": "v1", "kind": "Config", "current-context": context,
        "clusters": [{"name": names, "cluster": cluster or {"server": server}}],
        "users": [{"name": names, "user": {"token": "kubeconfig-token"} if user is None
                   else user}],
        "contexts": [{"name": context, "context": {"cluster": names, "user": names}}]}
    path.write_text(yaml.safe_dump(document))
    return str(path)


def authorization(config: Any) -> str | None:
    value: str | None = config.credentials.current().authorization
    return value


def data(path: Path) -> str:
    return base64.b64encode(path.read_bytes()).decode()


# Sources and their order.

def test_explicit_kubeconfig_wins_over_the_environment(tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KUBECONFIG", write_config(tmp_path / "env", server="http://127.0.0.2:1"))
    explicit = write_config(tmp_path / "explicit", server="http://127.0.0.3:1")
    client = load_api_client(explicit, pool_maxsize=7)
    assert client.host == "http://127.0.0.3:1"
    pool, _ = client.connection()
    assert pool is not None
    assert pool.pool.maxsize == 7  # type: ignore[union-attr]
    assert authorization(client.config) == "Bearer kubeconfig-token"


def test_kubeconfig_env_var_then_default_file(no_ambient_config: Path, tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    write_config(no_ambient_config / ".kube" / "config", server="http://127.0.0.4:1")
    assert load_client_config().host == "http://127.0.0.4:1"
    monkeypatch.setenv("KUBECONFIG", write_config(tmp_path / "env", server="http://127.0.0.2:1"))
    assert load_client_config().host == "http://127.0.0.2:1"


def in_cluster(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, pki: Pki, *,
               host: str = "10.0.0.1") -> Path:
    token_file = tmp_path / "sa" / "token"
    token_file.parent.mkdir()
    token_file.write_text("sa-token-1\n")
    monkeypatch.setattr(kubeconfig, "SERVICE_ACCOUNT_TOKEN_PATH", str(token_file))
    monkeypatch.setattr(kubeconfig, "SERVICE_ACCOUNT_CA_PATH", str(pki.ca))
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", host)
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", "443")
    return token_file


def test_in_cluster_before_default_file(no_ambient_config: Path, tmp_path: Path, pki: Pki,
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    write_config(no_ambient_config / ".kube" / "config", server="http://127.0.0.4:1")
    in_cluster(tmp_path, monkeypatch, pki)
    config = load_client_config()
    assert (config.host, config.ca_file) == ("https://10.0.0.1:443", str(pki.ca))
    assert authorization(config) == "Bearer sa-token-1"
    assert isinstance(config.credentials, TokenFile)


def test_in_cluster_ipv6_host_is_bracketed(tmp_path: Path, pki: Pki,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    in_cluster(tmp_path, monkeypatch, pki, host="fd00:10:96::1")
    client = load_api_client()
    assert client.host == "https://[fd00:10:96::1]:443"
    pool, _ = client.connection()
    assert pool is not None
    assert (pool.host, pool.port) == ("fd00:10:96::1", 443)


def test_no_configuration_anywhere() -> None:
    with pytest.raises(ConfigError, match="no Kubernetes configuration"):
        load_client_config()


# Failures: one line, the source named, never a credential.

@pytest.mark.parametrize("text", [
    f"apiVersion: v1\nusers:\n- name: u\n  user: {{token: {SECRETISH}}}\n",  # no context
    f"current-context: x\nusers: [{{name: u, user: {{token: {SECRETISH}}}}}]\n",
    f"users: [{{name: u, user: {{token: {SECRETISH}\n",  # not YAML
    "current-context: c\nclusters: [{name: c, cluster: {server: 'http://x',"
    f" certificate-authority-data: '{SECRETISH}!'}}]\nusers: []\n"
    "contexts: [{name: c, context: {cluster: c}}]\n",  # not base64
])
def test_a_broken_kubeconfig_is_a_one_line_config_error(tmp_path: Path, text: str) -> None:
    broken = tmp_path / "broken"
    broken.write_text(text)
    with pytest.raises(ConfigError) as info:
        load_client_config(str(broken))
    message = str(info.value)
    assert str(broken) in message
    assert "\n" not in message
    assert "hunter2" not in message


def test_a_missing_explicit_kubeconfig(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="No such file"):
        load_client_config(str(tmp_path / "none"))


# Tokens.

def test_token_file_rotation(tmp_path: Path) -> None:
    """A bound ServiceAccount token (in-cluster, or a kubeconfig tokenFile) is rotated
    by the kubelet: the new one is used within a minute, and at once after a 401."""
    token_file = tmp_path / "token"
    token_file.write_text("t1")
    now = [0.0]
    credentials = TokenFile(str(token_file), clock=lambda: now[0])
    first = credentials.current()
    token_file.write_text("t2\n")
    now[0] = 59.0
    assert credentials.current().authorization == "Bearer t1"
    now[0] = 60.0
    assert credentials.current().authorization == "Bearer t2"
    token_file.write_text("t3")
    credentials.refused(first)  # a 401 for a token no longer in use: no re-read
    assert credentials.current().authorization == "Bearer t2"
    credentials.refused(credentials.current())
    assert credentials.current().authorization == "Bearer t3"
    token_file.unlink()  # mid-rotation: the last token is kept
    now[0] = 200.0
    assert credentials.current().authorization == "Bearer t3"


def test_a_rotated_token_file_reaches_the_wire_at_once_after_a_401(
        tmp_path: Path, server: FakeApiServer) -> None:
    token_file = tmp_path / "token"
    token_file.write_text("sa-token-1")
    server.tokens = {"sa-token-1", "sa-token-2"}
    client = new_api_client(ClientConfig(server.url, credentials=TokenFile(str(token_file))))
    rest = RestClient(client)
    server.put("a")
    rest.get(WIDGETS, "a", namespace="ns")
    token_file.write_text("sa-token-2")
    server.tokens = {"sa-token-2"}  # the old one revoked: a 401 makes it re-read at once
    with pytest.raises(ApiError, match="Unauthorized"):
        rest.get(WIDGETS, "a", namespace="ns")
    rest.get(WIDGETS, "a", namespace="ns")
    assert [r.headers["authorization"] for r in server.requests] == [
        "Bearer sa-token-1", "Bearer sa-token-1", "Bearer sa-token-2"]


# TLS from a kubeconfig.

def test_relative_ca_and_client_certificate_files(tls_server: TlsApiServer, pki: Pki,
                                                  tmp_path: Path) -> None:
    directory = tmp_path / "kube"
    directory.mkdir()
    for source, name in ((pki.ca, "ca.crt"), (pki.client_cert, "me.crt"),
                         (pki.client_key, "me.key")):
        (directory / name).write_bytes(source.read_bytes())
    path = write_config(directory / "config", cluster={
        "server": tls_server.url, "certificate-authority": "ca.crt",
        "tls-server-name": "kubernetes.default.svc"},
        user={"client-certificate": "me.crt", "client-key": "me.key"})
    answer = RestClient(load_api_client(path)).get(WIDGETS, "a", namespace="ns")
    assert answer == {"client": "himitsu-client", "auth": None}


def test_without_tls_server_name_the_name_is_checked(tls_server: TlsApiServer, pki: Pki,
                                                     tmp_path: Path) -> None:
    cluster = {"server": tls_server.url, "certificate-authority-data": data(pki.ca)}
    user = {"client-certificate-data": data(pki.client_cert),
            "client-key-data": data(pki.client_key)}
    rest = RestClient(load_api_client(write_config(tmp_path / "c", cluster=cluster, user=user),
                                      retries=0))
    with pytest.raises(TransportError, match="IP address mismatch"):
        rest.get(WIDGETS, "a", namespace="ns", timeout=5.0)


@pytest.mark.filterwarnings("ignore::urllib3.exceptions.InsecureRequestWarning")
def test_insecure_skip_tls_verify(tls_server: TlsApiServer, pki: Pki, tmp_path: Path) -> None:
    path = write_config(tmp_path / "c", cluster={"server": tls_server.url,
                                                 "insecure-skip-tls-verify": True},
                        user={"client-certificate-data": data(pki.client_cert),
                              "client-key-data": data(pki.client_key)})
    assert RestClient(load_api_client(path)).get(WIDGETS, "a", namespace="ns")["client"] \
        == "himitsu-client"


def test_a_key_that_is_not_a_key_is_a_config_error(tmp_path: Path, pki: Pki) -> None:
    path = write_config(tmp_path / "c", cluster={"server": "https://127.0.0.1:1"},
                        user={"client-certificate-data": data(pki.client_cert),
                              "client-key-data": base64.b64encode(b"not a key").decode()})
    with pytest.raises(ConfigError, match="client certificate or key") as info:
        load_api_client(path)
    assert "not a key" not in str(info.value)


# Proxies.

def test_proxy_url_and_the_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = write_config(tmp_path / "c", cluster={"server": "https://10.1.2.3:6443",
                                                 "proxy-url": "http://u:p@proxy.test:3128"})
    _, manager = load_api_client(path).connection()
    assert isinstance(manager, urllib3.ProxyManager)
    assert (manager.proxy.host, manager.proxy.auth) == ("proxy.test", None)  # type: ignore[union-attr]
    assert manager.proxy_headers["proxy-authorization"].startswith("Basic ")
    monkeypatch.setenv("HTTPS_PROXY", "http://env-proxy.test:8080")
    plain = write_config(tmp_path / "d", server="https://10.1.2.3:6443")
    assert load_client_config(plain).proxy == "http://env-proxy.test:8080"
    monkeypatch.setenv("NO_PROXY", "example.com,10.0.0.0/8")
    assert load_client_config(plain).proxy is None


def test_a_socks_proxy_is_refused_clearly(tmp_path: Path) -> None:
    path = write_config(tmp_path / "c", cluster={"server": "https://10.1.2.3:6443",
                                                 "proxy-url": "socks5://proxy.test:1080"})
    with pytest.raises(ConfigError, match="SOCKS proxies are not supported"):
        load_api_client(path)


# Without the kubernetes package (the image's case): in-cluster works, a kubeconfig says why not.

def test_without_the_kubernetes_package_a_kubeconfig_is_a_one_line_config_error(
        tmp_path: Path, pki: Pki, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in [m for m in sys.modules if m == "kubernetes" or m.startswith("kubernetes.")]:
        monkeypatch.setitem(sys.modules, name, None)
    monkeypatch.setitem(sys.modules, "kubernetes", None)
    with pytest.raises(ConfigError) as info:
        load_client_config(write_config(tmp_path / "c"))
    assert str(info.value) == kubeconfig.NO_KUBERNETES
    in_cluster(tmp_path, monkeypatch, pki)
    assert load_client_config().host == "https://10.0.0.1:443"
