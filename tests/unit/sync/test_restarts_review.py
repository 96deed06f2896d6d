"""Adversarial review of issue 22's restarts: each test states a guarantee of item 3 (or
item 2) that the change breaks; they fail until the production code is fixed."""

from __future__ import annotations

import copy
from datetime import timedelta
from typing import Any

from reconcile_world import KEY, NAME, NS, TARGET, World, fetched, merge_world, values
from test_restarts import _other, changed, tick, two_holders

from himitsu_controller import api, himitsu
from himitsu_controller.runtime.controller import Result
from himitsu_controller.sync.ports import Conflict, KubeError
from himitsu_controller.sync.restarts.scheduler import record_of

WEB = {"kind": "Deployment", "name": "web"}

def rollout_world(**spec: Any) -> World:
    spec.setdefault("minRestartInterval", "0")
    world = World(rolloutRestartTargets=[WEB], **spec)
    world.kube.add_workload(NS, "Deployment", "web", reads=TARGET)
    return world


def restarts(world: World) -> list[str]:
    return [at for _, _, name, at in world.kube.restarts if name == "web"]


def wake(world: World, result: Result) -> Result:
    """Let the time the reconcile asked for pass, and reconcile (a poll due is a 304)."""
    assert result.requeue_after is not None
    world.clock.advance(result.requeue_after)
    world.fetcher.script[:] = [himitsu.NotModified(6)]
    result = world.reconciler.reconcile(KEY)
    world.fetcher.script.clear()
    return result


def settle_304(world: World, result: Result) -> Result:
    """Let the time the reconcile asked for pass, and reconcile (a poll due is a 304 for
    the version the target holds)."""
    world.clock.advance(result.requeue_after or 60.0)
    version = int(world.kube.secret(NS, TARGET)["metadata"]["annotations"][
        api.ANN_CONFIG_VERSION])
    world.fetcher.script[:] = [himitsu.NotModified(version)]
    result = world.reconciler.reconcile(KEY)
    world.fetcher.script.clear()
    assert result.error is None, result
    return result


def stamp_of(world: World) -> str:
    return str(world.kube.secret(NS, TARGET)["metadata"]["annotations"][api.ANN_DATA_ID])


def test_a_hand_edit_of_the_target_s_data_id_stamp_alone_restarts_nothing() -> None:
    """Item 3: only a change of the bytes restarts. A user (or a tool copying annotations
    from another Secret) who edits only ``himitsu.io/data-id`` changes no byte."""
    world = rollout_world()
    world.sync(5)
    meta = copy.deepcopy(world.kube.secret(NS, TARGET)["metadata"])
    meta["annotations"][api.ANN_DATA_ID] = "0123456789abcdef"
    world.kube.edit_secret(NS, TARGET, metadata=meta)
    world.restart()  # or a failover: memory gone, the edited stamp is what is read
    world.poll(himitsu.NotModified(5))
    world.poll(himitsu.NotModified(5))
    assert world.data() == values()
    assert restarts(world) == []
    world.poll(fetched(6, values(tag="b")))  # a change of the bytes still restarts, once
    world.poll(himitsu.NotModified(6))
    assert len(restarts(world)) == 1


def test_a_hand_edited_data_id_after_a_crash_that_owed_a_restart_still_restarts() -> None:
    """The edit must not hide a restart owed: the leader wrote new bytes and died within the
    window, then the id was edited; the pods still run the old data."""
    world = rollout_world(minRestartInterval="10s")
    world.sync(5)
    world.poll(fetched(6, values(tag="b")))
    assert restarts(world) == []  # owed, due within the window
    meta = copy.deepcopy(world.kube.secret(NS, TARGET)["metadata"])
    meta["annotations"][api.ANN_DATA_ID] = "0123456789abcdef"
    world.kube.edit_secret(NS, TARGET, metadata=meta)
    world.restart()
    for _ in range(3):
        world.poll(himitsu.NotModified(6))
    assert len(restarts(world)) == 1


