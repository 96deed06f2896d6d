"""Rollout restarts (issue 22): a workload records, in its own annotations, the data id its
pods were started with; a restart is owed exactly while that record differs from the id
the target holds, and is one patch of restartedAt and the record. Batched per workload,
one restart per window whatever the number of HimitsuSecrets; a restart owed survives
failures, crashes and a change of leader, and is made once.

Everything runs on the reconcile world's simulated clock: the only way time passes is
``world.clock.advance``, and the reconciler's Result says when it wants to be woken.
``world.restart()`` is a new operator process (a crash, a rollout, a new leader): all
memory gone, the apiserver as it was.
"""

from __future__ import annotations

import itertools
from typing import Any

import pytest
from fakes import FakeKube, b64
from hypothesis import given, settings
from hypothesis import strategies as st
from reconcile_world import (
    KEY,
    NAME,
    NS,
    TARGET,
    TOKEN,
    World,
    fetched,
    make_hsec,
    merge_world,
    values,
)

from himitsu_controller import api, himitsu, metrics
from himitsu_controller.runtime.controller import Result
from himitsu_controller.sync.polling.schedule import MAX_FAILURE_BACKOFF as RETRY_CAP
from himitsu_controller.sync.ports import KubeError
from himitsu_controller.sync.restarts import references
from himitsu_controller.sync.restarts.scheduler import (
    Claim,
    Scheduler,
    record_of,
    stamp,
)
from himitsu_controller.sync.target import render

WINDOW = 10.0
WEB = {"kind": "Deployment", "name": "web"}


def rollout_world(*targets: dict[str, Any], reads: str | None = TARGET, **spec: Any) -> World:
    spec.setdefault("minRestartInterval", "10s")
    world = World(rolloutRestartTargets=list(targets or [WEB]), **spec)
    world.kube.add_workload(NS, "Deployment", "web", reads=reads)
    return world


def merge_web_world() -> World:
    """A Merge HimitsuSecret into a Secret that web's pods already read, 10 s window."""
    world = merge_world(rolloutRestartTargets=[WEB], minRestartInterval="10s")
    world.kube.add_workload(NS, "Deployment", "web", reads=TARGET)
    return world


def restarts(world: World) -> list[str]:
    return [at for _, _, name, at in world.kube.restarts if name == "web"]


def workload(world: World, name: str = "web") -> dict[str, Any]:
    return world.kube.workloads[(NS, "Deployment", name)]


def record(world: World, holder: str = NAME) -> str | None:
    return record_of(workload(world)).get(holder)


def data_id(world: World, target: str = TARGET) -> str:
    return str(world.kube.secret(NS, target)["metadata"]["annotations"][api.ANN_DATA_ID])


def entry(world: World, name: str = "web") -> dict[str, Any]:
    (found,) = [e for e in world.status().get("rolloutRestarts") or [] if e["name"] == name]
    assert isinstance(found, dict)
    return found


def wake(world: World, result: Result) -> Result:
    """Let the time the reconcile asked for pass, and reconcile (no poll may be due)."""
    assert result.requeue_after is not None
    world.clock.advance(result.requeue_after)
    return world.reconcile()


def tick(world: World, name: str = NAME) -> Result:
    """A reconcile of ``name`` however the queue woke it: a poll that falls due is
    answered 304 (Himitsu unchanged since the version the target holds)."""
    target = world.kube.himitsu_secrets[(NS, name)]["spec"]["target"]["name"]
    held = world.kube.secret(NS, target)["metadata"]["annotations"][api.ANN_CONFIG_VERSION]
    world.fetcher.script[:] = [himitsu.NotModified(int(held))]
    result = world.reconciler.reconcile(f"{NS}/{name}")
    world.fetcher.script.clear()
    return result


def count(result: str) -> float:
    value = metrics.rollout_restarts.labels(result=result)._value.get()
    return float(value)


def changed(tag: str) -> dict[str, str]:
    return values(tag=tag)


# --- the record and the rule -----------------------------------------------------------


def test_a_first_sync_records_the_target_s_data_id_on_the_workload_without_a_restart() -> None:
    world = rollout_world()
    world.sync(5)
    assert restarts(world) == []
    assert record(world) == data_id(world)
    assert "restartedAt" not in str(workload(world)["spec"]["template"])
    assert entry(world) == {"kind": "Deployment", "name": "web"}


def test_a_data_change_restarts_once_within_the_window_and_never_on_a_304() -> None:
    world = rollout_world()
    world.sync(5)
    world.poll(himitsu.NotModified(5))
    old, made = data_id(world), count("restarted")
    result = world.poll(fetched(6, changed("b")))
    assert restarts(world) == [] and record(world) == old != data_id(world)
    assert result.requeue_after is not None and result.requeue_after <= WINDOW
    result = wake(world, result)
    assert len(restarts(world)) == 1 and record(world) == data_id(world)
    assert entry(world)["lastRestart"] == restarts(world)[0]
    assert world.ready()["status"] == "True"
    assert [e.reason for e in world.kube.events].count("RolloutRestarted") == 1
    for _ in range(5):
        world.poll(himitsu.NotModified(6))
    assert len(restarts(world)) == 1 and count("restarted") - made == 1


