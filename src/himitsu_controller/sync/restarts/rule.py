"""When a HimitsuSecret's workloads owe a restart: while the data id each one records for
its pods (``before_change``) differs from the one stamped on the target (``data_id``).

Why this is level-based and leaks nothing, and the edge cases: docs/design/restarts.md.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from math import inf
from typing import Any

import structlog

from himitsu_controller import api, metrics
from himitsu_controller.runtime.controller import Result
from himitsu_controller.sync.context import Context
from himitsu_controller.sync.memory import Memory
from himitsu_controller.sync.polling import schedule
from himitsu_controller.sync.ports import Kube, KubeError
from himitsu_controller.sync.restarts.scheduler import NOT_OURS, Claim, Key, Scheduler, stamp
from himitsu_controller.sync.status import StatusWriter, bounded
from himitsu_controller.sync.target.stamps import stamped_by
from himitsu_controller.sync.target.targets import Owner, annotations_of, holds_own_bytes

__all__ = ["Restarts"]

log = structlog.get_logger(__name__)


class Restarts:
    def __init__(self, kube: Kube, status: StatusWriter, *, now: Callable[[], float]) -> None:
        self._kube, self._status, self._now = kube, status, now
        self.scheduler = Scheduler(kube, now=now, current=self._current)

    def before_change(self, ctx: Context, spec: api.Spec, target: Mapping[str, Any] | None,
                      mem: Memory) -> None:
        """A write will put other bytes in ``target``: a workload without a record gets one.
        When each one's record is the target's id, none is owed: the change opens a window."""
        ann, on_create = annotations_of(target), _on_create(ctx, spec)
        if target is None and not on_create:
            return  # no pod can have read a missing target
        ours = ann.get(api.ANN_OWNED_BY) == ctx.owner.name and not on_create
        held, had = ann.get(api.ANN_DATA_ID) if ours else None, {}
        for t in (t for t in spec.rollout.targets if t.supported):
            try:
                had[t.kind, t.name] = self.scheduler.baseline(
                    (ctx.owner.namespace, t.kind, t.name), ctx.owner.name, spec.target.name,
                    held or NOT_OURS)
            except KubeError as exc:  # a 403 (no restart RBAC), 400 or 422 lasts: go on
                if exc.status in (0, 409, 429) or exc.status >= 500:
                    raise
                log.warning("recording a workload failed", key=ctx.key, error=str(exc))
                had[t.kind, t.name] = None
        # A record read (not one just put back: a guess) that is the target's: none is owed.
        for workload in (w for w, v in had.items() if held and v in (held, None)):
            mem.rolled_out(workload, held or "")

    def after(self, ctx: Context, spec: api.Spec, mem: Memory, result: Result) -> Result:
        """``result`` (whatever the sync did), woken in time for the restarts owed."""
        try:
            wake = self._step(ctx, spec, mem)
        except KubeError as exc:  # the status patch: retried
            log.warning("rollout status update failed", key=ctx.key, error=str(exc))
            wake = self._now() + 1.0
        delay = None if wake in (None, inf) else schedule.requeue_delay(self._now(), wake)
        if delay is None or 0 < (result.requeue_after or 0) <= delay:
            return result
        return Result(requeue_after=delay, error=result.error)

    def forget(self, namespace: str, name: str) -> None:
        self.scheduler.release(namespace, name)

    def _step(self, ctx: Context, spec: api.Spec, mem: Memory) -> float | None:
        """Settle the workloads owed a restart, write their status entries; the next wake."""
        ns, entries, wakes = ctx.owner.namespace, [], {}
        if mem.data_id is None or mem.sent:  # else as known; after a lost answer: fresh
            target = self._kube.get_secret(ns, spec.target.name, cached=not mem.sent,
                                           fresh=bool(mem.sent))
            ours = holds_own_bytes(target, owner=ctx.owner, spec=spec)
            mem.target_holds(annotations_of(target if ours else None), since=None,
                             read=bool(mem.sent))
        held = mem.data_id or ""
        if not held and spec.rollout.targets:
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
                if entry["warning"] != before.get("warning"):
                    metrics.count_rollout("skipped_kind")
            elif (mem.workloads or {}).get((t.kind, t.name)) != held:
                key, recorded = (ns, t.kind, t.name), _recorded(before)
                baseline = NOT_OURS if recorded or _on_create(ctx, spec) else held
                out = self.scheduler.settle(key, Claim(
                    ctx.owner.name, spec.target.name, held, mem.since_of((t.kind, t.name)),
                    spec.rollout.min_interval, baseline, (mem.data_digest, mem.data_check),
                    recorded=recorded))
                if out.wake is None:  # nothing more owed for this data
                    mem.rolled_out((t.kind, t.name), held)
                else:
                    wakes[key] = out.wake
                if out.message:
                    entry["warning"] = bounded(out.message)
                elif out.recorded:
                    entry.pop("warning", None)
                    if out.restarted:
                        entry["lastRestart"] = stamp(out.restarted)
                if not (recorded or out.recorded or "warning" in entry):
                    continue  # no entry until its record lands (a 409): see _recorded
            entries.append(entry)
        self.scheduler.release(ns, ctx.owner.name, keep=frozenset(wakes))
        self._status.rollouts(ctx.key, ctx.obj, entries)
        return min(wakes.values(), default=None)

    def _current(self, key: Key) -> dict[str, tuple[str, str | None]]:
        """Each HimitsuSecret naming the workload: its target, the id it holds (read fresh;
        NOT_OURS: a target stamped ours holding other bytes, a hand edit; None: none).
        One whose spec is invalid (a typo being fixed) may name it: its record is kept."""
        found: dict[str, tuple[str, str | None]] = {}
        for obj in self._kube.list_himitsu_secrets():
            meta = obj.get("metadata") or {}
            try:
                spec = api.parse_spec(obj) if meta.get("namespace") == key[0] else None
            except api.InvalidSpec:
                found[meta["name"]] = ("", None)
                continue
            if spec and any((t.kind, t.name) == key[1:] for t in spec.rollout.targets):
                owner = Owner(namespace=key[0], name=meta["name"], uid=str(meta.get("uid") or ""))
                target = self._kube.get_secret(key[0], spec.target.name, fresh=True)
                ours = holds_own_bytes(target, owner=owner, spec=spec)
                edited = stamped_by(target, name=owner.name, uid=owner.uid)  # other bytes
                found[owner.name] = (spec.target.name, annotations_of(target).get(
                    api.ANN_DATA_ID) if ours else NOT_OURS if edited else None)
        return found


def _recorded(entry: Mapping[str, Any]) -> bool:
    """The status shows the workload's record landed (a warning says ``restarting``)."""
    warning = str(entry.get("warning") or "")
    return bool(entry) and (not warning or warning.startswith("restarting"))


def _on_create(ctx: Context, spec: api.Spec) -> bool:
    """A first sync that is to restart the workloads anyway (``rolloutRestartOnCreate``)."""
    return ctx.status.config_version is None and spec.rollout.on_create
