"""Rollout restarts (issue 16): a workload is restarted when, and only when, the data its
pods could have seen differs from what the target holds; batched per workload and
coalesced across HimitsuSecrets; a restart owed survives failures and restarts.

Everything runs on the reconcile world's simulated clock: the only way time passes is
``world.clock.advance``, and the reconciler's Result says when it wants to be woken.
"""

from __future__ import annotations

import hashlib
import hmac
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
from himitsu_controller.sync import references, rollout
from himitsu_controller.sync.ports import KubeError
from himitsu_controller.sync.restarter import (
    MAX_SERVED,
    RETRY_CAP,
    Claim,
    Restarter,
    restarted_at,
)
from himitsu_controller.sync.target import render

WINDOW = 10.0
WEB = {"kind": "Deployment", "name": "web"}


def rollout_world(*targets: dict[str, Any], reads: str | None = TARGET, **spec: Any) -> World:
    spec.setdefault("minRestartInterval", "10s")
    world = World(rolloutRestartTargets=list(targets or [WEB]), **spec)
    world.kube.add_workload(NS, "Deployment", "web", reads=reads)
    return world


def restarts(world: World) -> list[str]:
    return [at for _, _, name, at in world.kube.restarts if name == "web"]


def entry(world: World, name: str = "web") -> dict[str, Any]:
    (found,) = [e for e in world.status().get("rolloutRestarts") or [] if e["name"] == name]
    assert isinstance(found, dict)
    return found


def wake(world: World, result: Result) -> Result:
    """Let the time the reconcile asked for pass, and reconcile (no poll may be due)."""
    assert result.requeue_after is not None
    world.clock.advance(result.requeue_after)
    return world.reconcile()


def count(result: str) -> float:
    value = metrics.rollout_restarts.labels(result=result)._value.get()
    return float(value)


def changed(tag: str) -> dict[str, str]:
    return values(tag=tag)


# --- when to restart, and when not --------------------------------------------------------


def test_a_data_change_restarts_once_after_the_window_and_never_on_a_304() -> None:
    world = rollout_world()
    world.sync(5)
    assert restarts(world) == [] and "pendingSince" not in entry(world)
    world.poll(himitsu.NotModified(5))
    assert restarts(world) == []
    result = world.poll(fetched(6, changed("b")))
    assert restarts(world) == [] and entry(world)["pendingSince"]
    assert result.requeue_after is not None and result.requeue_after <= WINDOW
    result = wake(world, result)
    assert len(restarts(world)) == 1
    assert "pendingSince" not in entry(world) and entry(world)["lastRestart"]
    assert world.ready()["status"] == "True"
    assert any(e.reason == "RolloutRestarted" for e in world.kube.events)
    for _ in range(5):
        result = world.poll(himitsu.NotModified(6))
    assert len(restarts(world)) == 1


def test_the_restart_is_an_rfc3339_template_annotation() -> None:
    world = rollout_world(minRestartInterval="0")
    world.sync(5)
    world.poll(fetched(6, changed("b")))
    (at,) = restarts(world)
    assert api.parse_time(at) == world.clock.now
    template = world.kube.workloads[(NS, "Deployment", "web")]["spec"]["template"]
    assert template["metadata"]["annotations"][api.ANN_RESTARTED_AT] == at


@pytest.mark.parametrize("how", ["version bump, same bytes", "repair", "force-sync"])
def test_nothing_changed_in_the_bytes_restarts_nothing(how: str) -> None:
    world = rollout_world(minRestartInterval="0")
    world.sync(5)
    if how == "version bump, same bytes":
        world.poll(fetched(9))
    elif how == "repair":
        del world.kube.secrets[(NS, TARGET)]
        world.reconcile(fetched(5))
        assert world.data() == values()
    else:
        world.annotate(api.ANN_FORCE_SYNC, "1")
        world.reconcile(fetched(5))
    world.poll(himitsu.NotModified(world.status()["configVersion"]))
    assert restarts(world) == []
    assert world.kube.writes() >= 1


def test_a_repair_after_an_operator_restart_restarts_nothing() -> None:
    world = rollout_world(minRestartInterval="0")
    world.sync(5)
    world.restart()
    del world.kube.secrets[(NS, TARGET)]
    world.reconcile(fetched(5))
    assert restarts(world) == []


def test_a_hand_edit_repaired_restarts_nothing() -> None:
    world = rollout_world(minRestartInterval="0")
    world.sync(5)
    world.kube.edit_secret(NS, TARGET, data={"KEY_0": "ZWRpdGVk"})
    world.reconcile(fetched(5))
    assert world.data() == values() and restarts(world) == []


def test_the_first_sync_restarts_nothing_unless_asked() -> None:
    world = rollout_world(minRestartInterval="0")
    world.sync(5)
    assert restarts(world) == []
    opted = rollout_world(minRestartInterval="0", rolloutRestartOnCreate=True)
    opted.sync(5)
    assert len(restarts(opted)) == 1
    opted.poll(himitsu.NotModified(5))
    assert len(restarts(opted)) == 1


def test_a_target_added_later_takes_the_data_as_its_pods_have_it() -> None:
    world = World(minRestartInterval="0")
    world.kube.add_workload(NS, "Deployment", "web", reads=TARGET)
    world.sync(5)
    world.edit_spec(rolloutRestartTargets=[WEB])
    world.reconcile(fetched(5))
    assert restarts(world) == [] and entry(world)["dataMac"]