def test_the_restart_is_one_patch_of_restarted_at_and_the_record() -> None:
    """What makes it atomic and idempotent: the template annotation and the record move
    in the same write, conditional on the resourceVersion just read."""
    world = rollout_world(minRestartInterval="0")
    world.sync(5)
    before = world.kube.calls["patch_workload"]
    world.poll(fetched(6, changed("b")))
    (at,) = restarts(world)
    assert world.kube.calls["patch_workload"] == before + 1
    assert api.parse_time(at) == world.clock.now
    template = workload(world)["spec"]["template"]
    assert template["metadata"]["annotations"][api.ANN_RESTARTED_AT] == at
    assert record(world) == data_id(world)


@pytest.mark.parametrize("how", ["version bump, same bytes", "repair", "force-sync",
                                 "hand edit"])
def test_nothing_changed_in_the_bytes_restarts_nothing(how: str) -> None:
    world = rollout_world(minRestartInterval="0")
    world.sync(5)
    if how == "version bump, same bytes":
        world.poll(fetched(9))
    elif how == "repair":
        del world.kube.secrets[(NS, TARGET)]
        world.reconcile(fetched(5))
        assert world.data() == values()
    elif how == "force-sync":
        world.annotate(api.ANN_FORCE_SYNC, "1")
        world.reconcile(fetched(5))
    else:
        world.kube.edit_secret(NS, TARGET, data={"KEY_0": "ZWRpdGVk"})
        world.reconcile(fetched(5))
        assert world.data() == values()
    world.poll(himitsu.NotModified(world.status()["configVersion"]))
    assert restarts(world) == []
    assert world.kube.writes() >= 1


@pytest.mark.parametrize("how", ["operator restart", "new token", "token replaced in place"])
def test_an_operator_restart_a_failover_or_a_token_rotation_restarts_nothing(how: str) -> None:
    world = rollout_world(minRestartInterval="0")
    world.sync(5)
    other = TOKEN.replace("Canary", "Other1")
    if how == "new token":
        world.kube.put_secret({"metadata": {"namespace": NS, "name": "other-token"},
                               "data": {"token": b64(other)}})
        world.edit_spec(authSecretRef={"name": "other-token"})
    elif how == "token replaced in place":
        world.kube.edit_secret(NS, "himitsu-token", data={"token": b64(other)})
    world.restart()
    world.poll(fetched(5) if how == "new token" else himitsu.NotModified(5))
    world.restart()
    world.poll(himitsu.NotModified(5))
    assert restarts(world) == []


def test_the_first_sync_restarts_nothing_unless_asked() -> None:
    world = rollout_world(minRestartInterval="0")
    world.sync(5)
    assert restarts(world) == []
    opted = rollout_world(minRestartInterval="0", rolloutRestartOnCreate=True)
    opted.sync(5)
    assert len(restarts(opted)) == 1
    opted.poll(himitsu.NotModified(5))
    assert len(restarts(opted)) == 1


def test_a_workload_named_later_gets_its_record_without_a_restart() -> None:
    world = World(minRestartInterval="0")
    world.kube.add_workload(NS, "Deployment", "web", reads=TARGET)
    world.sync(5)
    world.edit_spec(rolloutRestartTargets=[WEB])
    world.reconcile()  # a spec edit keeping the source: Himitsu is not asked
    assert restarts(world) == [] and record(world) == data_id(world)
    world.poll(fetched(6, changed("b")))
    assert len(restarts(world)) == 1


def test_a_workload_created_after_the_first_sync_is_restarted_for_the_next_change() -> None:
    """The workload did not exist at the first sync (nothing recorded), then its pods
    started with that data: before the next write changes the bytes, it gets its record,
    so the change is owed to it."""
    world = World(rolloutRestartTargets=[WEB], minRestartInterval="0")
    world.sync(5)
    assert "not found" in entry(world)["warning"]
    world.kube.add_workload(NS, "Deployment", "web", reads=TARGET)
    world.poll(himitsu.NotModified(5))
    world.poll(fetched(6, changed("b")))
    assert len(restarts(world)) == 1 and record(world) == data_id(world)


def test_a_change_put_back_within_the_window_is_one_restart_under_a_fresh_id() -> None:
    """Bytes put back get a new id (the record must not confirm a value it held before):
    the change and its undoing are one restart, and no record names the first id again."""
    world = rollout_world()
    world.sync(5)
    first = data_id(world)
    world.clock.advance(60)
    world.reconcile(fetched(6, changed("b")))
    world.clock.advance(3)
    world.annotate(api.ANN_FORCE_SYNC, "back")
    world.reconcile(fetched(7))  # the old bytes again
    assert data_id(world) != first and world.data() == values()
    for _ in range(3):
        world.poll(himitsu.NotModified(7))
    assert len(restarts(world)) == 1 and record(world) == data_id(world) != first


