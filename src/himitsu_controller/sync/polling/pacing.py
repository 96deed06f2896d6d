"""Pacing: every request to Himitsu takes a place in line that keeps its key's and its
API URL's budget in any 60 s window, and yields to other clients.

* GCRA with reservations per key and per API URL: a burst, then an even pace.
* The server-header clamp: ``RateLimit-Remaining``/``-Reset`` cap us until its window ends.

Design: docs/design/pacing.md
"""

from __future__ import annotations

import bisect
import heapq
import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from himitsu_controller import himitsu
from himitsu_controller.himitsu.wire import RateLimits

__all__ = ["API_BUDGET", "LATE", "TOKEN_BUDGET", "WINDOW", "LocallyRateLimited", "Pacer"]

# Himitsu allows 120 requests per API key and 300 per client IP (every token this
# operator holds shares the one IP, so pace per API URL too) in each 60 s window.
TOKEN_BUDGET = 100
API_BUDGET = 250
SERVER_WINDOW = 60.0
LATE = 2.0  # how long past its moment a reserved place is still honoured
# The log's window: Himitsu's, plus LATE (a late send), plus 1 s of network jitter.
WINDOW = SERVER_WINDOW + LATE + 1.0
RESERVE_FRACTION = 0.05  # of the server's limit, left to the key's other users in flight
MIN_RESERVE = 2
BURST_FRACTION = 0.1  # of the budget that may go at once; the rest keeps an even pace


class LocallyRateLimited(himitsu.RateLimited):
    """Not sent: this key's or API URL's pace. ``retry_after``: seconds until the
    request's reserved place in line; it is kept for the caller until then."""


class _Log:
    """One budget: GCRA's ``tat`` (a burst, then one per ``spacing``: no window holds
    more than the budget), and the moments placed within the window, for the server's count."""

    def __init__(self, budget: int, window: float) -> None:
        self.budget, self.window = budget, window
        burst = max(1, round(budget * BURST_FRACTION))
        self.spacing = window / (budget - burst + 1)
        self.tolerance = (burst - 1) * self.spacing
        self.tat = -math.inf
        self.times: list[float] = []

    def prune(self, now: float) -> None:
        del self.times[:bisect.bisect_left(self.times, now - self.window)]

    def earliest(self, t: float) -> float:
        """The first moment >= t the pace allows."""
        return max(t, self.tat - self.tolerance)

    def count(self, start: float, end: float) -> int:
        return bisect.bisect_left(self.times, end) - bisect.bisect_left(self.times, start)

    def add(self, t: float) -> float:
        """Place a request at ``t``; the ``tat`` before it (to undo the place)."""
        before = self.tat
        bisect.insort(self.times, t)
        self.tat = max(before, t) + self.spacing
        return before

    def remove(self, t: float, before: float) -> None:
        """A place never used: out of the count, and out of the pace if it was the last."""
        i = bisect.bisect_left(self.times, t)
        if i < len(self.times) and self.times[i] == t:
            del self.times[i]
        if self.tat == max(before, t) + self.spacing:
            self.tat = before


@dataclass(frozen=True)
class _Place:
    at: float
    api_url: str
    key: str
    before: tuple[float, float]  # the key's and the API URL's pace before it


@dataclass
class _ServerView:
    """The server's count: our requests in [start, end) may number ``allowed`` + 1."""

    start: float
    end: float
    allowed: int
    limit: int


