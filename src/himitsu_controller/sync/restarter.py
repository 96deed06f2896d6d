"""The shared per-workload restart scheduler: batching, coalescing, retries.

One per process, keyed ``namespace/kind/name``, shared by every HimitsuSecret naming the
workload. A HimitsuSecret whose target's data changed *claims* a restart of each of its
workloads (``sync.rollout`` decides when); the claim is due ``minRestartInterval`` after
the change that opened it (``since``, kept in the HimitsuSecret's status, so a claim
survives an operator restart or a leader change). Claims on one workload share one
window: each further claim (another data change, another HimitsuSecret) joins the one
that is open and is due no later than its own ``since + window``. When it is due, the
reconcile that finds it so restarts the workload once for every claim, a patch of its
pod template's ``himitsu.io/restartedAt`` annotation, and leaves each other claimant its
outcome to collect on its own next reconcile (which its Result asked for at that time).
An outcome is kept until the holder claims anew or lets go, so asking again (its status
write failed) gets the same answer, not a second restart.

Nothing sleeps or runs on its own: the reconciles drive it (``claim`` answers "wait until
T", "done" or "failed, retry at T"), on whatever clock they are given.

A restart is made once for every claim it serves, so a claim is served without restarting
again when the workload was restarted after the claim's data was already in the target
(``changed``: the restart's pods read it), even by a restart made for another claimant,
in another process: two HimitsuSecrets owed a restart of one workload when the operator
restarts or the Lease moves get one, not one each (once the workload, read, says the
claim counts: see below). And every window opens no earlier than the workload's last
restart known here, so a claim older than that restart (made before an operator
restart) does not cut the next window short. A ``restartedAt`` further ahead of this
clock than ``CLOCK_SLACK`` (a former leader's clock ahead, or the owner's doing) proves
nothing and is disregarded, and a restart is reported as made at no later than now.

Before patching, the workload is read: a missing one has nothing to restart (its pods,
once created, read the Secret as it is); a claim whose Secret its pod template does not
read (``sync.references``) is skipped, unless the workload's owner allows its holder
(``himitsu.io/allow-restart-by`` on the workload). A refused patch keeps every
claim and is retried with backoff (1 s doubling to 5 min).

The patch also records, in ``himitsu.io/restarted-for`` beside ``restartedAt``, which
data each claimant's restart rolled out (its MAC: ``sync.rollout``). That record and the
restart are one write, so a claim found there is served without restarting again, even
when the operator stopped between the patch and the claimant's status write. It keeps
every claimant of the restart, and as many others as fit in 32, the latest first.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from himitsu_controller import api, metrics
from himitsu_controller.sync.ports import KubeError, Workloads
from himitsu_controller.sync.references import allows_restart_by, secrets_read

__all__ = ["Claim", "Outcome", "Restarter", "refused", "restarted_at"]

RETRY_FIRST, RETRY_CAP = 1.0, 300.0
MAX_SERVED = 32  # claimants remembered in himitsu.io/restarted-for (the latest)
# A restart this long after a claim's data was first seen in the target rolled it out
# (the clocks of two operator replicas, the restartedAt stamp's and the claim's, may differ).
CLOCK_SLACK = 1.0


@dataclass(frozen=True)
class Claim:
    holder: str  # the HimitsuSecret's key, namespace/name
    secret: str  # the target Secret it writes
    digest: str  # the MAC of the data a restart now would roll out (sync.rollout)
    since: float  # epoch seconds: the change that opened the claim
    window: float  # the holder's minRestartInterval
    # Epoch seconds: when the target was first seen holding ``digest`` (None: unknown); a
    # restart after it rolled that data out.
    changed: float | None = None


@dataclass(frozen=True)
class Outcome:
    """``state``: ``waiting`` (due at ``at``), ``failed`` (retried at ``at``), or ``done``:
    restarted at ``at`` for ``digest`` (``result`` restarted or coalesced), or nothing to
    restart (``missing``, ``skipped_unreferenced``); ``message`` says why, if it matters."""

    state: str
    at: float
    result: str = ""
    digest: str | None = None
    message: str = ""


@dataclass
class _Slot:
    claims: dict[str, Claim] = field(default_factory=dict)
    done: dict[str, Outcome] = field(default_factory=dict)
    failures: int = 0
    retry_at: float = 0.0
    restarted: float = 0.0  # the workload's last restart known here (epoch; 0: none)
    lock: threading.Lock = field(default_factory=threading.Lock)


def restarted_at(epoch: float) -> str:
    """RFC 3339 in microseconds: two restarts within one second stay two patches."""
    return datetime.fromtimestamp(epoch, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class Restarter:
    def __init__(self, workloads: Workloads, *, now: Callable[[], float]) -> None:
        self._workloads = workloads
        self._now = now
        self._slots: dict[tuple[str, str, str], _Slot] = {}
        self._by_holder: dict[str, set[tuple[str, str, str]]] = {}  # the slots it is in
        self._lock = threading.Lock()

    def claim(self, namespace: str, kind: str, name: str, claim: Claim) -> Outcome:
        key = (namespace, kind, name)
        while True:
            with self._lock:
                slot = self._slots.setdefault(key, _Slot())
                self._by_holder.setdefault(claim.holder, set()).add(key)
            with slot.lock:
                if self._slots.get(key) is slot:  # not dropped while we waited for it
                    return self._claim(key, slot, claim)

    def _claim(self, key: tuple[str, str, str], slot: _Slot, claim: Claim) -> Outcome:
        done = slot.done.get(claim.holder)
        if done is not None:
            # Served already. For the same data, asking again (the holder's status
            # write failed, say) gets the same answer, never a second restart; for
            # newer data the answer is given once, and the holder claims anew with
            # the change's own window (``since`` now), as after any restart.
            if done.digest != claim.digest:
                del slot.done[claim.holder]
                self._drop_if_idle(key, slot, claim.holder)
            return done
        previous = slot.claims.get(claim.holder)
        if previous is not None and previous.digest != claim.digest:
            metrics.count_rollout("coalesced")  # a further change, batched
        slot.claims[claim.holder] = claim
        due = _due(slot.claims.values(), slot.restarted)
        at = max(due, slot.retry_at)
        now = self._now()
        # Rolled out already by a restart made for another claimant: settled at once,
        # once the workload (read) says the claim counts (it reads the Secret, or consents).
        if now < at and not (_rolled_out(claim, slot.restarted) and now >= slot.retry_at):
            return Outcome("failed" if slot.failures else "waiting", at)
        return self._restart(key, slot, claim.holder, now)

    def release(self, holder: str, *, keep: frozenset[tuple[str, str, str]] = frozenset(),
                ) -> None:
        """``holder`` no longer names these workloads (deleted, or its spec changed):
        its claims and outcomes go, except on the workloads in ``keep``."""
        with self._lock:
            keys = [k for k in self._by_holder.get(holder, ()) if k not in keep]
        for key in keys:
            self.withdraw(*key, holder)

    def withdraw(self, namespace: str, kind: str, name: str, holder: str) -> None:
        """``holder`` owes this workload nothing any more (its data went back to what the
        pods have): its claim must not restart the workload with someone else's."""
        key = (namespace, kind, name)
        with self._lock:
            slot = self._slots.get(key)
        if slot is not None:
            with slot.lock:
                slot.claims.pop(holder, None)
                slot.done.pop(holder, None)
                self._drop_if_idle(key, slot, holder)

    def pending(self) -> int:
        """Claims not yet served (tests, leak checks)."""
        with self._lock:
            slots = list(self._slots.values())
        return sum(len(slot.claims) for slot in slots)

    def _drop_if_idle(self, key: tuple[str, str, str], slot: _Slot, holder: str) -> None:
        """Called with ``slot.lock`` held, once ``holder`` may have left it."""
        with self._lock:
            if holder not in slot.claims and holder not in slot.done:
                held = self._by_holder.get(holder, set())
                held.discard(key)
                if not held:
                    self._by_holder.pop(holder, None)
            if not slot.claims and not slot.done and self._slots.get(key) is slot:
                del self._slots[key]

    def _restart(self, key: tuple[str, str, str], slot: _Slot, holder: str, now: float,
                 ) -> Outcome:
        namespace, kind, name = key
        claims = list(slot.claims.values())
        try:
            workload = self._workloads.get_workload(namespace, kind, name)
            if workload is None:
                outcomes = {c.holder: Outcome(
                    "done", now, "missing", c.digest,
                    f"{kind} {name!r} not found: nothing to restart") for c in claims}
                metrics.count_rollout("missing", len(claims))
            else:
                outcomes = self._serve(key, slot, workload, claims=claims, holder=holder,
                                       now=now)
        except KubeError as exc:
            slot.failures += 1
            delay = min(RETRY_FIRST * 2 ** (slot.failures - 1), RETRY_CAP)
            slot.retry_at = now + delay
            metrics.count_rollout("failed")
            # One message while the same refusal lasts: one Warning Event, not one a retry.
            return Outcome("failed", slot.retry_at, "failed",
                           message=f"{refused(kind, name, exc)}; retrying with backoff")
        for answered in outcomes:
            del slot.claims[answered]
        if not slot.claims:
            slot.failures, slot.retry_at = 0, 0.0
        slot.done.update(outcomes)
        return outcomes.get(holder) or Outcome(
            "waiting", max(_due(slot.claims.values(), slot.restarted), slot.retry_at))

    def _serve(self, key: tuple[str, str, str], slot: _Slot, workload: dict[str, Any], *,
               claims: list[Claim], holder: str, now: float) -> dict[str, Outcome]:
        """The outcomes of the claims the workload as read settles; the others (none
        when the restart is made) wait for the window the workload's last restart opened."""
        namespace, kind, name = key
        # A restartedAt ahead of this clock by more than replicas' clocks may differ (a
        # former leader's clock ahead, or set by the workload's owner) proves nothing.
        stamp = _restarted(workload, 0.0)
        if stamp <= now + CLOCK_SLACK:
            slot.restarted = max(slot.restarted, stamp)
        last = min(slot.restarted, now)  # a restart reported is one made by now
        read, served = secrets_read(workload), _served(workload)
        outcomes: dict[str, Outcome] = {}
        wanted: list[Claim] = []
        fresh: list[Claim] = []
        for c in claims:
            if c.secret not in read and not allows_restart_by(workload, _name(c.holder)):
                metrics.count_rollout("skipped_unreferenced")
                outcomes[c.holder] = Outcome("done", now, "skipped_unreferenced", c.digest,
                                             unreferenced(kind, name, c.secret, c.holder))
                continue
            wanted.append(c)
            if served.get(_name(c.holder)) == c.digest:  # the status write was lost
                outcomes[c.holder] = Outcome("done", last or now, "coalesced", c.digest)
            elif _rolled_out(c, slot.restarted):
                metrics.count_rollout("coalesced")
                outcomes[c.holder] = Outcome("done", last, "coalesced", c.digest)
            else:
                fresh.append(c)
        if not fresh or now < _due(fresh, slot.restarted):
            return outcomes
        for c in wanted:  # the claimants of this restart last: the latest kept
            served.pop(_name(c.holder), None)
            served[_name(c.holder)] = c.digest
        kept = list(served.items())[-max(MAX_SERVED, len(wanted)):]
        self._workloads.restart_workload(namespace, kind, name, annotations={
            api.ANN_RESTARTED_AT: restarted_at(now),
            api.ANN_RESTARTED_FOR: ",".join(f"{k}={v}" for k, v in kept)})
        slot.restarted = now
        metrics.count_rollout("restarted")
        metrics.count_rollout("coalesced", len(fresh) - 1)
        outcomes.update({c.holder: Outcome(
            "done", now, "restarted" if c.holder == holder else "coalesced", c.digest,
        ) for c in fresh})
        return outcomes