def test_steady_state_costs_no_workload_request() -> None:
    world = rollout_world()
    world.sync(5)
    world.poll(himitsu.NotModified(5))
    world.kube.calls.clear()
    for _ in range(3):
        world.poll(himitsu.NotModified(5))
    assert world.kube.calls["get_workload"] == world.kube.calls["patch_workload"] == 0
    assert world.kube.calls["patch_status"] == 3


def test_a_target_deleted_and_recreated_across_an_operator_restart_costs_one_restart() -> None:
    """The accepted trade: the new process cannot know the new Secret holds the bytes the
    pods have (the id went with the Secret), so it may restart once; never twice."""
    world = rollout_world(minRestartInterval="0")
    world.sync(5)
    world.restart()
    del world.kube.secrets[(NS, TARGET)]
    world.reconcile(fetched(5))
    for _ in range(3):
        world.poll(himitsu.NotModified(5))
    assert len(restarts(world)) <= 1


# --- batching -----------------------------------------------------------------------------


def test_three_changes_within_the_window_are_one_restart_with_the_last_data() -> None:
    world = rollout_world(refreshInterval="2s")
    world.sync(5)
    before = count("coalesced")
    for version, tag in ((6, "b"), (7, "c"), (8, "d")):
        world.clock.advance(2)
        world.reconcile(fetched(version, changed(tag)))
    assert restarts(world) == []
    world.clock.advance(WINDOW)
    world.reconcile(himitsu.NotModified(8))
    assert len(restarts(world)) == 1 and record(world) == data_id(world)
    assert count("coalesced") - before == 2
    for _ in range(10):
        world.clock.advance(2)
        world.reconcile(himitsu.NotModified(8))
    assert len(restarts(world)) == 1


def test_a_change_is_restarted_no_later_than_the_window_after_it_reached_the_secret() -> None:
    world = rollout_world()
    world.sync(5)
    world.clock.advance(60)
    result = world.reconcile(fetched(6, changed("b")))
    written = world.clock.now
    while not restarts(world):
        result = wake(world, result)
    at = api.parse_time(restarts(world)[0])
    assert at is not None and (at - written).total_seconds() <= WINDOW


def test_restarts_of_one_workload_are_a_window_apart() -> None:
    world = rollout_world(refreshInterval="2s")
    world.sync(5)
    for version in range(6, 30):
        world.clock.advance(2)
        world.reconcile(fetched(version, changed(str(version))))
    times = [api.parse_time(at) for at in restarts(world)]
    assert len(times) >= 2
    gaps = [(b - a).total_seconds() for a, b in itertools.pairwise(times) if a and b]
    assert all(gap >= WINDOW for gap in gaps), gaps


def two_holders(window: str = "10s", **spec: Any) -> World:
    """``app-config`` (its ``spec`` fields as given) and ``other`` (target
    ``other-secrets``) both name Deployment web, which reads both targets; both synced
    once."""
    world = rollout_world(minRestartInterval=window, **spec)
    other = make_hsec(rolloutRestartTargets=[WEB], minRestartInterval=window)
    other["metadata"]["name"] = "other"
    other["spec"]["target"]["name"] = "other-secrets"
    world.kube.add_himitsu_secret(other)
    workload(world)["spec"]["template"]["spec"]["containers"][0]["envFrom"].append(
        {"secretRef": {"name": "other-secrets"}})
    world.sync(5)
    _other(world, fetched(5))
    return world


def _other(world: World, *script: Any) -> Result:
    world.fetcher.then(*script)
    result = world.reconciler.reconcile(f"{NS}/other")
    assert not world.fetcher.script
    return result


def test_two_himitsu_secrets_naming_one_workload_coalesce() -> None:
    world = two_holders()
    world.clock.advance(60)
    world.reconcile(fetched(6, changed("b")))
    world.clock.advance(2)
    _other(world, fetched(6, changed("o")))
    world.clock.advance(WINDOW)
    world.reconcile()
    _other(world)
    assert len(restarts(world)) == 1
    assert record_of(workload(world)) == {NAME: data_id(world),
                                          "other": data_id(world, "other-secrets")}
    for name in (NAME, "other"):
        (rec,) = world.kube.status(NS, name)["rolloutRestarts"]
        assert rec["lastRestart"] == restarts(world)[0], name


def test_owed_restarts_of_one_workload_batch_after_an_operator_restart() -> None:
    """Two Secrets rotate at once (VSO #644) and the operator restarts (or the Lease
    moves) inside the window: the next process restarts the workload once, not once per
    HimitsuSecret: the restart records what every HimitsuSecret naming it holds."""
    world = two_holders()
    world.clock.advance(60)
    world.reconcile(fetched(6, changed("b")))
    _other(world, fetched(6, changed("o")))
    assert restarts(world) == []  # both owed, inside the window
    world.restart()
    world.clock.advance(30)
    tick(world)
    world.clock.advance(1)  # the next key off the queue
    tick(world, "other")
    assert len(restarts(world)) == 1, restarts(world)
    for _ in range(3):
        world.clock.advance(WINDOW)
        tick(world)
        tick(world, "other")
    assert len(restarts(world)) == 1, restarts(world)


