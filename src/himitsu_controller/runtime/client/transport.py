"""The transport to one apiserver: one urllib3 pool, its TLS, headers built once a second.

* One pool (each open watch holds a connection for its life) with one ``ssl.SSLContext``:
  the cluster's CA or the system's, the client certificate, tls-server-name when set;
  behind a proxy (out-of-cluster) a ``ProxyManager`` with the same TLS settings.
* Headers (credentials included) are built once per refresh period (a ``Route``); a 401
  tells the credentials and drops the route at once.
* A request may run under an overall deadline (``httpdeadline``) and be sent ``once``;
  failures without an answer are ``TransportError``s naming the cause, never a credential.

Design: docs/design/apiserver-client.md
"""

from __future__ import annotations

import contextlib
import dataclasses
import http.client
import json
import ssl
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

import structlog
import urllib3
from urllib3.util import parse_url
from urllib3.util.ssl_ import create_urllib3_context

from himitsu_controller import httpdeadline
from himitsu_controller.httpdeadline import POOL_CLASSES
from himitsu_controller.runtime.client.config import (
    Auth,
    ClientConfig,
    ConfigError,
    load_client_config,
)
from himitsu_controller.runtime.client.errors import TransportError, describe_exception

__all__ = ["HttpClient", "LeanTransport", "Route", "encode_body", "load_api_client",
           "new_api_client", "new_retry"]

log = structlog.get_logger(__name__)

JSON = "application/json"
REFRESH_SECONDS = 1.0  # how long the headers (credentials) are used
CONNECT_TIMEOUT = 10.0  # a watch's (its reads have their own timeout)
# A deadline's socket timeout is a second later than the watchdog's reset, so it never
# wins the race: its graceful close would let bytes a hung network held arrive late.
_SOCKET_SLACK = 1.0


def encode_body(body: Any, content_type: str | None) -> bytes | None:
    """Compact JSON, or bytes as given; a str as is only for a non-JSON content type (an
    apply patch in YAML), as the client's REST layer does."""
    if body is None or isinstance(body, bytes):
        return body
    if isinstance(body, str) and content_type is not None and "json" not in content_type:
        return body.encode()
    return json.dumps(body, separators=(",", ":")).encode()


@dataclasses.dataclass(frozen=True)
class Route:
    """The headers to send until ``expires`` (a reading of the clock)."""

    headers: Mapping[str, str]  # shared by all requests, never mutated (urllib3 copies it)
    auth: Auth  # what the headers carry (told to the credentials after a 401)
    expires: float


