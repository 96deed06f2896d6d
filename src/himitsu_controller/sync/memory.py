"""What this process last wrote, per HimitsuSecret: client-go's "expectations".

The informer caches lag behind our own writes; trusting them right after a write would
cause a spurious full fetch (a stale status) or a second write (a stale target). The
reconciler keeps one ``Memory`` per object (dropped when the object goes, rebuilt from
nothing after a restart) and compares the cache's resourceVersion with the one it wrote.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["Memory", "resource_version", "uid_of"]


@dataclass(slots=True)
class Memory:
    """What this process last wrote for one HimitsuSecret (client-go's "expectations").

    The informer caches lag behind our own writes; trusting them right after a write
    would cause a spurious full fetch (stale status) or a second write (stale target).
    Small by design, one per HimitsuSecret: versions, times, and strings shared with the
    cache (``reads``: the informer interns them) or among readers (``source``).
    """

    uid: str
    target_rv: str | None = None
    failures: int = 0
    races: int = 0  # writes in a row that lost an optimistic-concurrency race (409)
    due: float | None = None  # when the next timed poll was scheduled (epoch seconds)
    read_live: bool = False  # a create found the target's name taken: read it directly
    cache_has_write: bool = False  # the informer has shown target_rv (it lags no more)
    answered: float | None = None  # when Himitsu gave the answer the target holds (epoch s)
    interval: float = 0.0  # the refreshInterval `answered` and `due` were scheduled with
    reads: tuple[str, ...] | None = None  # the spec's source (URL, env, token ref) last read
    source: str | None = None  # the poller source (token hash included) last fetched
    # A first sync or repair wrote an answer older than its reconcile (shared, or from
    # memory while Himitsu refused): it takes only an answer asked for since this moment.
    revalidate: float | None = None
    # The source (token hash included) Himitsu last refused with a 401/403, how many
    # times in a row, and until when it is not asked again while the token stays.
    refused: str | None = None
    refusals: int = 0
    refused_until: float = 0.0
    # sync.restarts: the data id the target holds, as written or seen here, and since when
    # (None: it was there before this process looked); (digest, id) of the last few ids
    # seen, so bytes put back get their id back; per named workload (kind, name) the id
    # for which it is owed nothing.
    data_id: str | None = None
    data_since: float | None = None
    data_ids: tuple[tuple[str, str], ...] = ()
    workloads: dict[tuple[str, str], str] | None = None

    def expect(self, rv: str | None) -> None:
        """The target now holds ``rv``; the informer may not have seen it yet."""
        self.target_rv, self.cache_has_write = rv, False


def resource_version(obj: Mapping[str, Any] | None) -> str | None:
    if not obj:
        return None
    value = (obj.get("metadata") or {}).get("resourceVersion")
    return str(value) if value else None


def uid_of(obj: Mapping[str, Any]) -> str:
    return str((obj.get("metadata") or {}).get("uid", ""))