def test_data_changed_after_the_last_restart_is_still_owed() -> None:
    world = two_holders()
    world.clock.advance(60)
    world.reconcile(fetched(6, changed("b")))
    world.clock.advance(WINDOW)
    world.reconcile()
    assert len(restarts(world)) == 1
    world.clock.advance(1)
    _other(world, fetched(7, changed("o2")))  # other changes after that restart
    for _ in range(3):
        world.clock.advance(WINDOW)
        _other(world)
    assert len(restarts(world)) == 2
    assert record(world, "other") == data_id(world, "other-secrets")


def test_a_window_never_opens_before_the_workload_s_last_restart() -> None:
    """A restart owed that a new process finds is made at once, but never sooner than a
    window after the workload's last restart (its restartedAt, by any process)."""
    world = two_holders()
    world.clock.advance(60)
    world.reconcile(fetched(6, changed("b")))
    world.clock.advance(WINDOW)
    world.reconcile()
    assert len(restarts(world)) == 1
    _other(world, fetched(7, changed("o")))
    world.restart()  # other's change is owed; the new process does not know since when
    for _ in range(8):
        world.clock.advance(2)
        tick(world)
        tick(world, "other")
    times = [api.parse_time(at) for at in restarts(world)]
    assert len(times) == 2
    gaps = [(b - a).total_seconds() for a, b in itertools.pairwise(times) if a and b]
    assert all(gap >= WINDOW for gap in gaps), gaps


# --- a restart owed is never lost, and made once ---------------------------------------


def test_a_refused_patch_is_retried_with_backoff_and_ready_stays_true() -> None:
    world = rollout_world(minRestartInterval="0")
    world.sync(5)
    world.kube.fail_next["patch_workload"] = [
        KubeError("restarting Deployment 'web' failed: 403 Forbidden", status=403)] * 2
    result = world.poll(fetched(6, changed("b")))
    assert restarts(world) == [] and world.ready()["status"] == "True"
    assert "403" in entry(world)["warning"]
    assert "--set rolloutRestarts.enabled=true" in entry(world)["warning"]
    assert any(e.reason == "RolloutRestartFailed" for e in world.kube.events)
    assert result.requeue_after == pytest.approx(1.0)
    result = wake(world, result)
    assert result.requeue_after == pytest.approx(2.0)
    wake(world, result)
    assert len(restarts(world)) == 1 and "warning" not in entry(world)


FORBIDDEN_GET = KubeError(
    "reading Deployment 'web' failed: 403 Forbidden: deployments.apps \"web\" is forbidden: "
    "User \"system:serviceaccount:himitsu-system:himitsu-operator\" cannot get resource "
    "\"deployments\" in API group \"apps\" in the namespace \"apps\"",
    status=403, reason="Forbidden")


def test_an_install_without_restart_rbac_tells_the_owner_how_to_enable_restarts() -> None:
    """The rollout-restart RBAC is granted only when the feature is enabled: a
    HimitsuSecret naming a workload there still syncs, and its status and a Warning Event
    say, once, what to enable (or to remove the target), not a repeated 'failed: failed'."""
    world = rollout_world()
    world.kube.fail_next["get_workload"] = [FORBIDDEN_GET]
    world.sync(5)
    warning = entry(world)["warning"]
    assert warning.count("reading Deployment 'web' failed: 403 Forbidden") == 1, warning
    assert "--set rolloutRestarts.enabled=true" in warning
    assert "deploy/components/rollout-restarts" in warning
    assert "remove Deployment 'web' from rolloutRestartTargets" in warning
    assert world.ready()["status"] == "True"
    (event,) = [e for e in world.kube.events if e.reason == "RolloutRestartFailed"]
    assert event.type == "Warning" and event.message == warning


def test_a_crash_between_the_secret_write_and_the_restart_restarts_once() -> None:
    """SIGKILL right after the Secret write (the window still open, nothing but the
    target and the workload's record left): the next process, or the next leader,
    restarts the workload exactly once, no later than the window after the write."""
    world = rollout_world()
    world.sync(5)
    world.clock.advance(60)
    world.reconcile(fetched(6, changed("b")))
    written = world.clock.now
    world.restart()
    world.clock.advance(1)
    result = world.reconcile()  # deferred to its next poll: the restart is not
    assert len(restarts(world)) == 1, result
    at = api.parse_time(restarts(world)[0])
    assert at is not None and (at - written).total_seconds() <= WINDOW
    world.restart()
    world.poll(himitsu.NotModified(6))
    world.poll(himitsu.NotModified(6))
    assert len(restarts(world)) == 1


