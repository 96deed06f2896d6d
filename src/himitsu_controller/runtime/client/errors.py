"""The two ways a request to the apiserver fails, as the rest of the runtime sees them.

* ``ApiError``: the Status fields (code, reason, message), never the body or headers;
  ``TransportError``: no status came back; ``WriteRefused``: never sent (not leading).
* ``ApiError.message`` is redacted when the error is made (``redact_values``): a denial
  keeps only who denied, and no quoted value of the object survives.

Design: docs/design/apiserver-client.md
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

__all__ = ["ApiError", "TransportError", "WriteRefused", "describe_exception",
           "is_resource_expired", "is_too_large_resource_version", "redact_values"]

# What client-go's apierrors reports when the body is not a Status object.
_REASON_BY_STATUS = {
    400: "BadRequest", 401: "Unauthorized", 403: "Forbidden", 404: "NotFound",
    405: "MethodNotAllowed", 406: "NotAcceptable", 409: "Conflict", 410: "Gone",
    413: "RequestEntityTooLarge", 415: "UnsupportedMediaType", 422: "Invalid",
    429: "TooManyRequests", 500: "InternalError", 503: "ServiceUnavailable", 504: "Timeout",
}
_MAX_MESSAGE = 1000
REDACTED = '"[redacted]"'
WITHHELD = "[message withheld: not the apiserver's own]"

# Who denied, as the apiserver words it; the free text after it is the denier's own.
_DENIED_BY = re.compile(
    r'admission webhook "(?:[^"\\]|\\.)*" denied the request'
    r"|(?:ValidatingAdmissionPolicy|MutatingAdmissionPolicy|policy) '[^']*'"
    r"(?: with binding '[^']*')? denied request")
# The apiserver's own 400/403/422 texts: validation (``Secret "x" is invalid: ...``), RBAC
# and quota (``secrets "x" is forbidden: ...``), decoding and request checks.
_OWN_TEXT = re.compile(
    r'(?:[\w.-]+(?: "(?:[^"\\]|\\.)*")? is (?:invalid|forbidden)(?:: |$)'
    r'|[\w.-]+ in version "[^"]*" cannot be handled as a '
    r"|the (?:server|body of the request|API version|namespace of the provided object) "
    r"|(?:name|resource name) (?:must|may not) )")
# A quoted string: Go %q (backslash escapes), or 'x', `x`, curly quotes. No closing quote:
# the text was cut inside it.
_QUOTED = re.compile(
    r'"(?:[^"\\]|\\.)*(?P<close>")?'
    r"|'(?:[^'\\]|\\.)*(?P<close1>')?"
    r"|`[^`]*(?P<close2>`)?"
    r"|\u201c[^\u201d]*(?P<close3>\u201d)?"
    r"|\u2018[^\u2019]*(?P<close4>\u2019)?", re.DOTALL)
# What may precede a double-quoted string that names something rather than holding a
# value: `secrets "app" is forbidden`, `Secret "app" is invalid`, `leases.coordination.
# k8s.io "x"`, `User "system:serviceaccount:..."`, `resource "secrets" in API group ""
# in the namespace "apps"`, `admission webhook "deny.example.com" denied the request`.
_NAMING = re.compile(
    r"(?:^|[\s\[(,])(?:(?:secrets|Secret|events|Event|leases|Lease|namespaces|Namespace"
    r"|serviceaccounts|ServiceAccount|himitsusecrets|HimitsuSecret)(?:\.[a-z0-9.-]+)?"
    r"|User|resource|API group|the namespace|admission webhook|calling webhook) $")
# ValidatingAdmissionPolicy 'p' with binding 'b' denied request.
_NAMING_SINGLE = re.compile(r"(?:AdmissionPolicy|policy|binding) $")
# `Unsupported value: "x": supported values: "a", "b"`: the schema's own constants.
_SUPPORTED = re.compile(r'supported values: (?:"(?:[^"\\]|\\.)*", )*$')
_FIELD_WORDS = frozenset({"`immutable`"})  # `data: Forbidden: field is immutable when ...`


class TransportError(Exception):
    """The request never produced an HTTP status: connect/read failure, reset, timeout."""


class WriteRefused(TransportError):
    """A write not sent: the replica's write gate is closed (it does not hold the Lease,
    or can no longer vouch that it does). Retrying cannot help until it leads again."""


class ApiError(Exception):
    """A non-2xx answer from the apiserver, described by its Status object only (never the
    request body), its message redacted (``redact_values``). ``details``: the Status
    details' kind, name and group, which tell the apiserver's own AlreadyExists from a
    webhook's denial with that reason; ``causes``: their reasons, never their messages."""

    def __init__(self, status: int, reason: str, message: str, *,
                 retry_after: float | None = None, causes: tuple[str, ...] = (),
                 details: Mapping[str, str] | None = None) -> None:
        message = redact_values(message[:_MAX_MESSAGE], status=status)[:_MAX_MESSAGE]
        super().__init__(f"{status} {reason}: {message}")
        self.status = status
        self.reason = reason
        self.message = message
        self.retry_after = retry_after
        self.causes = causes
        self.details: Mapping[str, str] = dict(details or {})

    @classmethod
    def from_response(cls, status: int, body: bytes,
                      headers: Mapping[str, str] | None = None) -> ApiError:
        try:
            decoded = json.loads(body) if body else None
        except ValueError:
            decoded = None
        if not isinstance(decoded, dict) or decoded.get("kind") != "Status":
            decoded = {}
        return cls._of(status, decoded, f"the server responded with status {status}",
                       retry_after=_parse_retry_after((headers or {}).get("Retry-After")))

    @classmethod
    def from_status(cls, status_object: Mapping[str, Any]) -> ApiError:
        """An ApiError from a Status carried in a watch ERROR event."""
        code = int(status_object.get("code") or 500)
        return cls._of(code, status_object, f"watch error {code}")

    @classmethod
    def _of(cls, code: int, status: Mapping[str, Any], message: str, *,
            retry_after: float | None = None) -> ApiError:
        found = status.get("details")
        details: Mapping[str, Any] = found if isinstance(found, Mapping) else {}
        causes = details.get("causes")
        return cls(code, str(status.get("reason") or _REASON_BY_STATUS.get(code, "Unknown")),
                   str(status.get("message") or message), retry_after=retry_after,
                   causes=tuple(str(c["reason"]) for c in causes
                                if isinstance(c, dict) and c.get("reason"))
                   if isinstance(causes, list) else (),
                   details={k: details[k] for k in ("kind", "name", "group")
                            if isinstance(details.get(k), str)})


