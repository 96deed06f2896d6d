"""Connections to one apiserver: the client configuration, its TLS context, one urllib3 pool.

Why not the ``kubernetes`` package's ApiClient: all the operator used of it was its
Configuration, its urllib3 pool and the kubeconfig loaders, and importing it costs about
16 MiB of resident memory (its generated models), a third of the operator's floor. Here
is what it did with urllib3, and nothing else:

* one ``HTTPSConnectionPool`` (or ``HTTPConnectionPool``) for the apiserver, ``maxsize``
  kept-alive connections (each open watch holds one for its life), with one
  ``ssl.SSLContext``: the cluster's CA (a file, or data loaded from memory), or the
  system's when none is given; no verification at all for insecure-skip-tls-verify;
  the client certificate; SNI and the hostname check against tls-server-name when set;
* behind a proxy (a kubeconfig's proxy-url, else HTTPS_PROXY/HTTP_PROXY unless NO_PROXY
  matches, resolved by the loader) a ``ProxyManager`` with the same TLS settings for the
  apiserver; SOCKS proxies are refused (urllib3 needs PySocks for them);
* the Retry policy (see ``new_retry``).

A client certificate handed over as data (a kubeconfig's -data fields, a credential
plugin's answer) is given to OpenSSL through an anonymous in-memory file
(``memfd_create``), so it never touches a disk; where that does not exist, through a
private temporary directory (0700) removed at once. A plugin's certificate may change:
the pool is then replaced (connections in use finish on the old one).
"""

from __future__ import annotations

import contextlib
import os
import ssl
import tempfile
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import urllib3
from urllib3.util import parse_url
from urllib3.util.ssl_ import create_urllib3_context

from himitsu_controller.runtime.client.credentials import (
    NO_CREDENTIALS,
    ClientCert,
    CredentialError,
    Credentials,
)
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
    ca_data: bytes | None = field(default=None, repr=False)  # PEM
    verify: bool = True  # False: insecure-skip-tls-verify
    tls_server_name: str | None = None
    cert_file: str | None = None
    key_file: str | None = None
    cert_data: bytes | None = field(default=None, repr=False)  # PEM
    key_data: bytes | None = field(default=None, repr=False)  # PEM
    proxy: str | None = field(default=None, repr=False)  # http(s)://[user:password@]host:port
    source: str = ""  # where it was loaded from, for messages


def new_retry(retries: int) -> urllib3.Retry:
    """No HTTP-status retries and no redirects: ``RestClient`` handles 429/Retry-After
    under its rate limiter, and a 3xx comes back as an answer. Failures without a status
    (connection failures, read failures of GET/PUT/DELETE) are retried ``retries`` times:
    0 for a client that must keep to a deadline, such as the leader elector's (each retry
    would get the whole timeout again)."""
    return urllib3.Retry(total=retries, redirect=0, status=0, respect_retry_after_header=False,
                         raise_on_redirect=False, raise_on_status=False)


class HttpClient:
    """The connection pool (or proxy manager) for one apiserver; thread-safe.

    ``ConfigError`` here when the TLS material cannot be used (unreadable CA, a key that
    does not match its certificate, an unsupported proxy).
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
        self._cert: ClientCert | None = None
        self._context = self._ssl_context(None) if self.scheme == "https" else None
        self._pool: urllib3.HTTPConnectionPool | None = None
        self._manager: urllib3.PoolManager | None = None

    @property
    def host(self) -> str:
        return self.config.host

    @property
    def credentials(self) -> Credentials:
        return self.config.credentials

    def connection(self, cert: ClientCert | None = None,
                   ) -> tuple[urllib3.HTTPConnectionPool | None, urllib3.PoolManager | None]:
        """The pool for the apiserver, or (None, the ProxyManager) behind a proxy.

        ``cert``: a client certificate from a credential plugin (replaces the
        configuration's); a new one gets a new TLS context and pool. A closed pool
        (``close()``) is replaced by a new one.
        """
        with self._lock:
            if cert != self._cert and self.scheme == "https":
                try:
                    context = self._ssl_context(cert)
                except ConfigError as exc:
                    raise CredentialError(str(exc)) from None
                self._cert, self._context = cert, context
                self._close_locked()
            if self._proxy_url is not None:
                if self._manager is None:
                    self._manager = urllib3.ProxyManager(
                        self._proxy_url, num_pools=2, proxy_headers=self._proxy_headers,
                        **self._pool_kw())
                return None, self._manager
            if self._pool is None or self._pool.pool is None:  # never made, or closed
                pool_class = (urllib3.HTTPSConnectionPool if self.scheme == "https"
                              else urllib3.HTTPConnectionPool)
                self._pool = pool_class(self._host, self._port, **self._pool_kw())
            return self._pool, None

    def close(self) -> None:
        """Close the idle connections (requests made later open new ones)."""
        with self._lock:
            self._close_locked()

    def _close_locked(self) -> None:
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

    def _ssl_context(self, cert: ClientCert | None) -> ssl.SSLContext:
        config = self.config
        what = "certificate authority"
        try:
            context = create_urllib3_context(
                cert_reqs=ssl.CERT_REQUIRED if config.verify else ssl.CERT_NONE)
            if config.verify:
                if config.ca_data is not None:
                    context.load_verify_locations(cadata=config.ca_data.decode("ascii"))
                elif config.ca_file is not None:
                    context.load_verify_locations(cafile=config.ca_file)
                else:
                    context.load_default_certs()
            what = "client certificate or key"
            if cert is not None:
                _load_pem_chain(context, cert.cert_pem, cert.key_pem)
            elif config.cert_data is not None or config.key_data is not None:
                if config.cert_data is None or config.key_data is None:
                    raise ValueError("needs both a certificate and a key")
                _load_pem_chain(context, config.cert_data, config.key_data)
            elif config.cert_file is not None or config.key_file is not None:
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


def _load_pem_chain(context: ssl.SSLContext, cert: bytes, key: bytes) -> None:
    """``load_cert_chain`` from memory: OpenSSL wants paths, so in-memory files."""
    with _pem_paths(cert, key) as (cert_path, key_path):
        context.load_cert_chain(cert_path, key_path)


@contextlib.contextmanager
def _pem_paths(*blobs: bytes) -> Iterator[list[str]]:
    memfd_create = getattr(os, "memfd_create", None)
    if memfd_create is not None and os.path.isdir("/proc/self/fd"):
        fds: list[int] = []
        try:
            for blob in blobs:
                fd = memfd_create("himitsu-tls", os.MFD_CLOEXEC)
                fds.append(fd)
                _write_all(fd, blob)
            yield [f"/proc/self/fd/{fd}" for fd in fds]
        finally:
            for fd in fds:
                os.close(fd)
        return
    with tempfile.TemporaryDirectory(prefix="himitsu-tls-") as directory:  # mode 0700
        paths = []
        for index, blob in enumerate(blobs):
            path = os.path.join(directory, str(index))
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            try:
                _write_all(fd, blob)
            finally:
                os.close(fd)
            paths.append(path)
        yield paths


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]