def test_a_crash_after_the_secret_write_with_every_status_write_lost_restarts_once() -> None:
    world = rollout_world(minRestartInterval="0")
    world.sync(5)
    world.kube.fail_next["patch_status"] = [KubeError("apiserver gone", status=0)] * 2
    world.kube.fail_next["patch_workload"] = [KubeError("apiserver gone", status=0)]
    world.poll(fetched(6, changed("b")))
    assert world.data() == changed("b") and restarts(world) == []
    world.restart()
    world.clock.advance(1)
    world.reconcile(fetched(6, changed("b")))
    world.poll(himitsu.NotModified(6))
    assert len(restarts(world)) == 1


@pytest.mark.parametrize("operator_restarts", [False, True])
def test_a_restart_whose_answer_was_lost_is_not_made_again(operator_restarts: bool) -> None:
    """The patch reached the apiserver, its answer did not (and the status write after it
    was lost too): asking again, in this process or the next, finds the record current."""
    world = rollout_world(minRestartInterval="0")
    world.sync(5)
    original = world.kube.patch_workload

    def applied_then_lost(*args: Any, **kwargs: Any) -> dict[str, Any]:
        original(*args, **kwargs)
        world.kube.patch_workload = original  # type: ignore[method-assign]
        raise KubeError("connection reset by peer", status=0)

    world.kube.patch_workload = applied_then_lost  # type: ignore[method-assign]
    world.kube.fail_next["patch_status"] = [KubeError("status patch refused", status=500)]
    result = world.poll(fetched(6, changed("b")))
    assert len(restarts(world)) == 1
    if operator_restarts:
        world.restart()
        result = world.poll(himitsu.NotModified(6))
    for _ in range(3):
        world.clock.advance(result.requeue_after or 60)
        result = tick(world)
    assert len(restarts(world)) == 1
    assert "warning" not in entry(world)


def test_a_record_patch_racing_another_writer_is_retried_not_lost() -> None:
    """The workload changed between our read and our patch (another HimitsuSecret's
    record, a kubectl edit): 409, read again, nothing lost or doubled."""
    world = rollout_world(minRestartInterval="0")
    world.sync(5)
    original = world.kube.get_workload

    def edited_meanwhile(namespace: str, kind: str, name: str) -> dict[str, Any] | None:
        seen = original(namespace, kind, name)
        if world.data() == changed("b"):  # the read before the restart
            workload(world)["metadata"]["resourceVersion"] = "edited"
            world.kube.get_workload = original  # type: ignore[method-assign]
        return seen

    world.kube.get_workload = edited_meanwhile  # type: ignore[method-assign]
    result = world.poll(fetched(6, changed("b")))
    assert restarts(world) == [] and "warning" not in entry(world)
    wake(world, result)
    assert len(restarts(world)) == 1 and record(world) == data_id(world)


def test_a_record_removed_while_its_workload_could_not_be_read_still_restarts() -> None:
    """A failure's warning on a workload whose record landed still shows it recorded, so
    a record another tool removed meanwhile is not taken for a workload first named."""
    world = rollout_world()
    world.sync(5)
    world.poll(fetched(6, changed("b")))  # owed, due within the window
    world.kube.fail_next["get_workload"] = [
        KubeError("reading Deployment 'web' failed: 500", status=500)]
    world.clock.advance(WINDOW)
    world.reconcile()
    assert entry(world)["warning"].startswith("restarting Deployment 'web' failed: reading")
    del workload(world)["metadata"]["annotations"][api.ANN_STARTED_WITH]
    world.restart()
    for _ in range(2):
        world.poll(himitsu.NotModified(6))
    assert len(restarts(world)) == 1 and record(world) == data_id(world)


def test_a_failing_himitsu_or_a_missing_token_does_not_hold_back_an_owed_restart() -> None:
    """The data is in the target already: neither a failing Himitsu nor a dead token
    holds the restart back, not even in a process that never fetched."""
    world = rollout_world()
    world.sync(5)
    world.clock.advance(60)
    world.reconcile(fetched(6, changed("b")))
    world.restart()
    world.clock.advance(WINDOW)
    world.annotate(api.ANN_FORCE_SYNC, "1")  # a sync that must ask Himitsu, which fails
    assert world.reconcile(himitsu.ServerError("down")).error == "FetchFailure"
    assert len(restarts(world)) == 1
    world.poll(fetched(7, changed("c")))
    world.restart()
    del world.kube.secrets[(NS, "himitsu-token")]
    world.clock.advance(WINDOW)
    world.annotate(api.ANN_FORCE_SYNC, "2")
    assert world.reconciler.reconcile(KEY).error == "AuthenticationFailure"
    assert len(restarts(world)) == 2


def test_a_hand_edited_target_decides_nothing_while_himitsu_fails() -> None:
    """Only a target holding what the operator wrote tells what the pods would get."""
    world = rollout_world()
    world.sync(5)
    world.restart()
    world.kube.edit_secret(NS, TARGET, data={"KEY_0": "ZWRpdGVk"})
    world.clock.advance(60)
    world.reconcile(himitsu.ServerError("down"))
    assert restarts(world) == []


