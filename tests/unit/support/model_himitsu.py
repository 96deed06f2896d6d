"""An in-memory Himitsu API server for the model-based test, behind the REAL HimitsuClient.

The client is given a ``requests`` session whose transport adapter answers from this
model, so everything between the shared poller and the wire (If-None-Match, the
verdict on a 304, a 5xx, Retry-After) is the production code. What it keeps
of ``/work/shared/spec/himitsu-api.md``: a per-environment configVersion starting at 0
that grows by one per change; ``If-None-Match`` (a list, weak tags, ``*``) answered 304
when it names the current version, version 0 included; ETag and
``X-Himitsu-Config-Version`` on 200 and 304; fixed 60 s rate-limit windows that start
at a key's first request, 120 per key (304s and refused requests count) and 300 per
client IP, with ``RateLimit-*`` on every answer and ``Retry-After`` on a 429; another
client can spend the same key's budget; 500 INTERNAL_ERROR on demand; slow answers.
"""

from __future__ import annotations

import io
import json
import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import requests
from requests.adapters import BaseAdapter
from requests.structures import CaseInsensitiveDict

KEY_LIMIT, IP_LIMIT, WINDOW = 120, 300, 60.0
_PATH = re.compile(r"/api/v1/projects/(?P<p>[^/]+)/environments/(?P<e>[^/]+)/secrets/runtime")
_TAG = re.compile(r'(?:W/)?"himi-config-([0-9]+)"')


@dataclass
class Window:
    start: float
    count: int = 0


@dataclass(frozen=True)
class Request:
    at: float
    token: str
    env: str
    status: int
    if_none_match: str | None


@dataclass
class ModelHimitsu:
    """Environments (by id) with their whole history, the keys that may read them, and
    the server's rate-limit windows. Times are simulated seconds (``now``)."""

    now: Callable[[], float]
    spend: Callable[[float], None]
    latency: Callable[[], float] = lambda: 0.0
    history: dict[str, list[tuple[float, dict[str, str]]]] = field(default_factory=dict)
    tokens: dict[str, frozenset[str]] = field(default_factory=dict)
    requests: list[Request] = field(default_factory=list)
    fail_next: int = 0  # answer this many requests 500 INTERNAL_ERROR
    slow_next: list[float] = field(default_factory=list)  # extra seconds, one per request
    horizon: float = 0.0  # the latest end of a window in which the budget ran short
    # The same per API key ("" for the IP's window): till when that key's budget is short.
    short_until: dict[str, float] = field(default_factory=dict)
    on_answer: Callable[[Request], None] = lambda request: None
    _keys: dict[str, Window] = field(default_factory=dict)
    _ip: Window | None = None
    _ids: int = 0

    # -- the environments -------------------------------------------------------------

    def add_environment(self, env: str, data: Mapping[str, str] | None = None) -> None:
        self.history[env] = [(self.now(), {})]
        for key, value in (data or {}).items():
            self.set(env, key, value)

    def version(self, env: str) -> int:
        return len(self.history[env]) - 1

    def data(self, env: str, version: int | None = None) -> dict[str, str]:
        return dict(self.history[env][self.version(env) if version is None else version][1])

    def version_at(self, env: str, at: float) -> int:
        """The version that was current at simulated time ``at``."""
        versions = [v for v, (t, _) in enumerate(self.history[env]) if t <= at]
        return versions[-1] if versions else 0

    def set(self, env: str, key: str, value: str) -> None:
        """Create or update a secret: one more version, even for an unchanged value."""
        self.history[env].append((self.now(), {**self.data(env), key: value}))

    def delete(self, env: str, key: str) -> bool:
        data = self.data(env)
        if key not in data:
            return False
        del data[key]
        self.history[env].append((self.now(), data))
        return True

    # -- the budget -------------------------------------------------------------------

    def spend_budget(self, token: str, requests_made: int) -> None:
        """Another client using the same API key made ``requests_made`` requests now."""
        window = self._window(self._keys.get(token))
        self._keys[token] = window
        window.count += requests_made
        if window.count > KEY_LIMIT * 3 // 4:
            self._short(token, window)

    def _short(self, key: str, window: Window) -> None:
        """``key``'s budget (the IP's for "") ran short in ``window``."""
        end = window.start + WINDOW
        self.horizon = max(self.horizon, end)
        self.short_until[key] = max(self.short_until.get(key, 0.0), end)

    def _window(self, window: Window | None) -> Window:
        now = self.now()
        if window is None or now >= window.start + WINDOW:
            return Window(start=now)
        return window

    # -- the endpoint -----------------------------------------------------------------

    def answer(self, url: str, headers: Mapping[str, str]) -> tuple[int, dict[str, str], bytes]:
        self.spend(self.latency() + (self.slow_next.pop(0) if self.slow_next else 0.0))
        self._ip = ip = self._window(self._ip)
        ip.count += 1
        if ip.count > IP_LIMIT:
            return self._limited(ip, IP_LIMIT, "", "")
        auth = headers.get("Authorization", "")
        token = auth[len("Bearer "):] if auth.startswith("Bearer ") else ""
        match = _PATH.fullmatch(urlsplit(url).path)
        if token not in self.tokens:
            return self._error(401, "UNAUTHENTICATED", {})
        window = self._keys[token] = self._window(self._keys.get(token))
        window.count += 1
        limits = _limit_headers(window, self.now())
        if window.count > KEY_LIMIT:
            return self._limited(window, KEY_LIMIT, token, match["e"] if match else "")
        if window.count > KEY_LIMIT * 3 // 4:
            self._short(token, window)
        if match is None:
            return self._error(404, "NOT_FOUND", limits)
        env = match["e"]
        if env not in self.tokens[token] or env not in self.history:
            return self._error(403, "API_SCOPE_FORBIDDEN", limits)
        if self.fail_next > 0:
            self.fail_next -= 1
            return self._record(token, env, headers, *self._error(500, "INTERNAL_ERROR", limits))
        version = self.version(env)
        tags = {"ETag": f'"himi-config-{version}"', "X-Himitsu-Config-Version": str(version)}
        if _names(headers.get("If-None-Match"), version):
            return self._record(token, env, headers, 304, {**limits, **tags}, b"")
        body = json.dumps({"data": {"configVersion": version, "secrets": self.data(env)}})
        return self._record(token, env, headers, 200,
                            {**limits, **tags, "Content-Type": "application/json"}, body.encode())

    def _record(self, token: str, env: str, headers: Mapping[str, str], *answer: Any,
                ) -> tuple[int, dict[str, str], bytes]:
        status, answer_headers, body = answer
        request = Request(self.now(), token, env, status, headers.get("If-None-Match"))
        self.requests.append(request)
        self.on_answer(request)
        return status, answer_headers, body

    def _limited(self, window: Window, limit: int, token: str, env: str,
                 ) -> tuple[int, dict[str, str], bytes]:
        self._short(token, window)
        retry = max(1, math.ceil(window.start + WINDOW - self.now()))
        status, headers, body = self._error(429, "RATE_LIMITED", {
            **_limit_headers(window, self.now(), limit), "Retry-After": str(retry)})
        return self._record(token, env, {}, status, headers, body)

    def _error(self, status: int, code: str, headers: dict[str, str],
               ) -> tuple[int, dict[str, str], bytes]:
        self._ids += 1
        body = {"error": {"code": code, "message": code.lower().replace("_", " "),
                          "requestId": f"req-{self._ids}"}}
        return status, {**headers, "Content-Type": "application/json"}, json.dumps(body).encode()


