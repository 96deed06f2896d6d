"""When a HimitsuSecret's workloads owe a restart: the rule on what the pods have seen.

Environment variables are read once, at container start, so a changed Secret reaches an
application only through new pods. The rule is on bytes, not on events: for each entry of
``rolloutRestartTargets`` the status records a MAC of the data the workload's pods were
last (re)started with (``dataMac``). A restart is owed exactly while the data the target
holds differs from it, and the claim opened then (``pendingSince``, also in status) is
handed to the shared scheduler (``sync.restarter``), which batches and coalesces.

So a 304, a new configVersion that renders the same bytes, a repair that puts back the
bytes the pods have, or a force-sync that changes nothing owes nothing; a change that
is put back before its window closes owes nothing any more; and a change written just
before the operator stopped (or lost the Lease) is still owed by the next process,
because the record only moves once the restart (or the finding that none is needed) is
done. A target entry seen for the first time takes the data as it is as what its pods
have (``rolloutRestartOnCreate`` makes a HimitsuSecret's first sync owe a restart).

The MAC is keyed by the token (HMAC-SHA256 of the data digest, keyed with a hash of
the token): status is readable by whoever may read HimitsuSecrets, and a plain digest
there would let them confirm guesses of a Secret they cannot read. When the token
changes, this process checks the record with the old token's key (it remembers the key
and data of its last look) and carries it over; a process that never saw the old token
cannot, and takes the record as matching (no restart) unless a restart was owed already.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import Any

import structlog

from himitsu_controller import api, metrics
from himitsu_controller.sync.expectations import Memory
from himitsu_controller.sync.ports import Kube, KubeError
from himitsu_controller.sync.references import secrets_read
from himitsu_controller.sync.restarter import Claim, Outcome, Restarter, unreferenced
from himitsu_controller.sync.status import StatusWriter, bounded

__all__ = ["Rollouts", "mac_key", "pending"]

log = structlog.get_logger(__name__)


def mac_key(token: str) -> bytes:
    return hashlib.sha256(b"himitsu-rollout\x00" + token.encode()).digest()


def _mac(key: bytes, digest: str) -> str:
    return hmac.new(key, digest.encode(), hashlib.sha256).hexdigest()[:32]


def _key_id(key: bytes) -> str:
    return hashlib.sha256(key).hexdigest()[:12]


def _stamp(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def pending(obj: Mapping[str, Any]) -> bool:
    """A restart is owed (the status says so): the object must not wait for its next poll."""
    entries = (obj.get("status") or {}).get("rolloutRestarts")
    return isinstance(entries, list) and any(
        isinstance(e, Mapping) and e.get("pendingSince") for e in entries)


def _rekeyed(entry: Mapping[str, Any], seen: tuple[bytes, str] | None, key: bytes, *,
             current: str) -> str:
    """The record under the new token's ``key``: checked with the old key and data when
    this process saw them; else the data as it is (``""``: owed, if it was owed)."""
    if seen is not None and entry.get("keyId") == _key_id(seen[0]):
        return _mac(key, seen[1]) if entry.get("dataMac") == _mac(*seen) else ""
    return "" if entry.get("pendingSince") else current


class Rollouts:
    def __init__(self, kube: Kube, status: StatusWriter, *, now: Callable[[], float]) -> None:
        self._kube = kube
        self._status = status
        self._now = now
        self.restarter = Restarter(kube, now=now)

    def step(self, obj: dict[str, Any], key: str, spec: api.Spec, mem: Memory, *,
             first_sync: bool, recheck: bool) -> float | None:
        """Settle the restarts ``obj``'s workloads owe; when to be woken (epoch), if ever.

        ``mem.digest``: the data the target holds, as this process last wrote or
        confirmed it (None: not yet known here; then nothing is decided)."""
        previous = self._status.rollout_entries(key, obj)
        targets = spec.rollout.targets
        self.restarter.release(key, keep=frozenset(
            (key.partition("/")[0], t.kind, t.name) for t in targets))
        if mem.digest is None or mem.mac_key is None:
            return None
        if not targets and not previous:
            return None
        old = {(str(e.get("kind")), str(e.get("name"))): e for e in previous}
        entries, wakes = [], []
        seen, mem.rollout_seen = mem.rollout_seen, (mem.mac_key, mem.digest)
        for target in targets:
            entry = dict(old.get((target.kind, target.name)) or
                         {"kind": target.kind, "name": target.name})
            wake = self._settle(key, spec, target, entry, mem, seen=seen,
                                first_sync=first_sync, recheck=recheck)
            if wake is not None:
                wakes.append(wake)
            self._report(obj, target, spec.target.name,
                         old.get((target.kind, target.name)) or {}, entry)
            entries.append(entry)
        self._status.rollouts(key, obj, entries)
        return min(wakes) if wakes else None

    def _settle(self, key: str, spec: api.Spec, target: api.RolloutTarget,
                entry: dict[str, Any], mem: Memory, *, seen: tuple[bytes, str] | None,
                first_sync: bool, recheck: bool) -> float | None:
        assert mem.digest is not None and mem.mac_key is not None
        namespace = key.partition("/")[0]
        if not target.supported:
            entry.clear()
            entry.update(kind=target.kind, name=target.name, warning=(
                f"kind {target.kind!r} cannot be restarted: only "
                f"{', '.join(api.WORKLOAD_KINDS)}"))
            return None
        now = self._now()
        mac, key_id = _mac(mem.mac_key, mem.digest), _key_id(mem.mac_key)
        if "dataMac" not in entry:  # a new entry: the pods have what the target holds
            entry["dataMac"] = "" if first_sync and spec.rollout.on_create else mac
            recheck = True
        elif entry.get("keyId") != key_id:  # another token
            entry["dataMac"] = _rekeyed(entry, seen, mem.mac_key, current=mac)
        entry["keyId"] = key_id
        if recheck:
            self._check(namespace, target, spec.target.name, entry)
        if entry["dataMac"] == mac:
            if entry.pop("pendingSince", None) is not None:
                self.restarter.withdraw(namespace, target.kind, target.name, key)
            return None
        entry.setdefault("pendingSince", _stamp(now))
        for _ in range(2):  # once more when the data changed again after a restart
            since = api.parse_time(str(entry["pendingSince"]))
            outcome = self.restarter.claim(namespace, target.kind, target.name, Claim(
                holder=key, secret=spec.target.name, digest=mac,
                since=since.timestamp() if since else now,
                window=spec.rollout.min_interval, force=target.force))
            if outcome.state != "done":
                if outcome.message:
                    entry["warning"] = bounded(outcome.message)
                return outcome.at
            self._done(entry, outcome)
            if entry["dataMac"] == mac:
                entry.pop("pendingSince", None)
                return None
            entry["pendingSince"] = _stamp(now)
        return now

    @staticmethod
    def _done(entry: dict[str, Any], outcome: Outcome) -> None:
        entry["dataMac"] = outcome.digest or ""
        if outcome.result in ("restarted", "coalesced"):
            entry["lastRestart"] = _stamp(outcome.at)
            entry.pop("warning", None)
        else:
            entry["warning"] = outcome.message

    def _check(self, namespace: str, target: api.RolloutTarget, secret: str,
               entry: dict[str, Any]) -> None:
        """Say at once (not only at the first data change) what a restart would find."""
        try:
            workload = self._kube.get_workload(namespace, target.kind, target.name)
        except KubeError as exc:
            entry["warning"] = bounded(f"reading {target.kind} {target.name!r} failed: {exc}")
            return
        if workload is None:
            entry["warning"] = f"{target.kind} {target.name!r} not found: nothing to restart"
        elif not target.force and secret not in secrets_read(workload):
            entry["warning"] = unreferenced(target.kind, target.name, secret)
        else:
            entry.pop("warning", None)

    def _report(self, obj: Mapping[str, Any], target: api.RolloutTarget, secret: str,
                before: Mapping[str, Any], after: Mapping[str, Any]) -> None:
        """An Event when a restart was made for this object, or a warning appears or
        changes; kinds outside the list count once."""
        if after.get("lastRestart") and after.get("lastRestart") != before.get("lastRestart"):
            self._event(obj, "Normal", "RolloutRestarted",
                        f"Restarted {target.kind} {target.name!r}: the data of Secret "
                        f"{secret!r} changed")
        warning = after.get("warning")
        if warning and warning != before.get("warning"):
            if not target.supported:
                metrics.count_rollout("skipped_kind")
            reason = ("RolloutRestartFailed" if str(warning).startswith(("restarting", "reading"))
                      else "RolloutRestartSkipped")
            self._event(obj, "Warning", reason, str(warning))

    def _event(self, obj: Mapping[str, Any], kind: str, reason: str, message: str) -> None:
        try:
            self._kube.record_event(obj, type=kind, reason=reason, message=message)
        except Exception as exc:  # best effort, as every Event
            log.warning("recording event failed", reason=reason, error=type(exc).__name__)
