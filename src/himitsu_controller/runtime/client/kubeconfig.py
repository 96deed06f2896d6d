"""Loading the Kubernetes client configuration: kubeconfig files or the in-cluster account.

The sources, in the order of kubectl and controller-runtime: ``--kubeconfig`` (one file),
``$KUBECONFIG`` (a colon-separated list, merged as kubectl does: the first file to name a
cluster, user or context, or to set current-context, wins; missing files are skipped),
the in-cluster ServiceAccount, ``~/.kube/config``. Relative paths in a file are resolved
against that file's directory.

Of a kubeconfig, what real clusters use: the current context's cluster (``server``,
``certificate-authority(-data)``, ``insecure-skip-tls-verify``, ``tls-server-name``,
``proxy-url``; without proxy-url, HTTPS_PROXY/HTTP_PROXY unless NO_PROXY matches, see
``proxyenv.py``) and user (``token``, trimmed, ``tokenFile`` re-read like client-go,
which takes precedence over ``token``, ``client-certificate(-data)``/``client-key(-data)``,
``exec`` plugins). Boolean fields must be YAML booleans (client-go's are bools: the
string "false" is an error, never true). A
user's legacy ``auth-provider`` or ``username``/``password`` is handed to the
``kubernetes`` package's loader, imported only then (``legacyauth.py``), and logged.

In-cluster: ``https://$KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT`` (an IPv6
address bracketed), the ServiceAccount's CA, and its token file re-read once a minute
and after a 401 (bound tokens rotate).

Every failure is a ``ConfigError``: one line naming the source, never a credential.
"""

from __future__ import annotations

import base64
import binascii
import os
import shutil
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import structlog
import yaml

from himitsu_controller.runtime.client.credentials import (
    Auth,
    Credentials,
    StaticCredentials,
    TokenFile,
    has_control_character,
)
from himitsu_controller.runtime.client.errors import describe_exception
from himitsu_controller.runtime.client.execcredential import API_VERSIONS, ExecCredentials, ExecSpec
from himitsu_controller.runtime.client.httpclient import ClientConfig, ConfigError, HttpClient
from himitsu_controller.runtime.client.proxyenv import environment_proxy

__all__ = ["ConfigError", "environment_proxy", "load_api_client", "load_client_config",
           "new_api_client"]

log = structlog.get_logger(__name__)

# Module attributes (not constants inlined in the loader) so tests can point them at
# temporary files.
SERVICE_ACCOUNT_TOKEN_PATH = "/var/run/secrets/kubernetes.io/serviceaccount/token"  # noqa: S105 (a path)
SERVICE_ACCOUNT_CA_PATH = "/var/run/secrets/kubernetes.io/serviceaccount/ca.crt"
_SAFE_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
_NAMED = {"clusters": "cluster", "users": "user", "contexts": "context"}


def load_api_client(kubeconfig: str | None = None, *, pool_maxsize: int = 32,
                    retries: int = 3) -> HttpClient:
    """A client for the configured apiserver (see ``load_client_config``).

    ``pool_maxsize`` bounds the kept-alive connections: every open watch holds one for
    its life, so size it to watches + workers + a few. ``retries``: see ``new_retry``.
    """
    return new_api_client(load_client_config(kubeconfig), pool_maxsize=pool_maxsize,
                          retries=retries)


def new_api_client(config: ClientConfig, *, pool_maxsize: int = 32,
                   retries: int = 3) -> HttpClient:
    """A client on ``config``; ConfigError (naming the source) if its TLS material is bad."""
    try:
        return HttpClient(config, pool_maxsize=pool_maxsize, retries=retries)
    except ConfigError as exc:
        raise ConfigError(f"cannot load Kubernetes configuration from "
                          f"{config.source or config.host}: {exc}") from None