def _limit_headers(window: Window, now: float, limit: int = KEY_LIMIT) -> dict[str, str]:
    reset = max(0, math.ceil(window.start + WINDOW - now))
    return {"RateLimit-Limit": str(limit), "RateLimit-Remaining": str(max(0, limit - window.count)),
            "RateLimit-Reset": str(reset), "RateLimit-Policy": f"{limit};w={reset}"}


def _names(header: str | None, version: int) -> bool:
    """Does an If-None-Match header name ``version`` (or ``*``)? Unrecognised tags are
    ignored, as the server does."""
    for part in (header or "").split(","):
        tag = part.strip()
        if tag == "*":
            return True
        match = _TAG.fullmatch(tag)
        if match and int(match.group(1)) == version:
            return True
    return False


class _Adapter(BaseAdapter):
    def __init__(self, server: ModelHimitsu) -> None:
        super().__init__()
        self._server = server

    def send(self, request: requests.PreparedRequest, stream: bool = False,  # noqa: PLR0917
             timeout: Any = None, verify: Any = True, cert: Any = None,
             proxies: Any = None) -> requests.Response:
        status, headers, body = self._server.answer(str(request.url), request.headers)
        response = requests.Response()
        response.status_code = status
        response.headers = CaseInsensitiveDict(headers)
        response.raw = io.BytesIO(body)
        response.url = str(request.url)
        response.request = request
        response.reason = "OK" if status < 300 else "Error"
        return response

    def close(self) -> None:
        return None


def session_for(server: ModelHimitsu) -> requests.Session:
    """A session whose every request is answered by ``server`` (no network at all)."""
    session = requests.Session()
    session.trust_env = False  # no proxies or CA bundles from the environment
    adapter = _Adapter(server)
    session.mount("https://", adapter)
    session.mount("http://", adapter)
    return session