def test_a_target_lost_while_the_operator_was_down_still_restarts_for_new_data() -> None:
    world = rollout_world(minRestartInterval="0")
    world.sync(5)
    world.restart()
    del world.kube.secrets[(NS, TARGET)]
    world.clock.advance(60)
    world.reconcile(fetched(6, changed("b")))
    world.poll(himitsu.NotModified(6))
    assert len(restarts(world)) == 1


# --- Merge targets: a first sync that changes a Secret the pods read -------------------


def test_a_merge_target_s_first_sync_changes_the_data_its_pods_read_and_restarts() -> None:
    """Not "the first creation of the Secret": the Helm Secret existed, web's pods read
    it, and the first sync adds the Himitsu keys to it, a change those pods never saw."""
    world = merge_web_world()
    world.sync(5)
    assert "KEY_0" in world.data() and "HELM_KEY" in world.data()
    assert record(world) == "-"  # recorded before the write: the pods have Helm's data
    world.clock.advance(WINDOW)
    world.reconcile()
    world.poll(himitsu.NotModified(5))
    assert len(restarts(world)) == 1


def test_a_merge_first_sync_crashed_after_its_write_still_restarts_once() -> None:
    world = merge_web_world()
    world.kube.fail_next["patch_status"] = [KubeError("apiserver gone", status=0)] * 3
    world.reconcile(fetched(5))
    assert "KEY_0" in world.data() and "configVersion" not in world.status()
    world.restart()
    for _ in range(4):
        world.clock.advance(60)
        world.reconcile(fetched(5) if "configVersion" not in world.status()
                        else himitsu.NotModified(5))
    assert len(restarts(world)) == 1


def test_a_merge_first_sync_waits_for_the_workload_s_record_and_then_restarts_once() -> None:
    """The record of what the pods have goes before the write that changes it: a workload
    that cannot be read (a 500) holds the write back, rather than losing the restart."""
    world = merge_web_world()
    world.kube.fail_next["get_workload"] = [
        KubeError("reading Deployment 'web' failed: 500", status=500)]
    result = world.reconcile(fetched(5))
    assert result.error == "WriteFailure" and "KEY_0" not in world.data()
    world.clock.advance(result.requeue_after or 1.0)
    world.sync(5)
    assert "KEY_0" in world.data() and record(world) == "-"
    world.clock.advance(WINDOW)
    world.reconcile()
    world.poll(himitsu.NotModified(5))
    assert len(restarts(world)) == 1


def test_a_merge_first_sync_without_restart_rbac_still_syncs() -> None:
    world = merge_web_world()
    world.kube.fail_next["get_workload"] = [FORBIDDEN_GET] * 2
    world.sync(5)
    assert "KEY_0" in world.data() and world.ready()["status"] == "True"


def test_a_recreated_merge_himitsusecret_does_not_restart_for_data_already_there() -> None:
    world = merge_world(rolloutRestartTargets=[WEB], minRestartInterval="0")
    world.kube.add_workload(NS, "Deployment", "web", reads=TARGET)
    world.reconcile(fetched(5))
    world.poll(himitsu.NotModified(5))
    assert len(restarts(world)) == 1
    world.restart()
    obj = world.kube.himitsu_secrets[(NS, NAME)]
    obj["metadata"]["uid"] = "recreated-uid"
    obj.pop("status", None)
    world.clock.advance(60)
    world.reconcile(fetched(5))
    world.poll(himitsu.NotModified(5))
    assert len(restarts(world)) == 1


# --- consent, and what a restartedAt proves --------------------------------------------


def test_an_unreferencing_workload_is_warned_about_and_never_touched() -> None:
    world = rollout_world(reads="something-else", minRestartInterval="0")
    world.sync(5)
    assert "does not read Secret 'app-secrets'" in entry(world)["warning"]
    warnings = [e for e in world.kube.events if e.reason == "RolloutRestartSkipped"]
    assert len(warnings) == 1
    world.poll(fetched(6, changed("b")))
    assert restarts(world) == [] and world.ready()["status"] == "True"
    assert api.ANN_STARTED_WITH not in (workload(world)["metadata"].get("annotations") or {})
    assert len([e for e in world.kube.events if e.reason == "RolloutRestartSkipped"]) == 1


@pytest.mark.parametrize(("allowed", "restarted"), [
    (NAME, True), ("*", True), (f"other, {NAME}", True), ("other", False), ("", False)])
def test_an_unreferencing_workload_is_restarted_only_with_its_owner_s_consent(
        allowed: str, restarted: bool) -> None:
    world = rollout_world(reads="something-else", minRestartInterval="0")
    workload(world)["metadata"]["annotations"] = {api.ANN_ALLOW_RESTART_BY: allowed}
    world.sync(5)
    world.poll(fetched(6, changed("b")))
    assert len(restarts(world)) == (1 if restarted else 0)
    assert ("warning" in entry(world)) is not restarted
    if not restarted:
        assert f"{api.ANN_ALLOW_RESTART_BY}={NAME}" in entry(world)["warning"]
        assert world.ready()["status"] == "True"


