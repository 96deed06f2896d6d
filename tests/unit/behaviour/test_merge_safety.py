"""Merge targets and template metadata: nothing foreign is removed or changed, a Merge
needs the target's consent, removed template metadata leaves, a renamed target leaves no
stale copy (issues 21 and 27). Through the reconcile, against the in-memory fakes."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from fakes import b64, unb64
from reconcile_world import NAME, NS, TARGET, World, fetched, make_hsec, merge_world

from himitsu_controller import api

OTHER_ENV = "44444444-4444-4444-4444-444444444444"


def successor(world: World, name: str = "b", **over: Any) -> str:
    """Another Merge HimitsuSecret (another environment) on the same target."""
    obj = make_hsec(policy="Merge", environmentId=OTHER_ENV, **over)
    obj["metadata"]["name"] = name
    world.kube.add_himitsu_secret(obj)
    return f"{NS}/{name}"


def reconcile_as(world: World, key: str, *script: Any) -> Any:
    world.fetcher.then(*script)
    return world.reconciler.reconcile(key)


def delete_hsec(world: World, name: str = NAME) -> None:
    del world.kube.himitsu_secrets[(NS, name)]
    world.reconciler.reconcile(f"{NS}/{name}")


def meta(world: World, name: str = TARGET) -> dict[str, Any]:
    found: dict[str, Any] = world.kube.secret(NS, name)["metadata"]
    return found


# --- issue 21 item 1: a successor removes nothing it did not write ---------------------


def test_a_merge_successor_keeps_the_keys_its_predecessor_wrote() -> None:
    world = merge_world(consent="*")
    world.sync(5, {"DB_URL": "postgres://a"})
    delete_hsec(world)
    b = successor(world)
    assert reconcile_as(world, b, fetched(1, {"B_KEY": "b"})).error is None
    assert world.data() == {"HELM_KEY": "helm-value", "DB_URL": "postgres://a", "B_KEY": "b"}
    # And on B's later syncs too: DB_URL was never B's.
    world.clock.advance(60)
    assert reconcile_as(world, b, fetched(2, {"B_KEY": "b2"})).error is None
    assert world.data() == {"HELM_KEY": "helm-value", "DB_URL": "postgres://a", "B_KEY": "b2"}


def test_a_predecessor_key_of_the_same_name_is_overwritten_and_becomes_the_successors() -> None:
    world = merge_world(consent="*")
    world.sync(5, {"DB_URL": "postgres://a", "A_ONLY": "a"})
    delete_hsec(world)
    b = successor(world)
    assert reconcile_as(world, b, fetched(1, {"DB_URL": "postgres://b"})).error is None
    assert world.data()["DB_URL"] == "postgres://b"
    world.clock.advance(60)
    assert reconcile_as(world, b, fetched(2, {"OTHER": "x"})).error is None
    # B drops DB_URL (now its own); A's other key stays, as does Helm's.
    assert world.data() == {"HELM_KEY": "helm-value", "A_ONLY": "a", "OTHER": "x"}


def test_a_recreated_himitsu_secret_of_the_same_name_is_another_writer() -> None:
    world = merge_world()
    world.sync(5, {"OLD": "1"})
    obj = make_hsec(policy="Merge")  # same name, a new uid
    world.kube.himitsu_secrets.pop((NS, NAME))
    world.kube.add_himitsu_secret(obj)
    world.restart()
    world.sync(6, {"NEW": "2"})
    assert world.data() == {"HELM_KEY": "helm-value", "OLD": "1", "NEW": "2"}


# --- issue 27 item 1: a Merge needs the target's consent ---------------------------------


def refused_byte_for_byte(world: World, *script: Any) -> None:
    """Refused before Himitsu is asked (``script``: what it would have answered)."""
    before = copy.deepcopy(world.target())
    writes, asked = world.kube.writes(), len(world.fetcher.calls)
    result = reconcile_as(world, f"{NS}/{NAME}", *script)
    assert result.error == "TargetConflict"
    assert f"{api.ANN_ALLOW_MERGE_BY}: {NAME}" in world.ready()["message"]
    assert (world.kube.writes(), len(world.fetcher.calls)) == (writes, asked)
    assert world.target() == before
    assert [(e.type, e.reason) for e in world.kube.events if e.type == "Warning"] == [
        ("Warning", "TargetConflict")]


def test_a_merge_without_consent_leaves_the_target_byte_for_byte() -> None:
    refused_byte_for_byte(merge_world(consent=None))


def test_a_merge_of_a_node_options_key_into_another_teams_secret_is_refused() -> None:
    refused_byte_for_byte(merge_world(consent=None),
                          fetched(1, {"NODE_OPTIONS": "--require /tmp/x.js"}))


def test_a_replicator_annotation_through_the_template_is_refused() -> None:
    world = merge_world(consent=None, template={"annotations": {
        "replicator.v1.mittwald.de/replicate-to": "attacker-ns"}})
    refused_byte_for_byte(world)


def test_a_workload_reading_a_refused_target_is_not_restarted() -> None:
    world = merge_world(consent=None, rolloutRestartTargets=[{"kind": "Deployment",
                                                               "name": "web"}])
    world.kube.add_workload(NS, "Deployment", "web", reads=TARGET)
    refused_byte_for_byte(world)
    world.clock.advance(600)
    world.reconcile()
    assert world.kube.restarts == []


def test_another_himitsu_secrets_consent_is_not_this_ones() -> None:
    refused_byte_for_byte(merge_world(consent="someone-else"))


@pytest.mark.parametrize("consent", ["*", NAME, f"other, {NAME}"])
def test_a_consenting_target_is_merged_into(consent: str) -> None:
    world = merge_world(consent=consent)
    world.sync(5)
    assert world.data()["HELM_KEY"] == "helm-value"
    assert meta(world)["annotations"][api.ANN_ALLOW_MERGE_BY] == consent


def test_withdrawn_consent_stops_every_write() -> None:
    world = merge_world()
    world.sync(5)
    target = world.target()
    del target["metadata"]["annotations"][api.ANN_ALLOW_MERGE_BY]
    world.kube.edit_secret(NS, TARGET, metadata=target["metadata"])
    world.edit_spec(environmentId=OTHER_ENV)  # a change that would write
    refused_byte_for_byte(world)


def test_a_merge_target_the_operator_created_needs_no_consent() -> None:
    world = World(policy="Merge")
    world.sync(5)
    world.poll(fetched(6, {"NEW": "1"}))
    assert world.data() == {"NEW": "1"}


def test_a_target_created_for_a_deleted_namesake_needs_consent() -> None:
    world = World(policy="Merge")
    world.sync(5)
    world.kube.himitsu_secrets.pop((NS, NAME))
    world.kube.add_himitsu_secret(make_hsec(policy="Merge"))  # same name, new uid
    world.restart()
    world.kube.events.clear()
    refused_byte_for_byte(world)


def test_merge_template_metadata_never_overwrites_a_foreign_key() -> None:
    world = merge_world(template={"annotations": {
        "meta.helm.sh/release-name": "mine", "example.com/new": "n"}})
    world.sync(5)
    ann = meta(world)["annotations"]
    assert ann["meta.helm.sh/release-name"] == "r"
    assert ann["example.com/new"] == "n"
    assert ann[api.ANN_TEMPLATE_ANNOTATIONS] == "example.com/new"


def test_service_account_annotations_are_reserved_in_templates() -> None:
    obj = make_hsec(template={"annotations": {"kubernetes.io/service-account.name": "default"}})
    with pytest.raises(api.InvalidSpec, match="service-account"):
        api.parse_spec(obj)


# --- issue 21 item 4: removed template metadata leaves the target --------------------------


def test_a_label_removed_from_an_owner_template_leaves_the_target() -> None:
    world = World(template={"labels": {"team": "a", "tier": "x"},
                            "annotations": {"example.com/replicate-to": "ns"}})
    world.sync(5)
    labels = meta(world)["labels"]
    labels["by-hand"] = "yes"
    world.kube.edit_secret(NS, TARGET, metadata=meta(world) | {"labels": labels})
    world.edit_target_spec(template={"labels": {"team": "a"}})
    world.reconcile()  # a spec edit keeping the source: the target's own data, no fetch
    got = meta(world)
    assert {k: v for k, v in got["labels"].items() if not api.is_reserved_key(k)} == {
        "team": "a", "by-hand": "yes"}
    assert "example.com/replicate-to" not in got["annotations"]


def test_a_merge_template_removes_only_what_it_applied() -> None:
    world = merge_world(template={"annotations": {"meta.helm.sh/release-name": "mine",
                                                  "example.com/ours": "1"}})
    world.sync(5)
    world.edit_target_spec(template={})
    world.reconcile()  # a spec edit keeping the source: the target's own data, no fetch
    ann = meta(world)["annotations"]
    assert ann["meta.helm.sh/release-name"] == "r"
    assert "example.com/ours" not in ann
    assert api.ANN_TEMPLATE_ANNOTATIONS not in ann


def test_a_removed_template_key_is_repaired_without_a_spec_edit() -> None:
    """Level-based: a target carrying a key the template applied and holds no more is
    not consistent, whoever put it back."""
    world = World(template={"labels": {"team": "a"}})
    world.sync(5)
    labels = meta(world)["labels"]
    world.kube.edit_secret(NS, TARGET, metadata=meta(world) | {"labels": {**labels,
                                                                          "stale": "1"}})
    got = meta(world)
    got["annotations"][api.ANN_TEMPLATE_LABELS] = "stale,team"
    world.kube.edit_secret(NS, TARGET, metadata=got)
    world.poll(fetched(5))  # a 304 would have left it
    assert "stale" not in meta(world)["labels"]


# --- issue 21 item 5: a renamed target leaves no stale copy --------------------------------


def test_a_renamed_owner_target_deletes_the_old_secret_once_the_new_one_is_written() -> None:
    world = World()
    world.sync(5)
    world.edit_target_spec(name="renamed")
    world.sync(5)
    assert (NS, TARGET) not in world.kube.secrets
    assert unb64(world.kube.secret(NS, "renamed")["data"]) == fetched(5).secrets
    normal = [e for e in world.kube.events if e.reason == "PreviousTargetReleased"]
    assert len(normal) == 1 and normal[0].type == "Normal" and TARGET in normal[0].message


def test_a_renamed_owner_target_whose_owner_reference_was_pruned_is_deleted_too() -> None:
    # Found by the model test ('renamed'): a GitOps tool pruned the controller reference
    # (a stamp the operator puts back); the old Secret lost its stamps but kept every value.
    world = World()
    world.sync(5)
    world.kube.edit_secret(NS, TARGET, metadata={
        **world.target()["metadata"], "ownerReferences": []})
    world.edit_target_spec(name="renamed")
    world.sync(5)
    assert (NS, TARGET) not in world.kube.secrets
    assert unb64(world.kube.secret(NS, "renamed")["data"]) == fetched(5).secrets


def test_a_renamed_merge_target_loses_our_keys_and_stamps_and_keeps_the_rest() -> None:
    world = merge_world(template={"annotations": {"example.com/ours": "1"}})
    world.sync(5)
    world.edit_target_spec(name="renamed")
    world.sync(5)
    old = world.kube.secret(NS, TARGET)
    assert unb64(old["data"]) == {"HELM_KEY": "helm-value"}
    assert old["metadata"]["labels"] == {api.LABEL_MANAGED_BY: "Helm"}
    assert old["metadata"]["annotations"] == {"meta.helm.sh/release-name": "r",
                                              api.ANN_ALLOW_MERGE_BY: NAME}
    assert [e.type for e in world.kube.events if e.reason == "PreviousTargetReleased"] == [
        "Normal"]


def test_the_old_target_stays_while_the_new_one_cannot_be_written() -> None:
    world = World()
    world.sync(5)
    world.kube.put_secret({"metadata": {"namespace": NS, "name": "taken"},
                           "data": {"X": b64("y")}})
    world.edit_target_spec(name="taken")
    assert world.reconcile().error == "TargetConflict"
    assert (NS, TARGET) in world.kube.secrets


def test_another_himitsu_secrets_target_is_never_released() -> None:
    world = World()
    world.sync(5)
    other = make_hsec(target={"name": "elsewhere", "creationPolicy": "Owner"})
    other["metadata"]["name"] = "other"
    world.kube.add_himitsu_secret(other)
    assert reconcile_as(world, f"{NS}/other", fetched(5)).error is None
    assert (NS, TARGET) in world.kube.secrets
    assert (NS, "elsewhere") in world.kube.secrets


def test_a_renamed_merge_target_the_operator_created_and_nobody_else_wrote_is_deleted() -> None:
    world = World(policy="Merge")
    world.sync(5)
    world.edit_target_spec(name="renamed")
    world.sync(5)
    assert (NS, TARGET) not in world.kube.secrets
    assert unb64(world.kube.secret(NS, "renamed")["data"]) == fetched(5).secrets


def test_a_renamed_merge_target_that_lost_our_label_is_left_alone(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # Found by the model test ('foreign'): the label was removed while the informer still
    # indexed the Secret; the fresh read decides, as the label-selected watch would.
    world = World(policy="Merge")
    world.sync(5)
    stale = world.kube.secrets_owned_by(NS, world.hsec["metadata"]["uid"])
    target = world.target()
    labels = {k: v for k, v in target["metadata"]["labels"].items() if k != api.LABEL_MANAGED}
    world.kube.edit_secret(NS, TARGET, metadata={**target["metadata"], "labels": labels})
    monkeypatch.setattr(world.kube, "secrets_owned_by", lambda namespace, uid: stale)
    world.edit_target_spec(name="renamed")
    world.sync(5)
    assert world.kube.secret(NS, TARGET)["data"] == target["data"]
    assert not [e for e in world.kube.events if e.reason == "PreviousTargetReleased"]


def test_a_renamed_merge_target_the_operator_created_keeps_what_others_added() -> None:
    world = World(policy="Merge")
    world.sync(5)
    target = world.target()
    target["data"]["THEIRS"] = b64("t")
    world.kube.edit_secret(NS, TARGET, data=target["data"])
    world.edit_target_spec(name="renamed")
    world.sync(5)
    old = world.kube.secret(NS, TARGET)
    assert unb64(old["data"]) == {"THEIRS": "t"}
    assert not old["metadata"].get("labels") and not old["metadata"].get("annotations")


# --- "created for" is a creation-time fact tied to one uid ---------------------------------


def another(world: World, name: str, *, policy: str, target: str = TARGET) -> str:
    """Another HimitsuSecret (another environment) naming ``target``."""
    obj = make_hsec(policy=policy, environmentId=OTHER_ENV)
    obj["metadata"]["name"] = name
    obj["spec"]["target"]["name"] = target
    world.kube.add_himitsu_secret(obj)
    return f"{NS}/{name}"


def set_consent(world: World, value: str | None) -> None:
    got = meta(world)
    ann = dict(got.get("annotations") or {})
    ann.pop(api.ANN_ALLOW_MERGE_BY, None)
    if value is not None:
        ann[api.ANN_ALLOW_MERGE_BY] = value
    world.kube.edit_secret(NS, TARGET, metadata={**got, "annotations": ann})


def orphaned_merge_target(world: World) -> None:
    """The operator created a Merge HimitsuSecret's target; its team added a key by hand
    and deleted the HimitsuSecret, keeping the Secret (it outlives a Merge one)."""
    world.sync(5, {"DB_URL": "postgres://team"})
    data = dict(world.target().get("data") or {})
    world.kube.edit_secret(NS, TARGET, data={**data, "THEIRS": b64("team-value")})
    delete_hsec(world)


def test_an_owner_himitsu_secret_never_adopts_a_secret_created_for_another() -> None:
    """The attacker may create HimitsuSecrets, not write Secrets: an Owner one naming the
    orphan would replace the team's data (NODE_OPTIONS into a Secret a workload loads)
    and put its controller reference on it."""
    world = World(policy="Merge")
    orphaned_merge_target(world)
    before = world.target()
    result = reconcile_as(world, another(world, "evil", policy="Owner"),
                          fetched(1, {"NODE_OPTIONS": "--require /tmp/x.js"}))
    assert result.error == "TargetConflict"
    assert world.target() == before
    message = world.kube.status(NS, "evil")["conditions"][0]["message"]
    assert "delete it" in message and api.ANN_ALLOW_MERGE_BY in message


def test_a_secret_created_for_another_survives_an_owner_himitsu_secret_moving_away() -> None:
    """Had the Owner write taken it, its controller reference would have made it an
    earlier target of the attacker's, deleted once target.name changes."""
    world = World(policy="Merge")
    orphaned_merge_target(world)
    evil = another(world, "evil", policy="Owner")
    reconcile_as(world, evil, fetched(1, {"X": "1"}))
    obj = world.kube.himitsu_secrets[(NS, "evil")]
    obj["spec"]["target"]["name"] = "elsewhere"
    obj["metadata"]["generation"] += 1
    assert reconcile_as(world, evil, fetched(1, {"X": "1"})).error is None
    assert unb64(world.kube.secret(NS, TARGET)["data"]) == {
        "DB_URL": "postgres://team", "THEIRS": "team-value"}


