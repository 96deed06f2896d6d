"""Review 4 of the restarts and reconciler fixes (431b481..b9304df): reproductions.

Each test is named after the guarantee it shows; one still broken is a strict xfail (an
XPASS fails the suite the day its fix lands: then drop the mark)."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

import pytest
from reconcile_world import NAME, NS, TARGET, World, fetched, values
from test_restarts_review import restarts, rollout_world, settle_304

from himitsu_controller import api as ann
from himitsu_controller.himitsu import ServerError
from himitsu_controller.sync.ports import KubeError

WEB = {"kind": "Deployment", "name": "web"}
API = {"kind": "Deployment", "name": "api"}


def lose_the_next_secret_write_answer(world: Any) -> None:
    """The next update of the target lands on the apiserver; its answer does not."""
    original = world.kube.update_secret

    def applied_then_lost(namespace: str, body: dict[str, Any]) -> dict[str, Any]:
        original(namespace, body)
        world.kube.update_secret = original
        raise KubeError("connection reset by peer", status=0)

    world.kube.update_secret = applied_then_lost


@pytest.mark.parametrize("operator_restarts", [False, True])
def test_changes_within_one_window_after_a_lost_write_answer_are_one_restart(
        operator_restarts: bool) -> None:
    """Item 3: several changes within the window are one restart with the last data, when
    the first change's Secret write landed but its answer was lost."""
    world = rollout_world(minRestartInterval="1m", refreshInterval="10s")
    world.sync(5)
    world.clock.advance(30)
    if operator_restarts:
        world.restart()
    lose_the_next_secret_write_answer(world)
    result = world.reconcile(fetched(6, values(tag="b")))  # landed; WriteFailure
    assert world.data() == values(tag="b")
    first = world.clock().timestamp()
    world.clock.advance(result.requeue_after or 1.0)
    result = world.reconcile(fetched(6, values(tag="b")))  # the retry finds it written
    world.clock.advance(result.requeue_after or 10.0)
    assert world.clock().timestamp() - first < 30  # the next poll: well within the 1m window
    result = world.reconcile(fetched(7, values(tag="c")))  # another change
    for _ in range(12):
        result = settle_304(world, result)
    assert world.data() == values(tag="c")
    assert len(restarts(world)) == 1, restarts(world)


def failover_with_api_owed() -> World:
    """web's record is the target's id, api's predates it: the old leader died before
    restarting api; 30 s later, the new leader is about to take its first look."""
    world = World(rolloutRestartTargets=[WEB, API], minRestartInterval="1m",
                  refreshInterval="10s")
    world.kube.add_workload(NS, "Deployment", "web", reads=TARGET)
    world.kube.add_workload(NS, "Deployment", "api", reads=TARGET)
    world.sync(5)
    api_obj = world.kube.workloads[(NS, "Deployment", "api")]
    api_obj["metadata"]["annotations"][ann.ANN_STARTED_WITH] = f"{NAME}=0123456789abcdef"
    world.restart()
    world.clock.advance(30)
    return world


def two_changes_an_interval_apart(world: World) -> None:
    """The new leader's first look writes a change, the next poll another (one window);
    then the restarts settle."""
    result = world.reconcile(fetched(6, values(tag="b")))
    world.clock.advance(result.requeue_after or 10.0)
    result = world.reconcile(fetched(7, values(tag="c")))
    for _ in range(12):
        result = settle_304(world, result)
    assert world.data() == values(tag="c")


def _failover_with_one_workload_owed() -> tuple[World, datetime]:
    """``failover_with_api_owed``, then two changes an interval apart."""
    world = failover_with_api_owed()
    first_look = world.clock()
    two_changes_an_interval_apart(world)
    return world, first_look


