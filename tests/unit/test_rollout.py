"""Rollout restarts (issue 16): a workload is restarted when, and only when, the data its
pods could have seen differs from what the target holds; batched per workload and
coalesced across HimitsuSecrets; a restart owed survives failures and restarts.

Everything runs on the reconcile world's simulated clock: the only way time passes is
``world.clock.advance``, and the reconciler's Result says when it wants to be woken.
"""

from __future__ import annotations

import itertools
from typing import Any

import pytest
from fakes import FakeKube, b64
from hypothesis import given, settings
from hypothesis import strategies as st
from reconcile_world import KEY, NAME, NS, TARGET, TOKEN, World, fetched, make_hsec, values

from himitsu_controller import api, himitsu, metrics
from himitsu_controller.runtime.controller import Result
from himitsu_controller.sync import references
from himitsu_controller.sync.ports import KubeError
from himitsu_controller.sync.restarter import Claim, Restarter

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


def test_two_himitsu_secrets_naming_one_workload_coalesce() -> None:
    world = rollout_world()
    other = make_hsec(rolloutRestartTargets=[WEB], minRestartInterval="10s")
    other["metadata"]["name"] = "other"
    other["spec"]["target"]["name"] = "other-secrets"
    world.kube.add_himitsu_secret(other)
    workload = world.kube.workloads[(NS, "Deployment", "web")]
    workload["spec"]["template"]["spec"]["containers"][0]["envFrom"].append(
        {"secretRef": {"name": "other-secrets"}})
    world.sync(5)
    world.fetcher.then(fetched(5))
    world.reconciler.reconcile(f"{NS}/other")
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


# --- a restart owed is never lost -------------------------------------------------------------


def test_a_refused_patch_is_retried_with_backoff_and_ready_stays_true() -> None:
    world = rollout_world(minRestartInterval="0")
    world.sync(5)
    world.kube.fail_next["restart_workload"] = [
        KubeError("restarting Deployment 'web' failed: 403 Forbidden", status=403)] * 2
    result = world.poll(fetched(6, changed("b")))
    assert restarts(world) == [] and world.ready()["status"] == "True"
    assert "403" in entry(world)["warning"]
    assert any(e.reason == "RolloutRestartFailed" for e in world.kube.events)
    assert result.requeue_after == pytest.approx(1.0)
    result = wake(world, result)
    assert result.requeue_after == pytest.approx(2.0)
    wake(world, result)
    assert len(restarts(world)) == 1 and "warning" not in entry(world)


def test_a_restart_owed_survives_an_operator_restart() -> None:
    world = rollout_world()
    world.sync(5)
    world.poll(fetched(6, changed("b")))
    world.restart()  # all memory gone; the claim is in status
    world.clock.advance(WINDOW)
    result = world.reconcile(himitsu.NotModified(6))  # not deferred to the next poll
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

    def refuse_after_a_restart(namespace: str, name: str, status: dict[str, Any]) -> None:
        if calls["restart_workload"] == 1 and not calls["refused"]:
            calls["refused"] += 1
            raise KubeError("status patch refused", status=500)
        original(namespace, name, status)

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


def test_a_failing_himitsu_does_not_hold_back_an_owed_restart() -> None:
    world = rollout_world()
    world.sync(5)
    world.poll(fetched(6, changed("b")))
    world.clock.advance(WINDOW)
    world.annotate(api.ANN_FORCE_SYNC, "1")  # a sync that must ask Himitsu, which fails
    result = world.reconcile(himitsu.ServerError("down"))
    assert result.error == "FetchFailure"
    assert len(restarts(world)) == 1


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


def test_force_restarts_an_unreferencing_workload() -> None:
    world = rollout_world({**WEB, "force": True}, reads=None, minRestartInterval="0")
    world.sync(5)
    assert "warning" not in entry(world)
    world.poll(fetched(6, changed("b")))
    assert len(restarts(world)) == 1


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
def test_a_new_token_carries_the_record_over(operator_restarts: bool) -> None:
    """A token replaced while the data changes: this process checks the record with the
    old key and still restarts; a fresh process (which never saw the old token) takes
    the data as the pods have it (the documented gap), and never restarts for nothing."""
    world = rollout_world(minRestartInterval="0")
    world.sync(5)
    world.kube.put_secret({"metadata": {"namespace": NS, "name": "other-token"},
                           "data": {"token": b64(TOKEN.replace("Canary", "Other1"))}})
    if operator_restarts:
        world.restart()
    world.edit_spec(authSecretRef={"name": "other-token"})
    world.reconcile(fetched(6, changed("b")))
    assert len(restarts(world)) == (0 if operator_restarts else 1)
    world.poll(himitsu.NotModified(6))
    assert len(restarts(world)) == (0 if operator_restarts else 1)


def test_status_holds_no_digest_of_the_data() -> None:
    """A plain data hash in status would let HimitsuSecret readers confirm guesses."""
    world = rollout_world()
    world.sync(5)
    digest = world.target()["metadata"]["annotations"][api.ANN_DATA_HASH]
    assert digest[:16] not in str(world.status())


def test_every_pod_template_reference_counts() -> None:
    def pod(**spec: Any) -> dict[str, Any]:
        return {"spec": {"template": {"spec": spec}}}

    found = references.secrets_read(pod(
        initContainers=[{"env": [{"valueFrom": {"secretKeyRef": {"name": "a"}}}]}],
        containers=[{"envFrom": [{"secretRef": {"name": "b"}}, {"configMapRef": {"name": "x"}}]}],
        volumes=[{"secret": {"secretName": "c"}},
                 {"projected": {"sources": [{"secret": {"name": "d"}}]}}],
        imagePullSecrets=[{"name": "e"}]))
    assert found == {"a", "b", "c", "d"}
    assert references.secrets_read({"spec": None}) == set()


# --- the spec -------------------------------------------------------------------------------


@pytest.mark.parametrize(("spec", "message"), [
    ({"rolloutRestartTargets": {"kind": "Deployment"}}, "must be a list"),
    ({"rolloutRestartTargets": [{"kind": "Deployment"}]}, "rolloutRestartTargets[0].name is"),
    ({"rolloutRestartTargets": [{"kind": "Deployment", "name": "Web"}]}, "not a valid workload"),
    ({"rolloutRestartTargets": [WEB, WEB]}, "names Deployment 'web' twice"),
    ({"rolloutRestartTargets": [{**WEB, "force": "yes"}]}, "force must be true or false"),
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
    for _ in range(3):
        if digest == rolled:
            break
        since = clock.t if since is None else since  # a new claim, as the holder makes
        clock.t += WINDOW + 2.0
        out = restarter.claim(NS, "Deployment", "web", Claim(
            holder=KEY, secret=TARGET, digest=digest, since=since, window=WINDOW))
        if out.state == "done":
            rolled, since = out.digest or "", None
    assert rolled == digest
    assert restarter.pending() == 0
