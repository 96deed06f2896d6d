"""What a Himitsu answer means: the runtime body, error envelopes, version headers, 429s.

* Strict: a body not exactly the documented shape is refused, never guessed at.
* Pure functions of status, headers and bytes; ``judge`` returns the result, or the
  typed error with a message of our own (never the envelope's free text), for the client
  to raise: no frame of it that holds a body is in a traceback.

Design: docs/design/himitsu-client.md
"""

from __future__ import annotations

import json
import math
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from email.utils import parsedate_to_datetime
from types import MappingProxyType
from typing import Any

__all__ = [
    "BadRequest", "FetchResult", "Fetched", "Forbidden", "HimitsuError", "InvalidInput",
    "InvalidToken", "NotFound", "NotModified", "RateLimited", "ServerError", "TransportError",
    "Unauthorized", "Undecodable", "UnexpectedStatus",
]

_VERSION = re.compile(r"[0-9]{1,18}")
_ETAG = re.compile(r'(?:W/)?"himi-config-([0-9]{1,18})"')
# Envelope fields we are willing to repeat in a status message; anything else is dropped.
_CODE = re.compile(r"[A-Z][A-Z0-9_]{0,63}")
_REQUEST_ID = re.compile(r"[A-Za-z0-9._:-]{1,128}")
_DELAY = re.compile(r"[0-9]{1,10}(?:\.[0-9]{1,6})?")
RATE_LIMIT_DEFAULT, RATE_LIMIT_MIN, RATE_LIMIT_MAX = 60.0, 1.0, 3600.0