def test_a_change_put_back_within_the_window_owes_nothing() -> None:
    world = rollout_world()
    world.sync(5)
    world.clock.advance(60)
    world.reconcile(fetched(6, changed("b")))
    world.clock.advance(3)
    world.annotate(api.ANN_FORCE_SYNC, "back")
    result = world.reconcile(fetched(7))  # the old bytes again
    assert "pendingSince" not in entry(world)
    assert world.reconciler._rollouts.restarter.pending() == 0  # no claim left to fire
    world.clock.advance(WINDOW)
    world.poll(himitsu.NotModified(7))
    assert restarts(world) == [], result


def test_steady_state_costs_no_workload_request() -> None:
    world = rollout_world()
    world.sync(5)
    world.poll(himitsu.NotModified(5))
    world.kube.calls.clear()
    for _ in range(3):
        world.poll(himitsu.NotModified(5))
    assert world.kube.calls["get_workload"] == world.kube.calls["restart_workload"] == 0
    assert world.kube.calls["patch_status"] == 3


# --- batching and coalescing ----------------------------------------------------------------


def test_three_changes_within_the_window_are_one_restart() -> None:
    world = rollout_world(refreshInterval="2s")
    world.sync(5)
    before = count("coalesced")
    for version, tag in ((6, "b"), (7, "c"), (8, "d")):
        world.clock.advance(2)
        world.reconcile(fetched(version, changed(tag)))
    assert restarts(world) == []
    world.clock.advance(WINDOW)
    world.reconcile(himitsu.NotModified(8))
    assert len(restarts(world)) == 1
    assert count("coalesced") - before == 2
    for _ in range(10):
        world.clock.advance(2)
        world.reconcile(himitsu.NotModified(8))
    assert len(restarts(world)) == 1


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


def two_holders(window: str = "10s", other_window: str | None = None) -> World:
    """``app-config`` and ``other`` (target ``other-secrets``) both name Deployment web,
    which reads both targets; both synced once."""
    world = rollout_world(minRestartInterval=window)
    other = make_hsec(rolloutRestartTargets=[WEB], minRestartInterval=other_window or window)
    other["metadata"]["name"] = "other"
    other["spec"]["target"]["name"] = "other-secrets"
    world.kube.add_himitsu_secret(other)
    workload = world.kube.workloads[(NS, "Deployment", "web")]
    workload["spec"]["template"]["spec"]["containers"][0]["envFrom"].append(
        {"secretRef": {"name": "other-secrets"}})
    world.sync(5)
    world.fetcher.then(fetched(5))
    world.reconciler.reconcile(f"{NS}/other")
    return world


def test_two_himitsu_secrets_naming_one_workload_coalesce() -> None:
    world = two_holders()
    world.clock.advance(60)
    world.reconcile(fetched(6, changed("b")))
    world.clock.advance(2)
    world.fetcher.then(fetched(6, changed("o")))
    world.reconciler.reconcile(f"{NS}/other")
    world.clock.advance(WINDOW)
    world.reconcile()
    world.reconciler.reconcile(f"{NS}/other")
    assert len(restarts(world)) == 1
    for name in (NAME, "other"):
        status = world.kube.status(NS, name)
        (rec,) = status["rolloutRestarts"]
        assert "pendingSince" not in rec and rec["lastRestart"], name


def test_owed_restarts_of_one_workload_batch_after_an_operator_restart() -> None:
    """Two Secrets rotate at once (VSO #644) and the operator restarts (or the Lease
    moves) inside the window: the next process restarts the workload once, not once per
    HimitsuSecret (each claim is due already when its reconcile makes it)."""
    world = two_holders()
    world.clock.advance(60)
    world.reconcile(fetched(6, changed("b")))
    world.fetcher.then(fetched(6, changed("o")))
    world.reconciler.reconcile(f"{NS}/other")
    assert restarts(world) == []  # both owed, inside the window
    world.restart()
    world.clock.advance(30)
    world.reconcile()  # no poll due: the targets hold version 6, nothing is asked
    world.clock.advance(1)  # the next key off the queue
    world.reconciler.reconcile(f"{NS}/other")
    assert len(restarts(world)) == 1, restarts(world)
    for name in (NAME, "other"):
        (rec,) = world.kube.status(NS, name)["rolloutRestarts"]
        assert "pendingSince" not in rec and rec["lastRestart"], name


def test_data_changed_after_the_last_restart_is_still_owed_after_an_operator_restart() -> None:
    """The other side of the rule above: a claim is served by an earlier restart only
    when its data was in the target before that restart."""
    world = two_holders()
    world.clock.advance(60)
    world.fetcher.then(fetched(6, changed("o")))
    world.reconciler.reconcile(f"{NS}/other")  # other owes a restart
    world.restart()
    world.clock.advance(20)
    world.reconcile(fetched(6, changed("b")))  # app-config's change, its window open
    world.clock.advance(10)
    world.reconcile()  # app-config's claim due: other's not claimed yet
    assert len(restarts(world)) == 1
    world.clock.advance(30)  # other's poll, due a minute after its answer:
    world.fetcher.then(fetched(7, changed("o2")))  # it changed again after the restart
    world.reconciler.reconcile(f"{NS}/other")
    world.clock.advance(WINDOW)
    world.fetcher.then(himitsu.NotModified(7))
    world.reconciler.reconcile(f"{NS}/other")
    assert len(restarts(world)) == 2