def test_consent_given_later_restarts_on_the_next_change() -> None:
    world = rollout_world(reads=None, minRestartInterval="0")
    world.sync(5)
    world.poll(fetched(6, changed("b")))
    assert restarts(world) == []
    workload(world)["metadata"]["annotations"] = {api.ANN_ALLOW_RESTART_BY: NAME}
    world.poll(fetched(7, changed("c")))
    assert len(restarts(world)) == 1 and "warning" not in entry(world)


def test_a_force_field_restarts_nothing_without_consent() -> None:
    world = rollout_world({**WEB, "force": True}, reads=None, minRestartInterval="0")
    world.sync(5)
    world.poll(fetched(6, changed("b")))
    assert restarts(world) == [] and "does not read" in entry(world)["warning"]


def test_a_missing_workload_and_a_foreign_kind_are_reported_and_the_sync_is_ready() -> None:
    world = rollout_world({"kind": "Deployment", "name": "gone"},
                          {"kind": "CronJob", "name": "nightly"}, minRestartInterval="0")
    world.sync(5)
    assert "not found" in entry(world, "gone")["warning"]
    assert "'CronJob' cannot be restarted" in entry(world, "nightly")["warning"]
    world.poll(fetched(6, changed("b")))
    assert world.kube.restarts == [] and world.ready()["status"] == "True"
    assert {e.reason for e in world.kube.events if e.type == "Warning"} == {
        "RolloutRestartSkipped"}


def test_a_workload_that_does_not_read_a_secret_is_never_restarted_for_it() -> None:
    """``other`` names web, which reads only app-secrets and gives ``other`` no consent:
    app-config's restart records nothing for ``other``, and ``other`` is never reported
    restarted."""
    world = rollout_world()
    other = make_hsec(rolloutRestartTargets=[WEB], minRestartInterval="10s")
    other["metadata"]["name"] = "other"
    other["spec"]["target"]["name"] = "other-secrets"
    world.kube.add_himitsu_secret(other)
    world.sync(5)
    _other(world, fetched(5))
    world.clock.advance(60)
    world.reconcile(fetched(6, changed("b")))
    _other(world, fetched(6, changed("o")))
    world.restart()
    world.clock.advance(WINDOW)
    tick(world)
    tick(world, "other")
    assert len(restarts(world)) == 1 and "other" not in record_of(workload(world))
    (rec,) = world.kube.status(NS, "other")["rolloutRestarts"]
    assert "lastRestart" not in rec and "does not read Secret 'other-secrets'" in rec["warning"]


def test_a_restarted_at_from_a_clock_ahead_does_not_swallow_later_changes() -> None:
    world = rollout_world()
    world.sync(5)
    template = workload(world)["spec"]["template"]
    template["metadata"]["annotations"] = {
        api.ANN_RESTARTED_AT: stamp(world.clock.now.timestamp() + 3600)}
    world.restart()
    world.poll(fetched(6, changed("b")))
    for _ in range(2):
        world.clock.advance(WINDOW)
        world.reconcile()
    assert len(restarts(world)) == 1
    last = api.parse_time(entry(world)["lastRestart"])
    assert last is not None and last <= world.clock.now


# --- the record leaks nothing ------------------------------------------------------------


def test_the_record_and_the_status_hold_nothing_derived_from_the_data() -> None:
    """Whoever may read the workload or the HimitsuSecret, not the Secret, cannot test a
    guess of the data: the id is random, two targets with the same bytes hold different
    ids, and no digest of the data is anywhere but on the Secret."""
    world = two_holders()
    mine, theirs = data_id(world), data_id(world, "other-secrets")
    assert world.target()["data"] == world.kube.secret(NS, "other-secrets")["data"] != {}
    assert mine != theirs
    digest = world.target()["metadata"]["annotations"][api.ANN_DATA_HASH]
    guess = render.data_hash(render.render("KeyValue", values()))
    seen = str(workload(world)) + str(world.status()) + str(world.kube.status(NS, "other"))
    assert digest[:12] not in seen and guess[:12] not in seen


# --- which Secrets a pod template reads ------------------------------------------------


def _pod(**spec: Any) -> dict[str, Any]:
    return {"spec": {"template": {"spec": spec}}}


def test_every_pod_template_reference_counts() -> None:
    found = references.secrets_read(_pod(
        initContainers=[{"env": [{"valueFrom": {"secretKeyRef": {"name": "a"}}}],
                         "volumeMounts": [{"name": "vd", "mountPath": "/d"}]}],
        containers=[{"envFrom": [{"secretRef": {"name": "b"}}, {"configMapRef": {"name": "x"}}],
                     "volumeMounts": [{"name": "vc", "mountPath": "/c"}]}],
        volumes=[{"name": "vc", "secret": {"secretName": "c"}},
                 {"name": "vd", "projected": {"sources": [{"secret": {"name": "d"}}]}}],
        imagePullSecrets=[{"name": "e"}]))
    assert found == {"a", "b", "c", "d"}
    assert references.secrets_read({"spec": None}) == set()