@dataclass
class Pacer:
    """Places in line per API key and per API URL; thread-safe. ``admit`` is the shared
    poller's; ``answered`` is the client's ``himitsu.Pacing``."""

    clock: Callable[[], float] = time.monotonic
    token_budget: int = TOKEN_BUDGET
    api_budget: int = API_BUDGET
    window: float = WINDOW
    _logs: dict[tuple[str, str], _Log] = field(default_factory=dict, init=False, repr=False)
    _views: dict[str, _ServerView] = field(default_factory=dict, init=False, repr=False)
    _places: dict[str, _Place] = field(default_factory=dict, init=False, repr=False)
    _expiries: list[tuple[float, str]] = field(default_factory=list, init=False, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False)

    def admit(self, ticket: str, api_url: str, key: str) -> float:
        """0.0: send now (it is counted); else the seconds until ``ticket``'s place, kept
        until ``late`` seconds past it."""
        with self._lock:
            now = self.clock()
            self._prune(now)
            held = self._places.pop(ticket, None)
            if held is not None and (held.api_url, held.key) != (api_url, key):
                self._drop(held)  # the ticket now names another key: its place is void
                held = None
            if held is not None:
                if now < held.at:
                    self._places[ticket] = held
                    return held.at - now
                if self._server_allows(held.key, now, placed=held.at):
                    return 0.0
                self._drop(held)  # the server's count left no room: a new place
            at = self._earliest(api_url, key, now)
            before = (self._log("token", key).add(at), self._log("api", api_url).add(at))
            if at <= now:
                return 0.0
            self._places[ticket] = _Place(at, api_url, key, before)
            heapq.heappush(self._expiries, (at + LATE, ticket))
            return at - now

    def answered(
        self, api_url: str, key: str, limits: RateLimits, *, elapsed: float,
    ) -> None:
        """``himitsu.Pacing``: the server's count for the key, from an answer's headers."""
        with self._lock:
            now = self.clock()
            start = now - max(0.0, elapsed) - LATE  # when it was sent, or reserved
            current = self._views.get(key)
            if current is not None and current.start > start:
                return  # an answer to an older request: the newer count stands
            limit = limits.limit or self.token_budget
            reserve = max(MIN_RESERVE, math.ceil(limit * RESERVE_FRACTION))
            self._views[key] = _ServerView(start=start, end=now + limits.reset,
                                           allowed=limits.remaining - reserve, limit=limit)

    def headroom(self) -> dict[str, float]:
        """The smallest share of a budget left (0..1) over API keys and over API URLs, by
        our count or the server's if less (``himitsu_api_rate_limit_headroom_ratio``)."""
        with self._lock:
            now = self.clock()
            self._prune(now)
            left = {"api_key": 1.0, "api_url": 1.0}
            for (kind, key), log in self._logs.items():
                share = max(0, log.budget - len(log.times)) / log.budget
                view = self._views.get(key) if kind == "token" else None
                if view is not None and view.start <= now < view.end and view.limit > 0:
                    spare = view.allowed - (log.count(view.start, view.end) - 1)
                    share = min(share, max(0, spare) / view.limit)
                scope = "api_key" if kind == "token" else "api_url"
                left[scope] = min(left[scope], share)
            for key, view in self._views.items():
                if (("token", key) not in self._logs and view.start <= now < view.end
                        and view.limit > 0):
                    left["api_key"] = min(left["api_key"], max(0, view.allowed) / view.limit)
            return left

    # -- inside the lock ------------------------------------------------------------------
    def _earliest(self, api_url: str, key: str, t: float) -> float:
        token, api = self._log("token", key), self._log("api", api_url)
        while True:
            t = token.earliest(t)
            later = api.earliest(t)
            if later > t:
                t = later
                continue
            if not self._server_allows(key, t):
                t = self._views[key].end
                continue
            return t

    def _server_allows(self, key: str, t: float, *, placed: float | None = None) -> bool:
        """Would one more request at ``t`` (placed at ``placed``) fit the server's count?"""
        view = self._views.get(key)
        if view is None or not view.start <= t < view.end:
            return True
        counted = placed is not None and view.start <= placed < view.end
        ours = self._log("token", key).count(view.start, view.end) + (not counted)
        return ours - 1 <= view.allowed  # less the answered request itself

    def _log(self, kind: str, key: str) -> _Log:
        log = self._logs.get((kind, key))
        if log is None:
            budget = self.token_budget if kind == "token" else self.api_budget
            log = self._logs[(kind, key)] = _Log(budget, self.window)
        return log

    def _drop(self, place: _Place) -> None:
        self._log("token", place.key).remove(place.at, place.before[0])
        self._log("api", place.api_url).remove(place.at, place.before[1])

    def _prune(self, now: float) -> None:
        while self._expiries and self._expiries[0][0] < now:
            expiry, ticket = heapq.heappop(self._expiries)
            place = self._places.get(ticket)
            if place is not None and place.at + LATE == expiry:
                del self._places[ticket]  # never came back: free its place
                self._drop(place)
        for name, log in list(self._logs.items()):
            log.prune(now)
            if not log.times:
                del self._logs[name]
        for key, view in list(self._views.items()):
            if view.end <= now:
                del self._views[key]