def _due(claims: Iterable[Claim], restarted: float) -> float:
    """When claims sharing a workload are due: at the earliest close of their windows,
    none opening before the workload's last restart."""
    return min(max(c.since, restarted) + c.window for c in claims)


def _rolled_out(claim: Claim, restarted: float) -> bool:
    """A restart at ``restarted`` (epoch) rolled out the data ``claim`` asks for."""
    return claim.changed is not None and restarted >= claim.changed + CLOCK_SLACK


def _name(holder: str) -> str:
    return holder.partition("/")[2]


def _served(workload: dict[str, Any]) -> dict[str, str]:
    """``himitsu.io/restarted-for`` of the pod template: HimitsuSecret -> data MAC."""
    meta = ((workload.get("spec") or {}).get("template") or {}).get("metadata") or {}
    raw = str((meta.get("annotations") or {}).get(api.ANN_RESTARTED_FOR) or "")
    pairs = (item.partition("=") for item in raw.split(",") if "=" in item)
    return {k: v for k, _, v in pairs}


def _restarted(workload: dict[str, Any], default: float) -> float:
    meta = ((workload.get("spec") or {}).get("template") or {}).get("metadata") or {}
    when = api.parse_time(str((meta.get("annotations") or {}).get(api.ANN_RESTARTED_AT) or ""))
    return when.timestamp() if when is not None else default


def refused(kind: str, name: str, exc: KubeError) -> str:
    """What a failed read or restart of a workload tells the HimitsuSecret's owner. A 403
    is almost always an install without the rollout-restart RBAC (get and patch on
    workloads are granted apart, and only when the feature is enabled): say how to
    enable it, or how to stop asking."""
    text = str(exc)  # "reading|restarting <kind> <name> failed: <status> ..."
    if exc.status == 403:
        text += (f"; rollout restarts need get and patch on {kind}s, which this install "
                 "may not grant: enable them (Helm: --set rolloutRestarts.enabled=true; "
                 "kubectl/kustomize: deploy/components/rollout-restarts), or remove "
                 f"{kind} {name!r} from rolloutRestartTargets")
    return text


def unreferenced(kind: str, name: str, secret: str, holder: str) -> str:
    return (f"{kind} {name!r} does not read Secret {secret!r} (no envFrom, env valueFrom, "
            "or mounted secret or projected volume names it): not restarted; its owner may "
            f"allow it with the annotation {api.ANN_ALLOW_RESTART_BY}={_name(holder)} "
            "(or *) on the workload")