def test_a_secret_volume_no_container_mounts_is_no_reference() -> None:
    pod = _pod(containers=[{"name": "app", "volumeMounts": [{"name": "other", "mountPath": "/o"}]}],
               volumes=[{"name": "unused", "secret": {"secretName": TARGET}},
                        {"name": "unused-too", "projected": {"sources": [
                            {"secret": {"name": TARGET}}]}},
                        {"name": "other", "secret": {"secretName": "mounted"}}])
    assert references.secrets_read(pod) == {"mounted"}
    world = rollout_world(reads=None, minRestartInterval="0")
    workload(world)["spec"] = pod["spec"]
    world.sync(5)
    world.poll(fetched(6, changed("b")))
    assert restarts(world) == [] and "does not read" in entry(world)["warning"]


# --- the spec -------------------------------------------------------------------------------


@pytest.mark.parametrize(("spec", "message"), [
    ({"rolloutRestartTargets": {"kind": "Deployment"}}, "must be a list"),
    ({"rolloutRestartTargets": [{"kind": "Deployment"}]}, "rolloutRestartTargets[0].name is"),
    ({"rolloutRestartTargets": [{"kind": "Deployment", "name": "Web"}]}, "not a valid workload"),
    ({"rolloutRestartTargets": [WEB, WEB]}, "names Deployment 'web' twice"),
    ({"rolloutRestartTargets": [{"kind": "Deployment", "name": f"w{i}"} for i in range(17)]},
     "at most 16"),
    ({"minRestartInterval": "10"}, "minRestartInterval '10' is not a Go duration"),
    ({"minRestartInterval": "25h"}, "longer than 24h"),
    ({"rolloutRestartOnCreate": "true"}, "rolloutRestartOnCreate must be true or false"),
])
def test_bad_rollout_specs_are_invalid_spec(spec: dict[str, Any], message: str) -> None:
    with pytest.raises(api.InvalidSpec) as info:
        api.parse_spec(make_hsec(**spec))
    assert message in str(info.value)


def test_rollout_defaults() -> None:
    rollout = api.parse_spec(make_hsec(rolloutRestartTargets=[WEB])).rollout
    assert rollout == api.Rollout(targets=(api.RolloutTarget("Deployment", "web"),),
                                  on_create=False, min_interval=60.0)


# --- the scheduler on its own, property-based -------------------------------------------------


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


@settings(max_examples=200, deadline=None)
@given(steps=st.lists(st.tuples(st.sampled_from(["change", "poll", "fail", "crash"]),
                                st.sampled_from([0.5, 1.0, 3.0, 7.0, 12.0])), max_size=40))
def test_scheduler_never_restarts_within_a_window_and_never_loses_a_claim(
        steps: list[tuple[str, float]]) -> None:
    """One holder, one workload: restarts are at least a window apart, each one records
    the data it rolls out, and once changes stop the last data is rolled out within a
    window plus the retry backoff, whatever crashes (a new scheduler) came between."""
    kube = FakeKube()
    kube.add_workload(NS, "Deployment", "web", reads=TARGET)
    clock = Clock()
    key = (NS, "Deployment", "web")

    def new() -> Scheduler:
        return Scheduler(kube, now=clock, current=lambda _: {})

    def claim(s: Scheduler, since: float | None) -> bool:
        """Nothing more is owed for the current data."""
        return s.settle(key, Claim(holder=NAME, secret=TARGET, data_id=f"d{version}",
                                   since=since, window=WINDOW, baseline="d0")).wake is None

    scheduler, version, since = new(), 0, None
    for what, dt in steps:
        clock.t += dt
        if what == "change":
            version, since = version + 1, clock.t
        elif what == "fail":
            kube.fail_next["patch_workload"] = [KubeError("refused", status=500)]
        elif what == "crash":
            scheduler, since = new(), None
        claim(scheduler, since)
    stamps = [t.timestamp() for *_, at in kube.restarts if (t := api.parse_time(at))]
    assert all(b - a >= WINDOW for a, b in itertools.pairwise(stamps))
    assert len(stamps) <= version
    kube.fail_next.clear()
    for _ in range(4):
        if record_of(kube.workloads[key]).get(NAME) == f"d{version}":
            break
        claim(scheduler, since)
        clock.t += max(WINDOW, RETRY_CAP)
    assert record_of(kube.workloads[key]).get(NAME) == f"d{version}"
    assert claim(scheduler, since)


def test_a_workload_refusing_its_record_does_not_hold_the_secret_write_back() -> None:
    """A lasting refusal (annotations past 256 KiB, an admission policy's 422) is not
    waited for: the Secret is written and the workload restarts nothing for it."""
    world = merge_web_world()
    world.kube.fail_next["patch_workload"] = [
        KubeError("restarting Deployment 'web' failed: 422 Invalid", status=422)] * 50
    for _ in range(5):
        result = world.reconcile(fetched(5))
        if "KEY_0" in world.data():
            break
        world.clock.advance(result.requeue_after or 1.0)
    assert "KEY_0" in world.data(), (result.error, world.ready())