def load_client_config(kubeconfig: str | None = None) -> ClientConfig:
    """The configuration from the first source there is (see the module docstring)."""
    env = [p for p in os.environ.get("KUBECONFIG", "").split(os.pathsep) if p]
    default = os.path.expanduser("~/.kube/config")
    if kubeconfig:
        source, files = kubeconfig, [kubeconfig]
    elif env:
        source, files = os.environ["KUBECONFIG"], [p for p in env if os.path.exists(p)]
        if not files:
            raise ConfigError(f"KUBECONFIG={source[:200]}: none of its files exists")
    elif _in_cluster():
        source = "in-cluster service account"
        return _wrap(source, _in_cluster_config)
    elif os.path.isfile(default):
        source, files = default, [default]
    else:
        raise ConfigError("no Kubernetes configuration: pass --kubeconfig, set KUBECONFIG,"
                          " run in a pod, or create ~/.kube/config")
    return _wrap(source, lambda: _from_files(files, source))


def _wrap(source: str, load: Any) -> ClientConfig:
    try:
        config: ClientConfig = load()
        return config
    except ConfigError as exc:
        raise ConfigError(f"cannot load Kubernetes configuration from {source}: {exc}"
                          ) from None
    except (TypeError, AttributeError, KeyError) as exc:  # a value of the wrong shape
        raise ConfigError(f"cannot load Kubernetes configuration from {source}: "
                          f"malformed kubeconfig ({type(exc).__name__})") from None
    except (OSError, ValueError, yaml.YAMLError) as exc:
        # str(exc) of these names a file or a position, never the file's content.
        what = type(exc).__name__
        detail = exc.strerror if isinstance(exc, OSError) and exc.strerror else None
        if isinstance(exc, OSError) and exc.filename:
            detail = f"{exc.filename}: {detail or what}"
        if isinstance(exc, yaml.MarkedYAMLError) and exc.problem_mark is not None:
            detail = f"not valid YAML (line {exc.problem_mark.line + 1})"
        raise ConfigError(f"cannot load Kubernetes configuration from {source}: "
                          f"{detail or what}") from None


def _in_cluster() -> bool:
    return bool(os.environ.get("KUBERNETES_SERVICE_HOST")
                and os.environ.get("KUBERNETES_SERVICE_PORT")
                and os.path.isfile(SERVICE_ACCOUNT_TOKEN_PATH))


def _in_cluster_config() -> ClientConfig:
    host = os.environ["KUBERNETES_SERVICE_HOST"]
    port = os.environ["KUBERNETES_SERVICE_PORT"]
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"
    if not os.path.isfile(SERVICE_ACCOUNT_CA_PATH):
        raise ConfigError(f"no CA file at {SERVICE_ACCOUNT_CA_PATH}")
    server = f"https://{host}:{port}"
    return ClientConfig(host=server, credentials=TokenFile(SERVICE_ACCOUNT_TOKEN_PATH),
                        ca_file=SERVICE_ACCOUNT_CA_PATH, proxy=environment_proxy(server),
                        source="in-cluster service account")


@dataclass
class _Entry:
    value: Mapping[str, Any]
    base: str  # the directory of the file that defined it


def _from_files(files: list[str], source: str) -> ClientConfig:
    named: dict[str, dict[str, _Entry]] = {kind: {} for kind in _NAMED}
    current = ""
    for path in files:
        with open(path, encoding="utf-8") as file:
            # The C SafeLoader where there is one: a safe loader all the same.
            document = yaml.load(file, Loader=_SAFE_LOADER)  # noqa: S506
        if document is None:
            continue
        if not isinstance(document, dict):
            raise ConfigError(f"{path}: not a kubeconfig (a YAML mapping)")
        base = os.path.dirname(os.path.abspath(path))
        current = current or str(document.get("current-context") or "")
        for kind, field in _NAMED.items():
            for item in document.get(kind) or []:
                if not isinstance(item, dict) or not isinstance(item.get(field), dict):
                    raise ConfigError(f"{path}: an entry of {kind} has no {field} mapping")
                named[kind].setdefault(str(item.get("name", "")), _Entry(item[field], base))
    if not current:
        raise ConfigError("no current-context")
    context = named["contexts"].get(current)
    if context is None:
        raise ConfigError(f"context {current[:100]!r} not found")
    cluster_name = str(context.value.get("cluster", ""))
    cluster = named["clusters"].get(cluster_name)
    if cluster is None:
        raise ConfigError(f"cluster {cluster_name[:100]!r} of context {current[:100]!r} not found")
    user_name = str(context.value.get("user", ""))
    user = named["users"].get(user_name, _Entry({}, cluster.base)) if user_name else None
    if user_name and user_name not in named["users"]:
        raise ConfigError(f"user {user_name[:100]!r} of context {current[:100]!r} not found")
    return _client_config(cluster, user, source, named, current)


