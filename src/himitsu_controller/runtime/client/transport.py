"""The request path to the apiserver: one urllib3 pool, headers built once a second.

* Headers (credentials included) and the pool are built once per refresh period (a
  ``Route``); a 401 tells the credentials and drops the route at once.
* A request may run under an overall deadline (``httpdeadline``) and be sent ``once``.
* Failures without an answer are ``TransportError``s naming the cause, never a credential.

Design: docs/design/apiserver-client.md
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

from himitsu_controller import httpdeadline
from himitsu_controller.runtime.client.credentials import Auth
from himitsu_controller.runtime.client.errors import TransportError, describe_exception
from himitsu_controller.runtime.client.httpclient import HttpClient

__all__ = ["LeanTransport", "Route", "encode_body"]

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


@dataclasses.dataclass(frozen=True)
class Route:
    """Where and how to send requests until ``expires`` (a reading of the clock)."""

    pool: urllib3.HTTPConnectionPool | None  # None: behind a proxy (see manager)
    prefix: str  # a path the host URL carries (e.g. a proxying gateway's), or ""
    # Behind a proxy: the client's ProxyManager and the apiserver's scheme://host:port.
    manager: urllib3.PoolManager | None
    origin: str
    headers: Mapping[str, str]  # shared by all requests, never mutated (urllib3 copies it)
    retries: urllib3.Retry  # the client's policy
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
        self._timeouts: dict[float, urllib3.Timeout] = {}

    def route(self) -> Route:
        """The current route, rebuilt when its refresh period is over."""
        route = self._route
        if route is not None and self._clock() < route.expires:
            return route
        # One thread rebuilds; the others keep using the route they have meanwhile: the
        # credentials may run a kubeconfig credential plugin for seconds. (Before the
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
        client = self._client
        auth = client.credentials.current()  # may run a kubeconfig plugin; CredentialError
        headers: dict[str, str] = {"Accept": JSON}
        if self._user_agent is not None:
            headers["User-Agent"] = self._user_agent
        if auth.authorization is not None:
            headers["Authorization"] = auth.authorization
        pool, manager = client.connection()
        return Route(pool, client.prefix, manager, client.origin, headers, client.retries,
                     auth, now + self._refresh_every)

    def _timeout(self, seconds: float, deadline: bool) -> urllib3.Timeout:
        if deadline:  # a remainder: not kept
            # The watchdog (httpdeadline.py) enforces ``seconds`` with a reset; the
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
            return self._answer(self._send(route, urlopen, method, path))
        with httpdeadline.within(timeout) as bound:
            try:
                return self._answer(self._send(route, urlopen, method, path))
            except TransportError:
                if bound.expired:
                    log.warning("request aborted at its deadline", method=method, path=path,
                                seconds=round(timeout, 2))
                    raise TransportError(f"{method} {path}: no answer within {timeout:.1f}s, "
                                         "connection aborted") from None
                raise

    def open(self, method: str, path: str, query: str, *, connect_timeout: float,
             read_timeout: float) -> urllib3.BaseHTTPResponse:
        """A streaming request (a watch): the response with its body unread; the caller
        reads it and releases it (``release_conn``/``close``)."""
        route = self.route()
        url = route.prefix + path + ("?" + query if query else "")
        urlopen = functools.partial(
            self._urlopen, method=method, url=url, body=None, headers=route.headers,
            timeout=urllib3.Timeout(connect=connect_timeout, read=read_timeout), once=False,
            preload=False)
        return self._send(route, urlopen, method, path)

    @staticmethod
    def _answer(response: urllib3.BaseHTTPResponse) -> tuple[int, bytes, Mapping[str, str]]:
        return response.status, response.data, response.headers

    def _send(self, route: Route, urlopen: Callable[[Route], urllib3.BaseHTTPResponse],
              method: str, path: str) -> urllib3.BaseHTTPResponse:
        try:
            try:
                response = urlopen(route)
            except urllib3.exceptions.ClosedPoolError:
                # HttpClient.close() closed the pool; the request never left. The client
                # opens a new pool on demand.
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
        except ValueError:
            # http.client refuses a header value with a line break (a token read with
            # one) or a character beyond latin-1; its message quotes the header value,
            # i.e. the token: never pass it on.
            raise TransportError(f"{method} {path}: a request header is invalid (a control "
                                 "character in the credentials?)") from None
        if response.status == 401:
            # The credentials may have rotated under us: re-read them now.
            self._client.credentials.refused(route.auth)
            self.invalidate()
        return response

    @staticmethod
    def _urlopen(route: Route, *, method: str, url: str, body: bytes | None,
                 headers: Mapping[str, str], timeout: urllib3.Timeout,
                 once: bool, preload: bool = True) -> urllib3.BaseHTTPResponse:
        # Redirects are not followed (the Retry policy has redirect=0 and hands the 3xx
        # back).
        retries = False if once else route.retries
        if route.pool is None:
            assert route.manager is not None
            full = route.origin + url
            return route.manager.urlopen(method, full, body=body, headers=dict(headers),
                                         retries=retries, redirect=False, timeout=timeout,
                                         preload_content=preload)
        return route.pool.urlopen(method, url, body=body, headers=headers, retries=retries,
                                  redirect=False, timeout=timeout, preload_content=preload)
