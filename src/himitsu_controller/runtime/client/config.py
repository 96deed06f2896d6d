"""Where the apiserver is and who we are to it: the in-cluster account, or a kubeconfig.

* Sources in kubectl's order: ``--kubeconfig``, ``$KUBECONFIG``, in-cluster, ``~/.kube/config``.
* In a pod (the deployed path, ours and minimal): the service's address, the
  ServiceAccount's CA and its token file, re-read once a minute as client-go does and at
  once after a 401; the ``kubernetes`` package is not imported.
* Elsewhere: that package's kubeconfig loader, imported only then (exec plugins, auth
  providers, client certificates and proxies are its job).
* Every failure is a ``ConfigError``: one line naming the source, never a credential.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import structlog

from himitsu_controller.runtime.client.errors import TransportError, describe_exception

__all__ = ["NO_CREDENTIALS", "Auth", "ClientConfig", "ConfigError", "Credentials",
           "StaticCredentials", "TokenFile", "bearer", "load_client_config"]

log = structlog.get_logger(__name__)

SERVICE_ACCOUNT_TOKEN_PATH = "/var/run/secrets/kubernetes.io/serviceaccount/token"  # noqa: S105 (a path)
SERVICE_ACCOUNT_CA_PATH = "/var/run/secrets/kubernetes.io/serviceaccount/ca.crt"
IN_CLUSTER = "in-cluster service account"
NO_KUBERNETES = ("out-of-cluster configuration needs the kubernetes package: "
                 "pip install 'himitsu-controller[kubeconfig]'")
TOKEN_FILE_PERIOD = 60.0  # client-go's transport.NewCachedFileTokenSource


@dataclass(frozen=True)
class Auth:
    """What a request carries: an Authorization header value."""

    authorization: str | None = field(default=None, repr=False)


class Credentials(Protocol):
    """``current()``: what to send now (TransportError: nothing, the request is not sent);
    ``refused()``: a 401 to it.
    Asked once per transport refresh (about a second), from many threads."""

    def current(self) -> Auth: ...

    def refused(self, auth: Auth) -> None: ...


@dataclass(frozen=True)
class StaticCredentials:
    """The same credentials for good (a bearer token, or none)."""

    auth: Auth

    def current(self) -> Auth:
        return self.auth

    def refused(self, auth: Auth) -> None:
        pass


NO_CREDENTIALS = StaticCredentials(Auth())


def bearer(token: str) -> StaticCredentials:
    return StaticCredentials(Auth(f"Bearer {token}"))


def read_token(path: str) -> Auth:
    """The bearer token in ``path``; OSError or ValueError (naming the path only)."""
    with open(path, encoding="utf-8") as file:
        token = file.read().strip()
    if not token:
        raise ValueError(f"token file {path} is empty")
    if any(ord(ch) < 0x20 or ord(ch) == 0x7F for ch in token):
        raise ValueError(f"token file {path} contains a control character")
    return Auth(f"Bearer {token}")


class TokenFile:
    """A bearer token file, re-read every ``period`` seconds and after a 401. A failed
    first read raises (OSError/ValueError); a later one keeps the last token (logged,
    path only), as client-go does: a rotation in progress must not stop every request."""

    def __init__(self, path: str, *, period: float = TOKEN_FILE_PERIOD,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.path = path
        self._period = period
        self._clock = clock
        self._lock = threading.Lock()
        self._auth = read_token(path)
        self._next_read = clock() + period

    def current(self) -> Auth:
        with self._lock:
            now = self._clock()
            if now >= self._next_read:
                self._next_read = now + self._period
                try:
                    self._auth = read_token(self.path)
                except (OSError, ValueError, UnicodeDecodeError) as exc:
                    log.warning("cannot re-read the token file, keeping the last token",
                                path=self.path, error=type(exc).__name__)
            return self._auth

    def refused(self, auth: Auth) -> None:
        with self._lock:
            if auth == self._auth:  # not a token already replaced meanwhile
                self._next_read = float("-inf")


class ConfigError(Exception):
    """No usable Kubernetes client configuration (one-line message, no credentials)."""


@dataclass(frozen=True)
class ClientConfig:
    """Where the apiserver is, how to trust it, who we are to it."""

    host: str  # https://host:port, maybe with a path prefix (a proxying gateway's)
    credentials: Credentials = NO_CREDENTIALS
    ca_file: str | None = None
    verify: bool = True  # False: insecure-skip-tls-verify
    tls_server_name: str | None = None
    cert_file: str | None = None
    key_file: str | None = None
    proxy: str | None = field(default=None, repr=False)  # http(s)://[user:password@]host:port
    source: str = ""  # where it was loaded from, for messages


def load_client_config(kubeconfig: str | None = None) -> ClientConfig:
    """The configuration from the first source there is (see the module docstring)."""
    env = [p for p in os.environ.get("KUBECONFIG", "").split(os.pathsep) if p]
    default = os.path.expanduser("~/.kube/config")
    if kubeconfig:
        if not os.path.isfile(kubeconfig):
            raise ConfigError(f"cannot load Kubernetes configuration from {kubeconfig}: "
                              "No such file")
        return _from_kubeconfig(kubeconfig)
    if env:
        source = os.environ["KUBECONFIG"]
        if not any(os.path.exists(p) for p in env):
            raise ConfigError(f"KUBECONFIG={source[:200]}: none of its files exists")
        return _from_kubeconfig(source)
    if (os.environ.get("KUBERNETES_SERVICE_HOST") and os.environ.get("KUBERNETES_SERVICE_PORT")
            and os.path.isfile(SERVICE_ACCOUNT_TOKEN_PATH)):
        return in_cluster_config()
    if os.path.isfile(default):
        return _from_kubeconfig(default)
    raise ConfigError("no Kubernetes configuration: pass --kubeconfig, set KUBECONFIG,"
                      " run in a pod, or create ~/.kube/config")


def in_cluster_config() -> ClientConfig:
    """The ServiceAccount's: its CA, its token file (re-read), the service's address."""
    host = os.environ["KUBERNETES_SERVICE_HOST"]
    port = os.environ["KUBERNETES_SERVICE_PORT"]
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"
    unusable = f"cannot load Kubernetes configuration from {IN_CLUSTER}: "
    if not os.path.isfile(SERVICE_ACCOUNT_CA_PATH):
        raise ConfigError(f"{unusable}no CA file at {SERVICE_ACCOUNT_CA_PATH}")
    try:
        token = TokenFile(SERVICE_ACCOUNT_TOKEN_PATH)
    except (OSError, ValueError, UnicodeDecodeError) as exc:
        raise ConfigError(unusable + describe_exception(exc)) from None
    return ClientConfig(host=f"https://{host}:{port}", credentials=token,
                        ca_file=SERVICE_ACCOUNT_CA_PATH, source=IN_CLUSTER)


class ConfigurationCredentials:
    """A ``kubernetes`` Configuration's Authorization header (its loader refreshes it)."""

    def __init__(self, configuration: Any) -> None:
        self._configuration = configuration
        self._lock = threading.Lock()

    def current(self) -> Auth:
        with self._lock:
            try:
                value = self._configuration.get_api_key_with_prefix("BearerToken")
            except Exception as exc:  # the loader's refresh raises many types
                raise TransportError(f"kubeconfig credentials: {type(exc).__name__}") from None
        return Auth(str(value) if value else None)

    def refused(self, auth: Auth) -> None:
        pass  # the loader refreshes by expiry only


def _from_kubeconfig(source: str) -> ClientConfig:
    try:
        from kubernetes.client import Configuration  # noqa: PLC0415 (out-of-cluster only)
        from kubernetes.client.rest import should_bypass_proxies  # noqa: PLC0415
        from kubernetes.config import load_kube_config  # noqa: PLC0415
    except ImportError:
        raise ConfigError(NO_KUBERNETES) from None
    configuration = Configuration()
    try:
        load_kube_config(config_file=source, client_configuration=configuration,
                         persist_config=False)  # type: ignore[no-untyped-call]
    except Exception as exc:  # the loader raises many types; its messages name keys/paths
        raise ConfigError(f"cannot load Kubernetes configuration from {source}: "
                          f"{describe_exception(exc)}") from None
    host = configuration.host
    bypass = should_bypass_proxies(host, configuration.no_proxy or "")
    return ClientConfig(host=host, credentials=ConfigurationCredentials(configuration),
                        ca_file=configuration.ssl_ca_cert, verify=configuration.verify_ssl,
                        tls_server_name=configuration.tls_server_name,
                        cert_file=configuration.cert_file, key_file=configuration.key_file,
                        proxy=None if bypass else configuration.proxy, source=source)
