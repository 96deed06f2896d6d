"""Connections to one apiserver: the client configuration, its TLS context, one urllib3 pool.

* One pool (each open watch holds a connection for its life) with one ``ssl.SSLContext``:
  the cluster's CA or the system's, the client certificate, tls-server-name when set.
* Behind a proxy (out-of-cluster) a ``ProxyManager`` with the same TLS settings.
* Why not the ``kubernetes`` package's ApiClient: its import alone costs ~16 MiB.
"""

from __future__ import annotations

import ssl
import threading
from dataclasses import dataclass, field
from typing import Any

import urllib3
from urllib3.util import parse_url
from urllib3.util.ssl_ import create_urllib3_context

from himitsu_controller.httpdeadline import POOL_CLASSES
from himitsu_controller.runtime.client.credentials import NO_CREDENTIALS, Credentials
from himitsu_controller.runtime.client.errors import describe_exception

__all__ = ["ClientConfig", "ConfigError", "HttpClient", "new_retry"]


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


def new_retry(retries: int) -> urllib3.Retry:
    """Failures without a status retried ``retries`` times (0 to keep to a deadline); no
    status retries (``RestClient`` handles 429) and no redirects (a 3xx is an answer)."""
    return urllib3.Retry(total=retries, redirect=0, status=0, respect_retry_after_header=False,
                         raise_on_redirect=False, raise_on_status=False)


class HttpClient:
    """The connection pool (or proxy manager) for one apiserver; thread-safe.

    ``ConfigError`` when the TLS material or the proxy cannot be used.
    """

    def __init__(self, config: ClientConfig, *, pool_maxsize: int = 32,
                 retries: int = 3) -> None:
        self.config = config
        self.retries = new_retry(retries)
        self.pool_maxsize = pool_maxsize
        url = parse_url(config.host)
        if url.scheme not in ("http", "https") or not url.host:
            raise ConfigError(f"server {config.host[:100]!r} is not an http(s) URL")
        self.scheme = url.scheme
        self.origin = f"{url.scheme}://{url.netloc}"
        self.prefix = (url.path or "").rstrip("/")
        self._host = url.host
        self._port = url.port or (443 if url.scheme == "https" else 80)
        self._proxy_url, self._proxy_headers = _proxy(config.proxy)
        self._lock = threading.Lock()
        self._context = self._ssl_context() if self.scheme == "https" else None
        self._pool: urllib3.HTTPConnectionPool | None = None
        self._manager: urllib3.PoolManager | None = None

    @property
    def host(self) -> str:
        return self.config.host

    @property
    def credentials(self) -> Credentials:
        return self.config.credentials

    def connection(self) -> tuple[urllib3.HTTPConnectionPool | None, urllib3.PoolManager | None]:
        """The pool, or (None, the ProxyManager) behind a proxy; a closed pool is replaced."""
        with self._lock:
            if self._proxy_url is not None:
                if self._manager is None:
                    self._manager = urllib3.ProxyManager(
                        self._proxy_url, num_pools=2, proxy_headers=self._proxy_headers,
                        **self._pool_kw())
                    self._manager.pool_classes_by_scheme = POOL_CLASSES
                return None, self._manager
            if self._pool is None or self._pool.pool is None:  # never made, or closed
                pool_class = POOL_CLASSES[self.scheme]
                self._pool = pool_class(self._host, self._port, **self._pool_kw())
            return self._pool, None

    def close(self) -> None:
        """Close the idle connections (requests made later open new ones)."""
        with self._lock:
            if self._pool is not None:
                self._pool.close()
            if self._manager is not None:
                self._manager.clear()
            self._pool = self._manager = None

    def _pool_kw(self) -> dict[str, Any]:
        kw: dict[str, Any] = {"maxsize": self.pool_maxsize, "retries": self.retries}
        if self.scheme == "https":
            kw["ssl_context"] = self._context
            kw["cert_reqs"] = ssl.CERT_REQUIRED if self.config.verify else ssl.CERT_NONE
            if self.config.tls_server_name:
                kw["server_hostname"] = self.config.tls_server_name
        return kw

    def _ssl_context(self) -> ssl.SSLContext:
        config = self.config
        what = "certificate authority"
        try:
            context = create_urllib3_context(
                cert_reqs=ssl.CERT_REQUIRED if config.verify else ssl.CERT_NONE)
            if config.verify:
                if config.ca_file is not None:
                    context.load_verify_locations(cafile=config.ca_file)
                else:
                    context.load_default_certs()
            what = "client certificate or key"
            if config.cert_file is not None or config.key_file is not None:
                if config.cert_file is None or config.key_file is None:
                    raise ValueError("needs both a certificate and a key")
                context.load_cert_chain(config.cert_file, config.key_file)
        except (OSError, ValueError, ssl.SSLError) as exc:  # ssl.SSLError: not the PEM text
            raise ConfigError(f"{what}: {describe_exception(exc)}") from None
        return context


def _proxy(url: str | None) -> tuple[str | None, dict[str, str] | None]:
    """The proxy URL without its credentials, and the header that carries them."""
    if not url:
        return None, None
    parsed = parse_url(url)
    if parsed.scheme not in ("http", "https") or not parsed.host:
        scheme = (parsed.scheme or "?")[:20]
        raise ConfigError(f"proxy scheme {scheme!r} is not supported: use an http:// or "
                          "https:// proxy (SOCKS proxies are not supported)")
    headers = urllib3.make_headers(proxy_basic_auth=parsed.auth) if parsed.auth else None
    return parsed._replace(auth=None).url, headers