def _client_config(cluster: _Entry, user: _Entry | None, source: str,
                   named: dict[str, dict[str, _Entry]], context: str) -> ClientConfig:
    c = cluster.value
    server = str(c.get("server") or "")
    if not server:
        raise ConfigError("the cluster has no server")
    proxy = str(c["proxy-url"]) if c.get("proxy-url") else environment_proxy(server)
    u = user.value if user is not None else {}
    ubase = user.base if user is not None else cluster.base
    cert_data, key_data = _data(u, "client-certificate-data"), _data(u, "client-key-data")
    return ClientConfig(
        host=server,
        ca_data=_data(c, "certificate-authority-data"),
        ca_file=_path(c, "certificate-authority", cluster.base),
        verify=not _bool(c, "insecure-skip-tls-verify"),
        tls_server_name=str(c["tls-server-name"]) if c.get("tls-server-name") else None,
        cert_data=cert_data, key_data=key_data,
        cert_file=None if cert_data else _path(u, "client-certificate", ubase),
        key_file=None if key_data else _path(u, "client-key", ubase),
        proxy=proxy,
        credentials=_credentials(u, ubase, cluster, server=server, proxy=proxy, named=named,
                                 context=context),
        source=source)


def _credentials(user: Mapping[str, Any], base: str, cluster: _Entry, *, server: str,
                 proxy: str | None, named: dict[str, dict[str, _Entry]], context: str,
                 ) -> Credentials:
    if user.get("auth-provider"):
        return _legacy(named, context, "auth-provider")
    token_file = _path(user, "tokenFile", base)
    if token_file:
        try:
            return TokenFile(token_file)
        except (OSError, ValueError, UnicodeDecodeError) as exc:
            if not _token(user):
                raise ConfigError(f"tokenFile {token_file}: {type(exc).__name__}") from None
            log.warning("cannot read the kubeconfig's tokenFile, using its token",
                        path=token_file, error=type(exc).__name__)
    token = _token(user)
    if token:
        return StaticCredentials(Auth(f"Bearer {token}"))
    has_cert = user.get("client-certificate") or user.get("client-certificate-data")
    if user.get("exec") and not has_cert:  # static credentials win over a plugin (client-go)
        return ExecCredentials(_exec_spec(user["exec"], base, cluster, server, proxy))
    if user.get("username") or user.get("password"):
        return _legacy(named, context, "username/password")
    return StaticCredentials(Auth())


def _exec_spec(stanza: Any, base: str, cluster: _Entry, server: str, proxy: str | None,
               ) -> ExecSpec:
    if not isinstance(stanza, dict):
        raise ConfigError("user.exec is not a mapping")
    api_version = str(stanza.get("apiVersion", ""))
    if api_version not in API_VERSIONS:
        raise ConfigError(f"exec plugin apiVersion {api_version[:80]!r} is not supported "
                          f"(one of {', '.join(API_VERSIONS)})")
    command = str(stanza.get("command") or "")
    if not command:
        raise ConfigError("exec plugin has no command")
    if os.sep in command and not os.path.isabs(command):  # a path, not a name to look up
        command = os.path.join(base, command)
    if shutil.which(command) is None:
        hint = str(stanza.get("installHint") or "").strip()
        raise ConfigError(f"exec plugin command {command!r} not found"
                          + (f" ({' '.join(hint.split())[:200]})" if hint else ""))
    mode = stanza.get("interactiveMode")
    if mode not in (None, "Never", "IfAvailable", "Always"):
        raise ConfigError("exec plugin interactiveMode is not one of Never, IfAvailable, "
                          "Always")
    if mode == "Always":
        raise ConfigError("exec plugin needs interactiveMode Always: the operator has no "
                          "terminal")
    env = tuple((str(e["name"]), str(e.get("value", ""))) for e in stanza.get("env") or []
                if isinstance(e, dict) and e.get("name"))
    info = (_cluster_info(cluster, server, proxy)
            if _bool(stanza, "provideClusterInfo", "user.exec") else None)
    return ExecSpec(api_version, command, tuple(str(a) for a in stanza.get("args") or []),
                    env, info)


