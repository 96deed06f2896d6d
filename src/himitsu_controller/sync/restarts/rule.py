"""When a HimitsuSecret's workloads owe a restart: the data their pods were started with.

A write of other bytes stamps a new random data id on the target (``data_id``); each
named workload records the id its pods were started with; a restart is owed while the
two differ. A workload gets its record before the first write that changes the bytes
(``before_change``), so a crash after that write loses nothing. docs/design/restarts.md.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from secrets import token_hex
from typing import Any

import structlog

from himitsu_controller import api, metrics
from himitsu_controller.runtime.controller import Result
from himitsu_controller.sync.context import Context
from himitsu_controller.sync.memory import Memory
from himitsu_controller.sync.polling import schedule
from himitsu_controller.sync.ports import Kube, KubeError
from himitsu_controller.sync.restarts.scheduler import Claim, Key, Scheduler, stamp
from himitsu_controller.sync.status import StatusWriter, bounded
from himitsu_controller.sync.target.targets import Owner, annotations_of, holds_own_data

__all__ = ["Restarts", "data_id", "learn"]

log = structlog.get_logger(__name__)
NOT_OURS = "-"  # the record of pods started with data this HimitsuSecret did not write


def data_id(mem: Memory, target: Mapping[str, Any] | None, digest: str) -> str:
    """The id to stamp for data ``digest``: the target's while it holds these bytes (or
    this process knows it does: its stamps pruned, or it was deleted), else a new one, for
    bytes put back too: a record must not confirm a value the Secret held before. What the
    target holds is learnt first: a restart owed for it of unknown age stays due at once."""
    if mem.data_id is None:
        learn(mem, target)
    ann = annotations_of(target)
    if ann.get(api.ANN_DATA_ID) and ann.get(api.ANN_DATA_HASH) == digest:
        return ann[api.ANN_DATA_ID]
    return mem.data_id if mem.data_id and mem.data_digest == digest else token_hex(8)


def learn(mem: Memory, secret: Mapping[str, Any] | None, *, since: float | None = None) -> None:
    """The target holds ``secret``'s data id, since ``since`` (None: since before we looked)."""
    ann = annotations_of(secret)
    mem.target_holds(ann.get(api.ANN_DATA_ID), ann.get(api.ANN_DATA_HASH),
                     ann.get(api.ANN_DATA_ID_CHECK), since=since)


