"""Client for the one Himitsu API call the operator makes: the runtime secrets read.

* A 304 never looks like an empty environment; the version in the headers is the
  authority; no redirect, a deadline per request (``http``), strict answers (``wire``).
* Errors (``wire``) are typed by what the caller does next (fix the spec, fix the token,
  wait, retry); every message is ours, never the envelope's free text or a body.
* No token or value in an exception, a log line or a metric label.

Design: docs/design/himitsu-client.md
"""

from __future__ import annotations

import hashlib
import ipaddress
import json
import os
import re
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from http.cookiejar import DefaultCookiePolicy
from typing import Protocol
from urllib.parse import quote, urlsplit

import requests
import structlog

from himitsu_controller import __version__
from himitsu_controller.himitsu import wire
from himitsu_controller.himitsu.http import Abort, BearerAuth, RawAnswer, bounded_get, new_session
from himitsu_controller.himitsu.wire import FetchResult, InvalidInput, InvalidToken, TransportError

__all__ = [
    "OUTCOMES", "TOKEN_PATTERN", "USER_AGENT", "HimitsuClient", "Pacing", "pacing_key",
    "source_fingerprint", "validate_api_url", "validate_token",
]

USER_AGENT = f"himitsu-k8s-operator/{__version__}"
TOKEN_PATTERN = re.compile(r"^himi_[0-9a-f]{16}_[A-Za-z0-9_-]{43}$")
# Labels passed to the observer, one per HTTP attempt: a closed set, so a metric can
# create them all up front. "other" is any status outside these classes (a redirect).
OUTCOMES = ("200", "304", "4xx", "429", "5xx", "transport_error", "other")

_log = structlog.get_logger(__name__)
# Nothing of the value, not even its length: whoever may create a HimitsuSecret but not
# read the token Secret would learn it (a shape to guess, a truncation to spot).
_NOT_AN_API_KEY = ("token is not a Himitsu API key (expected himi_<16 hex>_<43 base64url>, 65 "
                   "characters; check for a truncated or padded paste)")
_UUID = re.compile(r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}")
_DEFAULT_PORTS = {"http": 80, "https": 443}
_NETLOC = re.compile(r"(?:\[(?P<ipv6>[0-9A-Fa-f:.]+)\]|[A-Za-z0-9._-]+)(?::[0-9]*)?")
# RFC 3986 unreserved characters only: nothing in them is decoded, re-encoded or given a
# meaning (path parameters, escapes) by requests, urllib3, a proxy or a server.
_PATH_SEGMENT = re.compile(r"[A-Za-z0-9._~-]+")
MAX_API_URL_LENGTH = 2048


class Pacing(Protocol):
    """Answer hook (``sync.polling.pacing.Pacer``): the request itself is the caller's to
    pace; this hears the server's count. ``key`` is ``pacing_key(api_url, token)``."""

    def answered(
        self, api_url: str, key: str, limits: wire.RateLimits, *, elapsed: float,
    ) -> None:
        """An answer ``elapsed`` s after its attempt was sent carried rate-limit headers."""
        ...


def validate_api_url(url: str) -> str:
    """The normalised API base URL (lowercase scheme and host, no default port, no trailing
    slash), byte for byte the URL requested, or InvalidInput (never echoing the URL).
    Anything a client or server would rewrite (``..``, percent-encoding) is refused."""
    candidate = url.strip() if isinstance(url, str) else ""
    if not candidate:
        raise InvalidInput("apiUrl is empty")
    if len(candidate) > MAX_API_URL_LENGTH:
        raise InvalidInput(f"apiUrl is longer than {MAX_API_URL_LENGTH} characters")
    if any(ch.isspace() or not ch.isprintable() for ch in candidate):
        raise InvalidInput("apiUrl must not contain whitespace or control characters")
    try:
        parts = urlsplit(candidate)
        host, port = parts.hostname, parts.port
    except ValueError:  # unbalanced brackets, a port out of range or not a number
        raise InvalidInput("apiUrl is not a valid URL (check the host and port)") from None
    scheme = parts.scheme.lower()
    if scheme not in _DEFAULT_PORTS:
        raise InvalidInput("apiUrl must start with https:// or http://")
    if "@" in parts.netloc:
        raise InvalidInput("apiUrl must not contain credentials (user:password@)")
    if "?" in candidate or "#" in candidate:
        raise InvalidInput("apiUrl must not have a query or a fragment")
    if not host:
        raise InvalidInput("apiUrl has no host")
    if not _host_is_valid(parts.netloc):
        raise InvalidInput("apiUrl's host must be an ASCII DNS name (xn-- for an "
                           "internationalised one) or an IP address")
    path = parts.path.rstrip("/")
    if any(not _PATH_SEGMENT.fullmatch(seg) or seg in (".", "..")
           for seg in path.split("/")[1:]):
        raise InvalidInput("apiUrl's path must be plain segments of letters, digits and "
                           "'-._~' (no '.' or '..' segments, no '//', no percent-encoding)")
    # IPv6: one spelling per address ([::FFFF:7F00:1] is [::ffff:7f00:1]).
    netloc = f"[{ipaddress.IPv6Address(host).compressed}]" if ":" in host else host
    if port is not None and port != _DEFAULT_PORTS[scheme]:
        netloc = f"{netloc}:{port}"
    return f"{scheme}://{netloc}{path}"


