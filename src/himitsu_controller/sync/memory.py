"""What this process last wrote, per HimitsuSecret: client-go's "expectations".

The informer caches lag behind our own writes: the cache's resourceVersion is compared
with the one we wrote, so a lagging cache causes no full fetch and no second write.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from secrets import token_hex
from typing import Any

from himitsu_controller import api

__all__ = ["Memory", "resource_version", "uid_of"]


@dataclass(slots=True)
class Memory:
    """Small by design, one per HimitsuSecret (dropped with it, rebuilt after a restart):
    versions, times, and strings shared with the cache or among readers."""

    uid: str
    target_rv: str | None = None
    failures: int = 0
    races: int = 0  # writes in a row that lost an optimistic-concurrency race (409)
    due: float | None = None  # when the next timed poll was scheduled (epoch seconds)
    read_live: bool = False  # a create found the target's name taken: read it directly
    answered: float | None = None  # when Himitsu gave the answer the target holds (epoch s)
    interval: float = 0.0  # the refreshInterval `answered` and `due` were scheduled with
    reads: tuple[str, ...] | None = None  # the spec's source (URL, env, token ref) last read
    source: str | None = None  # the poller source (token hash included) last fetched
    # A first sync or repair wrote an older answer: it takes only one asked for since then.
    revalidate: float | None = None
    # The source Himitsu last refused (401/403), how often in a row, and until when.
    refused: str | None = None
    refusals: int = 0
    refused_until: float = 0.0
    # sync.restarts: the data id the target holds, as written or seen here, the digest of
    # that data and the id's check, and since when (None: it was there before this process
    # looked), for the named workloads (kind, name) in ``sure`` (None: for all; others may
    # owe a restart for older data of unknown arrival); per workload the id for which it
    # is owed nothing; a write whose answer was lost: the id it sent, and when.
    data_id: str | None = None
    data_digest: str | None = None
    data_check: str | None = None
    data_since: float | None = None
    sure: frozenset[tuple[str, str]] | None = None
    workloads: dict[tuple[str, str], str] | None = None
    sent: tuple[str, float] | None = None

    # How a Memory changes: these methods are the only writers of its fields, each named
    # for what happened.

    def expect(self, rv: str | None) -> None:
        """The target now holds ``rv``; the informer may not have seen it yet."""
        self.target_rv = rv

    def scheduled(self, *, answered: float | None, interval: float, due: float | None) -> None:
        """The answer the target holds, the interval it is polled under, the next poll."""
        self.answered, self.interval, self.due = answered, interval, due

    def rescheduled(self, due: float | None) -> None:
        self.due = due

    def follow(self, reads: tuple[str, ...]) -> None:
        """The spec names another source: nothing fetched for the old one counts."""
        self.reads, self.source, self.revalidate = reads, None, None

    def asked(self, source: str, *, began: float, answered: float, stale: bool) -> None:
        """An answer for ``source`` (Himitsu took the token). ``stale``: written from an
        answer older than the reconcile that ``began``: it takes only a newer one then."""
        self.source, self.refused, self.refusals = source, None, 0
        if stale:
            self.revalidate = began if self.revalidate is None else self.revalidate
        elif self.revalidate is not None and answered >= self.revalidate:
            self.revalidate = None

    def refused_by(self, source: str, *, now: float, backoff: Callable[[int], float]) -> float:
        """Himitsu refused the token of ``source`` (401/403): not asked again for
        ``backoff(refusals in a row)`` seconds, which are returned."""
        self.refusals = self.refusals + 1 if self.refused == source else 1
        wait = backoff(self.refusals)
        self.refused, self.refused_until = source, now + wait
        return wait

    def lost_race(self, seen: str | None, *, creating: bool) -> int:
        """A write lost an optimistic-concurrency race; the races in a row."""
        self.expect(seen)
        self.read_live = self.read_live or creating
        self.races += 1
        return self.races

    def wrote(self, rv: str | None, *, sent: bool) -> None:
        """A write (or a write found unneeded) left the target at ``rv``."""
        self.races = 0
        self.expect(rv)
        if sent:
            self.read_live = False

    def synced(self, *, answered: float, interval: float, due: float | None) -> None:
        self.failures = 0
        self.scheduled(answered=answered, interval=interval, due=due)

    def target_holds(self, ann: Mapping[str, str], *, since: float | None,
                     read: bool = False) -> None:
        """The target holds the data of annotations ``ann`` (its id, digest and the id's
        check; sync.restarts), since ``since`` (None: since before this process looked);
        ``read``: as read afresh, so a write whose answer was lost is settled either way."""
        data_id = ann.get(api.ANN_DATA_ID)
        if data_id and data_id != self.data_id:
            if self.sent and self.sent[0] == data_id:  # that write landed: its time
                since, self.sent = self.sent[1], None
            # A restart that may still be owed for data of unknown arrival stays due at once:
            # only a workload known to have had the data before waits from ``since``.
            if self.data_id is not None and (self.data_since is None or self.sure is not None):
                had = frozenset(w for w, i in (self.workloads or {}).items() if i == self.data_id)
                kept = self.sure if self.data_since is not None and self.sure else frozenset()
                self.sure = had | kept
            else:
                self.sure = None
            self.data_id, self.data_digest = data_id, ann.get(api.ANN_DATA_HASH)
            self.data_since = since
        if data_id:
            self.data_check = ann.get(api.ANN_DATA_ID_CHECK)
        if read:
            self.sent = None

    def id_for(self, ann: Mapping[str, str], digest: str) -> str:
        """The data id to stamp on a target with annotations ``ann`` for data ``digest``:
        the one held for these bytes, else a new one."""
        if self.data_id is None:
            self.target_holds(ann, since=None)
        if ann.get(api.ANN_DATA_ID) and ann.get(api.ANN_DATA_HASH) == digest:
            return ann[api.ANN_DATA_ID]
        mine = self.data_id if ann.get(api.ANN_DATA_ID) in (None, self.data_id) else None
        return mine if mine and self.data_digest == digest else token_hex(8)  # (A, B, A): new

    def target_unknown(self, sent: str, *, at: float) -> None:
        """A write of data id ``sent`` at ``at`` that may have landed: the target is to be
        read afresh (``sent`` set), unless ``sent`` is the id known here (a repair:
        whichever way, it stays); found there, it arrived at ``at``."""
        if sent != self.data_id:
            self.sent = (sent, at)

    def since_of(self, workload: tuple[str, str]) -> float | None:
        """Since when ``workload`` (kind, name) may owe a restart for the data the target
        holds (None: not known; due at once)."""
        return self.data_since if self.sure is None or workload in self.sure else None

    def rolled_out(self, workload: tuple[str, str], data_id: str) -> None:
        """``workload`` (kind, name) is owed nothing for the data ``data_id``."""
        self.workloads = {**(self.workloads or {}), workload: data_id}

    def failed(self) -> None:
        """A retry is not the scheduled poll: no lateness allowance."""
        self.failures += 1
        self.due = None


def resource_version(obj: Mapping[str, Any] | None) -> str | None:
    if not obj:
        return None
    value = (obj.get("metadata") or {}).get("resourceVersion")
    return str(value) if value else None


def uid_of(obj: Mapping[str, Any]) -> str:
    return str((obj.get("metadata") or {}).get("uid", ""))