def _cluster_info(cluster: _Entry, server: str, proxy: str | None) -> dict[str, Any]:
    """The ExecCredential's spec.cluster, as client-go's ConfigToExecCluster fills it:
    the CA as data (read from certificate-authority if need be), the proxy in use."""
    c = cluster.value
    info: dict[str, Any] = {"server": server}
    if c.get("tls-server-name"):
        info["tls-server-name"] = str(c["tls-server-name"])
    if _bool(c, "insecure-skip-tls-verify"):
        info["insecure-skip-tls-verify"] = True
    ca = _data(c, "certificate-authority-data")
    ca_file = _path(c, "certificate-authority", cluster.base)
    if ca is None and ca_file is not None:
        with open(ca_file, "rb") as file:  # OSError: a ConfigError naming the file
            ca = file.read()
    if ca is not None:
        info["certificate-authority-data"] = base64.b64encode(ca).decode("ascii")
    if proxy:
        info["proxy-url"] = proxy
    extension = next((e.get("extension") for e in c.get("extensions") or []
                      if isinstance(e, dict)
                      and e.get("name") == "client.authentication.k8s.io/exec"), None)
    if extension is not None:
        info["config"] = extension
    return info


def _legacy(named: dict[str, dict[str, _Entry]], context: str, what: str) -> Credentials:
    from himitsu_controller.runtime.client import legacyauth  # noqa: PLC0415 (imports the kubernetes package: only now)

    log.info("kubeconfig user needs the kubernetes package's loader", uses=what)
    document = {kind: [{"name": name, _NAMED[kind]: dict(entry.value)}
                       for name, entry in entries.items()] for kind, entries in named.items()}
    document["current-context"] = context  # type: ignore[assignment]
    user = named["users"][str(named["contexts"][context].value.get("user"))]
    try:
        return legacyauth.credentials(document, context, user.base)
    except Exception as exc:  # the package's loader raises many types
        raise ConfigError(f"{what}: {describe_exception(exc)}") from None


def _bool(stanza: Mapping[str, Any], key: str, where: str = "cluster") -> bool:
    """A boolean field: only YAML true/false (client-go's is a bool; the string "false"
    must not turn anything on)."""
    value = stanza.get(key, False)
    if not isinstance(value, bool):
        raise ConfigError(f"{where}.{key} is not a boolean (true or false)")
    return value


def _token(user: Mapping[str, Any]) -> str:
    """user.token without surrounding whitespace (``token: |`` keeps a newline, as
    kubectl trims it); ConfigError if it holds a control character (an invalid header)."""
    token = str(user.get("token") or "").strip()
    if has_control_character(token):
        raise ConfigError("user.token contains a control character")
    return token


def _data(stanza: Mapping[str, Any], key: str) -> bytes | None:
    value = stanza.get(key)
    if not value:
        return None
    try:
        return base64.b64decode(str(value), validate=True)
    except (binascii.Error, ValueError):
        raise ConfigError(f"{key} is not base64") from None


def _path(stanza: Mapping[str, Any], key: str, base: str) -> str | None:
    value = stanza.get(key)
    return os.path.join(base, str(value)) if value else None
