"""Review 8 of 3497073 (only a target stamped by its HimitsuSecret holds a restart back;
a wait on a co-holder backs off per workload, with a ``restarting ... waits`` warning):
reproductions.

Each xfail is strict, named after the guarantee it shows broken; it passes (XPASS,
which fails the suite) the day the fix lands: then drop the mark."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from reconcile_world import NAME, NS, TARGET
from test_restarts import two_holders

from himitsu_controller.sync.ports import Conflict
from himitsu_controller.sync.restarts.scheduler import NOT_OURS, Claim, Outcome, Scheduler

KEY = (NS, "Deployment", "web")


def _scheduler(world: Any, holds: dict[str, tuple[str, str | None]]) -> Scheduler:
    """A Scheduler on ``world``'s workloads whose fresh target reads are ``holds``."""
    def current(_key: Any) -> Mapping[str, tuple[str, str | None]]:
        return dict(holds)
    return Scheduler(world.kube, now=lambda: world.clock().timestamp(), current=current)


def _claim() -> Claim:
    """app-config owes web a restart for new data (seen before this process looked)."""
    return Claim(NAME, TARGET, "new-id", None, 10.0, NOT_OURS)


def test_a_co_holder_s_hand_edit_while_the_own_target_reads_none_is_a_wait_not_a_crash(
) -> None:
    """Item 3: a restart held back by a co-holder's hand edit waits with a warning."""
    world = two_holders("10s")
    world.clock.advance(60)
    holds: dict[str, tuple[str, str | None]] = {
        NAME: (TARGET, None), "other": ("other-secrets", NOT_OURS)}
    out = _scheduler(world, holds).settle(KEY, _claim())
    assert out.wake is not None and "waits" in out.message


def test_a_first_conflict_after_a_long_wait_for_a_repair_is_retried_at_once() -> None:
    """Item 3: failures (409s included) back off; a wait for a repair is not a failure."""
    world = two_holders("10s")
    world.clock.advance(60)
    holds: dict[str, tuple[str, str | None]] = {
        NAME: (TARGET, "new-id"), "other": ("other-secrets", NOT_OURS)}
    scheduler = _scheduler(world, holds)
    out: Outcome = scheduler.settle(KEY, _claim())
    for _ in range(12):  # the co-holder stays hand-edited a while (its Himitsu down)
        assert out.wake is not None and out.wake != float("inf")
        world.clock.advance(max(out.wake - world.clock().timestamp(), 0.0))
        out = scheduler.settle(KEY, _claim())
    holds["other"] = ("other-secrets", "repaired-id")  # its sync repairs it
    world.kube.fail_next["patch_workload"] = [Conflict("the workload changed", status=409)]
    world.clock.advance(max((out.wake or 0.0) - world.clock().timestamp(), 0.0))
    out = scheduler.settle(KEY, _claim())
    assert out.wake is not None
    assert out.wake - world.clock().timestamp() <= 2.0, "a first 409 retried minutes later"