def test_a_restart_owed_before_a_failover_stays_due_at_once_when_the_new_leader_writes(
) -> None:
    """Item 3: a restart owed before a failover, for data of unknown age, is due at once
    (docs/design/restarts.md), not a window after the change the new leader wrote; another
    workload of the same HimitsuSecret whose record is current does not change that (a
    regression of 79cc1da, found by review4)."""
    world, first_look = _failover_with_one_workload_owed()
    api = [at for _, _, name, at in world.kube.restarts if name == "api"]
    assert api and datetime.fromisoformat(api[0]) - first_look < timedelta(seconds=15), (
        api, first_look)


def test_changes_within_one_window_after_a_failover_are_one_restart_for_a_current_workload(
) -> None:
    """Item 3: several changes within the window are one restart with the last data."""
    world, _ = _failover_with_one_workload_owed()
    web = [at for _, _, name, at in world.kube.restarts if name == "web"]
    assert len(web) == 1, web


def test_a_restart_owed_at_a_failover_waits_for_the_repair_of_a_hand_edited_target() -> None:
    """Seed 46 (the oracle's, test_model_review4.py): a restart owed when the leader
    changes, the target's data edited by hand meanwhile, Himitsu failing. The new leader
    never restarts the pods onto the hand edit; the repair that Himitsu's retry allows
    restarts them at once (data of unknown age), with what the target then holds."""
    world = rollout_world(minRestartInterval="10s", refreshInterval="10s")
    world.sync(5)
    world.clock.advance(10)
    world.reconcile(fetched(6, values(tag="b")))  # a change: its restart a window later
    assert restarts(world) == []
    world.restart()
    world.kube.edit_secret(NS, TARGET, data={"KEY_0": "ZWRpdGVk"})
    world.clock.advance(1)
    failed = world.reconcile(ServerError("down", status=500))
    assert failed.error == "FetchFailure" and restarts(world) == []
    world.clock.advance(failed.requeue_after or 1.0)
    world.reconcile(fetched(6, values(tag="b")))  # the repair
    assert len(restarts(world)) == 1
    assert world.data() == values(tag="b")


def test_an_owed_restart_waits_for_the_repair_of_a_target_edited_by_hand() -> None:
    """The pods never start with a hand edit the operator is about to repair."""
    world = rollout_world(minRestartInterval="10s", refreshInterval="1m")
    world.sync(5)
    world.clock.advance(60)
    result = world.reconcile(fetched(6, values(tag="b")))  # owed a window later
    world.clock.advance(1)
    world.kube.edit_secret(NS, TARGET, data={**world.target()["data"], "KEY_0": "ZWRpdGVk"})
    for _ in range(5):  # Himitsu down past the window's end
        result = world.reconcile(ServerError("down", status=500))
        world.clock.advance(result.requeue_after or 1.0)
    assert restarts(world) == [], "restarted onto the hand edit"
    world.reconcile(fetched(6, values(tag="b")))  # the repair
    assert len(restarts(world)) == 1


def test_a_restart_waiting_for_a_repair_does_not_wake_the_sync_every_second() -> None:
    """Cost: while Himitsu is down and the target holds a hand edit, the restart owed
    wakes the sync at most once per minRestartInterval (Himitsu's backoff paces the rest),
    not every second for as long as the outage lasts."""
    world = rollout_world(minRestartInterval="1m", refreshInterval="1m")
    world.sync(5)
    world.clock.advance(60)
    world.reconcile(fetched(6, values(tag="b")))
    world.clock.advance(1)
    world.kube.edit_secret(NS, TARGET, data={**world.target()["data"], "KEY_0": "ZWRpdGVk"})
    start, wakes = world.clock().timestamp(), 0
    while world.clock().timestamp() - start < 600:  # a ten-minute outage
        result = world.reconcile(ServerError("down", status=500))
        world.clock.advance(result.requeue_after or 1.0)
        wakes += 1
    assert restarts(world) == []
    assert wakes <= 30, wakes  # every second would be 600
    world.reconcile(fetched(6, values(tag="b")))  # the repair
    assert len(restarts(world)) == 1
