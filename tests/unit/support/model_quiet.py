"""The ``idle`` invariant of the model-based test (issue 21, items 2 and 3): a wake that
is not due costs no Himitsu request and no status write that changes nothing.

The rules that make such wakes (a foreign annotation on a target, a foreign key in a
Merge target, a spec edit that keeps the source, a change to a token Secret that keeps
its token) open a watch on the HimitsuSecrets they wake, judged from what the oracle
sees, never from the operator's memory: it is Ready and in step, its target holds what
it should, no action of the user awaits fresh data, no fault is pending, no poll falls
due (lastSyncTime plus 90% of refreshInterval; never with refreshInterval 0), nothing
of it is still on its way through an informer, and the operator's queue holds no wake
for it before the watch ends. While the watch is open, a Himitsu request made by its
reconcile, or a status patch of it that leaves the status as it was, is a violation.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from model_himitsu import Request
from model_kube import HSEC, SECRET

from himitsu_controller import api

if TYPE_CHECKING:
    from model_world import World

SPAN = 3.0  # seconds the watch stays open: informer lag, latencies, the reconcile
NS = "apps"


class IdleOracle:
    def __init__(self, world: World, violation: Callable[[str], None]) -> None:
        self.world = world
        self.violation = violation
        self.until: dict[str, float] = {}  # key -> end of its watch (simulated seconds)
        self._prior: dict[str, Any] = {}  # status before a patch in flight, per name

    def quiet_now(self, key: str, problem: str | None) -> bool:
        """Would a wake of ``key`` now be one that is not due? (``problem``: the
        oracle's ``sync_problem`` of the object, None when its target is right.)"""
        world, name = self.world, key.partition("/")[2]
        obj = world.server.get(HSEC, NS, name)
        process = world.process
        if obj is None or process is None or problem is not None:
            return False
        if world.rest.faults or world.himitsu.fail_next or world.himitsu.slow_next:
            return False
        if world.oracle.triggers.get(key) or world.clock.t < world.himitsu.horizon:
            return False
        status = obj.get("status") or {}
        ready: dict[str, Any] = next((c for c in status.get("conditions") or []
                                      if c.get("type") == "Ready"), {})
        if (ready.get("status"), ready.get("reason")) != ("True", "Synced") or \
                status.get("observedGeneration") != obj["metadata"].get("generation") or \
                status.get("lastForceSync") != api.force_sync_value(obj):
            return False
        spec = api.parse_spec(obj)
        now = world.clock.epoch()
        last = api.parse_time(status.get("lastSyncTime"))
        if spec.refresh_interval > 0 and (
                last is None or last.timestamp() + 0.9 * spec.refresh_interval < now + SPAN + 1):
            return False
        targets = (spec.target.name,)
        for feed in process.feeds:
            for _, _, change in feed.pending:
                moving = (change.new or change.old or {}).get("metadata", {}).get("name")
                if (feed.resource, moving) in ((HSEC, name), *((SECRET, t) for t in targets)):
                    return False
        wake = process.wake_of(key)
        return wake is None or wake > now + SPAN + 1

    def watch(self, key: str) -> None:
        self.until[key] = self.world.clock.t + SPAN

    def close(self) -> None:
        self.until.clear()

    def _watched(self, key: str | None) -> bool:
        return key is not None and self.world.clock.t <= self.until.get(key, -1.0)

    # -- what the operator does -------------------------------------------------------

    def answered(self, request: Request) -> None:
        key = self.world.current
        if self._watched(key):
            self.violation(f"idle: the reconcile of {key}, woken before any poll was due "
                           f"with its target intact, asked Himitsu ({request.status}, "
                           f"If-None-Match: {request.if_none_match})")

    def before_write(self, method: str, resource: str, name: str) -> None:
        if resource == HSEC and method == "PATCH":
            prior = self.world.server.get(HSEC, NS, name)
            self._prior[name] = (prior or {}).get("status")

    def after_write(self, method: str, resource: str, name: str,
                    stored: Mapping[str, Any] | None) -> None:
        if resource != HSEC or method != "PATCH" or name not in self._prior:
            return
        prior = self._prior.pop(name)
        key = f"{NS}/{name}"
        if self._watched(key) and stored is not None and stored.get("status") == prior:
            self.violation(f"idle: a status patch of {key} that changes nothing, on a wake "
                           "that was not due")
