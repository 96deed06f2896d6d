"""Review 7 of c620537..8d12029 (no restart while any holder's target has a hand edit,
waits of no wake of their own, Events sent whether or not the status is written, a lost
write's ``sent`` read afresh): reproductions.

Each xfail is strict named after the guarantee it shows broken; it passes (XPASS,
which fails the suite) the day the fix lands: then drop the mark."""

from __future__ import annotations

from typing import Any

import pytest
from fakes import b64
from reconcile_world import NS, fetched, make_hsec
from test_restarts import (
    WEB,
    _other,
    changed,
    restarts,
    rollout_world,
    tick,
    two_holders,
    workload,
)

from himitsu_controller import himitsu
from himitsu_controller.runtime.controller import Result
from himitsu_controller.sync.ports import KubeError


def _hand_edit_other(world: Any) -> None:
    other = world.kube.secret(NS, "other-secrets")["data"]
    world.kube.edit_secret(NS, "other-secrets", data={**other, "KEY_0": b64("hand-edit")})


def test_a_co_holder_that_cannot_repair_its_hand_edit_does_not_starve_a_restart_forever(
) -> None:
    """Item 3: a change restarts each named workload no later than the window after it
    reached the Secret; at the least, a restart held back is said in the entry."""
    world = two_holders("10s")
    world.clock.advance(60)
    _hand_edit_other(world)
    world.reconcile(fetched(6, changed("b")))  # app-config's data changes: web owes one
    for _ in range(48):  # a day of hourly wakes; other's Himitsu is down all along
        world.clock.advance(1800)
        assert _other(world, himitsu.ServerError("down")).error == "FetchFailure"
        tick(world)
    warned = "warning" in (world.status().get("rolloutRestarts") or [{}])[0]
    assert restarts(world) or warned, "web never restarted for app-config's change, unsaid"


def test_a_restart_held_back_by_a_co_holder_s_hand_edit_is_made_soon_after_the_repair(
) -> None:
    """Item 3: no later than the window after the change (here: after the repair that
    unblocks it), not a whole refreshInterval of the claim's holder later. Each key is
    reconciled only when it asked (the co-holder's repair wakes nothing of the claim's);
    failed on 8d12029 (wake inf), passes since f836292."""
    world = two_holders("10s", refreshInterval="1h")  # app-config polls hourly
    world.clock.advance(3600)  # app-config's poll falls due
    _other(world, fetched(5))
    _hand_edit_other(world)
    result = world.reconcile(fetched(6, changed("b")))
    due = world.clock().timestamp() + (result.requeue_after or 3600.0)
    world.clock.advance(10)
    if world.clock().timestamp() >= due:
        result = tick(world)
        due = world.clock().timestamp() + (result.requeue_after or 3600.0)
    assert restarts(world) == []  # not onto other-secrets' hand edit
    world.clock.advance(50)
    _other(world, fetched(5))  # other's sync repairs its target
    repaired = world.clock().timestamp()
    while world.clock().timestamp() < repaired + 600:  # ten minutes: each key woken when it asked
        world.clock.advance(10)
        if world.clock().timestamp() >= due:
            result = tick(world)
            due = world.clock().timestamp() + (result.requeue_after or 3600.0)
        tick(world, "other")
    waited = world.clock().timestamp() - repaired
    assert restarts(world), f"no restart {waited:.0f}s after the repair"


@pytest.mark.xfail(strict=True, reason=(
    "review7 (LOW): StatusWriter.rollouts sends its Events in a finally, against `before` "
    "read from the status that failed to be written: each retry of a refused restart "
    "sends the same RolloutRestartFailed Warning again while the status write fails "
    "(status.py rollouts' finally block)"))
def test_a_warning_is_sent_once_while_the_status_write_keeps_failing() -> None:
    """Item 3: Events as today: one Warning per new warning, not one per retry."""
    world = rollout_world(minRestartInterval="0")
    world.sync(5)
    world.kube.fail_next["patch_workload"] = [
        KubeError("restarting Deployment 'web' failed: 403 Forbidden", status=403)] * 6
    world.kube.fail_next["patch_status"] = [
        KubeError("etcdserver: timed out", status=504)] * 20
    result: Result = world.poll(fetched(6, changed("b")))
    for _ in range(5):  # the restart's retries (1 s, 2 s, ...), each status write failing
        world.clock.advance(result.requeue_after or 1.0)
        result = tick(world)
    warnings = [e for e in world.kube.events if e.reason == "RolloutRestartFailed"]
    assert len(warnings) <= 1, [e.message[:60] for e in warnings]


def test_a_co_holder_in_target_conflict_does_not_hold_back_another_s_restarts() -> None:
    """Item 3: each change restarts web once, within the window; a co-holder that never
    wrote its target (a Secret of that name it may not take over) has no hand edit."""
    world = rollout_world(minRestartInterval="10s")
    other = make_hsec(rolloutRestartTargets=[WEB], minRestartInterval="10s")
    other["metadata"]["name"] = "other"
    other["spec"]["target"]["name"] = "other-secrets"
    world.kube.add_himitsu_secret(other)
    world.kube.put_secret({"metadata": {"namespace": NS, "name": "other-secrets"},
                           "data": {"FOREIGN": b64("someone else's")}})
    workload(world)["spec"]["template"]["spec"]["containers"][0]["envFrom"].append(
        {"secretRef": {"name": "other-secrets"}})
    world.sync(5)
    _other(world, fetched(5))  # the create finds the name taken; the retry reads it
    assert world.reconciler.reconcile(f"{NS}/other").error == "TargetConflict"
    world.clock.advance(60)
    world.reconcile(fetched(6, changed("b")))
    for _ in range(30):
        world.clock.advance(10)
        tick(world)
    assert len(restarts(world)) == 1, restarts(world)


def test_a_restart_held_back_by_an_unrepaired_co_holder_backs_off() -> None:
    """The review6 cost rule: a restart waiting for a repair never wakes each second."""
    world = two_holders("0", refreshInterval="1h")
    world.clock.advance(3600)
    _hand_edit_other(world)  # other's Himitsu is down from here on: never repaired
    result = world.reconcile(fetched(6, changed("b")))
    start = world.clock().timestamp()
    reads = world.kube.direct_reads + world.kube.calls["get_workload"]
    while world.clock().timestamp() - start < 600:
        world.clock.advance(result.requeue_after or 3600.0)
        if world.clock().timestamp() - start >= 600:
            break
        result = tick(world)
    assert restarts(world) == []  # never onto the hand edit
    requests = world.kube.direct_reads + world.kube.calls["get_workload"] - reads
    assert requests <= 40, f"{requests} Kubernetes reads in 10 min, waiting for a repair"
