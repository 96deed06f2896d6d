"""Shared polls: one conditional request per source per refresh window, however many read it.

* A source is (API URL, project, environment, sha256 of the token): one token's readers
  share, different tokens never do. One request at a time per source, conditional.
* Secrets are held once per source until its last reader is released.

Design: docs/design/polls.md
"""

from __future__ import annotations

import json
import random
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Protocol

from himitsu_controller import himitsu
from himitsu_controller.sync.polling.pacing import LocallyRateLimited, Pacer

__all__ = ["Blocked", "Client", "LocallyRateLimited", "SharedPoller"]

IDLE_TTL = 3600.0
FLIGHT_TIMEOUT = 60.0  # how long a reader waits for another's request in flight
FAILURE_HOLD = 1.0  # a source whose request failed (5xx, transport) is not asked again sooner


class Client(Protocol):
    def fetch(
        self, *, api_url: str, project_id: str, environment_id: str, token: str,
        known_version: int | None,
    ) -> himitsu.FetchResult: ...


class Blocked(LocallyRateLimited):
    """Not sent: Himitsu refused this source's last request (a 429 until its Retry-After,
    a 5xx or a transport error for ``FAILURE_HOLD``): one request per source, not per reader."""


@dataclass
class _Entry:
    at: float = 0.0
    version: int | None = None
    secrets: bytes | None = field(default=None, repr=False)  # ``_pack``ed
    blocked_until: float = 0.0
    refusal: str = "rate limited by the Himitsu API"  # why blocked (the failure said the rest)
    jitter: float = 0.0  # drawn once per request; see ``SharedPoller``
    readers: set[str] = field(default_factory=set)
    released: bool = False  # its last reader left while a request was in flight


@dataclass
class _Flight:
    done: threading.Event = field(default_factory=threading.Event)
    error: BaseException | None = None


