"""The lean request path to the apiserver: one urllib3 pool, headers built once a second.

Why not ``ApiClient.param_serialize`` + ``ApiClient.call_api`` for every request: in the
operator's steady state (one status merge-patch per poll) the request round trip was about
half of all CPU, and much of it went before a byte was sent. Per request they deep-copy
the body and headers (``sanitize_for_serialization``), build the auth settings (calling
the credential refresh hook), match the content type with regular expressions, serialise
the body, and let urllib3's PoolManager parse the URL and normalise a pool key to find
the one pool there is. None of that changes between two requests, so here it is done
once per refresh period:

* the headers -- Accept, the ApiClient's default headers (User-Agent), and the
  credentials, applied by the client's own ``update_params_for_auth`` so a rotating
  ServiceAccount token (the in-cluster loader's hook) or a kubeconfig's refreshed
  credentials (``kubeconfig.ThrottledRefresh``) arrive at most ``refresh_every`` seconds
  late, never cached for longer; a 401 drops them at once;
* the pool -- the very ``HTTPConnectionPool``/``HTTPSConnectionPool`` the ApiClient's
  PoolManager keeps for the apiserver, so TLS settings (CA, client certificate, verify,
  assert_hostname, SNI name), socket options and pool size are the client's, connections
  are shared with the watches (which keep the client's path), and ``ApiClient.close()``
  still closes them. With a proxy (a ProxyManager) there is no such pool: the route has
  none and the caller keeps using the client's path.

Requests go out with ``pool.urlopen`` and the Retry policy of the ApiClient (see
``kubeconfig.new_api_client``), the body serialised once by the caller. A request may
carry an overall deadline (``deadline=True``: its timeout bounds the whole request, see
``deadline.py``), and may be sent ``once`` (no urllib3 retry: a write the write gate let
through). Behind a proxy such requests go through the client's ProxyManager in the same
way (the route's ``manager``), not through the client's REST layer, whose Retry policy
cannot be turned off per request.
"""

from __future__ import annotations

import dataclasses
import functools
import http.client
import json
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

import structlog
import urllib3
from kubernetes import client as k8s
from urllib3.util import parse_url

from . import deadline as deadlines
from .apierrors import TransportError, describe_exception

__all__ = ["LeanTransport", "Route", "apiserver_pool", "encode_body"]

log = structlog.get_logger(__name__)

JSON = "application/json"
# How long the headers (credentials) and the pool are used before being built again.
REFRESH_SECONDS = 1.0
# Timeout objects kept for reuse: the few fixed timeouts callers use, not every deadline.
_SOCKET_SLACK = 1.0
_TIMEOUT_CACHE = 16


def encode_body(body: Any, content_type: str | None) -> bytes | None:
    """The request body as the apiserver receives it: compact JSON, or text/bytes as given.

    Like the client's REST layer, a str is sent as is only for non-JSON content types (an
    apply patch written as YAML); for JSON types it is a JSON string.
    """
    if body is None:
        return None
    if isinstance(body, bytes):
        return body
    if isinstance(body, str) and content_type is not None and "json" not in content_type:
        return body.encode()
    return json.dumps(body, separators=(",", ":")).encode()


def apiserver_pool(api_client: k8s.ApiClient) -> urllib3.HTTPConnectionPool | None:
    """The ApiClient's own connection pool for its apiserver; None behind a proxy.

    A ProxyManager's pools speak to the proxy (absolute URLs, proxy headers, CONNECT
    tunnels): such requests keep going through the client's own path.
    """
    manager = api_client.rest_client.pool_manager
    if type(manager) is not urllib3.PoolManager:
        return None
    return manager.connection_from_url(str(api_client.configuration.host))


@dataclasses.dataclass(frozen=True)
class Route:
    """Where and how to send requests until ``expires`` (a reading of the clock)."""

    pool: urllib3.HTTPConnectionPool | None  # None: behind a proxy (see manager)
    prefix: str  # a path the host URL carries (e.g. a proxying gateway's), or ""
    # Behind a proxy: the client's ProxyManager and the apiserver's scheme://host:port.
    manager: urllib3.PoolManager | None
    origin: str
    headers: Mapping[str, str]  # shared by all requests, never mutated (urllib3 copies it)
    retries: urllib3.Retry | bool | int | None  # the ApiClient's policy
    expires: float


