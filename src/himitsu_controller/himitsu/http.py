"""HTTP plumbing for the Himitsu client: a bounded GET in a session that keeps deadlines.

* ``new_session``: connections join ``httpdeadline.within``; urllib3 retries off.
* ``bounded_get``: no redirects (one could leave the allow-listed host), the deadline, a
  size cap, failures as ``Abort`` in our own words (the libraries' quote URLs).
* ``BearerAuth`` alone holds the token while a request is made (redacted repr).

Design: docs/design/deadlines.md
"""

from __future__ import annotations

import http.client
import re
import socket
import ssl
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import requests
from requests.adapters import HTTPAdapter
from requests.auth import AuthBase
from urllib3.exceptions import HTTPError as Urllib3HTTPError
from urllib3.poolmanager import ProxyManager

from himitsu_controller import httpdeadline


class _GuardedAdapter(HTTPAdapter):
    """An HTTPAdapter whose connections join the request's deadline (``httpdeadline``)."""

    def init_poolmanager(
        self, connections: int, maxsize: int, block: bool = False, **pool_kwargs: Any
    ) -> None:
        super().init_poolmanager(connections, maxsize, block, **pool_kwargs)
        self.poolmanager.pool_classes_by_scheme = httpdeadline.POOL_CLASSES

    def proxy_manager_for(self, proxy: str, **proxy_kwargs: Any) -> Any:
        manager = super().proxy_manager_for(proxy, **proxy_kwargs)
        # HTTP(S) proxies only: a SOCKS manager has pool classes of its own, and there the
        # per-chunk deadline check and the socket timeouts remain the bound.
        if isinstance(manager, ProxyManager):
            manager.pool_classes_by_scheme = httpdeadline.POOL_CLASSES
        return manager


def new_session(*, pool_maxsize: int = 16) -> requests.Session:
    """A session whose requests honour ``httpdeadline.within``; urllib3 retries are off."""
    session = requests.Session()
    adapter = _GuardedAdapter(pool_connections=1, pool_maxsize=pool_maxsize, max_retries=0)
    session.mount("https://", adapter)
    session.mount("http://", adapter)
    return session


class BearerAuth(AuthBase):
    """Adds ``Authorization: Bearer <token>``, the only place the token goes on the wire (as
    auth, not a header: requests then never lets ~/.netrc replace it with a Basic one)."""

    def __init__(self, token: str) -> None:
        self._token = token

    def __call__(self, request: requests.PreparedRequest) -> requests.PreparedRequest:
        request.headers["Authorization"] = f"Bearer {self._token}"
        return request

    def __repr__(self) -> str:
        return "BearerAuth(<redacted>)"


def _causes(exc: BaseException) -> list[BaseException]:
    """The exception and everything it wraps (cause, context, urllib3 ``reason``, args)."""
    seen: list[BaseException] = []
    pending: list[BaseException] = [exc]
    while pending and len(seen) < 32:
        current = pending.pop(0)
        if any(current is known for known in seen):
            continue
        seen.append(current)
        linked = [current.__cause__, current.__context__, getattr(current, "reason", None)]
        linked.extend(current.args)
        pending.extend(item for item in linked if isinstance(item, BaseException))
    return seen


def describe_transport_error(exc: BaseException) -> str:
    """A short reason in our own words: never the library's message, which quotes URLs."""
    chain = _causes(exc)
    for item in chain:
        if isinstance(item, ssl.SSLCertVerificationError):
            # verify_message is OpenSSL's fixed text ("unable to get local issuer
            # certificate"), the one detail that tells an operator which CA is missing.
            detail = item.verify_message if isinstance(item.verify_message, str) else ""
            return f"TLS certificate verification failed ({detail or 'untrusted'})"
    checks: list[tuple[type[BaseException], str]] = [
        (requests.exceptions.ConnectTimeout, "timed out connecting"),
        (requests.exceptions.ProxyError, "the proxy refused or failed the connection"),
        (ssl.SSLError, "TLS handshake failed"),
        (requests.exceptions.SSLError, "TLS handshake failed"),
        (socket.gaierror, "the host name could not be resolved"),
        (ConnectionRefusedError, "connection refused"),
        (http.client.RemoteDisconnected, "the server closed the connection without answering"),
        (http.client.BadStatusLine, "the server did not answer with HTTP"),
        (ConnectionResetError, "connection reset by the server"),
        (requests.exceptions.ReadTimeout, "timed out waiting for the response"),
        (TimeoutError, "timed out"),
        (requests.exceptions.ChunkedEncodingError, "the response ended before it was complete"),
    ]
    for kind, reason in checks:
        if any(isinstance(item, kind) for item in chain):
            return reason
    names = {type(item).__name__ for item in chain}
    if names & {"IncompleteRead", "ProtocolError", "RemoteDisconnected"}:
        return "the connection closed before the response was complete"
    if "NameResolutionError" in names:
        return "the host name could not be resolved"
    return "the connection failed"