def _host_is_valid(netloc: str) -> bool:
    """A name or IPv4 address of the CRD's characters, or a bracketed IPv6 address (no
    zone: it names an interface of whichever machine runs the operator)."""
    match = _NETLOC.fullmatch(netloc)
    try:
        return match is not None and (match["ipv6"] is None or
                                      bool(ipaddress.IPv6Address(match["ipv6"]).packed))
    except ValueError:
        return False


def validate_token(token: str) -> str:
    """Return the token without surrounding whitespace, or raise InvalidToken."""
    candidate = token.strip() if isinstance(token, str) else ""
    if TOKEN_PATTERN.fullmatch(candidate):
        return candidate
    # Raise from a frame that no longer holds the credential: a traceback rendered with
    # locals (structlog's dict_tracebacks does that by default) must not show it.
    del token, candidate
    raise InvalidToken(_NOT_AN_API_KEY)


def _validate_id(name: str, value: str) -> str:
    if not isinstance(value, str) or not _UUID.fullmatch(value):
        raise InvalidInput(f"{name} must be a UUID such as 0b6f8a52-1c3e-4d5f-9a7b-2c4d6e8f0a1b")
    return value.lower()


def source_fingerprint(api_url: str, project_id: str, environment_id: str, token: str) -> str:
    """Hex sha256 naming what a poll reads and with which credential: equal fingerprints
    may share one poll. Built over sha256(token), so the token cannot be recovered."""
    return _fingerprint(validate_api_url(api_url), project_id.strip().lower(),
                        environment_id.strip().lower(), _token_digest(token))


def pacing_key(api_url: str, token: str) -> str:
    """Names one API key at one API URL, what Himitsu's per-key limit counts (hex sha256,
    the token cannot be recovered from it)."""
    return source_fingerprint(api_url, "", "", token)


def _token_digest(token: str) -> str:
    return hashlib.sha256(token.strip().encode("utf-8", "surrogatepass")).hexdigest()


def _fingerprint(base: str, project: str, environment: str, token_digest: str) -> str:
    material = json.dumps(["himitsu-source/v1", base, project, environment, token_digest],
                          separators=(",", ":"))
    return hashlib.sha256(material.encode("utf-8", "surrogatepass")).hexdigest()


@dataclass(frozen=True)
class _Request:
    base: str
    url: str
    headers: Mapping[str, str | None]
    auth: BearerAuth
    known_version: int | None  # only when If-None-Match was sent
    pacing_key: str


def _outcome(status: int) -> str:
    if status in (200, 304, 429):
        return str(status)
    if 400 <= status < 500:
        return "4xx"
    return "5xx" if 500 <= status < 600 else "other"