class SharedPoller:
    """Every answer carries its request's age and one jitter drawn for it (``rng``), so
    its readers come back together; ``pacer`` is the client's too (one line per key)."""

    def __init__(
        self, client: Client, *, clock: Callable[[], float] = time.monotonic,
        pacer: Pacer | None = None, rng: Callable[[], float] = random.random,
    ) -> None:
        self._client = client
        self._clock = clock
        self._rng = rng
        self._pacer = pacer if pacer is not None else Pacer(clock=clock)
        self._entries: dict[str, _Entry] = {}
        self._readers: dict[str, str] = {}  # reader -> the source it reads
        self._flights: dict[str, _Flight] = {}
        self._lock = threading.Lock()

    def fetch(
        self, *, api_url: str, project_id: str, environment_id: str, token: str,
        known_version: int | None, max_age: float = 0.0, reader: str | None = None,
    ) -> himitsu.FetchResult:
        """An answer no older than ``max_age``; NotModified only when ``known_version`` is
        current. ``reader`` (a HimitsuSecret's key) reads the source until ``release``."""
        source = himitsu.source_fingerprint(api_url, project_id, environment_id, token)
        while True:
            with self._lock:
                if reader is not None:
                    self._enlist(reader, source)
                answer = self._cached(source, known_version, max_age)
                if answer is not None:
                    return answer
                flight = self._flights.get(source)
                if flight is None:
                    flight = self._flights[source] = _Flight()
                    break
            # Someone is asking Himitsu right now: their answer is as fresh as ours would be.
            flight.done.wait(FLIGHT_TIMEOUT)
            if flight.error is not None:
                raise flight.error
            max_age = float("inf")
        try:
            return self._request(source, api_url=api_url, project_id=project_id,
                                 environment_id=environment_id, token=token,
                                 known=known_version)
        except BaseException as exc:
            flight.error = exc
            raise
        finally:
            with self._lock:
                self._flights.pop(source, None)
                entry = self._entries.get(source)
                if entry is not None and entry.released and not entry.readers:
                    del self._entries[source]
            flight.done.set()

    def remembered(
        self, *, api_url: str, project_id: str, environment_id: str, token: str,
    ) -> himitsu.Fetched | None:
        """The secrets held for this exact source, however old (None: none are held)."""
        source = himitsu.source_fingerprint(api_url, project_id, environment_id, token)
        with self._lock:
            entry = self._entries.get(source)
            if entry is None or entry.secrets is None or entry.version is None:
                return None
            return himitsu.Fetched(version=entry.version, secrets=_unpack(entry.secrets),
                                   age=max(0.0, self._clock() - entry.at), jitter=entry.jitter)

    def release(self, reader: str) -> None:
        """``reader`` reads nothing any more; its source's entry goes with its last reader."""
        with self._lock:
            source = self._readers.pop(reader, None)
            if source is not None:
                self._leave(reader, source)

    def _enlist(self, reader: str, source: str) -> None:
        previous = self._readers.get(reader)
        if previous != source:
            self._readers[reader] = source
            if previous is not None:
                self._leave(reader, previous)
        entry = self._entries.setdefault(source, _Entry())
        entry.readers.add(reader)
        entry.released = False

    def _leave(self, reader: str, source: str) -> None:
        entry = self._entries.get(source)
        if entry is None:
            return
        entry.readers.discard(reader)
        if not entry.readers:
            if source in self._flights:
                entry.released = True  # dropped when the request in flight is answered
            else:
                del self._entries[source]

    def _cached(
        self, source: str, known: int | None, max_age: float,
    ) -> himitsu.FetchResult | None:
        entry = self._entries.get(source)
        if entry is None:
            return None
        now = self._clock()
        age = now - entry.at
        if max_age > 0 and age <= max_age:  # a 429 since takes nothing away from an answer
            answer = _answer(entry, known, age)
            if answer is not None:
                return answer
        if entry.blocked_until > now:  # Himitsu answered 429 for this source: everyone waits
            wait = entry.blocked_until - now
            raise Blocked(
                f"{entry.refusal}, retrying in {max(1, round(wait))} s",
                retry_after=wait)
        return None

    def _request(
        self, source: str, *, api_url: str, project_id: str, environment_id: str, token: str,
        known: int | None,
    ) -> himitsu.FetchResult:
        """Ask Himitsu once, conditional on the version whose secrets are held, else on the
        caller's (a target in sync after a restart is confirmed by a 304), and remember."""
        wait = self._pacer.admit(source, himitsu.validate_api_url(api_url),
                                 himitsu.pacing_key(api_url, token))
        if wait > 0:
            raise LocallyRateLimited("Himitsu request pace for this token or API reached",
                                     retry_after=wait)
        with self._lock:
            entry = self._entries.setdefault(source, _Entry())
            held = entry.version if entry.secrets is not None else known
            sent = self._clock()
        try:
            result = self._client.fetch(
                api_url=api_url, project_id=project_id, environment_id=environment_id,
                token=token, known_version=held)
        except (himitsu.RateLimited, himitsu.ServerError, himitsu.TransportError) as exc:
            limited = isinstance(exc, himitsu.RateLimited)
            hold = float(exc.retry_after) if isinstance(exc, himitsu.RateLimited) else FAILURE_HOLD
            with self._lock:
                entry.blocked_until = self._clock() + hold
                entry.refusal = "rate limited by the Himitsu API" if limited \
                    else "the Himitsu API failed a moment ago"
            raise
        with self._lock:
            # ``entry`` is ours for the flight: it is never dropped meanwhile.
            entry.at = sent
            entry.jitter = self._rng()
            entry.blocked_until = 0.0
            if isinstance(result, himitsu.Fetched):
                entry.version, entry.secrets = result.version, _pack(result.secrets)
            elif result.version != entry.version:
                entry.version, entry.secrets = result.version, None
            answer = _answer(entry, known, max(0.0, self._clock() - sent))
            self._evict_idle(entry.at)
        if answer is None:  # a 304 for a version we did not send: the client refuses those
            raise himitsu.Undecodable("the Himitsu API answered 304 to an unconditional request")
        return answer

    def _evict_idle(self, now: float) -> None:
        """Entries nobody reads by name (no ``reader``) and nobody is asking for."""
        if len(self._entries) < 64:
            return
        for source in [s for s, e in self._entries.items()
                       if now - e.at > IDLE_TTL and not e.readers and s not in self._flights]:
            del self._entries[source]


def _answer(entry: _Entry, known: int | None, age: float) -> himitsu.FetchResult | None:
    """What ``entry`` can tell a caller whose target holds ``known``, if anything."""
    if entry.version is None:
        return None
    if known is not None and known == entry.version:
        return himitsu.NotModified(version=entry.version, age=age, jitter=entry.jitter)
    if entry.secrets is not None:
        return himitsu.Fetched(version=entry.version, secrets=_unpack(entry.secrets), age=age,
                               jitter=entry.jitter)
    return None


def _pack(secrets: Mapping[str, str]) -> bytes:
    """Compact JSON, ASCII escapes (a lone surrogate round-trips, for render to refuse)."""
    return json.dumps(dict(secrets), ensure_ascii=True, separators=(",", ":")).encode("ascii")


def _unpack(packed: bytes) -> Mapping[str, str]:
    secrets: dict[str, str] = json.loads(packed)
    return MappingProxyType(secrets)
