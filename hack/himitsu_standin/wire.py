"""The Himitsu wire format as the real server speaks it, kept free of state and sockets.

Why a separate module: these are the facts of spec/himitsu-api.md (token and id formats,
ETags, the error envelope, rate-limit headers, data rules), and the core, the control API
and the tests all lean on them. Keeping them pure makes each rule testable on its own.
"""

from __future__ import annotations

import hashlib
import ipaddress
import json
import math
import re
import secrets
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

TOKEN_RE = re.compile(r"^himi_[0-9a-f]{16}_[A-Za-z0-9_-]{43}$")
UUID_RE = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$", re.I)
RUNTIME_RE = re.compile(r"^/api/v1/projects/([^/]+)/environments/([^/]+)/secrets/runtime$")
_ETAG_RE = re.compile(r'^(?:W/)?"himi-config-(\d+)"$')
_BAD_KEY_RE = re.compile(r"[\s=\x00-\x1f\x7f]")
_CODES = {400: "INVALID_REQUEST", 401: "UNAUTHENTICATED", 403: "FORBIDDEN", 404: "NOT_FOUND",
          409: "CONFLICT", 429: "RATE_LIMITED", 500: "INTERNAL_ERROR", 502: "BAD_GATEWAY",
          503: "SERVICE_UNAVAILABLE", 504: "GATEWAY_TIMEOUT"}
JSON_TYPE = "application/json; charset=utf-8"


def fingerprint(token: str) -> str:
    """A sha256 prefix: tells tokens apart in logs and stats without revealing them."""
    return hashlib.sha256(token.encode()).hexdigest()[:16]


def token_digest(token: str) -> str:
    """What the stand-in stores instead of a token."""
    return hashlib.sha256(token.encode()).hexdigest()


def generate_token() -> str:
    """A fresh token in Himitsu's format (32 random bytes are 43 base64url characters)."""
    return f"himi_{secrets.token_hex(8)}_{secrets.token_urlsafe(32)}"


def is_loopback(host: str) -> bool:
    """True for localhost and loopback addresses (IPv4-mapped IPv6 included)."""
    if host == "localhost":
        return True
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return False
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped.is_loopback
    return address.is_loopback


def if_none_match_hits(header: str | None, version: int) -> bool:
    """RFC 9110 weak comparison over a comma-separated list; ``*`` matches what exists.

    Tags that are unquoted or not ours are ignored, as the real server ignores them.
    """
    for raw in (header or "").split(","):
        tag = raw.strip()
        match = _ETAG_RE.match(tag)
        if tag == "*" or (match is not None and int(match.group(1)) == version):
            return True
    return False


def version_headers(version: int) -> dict[str, str]:
    return {"ETag": f'"himi-config-{version}"', "X-Himitsu-Config-Version": str(version)}


def uuid_arg(value: str) -> str:
    """A UUID id, lowercased (the server compares them as UUIDs, not strings)."""
    if not isinstance(value, str) or not UUID_RE.match(value):
        raise ValueError("project and environment ids must be UUIDs")
    return value.lower()


def check_secret(key: str, value: str) -> None:
    """Himitsu's data rules: a stand-in that accepts what Himitsu refuses would mislead."""
    if not isinstance(key, str) or not 1 <= len(key) <= 255 or _BAD_KEY_RE.search(key):
        raise ValueError("secret keys are 1-255 characters without whitespace, '=' or controls")
    if not isinstance(value, str) or len(value.encode()) > 65536:
        raise ValueError("secret values are strings of at most 65536 UTF-8 bytes")


@dataclass(frozen=True)
class RequestRecord:
    """One API request as the stand-in saw it; never holds a token or a secret value."""

    time: float
    method: str
    path: str
    environment: str | None
    token_fingerprint: str | None
    status: int | None  # None: the connection was reset without an answer
    if_none_match: str | None
    user_agent: str | None
    content_type_sent: bool
    fault: str | None


@dataclass(frozen=True)
class Inbound:
    """The parts of an HTTP request the API decides on."""

    method: str
    path: str
    client_ip: str
    token: str | None  # what followed "Bearer "; transient, never stored
    if_none_match: str | None = None
    user_agent: str | None = None
    content_type: str | None = None
    body_length: int = 0


@dataclass
class Answer:
    """What to send. The HTTP layer carries out the delay, trickle, filler and reset."""

    status: int
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes = b""
    filler: int = 0  # b"x" bytes streamed before the last `tail` bytes of `body`
    tail: int = 0
    delay: float = 0.0
    trickle: int = 0  # bytes per second; 0 = all at once
    reset: bool = False
    fault: str | None = None

    @property
    def length(self) -> int:
        return len(self.body) + self.filler


def error_answer(status: int, message: str, headers: Mapping[str, str] | None = None, *,
                 code: str | None = None) -> Answer:
    """The error envelope every non-2xx API answer carries."""
    request_id = str(uuid.uuid4())
    envelope = {"error": {"code": code or _CODES.get(status, "ERROR"), "message": message,
                          "requestId": request_id}}
    return Answer(status, {**(headers or {}), "Content-Type": JSON_TYPE,
                           "X-Request-Id": request_id}, json.dumps(envelope).encode())


def json_answer(payload: object, status: int = 200,
                headers: Mapping[str, str] | None = None) -> Answer:
    return Answer(status, {**(headers or {}), "Content-Type": JSON_TYPE},
                  json.dumps(payload).encode())


class FixedWindows:
    """Fixed windows per key, each opened by the key's first hit (express-rate-limit style).

    Not thread-safe on its own: the core calls it under its lock.
    """

    def __init__(self, limit: int, window: float, clock: Callable[[], float]) -> None:
        if limit < 1 or window <= 0:
            raise ValueError("a rate limit needs limit >= 1 and a positive window")
        self.limit, self.window, self._clock = limit, window, clock
        self._windows: dict[str, tuple[float, int]] = {}

    def policy(self, seconds_left: int) -> str:
        """``RateLimit-Policy`` as the real server sends it: ``w`` is the seconds left in
        the current window, not the window's length."""
        return f"{self.limit};w={seconds_left}"

    def hit(self, key: str) -> tuple[bool, dict[str, str]]:
        """Count one request; (allowed, the RateLimit-* headers to send)."""
        now = self._clock()
        start, hits = self._windows.get(key, (now, 0))
        if now >= start + self.window:
            start, hits = now, 0
        hits += 1
        self._windows[key] = (start, hits)
        left = max(0, math.ceil(start + self.window - now))
        headers = {"RateLimit-Policy": self.policy(left), "RateLimit-Limit": str(self.limit),
                   "RateLimit-Remaining": str(max(0, self.limit - hits)),
                   "RateLimit-Reset": str(left)}
        if hits > self.limit:
            headers["Retry-After"] = headers["RateLimit-Reset"]
        return hits <= self.limit, headers

    def peek(self, key: str) -> tuple[float, int] | None:
        """(seconds left, requests counted) of the key's open window; None when none is."""
        now = self._clock()
        start, hits = self._windows.get(key, (now - self.window, 0))
        return (start + self.window - now, hits) if now < start + self.window else None

    def clear(self) -> None:
        self._windows.clear()