def is_resource_expired(exc: ApiError) -> bool:
    """client-go's isExpiredError: 410, reason Expired (or Gone, from servers before 1.18)."""
    return exc.status == 410 or exc.reason in ("Expired", "Gone")


def is_too_large_resource_version(exc: ApiError) -> bool:
    """client-go's isTooLargeResourceVersionError (e.g. after an etcd restore): a cause
    since 1.18.6, before only a 504 Timeout's message."""
    if "ResourceVersionTooLarge" in exc.causes:
        return True
    return exc.reason == "Timeout" and "too large resource version" in exc.message.lower()


def redact_values(message: str, *, status: int | None = None) -> str:
    """``message`` without anything that may be a value of the object refused.

    A denial by admission is cut after who denied; with ``status`` 400, 403 or 422 a text
    in none of the apiserver's own shapes is withheld. In what is left every quoted string
    (or the rest of a message cut inside a quote) becomes ``"[redacted]"`` unless it names
    something (``_NAMING``) or lists supported values.
    """
    denied = _DENIED_BY.search(message)
    if denied is not None:
        message = message[:denied.end()]
    elif status in (400, 403, 422) and _OWN_TEXT.match(message) is None:
        return WITHHELD
    return _QUOTED.sub(lambda match: match.group() if _kept(message, match) else REDACTED,
                       message)


def _kept(message: str, match: re.Match[str]) -> bool:
    text, head = match.group(), message[:match.start()]
    if text[0] == '"':
        return match.group("close") is not None and (
            _NAMING.search(head) is not None or _SUPPORTED.search(head) is not None)
    if text[0] == "'":
        return match.group("close1") is not None and _NAMING_SINGLE.search(head) is not None
    return text in _FIELD_WORDS


def _parse_retry_after(value: str | None) -> float | None:
    try:  # client-go honours only the integer-seconds form
        seconds = int(value.strip()) if value is not None else -1
    except ValueError:
        return None
    return float(seconds) if seconds >= 0 else None


def describe_exception(exc: BaseException) -> str:
    """One line naming an exception, short enough for a log field or an error string."""
    first = next(iter(str(exc).strip().splitlines()), "")
    return f"{type(exc).__name__}: {first[:200]}" if first else type(exc).__name__