class Restarts:
    def __init__(self, kube: Kube, status: StatusWriter, *, now: Callable[[], float]) -> None:
        self._kube, self._status, self._now = kube, status, now
        self.scheduler = Scheduler(kube, now=now, current=self._current)

    def before_change(self, ctx: Context, spec: api.Spec, target: Mapping[str, Any] | None,
                      ) -> None:
        """A write is about to put other bytes in ``target``: each named workload without
        a record gets one, what its pods have now (none can have read a missing target).
        A transient KubeError (unreachable, 409, 429, 5xx): the write waits for the record;
        any other (403: no restart RBAC; 400/422: a workload refusing it) does not."""
        ann, on_create = annotations_of(target), _on_create(ctx, spec)
        if target is None and not on_create:
            return
        ours = ann.get(api.ANN_OWNED_BY) == ctx.owner.name and not on_create
        value = (ann.get(api.ANN_DATA_ID) if ours else None) or NOT_OURS
        for t in (t for t in spec.rollout.targets if t.supported):
            try:
                self.scheduler.baseline((ctx.owner.namespace, t.kind, t.name), ctx.owner.name,
                                        spec.target.name, value)
            except KubeError as exc:  # lasting: it gets the new data's id, restarts nothing
                if exc.status in (0, 409, 429) or exc.status >= 500:
                    raise
                log.warning("recording a workload failed", key=ctx.key, error=str(exc))

    def after(self, ctx: Context, spec: api.Spec, mem: Memory, result: Result) -> Result:
        """``result`` (whatever the sync did), woken in time for the restarts owed."""
        try:
            wake = self._step(ctx, spec, mem)
        except KubeError as exc:  # the status patch: retried
            log.warning("rollout status update failed", key=ctx.key, error=str(exc))
            wake = self._now() + 1.0
        delay = None if wake is None else schedule.requeue_delay(self._now(), wake)
        if delay is None or 0 < (result.requeue_after or 0) <= delay:
            return result
        return Result(requeue_after=delay, error=result.error)

    def forget(self, namespace: str, name: str) -> None:
        self.scheduler.release(namespace, name)

    def _step(self, ctx: Context, spec: api.Spec, mem: Memory) -> float | None:
        ns, owed, entries, wakes = ctx.owner.namespace, set(), [], []
        if mem.data_id is None:  # else as the cached target shows it, when it holds our data
            target = self._kube.get_secret(ns, spec.target.name, cached=True)
            learn(mem, target if holds_own_data(target, owner=ctx.owner, spec=spec) else None)
        held = mem.data_id
        if held is None and spec.rollout.targets:
            return None  # what the target holds is not known: nothing is decided
        old = {(e.get("kind"), e.get("name")): e
               for e in self._status.rollout_entries(ctx.key, ctx.obj)}
        for t in spec.rollout.targets:
            before: Mapping[str, Any] = old.get((t.kind, t.name), {})
            entry = {"kind": t.kind, "name": t.name, **{
                k: before[k] for k in ("lastRestart", "warning") if k in before}}
            if not t.supported:
                entry["warning"] = (f"kind {t.kind!r} cannot be restarted: only "
                                    f"{', '.join(api.WORKLOAD_KINDS)}")
            elif (mem.workloads or {}).get((t.kind, t.name)) != held:
                recorded = _recorded(before)
                out = self.scheduler.settle((ns, t.kind, t.name), Claim(
                    ctx.owner.name, spec.target.name, str(held), mem.data_since,
                    spec.rollout.min_interval, NOT_OURS if _on_create(ctx, spec) or
                    recorded else str(held), (mem.data_digest, mem.data_check)))
                if out.wake is not None:
                    wakes.append(out.wake)
                    owed.add((ns, t.kind, t.name))
                else:  # nothing more owed for this data
                    mem.rolled_out((t.kind, t.name), str(held))
                if out.recorded or out.wake is None:
                    entry.pop("warning", None)
                if out.message:
                    entry["warning"] = bounded(_failure(t, out.message, recorded))
                elif out.restarted:
                    entry["lastRestart"] = stamp(out.restarted)
                if not (recorded or out.recorded or "warning" in entry):
                    continue  # no entry until its record lands (a 409): see _recorded
            self._report(ctx.obj, t, spec.target.name, before, entry)
            entries.append(entry)
        self.scheduler.release(ns, ctx.owner.name, keep=frozenset(owed))
        self._status.rollouts(ctx.key, ctx.obj, entries)
        return min(wakes, default=None)

    def _current(self, key: Key) -> dict[str, tuple[str, str | None]]:
        """Every HimitsuSecret naming the workload: its target, and the id it holds (read
        directly: memory and caches may lag a write whose answer was lost)."""
        found: dict[str, tuple[str, str | None]] = {}
        for obj in self._kube.list_himitsu_secrets():
            meta = obj.get("metadata") or {}
            try:
                spec = api.parse_spec(obj) if meta.get("namespace") == key[0] else None
            except api.InvalidSpec:
                continue
            if spec and any((t.kind, t.name) == key[1:] for t in spec.rollout.targets):
                owner = Owner(namespace=key[0], name=meta["name"], uid=str(meta.get("uid")))
                target = self._kube.get_secret(key[0], spec.target.name, fresh=True)
                ours = holds_own_data(target, owner=owner, spec=spec)
                found[owner.name] = (spec.target.name, annotations_of(target).get(
                    api.ANN_DATA_ID) if ours else None)
        return found

    def _report(self, obj: Mapping[str, Any], target: api.RolloutTarget, secret: str,
                before: Mapping[str, Any], after: Mapping[str, Any]) -> None:
        """An Event when a restart was made for this object, or a warning appears."""
        events, warning = [], str(after.get("warning") or "")
        if after.get("lastRestart") not in (None, before.get("lastRestart")):
            events.append(("Normal", "RolloutRestarted", f"Restarted {target.kind} "
                           f"{target.name!r}: the data of Secret {secret!r} changed"))
        if warning and warning != before.get("warning"):
            if not target.supported:
                metrics.count_rollout("skipped_kind")
            events.append(("Warning", "RolloutRestartFailed" if warning.startswith(
                ("reading", "restarting", "recording")) else "RolloutRestartSkipped", warning))
        for kind, reason, message in events:
            try:
                self._kube.record_event(obj, type=kind, reason=reason, message=message)
            except Exception as exc:  # best effort, as every Event
                log.warning("recording event failed", reason=reason, error=type(exc).__name__)


def _recorded(entry: Mapping[str, Any]) -> bool:
    """The status shows the workload's record landed: an entry without a warning, or one
    of a failed restart. Without a record now (another tool removed it), what its pods
    have is not known, so a restart is owed."""
    warning = str(entry.get("warning") or "")
    return bool(entry) and (not warning or warning.startswith("restarting"))


def _failure(t: api.RolloutTarget, message: str, recorded: bool) -> str:
    """A failure's warning says ``restarting`` exactly when the workload's record landed."""
    if recorded and message.startswith("reading"):
        return f"restarting {t.kind} {t.name!r} failed: {message}"
    if not recorded and message.startswith("restarting"):
        return "recording" + message.removeprefix("restarting")
    return message


def _on_create(ctx: Context, spec: api.Spec) -> bool:
    """A first sync that is to restart the workloads anyway (``rolloutRestartOnCreate``)."""
    return ctx.status.config_version is None and spec.rollout.on_create
