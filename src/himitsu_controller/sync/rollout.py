"""When a HimitsuSecret's workloads owe a restart: the rule on what the pods have seen.

Environment variables are read once, at container start, so a changed Secret reaches an
application only through new pods. The rule is on bytes, not on events: for each entry of
``rolloutRestartTargets`` the status records a MAC of the data the workload's pods were
last (re)started with (``dataMac``). A restart is owed exactly while the data the target
holds differs from it, and the claim opened then (``pendingSince``, also in status, with
the MAC of the data owed and when the target was first seen holding it: ``pendingMac``,
``changedAt``) is handed to the shared scheduler (``sync.restarter``), which batches and
coalesces.

So a 304, a new configVersion that renders the same bytes, a repair that puts back the
bytes the pods have, or a force-sync that changes nothing owes nothing; a change that
is put back before its window closes owes nothing any more; and a change written just
before the operator stopped (or lost the Lease) is still owed by the next process,
because the record only moves once the restart (or the finding that none is needed) is
done. A target entry seen for the first time takes the data as it is as what its pods
have, unless a first sync changed a Secret that existed (a Merge target's: its pods read
it before; its data-changed-at says so, ``first_change``) or ``rolloutRestartOnCreate``.

What the target holds is the digest its ``himitsu.io/data-hash`` records: as this process
last wrote or confirmed it, else (a fetch failed after an operator restart) as the cached
target shows it when it holds what we wrote (at whichever version). So neither Himitsu
nor the token holds back a restart owed for data already in the Secret. The write that
changes the data stamps when (``himitsu.io/data-changed-at``, MACed with the data), which
is the claim's ``changedAt``: a restart made after it serves the claim, even when the
status write of that change was lost.

The MAC is keyed by a random salt kept on the target Secret (``himitsu.io/rollout-salt``,
seen only by those who may read the data anyway): status is readable by whoever may read
HimitsuSecrets, and a plain digest there would let them confirm guesses of a Secret they
cannot read. So the operator alone chooses it: its first write stamps a fresh one over
whatever is there, and it trusts only the salt it remembers or one the status's one-way
``saltId`` vouches for (``trusted_salt``). The salt survives token rotations and operator
restarts; one lost with its target (deleted while no process remembered it) or replaced
by someone else gives way to a new one, and the record then decides by the config
version and source stamp the pods were started with (``dataVersion``, ``dataSource``):
owed exactly when the target's differ. Records an older version wrote (MACs keyed by
the token, ``keyId``) are checked with the token and carried over once the target has a
salt, deciding exactly as that version would; a restart owed there counts as owed since
its ``pendingSince``.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from secrets import token_hex
from typing import Any, NamedTuple

import structlog

from himitsu_controller import api, metrics
from himitsu_controller.runtime.controller import Result
from himitsu_controller.sync.context import Context
from himitsu_controller.sync.memory import Memory
from himitsu_controller.sync.polling import schedule
from himitsu_controller.sync.ports import Kube, KubeError
from himitsu_controller.sync.references import allows_restart_by, secrets_read
from himitsu_controller.sync.restarter import Claim, Outcome, Restarter, refused, unreferenced
from himitsu_controller.sync.status import StatusWriter, bounded
from himitsu_controller.sync.target import targets as target_rules

__all__ = ["Rollouts", "first_change", "legacy_key", "note_held", "pending", "trusted_salt"]

log = structlog.get_logger(__name__)
_PENDING = ("pendingSince", "pendingMac", "changedAt")
_CHANGED = "himitsu-data-changed-at\x00"


class _Held(NamedTuple):
    """What the target holds: its data's digest, the salt, its config version, its
    ``himitsu.io/data-changed-at`` and its ``himitsu.io/source-hash`` (the spec fields
    that shape the bytes besides the data: a hash of spec fields, no value)."""

    digest: str
    salt: str
    version: int | None
    changed_at: str | None
    source: str | None = None


def _mac(salt: str, digest: str) -> str:
    return hmac.new(salt.encode(), digest.encode(), hashlib.sha256).hexdigest()[:32]


def _salt_id(salt: str) -> str:
    """One-way: the status shows which salt without giving it, and vouches for it."""
    return hashlib.sha256(b"himitsu-rollout-salt\x00" + salt.encode()).hexdigest()[:32]


def _vouches(salt_id: Any, salt: str) -> bool:
    """A status ``saltId`` is ``salt``'s (older versions wrote its first 12 digits)."""
    return (isinstance(salt_id, str) and len(salt_id) >= 12
            and hmac.compare_digest(_salt_id(salt)[:len(salt_id)], salt_id))


