"""Fault injection: the ways a Himitsu request goes wrong in production, on demand.

Why: the operator's retry, backoff, size cap, deadline and "never echo a proxy's body"
rules can only be proven against answers that break them. A fault matches one
environment or (without ``environment``) every runtime request, for the next ``count``
matching requests or, without ``count``, until cleared. Faults apply before any check,
as a proxy or a failing server would, so they use no rate-limit budget.

Replacements (the first matching one answers the request):
  error        ``status`` (default 500, any 4xx/5xx) with an error envelope; ``code``
  garbage      a non-envelope body (default: a proxy's HTML), ``status`` default 502
  reset        close the connection without answering (TCP RST)
  huge         a valid 200 of ``size_mb`` MB: only a client-side size cap stops it
  wrong_shape  a 200 whose JSON is not the runtime shape (``body`` to choose it)
  rate_limit   429 RATE_LIMITED with ``Retry-After: retry_after``, Remaining 0
Modifiers (applied to whatever is answered, together with a replacement):
  delay        wait ``seconds`` before answering
  trickle      send the body at ``bytes_per_second``
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass

from .wire import JSON_TYPE, Answer, FixedWindows, error_answer, version_headers

FAULT_KINDS = ("error", "garbage", "reset", "huge", "wrong_shape", "rate_limit", "delay",
               "trickle")
_DEFAULT_STATUS = {"error": 500, "garbage": 502, "rate_limit": 429}
_PROXY_HTML = "<html><head><title>{0}</title></head><body><h1>{0} Bad Gateway</h1></body></html>"
_WRONG_SHAPE = '{"data": {"configVersion": "7", "secrets": ["NOT", "A_MAP"]}}'


@dataclass
class _Fault:
    kind: str
    environment: str | None
    remaining: int | None
    status: int
    code: str | None
    seconds: float
    bytes_per_second: int
    size_mb: float
    retry_after: int
    body: str | None


class FaultBook:
    """The active faults; the core calls it under its lock."""

    def __init__(self, key_limits: FixedWindows) -> None:
        self._key_limits = key_limits  # a forced 429 advertises the real policy
        self._faults: dict[str, _Fault] = {}

    def add(self, kind: str, *, environment: str | None, count: int | None, status: int | None,
            code: str | None, seconds: float, bytes_per_second: int, size_mb: float,
            retry_after: int, body: str | None) -> str:
        if kind not in FAULT_KINDS:
            raise ValueError(f"unknown fault kind {kind!r}; one of {', '.join(FAULT_KINDS)}")
        status = int(status or _DEFAULT_STATUS.get(kind, 200))
        if kind in ("error", "garbage") and not 400 <= status <= 599:
            raise ValueError("an error status must be 4xx or 5xx")
        if (kind == "trickle" and bytes_per_second <= 0) or (kind == "huge" and size_mb <= 0):
            raise ValueError(f"{kind} needs a positive bytes_per_second or size_mb")
        if kind == "delay" and seconds <= 0:
            raise ValueError("delay needs positive seconds")
        if count is not None and int(count) <= 0:
            raise ValueError("count must be positive (or absent: until cleared)")
        fault_id = uuid.uuid4().hex[:12]
        self._faults[fault_id] = _Fault(
            kind, environment, None if count is None else int(count), status, code,
            float(seconds), int(bytes_per_second), float(size_mb), int(retry_after), body)
        return fault_id

    def clear(self, fault_id: str | None = None) -> None:
        if fault_id is None:
            self._faults.clear()
        elif self._faults.pop(fault_id, None) is None:
            raise KeyError("no such fault")

    def take(self, environment: str, version: int) -> tuple[Answer | None, float, int, list[str]]:
        """Consume the faults matching one request: (replacement, delay, trickle, kinds)."""
        replacement, delay, trickle, used = None, 0.0, 0, []
        for fault_id, fault in list(self._faults.items()):
            if fault.environment not in (None, environment):
                continue
            if fault.kind == "delay":
                delay += fault.seconds
            elif fault.kind == "trickle":
                trickle = fault.bytes_per_second
            elif replacement is None:
                replacement = self._answer(fault, version)
            else:
                continue  # one replacement per request; the others wait their turn
            used.append(fault.kind)
            if fault.remaining is not None:
                fault.remaining -= 1
                if fault.remaining <= 0:
                    del self._faults[fault_id]
        return replacement, delay, trickle, used

    def _answer(self, fault: _Fault, version: int) -> Answer:
        if fault.kind == "error":
            return error_answer(fault.status, "injected failure", code=fault.code)
        if fault.kind == "garbage":
            text = fault.body if fault.body is not None else _PROXY_HTML.format(fault.status)
            return Answer(fault.status, {"Content-Type": "text/html"}, text.encode())
        if fault.kind == "reset":
            return Answer(0, reset=True)
        if fault.kind == "rate_limit":
            wait = str(fault.retry_after)
            return error_answer(429, "too many requests", {
                "RateLimit-Policy": self._key_limits.policy(fault.retry_after),
                "RateLimit-Limit": str(self._key_limits.limit), "RateLimit-Remaining": "0",
                "RateLimit-Reset": wait, "Retry-After": wait})
        if fault.kind == "wrong_shape":
            text = fault.body if fault.body is not None else _WRONG_SHAPE
            return Answer(fault.status, {"Content-Type": JSON_TYPE}, text.encode())
        head = f'{{"data": {{"configVersion": {version}, "secrets": {{"HUGE": "'.encode()
        return Answer(fault.status, {"Content-Type": JSON_TYPE, **version_headers(version)},
                      head + b'"}}}', filler=int(fault.size_mb * 1024 * 1024), tail=4)