def test_data_changed_back_gets_a_fresh_id_so_the_record_does_not_confirm_a_past_value(
) -> None:
    """Item 2: whoever reads only the workload must not confirm a guess of the data. Reusing
    the id of bytes seen before tells them the Secret again holds a value they once knew."""
    world = rollout_world()
    world.sync(5)
    first = record_of(world.kube.workloads[(NS, "Deployment", "web")])
    world.poll(fetched(6, values(tag="b")))
    world.poll(fetched(7))  # the first bytes again
    assert len(restarts(world)) == 2
    assert record_of(world.kube.workloads[(NS, "Deployment", "web")]) != first
    assert stamp_of(world) not in first.values()


def test_a_workload_whose_restart_patch_keeps_hitting_409_is_retried_with_backoff() -> None:
    """No request storm: a busy workload (HPA, another controller) that answers 409 to each
    patch is asked again with a growing delay, as other failures are, not every second;
    once it stops answering 409 the restart is made, once."""
    world = rollout_world()
    world.sync(5)
    world.kube.fail_next["patch_workload"] = [
        Conflict("Deployment 'web' changed while patching", status=409) for _ in range(200)]
    world.kube.calls.clear()
    result = world.poll(fetched(6, values(tag="b")))
    start = world.clock.now
    while world.clock.now - start < timedelta(seconds=120):
        result = wake(world, result)
    # 1 s doubling: at most 8 attempts in 2 minutes (every second: 120)
    assert 2 <= world.kube.calls["patch_workload"] <= 8, world.kube.calls
    assert restarts(world) == []
    world.kube.fail_next.clear()
    for _ in range(4):
        result = wake(world, result)
    assert len(restarts(world)) == 1


def test_a_record_removed_by_another_tool_while_a_restart_is_owed_still_restarts() -> None:
    """Item 3 (a crash between the write and the restart): the leader wrote new bytes and
    died within the window; meanwhile a GitOps sync (Argo CD Replace=true, Helm --force,
    kubectl replace) dropped ``himitsu.io/started-with``. The pods still run the old data:
    the next leader must restart them, not record the new id as what they have."""
    world = rollout_world(minRestartInterval="10s")
    world.sync(5)
    world.poll(fetched(6, values(tag="b")))
    assert restarts(world) == []  # owed, due within the window
    meta = world.kube.workloads[(NS, "Deployment", "web")]["metadata"]
    del meta["annotations"][api.ANN_STARTED_WITH]
    world.restart()
    world.clock.advance(10.0)
    world.poll(himitsu.NotModified(6))
    world.clock.advance(10.0)
    world.poll(himitsu.NotModified(6))
    assert len(restarts(world)) == 1
    assert record_of(world.kube.workloads[(NS, "Deployment", "web")]) == {NAME: stamp_of(world)}


def test_a_first_named_workload_whose_first_record_patch_hit_a_409_is_not_restarted() -> None:
    """Item 3: a workload first named gets its record without a restart. The first patch
    of its record losing an optimistic-concurrency race (the Deployment controller wrote
    its status between our read and our patch) changes nothing about what its pods have."""
    world = rollout_world(minRestartInterval="10s")
    world.kube.fail_next["patch_workload"] = [
        Conflict("Deployment 'web' changed while patching", status=409)]
    result = world.sync(5)
    assert record_of(world.kube.workloads[(NS, "Deployment", "web")]) == {}
    for _ in range(3):
        result = settle_304(world, result)
    assert record_of(world.kube.workloads[(NS, "Deployment", "web")]) == {NAME: stamp_of(world)}
    assert restarts(world) == []


def test_a_first_named_workload_is_not_restarted_once_missing_restart_rbac_is_granted() -> None:
    """The user follows the RolloutRestartFailed Event and enables the RBAC: the workload
    then gets its record, and no restart (no data changed since its pods started)."""
    world = rollout_world(minRestartInterval="10s")
    forbidden = [KubeError("reading Deployment 'web' failed: 403 Forbidden", status=403)
                 for _ in range(2)]
    world.kube.fail_next["get_workload"] = list(forbidden)
    world.kube.fail_next["patch_workload"] = list(forbidden)
    result = world.sync(5)
    assert str(world.status()["rolloutRestarts"][0].get("warning", "")).startswith("reading")
    world.kube.fail_next.clear()  # the RBAC is granted
    for _ in range(3):
        result = settle_304(world, result)
    assert record_of(world.kube.workloads[(NS, "Deployment", "web")]) == {NAME: stamp_of(world)}
    assert restarts(world) == []