_TRANSPORT_ERRORS = (
    requests.RequestException, Urllib3HTTPError, http.client.HTTPException, OSError,
)
_DIGITS = re.compile(r"[0-9]{1,18}")
_CHUNK_BYTES = 64 * 1024


class Abort(Exception):
    """Why a bounded GET got no complete answer. ``kind``: "deadline", "too_large" or
    "transport" (then ``reason`` says what failed, in our words)."""

    def __init__(self, kind: str, reason: str = "") -> None:
        super().__init__(kind)
        self.kind = kind
        self.reason = reason


@dataclass(frozen=True)
class RawAnswer:
    status: int
    # Neither in a repr (a traceback rendered with locals): both are the server's words.
    headers: Mapping[str, str] = field(repr=False)
    body: bytes | None = field(repr=False)  # None: content-encoded, left unread


def bounded_get(
    session: requests.Session, url: str, *, headers: Mapping[str, str | None],
    auth: AuthBase, connect_timeout: float, read_timeout: float, verify: str | bool,
    deadline: float, clock: Callable[[], float], max_bytes: int,
) -> RawAnswer:
    """One GET, no redirects, whose whole answer arrives before ``deadline`` (a ``clock``
    reading) and holds at most ``max_bytes``; raises Abort otherwise."""
    remaining = deadline - clock()
    if remaining <= 0:
        raise Abort("deadline")
    failure: Abort | None = None
    response: requests.Response | None = None
    try:
        with httpdeadline.within(remaining) as guard:
            try:
                response = session.get(
                    url, headers=headers, auth=auth, allow_redirects=False, stream=True,
                    timeout=(min(connect_timeout, remaining), min(read_timeout, remaining)),
                    verify=verify,
                )
                body = _read_body(response, deadline=deadline, clock=clock, max_bytes=max_bytes)
            except Abort as abort:
                failure = abort
            except _TRANSPORT_ERRORS as exc:
                failure = Abort("transport", describe_transport_error(exc))
            if guard.expired:  # whatever the read saw, the cause was our deadline
                failure = Abort("deadline")
    finally:
        if response is not None:
            response.close()
    if failure is not None or response is None:
        # A fresh exception, raised outside any except block: no traceback or context of
        # a frame that held the body or the request headers travels with it.
        raise Abort(failure.kind if failure else "transport", failure.reason if failure else "")
    return RawAnswer(response.status_code, response.headers, body)


def _read_body(
    response: requests.Response, *, deadline: float, clock: Callable[[], float], max_bytes: int,
) -> bytes | None:
    encoding = response.headers.get("Content-Encoding", "").strip().lower()
    if encoding not in ("", "identity"):
        return None  # we asked for identity: an encoded body is not read at all
    declared = response.headers.get("Content-Length", "").strip()
    if _DIGITS.fullmatch(declared) and int(declared) > max_bytes:
        raise Abort("too_large")
    buffer = bytearray()
    # The clock check between chunks is the fallback bound for sessions without the
    # guarded adapter; the deadline's watchdog ends a chunk read blocked on a trickle.
    for chunk in response.iter_content(chunk_size=_CHUNK_BYTES):
        buffer += chunk
        if len(buffer) > max_bytes:
            raise Abort("too_large")
        if clock() > deadline:
            raise Abort("deadline")
    return bytes(buffer)