class HimitsuError(Exception):
    """Base of every client error. ``message`` is safe for a status, an Event or a log."""

    def __init__(
        self, message: str, *, status: int | None = None, code: str | None = None,
        request_id: str | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.code = code
        self.request_id = request_id

    @property
    def gist(self) -> str:
        """The message without its requestId (new on every attempt): what a repeat keeps."""
        suffix = f" (requestId {self.request_id})" if self.request_id else ""
        return self.message.removesuffix(suffix) if suffix else self.message


class InvalidInput(HimitsuError):
    """A URL, id or option failed local validation; no request was made."""


class InvalidToken(HimitsuError):
    """The token is not a Himitsu API key; no request was made."""


class BadRequest(HimitsuError):
    """400: the request itself is wrong, which means the spec is."""


class Unauthorized(HimitsuError):
    """401: token unknown, expired, revoked, or its scope deleted."""


class Forbidden(HimitsuError):
    """403: FORBIDDEN (creator lost permission) or API_SCOPE_FORBIDDEN (key scope)."""


class NotFound(HimitsuError):
    """404: project or environment does not exist (for this key)."""


class RateLimited(HimitsuError):
    """429: ``retry_after`` seconds to wait (Retry-After, else RateLimit-Reset, else 60)."""

    def __init__(self, message: str, *, retry_after: float, **kwargs: Any) -> None:
        super().__init__(message, **kwargs)
        self.retry_after = retry_after


class ServerError(HimitsuError):
    """5xx."""


class TransportError(HimitsuError):
    """No complete answer: connect/read failure, timeout, deadline, reset, too large."""


class Undecodable(HimitsuError):
    """A 2xx or 304 that is not the documented shape."""


class UnexpectedStatus(HimitsuError):
    """Any other status, redirects included (never followed)."""


@dataclass(frozen=True)
class Fetched:
    """A 200: every live secret of the environment at ``version``."""

    version: int
    secrets: Mapping[str, str] = field(repr=False)  # values never in a repr
    # Seconds since the request (a shared poll's cached answer is older): the next poll
    # aligns on it. The requeue jitter (0..1) drawn once for the request, so every
    # HimitsuSecret sharing it comes back together; None: draw your own.
    age: float = field(default=0.0, compare=False)
    jitter: float | None = field(default=None, compare=False)


@dataclass(frozen=True)
class NotModified:
    """A 304: the environment is still at ``version``; no secret material came back."""

    version: int
    age: float = field(default=0.0, compare=False)
    jitter: float | None = field(default=None, compare=False)


FetchResult = Fetched | NotModified


class _DuplicateKey(ValueError):
    pass


def _reject_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    result = dict(pairs)
    if len(result) != len(pairs):  # two values for one key: which one is meant is unknowable
        raise _DuplicateKey
    return result


def _reject_constant(_name: str) -> Any:
    raise ValueError  # NaN and Infinity are Python's extension, not JSON


def load_json(body: bytes) -> tuple[Any, str | None]:
    """(value, None), or (None, why the body is not strict UTF-8 JSON)."""
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError:
        return None, "body is not UTF-8"
    try:
        payload = json.loads(
            text, object_pairs_hook=_reject_duplicates, parse_constant=_reject_constant
        )
    except _DuplicateKey:
        return None, "body has duplicate JSON keys"
    except (ValueError, RecursionError):
        return None, "body is not JSON"
    return payload, None


def decode_runtime(body: bytes) -> tuple[int, dict[str, str]] | str:
    """(configVersion, secrets) of a 200 body, or why it is not the documented shape
    ``{"data": {"configVersion": int >= 0, "secrets": {str: str}}}``."""
    payload, problem = load_json(body)
    if problem is not None:
        return problem
    data = payload.get("data") if isinstance(payload, dict) else None
    if not isinstance(data, dict):
        return "no data object"
    version = data.get("configVersion")
    if type(version) is not int or version < 0:  # type(): to isinstance a bool is an int
        return "data.configVersion is not a non-negative integer"
    secrets = data.get("secrets")
    if not isinstance(secrets, dict):
        return "data.secrets is not an object"
    for key, value in secrets.items():
        if type(value) is not str:
            return "a secret value is not a string"
        try:
            (key + value).encode("utf-8")  # a lone surrogate (\ud800) parses, but is no UTF-8
        except UnicodeEncodeError:
            return "a secret key or value is not valid UTF-8"
    return version, secrets


def envelope(body: bytes | None) -> tuple[str, str | None] | None:
    """(code, requestId) of a Himitsu error envelope ``{"error": {"code", "message",
    "requestId"}}``, or None when the body is not one (then it came from something else)."""
    payload, problem = load_json(body) if body is not None else (None, "encoded")
    error = payload.get("error") if problem is None and isinstance(payload, dict) else None
    if not isinstance(error, dict):
        return None
    code, message, request_id = error.get("code"), error.get("message"), error.get("requestId")
    if not isinstance(code, str) or not _CODE.fullmatch(code) or not isinstance(message, str):
        return None
    if not isinstance(request_id, str) or not _REQUEST_ID.fullmatch(request_id):
        request_id = None  # an odd requestId is dropped, never echoed
    return code, request_id


def header_version(headers: Mapping[str, str]) -> int | None:
    """The config version from ``X-Himitsu-Config-Version``, else from the ETag."""
    raw = headers.get("X-Himitsu-Config-Version", "").strip()
    if _VERSION.fullmatch(raw):
        return int(raw)
    match = _ETAG.fullmatch(headers.get("ETag", "").strip())
    return int(match.group(1)) if match else None


def _parse_delay(value: str | None, *, allow_date: bool) -> float | None:
    value = (value or "").strip()
    if _DELAY.fullmatch(value):
        return float(value)
    if allow_date and value:  # Retry-After may be an HTTP-date (proxies send those)
        try:
            return parsedate_to_datetime(value).timestamp() - time.time()
        except (TypeError, ValueError, OverflowError):
            return None
    return None


def retry_after(headers: Mapping[str, str]) -> float:
    """Seconds to wait after a 429: Retry-After, else RateLimit-Reset, else 60; clamped
    to [1 s, 1 h] so a 0 cannot make a workqueue spin and a typo cannot park it for days."""
    delay = _parse_delay(headers.get("Retry-After"), allow_date=True)
    if delay is None:
        delay = _parse_delay(headers.get("RateLimit-Reset"), allow_date=False)
    if delay is None:
        return RATE_LIMIT_DEFAULT
    return min(max(delay, RATE_LIMIT_MIN), RATE_LIMIT_MAX)


@dataclass(frozen=True)
class RateLimits:
    """The ``RateLimit-*`` headers of one answer: this key's count in the server's window
    (only the server knows where it lies), other clients of the key included."""

    limit: int | None
    remaining: int
    reset: float  # seconds until the server's window ends


def _header_int(headers: Mapping[str, str], name: str) -> int | None:
    raw = (headers.get(name) or "").strip()
    return int(raw) if _VERSION.fullmatch(raw) else None


def rate_limits(headers: Mapping[str, str]) -> RateLimits | None:
    """RateLimits of an answer (any status), or None without a usable Remaining/Reset.
    A reset is clamped like a 429's delay, so a typo cannot park a key for days."""
    remaining = _header_int(headers, "RateLimit-Remaining")
    reset = _parse_delay(headers.get("RateLimit-Reset"), allow_date=False)
    if remaining is None or reset is None:
        return None
    return RateLimits(limit=_header_int(headers, "RateLimit-Limit"), remaining=remaining,
                      reset=min(reset, RATE_LIMIT_MAX))


NOT_HIMITSU = "response was not a Himitsu API response"
_ERRORS: dict[int, type[HimitsuError]] = {
    400: BadRequest, 401: Unauthorized, 403: Forbidden, 404: NotFound, 429: RateLimited,
}
_HINTS = {
    400: "the request was rejected as invalid; check projectId and environmentId",
    401: "the token is unknown, expired or revoked, or its scope was deleted",
    403: "the token may not read this environment",
    404: "the project or environment does not exist",
}
_FORBIDDEN_HINTS = {
    "API_SCOPE_FORBIDDEN": "the API key's scope does not cover this project or environment",
    "FORBIDDEN": "the API key's creator no longer has permission to read this environment",
}


def _undecodable(status: int, reason: str) -> Undecodable:
    return Undecodable(f"Himitsu API answered {status} but the {NOT_HIMITSU} ({reason})",
                       status=status)


def judge(
    status: int, headers: Mapping[str, str], body: bytes | None, *, known_version: int | None,
) -> FetchResult | HimitsuError:
    """The result of one answer, or the error to raise; ``known_version`` is the version
    sent as If-None-Match, if any; ``body`` None: a content-encoded body, not read."""
    if status == 200:
        decoded = decode_runtime(body) if body is not None else "encoded body"
        if isinstance(decoded, str):
            return _undecodable(200, decoded)
        version = header_version(headers)  # the header is the authority
        return Fetched(version=decoded[0] if version is None else version,
                       secrets=MappingProxyType(decoded[1]))
    if status == 304:
        # A 304 carries no secrets. Accept it only for the exact version asked about:
        # anything else would record a version whose data the target does not hold.
        version = header_version(headers)
        if version is None:
            return _undecodable(304, "no config version header")
        if version != known_version:
            return _undecodable(304, f"unchanged at version {version}, asked about {known_version}")
        return NotModified(version=version)
    if 200 <= status < 300:
        return _undecodable(status, "only 200 and 304 are expected")
    if 300 <= status < 400:
        return UnexpectedStatus(f"Himitsu API answered {status}: redirect not followed "
                                "(check apiUrl)", status=status)
    return _judge_error(status, headers, body)


def _judge_error(status: int, headers: Mapping[str, str], body: bytes | None) -> HimitsuError:
    kind = _ERRORS.get(status, ServerError if 500 <= status < 600 else UnexpectedStatus)
    found = envelope(body)
    if found is None:
        # Not from Himitsu (a proxy, a load balancer, a wrong URL): say so, echo nothing.
        message = f"Himitsu API answered {status}, but the {NOT_HIMITSU}"
        code = request_id = None
    else:
        code, request_id = found
        hint = _FORBIDDEN_HINTS.get(code) if status == 403 else None
        hint = hint or _HINTS.get(status, "server error" if kind is ServerError else "")
        message = f"Himitsu API answered {status} {code}" + (f": {hint}" if hint else "")
    delay = retry_after(headers) if kind is RateLimited else 0.0
    if kind is RateLimited:
        message += f"; rate limited, retry in {math.ceil(delay)} s"
    if request_id:
        message += f" (requestId {request_id})"
    if kind is RateLimited:
        return RateLimited(message, retry_after=delay, status=status, code=code,
                           request_id=request_id)
    return kind(message, status=status, code=code, request_id=request_id)
