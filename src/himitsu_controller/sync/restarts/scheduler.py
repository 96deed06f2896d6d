"""The per-workload restart scheduler: batching, one restart per window, retries.

When claims fall due, and why: docs/design/restarts.md, "Windows, batching and retries".
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, NamedTuple

from himitsu_controller import api, metrics
from himitsu_controller.sync.polling import schedule
from himitsu_controller.sync.ports import Conflict, KubeError, Workloads
from himitsu_controller.sync.restarts.references import allowed, refused, unreferenced

__all__ = ["NOT_OURS", "Claim", "Outcome", "Scheduler", "record_of", "stamp"]

CONFLICT_RETRIES = 5  # a record before a write: the workload read again after a 409
CLOCK_SLACK = 1.0  # a restartedAt further ahead of our clock proves nothing (skew, or by hand)
Key = tuple[str, str, str]  # namespace, kind, name
NOT_OURS = "-"  # the data id of bytes the HimitsuSecret did not write (pods have, or a target)
# Every HimitsuSecret naming the workload: name -> (its target, the id it holds or None).
Current = Callable[[Key], Mapping[str, tuple[str, str | None]]]


class Claim(NamedTuple):
    holder: str  # the HimitsuSecret's name
    secret: str  # its target Secret
    data_id: str  # the id of the data the target holds
    since: float | None  # when this process saw that data arrive (None: before it looked)
    window: float  # its minRestartInterval
    baseline: str  # the record a workload without one gets: what its pods have
    bound: tuple[str | None, str | None] = (None, None)  # the data's digest, the id's check
    recorded: bool = False  # the status shows the workload's record landed


class Outcome(NamedTuple):
    wake: float | None  # when to ask again (None: nothing more is owed; inf: at the next sync)
    restarted: float = 0.0  # when the restart that rolled it out was made (0: none needed)
    message: str = ""  # what went wrong, or why the workload is skipped
    recorded: bool = False  # the workload was read with the holder's record, or got it


@dataclass
class _Slot:
    claims: dict[str, Claim] = field(default_factory=dict)
    restarted: float = 0.0  # the workload's last restart known here (epoch)
    recorded: set[str] = field(default_factory=set)  # holders seen in its record
    failures: int = 0  # in a row, 409s included: the retries back off
    waits: int = 0  # in a row, for a co-holder's repair: they back off too
    retry_at: float = 0.0


class Scheduler:
    def __init__(self, workloads: Workloads, *, now: Callable[[], float],
                 current: Current) -> None:
        self._workloads, self._now, self._current = workloads, now, current
        self._slots: dict[Key, _Slot] = {}
        self._lock = threading.Lock()

    def settle(self, key: Key, claim: Claim) -> Outcome:
        """Read the workload (unless the claim is known, not due), record, restart if due."""
        with self._lock:  # one for all: restarts are rare, and never two of one workload
            slot = self._slots.setdefault(key, _Slot())
            now, before = self._now(), slot.claims.get(claim.holder)
            if before is not None:
                if before.data_id != claim.data_id:
                    metrics.count_rollout("coalesced")  # a further change, batched
                if claim.holder in slot.recorded:  # else the first owed nothing yet
                    claim = claim._replace(since=before.since)  # the window it opened
            slot.claims[claim.holder] = claim
            if before is not None and now < (due := self._due(slot, claim.holder)):
                return Outcome(due)
            try:
                out = self._evaluate(key, slot, claim, now)
            except KubeError as exc:  # a 409 too (the workload changed since it was read)
                slot.failures += 1
                slot.retry_at = now + schedule.backoff(slot.failures, 0.0)
                if isinstance(exc, Conflict):
                    return Outcome(slot.retry_at)
                metrics.count_rollout("failed")
                landed = claim.recorded or claim.holder in slot.recorded
                return Outcome(slot.retry_at, message=f"{refused(*key[1:], exc, landed)}"
                               "; retrying with backoff")
            if out.wake is None:
                slot.claims.pop(claim.holder, None)
            return out

    def baseline(self, key: Key, holder: str, secret: str, value: str) -> str | None:
        """A workload without a record for ``holder`` gets ``value``; a 409: read again.
        The record it had ("": none, it got ``value``; None: no workload, or not one
        ``holder`` may restart)."""
        with self._lock:
            for attempt in range(1, CONFLICT_RETRIES + 1):
                workload = self._workloads.get_workload(*key)
                record = record_of(workload or {})
                if workload is None or not allowed(workload, holder, secret):
                    return None
                if holder in record:
                    return record[holder]
                try:
                    self._patch(key, workload, {**record, holder: value})
                    return ""
                except Conflict:
                    if attempt == CONFLICT_RETRIES:
                        raise
            return None

    def release(self, namespace: str, holder: str, *, keep: frozenset[Key] = frozenset()) -> None:
        """``holder`` owes no restart to the workloads of ``namespace`` but ``keep``."""
        with self._lock:
            for key in [k for k in self._slots if k[0] == namespace and k not in keep]:
                slot = self._slots[key]
                slot.claims.pop(holder, None)
                slot.recorded.discard(holder)
                if not slot.claims:
                    del self._slots[key]

    def _evaluate(self, key: Key, slot: _Slot, claim: Claim, now: float) -> Outcome:
        workload = self._workloads.get_workload(*key)
        if workload is None or not allowed(workload, claim.holder, claim.secret):
            metrics.count_rollout("missing" if workload is None else "skipped_unreferenced")
            return Outcome(None, message=unreferenced(*key[1:], claim.secret, claim.holder)
                           if workload else f"{key[1]} {key[2]!r} not found: nothing to restart")
        record = record_of(workload)
        if claim.holder not in record:  # first named: its pods have ``baseline``
            workload = self._patch(key, workload, {**record, claim.holder: claim.baseline})
            record[claim.holder] = claim.baseline
        slot.recorded.add(claim.holder)
        slot.restarted = max(slot.restarted, _restarted_at(workload, now))
        digest, check = claim.bound
        if record[claim.holder] == claim.data_id or (digest and check and api.data_id_check(
                record[claim.holder], digest) == check):  # an id minted for these bytes
            restarted = slot.restarted if (claim.since or now) <= slot.restarted else 0
            return Outcome(None, restarted, recorded=True)  # the restart that did it, if any
        if now < (due := self._due(slot, claim.holder)):
            return Outcome(due, recorded=True)
        names = self._current(key)  # what each target holds now: what new pods will read
        ids = {h: i for h, (secret, i) in names.items() if i and allowed(workload, h, secret)}
        if edited := sorted(names[h][0] for h, i in ids.items() if i == NOT_OURS):
            # New pods would read a hand edit: after its repair, which the holder's own sync
            # makes; a co-holder's wakes nothing here: asked again with backoff.
            wake = float("inf")
            if ids.get(claim.holder) != NOT_OURS or len(edited) > 1:
                slot.waits += 1
                wake = slot.retry_at = now + schedule.backoff(slot.waits, claim.window)
            return Outcome(wake, recorded=True, message=f"restarting {key[1]} {key[2]!r} "
                           f"waits: Secret {', '.join(map(repr, edited))} holds data the "
                           "operator did not write (edited by hand?); it follows the repair")
        ids = {c.holder: c.data_id for c in slot.claims.values()} | ids
        if ids[claim.holder] == record[claim.holder]:  # changed back meanwhile
            return Outcome(None, recorded=True)
        new = {h: i for h, i in record.items() if h in names} | ids
        self._patch(key, workload, new, restart=now)
        metrics.count_rollout("restarted")
        metrics.count_rollout("coalesced", sum(record.get(h) != i for h, i in new.items()) - 1)
        slot.claims.clear()
        slot.restarted, slot.failures, slot.waits, slot.retry_at = now, 0, 0, 0.0
        return Outcome(None, now, recorded=True)

    def _due(self, slot: _Slot, holder: str) -> float:
        """Not before the retry; nor, once ``holder``'s record landed, within a window."""
        if holder not in slot.recorded:
            return slot.retry_at
        return max(slot.retry_at, min((max(c.since or 0.0, slot.restarted) + c.window
                                       for c in slot.claims.values()
                                       if c.holder in slot.recorded), default=float("inf")))

    def _patch(self, key: Key, workload: Mapping[str, Any], record: Mapping[str, str], *,
               restart: float | None = None) -> dict[str, Any]:
        return self._workloads.patch_workload(
            *key, resource_version=str((workload.get("metadata") or {}).get("resourceVersion")),
            annotations={api.ANN_STARTED_WITH: ",".join(f"{h}={i}" for h, i in sorted(
                record.items()))},
            template={api.ANN_RESTARTED_AT: stamp(restart)} if restart is not None else None)


def record_of(workload: Mapping[str, Any]) -> dict[str, str]:
    """``himitsu.io/started-with``: HimitsuSecret name -> the data id its pods have."""
    raw = str(((workload.get("metadata") or {}).get("annotations") or {})
              .get(api.ANN_STARTED_WITH) or "")
    return dict(item.split("=", 1) for item in raw.split(",") if "=" in item)


def stamp(epoch: float) -> str:
    """RFC 3339 in microseconds: two restarts within one second stay two patches."""
    return datetime.fromtimestamp(epoch, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _restarted_at(workload: Mapping[str, Any], now: float) -> float:
    meta = ((workload.get("spec") or {}).get("template") or {}).get("metadata") or {}
    when = api.parse_time(str((meta.get("annotations") or {}).get(api.ANN_RESTARTED_AT) or ""))
    at = when.timestamp() if when is not None else 0.0
    return min(at, now) if at <= now + CLOCK_SLACK else 0.0
