"""HimitsuSecret status: the Ready condition, its Events, and what we last wrote.

* Kubernetes conventions: lastTransitionTime moves only when Ready flips, one Event per
  transition, and a status that would not change is not written.
* The writer remembers what it last patched (one flat tuple per object): the informer's
  copy lags behind it. A status is skipped only if the object already holds it.

Design: docs/design/status.md
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Any

import structlog

from himitsu_controller import api, metrics
from himitsu_controller.sync.ports import Kube

log = structlog.get_logger(__name__)

MAX_MESSAGE = 1024  # bytes
LATE_NOTE = "; this poll ran "  # Ready's message says the last poll ran late


class StatusWriter:
    def __init__(self, kube: Kube, *, now: Callable[[], datetime]) -> None:
        self._kube = kube
        self._now = now
        self._written: dict[str, _Packed] = {}
        self._unsure: set[str] = set()  # keys whose last write failed: applied or not
        self._lock = threading.Lock()

    def effective(self, key: str, obj: Mapping[str, Any]) -> api.Status:
        """The freshest status we know: our own last write, else the cached object's."""
        return api.parse_status({"status": self._current(key, obj)})

    def synced(
        self, key: str, obj: Mapping[str, Any], *, version: int, secret_count: int,
        generation: int, force_sync: str | None, data_changed: bool, target: str,
        answered_at: datetime | None = None, late: float = 0.0, interval: float = 0.0,
    ) -> None:
        """``answered_at`` (lastSyncTime): when Himitsu gave the answer the target holds.
        ``late``: how far past its promise this poll ran; more than ``interval`` is said."""
        previous = self._current(key, obj)
        status = dict(previous)
        status.update({
            "configVersion": version, "secretCount": secret_count, "lastForceSync": force_sync,
            "lastSyncTime": self._timestamp(answered_at), "observedGeneration": generation})
        message = _holds(target, secret_count, version)
        if interval > 0 and late > interval:
            message += (f"{LATE_NOTE}{api.format_duration(late)} later than "
                        f"refreshInterval {api.format_duration(interval)} allows")
        was_ready = _ready_status(previous) == "True"
        status["conditions"] = _with_ready(
            previous, self._ready("True", "Synced", message, previous, generation))
        self._write_if_changed(key, obj, status, previous)
        if data_changed:
            self.event(obj, "Normal", "Synced", (
                f"Wrote {_keys(secret_count)} at config version {version} to Secret {target!r}"
            ))
        elif not was_ready:
            self.event(obj, "Normal", "Synced", message)

    def overdue(
        self, key: str, obj: Mapping[str, Any], *, target: str, interval: float, generation: int,
    ) -> None:
        """The next poll is held back while the target is over an interval past its
        promise: Ready (still True) says so, once; a late note already there stays."""
        previous = self._current(key, obj)
        if (_ready_status(previous) != "True"  # a failure already says why nothing is polled
                or LATE_NOTE in str(_ready_field(previous, "message") or "")):
            self._report(obj, previous)
            return
        holds = _holds(target, int(previous.get("secretCount") or 0),
                       int(previous.get("configVersion") or 0))
        message = (f"{holds}; polls are overdue: the last answer, from "
                   f"{previous.get('lastSyncTime')}, is more than twice refreshInterval "
                   f"{api.format_duration(interval)} old (Himitsu request pacing holds "
                   "polls back)")
        status = dict(previous)
        status["conditions"] = _with_ready(
            previous, self._ready("True", "Synced", message, previous, generation))
        self._write_if_changed(key, obj, status, previous)

    def failed(
        self, key: str, obj: Mapping[str, Any], *, reason: str, message: str, generation: int,
        request_id: str | None = None,
    ) -> None:
        """``request_id``, Himitsu's for this attempt, goes only into a transition's Event."""
        previous = self._current(key, obj)
        status = dict(previous)
        message = bounded(message)
        status["conditions"] = _with_ready(
            previous, self._ready("False", reason, message, previous, generation))
        transition = (_ready_status(previous), _ready_field(previous, "reason")) != (
            "False", reason)
        try:
            # Nothing to write (the same failure again, or after a restart): still in the gauge.
            self._write_if_changed(key, obj, status, previous)
        finally:  # the Event does not depend on the status write (a 403 on it, say)
            if transition:
                note = f" (requestId {request_id})" if request_id else ""
                self.event(obj, "Warning", reason, bounded(message + note))

    def rollout_entries(self, key: str, obj: Mapping[str, Any]) -> list[dict[str, Any]]:
        """``status.rolloutRestarts`` as we last wrote it (``sync.restarts``)."""
        packed = self._remembered(key, obj)  # no copy of the whole status: every reconcile asks
        # Packed flat only when it holds nothing but our plain fields (``_pack``).
        status = obj.get("status") if packed is None else packed[2] if len(packed) == 3 else None
        entries = status.get("rolloutRestarts") if isinstance(status, Mapping) else None
        return [dict(e) for e in entries if isinstance(e, Mapping)] \
            if isinstance(entries, list) else []

    def rollouts(self, key: str, obj: Mapping[str, Any], entries: list[dict[str, Any]]) -> None:
        """Write ``status.rolloutRestarts`` (removed when empty) if it changed; not after a
        write whose outcome is unknown (an answer lost: built on what we knew, it could undo
        that write), which the next reconcile's write repeats. An Event for each restart
        the entries show made and each new warning, written or not: none is lost."""
        before = {(e.get("kind"), e.get("name")): e for e in self.rollout_entries(key, obj)}
        try:
            with self._lock:
                if key in self._unsure:
                    return
            previous = self._current(key, obj)
            status = dict(previous)
            status["rolloutRestarts"] = entries or None
            if {k: v for k, v in status.items() if v is not None} != previous:
                self._write(key, obj, status)
        finally:
            secret = ((obj.get("spec") or {}).get("target") or {}).get("name")
            for entry in entries:
                old = before.get((entry["kind"], entry["name"]), {})
                what = f"{entry['kind']} {entry['name']!r}"
                if entry.get("lastRestart") not in (None, old.get("lastRestart")):
                    self.event(obj, "Normal", "RolloutRestarted",
                               f"Restarted {what}: the data of Secret {secret!r} changed")
                warning = str(entry.get("warning") or "")
                if warning and warning != old.get("warning"):
                    failed = warning.startswith(("reading", "restarting", "recording"))
                    self.event(obj, "Warning", "RolloutRestartFailed" if failed
                               else "RolloutRestartSkipped", warning)

    def forget(self, key: str) -> None:
        with self._lock:
            self._written.pop(key, None)
            self._unsure.discard(key)
        namespace, _, name = key.partition("/")
        metrics.forget_ready(namespace, name)

    def _remembered(self, key: str, obj: Mapping[str, Any]) -> _Packed | None:
        """Our last write to this very object (its uid)."""
        uid = str((obj.get("metadata") or {}).get("uid", ""))
        with self._lock:
            packed = self._written.get(key)
        return packed if packed is not None and packed[0] == uid else None

    def _current(self, key: str, obj: Mapping[str, Any]) -> dict[str, Any]:
        """A fresh dict (the caller's to change): what we last wrote, else the object's."""
        packed = self._remembered(key, obj)
        raw = obj.get("status")
        if packed is None:
            return _copy_status(raw) if isinstance(raw, Mapping) else {}
        status = _unpack(packed)
        # Conditions another writer keeps (the schema admits no other field): as the
        # informer last saw them, not as they were when we last wrote.
        seen = raw.get("conditions") if isinstance(raw, Mapping) else None
        others = [dict(c) for c in seen if isinstance(c, Mapping) and c.get("type") != "Ready"] \
            if isinstance(seen, list) else []
        ours = [c for c in status.get("conditions") or []
                if isinstance(c, Mapping) and c.get("type") == "Ready"]
        if others or len(ours) != len(status.get("conditions") or []):
            status["conditions"] = ours + others
        return status

    def _ready(
        self, state: str, reason: str, message: str, previous: Mapping[str, Any], generation: int,
    ) -> dict[str, Any]:
        since = _ready_field(previous, "lastTransitionTime")
        if _ready_status(previous) != state or not since:
            since = self._timestamp()
        return api.Condition(
            type="Ready", status=state, reason=reason, message=bounded(message),
            last_transition_time=str(since), observed_generation=generation,
        ).to_dict()

    def _write_if_changed(self, key: str, obj: Mapping[str, Any], status: dict[str, Any],
                          previous: Mapping[str, Any]) -> None:
        """Write ``status`` unless it is ``previous`` (ours) and the object holds it too: the
        informer still shows the copy our last write was built on, or shows that status."""
        packed = self._remembered(key, obj)
        lags = packed is not None and packed[1] == (obj.get("metadata") or {}).get(
            "resourceVersion")
        desired = {k: v for k, v in status.items() if v is not None}
        with self._lock:
            unsure = key in self._unsure
        if desired == previous and not unsure and (lags or desired == (obj.get("status") or {})):
            self._report(obj, previous)
        else:
            self._write(key, obj, status)

    def _write(self, key: str, obj: Mapping[str, Any], status: dict[str, Any]) -> None:
        meta = obj.get("metadata") or {}
        namespace, name = str(meta.get("namespace", "")), str(meta.get("name", ""))
        # The uid: a status computed from a deleted object never lands on its namesake.
        try:
            self._kube.patch_status(namespace, name, status, uid=str(meta.get("uid", "")))
        except Exception:
            with self._lock:
                self._unsure.add(key)
            raise
        stored = {k: v for k, v in status.items() if v is not None}
        with self._lock:  # built on this copy of the object: see ``_remembered``
            self._unsure.discard(key)
            self._written[key] = _pack(str(meta.get("uid", "")), meta.get("resourceVersion"),
                                       stored)
        self._report(obj, stored)

    @staticmethod
    def _report(obj: Mapping[str, Any], status: Mapping[str, Any]) -> None:
        meta = obj.get("metadata") or {}
        reason = str(_ready_field(status, "reason") or "")
        metrics.set_ready(str(meta.get("namespace", "")), str(meta.get("name", "")),
                          _ready_status(status) == "True", reason)

    def event(self, obj: Mapping[str, Any], kind: str, reason: str, message: str) -> None:
        """Record an Event on ``obj``, best effort (also for ``sync.restarts``)."""
        try:
            self._kube.record_event(obj, type=kind, reason=reason, message=message)
        except Exception as exc:  # an Event is best effort; never fail a sync over one
            log.warning("recording event failed", reason=reason, error=type(exc).__name__)

    def _timestamp(self, at: datetime | None = None) -> str:
        return (at or self._now()).strftime("%Y-%m-%dT%H:%M:%SZ")


