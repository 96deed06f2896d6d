"""When a reconcile wakes and whether it must ask anything: the wake rules.

* ``woken_idle``: everything as this process left it, back to sleep;
  ``defer_after_restart``: a healthy object waits for its next poll after a restart.
* ``held_answer``: any other wake that is not due asks Himitsu nothing; ``restamp``:
  the target's data, kept by a write that puts stamps back (no Himitsu answer needed).
* ``until_due``: the next due time as the controller's Result.

Design: docs/design/polls.md ("Wakes")
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from himitsu_controller import api, himitsu, metrics
from himitsu_controller.runtime.controller import Result
from himitsu_controller.sync.context import Context
from himitsu_controller.sync.memory import Memory, resource_version
from himitsu_controller.sync.polling import schedule
from himitsu_controller.sync.ports import Kube
from himitsu_controller.sync.target import render, targets, writes

__all__ = ["defer_after_restart", "held_answer", "in_step", "not_due_since", "read_target",
           "restamp", "until_due", "woken_idle"]


def in_step(ctx: Context) -> bool:
    """Ready, written for this generation, and no force-sync pending: nothing asks for a poll."""
    status = ctx.status
    return (status.ready is not None and status.ready.status == "True"
            and status.observed_generation == ctx.generation
            and api.force_sync_value(ctx.obj) == status.last_force_sync)


def defer_after_restart(
    kube: Kube, ctx: Context, spec: api.Spec, mem: Memory, *, now: float,
) -> Result | None:
    """First reconcile in this process of a healthy object: wait for its next poll, or
    for refreshInterval 0 (synced once) ask nothing, as ``woken_idle`` does in-process."""
    if mem.target_rv is not None or mem.failures:
        return None
    status = ctx.status
    last = api.parse_time(status.last_sync_time)
    if last is None or not in_step(ctx):
        return None
    interval = spec.refresh_interval
    # A lastSyncTime ahead of our clock (another replica's skew) waits at most an interval.
    remaining = min(last.timestamp() + interval - now, interval)
    if interval > 0 and schedule.is_due(now, now + remaining):
        return None
    # The informer's copy only: a miss is a target to sync, which ``read_target`` reads
    # directly if it must (a read here would be a second GET per object on a cold sync).
    target = kube.get_secret(ctx.owner.namespace, spec.target.name, cached=True)
    if not targets.is_consistent(target, owner=ctx.owner, spec=spec,
                                 version=status.config_version):
        return None
    mem.expect(resource_version(target))
    # lastSyncTime: what the target holds
    mem.scheduled(answered=now + remaining - interval, interval=interval,
                  due=now + remaining if interval > 0 else None)
    # No status write will report it for now: a new process's Ready gauge starts here.
    metrics.set_ready(ctx.owner.namespace, ctx.owner.name, True, "Synced")
    return until_due(mem, now=now)


def woken_idle(
    kube: Kube, ctx: Context, spec: api.Spec, mem: Memory, *, now: float,
) -> Result | None:
    """Woken before the next poll with everything as this process left it (our write's
    echo, a resync, a metadata-only edit): back to sleep until the poll is due, or for
    refreshInterval 0 for good. Drift, a spec change, a force-sync or a failure go on."""
    if mem.target_rv is None or mem.failures or not in_step(ctx):
        return None
    # A due poll, or at refreshInterval 0 a due revalidation, goes on to sync.
    if (mem.due is None and spec.refresh_interval > 0) or (
            mem.due is not None and schedule.is_due(now, mem.due)):
        return None
    target = kube.get_secret(ctx.owner.namespace, spec.target.name, cached=True)
    if resource_version(target) != mem.target_rv or not targets.is_consistent(
            target, owner=ctx.owner, spec=spec, version=ctx.status.config_version):
        return None
    return until_due(mem, now=now)


def held_answer(
    kube: Kube, ctx: Context, spec: api.Spec, mem: Memory, target: Mapping[str, Any] | None,
    *, now: float, consistent: bool,
) -> tuple[himitsu.NotModified, tuple[dict[str, Any], dict[str, str]] | None] | None:
    """For a wake that needs no news (``not_due_since``) with the target's data intact:
    the answer it holds, and, when a spec edit left stamps to put back (a template
    label), the whole target and our data in it, to write without Himitsu. None: ask."""
    version, since = ctx.status.config_version, not_due_since(ctx, spec, mem, now)
    if version is None or since is None:
        return None
    answer = himitsu.NotModified(version=version, age=now - since)
    if consistent:
        return answer, None
    if ctx.status.observed_generation == ctx.generation:
        return None
    try:
        held = restamp(kube, ctx, spec, target)
    except writes.Raced:
        return None  # changed since the cache showed it: a sync decides on it afresh
    return None if held is None else (answer, held)


def restamp(
    kube: Kube, ctx: Context, spec: api.Spec, target: Mapping[str, Any] | None,
) -> tuple[dict[str, Any], dict[str, str]] | None:
    """The whole target and our data in it, which its data hash vouches for: what a write
    putting the stamps back keeps (None: the hash does not). Raises ``writes.Raced`` when
    it changed since ``target`` was read."""
    whole = kube.get_secret(ctx.owner.namespace, spec.target.name, fresh=True)
    if whole is None or resource_version(whole) != resource_version(target):
        raise writes.Raced(creating=whole is None, seen=resource_version(whole))
    data = whole.get("data") or {}
    ours = {k: str(data[k]) for k in targets.our_previous_keys(
        whole, owner=ctx.owner, policy=spec.target.creation_policy) if k in data}
    recorded = targets.annotations_of(whole).get(api.ANN_DATA_HASH)
    return (whole, ours) if recorded == render.data_hash(ours) else None


def not_due_since(ctx: Context, spec: api.Spec, mem: Memory, now: float) -> float | None:
    """When Himitsu gave the answer the target holds, if nothing asks this wake for news:
    Ready, no revalidation pending, no poll due (at refreshInterval 0 none ever is)."""
    ready = ctx.status.ready
    last = api.parse_time(ctx.status.last_sync_time)
    answered = mem.answered if mem.answered is not None else \
        last.timestamp() if last is not None else None
    if (ready is None or ready.status != "True" or answered is None or mem.failures
            or mem.revalidate is not None):
        return None
    interval = spec.refresh_interval
    if interval <= 0:
        return answered
    # Not scheduled here, or under another interval: due by this one, as early as may be.
    due = mem.due if mem.due is not None and interval == mem.interval else \
        schedule.next_due(interval, answered=answered, fraction=1.0)
    return answered if due is not None and not schedule.is_due(now, due) else None


def read_target(kube: Kube, ctx: Context, spec: api.Spec, mem: Memory) -> dict[str, Any] | None:
    """The target: an Owner one from the cache, a direct read when the cache may be
    wrong (docs/design/targets.md, "Reading the target")."""
    owner_policy = spec.target.creation_policy == "Owner" and not mem.read_live
    target = kube.get_secret(ctx.owner.namespace, spec.target.name, cached=owner_policy)
    missing = target is None and owner_policy
    if missing and mem.target_rv is None and ctx.status.config_version is None:
        return None  # never written by this HimitsuSecret: nothing to ask
    if missing or (mem.target_rv is not None and resource_version(target) != mem.target_rv):
        # The cache lags our write, or someone else wrote: read it, and expect that copy.
        target = kube.get_secret(ctx.owner.namespace, spec.target.name, fresh=True)
        mem.expect(resource_version(target))
    return target


def until_due(mem: Memory, *, now: float) -> Result:
    """Sleep until the next poll, never longer than refreshInterval; only refreshInterval
    0 (no poll due) forgets the key."""
    if mem.due is None:
        return Result()
    due = schedule.within_interval(now, mem.due, mem.interval)
    mem.rescheduled(due)
    return Result(requeue_after=schedule.requeue_delay(now, due))