class HimitsuClient:
    """Thread-safe client: one pooled session per API base URL, shared by all workers."""

    def __init__(
        self, *, ca_file: str | None = None, connect_timeout: float = 5, read_timeout: float = 15,
        deadline: float = 30, max_response_bytes: int = 16 * 1024 * 1024,
        session_factory: Callable[[], requests.Session] | None = None,
        clock: Callable[[], float] = time.monotonic,
        observer: Callable[[str], None] | None = None, pacing: Pacing | None = None,
    ) -> None:
        if min(connect_timeout, read_timeout, deadline, max_response_bytes) <= 0:
            raise ValueError("timeouts, deadline and max_response_bytes must be positive")
        if ca_file is not None and not os.path.isfile(ca_file):
            raise InvalidInput(f"CA file {ca_file} does not exist or is not a file")
        # verify=True lets requests apply REQUESTS_CA_BUNDLE / CURL_CA_BUNDLE.
        self._verify: str | bool = ca_file if ca_file is not None else True
        self._connect_timeout, self._read_timeout = connect_timeout, read_timeout
        self._deadline, self._max_bytes = deadline, max_response_bytes
        self._session_factory = session_factory or new_session
        self._clock, self._observer = clock, observer
        self._pacing = pacing
        self._sessions: dict[str, requests.Session] = {}
        self._lock = threading.Lock()
        self._closed = False

    def __enter__(self) -> HimitsuClient:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        """Close every pooled connection; a later fetch raises RuntimeError."""
        with self._lock:
            sessions, self._sessions, self._closed = list(self._sessions.values()), {}, True
        for session in sessions:
            session.close()

    def fetch(
        self, *, api_url: str, project_id: str, environment_id: str, token: str,
        known_version: int | None,
    ) -> FetchResult:
        """Fetched (200) or NotModified (304, only possible when ``known_version`` >= 0 was
        sent as If-None-Match: version 0, an empty environment, answers 304 too). Raises a
        HimitsuError subclass for everything else."""
        candidate = token.strip() if isinstance(token, str) else ""
        auth = BearerAuth(candidate) if TOKEN_PATTERN.fullmatch(candidate) else None
        digest = _token_digest(candidate)
        # From here on the token lives only in `auth`, whose repr is redacted: no frame
        # of this call shows it in a traceback rendered with locals.
        del token, candidate
        if auth is None:
            raise InvalidToken(_NOT_AN_API_KEY)
        base = validate_api_url(api_url)
        project = quote(_validate_id("projectId", project_id), safe="")
        environment = quote(_validate_id("environmentId", environment_id), safe="")
        conditional = type(known_version) is int and known_version >= 0
        headers: dict[str, str | None] = {
            "Accept": "application/json",
            "User-Agent": USER_AGENT,
            # Small JSON: identity keeps the size cap honest (no decompression bomb).
            "Accept-Encoding": "identity",
            # None drops a default a custom session might carry: the server answers 500
            # to a JSON Content-Type on a GET.
            "Content-Type": None,
        }
        if conditional:
            headers["If-None-Match"] = f'"himi-config-{known_version}"'
        path = f"/api/v1/projects/{project}/environments/{environment}/secrets/runtime"
        request = _Request(
            base=base, url=base + path, headers=headers, auth=auth,
            known_version=known_version if conditional else None,
            pacing_key=_fingerprint(base, "", "", digest),
        )
        return self._fetch(request)

    def _session_for(self, base: str) -> requests.Session:
        with self._lock:
            if self._closed:
                raise RuntimeError("HimitsuClient is closed")
            session = self._sessions.get(base)
            if session is None:
                session = self._session_factory()
                # One session serves every token of a base URL: a cookie set for one
                # must never ride along with another, so the jar accepts none.
                session.cookies.set_policy(DefaultCookiePolicy(allowed_domains=[]))
                self._sessions[base] = session
            return session

    def _fetch(self, request: _Request) -> FetchResult:
        """One request (the reconcile's backoff owns the retries, issue 21 item 6)."""
        answer = self._exchange(request, self._clock() + self._deadline)
        result = wire.judge(answer.status, answer.headers, answer.body,
                            known_version=request.known_version)
        if isinstance(result, wire.HimitsuError):
            raise result
        return result

    def _exchange(self, request: _Request, deadline: float) -> RawAnswer:
        """The HTTP request, counted by the observer; TransportError when no full answer."""
        host = urlsplit(request.base).netloc
        answer: RawAnswer | None = None
        failure: Abort | None = None
        sent = self._clock()
        try:
            answer = bounded_get(
                self._session_for(request.base), request.url, headers=request.headers,
                auth=request.auth, connect_timeout=self._connect_timeout,
                read_timeout=self._read_timeout, verify=self._verify, deadline=deadline,
                clock=self._clock, max_bytes=self._max_bytes,
            )
        except Abort as abort:
            failure = abort
        outcome = "transport_error" if answer is None else _outcome(answer.status)
        _log.debug("himitsu_attempt", host=host, outcome=outcome)
        self._observe(outcome)
        if answer is not None:
            limits = wire.rate_limits(answer.headers)
            if self._pacing is not None and limits is not None:
                self._pacing.answered(request.base, request.pacing_key, limits,
                                      elapsed=max(0.0, self._clock() - sent))
            return answer
        # Raised outside the except block, so no library exception rides along as context.
        kind, reason = (failure.kind, failure.reason) if failure else ("transport", "")
        if kind == "deadline":
            message = f"no complete answer within the {self._deadline:g} s deadline"
        elif kind == "too_large":
            message = f"response larger than {self._max_bytes} bytes"
        else:
            message = reason or "the connection failed"
        raise TransportError(f"Himitsu API at {host}: {message}")

    def _observe(self, outcome: str) -> None:
        if self._observer is None:
            return
        try:
            self._observer(outcome)
        except Exception:  # a broken metric must not fail a sync
            _log.warning("himitsu_observer_failed", outcome=outcome)