def test_a_merge_first_sync_whose_record_patch_lost_a_409_race_still_restarts_once() -> None:
    """Item 3: a first sync that changed a Secret its pods already read (a Merge target) is
    owed its restart. One optimistic-concurrency race on the workload (its controller
    wrote its status between our read and our patch) must not lose it."""
    world = merge_world(rolloutRestartTargets=[WEB], minRestartInterval="10s")
    world.kube.add_workload(NS, "Deployment", "web", reads=TARGET)
    world.kube.fail_next["patch_workload"] = [
        Conflict("Deployment 'web' changed while patching", status=409)]
    world.sync(5)
    assert "KEY_0" in world.data() and "HELM_KEY" in world.data()
    world.clock.advance(10.0)
    world.reconcile()
    world.poll(himitsu.NotModified(5))
    world.poll(himitsu.NotModified(5))
    assert len(restarts(world)) == 1


def test_a_deleted_target_whose_first_repair_failed_keeps_its_data_id_and_restarts_nothing(
) -> None:
    """Item 3: identical bytes restart nothing; the design: a repair of a deleted target
    keeps its id. One failed create (a 500, a timeout) on the way must not change that."""
    world = rollout_world(minRestartInterval="0")
    world.sync(5)
    before = stamp_of(world)
    del world.kube.secrets[(NS, TARGET)]
    world.kube.fail_next["create_secret"] = [KubeError("creating Secret: 500", status=500)]
    world.reconcile(fetched(5))
    world.clock.advance(5.0)
    world.reconcile(fetched(5))
    assert world.data() == values()
    world.poll(himitsu.NotModified(5))
    world.poll(himitsu.NotModified(5))
    assert restarts(world) == []
    assert stamp_of(world) == before


def test_a_restart_while_a_co_holder_s_spec_is_invalid_costs_no_extra_restart_later() -> None:
    """Item 3: an operator restart restarts nothing. The operator itself must not remove
    the record of a HimitsuSecret that still names the workload (a typo being fixed)."""
    world = two_holders()
    other = world.kube.himitsu_secrets[(NS, "other")]
    other["spec"]["minRestartInterval"] = "soon"  # invalid for a moment
    other["metadata"]["generation"] += 1
    world.clock.advance(60)
    world.reconcile(fetched(6, changed("b")))
    world.clock.advance(10.0)
    world.reconcile()
    assert len(restarts(world)) == 1
    other["spec"]["minRestartInterval"] = "10s"  # fixed
    other["metadata"]["generation"] += 1
    _other(world, himitsu.NotModified(5))
    world.restart()
    for _ in range(3):
        world.clock.advance(10.0)
        tick(world)
        tick(world, "other")
    assert len(restarts(world)) == 1


def test_a_first_record_that_lost_a_409_race_is_retried_within_seconds_not_the_window(
) -> None:
    """The record of a workload first named is asked again after the backoff of a 409 (1 s,
    doubling), not at the end of minRestartInterval: the Deployment controller writes its
    status while its first pods start, and the record must not wait a minute for that
    (found on kind: the Deployment's record was missing for the whole default window)."""
    world = rollout_world(minRestartInterval="1m")
    world.kube.fail_next["patch_workload"] = [
        Conflict("Deployment 'web' changed while patching", status=409) for _ in range(2)]
    result = world.sync(5)
    assert record_of(world.kube.workloads[(NS, "Deployment", "web")]) == {}
    start = world.clock.now
    while not record_of(world.kube.workloads[(NS, "Deployment", "web")]):
        assert world.clock.now - start < timedelta(seconds=10), result
        result = settle_304(world, result)
    assert record_of(world.kube.workloads[(NS, "Deployment", "web")]) == {NAME: stamp_of(world)}
    assert restarts(world) == []