class LeanTransport:
    """Sends requests to the apiserver through the client's pool (thread-safe)."""

    def __init__(self, client: HttpClient, *, user_agent: str | None = None,
                 refresh_every: float = REFRESH_SECONDS,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._client = client
        self._user_agent = user_agent
        self._refresh_every = refresh_every
        self._clock = clock
        self._route: Route | None = None
        self._lock = threading.Lock()  # held while rebuilding the route

    def route(self) -> Route:
        """The current route, rebuilt when its refresh period is over."""
        route = self._route
        if route is not None and self._clock() < route.expires:
            return route
        # One thread rebuilds (the credentials may run a plugin for seconds); the others
        # keep using the route they have, or wait when there is none yet.
        if route is None:
            self._lock.acquire()
        elif not self._lock.acquire(blocking=False):
            return route
        try:
            current, now = self._route, self._clock()
            if current is None or now >= current.expires:
                current = self._route = self._build(now)
            return current
        finally:
            self._lock.release()

    def invalidate(self) -> None:
        """Rebuild the route before the next request (the credentials were refused)."""
        route = self._route
        if route is not None:  # a race with a rebuild costs at most one more rebuild
            self._route = dataclasses.replace(route, expires=float("-inf"))

    def _build(self, now: float) -> Route:
        auth = self._client.config.credentials.current()  # may run a plugin; TransportError
        headers = {"Accept": JSON, "User-Agent": self._user_agent,
                   "Authorization": auth.authorization}
        return Route({k: v for k, v in headers.items() if v is not None}, auth,
                     now + self._refresh_every)

    def send(self, route: Route, method: str, path: str, query: str, *, body: bytes | None,
             content_type: str | None, timeout: float, deadline: bool = False,
             once: bool = False) -> tuple[int, bytes, Mapping[str, str]]:
        """Status, body, headers. ``deadline``: ``timeout`` bounds the whole request (aborted
        then), not each socket operation; ``once``: no urllib3 retry re-sends it."""
        headers = route.headers
        if content_type is not None:
            headers = {**headers, "Content-Type": content_type}
        seconds = timeout + _SOCKET_SLACK if deadline else timeout
        within = httpdeadline.within(timeout) if deadline else contextlib.nullcontext()
        with within as bound:
            try:
                response = self._send(route, method, path, query, body=body, headers=headers,
                                      timeout=urllib3.Timeout(total=seconds), once=once)
                return response.status, response.data, response.headers
            except TransportError:
                if bound is None or not bound.expired:
                    raise
                log.warning("request aborted at its deadline", method=method, path=path,
                            seconds=round(timeout, 2))
                raise TransportError(f"{method} {path}: no answer within {timeout:.1f}s, "
                                     "connection aborted") from None

    def open(self, path: str, query: str, *, read_timeout: float) -> urllib3.BaseHTTPResponse:
        """A watch: the response, its body unread, for the caller to read and release."""
        route = self.route()
        return self._send(route, "GET", path, query, body=None, headers=route.headers,
                          timeout=urllib3.Timeout(connect=CONNECT_TIMEOUT, read=read_timeout),
                          once=False, preload=False)

    def _send(self, route: Route, method: str, path: str, query: str, *, body: bytes | None,
              headers: Mapping[str, str], timeout: urllib3.Timeout, once: bool,
              preload: bool = True) -> urllib3.BaseHTTPResponse:
        pool, manager = self._client.connection()
        url = self._client.prefix + path + ("?" + query if query else "")
        kw: dict[str, Any] = {"body": body, "retries": False if once else self._client.retries,
                              "redirect": False, "timeout": timeout, "preload_content": preload}
        try:  # redirects are not followed: a 3xx is an answer
            if pool is not None:
                response = pool.urlopen(method, url, headers=headers, **kw)
            else:
                assert manager is not None
                response = manager.urlopen(method, self._client.origin + url,
                                           headers=dict(headers), **kw)
        except (urllib3.exceptions.HTTPError, http.client.HTTPException, OSError) as exc:
            # After the retries, the last failure says more than "Max retries exceeded".
            cause = exc.reason if isinstance(exc, urllib3.exceptions.MaxRetryError) else None
            raise TransportError(f"{method} {path}: {describe_exception(cause or exc)}",
                                 ) from None
        except ValueError:
            # http.client refuses a header with a line break or beyond latin-1, quoting
            # the value (the token): never pass it on.
            raise TransportError(f"{method} {path}: a request header is invalid (a control "
                                 "character in the credentials?)") from None
        if response.status == 401:  # the credentials may have rotated: re-read them now
            self._client.config.credentials.refused(route.auth)
            self.invalidate()
        return response


def new_retry(retries: int) -> urllib3.Retry:
    """Failures without a status retried ``retries`` times (0 to keep to a deadline); no
    status retries (``RestClient`` handles 429) and no redirects (a 3xx is an answer)."""
    return urllib3.Retry(total=retries, redirect=0, status=0, respect_retry_after_header=False,
                         raise_on_redirect=False, raise_on_status=False)


class HttpClient:
    """The pool (or proxy manager) for one apiserver; thread-safe. ConfigError when the
    TLS material or the proxy cannot be used."""

    def __init__(self, config: ClientConfig, *, pool_maxsize: int = 32,
                 retries: int = 3) -> None:
        self.config = config
        self.retries = new_retry(retries)
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
        self._pool_kw: dict[str, Any] = {"maxsize": pool_maxsize, "retries": self.retries}
        if self.scheme == "https":
            verify = ssl.CERT_REQUIRED if config.verify else ssl.CERT_NONE
            self._pool_kw.update(ssl_context=self._ssl_context(), cert_reqs=verify)
            if config.tls_server_name:
                self._pool_kw["server_hostname"] = config.tls_server_name
        self._pool: urllib3.HTTPConnectionPool | None = None
        self._manager: urllib3.PoolManager | None = None

    @property
    def host(self) -> str:
        return self.config.host

    def connection(self) -> tuple[urllib3.HTTPConnectionPool | None, urllib3.PoolManager | None]:
        """The pool, or (None, the ProxyManager) behind a proxy; a closed pool is replaced."""
        with self._lock:
            if self._proxy_url is not None:
                if self._manager is None:
                    self._manager = urllib3.ProxyManager(
                        self._proxy_url, num_pools=2, proxy_headers=self._proxy_headers,
                        **self._pool_kw)
                    self._manager.pool_classes_by_scheme = POOL_CLASSES
                return None, self._manager
            if self._pool is None or self._pool.pool is None:  # never made, or closed
                pool_class = POOL_CLASSES[self.scheme]
                self._pool = pool_class(self._host, self._port, **self._pool_kw)
            return self._pool, None

    def close(self) -> None:
        """Close the idle connections (requests made later open new ones)."""
        with self._lock:
            if self._pool is not None:
                self._pool.close()
            if self._manager is not None:
                self._manager.clear()
            self._pool = self._manager = None

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
