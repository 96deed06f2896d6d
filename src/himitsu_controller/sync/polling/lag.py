"""How far targets are behind their promise: the poll lag gauges, computed when scraped.

Every HimitsuSecret in the cache counts, from this process's answer or its lastSyncTime;
a pure read (no memory made), the same on every replica.

Design: docs/design/polls.md
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping
from typing import Any

from himitsu_controller import api
from himitsu_controller.sync.memory import Memory
from himitsu_controller.sync.polling import schedule


def first_sight(mem: Memory, *, last_sync_time: str | None, interval: float,
                in_step: bool) -> None:
    """Memory holding no answer yet (a restart): the target holds lastSyncTime's, so its
    lag counts from there and, ``in_step``, its poll was due an interval after it."""
    last = api.parse_time(last_sync_time)
    if mem.answered is not None or interval <= 0 or last is None:
        return
    answered = last.timestamp()
    mem.scheduled(answered=answered, interval=interval,
                  due=answered + interval if mem.due is None and in_step else mem.due)


def worst(
    now: float, objects: Iterable[Mapping[str, Any]], memory: Mapping[str, Memory],
) -> tuple[float, int, float]:
    """The largest lag, how many targets lag, and the largest lag in its own target's
    refreshIntervals. An object being deleted promises nothing, so it does not lag."""
    largest, lagging, ratio = 0.0, 0, 0.0
    for obj in objects:
        if (obj.get("metadata") or {}).get("deletionTimestamp"):
            continue
        lag, interval = _lag(now, obj, memory)
        largest, lagging = max(largest, lag), lagging + (lag > 0)
        if lag > 0:
            ratio = max(ratio, lag / interval)
    return largest, lagging, ratio


def _lag(now: float, obj: Mapping[str, Any],
         memory: Mapping[str, Memory]) -> tuple[float, float]:
    """(lag, refreshInterval); a lag is never positive with an interval of 0."""
    meta = obj.get("metadata") or {}
    mem = memory.get(f"{meta.get('namespace', '')}/{meta.get('name', '')}")
    if mem is not None and mem.uid == str(meta.get("uid", "")) and mem.answered is not None:
        return schedule.lag(now, mem.answered, mem.interval), mem.interval
    status, spec = obj.get("status"), obj.get("spec")
    last = api.parse_time(status.get("lastSyncTime")) if isinstance(status, Mapping) else None
    raw = spec.get("refreshInterval", "1m") if isinstance(spec, Mapping) else None
    interval = _interval(raw) if isinstance(raw, str) else None
    if last is None or interval is None:
        return 0.0, 0.0
    return schedule.lag(now, last.timestamp(), interval), interval


@functools.lru_cache(maxsize=256)
def _interval(raw: str) -> float | None:
    """Parsed once per distinct text (a handful in any cluster); None: InvalidSpec."""
    try:
        return api.parse_refresh_interval({"refreshInterval": raw})
    except api.InvalidSpec:
        return None
