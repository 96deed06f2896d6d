"""Review 3 of the restarts diff (ec0ce65..46354ac): reproductions of guarantees broken.

Each test is a strict xfail named after the guarantee it shows broken; it passes (XPASS,
which fails the suite) the day the fix lands: then drop the mark."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from reconcile_world import KEY, NAME, NS, World, fetched, values
from test_restarts import _other, changed, tick, two_holders
from test_restarts_review import restarts, rollout_world, settle_304

from himitsu_controller import api, himitsu
from himitsu_controller.sync.ports import Conflict, KubeError
from himitsu_controller.sync.restarts.scheduler import record_of

WORKLOAD = (NS, "Deployment", "web")


def fail_restart_patches(world: World, count: int) -> None:
    """The next ``count`` patches that restart (not those that only record) answer 500."""
    patch, left = world.kube.patch_workload, [count]

    def patch_workload(*args: Any, **kwargs: Any) -> dict[str, Any]:
        if kwargs.get("template") and left[0] > 0:
            left[0] -= 1
            raise KubeError("restarting Deployment 'web' failed: 500 InternalError", status=500)
        return patch(*args, **kwargs)
    world.kube.patch_workload = patch_workload  # type: ignore[method-assign]


def test_a_restart_owed_on_create_whose_first_patch_failed_is_not_lost_to_a_dropped_record(
) -> None:
    """Item 3: rolloutRestartOnCreate restarts the workload once; a record another tool
    removed may cost an extra restart, never a lost one (docs/restarting-consumers.md)."""
    world = rollout_world(rolloutRestartOnCreate=True)
    fail_restart_patches(world, 1)
    result = world.sync(5)
    assert record_of(world.kube.workloads[WORKLOAD]) == {NAME: "-"}  # the record landed
    assert restarts(world) == []  # the restart patch failed: retried with backoff
    (entry,) = world.status()["rolloutRestarts"]
    # The docs: a warning starts with ``restarting`` once the record landed.
    assert entry["warning"].startswith("restarting"), entry["warning"]
    # A GitOps sync drops the record before the retry (with or without an operator
    # restart in between: the status entry decides the baseline either way).
    del world.kube.workloads[WORKLOAD]["metadata"]["annotations"][api.ANN_STARTED_WITH]
    for _ in range(3):
        result = settle_304(world, result)
    assert len(restarts(world)) == 1


def test_changes_within_one_window_after_a_first_record_lost_to_409s_are_one_restart(
) -> None:
    """Item 3: several changes within the window are one restart, with the last data,
    even when the workload's first record lost 409 races (a Deployment starting). Without
    the 409s the same two changes are one restart (t=115, with the last data)."""
    world = rollout_world(minRestartInterval="1m", refreshInterval="10s")
    world.kube.fail_next["patch_workload"] = [_conflict() for _ in range(50)]
    world.sync(5)  # t=0: the target written; the workload's record waits (409s)
    assert record_of(world.kube.workloads[WORKLOAD]) == {}
    world.clock.advance(55)  # the 409s stop
    world.kube.fail_next.clear()
    result = world.reconcile(fetched(6, values(tag="b")))  # t=55: a change (record first)
    version, start = 6, world.clock.now
    while world.clock.now - start < timedelta(seconds=80):
        world.clock.advance(result.requeue_after or 10.0)
        late = version == 6 and world.clock.now - start >= timedelta(seconds=9)
        version = 7 if late else version  # t=65: another change, within the window
        world.fetcher.script[:] = [fetched(7, values(tag="c")) if late
                                   else himitsu.NotModified(version)]
        result = world.reconciler.reconcile(KEY)
        world.fetcher.script.clear()
    assert world.data() == values(tag="c")
    assert len(restarts(world)) == 1, restarts(world)


def _conflict() -> Exception:
    return Conflict("Deployment 'web' changed while patching", status=409)


@pytest.mark.xfail(strict=True, reason=(
    "review3: Restarts._current keeps an invalid co-holder's record as it was (item 4 of "
    "this diff), also when the restart just gave the pods that co-holder's new bytes: "
    "once its spec is fixed, it restarts the workload again for data the pods have"))
def test_a_restart_while_a_co_holder_s_spec_is_invalid_records_what_its_pods_now_have(
) -> None:
    """Item 3: a restart happens only for bytes the pods do not have. ``other`` wrote new
    bytes and the operator restarted before ``other`` settled its restart (a failover);
    its spec is invalid for a moment; app-config's change restarts web, whose new pods
    read other-secrets' new bytes too: fixing the typo must not cost a second restart."""
    world = two_holders()
    world.clock.advance(60)
    _other(world, fetched(6, changed("o")))  # other-secrets changes: a restart is owed
    world.restart()  # a failover before other's restart: its claim is in no memory
    other = world.kube.himitsu_secrets[(NS, "other")]
    other["spec"]["minRestartInterval"] = "soon"  # invalid for a moment
    other["metadata"]["generation"] += 1
    world.clock.advance(1)
    world.reconcile(fetched(6, changed("b")))
    world.clock.advance(10.0)
    tick(world)
    assert len(restarts(world)) == 1  # web's new pods read both targets' new bytes
    assert record_of(world.kube.workloads[WORKLOAD])["other"] == world.kube.secret(
        NS, "other-secrets")["metadata"]["annotations"][api.ANN_DATA_ID]
    other["spec"]["minRestartInterval"] = "10s"  # fixed
    other["metadata"]["generation"] += 1
    for _ in range(4):
        world.clock.advance(10.0)
        tick(world)
        tick(world, "other")
    assert len(restarts(world)) == 1, restarts(world)


def test_changes_within_one_window_after_a_failover_are_one_restart() -> None:
    """Item 3: several changes within the window are one restart with the last data; an
    operator restart or failover changes nothing of that (the record shows the pods had
    the data the target held before the change)."""
    world = rollout_world(minRestartInterval="1m", refreshInterval="10s")
    world.sync(5)
    world.restart()  # an upgrade or a failover; meanwhile Himitsu changed
    world.clock.advance(30)
    result = world.reconcile(fetched(6, values(tag="b")))
    world.clock.advance(10)
    result = world.reconcile(fetched(7, values(tag="c")))  # 10 s later: the same window
    for _ in range(12):
        result = settle_304(world, result)
    assert world.data() == values(tag="c")
    assert len(restarts(world)) == 1, restarts(world)