# The status fields and Ready condition fields a packed status holds, in tuple order.
_FIELDS = ("configVersion", "secretCount", "lastSyncTime", "observedGeneration",
           "lastForceSync")
_READY = ("type", "status", "reason", "message", "lastTransitionTime", "observedGeneration")
_Packed = tuple[Any, ...]  # (uid, rv, *_FIELDS, *_READY[1:]) or (uid, rv, the status dict)


def _pack(uid: str, rv: str | None, status: dict[str, Any]) -> _Packed:
    """``status`` as one flat tuple when it holds only our fields and one Ready condition
    (what every write of ours leaves), else ``(uid, rv, status)``."""
    conditions = status.get("conditions")
    known = set(status) <= {*_FIELDS, "conditions"}
    if known and isinstance(conditions, list) and len(conditions) == 1:
        ready = conditions[0]
        if (isinstance(ready, dict) and ready.get("type") == "Ready"
                and set(ready) <= set(_READY)):
            return (uid, rv, *(status.get(k) for k in _FIELDS),
                    *(ready.get(k) for k in _READY[1:]))
    return (uid, rv, _copy_status(status))


def _unpack(packed: _Packed) -> dict[str, Any]:
    if len(packed) == 3:
        return _copy_status(packed[2])
    fields = packed[2:2 + len(_FIELDS)]
    status = {k: v for k, v in zip(_FIELDS, fields, strict=True) if v is not None}
    ready = {"type": "Ready", **{k: v for k, v in zip(
        _READY[1:], packed[2 + len(_FIELDS):], strict=True) if v is not None}}
    status["conditions"] = [ready]
    return status


