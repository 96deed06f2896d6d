"""Loading a Kubernetes client configuration without touching the client's globals.

Why not ``kubernetes.config.load_config()``: it mutates the process-wide default
Configuration, prints to stdout, persists refreshed credentials back into the kubeconfig
file, and checks the sources in a different order from kubectl and controller-runtime
(--kubeconfig, $KUBECONFIG, in-cluster, ~/.kube/config), which is the order used here.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from typing import Any

import urllib3
from kubernetes import client as k8s
from kubernetes.config.incluster_config import InClusterConfigLoader
from kubernetes.config.kube_config import load_kube_config

from .apierrors import describe_exception

__all__ = ["ConfigError", "ThrottledRefresh", "load_api_client", "new_api_client"]

# Module attributes (not constants inlined in the loader) so tests can point them at
# temporary files.
SERVICE_ACCOUNT_TOKEN_PATH = "/var/run/secrets/kubernetes.io/serviceaccount/token"  # noqa: S105 (a path)
SERVICE_ACCOUNT_CA_PATH = "/var/run/secrets/kubernetes.io/serviceaccount/ca.crt"
# How often a kubeconfig's credentials are re-applied (see ThrottledRefresh).
KUBECONFIG_REFRESH_SECONDS = 5.0


class ConfigError(Exception):
    """No usable Kubernetes client configuration (one-line message, no credentials)."""


def load_api_client(kubeconfig: str | None = None, *,
                    pool_maxsize: int = 32, retries: int = 3) -> k8s.ApiClient:
    """An ApiClient on an explicit Configuration (the client's global default is untouched).

    Source order: ``kubeconfig``, ``$KUBECONFIG``, in-cluster ServiceAccount, ~/.kube/config.
    In-cluster uses the client's loader with its refresh hook, which re-reads the rotating
    token file about every minute. ``pool_maxsize`` bounds the kept-alive connections:
    every open watch holds one for its life, so size it to watches + workers + a few.
    ``retries``: as for ``new_api_client``.
    """
    configuration = k8s.Configuration()
    path = kubeconfig or os.environ.get("KUBECONFIG") or None
    default_path = os.path.expanduser("~/.kube/config")
    source = "nowhere"
    try:
        if path:
            source = path
            load_kube_config(config_file=path,  # type: ignore[no-untyped-call]
                             client_configuration=configuration, persist_config=False)
            ThrottledRefresh.install(configuration)
        elif _in_cluster():
            source = "in-cluster service account"
            loader = InClusterConfigLoader(  # type: ignore[no-untyped-call]
                token_filename=SERVICE_ACCOUNT_TOKEN_PATH, cert_filename=SERVICE_ACCOUNT_CA_PATH)
            # Also installs the hook that re-reads the rotating token file.
            loader.load_and_set(configuration)  # type: ignore[no-untyped-call]
        elif os.path.isfile(default_path):
            source = default_path
            load_kube_config(config_file=default_path,  # type: ignore[no-untyped-call]
                             client_configuration=configuration, persist_config=False)
            ThrottledRefresh.install(configuration)
        else:
            raise ConfigError("no Kubernetes configuration: pass --kubeconfig, set KUBECONFIG,"
                              " run in a pod, or create ~/.kube/config")
    except ConfigError:
        raise
    except Exception as exc:  # the loaders raise many types (ConfigException, YAML, OSError)
        raise ConfigError(f"cannot load Kubernetes configuration from {source}: "
                          f"{describe_exception(exc)}") from None
    return new_api_client(configuration, pool_maxsize=pool_maxsize, retries=retries)


def new_api_client(configuration: k8s.Configuration, *, pool_maxsize: int = 32,
                   retries: int = 3) -> k8s.ApiClient:
    """An ApiClient whose transport leaves HTTP-status retries to ``RestClient``.

    With ``Configuration.retries`` unset, urllib3's default Retry re-sends GET/PUT/DELETE
    answered 429/503/413 with Retry-After by itself, sleeping in the calling thread and
    out of sight of our rate limiting and logs; it also follows redirects. Failures
    without a status are still retried ``retries`` times by urllib3 (connection failures,
    and read failures of GET/PUT/DELETE): 0 for a client that must keep to a deadline,
    such as the leader elector's (each retry would get the whole timeout again).
    """
    configuration.retries = urllib3.Retry(total=retries, redirect=0, status=0,
                                          respect_retry_after_header=False,
                                          raise_on_redirect=False, raise_on_status=False)
    configuration.connection_pool_maxsize = pool_maxsize
    return k8s.ApiClient(configuration)


class ThrottledRefresh:
    """Runs a kubeconfig's credential refresh hook at most every few seconds.

    The client's kubeconfig loader installs a hook that runs before *every* request: it
    re-applies host, TLS files and token to the Configuration (setting ``host`` even
    re-reads the proxy variables of the environment) and reloads credentials that have
    an expiry once it passed. Profiles of the operator's steady state put it at about 5%
    of all CPU. Credentials are still refreshed within ``every`` seconds of expiring.
    The loader re-installs its own hook on each run, so this one puts itself back in
    front of whatever hook is there afterwards.
    """

    def __init__(self, inner: Callable[[Any], None], *, every: float,
                 clock: Callable[[], float]) -> None:
        self._inner = inner
        self._every = every
        self._clock = clock
        self._last = float("-inf")
        self._lock = threading.Lock()

    @classmethod
    def install(cls, configuration: Any, *, every: float = KUBECONFIG_REFRESH_SECONDS,
                clock: Callable[[], float] = time.monotonic) -> None:
        hook = configuration.refresh_api_key_hook
        if hook is not None and not isinstance(hook, cls):
            configuration.refresh_api_key_hook = cls(hook, every=every, clock=clock)

    def __call__(self, configuration: Any) -> None:
        now = self._clock()
        with self._lock:
            if now - self._last < self._every:
                return
            self._last = now
            inner = self._inner
        inner(configuration)
        replaced = configuration.refresh_api_key_hook
        if replaced is not self and replaced is not None:
            with self._lock:
                self._inner = replaced
            configuration.refresh_api_key_hook = self


def _in_cluster() -> bool:
    return bool(os.environ.get("KUBERNETES_SERVICE_HOST")
                and os.environ.get("KUBERNETES_SERVICE_PORT")
                and os.path.isfile(SERVICE_ACCOUNT_TOKEN_PATH))
