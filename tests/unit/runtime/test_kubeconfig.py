"""The configuration loader: its sources, each kind of credential, TLS from a kubeconfig.

What a real cluster's kubeconfig holds must reach the wire: tokens (fixed, a token file
re-read as it rotates, an exec plugin's until it expires), client certificates (files
found relative to the kubeconfig, or data), the CA, tls-server-name and
insecure-skip-tls-verify, a proxy. And the loader's failures are one line that names the
source and never a credential.
"""

from __future__ import annotations

import base64
import json
import os
import stat
import sys
from pathlib import Path
from typing import Any

import pytest
import structlog
import urllib3
import yaml
from fake_apiserver import Canned, FakeApiServer, status_body
from tls_server import Pki, TlsApiServer

from himitsu_controller.runtime.client import execcredential, kubeconfig
from himitsu_controller.runtime.client.credentials import CredentialError, TokenFile
from himitsu_controller.runtime.client.execcredential import ExecCredentials
from himitsu_controller.runtime.client.rest import (
    ApiError,
    ConfigError,
    Resource,
    RestClient,
    TransportError,
    load_api_client,
    load_client_config,
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


def test_a_kubeconfig_list_is_merged_first_wins(tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    first = write_config(tmp_path / "a" / "config", server="http://127.0.0.1:1", context="a",
                         names="shared")
    second = tmp_path / "b" / "config"
    second.parent.mkdir()
    second.write_text(yaml.safe_dump({
        "current-context": "b",
        "clusters": [{"name": "shared", "cluster": {"server": "http://127.0.0.9:9"}},
                     {"name": "other", "cluster": {"server": "http://127.0.0.5:5"}}],
        "users": [{"name": "shared", "user": {"token": "loses"}},
                  {"name": "other", "user": {"token": "other-token"}}],
        "contexts": [{"name": "a", "context": {"cluster": "other", "user": "other"}},
                     {"name": "b", "context": {"cluster": "other", "user": "other"}}]}))
    missing = str(tmp_path / "missing")
    monkeypatch.setenv("KUBECONFIG", os.pathsep.join([missing, first, str(second)]))
    config = load_client_config()
    assert (config.host, authorization(config)) == ("http://127.0.0.1:1",
                                                    "Bearer kubeconfig-token")
    monkeypatch.setenv("KUBECONFIG", os.pathsep.join([str(second), first]))
    config = load_client_config()
    assert (config.host, authorization(config)) == ("http://127.0.0.5:5", "Bearer other-token")
    monkeypatch.setenv("KUBECONFIG", missing)
    with pytest.raises(ConfigError, match="none of its files exists"):
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

def test_a_token_file_takes_precedence_and_is_reread(tmp_path: Path) -> None:
    token_file = tmp_path / "kc" / "token"
    token_file.parent.mkdir()
    token_file.write_text("file-token-1")
    path = write_config(tmp_path / "kc" / "config",
                        user={"token": "fixed", "tokenFile": "token"})  # relative path
    credentials = load_client_config(path).credentials
    assert isinstance(credentials, TokenFile)
    assert credentials.path == str(token_file)
    assert credentials.current().authorization == "Bearer file-token-1"


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


def test_an_unreadable_token_file_without_a_token(tmp_path: Path) -> None:
    path = write_config(tmp_path / "config", user={"tokenFile": "missing"})
    with pytest.raises(ConfigError, match="tokenFile"):
        load_client_config(path)


def test_a_rotated_token_file_reaches_the_wire_at_once_after_a_401(
        tmp_path: Path, server: FakeApiServer) -> None:
    token_file = tmp_path / "token"
    token_file.write_text("sa-token-1")
    server.tokens = {"sa-token-1", "sa-token-2"}
    client = load_api_client(write_config(tmp_path / "kc", server=server.url,
                                          user={"tokenFile": str(token_file)}))
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


# Exec credential plugins.

PLUGIN = """#!{python}
import json, os, pathlib, sys
here = pathlib.Path(__file__).parent
runs = here / "runs"
n = int(runs.read_text()) + 1 if runs.exists() else 1
runs.write_text(str(n))
info = json.loads(os.environ["KUBERNETES_EXEC_INFO"])
(here / "seen.json").write_text(json.dumps({{"info": info, "args": sys.argv[1:],
                                            "env": os.environ.get("PLUGIN_ENV")}}))
mode = os.environ.get("PLUGIN_MODE", "token")
if mode == "fail":
    print(json.dumps({{"status": {{"token": "stdout-token-0123456789abcdefghij"}}}}))
    sys.stderr.write("boom: the identity provider said no\\n"
                     "cached eyJhbGciOiJSUzI1NiJ9.c2VjcmV0LXRva2Vu.c2lnbmF0dXJl\\n")
    sys.exit(3)
status = {{}}
if mode in ("token", "both"):
    status["token"] = f"exec-token-{{n}}"
if mode in ("cert", "both"):
    status["clientCertificateData"] = pathlib.Path(os.environ["CERT"]).read_text()
    status["clientKeyData"] = pathlib.Path(os.environ["KEY"]).read_text()
if os.environ.get("EXPIRES"):
    status["expirationTimestamp"] = os.environ["EXPIRES"]
print(json.dumps({{"apiVersion": info["apiVersion"], "kind": "ExecCredential",
                  "status": status}}))
"""


def plugin(directory: Path) -> Path:
    script = directory / "bin" / "fake-plugin"
    script.parent.mkdir(parents=True)
    script.write_text(PLUGIN.format(python=sys.executable))
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return script


def exec_user(api_version: str = "client.authentication.k8s.io/v1", **env: str,
              ) -> dict[str, Any]:
    return {"exec": {"apiVersion": api_version, "command": "./bin/fake-plugin",
                     "args": ["get-token", "--cluster", "c1"], "interactiveMode": "Never",
                     "env": [{"name": k, "value": v} for k, v in env.items()]}}


def runs(directory: Path) -> int:
    return int((directory / "bin" / "runs").read_text())


@pytest.mark.parametrize("api_version", execcredential.API_VERSIONS)
def test_an_exec_token_is_cached_until_shortly_before_it_expires(tmp_path: Path,
                                                                 api_version: str) -> None:
    plugin(tmp_path)
    path = write_config(tmp_path / "config", user=exec_user(
        api_version, PLUGIN_ENV="from-kubeconfig", EXPIRES="2030-01-01T00:00:00Z"))
    spec = load_client_config(path).credentials.spec  # type: ignore[attr-defined]
    expiry = 1893456000.0  # 2030-01-01T00:00:00Z
    now = [expiry - 3600]
    credentials = ExecCredentials(spec, clock=lambda: now[0])
    assert credentials.current().authorization == "Bearer exec-token-1"
    now[0] = expiry - 11
    assert credentials.current().authorization == "Bearer exec-token-1"
    assert runs(tmp_path) == 1
    now[0] = expiry - 9  # within the leeway: run again before it expires
    assert credentials.current().authorization == "Bearer exec-token-2"
    seen = json.loads((tmp_path / "bin" / "seen.json").read_text())
    assert seen["info"] == {"apiVersion": api_version, "kind": "ExecCredential",
                            "spec": {"interactive": False}}
    assert (seen["args"], seen["env"]) == (["get-token", "--cluster", "c1"], "from-kubeconfig")


def test_an_exec_token_reaches_the_wire_and_a_401_runs_the_plugin_again(
        tmp_path: Path, server: FakeApiServer) -> None:
    plugin(tmp_path)
    server.tokens = {"exec-token-1", "exec-token-2"}
    rest = RestClient(load_api_client(write_config(tmp_path / "config", server=server.url,
                                                   user=exec_user())))
    server.put("a")
    rest.get(WIDGETS, "a", namespace="ns")
    rest.get(WIDGETS, "a", namespace="ns")
    assert runs(tmp_path) == 1  # no expiry: kept
    server.canned.append(Canned(401, status_body(401, "Unauthorized", "token revoked")))
    with pytest.raises(ApiError, match="Unauthorized"):
        rest.get(WIDGETS, "a", namespace="ns")
    rest.get(WIDGETS, "a", namespace="ns")
    assert runs(tmp_path) == 2
    assert [r.headers["authorization"] for r in server.requests] == [
        "Bearer exec-token-1"] * 3 + ["Bearer exec-token-2"]


def test_an_exec_client_certificate_is_presented(tls_server: TlsApiServer, pki: Pki,
                                                 tmp_path: Path) -> None:
    plugin(tmp_path)
    path = write_config(tmp_path / "config", cluster={
        "server": tls_server.url, "certificate-authority-data": data(pki.ca),
        "tls-server-name": "kubernetes.default.svc"},
        user=exec_user(PLUGIN_MODE="cert", CERT=str(pki.client_cert), KEY=str(pki.client_key)))
    answer = RestClient(load_api_client(path)).get(WIDGETS, "a", namespace="ns")
    assert answer == {"client": "himitsu-client", "auth": None}


def test_a_failing_plugin_says_why_without_its_credential(tmp_path: Path) -> None:
    plugin(tmp_path)
    config = load_client_config(write_config(tmp_path / "config",
                                             user=exec_user(PLUGIN_MODE="fail")))
    with pytest.raises(CredentialError) as info:
        config.credentials.current()
    message = str(info.value)
    assert "fake-plugin exited with 3" in message
    assert "boom: the identity provider said no" in message
    assert "stdout-token" not in message
    assert "eyJhbGciOiJSUzI1NiJ9" not in message
    assert "get-token" not in message  # the arguments may hold secrets
    assert "\n" not in message


def test_a_missing_plugin_is_a_config_error_with_its_install_hint(tmp_path: Path) -> None:
    user = {"exec": {"apiVersion": "client.authentication.k8s.io/v1beta1",
                     "command": "no-such-plugin-here",
                     "installHint": "install it with\n  brew install no-such-plugin"}}
    with pytest.raises(ConfigError, match=r"not found \(install it with brew install"):
        load_client_config(write_config(tmp_path / "config", user=user))


def test_a_plugin_that_vanished_is_a_credential_error(tmp_path: Path) -> None:
    script = plugin(tmp_path)
    config = load_client_config(write_config(tmp_path / "config", user=exec_user()))
    script.unlink()
    with pytest.raises(CredentialError, match="not found"):
        config.credentials.current()


def test_a_plugin_answer_that_is_not_an_exec_credential(tmp_path: Path) -> None:
    spec = execcredential.ExecSpec("client.authentication.k8s.io/v1", "true")
    for stdout, why in ((b"token: " + SECRETISH.encode(), "not JSON"),
                        (json.dumps({"kind": "ExecCredential",
                                     "apiVersion": "client.authentication.k8s.io/v1beta1",
                                     "status": {"token": SECRETISH}}).encode(), "apiVersion"),
                        (json.dumps({"kind": "ExecCredential",
                                     "apiVersion": "client.authentication.k8s.io/v1",
                                     "status": {}}).encode(), "neither a token")):
        def run(*args: Any, out: bytes = stdout, **kwargs: Any) -> Any:
            import subprocess  # noqa: PLC0415
            return subprocess.CompletedProcess(args, 0, out, b"")
        with pytest.raises(CredentialError, match=why) as info:
            ExecCredentials(spec, run=run).current()
        assert "hunter2" not in str(info.value)


# What we leave to the kubernetes package.

def test_username_and_password_go_through_the_kubernetes_loader(
        tmp_path: Path, server: FakeApiServer) -> None:
    path = write_config(tmp_path / "config", server=server.url,
                        user={"username": "admin", "password": "pw"})
    with structlog.testing.capture_logs() as logs:
        rest = RestClient(load_api_client(path))
    assert [e["uses"] for e in logs if "kubernetes package" in e["event"]] == [
        "username/password"]
    with pytest.raises(ApiError, match="Unauthorized"):  # the fake knows bearer tokens only
        rest.get(WIDGETS, "a", namespace="ns")
    expected = "Basic " + base64.b64encode(b"admin:pw").decode()
    assert server.requests[0].headers["authorization"] == expected


def test_a_failed_plugin_is_not_run_again_for_every_request(tmp_path: Path) -> None:
    plugin(tmp_path)
    config = load_client_config(write_config(tmp_path / "config",
                                             user=exec_user(PLUGIN_MODE="fail")))
    spec = config.credentials.spec  # type: ignore[attr-defined]
    now = [1000.0]
    credentials = ExecCredentials(spec, clock=lambda: now[0])
    for _ in range(3):
        with pytest.raises(CredentialError, match="exited with 3"):
            credentials.current()
    assert runs(tmp_path) == 1
    now[0] += execcredential.FAILURE_BACKOFF
    with pytest.raises(CredentialError):
        credentials.current()
    assert runs(tmp_path) == 2


def test_a_kubeconfig_of_the_wrong_shape_is_a_config_error(tmp_path: Path) -> None:
    path = tmp_path / "config"
    path.write_text("current-context: c\ncontexts: [{name: c, context: {cluster: c}}]\n"
                    "clusters: [{name: c, cluster: {server: http://x}}]\n"
                    "users: []\n")
    assert load_client_config(str(path)).host == "http://x"
    path.write_text("current-context: c\ncontexts: [{name: c, context: {cluster: c, "
                    "user: u}}]\nclusters: [{name: c, cluster: {server: http://x}}]\n"
                    "users: [{name: u, user: {exec: {apiVersion: "
                    "client.authentication.k8s.io/v1, command: 'true', env: 3}}}]\n")
    with pytest.raises(ConfigError, match="malformed kubeconfig"):
        load_client_config(str(path))


# Values of the wrong type or with a line break.

@pytest.mark.parametrize("value", ["false", "False", "no", 0, "true", 1])
def test_insecure_skip_tls_verify_must_be_a_boolean(tmp_path: Path, value: Any) -> None:
    """client-go's field is a bool: the *string* "false" must never turn verification off."""
    path = write_config(tmp_path / "c", cluster={"server": "https://10.1.2.3:6443",
                                                 "insecure-skip-tls-verify": value})
    with pytest.raises(ConfigError, match="insecure-skip-tls-verify is not a boolean"):
        load_client_config(path)
    for flag, verify in ((False, True), (True, False)):
        path = write_config(tmp_path / "c", cluster={"server": "https://10.1.2.3:6443",
                                                     "insecure-skip-tls-verify": flag})
        assert load_client_config(path).verify is verify


@pytest.mark.parametrize(("field", "value", "why"), [
    ("provideClusterInfo", "false", "provideClusterInfo is not a boolean"),
    ("interactiveMode", "never", "interactiveMode is not one of"),
])
def test_exec_fields_of_the_wrong_type_are_config_errors(tmp_path: Path, field: str,
                                                         value: str, why: str) -> None:
    plugin(tmp_path)
    user = exec_user()
    user["exec"][field] = value
    with pytest.raises(ConfigError, match=why):
        load_client_config(write_config(tmp_path / "config", user=user))


def test_a_token_with_a_line_break_around_it_is_trimmed(tmp_path: Path,
                                                         server: FakeApiServer) -> None:
    """``token: |`` keeps a trailing newline; kubectl trims it, and a header cannot hold it
    (http.client's error would quote the token)."""
    path = write_config(tmp_path / "c", server=server.url,
                        user={"token": f"{SECRETISH}\n"})
    server.tokens = {SECRETISH}
    server.put("a")
    RestClient(load_api_client(path, retries=0), max_retries=0).get(WIDGETS, "a",
                                                                     namespace="ns")
    assert server.requests[-1].headers["authorization"] == f"Bearer {SECRETISH}"


def test_a_token_with_a_control_character_inside_is_a_config_error(tmp_path: Path) -> None:
    path = write_config(tmp_path / "c", user={"token": f"{SECRETISH}\nX-Injected: 1"})
    with pytest.raises(ConfigError, match=r"user\.token contains a control character") as info:
        load_client_config(path)
    assert "hunter2" not in str(info.value)
    token_file = tmp_path / "token"
    token_file.write_text(f"{SECRETISH}\r\nX-Injected: 1\n")
    with pytest.raises(ValueError, match="contains a control character") as error:
        TokenFile(str(token_file))
    assert "hunter2" not in str(error.value)


def test_no_secret_in_the_repr_of_the_configuration(tmp_path: Path) -> None:
    """A proxy password or an exec plugin's env value or argument must not show in a repr
    (a traceback with locals, a debug log of the configuration)."""
    plugin(tmp_path)
    user = exec_user(CLIENT_SECRET="env-secret-42")
    user["exec"]["args"] = ["--secret", "arg-secret-42"]
    path = write_config(tmp_path / "c", cluster={
        "server": "https://10.1.2.3:6443", "proxy-url": "http://u:proxy-pass-42@proxy.test:1"},
        user=user)
    config = load_client_config(path)
    text = repr(config) + repr(config.credentials.spec)  # type: ignore[attr-defined]
    for secret in ("proxy-pass-42", "arg-secret-42", "env-secret-42"):
        assert secret not in text


def test_provide_cluster_info_carries_the_ca_and_the_proxy_in_use(
        tmp_path: Path, pki: Pki, monkeypatch: pytest.MonkeyPatch) -> None:
    """client-go's ConfigToExecCluster: certificate-authority-data from the CA data or
    file, proxy-url the proxy in use (the environment's too). Plugins (pinniped,
    kubelogin) reach the cluster's own identity endpoint with them."""
    plugin(tmp_path)
    (tmp_path / "ca.crt").write_bytes(pki.ca.read_bytes())
    monkeypatch.setenv("HTTPS_PROXY", "http://proxy.test:3128")
    user = exec_user()
    user["exec"]["provideClusterInfo"] = True
    path = write_config(tmp_path / "config", cluster={
        "server": "https://10.1.2.3:6443", "certificate-authority": "ca.crt",
        "tls-server-name": "kubernetes.default.svc", "insecure-skip-tls-verify": False},
        user=user)
    spec = load_client_config(path).credentials.spec  # type: ignore[attr-defined]
    assert json.loads(spec.exec_info())["spec"]["cluster"] == {
        "server": "https://10.1.2.3:6443", "tls-server-name": "kubernetes.default.svc",
        "certificate-authority-data": data(pki.ca), "proxy-url": "http://proxy.test:3128"}