def _copy_status(raw: Mapping[str, Any]) -> dict[str, Any]:
    """A copy as deep as the conditions' dicts, without ``copy.deepcopy``'s cost."""
    status = dict(raw)
    conditions = status.get("conditions")
    if isinstance(conditions, list):
        status["conditions"] = [dict(c) if isinstance(c, Mapping) else c for c in conditions]
    return status


def _with_ready(previous: Mapping[str, Any], ready: dict[str, Any]) -> list[Any]:
    """``previous``'s conditions (another writer's too) with Ready, in its place, as ``ready``."""
    conditions = [c for c in previous.get("conditions") or [] if isinstance(c, Mapping)]
    at = next((i for i, c in enumerate(conditions) if c.get("type") == "Ready"), 0)
    others = [dict(c) for c in conditions if c.get("type") != "Ready"]
    return [*others[:at], ready, *others[at:]]


def _holds(target: str, secret_count: int, version: int) -> str:
    return f"Secret {target!r} holds {_keys(secret_count)} at config version {version}"


def _keys(count: int) -> str:
    return "1 key" if count == 1 else f"{count} keys"


def bounded(message: str) -> str:
    """``message`` cut to at most MAX_MESSAGE bytes of UTF-8, with an ellipsis when cut."""
    if len(message.encode("utf-8")) <= MAX_MESSAGE:
        return message
    cut = message.encode("utf-8")[: MAX_MESSAGE - len("…".encode())]
    return cut.decode("utf-8", "ignore") + "…"


def _ready_field(status: Mapping[str, Any], name: str) -> Any:
    for cond in status.get("conditions") or []:
        if isinstance(cond, Mapping) and cond.get("type") == "Ready":
            return cond.get(name)
    return None


def _ready_status(status: Mapping[str, Any]) -> str | None:
    value = _ready_field(status, "status")
    return str(value) if value is not None else None