def trusted_salt(mem: Memory, target: Mapping[str, Any] | None,
                 entries: list[dict[str, Any]]) -> str | None:
    """The rollout salt to MAC with and stamp: the one this process stamped or
    confirmed, else the target's when the status's ``saltId`` vouches for it; None: a
    fresh one is to be stamped. Never one only someone else chose: whoever may create or
    patch the target without reading it could then test guesses of its values against
    the status MACs."""
    if mem.salt is not None:
        return mem.salt
    salt = target_rules.annotations_of(target).get(api.ANN_ROLLOUT_SALT)
    if salt and any(_vouches(e.get("saltId"), salt) for e in entries):
        return salt
    return None


def legacy_key(token: str) -> bytes:
    """The key an older version MACed the record with (``keyId``): read to migrate it."""
    return hashlib.sha256(b"himitsu-rollout\x00" + token.encode()).digest()


def _stamp(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _epoch(text: Any) -> float | None:
    when = api.parse_time(str(text or ""))
    return when.timestamp() if when is not None else None


def pending(obj: Mapping[str, Any]) -> bool:
    """A restart is owed (the status says so): the object must not wait for its next poll."""
    entries = (obj.get("status") or {}).get("rolloutRestarts")
    return isinstance(entries, list) and any(
        isinstance(e, Mapping) and e.get("pendingSince") for e in entries)


def note_held(mem: Memory, target: Mapping[str, Any] | None, salt: str | None) -> None:
    """What the target now holds, by its stamps (data-hash, config version), written or
    confirmed by this process, and the salt it was written or confirmed with: what the
    record is compared with."""
    ann = target_rules.annotations_of(target)
    mem.digest = ann.get(api.ANN_DATA_HASH, mem.digest)
    mem.version = _version(ann) if api.ANN_CONFIG_VERSION in ann else mem.version
    mem.changed_at = ann.get(api.ANN_DATA_CHANGED_AT) if ann else mem.changed_at
    mem.data_source = ann.get(api.ANN_SOURCE, mem.data_source)
    mem.salt = salt or mem.salt


def changed_stamp(salt: str, digest: str, epoch: float, *, first_of: str | None = None) -> str:
    """``himitsu.io/data-changed-at``: the target holds the data ``digest`` since ``epoch``;
    ``first_of``: put there by the first sync of the HimitsuSecret of that uid, into a
    Secret that existed (its pods read it before: a restart is owed, ``first_change``)."""
    when = _stamp(epoch)
    return f"{when};{_stamp_mac(salt, digest, when, first_of)}"


def _stamp_mac(salt: str, digest: str, when: str, first_of: str | None) -> str:
    first = f"\x00first\x00{first_of}" if first_of is not None else ""
    return _mac(salt, _CHANGED + digest + chr(0) + when + first)[:16]


def _changed_at(value: str | None, salt: str, digest: str, uid: str) -> float | None:
    """The time a ``changed_stamp`` of this data under this salt names, else None."""
    when, _, mac = (value or "").partition(";")
    if not mac or not any(hmac.compare_digest(mac, _stamp_mac(salt, digest, when, first))
                          for first in (None, uid)):
        return None
    return _epoch(when)


def first_change(target: Mapping[str, Any] | None, uid: str) -> bool:
    """The data ``target`` holds was put there by the first sync of the HimitsuSecret
    ``uid`` into a Secret that existed (its ``changed_stamp``, under the target's own
    salt, says so), as the status may not record (the process stopped before its status
    write): the restart that first sync owes is still owed. At worst (a stamp forged by
    whoever may patch the Secret) one restart of workloads that read it."""
    ann = target_rules.annotations_of(target)
    salt, digest = ann.get(api.ANN_ROLLOUT_SALT), ann.get(api.ANN_DATA_HASH)
    when, _, mac = ann.get(api.ANN_DATA_CHANGED_AT, "").partition(";")
    return bool(salt and digest and mac and uid) and hmac.compare_digest(
        mac, _stamp_mac(str(salt), str(digest), when, uid))


def _version(ann: Mapping[str, str]) -> int | None:
    raw = ann.get(api.ANN_CONFIG_VERSION, "")
    return int(raw) if raw.isascii() and raw.isdigit() else None


def _migrated(entry: dict[str, Any], key: bytes | None, digest: str, mac: str) -> bool:
    """An older version's record (``keyId``, MACs keyed by the token) under the salt's
    ``mac``, decided as that version would have; False: not yet (no token read here)."""
    if key is None:
        return False
    if entry.pop("keyId") == hashlib.sha256(key).hexdigest()[:12]:
        old = hmac.new(key, digest.encode(), hashlib.sha256).hexdigest()[:32]
        entry["dataMac"] = mac if entry.get("dataMac") == old else ""
    else:  # keyed by a token replaced before the upgrade and never checked since
        entry["dataMac"] = "" if entry.get("pendingSince") else mac
    return True


def _changed(held: _Held, now: float, *, legacy: str | None, uid: str) -> float:
    """Since when the target holds its data: as the write that put it there stamped it
    (before a crash lost the status write, say); for a claim an older version opened (no
    changedAt: ``legacy``, its pendingSince), since that claim; else since now."""
    when = _changed_at(held.changed_at, held.salt, held.digest, uid)
    if when is None and legacy:
        when = _epoch(legacy)
    return min(when, now) if when is not None else now


def _settled(entry: dict[str, Any], held: _Held) -> None:
    """The pods have the data the target holds (at its config version, rendered from its
    source stamp): nothing owed."""
    for name in _PENDING:
        entry.pop(name, None)
    if held.version is not None:
        entry["dataVersion"] = held.version
    if held.source:
        entry["dataSource"] = held.source


class Rollouts:
    def __init__(self, kube: Kube, status: StatusWriter, *, now: Callable[[], float]) -> None:
        self._kube = kube
        self._status = status
        self._now = now
        self.restarter = Restarter(kube, now=now)

    def after(self, ctx: Context, spec: api.Spec, mem: Memory, result: Result) -> Result:
        """``result`` of a reconcile (whatever the sync did), woken in time for the
        restarts owed: a failing Himitsu does not hold back one for data in the target."""
        try:
            wake = self.step(ctx, spec, mem)
        except KubeError as exc:  # the status patch: the claims are kept and retried
            log.warning("rollout status update failed", key=ctx.key, error=str(exc))
            wake = self._now() + 1.0
        if wake is None:
            return result
        delay = schedule.requeue_delay(self._now(), wake)
        if result.requeue_after is not None and 0 < result.requeue_after <= delay:
            return result
        return Result(requeue_after=delay, error=result.error)

    def step(self, ctx: Context, spec: api.Spec, mem: Memory) -> float | None:
        """Settle the restarts ``ctx.obj``'s workloads owe; when to be woken (epoch), if
        ever. Nothing is decided while what the target holds is not known."""
        key, obj = ctx.key, ctx.obj
        previous = self._status.rollout_entries(key, obj)
        targets = spec.rollout.targets
        self.restarter.release(key, keep=frozenset(
            (key.partition("/")[0], t.kind, t.name) for t in targets))
        if not targets and not previous:
            return None
        held = self._held(ctx, spec, mem, previous)
        if held is None:
            return None
        old = {(str(e.get("kind")), str(e.get("name"))): e for e in previous}
        entries, wakes = [], []
        for target in targets:
            entry = dict(old.get((target.kind, target.name)) or
                         {"kind": target.kind, "name": target.name})
            wake = self._settle(ctx, spec, target, entry=entry, mem=mem, held=held)
            if wake is not None:
                wakes.append(wake)
            self._report(obj, target, spec.target.name,
                         old.get((target.kind, target.name)) or {}, entry)
            entries.append(entry)
        self._status.rollouts(key, obj, entries)
        mem.first_write = None  # the new entries it concerns are recorded
        return min(wakes) if wakes else None

    def _held(self, ctx: Context, spec: api.Spec, mem: Memory,
              entries: list[dict[str, Any]]) -> _Held | None:
        """The digest of the data the target holds, the salt and the target's config
        version: as this process last wrote or confirmed them, else as the cached target
        shows them when it holds what we wrote (at whichever version: the status may not
        have recorded it yet), with our salt if the status vouches for the target's,
        else a new one (stamped by the next write)."""
        if mem.digest is not None and mem.salt is not None:
            return _Held(mem.digest, mem.salt, mem.version, mem.changed_at, mem.data_source)
        target = self._kube.get_secret(ctx.owner.namespace, spec.target.name, cached=True)
        if not target_rules.holds_own_data(target, owner=ctx.owner, spec=spec):
            return None
        ann = target_rules.annotations_of(target)
        digest = ann.get(api.ANN_DATA_HASH)
        if not digest:
            return None
        mem.salt = trusted_salt(mem, target, entries) or token_hex(16)
        return _Held(digest, mem.salt, _version(ann), ann.get(api.ANN_DATA_CHANGED_AT),
                     ann.get(api.ANN_SOURCE))

    def _settle(self, ctx: Context, spec: api.Spec, target: api.RolloutTarget, *,
                entry: dict[str, Any], mem: Memory, held: _Held) -> float | None:
        namespace = ctx.owner.namespace
        recheck = ctx.status.observed_generation != ctx.generation
        digest, salt, version = held.digest, held.salt, held.version
        mac, salt_id = _mac(salt, digest), _salt_id(salt)
        if not target.supported:  # its saltId still vouches for the salt (trusted_salt)
            entry.clear()
            entry.update(kind=target.kind, name=target.name, saltId=salt_id, warning=(
                f"kind {target.kind!r} cannot be restarted: only "
                f"{', '.join(api.WORKLOAD_KINDS)}"))
            return None
        now = self._now()
        legacy = "keyId" in entry
        if legacy and not _migrated(entry, mem.legacy_key, digest, mac):
            return None  # an older version's record: kept as it is until the token is read
        if "dataMac" not in entry:  # a new entry: the pods have what the target holds,
            # unless a first sync changed a Secret they read (a Merge target's) or asks
            first_sync = ctx.status.config_version is None
            entry["dataMac"] = "" if first_sync and (
                spec.rollout.on_create or mem.first_write == "changed") else mac
            recheck = True
        elif "saltId" in entry and not _vouches(entry["saltId"], salt):
            # The salt the record was keyed with is lost (the target deleted while no
            # process kept it) or was replaced by someone else: by the config version
            # the pods were started with and the source stamp it was rendered from
            # (template, type, environment: new bytes at one version), a restart is
            # owed unless both are the target's.
            pods, made = entry.get("dataVersion"), entry.get("dataSource")
            if isinstance(pods, int) and version is not None:
                entry["dataMac"] = mac if pods == version and (
                    not isinstance(made, str) or made == held.source) else ""
            else:  # an older record: owed only if it was owed already
                entry["dataMac"] = "" if entry.get("pendingSince") else mac
        entry["saltId"] = salt_id
        if recheck:
            self._check(namespace, target, spec.target.name, ctx.key, entry)
        if entry["dataMac"] == mac:
            if entry.pop("pendingSince", None) is not None:
                self.restarter.withdraw(namespace, target.kind, target.name, ctx.key)
            _settled(entry, held)
            return None
        entry.setdefault("pendingSince", _stamp(now))
        if entry.get("pendingMac") != mac:  # the target holds this data since now, or before
            entry["pendingMac"], entry["changedAt"] = mac, _stamp(_changed(
                held, now, legacy=entry["pendingSince"] if legacy else None,
                uid=ctx.owner.uid))
        for _ in range(2):  # once more when the data changed again after a restart
            outcome = self.restarter.claim(namespace, target.kind, target.name, Claim(
                holder=ctx.key, secret=spec.target.name, digest=mac,
                since=_epoch(entry["pendingSince"]) or now, window=spec.rollout.min_interval,
                changed=_epoch(entry["changedAt"])))
            if outcome.state != "done":
                if outcome.message:
                    entry["warning"] = bounded(outcome.message)
                return outcome.at
            self._done(entry, outcome)
            if entry["dataMac"] == mac:
                _settled(entry, held)
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

    def _check(self, namespace: str, target: api.RolloutTarget, secret: str, holder: str,
               entry: dict[str, Any]) -> None:
        """Say at once (not only at the first data change) what a restart would find."""
        try:
            workload = self._kube.get_workload(namespace, target.kind, target.name)
        except KubeError as exc:
            entry["warning"] = bounded(refused(target.kind, target.name, exc))
            return
        if workload is None:
            entry["warning"] = f"{target.kind} {target.name!r} not found: nothing to restart"
        elif secret not in secrets_read(workload) and not allows_restart_by(
                workload, holder.partition("/")[2]):
            entry["warning"] = unreferenced(target.kind, target.name, secret, holder)
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