def test_a_window_never_opens_before_the_workload_s_last_restart() -> None:
    """A claim made before an operator restart does not cut the next window short: the
    restart after the one just made is a window after it."""
    world = two_holders()
    world.clock.advance(60)
    world.fetcher.then(fetched(6, changed("o")))
    world.reconciler.reconcile(f"{NS}/other")
    world.restart()
    world.clock.advance(5)
    world.reconcile(fetched(6, changed("b")))
    world.clock.advance(WINDOW)
    world.reconcile()
    world.clock.advance(1)
    world.fetcher.then(fetched(7, changed("o2")))  # other's claim is old, its data new
    world.reconciler.reconcile(f"{NS}/other")
    world.clock.advance(WINDOW / 2)
    world.fetcher.then(himitsu.NotModified(7))
    world.reconciler.reconcile(f"{NS}/other")
    times = [api.parse_time(at) for at in restarts(world)]
    gaps = [(b - a).total_seconds() for a, b in itertools.pairwise(times) if a and b]
    assert all(gap >= WINDOW for gap in gaps), gaps


# --- a restart owed is never lost -------------------------------------------------------------


def test_a_refused_patch_is_retried_with_backoff_and_ready_stays_true() -> None:
    world = rollout_world(minRestartInterval="0")
    world.sync(5)
    world.kube.fail_next["restart_workload"] = [
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


def test_a_restart_owed_survives_an_operator_restart() -> None:
    world = rollout_world()
    world.sync(5)
    world.poll(fetched(6, changed("b")))
    world.restart()  # all memory gone; the claim is in status
    world.clock.advance(WINDOW)
    result = world.reconcile()  # not deferred to the next poll (no poll due: nothing asked)
    assert len(restarts(world)) == 1, result
    world.restart()
    world.poll(himitsu.NotModified(6))
    assert len(restarts(world)) == 1


def test_a_change_written_just_before_a_crash_still_restarts() -> None:
    """The Secret was written, the status patch never made it: the record still holds
    the old data, so the next process owes the restart."""
    world = rollout_world(minRestartInterval="0")
    world.sync(5)
    world.kube.fail_next["patch_status"] = [KubeError("apiserver gone", status=0)] * 2
    world.poll(fetched(6, changed("b")))
    assert world.data() == changed("b")
    world.restart()
    world.clock.advance(1)
    world.reconcile(fetched(6, changed("b")))
    assert len(restarts(world)) == 1


@pytest.mark.parametrize("operator_restarts", [False, True])
def test_a_status_write_lost_after_a_restart_does_not_restart_again(
        operator_restarts: bool) -> None:
    """The restart was made, the status saying so was not written: asking again (this
    process, or the next one after a crash) restarts nothing more."""
    world = rollout_world(minRestartInterval="0")
    world.sync(5)
    calls = world.kube.calls
    original = world.kube.patch_status

    def refuse_after_a_restart(namespace: str, name: str, status: dict[str, Any], *,
                               uid: str = "") -> None:
        if calls["restart_workload"] == 1 and not calls["refused"]:
            calls["refused"] += 1
            raise KubeError("status patch refused", status=500)
        original(namespace, name, status, uid=uid)

    world.kube.patch_status = refuse_after_a_restart  # type: ignore[method-assign]
    result = world.poll(fetched(6, changed("b")))
    assert len(restarts(world)) == 1
    if operator_restarts:  # the record is on the Deployment, written with the restart
        world.restart()
        result = world.poll(himitsu.NotModified(6))
    for _ in range(3):
        result = wake(world, result) if result.requeue_after and result.requeue_after < 30 \
            else world.poll(himitsu.NotModified(6))
    assert len(restarts(world)) == 1
    assert "pendingSince" not in entry(world)


def _as_an_older_version_wrote_it(world: World, pods_have: str) -> None:
    """Status and target as the version before the salt left them: the record keyed by
    the token (``keyId``), no salt on the target; ``pods_have``: that data's digest."""
    key = rollout.legacy_key(TOKEN)
    for rec in world.kube.himitsu_secrets[(NS, NAME)]["status"]["rolloutRestarts"]:
        for name in ("saltId", "pendingMac", "changedAt", "dataVersion", "dataSource"):
            rec.pop(name, None)
        rec["keyId"] = hashlib.sha256(key).hexdigest()[:12]
        rec["dataMac"] = hmac.new(key, pods_have.encode(), hashlib.sha256).hexdigest()[:32]
    ann = world.kube.secrets[(NS, TARGET)]["metadata"]["annotations"]
    for stamp in (api.ANN_ROLLOUT_SALT, api.ANN_DATA_CHANGED_AT):
        ann.pop(stamp, None)


@pytest.mark.parametrize("owed", [False, True])
def test_a_record_an_older_version_wrote_decides_as_it_would(owed: bool) -> None:
    """Upgrade: a record keyed by the token is checked with the token and carried over
    under the target's new salt: no restart for data the pods have, and an owed one kept."""
    world = rollout_world()
    world.sync(5)
    pods_have = world.target()["metadata"]["annotations"][api.ANN_DATA_HASH]
    now = fetched(5)
    if owed:
        now = fetched(6, changed("b"))
        world.poll(now)
    _as_an_older_version_wrote_it(world, pods_have)
    world.restart()
    world.clock.advance(WINDOW)
    world.reconcile(now)  # no salt on the target yet: one full sync stamps one
    result = world.poll(himitsu.NotModified(now.version))
    if result.requeue_after is not None and result.requeue_after <= WINDOW:
        wake(world, result)
    assert len(restarts(world)) == (1 if owed else 0)
    assert "keyId" not in entry(world) and "pendingSince" not in entry(world)
    world.poll(himitsu.NotModified(now.version))
    assert len(restarts(world)) == (1 if owed else 0)


def test_the_status_does_not_tell_which_himitsu_secrets_share_a_token() -> None:
    world = two_holders()
    mine, theirs = (world.kube.status(NS, n)["rolloutRestarts"][0] for n in (NAME, "other"))
    assert "keyId" not in mine and "keyId" not in theirs
    assert mine["saltId"] != theirs["saltId"]


def test_a_failing_himitsu_does_not_hold_back_an_owed_restart() -> None:
    world = rollout_world()
    world.sync(5)
    world.poll(fetched(6, changed("b")))
    world.clock.advance(WINDOW)
    world.annotate(api.ANN_FORCE_SYNC, "1")  # a sync that must ask Himitsu, which fails
    result = world.reconcile(himitsu.ServerError("down"))
    assert result.error == "FetchFailure"
    assert len(restarts(world)) == 1


def test_an_owed_restart_is_not_held_back_by_himitsu_after_an_operator_restart() -> None:
    """The data is in the target already: a failing Himitsu (or a dead token) does not
    hold the restart back, not even in a process that never fetched."""
    world = rollout_world()
    world.sync(5)
    world.clock.advance(60)
    world.reconcile(fetched(6, changed("b")))
    world.restart()
    for _ in range(5):
        world.clock.advance(60)
        world.reconcile(himitsu.ServerError("down"))
    assert len(restarts(world)) == 1
    assert "pendingSince" not in entry(world)


def test_an_owed_restart_is_not_held_back_by_a_missing_token() -> None:
    world = rollout_world()
    world.sync(5)
    world.clock.advance(60)
    world.reconcile(fetched(6, changed("b")))
    world.restart()
    del world.kube.secrets[(NS, "himitsu-token")]
    world.clock.advance(WINDOW)
    result = world.reconciler.reconcile(KEY)
    assert result.error == "AuthenticationFailure"
    assert len(restarts(world)) == 1


def test_a_hand_edited_target_decides_nothing_while_himitsu_fails() -> None:
    """Only a target holding what the operator wrote tells what the pods would get."""
    world = rollout_world()
    world.sync(5)
    world.restart()
    world.kube.edit_secret(NS, TARGET, data={"KEY_0": "ZWRpdGVk"})
    world.clock.advance(60)
    world.reconcile(himitsu.ServerError("down"))
    assert restarts(world) == [] and "pendingSince" not in entry(world)


# --- safety -------------------------------------------------------------------------------------


def test_an_unreferencing_workload_is_warned_about_and_not_restarted() -> None:
    world = rollout_world(reads="something-else", minRestartInterval="0")
    world.sync(5)
    assert "does not read Secret 'app-secrets'" in entry(world)["warning"]
    warnings = [e for e in world.kube.events if e.reason == "RolloutRestartSkipped"]
    assert len(warnings) == 1
    world.poll(fetched(6, changed("b")))
    assert restarts(world) == [] and world.ready()["status"] == "True"
    assert len([e for e in world.kube.events if e.reason == "RolloutRestartSkipped"]) == 1


@pytest.mark.parametrize(("allowed", "restarted"), [
    (NAME, True), ("*", True), (f"other, {NAME}", True), ("other", False), ("", False)])
def test_an_unreferencing_workload_is_restarted_only_with_its_owner_s_consent(
        allowed: str, restarted: bool) -> None:
    """Naming a workload is not enough to restart one that does not read the Secret
    (whoever may create a HimitsuSecret would restart anything): its owner must allow
    it, on the workload."""
    world = rollout_world(reads="something-else", minRestartInterval="0")
    workload = world.kube.workloads[(NS, "Deployment", "web")]
    workload["metadata"]["annotations"] = {api.ANN_ALLOW_RESTART_BY: allowed}
    world.sync(5)
    world.poll(fetched(6, changed("b")))
    assert len(restarts(world)) == (1 if restarted else 0)
    assert ("warning" in entry(world)) is not restarted
    if not restarted:
        assert f"{api.ANN_ALLOW_RESTART_BY}={NAME}" in entry(world)["warning"]
        assert any(e.reason == "RolloutRestartSkipped" for e in world.kube.events)
        assert world.ready()["status"] == "True"


def test_a_force_field_restarts_nothing_without_consent() -> None:
    """``force`` is gone: an object still carrying it (stored before the schema changed)
    restarts an unreferencing workload no more than one without it."""
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


@pytest.mark.parametrize("operator_restarts", [False, True])
def test_a_new_token_keeps_the_record(operator_restarts: bool) -> None:
    """A token replaced while the data changes, in this process or across an operator
    restart: the record is keyed by the target's salt, not the token, so the change
    restarts once, and the token alone never restarts anything."""
    world = rollout_world(minRestartInterval="0")
    world.sync(5)
    world.kube.put_secret({"metadata": {"namespace": NS, "name": "other-token"},
                           "data": {"token": b64(TOKEN.replace("Canary", "Other1"))}})
    if operator_restarts:
        world.restart()
    world.edit_spec(authSecretRef={"name": "other-token"})
    world.reconcile(fetched(6, changed("b")))
    assert len(restarts(world)) == 1
    world.poll(himitsu.NotModified(6))
    assert len(restarts(world)) == 1


def test_a_token_replaced_in_place_across_an_operator_restart_does_not_lose_the_restart() -> None:
    """Token rotated (its Secret's value replaced), operator restarted, value changed: the
    pods have the old value, so the workload restarts."""
    world = rollout_world(minRestartInterval="0")
    world.sync(5)
    world.kube.put_secret({"metadata": {"namespace": NS, "name": "himitsu-token"},
                           "data": {"token": b64(TOKEN.replace("Canary", "Other1"))}})
    world.restart()
    world.poll(fetched(6, changed("b")))
    world.poll(himitsu.NotModified(6))
    assert world.data() == changed("b")
    assert len(restarts(world)) == 1


def test_a_target_recreated_across_an_operator_restart_restarts_nothing() -> None:
    """Its salt is gone with it: the record (under the old salt) is taken as matching."""
    world = rollout_world(minRestartInterval="0")
    world.sync(5)
    salt = world.target()["metadata"]["annotations"][api.ANN_ROLLOUT_SALT]
    world.restart()
    del world.kube.secrets[(NS, TARGET)]
    world.reconcile(fetched(5))
    assert world.target()["metadata"]["annotations"][api.ANN_ROLLOUT_SALT] != salt
    world.poll(himitsu.NotModified(5))
    assert restarts(world) == []


# --- who chooses the salt, and when it cannot be trusted ------------------------------


def test_a_salt_chosen_by_someone_who_cannot_read_the_secret_is_not_used() -> None:
    """A user who may create Secrets (not read them) and read HimitsuSecrets creates the
    target first, with the operator's public stamps and a salt of their choosing: adopted
    as the Owner target, its salt must not key the status MACs (they could test guesses
    of the values offline against them). Its owner consents to a Merge (an Owner
    HimitsuSecret never adopts it): the operator's first write stamps its own salt."""
    world = rollout_world(policy="Merge")
    world.kube.put_secret({
        "metadata": {"namespace": NS, "name": TARGET,
                     "labels": {api.LABEL_MANAGED: "true",
                                api.LABEL_MANAGED_BY: api.MANAGED_BY_VALUE},
                     "annotations": {api.ANN_OWNED_BY: NAME, api.ANN_ALLOW_MERGE_BY: NAME,
                                     api.ANN_ROLLOUT_SALT: "chosen-by-the-user"}},
        "type": "Opaque", "data": {}})
    world.sync(5)
    assert world.data() == values()  # written: the Secret consents to the Merge
    assert world.target()["metadata"]["annotations"][api.ANN_ROLLOUT_SALT] \
        != "chosen-by-the-user"
    guess = render.data_hash(render.render("KeyValue", values()))
    forged = rollout._mac("chosen-by-the-user", guess)
    assert forged not in str(world.status()), entry(world)


def test_a_salt_rewritten_on_the_target_does_not_swallow_the_restart_of_a_change() -> None:
    """Whoever may patch the target (a Merge target's foreign owner, a GitOps tool), but
    not the Deployment, rewrites himitsu.io/rollout-salt between two polls; the next poll
    brings new data the pods do not have: the restart is owed, and our salt put back."""
    world = rollout_world()
    world.sync(5)
    world.poll(himitsu.NotModified(5))
    ann = world.target()["metadata"]["annotations"]
    ours = ann[api.ANN_ROLLOUT_SALT]
    world.kube.edit_secret(NS, TARGET, metadata={
        **world.target()["metadata"], "annotations": {**ann, api.ANN_ROLLOUT_SALT: "forged"}})
    world.poll(fetched(6, changed("b")))  # the wake of the edit finds Himitsu changed
    assert world.data() == changed("b")
    assert world.target()["metadata"]["annotations"][api.ANN_ROLLOUT_SALT] == ours
    world.clock.advance(WINDOW)
    world.reconcile()  # the window closed: no poll due yet
    world.poll(himitsu.NotModified(6))
    assert len(restarts(world)) == 1, entry(world)


def test_a_target_lost_while_the_operator_was_down_still_restarts_for_new_data() -> None:
    """The target is deleted (a GitOps prune, a namespace restore) while no operator
    process runs, and Himitsu changed meanwhile: the recreated Secret holds data the pods
    never had (another config version than theirs), so its sync restarts them."""
    world = rollout_world(minRestartInterval="0")
    world.sync(5)
    world.restart()
    del world.kube.secrets[(NS, TARGET)]
    world.clock.advance(60)
    world.reconcile(fetched(6, changed("b")))
    assert world.data() == changed("b")
    world.poll(himitsu.NotModified(6))
    assert len(restarts(world)) == 1, entry(world)


def test_a_merge_target_s_first_sync_changes_the_data_its_pods_read_and_restarts() -> None:
    """Issue 16: no restart "on the first creation of the Secret unless the user opts in".
    A Merge target is not created: the Helm Secret existed, web's pods read it, and the
    first sync adds the Himitsu keys to it, a change those pods never saw."""
    world = merge_world(rolloutRestartTargets=[WEB], minRestartInterval="10s")
    world.kube.add_workload(NS, "Deployment", "web", reads=TARGET)
    world.sync(5)
    assert "KEY_0" in world.data() and "HELM_KEY" in world.data()
    world.clock.advance(WINDOW)
    world.reconcile()
    world.poll(himitsu.NotModified(5))
    assert len(restarts(world)) == 1, entry(world)


# --- a crash between the target's write and the status write ---------------------------


def _lose_status_writes(world: World, n: int = 3) -> None:
    """The next ``n`` status patches never reach the apiserver (the operator dies)."""
    world.kube.fail_next["patch_status"] = [KubeError("apiserver gone", status=0)] * n


def _other(world: World, *script: Any) -> None:
    world.fetcher.then(*script)
    world.reconciler.reconcile(f"{NS}/other")
    assert not world.fetcher.script


def test_a_change_written_just_before_a_crash_is_restarted_while_himitsu_is_down() -> None:
    """The Secret got the new data, the status patches were lost (crash), and the next
    process finds Himitsu down: the target (as the operator wrote it, its data-hash its
    data's, at a config version the status has not recorded) says what the pods must get."""
    world = rollout_world()
    world.sync(5)
    _lose_status_writes(world)
    world.poll(fetched(6, changed("b")))
    assert world.data() == changed("b") and world.status()["configVersion"] == 5
    world.restart()
    for _ in range(5):
        world.clock.advance(60)
        world.reconcile(himitsu.ServerError("down"))
    assert world.data() == changed("b")
    assert len(restarts(world)) == 1, world.status().get("rolloutRestarts")


def test_two_changes_before_a_crash_are_one_restart_even_if_one_status_was_lost() -> None:
    """Both Secrets rotate within the window (VSO #644); other's status patch is lost in
    the crash. The next process restarts web for app-config after the window: its pods
    read both new Secrets already (other's write stamped when its data changed), so
    other's change is not restarted a second time."""
    world = two_holders()
    world.clock.advance(60)
    world.reconcile(fetched(6, changed("b")))
    _lose_status_writes(world)
    _other(world, fetched(6, changed("o")))
    assert world.kube.status(NS, "other")["configVersion"] == 5
    world.restart()
    world.clock.advance(WINDOW)
    world.reconcile()  # no poll due: the target holds version 6, nothing is asked
    assert len(restarts(world)) == 1
    world.clock.advance(1)
    _other(world, fetched(6, changed("o")))  # a full fetch: its status says version 5
    for _ in range(3):
        world.clock.advance(WINDOW)
        _other(world)
    assert len(restarts(world)) == 1, restarts(world)


def test_an_upgrade_with_two_owed_claims_on_one_workload_restarts_it_once() -> None:
    """Two HimitsuSecrets owe web a restart when the operator is upgraded from the version
    without the salt (records keyed by the token: keyId, no pendingMac/changedAt). The
    restart for the first serves the second, whose change was in its Secret long before
    (since its pendingSince)."""
    world = two_holders()
    had = {n: world.kube.secret(NS, t)["metadata"]["annotations"][api.ANN_DATA_HASH]
           for n, t in ((NAME, TARGET), ("other", "other-secrets"))}
    world.clock.advance(60)
    world.reconcile(fetched(6, changed("b")))
    _other(world, fetched(6, changed("o")))
    key = rollout.legacy_key(TOKEN)
    for name, target in ((NAME, TARGET), ("other", "other-secrets")):
        for rec in world.kube.himitsu_secrets[(NS, name)]["status"]["rolloutRestarts"]:
            for field in ("saltId", "pendingMac", "changedAt", "dataVersion", "dataSource"):
                rec.pop(field, None)
            rec["keyId"] = hashlib.sha256(key).hexdigest()[:12]
            rec["dataMac"] = hmac.new(key, had[name].encode(), hashlib.sha256).hexdigest()[:32]
        ann = world.kube.secrets[(NS, target)]["metadata"]["annotations"]
        for stamp in (api.ANN_ROLLOUT_SALT, api.ANN_DATA_CHANGED_AT):
            del ann[stamp]
    world.restart()
    world.clock.advance(WINDOW)
    world.reconcile(fetched(6, changed("b")))  # no salt yet: a full fetch stamps one
    world.clock.advance(1)
    _other(world, fetched(6, changed("o")))
    assert len(restarts(world)) == 1
    for _ in range(3):
        world.clock.advance(WINDOW)
        _other(world)
        world.reconcile()
    assert len(restarts(world)) == 1, restarts(world)


# --- what a workload's restartedAt proves, and consent ---------------------------------


def test_a_restarted_at_from_a_clock_ahead_does_not_swallow_later_changes() -> None:
    """The last leader's clock was an hour ahead (the docs allow 1 s), or the workload's
    owner put a future himitsu.io/restartedAt in the template: it proves nothing, so a
    change made meanwhile is still restarted, and no restart is reported in the future."""
    world = rollout_world()
    world.sync(5)
    template = world.kube.workloads[(NS, "Deployment", "web")]["spec"]["template"]
    template["metadata"]["annotations"] = {
        api.ANN_RESTARTED_AT: restarted_at(world.clock.now.timestamp() + 3600)}
    world.restart()
    world.poll(fetched(6, changed("b")))
    for _ in range(5):
        world.clock.advance(WINDOW)
        world.reconcile()
    world.poll(himitsu.NotModified(6))
    assert len(restarts(world)) == 1, entry(world)
    last = api.parse_time(entry(world)["lastRestart"])
    assert last is not None and last <= world.clock.now


def test_a_workload_that_does_not_read_a_secret_is_never_reported_restarted_for_it() -> None:
    """HimitsuSecret ``other`` names Deployment web, which reads only app-secrets and
    gives ``other`` no consent. After an operator restart app-config's owed restart is
    made first; other's claim is not taken as served by it: no lastRestart, no
    RolloutRestarted Event for other-secrets, and the "does not read" warning stays."""
    world = rollout_world()  # web reads app-secrets only
    other = make_hsec(rolloutRestartTargets=[WEB], minRestartInterval="10s")
    other["metadata"]["name"] = "other"
    other["spec"]["target"]["name"] = "other-secrets"
    world.kube.add_himitsu_secret(other)
    world.sync(5)
    _other(world, fetched(5))

    def other_entry() -> dict[str, Any]:
        (rec,) = world.kube.status(NS, "other")["rolloutRestarts"]
        assert isinstance(rec, dict)
        return rec

    assert "does not read Secret 'other-secrets'" in other_entry()["warning"]
    world.clock.advance(60)
    world.reconcile(fetched(6, changed("b")))
    _other(world, fetched(6, changed("o")))
    world.restart()
    world.clock.advance(WINDOW)
    world.reconcile()  # no poll due: nothing is asked
    assert len(restarts(world)) == 1
    world.clock.advance(2)
    _other(world)
    assert "lastRestart" not in other_entry(), other_entry()
    assert "does not read Secret 'other-secrets'" in other_entry().get("warning", "")
    assert not [e for e in world.kube.events if e.reason == "RolloutRestarted"
                and "other-secrets" in e.message]


def test_status_holds_no_digest_of_the_data() -> None:
    """A plain data hash in status would let HimitsuSecret readers confirm guesses."""
    world = rollout_world()
    world.sync(5)
    digest = world.target()["metadata"]["annotations"][api.ANN_DATA_HASH]
    assert digest[:16] not in str(world.status())


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
    """A volume is only read by a container that mounts it: a workload listing the
    target's volume but mounting it nowhere is not restarted."""
    pod = _pod(containers=[{"name": "app", "volumeMounts": [{"name": "other", "mountPath": "/o"}]}],
               volumes=[{"name": "unused", "secret": {"secretName": TARGET}},
                        {"name": "unused-too", "projected": {"sources": [
                            {"secret": {"name": TARGET}}]}},
                        {"name": "other", "secret": {"secretName": "mounted"}}])
    assert references.secrets_read(pod) == {"mounted"}
    world = rollout_world(reads=None, minRestartInterval="0")
    world.kube.workloads[(NS, "Deployment", "web")]["spec"] = pod["spec"]
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
    with pytest.raises(api.InvalidSpec, match=None) as info:
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
@given(steps=st.lists(st.tuples(st.sampled_from(["change", "poll", "fail"]),
                                st.sampled_from([0.5, 1.0, 3.0, 7.0, 12.0])), max_size=40))
def test_scheduler_never_restarts_within_a_window_and_never_loses_a_claim(
        steps: list[tuple[str, float]]) -> None:
    """One holder, one workload: restarts are at least a window apart, each restart
    covers a claim, and once claims stop, the last data is rolled out within a window
    plus the retry backoff."""
    kube = FakeKube()
    kube.add_workload(NS, "Deployment", "web", reads=TARGET)
    clock = Clock()
    restarter = Restarter(kube, now=clock)
    digest, rolled, since = "d0", "d0", None
    version = 0
    for what, dt in steps:
        clock.t += dt
        if what == "change":
            version += 1
            digest = f"d{version}"
        elif what == "fail":
            kube.fail_next["restart_workload"] = [KubeError("refused", status=500)]
        if digest != rolled:
            since = clock.t if since is None else since
            out = restarter.claim(NS, "Deployment", "web", Claim(
                holder=KEY, secret=TARGET, digest=digest, since=since, window=WINDOW))
            if out.state == "done":
                rolled, since = out.digest or "", None
    times = [api.parse_time(at) for *_, at in kube.restarts]
    stamps = [t.timestamp() for t in times if t is not None]
    assert all(b - a >= WINDOW for a, b in itertools.pairwise(stamps))
    assert len(stamps) <= version
    kube.fail_next.clear()
    for _ in range(4):
        if digest == rolled:
            break
        since = clock.t if since is None else since  # a new claim, as the holder makes
        out = restarter.claim(NS, "Deployment", "web", Claim(
            holder=KEY, secret=TARGET, digest=digest, since=since, window=WINDOW))
        if out.state == "done":
            rolled, since = out.digest or "", None
        else:  # woken when it says: within a window, or the retry backoff's cap
            assert out.at <= clock.t + max(WINDOW, RETRY_CAP)
            clock.t = max(clock.t, out.at)
    assert rolled == digest
    assert restarter.pending() == 0


def test_the_restart_record_keeps_the_claimants_it_just_served() -> None:
    """himitsu.io/restarted-for is bounded (32 claimants) but never drops one the restart
    was made for: its status write lost, the next process would restart it again."""
    kube = FakeKube()
    workload = kube.add_workload(NS, "Deployment", "web")
    workload["spec"]["template"]["spec"]["containers"][0]["envFrom"] = [
        {"secretRef": {"name": f"s{i}"}} for i in range(MAX_SERVED + 1)]
    clock = Clock()

    def claim(r: Restarter, i: int, digest: str, window: float = 0.0) -> str:
        return r.claim(NS, "Deployment", "web", Claim(
            holder=f"{NS}/h{i}", secret=f"s{i}", digest=digest, since=clock.t,
            window=window)).state

    first = Restarter(kube, now=clock)
    for i in range(MAX_SERVED):
        assert claim(first, i, "d1") == "done"
    clock.t += 60
    # h0 changes again and a 33rd HimitsuSecret changes in the same window: one restart.
    claim(first, 0, "d2", 10.0)  # collects the outcome kept for d1 (sync.rollout re-claims)
    assert claim(first, 0, "d2", 10.0) == "waiting"
    assert claim(first, MAX_SERVED, "d1", 10.0) == "waiting"
    clock.t += 10
    assert claim(first, 0, "d2", 10.0) == "done"
    before = len(kube.restarts)
    # h0's status write was lost; the operator restarts; h0 asks again for d2.
    assert claim(Restarter(kube, now=clock), 0, "d2") == "done"
    assert len(kube.restarts) == before, "d2 rolled out twice"


def _strip_rollout_stamps(world: World) -> None:
    """A GitOps tool (Argo CD self-heal with the Secret in git) drops the annotations it
    does not know: the rollout salt and data-changed-at among them."""
    meta = world.target()["metadata"]
    ann = {k: v for k, v in meta["annotations"].items()
           if k not in (api.ANN_ROLLOUT_SALT, api.ANN_DATA_CHANGED_AT)}
    world.kube.edit_secret(NS, TARGET, metadata={**meta, "annotations": ann})


def test_after_a_salt_loss_new_bytes_at_the_same_config_version_still_restart() -> None:
    """The salt was stripped while the operator was down, and the spec's template changed
    (one commit: operator upgrade + new format), so the target's bytes change while
    Himitsu's config version stays 5. The pods never saw these bytes: the restart is
    owed, though the config version alone says "same version"."""
    world = rollout_world(minRestartInterval="0")
    world.sync(5)
    world.poll(himitsu.NotModified(5))
    before = dict(world.target()["data"])
    world.restart()
    _strip_rollout_stamps(world)
    world.edit_target_spec(template={"format": "Json", "key": "config.json"})
    world.clock.advance(60)
    world.reconcile(fetched(5))
    assert world.target()["data"] != before  # the pods' bytes are no longer the target's
    world.poll(himitsu.NotModified(5))
    assert len(restarts(world)) == 1, entry(world)
    assert "dataSource" in entry(world)  # a hash of spec fields: no value, no salt


def test_after_a_salt_loss_a_version_bump_to_the_same_bytes_restarts_once() -> None:
    """The documented conservative side (docs/restarting-consumers.md): once the salt
    is lost, the record cannot tell bytes apart and decides by config version and source
    stamp; a new version rendering the same bytes restarts once, then nothing more."""
    world = rollout_world(minRestartInterval="0")
    world.sync(5)
    world.poll(himitsu.NotModified(5))
    world.restart()
    _strip_rollout_stamps(world)
    world.clock.advance(60)
    world.reconcile(fetched(6))  # the same values as version 5
    world.poll(himitsu.NotModified(6))
    assert len(restarts(world)) == 1, entry(world)
    world.clock.advance(60)
    world.reconcile(fetched(7))
    world.poll(himitsu.NotModified(7))
    assert len(restarts(world)) == 1, entry(world)


def _as_apiserver(world: World) -> None:
    """The apiserver omits an empty ``data`` map (``omitempty``) in what it returns."""
    stored = world.kube.secrets[(NS, TARGET)]
    if not stored.get("data"):
        stored.pop("data", None)


def test_a_no_op_force_sync_of_an_empty_environment_writes_nothing() -> None:
    """An environment with no secrets renders no data: the Secret comes back without
    ``data``. A force-sync that changes nothing must not write, nor restamp
    himitsu.io/data-changed-at each time."""
    world = rollout_world(minRestartInterval="0")
    world.sync(5, {})
    _as_apiserver(world)
    world.poll(himitsu.NotModified(5))
    writes = world.kube.writes()
    stamp = world.target()["metadata"]["annotations"].get(api.ANN_DATA_CHANGED_AT)
    for i in range(3):
        world.annotate(api.ANN_FORCE_SYNC, str(i))
        world.clock.advance(60)
        world.reconcile(fetched(5, {}))
        _as_apiserver(world)
    assert world.kube.writes() == writes, world.target()["metadata"]["annotations"]
    assert world.target()["metadata"]["annotations"].get(api.ANN_DATA_CHANGED_AT) == stamp
    assert restarts(world) == []


def test_a_merge_first_sync_whose_status_write_was_lost_still_restarts() -> None:
    """A Merge target's first sync adds the Himitsu keys to the Helm Secret web's pods
    read (a restart is owed), then the operator dies before any status write. The next
    process finds a first sync whose write is already done: the change is still one the
    pods never saw, so the restart is still owed, once."""
    world = merge_world(rolloutRestartTargets=[WEB], minRestartInterval="10s")
    world.kube.add_workload(NS, "Deployment", "web", reads=TARGET)
    _lose_status_writes(world)
    world.reconcile(fetched(5))
    assert "KEY_0" in world.data() and "configVersion" not in world.status()
    world.restart()
    world.clock.advance(60)
    world.reconcile(fetched(5))
    world.clock.advance(WINDOW)
    world.reconcile()
    world.poll(himitsu.NotModified(5))
    assert len(restarts(world)) == 1, entry(world)
    world.clock.advance(60)
    world.reconcile(fetched(5))
    world.poll(himitsu.NotModified(5))
    assert len(restarts(world)) == 1, entry(world)


def test_a_recreated_merge_himitsusecret_does_not_restart_for_data_already_there() -> None:
    """The Merge target outlives its HimitsuSecret; one recreated under the same name
    (another uid) finds the keys its predecessor's first sync wrote: its pods have them,
    so its own first sync, which changes nothing, owes nothing."""
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
    assert len(restarts(world)) == 1, entry(world)


def test_a_deleted_himitsusecret_s_status_never_lands_on_its_recreated_namesake() -> None:
    """The user deletes the HimitsuSecret and creates another of the same name before the
    informer sees it: a reconcile of the stale copy must not write the deleted object's
    status (its rolloutRestarts record: what the old target's pods had) onto the new one,
    whose first sync would then take that record as its own and owe no restart, or one
    it does not owe (the model-based test's shrunk example: w0 kept older data)."""
    world = rollout_world(minRestartInterval="0")
    world.sync(5)
    world.poll(himitsu.NotModified(5))
    assert world.status().get("rolloutRestarts")
    world.kube.freeze_himitsu_secret(NS, NAME)  # the informer still has the deleted one
    del world.kube.himitsu_secrets[(NS, NAME)]
    world.kube.add_himitsu_secret(make_hsec(rolloutRestartTargets=[WEB],
                                            minRestartInterval="0"))
    world.clock.advance(60)
    world.fetcher.then(himitsu.NotModified(5), fetched(5))
    world.reconciler.reconcile(KEY)
    assert not world.status().get("rolloutRestarts"), world.status()
