"""Where the apiserver is and who we are to it: the in-cluster account, or a kubeconfig.

* Sources in kubectl's order: ``--kubeconfig``, ``$KUBECONFIG``, in-cluster, ``~/.kube/config``.
* In a pod (the deployed path, ours and minimal): the service's address, the
  ServiceAccount's CA and its token file re-read; the ``kubernetes`` package is not imported.
* Elsewhere: that package's kubeconfig loader, imported only then (exec plugins, auth
  providers, client certificates and proxies are its job).
* Every failure is a ``ConfigError``: one line naming the source, never a credential.
"""

from __future__ import annotations

import os
import threading
from typing import Any

from himitsu_controller.runtime.client.credentials import Auth, CredentialError, TokenFile
from himitsu_controller.runtime.client.errors import describe_exception
from himitsu_controller.runtime.client.httpclient import ClientConfig, ConfigError, HttpClient

__all__ = ["ConfigError", "load_api_client", "load_client_config", "new_api_client"]

SERVICE_ACCOUNT_TOKEN_PATH = "/var/run/secrets/kubernetes.io/serviceaccount/token"  # noqa: S105 (a path)
SERVICE_ACCOUNT_CA_PATH = "/var/run/secrets/kubernetes.io/serviceaccount/ca.crt"
IN_CLUSTER = "in-cluster service account"
NO_KUBERNETES = ("out-of-cluster configuration needs the kubernetes package: "
                 "pip install 'himitsu-controller[kubeconfig]'")


def load_api_client(kubeconfig: str | None = None, *, pool_maxsize: int = 32,
                    retries: int = 3) -> HttpClient:
    """A client for the configured apiserver (see ``load_client_config``)."""
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
        if not os.path.isfile(kubeconfig):
            raise ConfigError(f"cannot load Kubernetes configuration from {kubeconfig}: "
                              "No such file")
        return _from_kubeconfig(kubeconfig)
    if env:
        source = os.environ["KUBECONFIG"]
        if not any(os.path.exists(p) for p in env):
            raise ConfigError(f"KUBECONFIG={source[:200]}: none of its files exists")
        return _from_kubeconfig(source)
    if in_cluster():
        return in_cluster_config()
    if os.path.isfile(default):
        return _from_kubeconfig(default)
    raise ConfigError("no Kubernetes configuration: pass --kubeconfig, set KUBECONFIG,"
                      " run in a pod, or create ~/.kube/config")


def in_cluster() -> bool:
    return bool(os.environ.get("KUBERNETES_SERVICE_HOST")
                and os.environ.get("KUBERNETES_SERVICE_PORT")
                and os.path.isfile(SERVICE_ACCOUNT_TOKEN_PATH))


def in_cluster_config() -> ClientConfig:
    """The ServiceAccount's: its CA, its token file (re-read), the service's address."""
    host = os.environ["KUBERNETES_SERVICE_HOST"]
    port = os.environ["KUBERNETES_SERVICE_PORT"]
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"
    if not os.path.isfile(SERVICE_ACCOUNT_CA_PATH):
        raise ConfigError(f"cannot load Kubernetes configuration from {IN_CLUSTER}: "
                          f"no CA file at {SERVICE_ACCOUNT_CA_PATH}")
    try:
        token = TokenFile(SERVICE_ACCOUNT_TOKEN_PATH)
    except (OSError, ValueError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot load Kubernetes configuration from {IN_CLUSTER}: "
                          f"{describe_exception(exc)}") from None
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
                raise CredentialError(f"kubeconfig credentials: {type(exc).__name__}",
                                      ) from None
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
    proxy = configuration.proxy
    if proxy and should_bypass_proxies(host, configuration.no_proxy or ""):
        proxy = None
    return ClientConfig(host=host, credentials=ConfigurationCredentials(configuration),
                        ca_file=configuration.ssl_ca_cert, verify=configuration.verify_ssl,
                        tls_server_name=configuration.tls_server_name,
                        cert_file=configuration.cert_file, key_file=configuration.key_file,
                        proxy=proxy, source=source)