def test_withdrawn_consent_stops_a_merge_into_a_secret_created_for_another() -> None:
    """A later writer never inherits "created for": once b merged with the Secret's
    consent, withdrawing it stops b."""
    world = World(policy="Merge")
    orphaned_merge_target(world)
    set_consent(world, "b")
    b = another(world, "b", policy="Merge")
    assert reconcile_as(world, b, fetched(1, {"B_KEY": "b1"})).error is None
    assert api.ANN_CREATED_FOR not in meta(world)["annotations"]
    set_consent(world, None)
    before = world.target()
    world.clock.advance(120)
    assert reconcile_as(world, b, fetched(2, {"B_KEY": "b2", "NEW": "n"})).error == \
        "TargetConflict"
    assert world.target()["data"] == before["data"]


def test_a_merge_target_created_before_the_created_for_record_is_still_its_creators() -> None:
    """Written by an earlier version (the managed-by label beside this HimitsuSecret's
    stamps, no created-for): no consent asked, and the next write records the uid."""
    world = World(policy="Merge")
    world.sync(5)
    got = meta(world)
    got["annotations"].pop(api.ANN_CREATED_FOR)
    world.kube.edit_secret(NS, TARGET, metadata=got)
    world.poll(fetched(6, {"NEW": "1"}))
    assert world.data() == {"NEW": "1"}
    assert meta(world)["annotations"][api.ANN_CREATED_FOR] == world.kube.himitsu_secrets[
        (NS, NAME)]["metadata"]["uid"]


def test_an_earlier_target_held_by_a_finalizer_costs_no_read_per_poll() -> None:
    def renamed_then_polled(*, finalizer: bool) -> tuple[World, int]:
        world = World()
        world.sync(5)
        if finalizer:
            world.kube.edit_secret(NS, TARGET, metadata={
                **meta(world), "finalizers": ["example.com/hold"]})
        world.edit_target_spec(name="renamed")
        world.sync(5)
        reads = world.kube.direct_reads
        for _ in range(3):
            world.poll(fetched(5))
        return world, world.kube.direct_reads - reads

    held, reads_held = renamed_then_polled(finalizer=True)
    assert meta(held).get("deletionTimestamp")
    assert reads_held == renamed_then_polled(finalizer=False)[1]