class LeanTransport:
    """Sends requests to the apiserver through the ApiClient's pool (thread-safe)."""

    def __init__(self, api_client: k8s.ApiClient, *, user_agent: str | None = None,
                 refresh_every: float = REFRESH_SECONDS,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._api_client = api_client
        self._user_agent = user_agent
        self._refresh_every = refresh_every
        self._clock = clock
        self._route: Route | None = None
        self._lock = threading.Lock()  # held while rebuilding the route
        self._timeouts: dict[float, urllib3.Timeout] = {}

    def route(self) -> Route:
        """The current route, rebuilt when its refresh period is over."""
        route = self._route
        if route is not None and self._clock() < route.expires:
            return route
        # One thread rebuilds; the others keep using the route they have meanwhile: the
        # refresh hook may run a kubeconfig credential plugin for seconds. (Before the
        # first route there is nothing to use: they wait.)
        if route is None:
            self._lock.acquire()
        elif not self._lock.acquire(blocking=False):
            return route
        try:
            current = self._route
            now = self._clock()
            if current is None or now >= current.expires:
                current = self._route = self._build(now)
            return current
        finally:
            self._lock.release()

    def invalidate(self) -> None:
        """Rebuild the route before the next request (credentials refused, pool closed)."""
        route = self._route
        if route is not None:  # a race with a rebuild costs at most one more rebuild
            self._route = dataclasses.replace(route, expires=float("-inf"))

    def _build(self, now: float) -> Route:
        api_client = self._api_client
        headers: dict[str, str] = {"Accept": JSON}
        headers.update(api_client.default_headers)
        if api_client.cookie:
            headers["Cookie"] = api_client.cookie
        queries: list[tuple[str, str]] = []
        # The client's own auth logic; it calls the Configuration's refresh hook.
        api_client.update_params_for_auth(headers, queries, ["BearerToken"], "", "GET", None)
        if self._user_agent is not None:
            headers["User-Agent"] = self._user_agent
        pool = apiserver_pool(api_client)
        manager = api_client.rest_client.pool_manager if pool is None else None
        if queries:  # credentials in the query string: not something a kubeconfig does
            pool = manager = None
        if pool is not None:
            deadlines.track(pool)
        # What the client's PoolManager gave the pool: Configuration.retries, if set.
        retries = pool.retries if pool is not None else None
        host = parse_url(str(api_client.configuration.host))
        return Route(pool, host.path or "", manager,
                     f"{host.scheme}://{host.netloc}", headers, retries,
                     now + self._refresh_every)

    def _timeout(self, seconds: float, deadline: bool) -> urllib3.Timeout:
        if deadline:  # a remainder: not kept
            # The watchdog (runtime/deadline.py) enforces ``seconds`` with a reset; the
            # socket timeout is a second later so that it never wins the race: a socket
            # timeout closes the connection gracefully, and a graceful close lets bytes
            # still queued (a write held by a hung network) arrive after the deadline.
            return urllib3.Timeout(total=seconds + _SOCKET_SLACK)
        timeout = self._timeouts.get(seconds)
        if timeout is None:
            # total, like the client's REST layer: connect + read together
            timeout = urllib3.Timeout(total=seconds)
            if len(self._timeouts) < _TIMEOUT_CACHE:  # a deadline's remainder: not kept
                timeout = self._timeouts.setdefault(seconds, timeout)
        return timeout

    def send(self, route: Route, method: str, path: str, query: str, *, body: bytes | None,
             content_type: str | None, timeout: float, deadline: bool = False,
             once: bool = False) -> tuple[int, bytes, Mapping[str, str]]:
        """One request on ``route`` (which has a pool, or a ProxyManager if ``deadline``);
        the status, body and headers.

        ``deadline``: ``timeout`` bounds the whole request (the watchdog aborts it then),
        not each socket operation. ``once``: no urllib3 retry re-sends it.
        """
        headers = route.headers
        if content_type is not None:
            headers = {**headers, "Content-Type": content_type}
        url = route.prefix + path + ("?" + query if query else "")
        urlopen = functools.partial(self._urlopen, method=method, url=url, body=body,
                                    headers=headers, timeout=self._timeout(timeout, deadline),
                                    once=once)
        if not deadline:
            return self._send(route, urlopen, method, path)
        with deadlines.within(timeout) as bound:
            try:
                return self._send(route, urlopen, method, path)
            except TransportError:
                if bound.expired:
                    log.warning("request aborted at its deadline", method=method, path=path,
                                seconds=round(timeout, 2))
                    raise TransportError(f"{method} {path}: no answer within {timeout:.1f}s, "
                                         "connection aborted") from None
                raise

    def _send(self, route: Route, urlopen: Callable[[Route], urllib3.BaseHTTPResponse],
              method: str, path: str) -> tuple[int, bytes, Mapping[str, str]]:
        try:
            try:
                response = urlopen(route)
            except urllib3.exceptions.ClosedPoolError:
                # ApiClient.close() closed the pool; the request never left. The client's
                # PoolManager opens a new pool on demand, as it would for its own path.
                self.invalidate()
                retry = self.route()
                if retry.pool is None or retry.pool is route.pool:
                    raise
                response = urlopen(retry)
        except (urllib3.exceptions.HTTPError, http.client.HTTPException, OSError) as exc:
            # After the retries, the last failure says more than "Max retries exceeded".
            cause = exc.reason if isinstance(exc, urllib3.exceptions.MaxRetryError) else None
            raise TransportError(f"{method} {path}: {describe_exception(cause or exc)}",
                                 ) from None
        if response.status == 401:
            self.invalidate()  # the credentials may have rotated under us: re-read them now
        return response.status, response.data, response.headers

    @staticmethod
    def _urlopen(route: Route, *, method: str, url: str, body: bytes | None,
                 headers: Mapping[str, str], timeout: urllib3.Timeout,
                 once: bool) -> urllib3.BaseHTTPResponse:
        # Redirects are not followed (the client's PoolManager does not either: its
        # Retry has redirect=0 and hands the 3xx back).
        if route.pool is None:
            assert route.manager is not None
            full = route.origin + url
            deadlines.track(route.manager.connection_from_url(full))
            # Behind a proxy: the client's Retry policy is the manager's, unless once.
            return route.manager.urlopen(method, full, body=body, headers=dict(headers),
                                         retries=False if once else None, redirect=False,
                                         timeout=timeout, preload_content=True)
        return route.pool.urlopen(method, url, body=body, headers=headers,
                                  retries=False if once else route.retries, redirect=False,
                                  timeout=timeout, preload_content=True)
