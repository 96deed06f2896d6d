"""Tests for reconciler.py: the sync contract, end to end against in-memory fakes.

Each test names one promise of the contract (spec/operator-readme.txt and the design's
Reconcile section) and checks it through what a user or the apiserver would see: the
requests sent to Himitsu (conditional or full), the Secret written or left alone, and
the status. Failures, timing, Events and the canary are in test_reconciler_failures.py;
the world both run in is reconcile_world.py.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest
from fakes import FakeFetcher, b64
from reconcile_world import (
    API,
    CANARY,
    ENV,
    KEY,
    NAME,
    NS,
    OTHER_ENV,
    PROJECT,
    TARGET,
    TOKEN,
    World,
    add_other,
    fetched,
    make_hsec,
    merge_world,
    values,
)

from himitsu_controller import api, himitsu, metrics
from himitsu_controller.runtime.controller import Result
from himitsu_controller.runtime.metrics import REGISTRY
from himitsu_controller.sync.ports import SecretValue
from himitsu_controller.sync.reconciler import HimitsuSecretReconciler


@pytest.fixture
def world() -> World:
    return World()


# --- conditional requests only when safe ---------------------------------------------


def test_first_sync_is_a_full_fetch_then_conditional(world: World) -> None:
    world.sync(5)
    assert world.fetcher.calls[0].known_version is None
    assert world.fetcher.calls[0].token == TOKEN
    assert (world.fetcher.calls[0].api_url, world.fetcher.calls[0].environment_id) == (API, ENV)
    assert world.data() == values()
    world.poll(himitsu.NotModified(5))
    assert world.fetcher.known_versions == [None, 5]


def test_304_touches_only_the_status(world: World) -> None:
    world.sync(5)
    before, writes, patches = world.target(), world.kube.writes(), len(world.kube.status_patches)
    world.clock.advance(60)
    result = world.reconcile(himitsu.NotModified(5))
    assert result.error is None
    assert world.kube.writes() == writes
    assert world.target() == before
    assert len(world.kube.status_patches) == patches + 1
    assert world.status()["lastSyncTime"] == "2024-05-06T07:09:09Z"
    assert world.status()["secretCount"] == 2


def test_200_with_the_same_content_writes_nothing(world: World) -> None:
    world.sync(5)
    before, writes, events = world.target(), world.kube.writes(), len(world.kube.events)
    world.annotate(api.ANN_FORCE_SYNC, "1")  # forces the full fetch
    world.sync(5)
    assert world.fetcher.known_versions == [None, None]
    assert world.kube.writes() == writes
    assert world.target() == before
    assert len(world.kube.events) == events


def test_deleted_target_forces_a_full_fetch_and_is_restored(world: World) -> None:
    world.sync(5)
    del world.kube.secrets[(NS, TARGET)]
    world.sync(5)
    assert world.fetcher.known_versions == [None, None]
    assert world.data() == values()


def test_a_first_owner_target_is_created_without_reading_it_first(world: World) -> None:
    # A HimitsuSecret that never wrote a target has none among the labelled Secrets the
    # informer holds, and a GET would only say 404.
    world.sync(5)
    assert world.kube.calls["get_secret"] == world.kube.calls["get_secret_fresh"] == 0
    assert world.kube.calls["create_secret"] == 1


def test_a_deleted_owner_target_costs_one_direct_read_then_a_create(world: World) -> None:
    # Missing from the informer once it has shown our write: deleted, or only unlabelled
    # (the informer watches labelled Secrets). One direct read tells which.
    world.sync(5)
    world.reconcile()  # the echo of our create: nothing to do
    del world.kube.secrets[(NS, TARGET)]
    world.kube.calls.clear()
    world.sync(5)
    assert world.kube.calls["get_secret_fresh"] == 1
    assert world.kube.calls["create_secret"] == 1
    assert world.data() == values()


def test_a_target_the_informer_has_not_shown_yet_is_read_directly(world: World) -> None:
    # Missing from the informer right after our create may only be its lag.
    world.sync(5)
    world.kube.freeze_cache(NS, TARGET)
    world.clock.advance(60)
    world.sync(6, values(3))
    del world.kube.secrets[(NS, TARGET)]
    world.kube.thaw()
    world.kube.calls.clear()
    world.sync(6, values(3))
    assert world.kube.calls["get_secret_fresh"] == 1
    assert world.data() == values(3)


def test_a_merge_target_is_read_directly_until_adopted() -> None:
    world = merge_world()  # Helm's Secret: not labelled, so not in the informer
    world.kube.calls.clear()
    world.sync(5)
    assert world.kube.calls["get_secret"] == 1
    assert world.kube.calls["create_secret"] == 0 and world.kube.calls["update_secret"] == 1


def test_config_version_annotation_edit_forces_a_full_fetch(world: World) -> None:
    world.sync(5)
    target = world.target()
    target["metadata"]["annotations"][api.ANN_CONFIG_VERSION] = "4"
    world.kube.edit_secret(NS, TARGET, metadata=target["metadata"])
    world.sync(5)
    assert world.fetcher.known_versions == [None, None]
    assert world.target()["metadata"]["annotations"][api.ANN_CONFIG_VERSION] == "5"


def test_hand_edited_data_forces_a_full_fetch_and_is_repaired(world: World) -> None:
    world.sync(5)
    world.kube.edit_secret(NS, TARGET, data={"KEY_0": b64("hacked")})
    world.sync(5)
    assert world.fetcher.known_versions == [None, None]
    assert world.data() == values()


@pytest.mark.parametrize(
    "change",
    [
        {"apiUrl": "https://other.example.com"},
        {"projectId": "44444444-4444-4444-4444-444444444444"},
        {"environmentId": OTHER_ENV},
        {"template": {"format": "Dotenv"}},
        {"template": {"format": "Json", "key": "app.json"}},
    ],
    ids=["apiUrl", "project", "environment", "format", "template-key"],
)
def test_target_recorded_for_another_source_forces_a_full_fetch(
    world: World, change: dict[str, Any],
) -> None:
    world.sync(5)
    # Without a generation bump, so only the recorded source can tell.
    if "template" in change:
        world.edit_target_spec(bump=False, **change)
    else:
        world.edit_spec(bump=False, **change)
    world.sync(5)
    assert world.fetcher.known_versions == [None, None]
    call = world.fetcher.calls[1]
    assert (call.api_url, call.project_id, call.environment_id) == (
        world.hsec["spec"]["apiUrl"], world.hsec["spec"]["projectId"],
        world.hsec["spec"]["environmentId"])


def test_spec_edit_keeping_the_source_asks_himitsu_nothing_before_the_poll(
        world: World) -> None:
    """The target's source stamp shows it holds this spec's source: no news is needed
    (issue 21 item 2); the status records the new generation, the poll stays conditional."""
    world.sync(5)
    world.hsec["metadata"]["generation"] = 2
    world.reconcile()
    assert world.fetcher.known_versions == [None]
    assert world.status()["observedGeneration"] == 2
    world.poll(himitsu.NotModified(5))
    assert world.fetcher.known_versions == [None, 5]


def test_new_force_sync_value_forces_one_full_fetch(world: World) -> None:
    world.sync(5)
    world.annotate(api.ANN_FORCE_SYNC, "2024-05-06T00:00:00Z")
    world.sync(5)
    world.poll(himitsu.NotModified(5))
    world.annotate(api.ANN_FORCE_SYNC, "again")
    world.sync(5)
    assert world.fetcher.known_versions == [None, None, 5, None]
    assert world.status()["lastForceSync"] == "again"


def test_a_force_sync_reads_the_token_secret_afresh(world: World) -> None:
    """How a narrowed binding (or a replaced token) counts at once for a HimitsuSecret
    already polling: the token cache is dropped before the forced fetch."""
    kube = world.kube
    cached: dict[str, SecretValue] = {}  # the adapter's token cache, as the fake has none
    read, forget = kube.read_secret_value, kube.forget_secret_value

    def cached_read(namespace: str, name: str, key: str, *, for_url: str | None = None,
                    max_age: float | None = None) -> SecretValue:
        return cached.setdefault(name, read(namespace, name, key, for_url=for_url))

    def dropping_forget(namespace: str, name: str, key: str) -> None:
        cached.pop(name, None)
        forget(namespace, name, key)

    kube.read_secret_value = cached_read  # type: ignore[method-assign]
    kube.forget_secret_value = dropping_forget  # type: ignore[method-assign]
    world.sync(5)
    world.poll(himitsu.NotModified(5))
    bind_token(world, "https://himitsu.example.com/elsewhere")  # not seen: cached
    world.poll(himitsu.NotModified(5))
    world.annotate(api.ANN_FORCE_SYNC, "narrowed")
    world.clock.advance(1)
    assert world.reconcile().error == "InvalidSpec"
    assert world.fetcher.known_versions == [None, 5, 5]  # nothing sent once forced


def test_unconditional_304_is_a_fetch_failure(world: World) -> None:
    result = world.reconcile(himitsu.NotModified(5))
    assert result.error == "FetchFailure"
    assert (NS, TARGET) not in world.kube.secrets


# --- Owner -----------------------------------------------------------------------------


def test_owner_target_exact_data_reference_and_metadata() -> None:
    world = World(template={"labels": {"team": "a"}, "annotations": {"note": "n"}})
    world.sync(7)
    target = world.target()
    meta = target["metadata"]
    assert target["type"] == "Opaque"
    assert world.data() == values()
    assert meta["ownerReferences"] == [{
        "apiVersion": api.API_VERSION, "kind": api.KIND, "name": NAME,
        "uid": world.hsec["metadata"]["uid"], "controller": True, "blockOwnerDeletion": True}]
    assert meta["labels"] == {api.LABEL_MANAGED: "true",
                              api.LABEL_MANAGED_BY: api.MANAGED_BY_VALUE, "team": "a"}
    ann = meta["annotations"]
    assert ann["note"] == "n"
    assert ann[api.ANN_OWNED_BY] == NAME
    assert ann[api.ANN_CONFIG_VERSION] == "7"
    assert (ann[api.ANN_PROJECT_ID], ann[api.ANN_ENVIRONMENT_ID]) == (PROJECT, ENV)
    assert len(ann[api.ANN_DATA_HASH]) == 64
    assert api.ANN_MANAGED_KEYS not in ann
    assert world.status()["configVersion"] == 7
    assert world.status()["secretCount"] == 2


def test_owner_drops_keys_removed_upstream(world: World) -> None:
    world.sync(5, values(3))
    world.poll(fetched(6, {"KEY_0": "new"}))
    assert world.data() == {"KEY_0": "new"}
    assert world.status()["secretCount"] == 1


def test_owner_never_adopts_a_pre_existing_secret(world: World) -> None:
    world.kube.put_secret({"metadata": {"namespace": NS, "name": TARGET},
                           "data": {"THEIRS": b64("keep")}})
    before = world.target()
    # Owner targets are looked up in the informer (labelled Secrets only) and created on
    # a miss: the create finds the name taken, and the retry reads it directly.
    first = world.reconcile(fetched(5))
    assert first.error is None and first.requeue_after is not None
    assert world.target() == before
    result = world.reconcile()
    assert result.error == "TargetConflict"
    assert world.target() == before
    assert world.kube.calls["create_secret"] == 1 and world.kube.calls["update_secret"] == 0
    assert "creationPolicy: Merge" in world.ready()["message"]


def test_owner_type_change_recreates_the_secret(world: World) -> None:
    world.sync(5)
    old_uid = world.target()["metadata"]["uid"]
    world.edit_target_spec(type="example.com/custom")
    world.sync(5)
    target = world.target()
    assert target["type"] == "example.com/custom"
    assert target["metadata"]["uid"] != old_uid
    assert world.data() == values()
    assert world.kube.calls["delete_secret"] == 1


# --- Merge -----------------------------------------------------------------------------


def test_merge_keys_in_stale_keys_out_foreign_untouched() -> None:
    world = merge_world()
    world.sync(5, values(3))
    assert world.data() == {"HELM_KEY": "helm-value", **values(3)}
    meta = world.target()["metadata"]
    assert "ownerReferences" not in meta
    assert meta["labels"][api.LABEL_MANAGED_BY] == "Helm"
    assert meta["labels"][api.LABEL_MANAGED] == "true"
    assert meta["annotations"]["meta.helm.sh/release-name"] == "r"
    assert meta["annotations"][api.ANN_MANAGED_KEYS] == "KEY_0,KEY_1,KEY_2"
    world.poll(fetched(6, {"KEY_0": "new"}))
    assert world.data() == {"HELM_KEY": "helm-value", "KEY_0": "new"}
    assert world.target()["metadata"]["annotations"][api.ANN_MANAGED_KEYS] == "KEY_0"


def test_merge_foreign_edits_do_not_force_a_fetch_or_a_write() -> None:
    world = merge_world()
    world.sync(5)
    target = world.target()
    target["data"]["HELM_KEY"] = b64("helm-v2")
    world.kube.edit_secret(NS, TARGET, data=target["data"])
    writes = world.kube.writes()
    world.reconcile()  # the foreign write's wake, before the poll is due: nothing asked
    assert world.fetcher.known_versions == [None]
    assert world.kube.writes() == writes


def test_merge_collision_with_a_foreign_key_is_a_conflict_naming_the_key() -> None:
    world = merge_world()
    before = world.target()
    result = world.reconcile(fetched(5, {"HELM_KEY": CANARY, "OK": "1"}))
    assert result.error == "TargetConflict"
    assert "'HELM_KEY'" in world.ready()["message"]
    assert world.target() == before


def test_merge_creates_a_missing_target_without_owner_reference() -> None:
    world = World(policy="Merge")
    world.sync(5)
    meta = world.target()["metadata"]
    assert world.data() == values()
    assert "ownerReferences" not in meta
    assert meta["labels"][api.LABEL_MANAGED_BY] == api.MANAGED_BY_VALUE


def test_merge_type_change_is_invalid_spec() -> None:
    world = merge_world()
    world.sync(5)
    before = world.target()
    world.edit_target_spec(type="kubernetes.io/tls")
    result = world.reconcile(fetched(5))
    assert result.error == "InvalidSpec"
    assert "immutable" in world.ready()["message"]
    assert world.target() == before
    assert world.kube.calls["delete_secret"] == 0


def test_policy_switch_owner_to_merge() -> None:
    world = World()
    world.sync(5, values(3))
    world.edit_target_spec(creationPolicy="Merge")
    world.sync(6, values(2))
    assert world.data() == values(2)
    meta = world.target()["metadata"]
    assert "ownerReferences" not in meta
    assert meta["annotations"][api.ANN_MANAGED_KEYS] == "KEY_0,KEY_1"


def test_policy_switch_merge_to_owner_for_a_target_we_created() -> None:
    world = World(policy="Merge")
    world.sync(5)
    world.edit_target_spec(creationPolicy="Owner")
    world.sync(5)
    assert [r["kind"] for r in world.target()["metadata"]["ownerReferences"]] == [api.KIND]


def test_policy_switch_merge_to_owner_never_wipes_a_foreign_secret() -> None:
    world = merge_world()
    world.sync(5)
    before = world.target()
    world.edit_target_spec(creationPolicy="Owner")
    assert world.reconcile().error == "TargetConflict"
    assert world.target() == before


# --- TargetConflict between HimitsuSecrets ----------------------------------------------


# --- our own target stays ours ----------------------------------------------------------


def _prune_metadata(world: World) -> None:
    """A GitOps tool's prune: our labels and annotations go, the ownerReference stays.
    The informer watches only labelled Secrets, so for it the target is gone."""
    meta = world.target()["metadata"]
    meta.pop("labels")
    meta.pop("annotations")
    world.kube.edit_secret(NS, TARGET, metadata=meta)
    assert world.kube.get_secret(NS, TARGET, cached=True) is None


def test_a_pruned_owner_target_is_relabelled_in_place_not_created_over() -> None:
    world = World(template={"labels": {"team": "a"}, "annotations": {"note": "n"}})
    world.sync(5)
    world.reconcile()  # the echo of our create
    before = world.target()
    _prune_metadata(world)
    world.kube.calls.clear()

    world.sync(5)

    after = world.target()
    assert after["metadata"]["uid"] == before["metadata"]["uid"]
    for part in ("labels", "annotations", "ownerReferences"):
        assert after["metadata"][part] == before["metadata"][part], part
    assert after["data"] == before["data"]
    assert world.kube.calls["create_secret"] == 0, "created over our own Secret (409)"
    assert world.kube.calls["update_secret"] == 1
    assert world.ready()["reason"] == "Synced"
    assert [e.reason for e in world.kube.events] == ["Synced"]  # no TargetConflict


def test_a_target_pruned_while_the_operator_was_down_is_relabelled(world: World) -> None:
    world.sync(5)
    _prune_metadata(world)
    world.restart()
    world.kube.calls.clear()
    world.sync(5)
    assert world.kube.calls["create_secret"] == 0
    assert world.target()["metadata"]["labels"][api.LABEL_MANAGED] == "true"
    assert world.ready()["reason"] == "Synced"


@pytest.mark.parametrize("removed", ["ownerReferences", "labels|team", "annotations|note"])
def test_removed_metadata_of_ours_is_put_back_by_the_304_of_a_conditional_request(
        removed: str) -> None:
    # The data still matches its hash: a 304 confirms it, and must not confirm the Secret
    # as it is (a removed controller reference would leave it to outlive its HimitsuSecret).
    world = World(template={"labels": {"team": "a"}, "annotations": {"note": "n"}})
    world.sync(5)
    before = world.target()
    meta = world.target()["metadata"]
    part, _, key = removed.partition("|")
    (meta[part] if key else meta).pop(key or part)
    world.kube.edit_secret(NS, TARGET, metadata=meta)

    world.poll(himitsu.NotModified(5))

    assert world.fetcher.known_versions == [None, 5]
    assert world.target()["metadata"][part] == before["metadata"][part]
    assert world.target()["data"] == before["data"]


def test_target_owned_by_another_existing_himitsu_secret(world: World) -> None:
    world.sync(5)
    add_other(world)
    before = world.target()
    other_reconciler = HimitsuSecretReconciler(world.kube, world.fetcher, now=world.clock)
    result = other_reconciler.reconcile("apps/other")
    assert result.error == "TargetConflict"
    assert world.target() == before
    assert len(world.fetcher.calls) == 1
    other_status = world.kube.status(NS, "other")
    assert "already managed by HimitsuSecret 'app-config'" in \
        other_status["conditions"][0]["message"]


def test_an_owner_target_orphaned_by_its_deleted_himitsu_secret_is_not_adopted(
        world: World) -> None:
    """Its HimitsuSecret deleted with --cascade=orphan: the Secret is whoever keeps it now;
    an Owner HimitsuSecret naming it never takes it over (its controller reference would
    let a later rename or deletion delete it). Deleted, it is created anew."""
    add_other(world)
    HimitsuSecretReconciler(world.kube, FakeFetcher(fetched(3, {"OLD": "x"})),
                            now=world.clock).reconcile("apps/other")
    del world.kube.himitsu_secrets[(NS, "other")]
    before = world.target()
    assert world.reconcile().error == "TargetConflict"
    assert world.target() == before
    assert "delete it" in world.ready()["message"]
    del world.kube.secrets[(NS, TARGET)]
    world.sync(5)
    assert world.data() == values()
    assert world.target()["metadata"]["annotations"][api.ANN_OWNED_BY] == NAME


def test_a_target_left_by_a_retargeted_owner_is_taken_only_once_released(
        world: World) -> None:
    world.sync(5)
    add_other(world)
    world.edit_target_spec(name="moved-on")
    other = HimitsuSecretReconciler(world.kube, FakeFetcher(fetched(3, {"NEW": "x"})),
                                    now=world.clock)
    assert other.reconcile("apps/other").error == "TargetConflict"
    assert world.target()["metadata"]["annotations"][api.ANN_OWNED_BY] == NAME
    world.sync(5)  # written to moved-on, the earlier target deleted
    assert (NS, TARGET) not in world.kube.secrets
    assert other.reconcile("apps/other").error is None
    assert world.target()["metadata"]["annotations"][api.ANN_OWNED_BY] == "other"


# --- restarts --------------------------------------------------------------------------


def test_restart_with_a_consistent_target_waits_for_the_next_poll(world: World) -> None:
    world.sync(5)
    world.clock.advance(20)
    world.restart()
    reads = world.kube.calls["read_secret_value"]
    result = world.reconcile()
    assert world.fetcher.calls[1:] == []
    assert world.kube.calls["read_secret_value"] == reads
    assert result.requeue_after == pytest.approx(40.0)
    assert result.error is None
    # The next reconcile is the normal conditional poll.
    world.clock.advance(40)
    world.reconcile(himitsu.NotModified(5))
    assert world.fetcher.known_versions == [None, 5]


def test_restart_with_a_broken_target_syncs_at_once(world: World) -> None:
    world.sync(5)
    del world.kube.secrets[(NS, TARGET)]
    world.clock.advance(20)
    world.restart()
    world.sync(5)
    assert world.fetcher.known_versions == [None, None]


def test_restart_asks_nothing_for_a_refresh_interval_zero_synced_once() -> None:
    # "0 syncs once and stops": a restart is no second sync. (It was: Himitsu's answer by
    # then, one a basic-auth target cannot hold, made it Ready=False InvalidSpec while the
    # target held the first sync; found by the model-based test.)
    world = World(refreshInterval="0", target_type="kubernetes.io/basic-auth")
    world.sync(5, {"username": "u"})
    world.clock.advance(3600)
    world.restart()
    world.fetcher.then(fetched(6, {"OTHER": "x"}))
    result = world.reconciler.reconcile(KEY)
    assert world.fetcher.known_versions == [None]
    assert result == Result()
    assert world.ready()["reason"] == "Synced" and world.data() == {"username": "u"}
    world.fetcher.script.clear()
    # After a restart drift is still repaired, and a force-sync still syncs.
    world.restart()
    del world.kube.secrets[(NS, TARGET)]
    world.sync(6, {"username": "v"})
    world.restart()
    world.annotate(api.ANN_FORCE_SYNC, "now")
    world.sync(7, {"username": "w"})
    assert world.data() == {"username": "w"}


def test_restart_after_the_interval_polls_at_once(world: World) -> None:
    world.sync(5)
    world.clock.advance(61)
    world.restart()
    world.reconcile(himitsu.NotModified(5))
    assert world.fetcher.known_versions == [None, 5]


# --- expectations: our own writes vs a lagging cache -------------------------------------


def test_stale_caches_after_our_write_cause_no_second_write_or_full_fetch(
    world: World,
) -> None:
    world.sync(5)
    world.kube.freeze_cache(NS, TARGET)  # the informers still hold version 5 ...
    world.kube.freeze_himitsu_secret(NS, NAME)
    world.clock.advance(60)
    world.sync(6, values(3))  # ... while we write version 6
    assert world.data() == values(3)
    writes = world.kube.writes()
    result = world.poll(himitsu.NotModified(6))
    assert result.error is None
    assert world.fetcher.known_versions == [None, 5, 6]
    assert world.kube.writes() == writes


def test_stale_cache_of_a_created_target(world: World) -> None:
    world.kube.freeze_cache(NS, TARGET)  # the informer has not seen our create yet
    world.kube.freeze_himitsu_secret(NS, NAME)
    world.sync(5)
    world.poll(himitsu.NotModified(5))
    assert world.fetcher.known_versions == [None, 5]
    assert world.kube.writes() == 1


def test_someone_elses_write_costs_one_direct_read_not_one_per_poll() -> None:
    world = merge_world()
    world.sync(5)
    target = world.target()
    target["data"]["HELM_KEY"] = b64("helm-v2")
    world.kube.edit_secret(NS, TARGET, data=target["data"])  # the cache sees it too
    for _ in range(3):
        world.poll(himitsu.NotModified(5))
    assert world.kube.calls["get_secret_fresh"] == 1


# --- --allowed-api-urls ----------------------------------------------------------------


def test_an_allowed_api_url_syncs() -> None:
    world = World(apiUrl="https://himitsu.example.com/v2", allowed=("https://himitsu.example.com",))
    world.sync(5)


def test_a_refused_api_url_is_invalid_spec_without_any_request() -> None:
    # The matching rules themselves: test_allowlist.py.
    world = World(apiUrl="https://himitsu.example.com.evil",
                  allowed=("https://himitsu.example.com",))
    result = world.reconcile()
    assert result.error == "InvalidSpec"
    assert "--allowed-api-urls" in world.ready()["message"]
    assert world.fetcher.calls == []
    assert world.kube.calls["read_secret_value"] == 0


def test_a_prefix_walk_is_invalid_spec_without_a_token_read_or_a_request() -> None:
    """The issue's reproduction: /himitsu/../elsewhere was accepted under /himitsu and
    requested as /elsewhere/api/v1/..."""
    world = World(apiUrl="https://himitsu.example.com/himitsu/../elsewhere",
                  allowed=("https://himitsu.example.com/himitsu",))
    result = world.reconcile()
    assert result.error == "InvalidSpec"
    assert "apiUrl's path" in world.ready()["message"]
    assert world.fetcher.calls == []
    assert world.kube.calls["read_secret_value"] == 0


def test_the_url_requested_is_the_url_checked() -> None:
    world = World(apiUrl="HTTPS://Himitsu.Example.com:443/himitsu/v2/",
                  allowed=("https://himitsu.example.com/himitsu",))
    world.sync(5)
    assert [c.api_url for c in world.fetcher.calls] == ["https://himitsu.example.com/himitsu/v2"]


def test_plain_http_is_invalid_spec_unless_the_operator_allows_it() -> None:
    refused = World(apiUrl="http://himitsu.example.com")
    assert refused.reconcile().error == "InvalidSpec"
    assert "--allow-insecure-http" in refused.ready()["message"]
    assert refused.fetcher.calls == [] and refused.kube.calls["read_secret_value"] == 0
    World(apiUrl="http://himitsu.example.com", insecure_http=True).sync(5)


def bind_token(world: World, urls: str) -> None:
    token = world.kube.secrets[(NS, "himitsu-token")]
    token["metadata"]["annotations"] = {api.ANN_ALLOWED_API_URLS: urls}


def test_a_token_bound_elsewhere_is_invalid_spec_and_sends_nothing() -> None:
    world = World(apiUrl="https://himitsu.example.com/team-b",
                  allowed=("https://himitsu.example.com",))
    bind_token(world, "https://himitsu.example.com/team-a")
    result = world.reconcile()
    assert result.error == "InvalidSpec"
    message = world.ready()["message"]
    assert message.startswith("token Secret 'himitsu-token' does not allow this apiUrl")
    assert world.fetcher.calls == []
    assert world.kube.writes() == 0
    (event,) = world.kube.events
    assert (event.type, event.reason) == ("Warning", "InvalidSpec")
    # The owner widens it: the refused value was dropped from the cache, so the very next
    # retry syncs.
    assert world.kube.forgotten == [(NS, "himitsu-token")]
    bind_token(world, "https://himitsu.example.com/team-a,https://himitsu.example.com/team-b")
    world.sync(5)


def test_a_himitsu_secret_author_cannot_widen_a_token_binding() -> None:
    """The binding is read from the token Secret only: the same annotation on the
    HimitsuSecret (which its author writes) changes nothing."""
    world = World(apiUrl="https://evil.example")
    bind_token(world, "https://himitsu.example.com")
    world.annotate(api.ANN_ALLOWED_API_URLS, "https://evil.example")
    assert world.reconcile().error == "InvalidSpec"
    assert world.fetcher.calls == []


def test_a_token_bound_to_its_url_syncs() -> None:
    world = World(apiUrl="https://himitsu.example.com/team-a/")
    bind_token(world, "https://HIMITSU.example.com:443/team-a")
    world.sync(5)


def test_a_merge_into_another_teams_token_secret_writes_nothing() -> None:
    """Team B may create HimitsuSecrets, not write Secrets: its Merge target is team A's
    token Secret. Nothing is written there (the reviewer's attack wrote a template
    annotation rebinding the token); the binding and the token stay as their owner left
    them."""
    world = World(policy="Merge")
    victim: dict[str, Any] = {"metadata": {"namespace": NS, "name": TARGET, "annotations": {
        api.ANN_ALLOWED_API_URLS: "https://himitsu.example.com"}},
        "type": "Opaque", "data": {"token": b64(TOKEN)}}
    world.kube.put_secret(copy.deepcopy(victim))
    writes = world.kube.writes()
    result = world.reconcile()  # refused before Himitsu is asked
    assert result.error == "TargetConflict"
    assert "token Secret" in world.ready()["message"]
    assert world.kube.writes() == writes
    after = world.target()
    assert after["data"] == victim["data"]
    assert after["metadata"]["annotations"] == victim["metadata"]["annotations"]


# --- lifecycle -------------------------------------------------------------------------


def test_deleted_himitsu_secret_is_done_and_forgotten(world: World) -> None:
    world.sync(5)
    del world.kube.himitsu_secrets[(NS, NAME)]
    assert world.reconciler.reconcile(KEY) == Result()
    assert world.kube.writes() == 1  # the Owner target is left to the garbage collector


def test_a_recreated_himitsu_secret_takes_no_target_created_for_its_namesake(
        world: World) -> None:
    """A name is reused, a uid never: the old target's controller reference names the
    old uid, so the new HimitsuSecret waits for the garbage collector to delete it, and
    then creates its own with a full fetch."""
    world.kube.freeze_himitsu_secret(NS, NAME)
    world.sync(5)
    world.kube.thaw()
    fresh = make_hsec()
    world.kube.himitsu_secrets.pop((NS, NAME))
    world.kube.add_himitsu_secret(fresh)
    before = world.target()
    assert world.reconcile().error == "TargetConflict"
    assert world.target() == before
    del world.kube.secrets[(NS, TARGET)]  # the garbage collector
    world.sync(5)
    assert world.fetcher.known_versions == [None, None]
    refs = world.target()["metadata"]["ownerReferences"]
    assert [r["uid"] for r in refs] == [fresh["metadata"]["uid"]]


def _ready_gauge(name: str) -> float | None:
    values = [s.value for family in REGISTRY.collect() for s in family.samples
              if s.name == "himitsu_secret_ready"
              and (s.labels["hsec_namespace"], s.labels["name"]) == (NS, name)]
    assert len(values) <= 1, values
    return values[0] if values else None


@pytest.mark.parametrize("interval", ["0", "1h"])
def test_a_restarted_process_reports_the_ready_gauge_of_an_object_it_asks_nothing_for(
        interval: str) -> None:
    """Invariant: every Ready HimitsuSecret the process holds is in himitsu_secret_ready,
    also one a restart leaves alone (no status write to report it)."""
    world = World(refreshInterval=interval)
    world.sync(5, {"A": "1"})
    name = KEY.partition("/")[2]
    metrics.forget_ready(NS, name)  # a new process's gauge starts empty
    world.restart()
    world.clock.advance(10)
    world.reconciler.reconcile(KEY)
    assert world.ready()["status"] == "True"
    assert _ready_gauge(name) == 1.0


def test_a_restarted_process_reports_the_ready_gauge_of_an_object_whose_failure_repeats() -> None:
    """Invariant: every HimitsuSecret the process holds is in himitsu_secret_ready, also a
    failing one whose failure a restart finds unchanged (its status write is skipped)."""
    world = World()
    world.sync(5, {"A": "1"})
    denied = himitsu.Unauthorized("401", status=401)
    world.clock.advance(3600)
    world.reconcile(denied)
    assert world.ready()["status"] == "False"
    name = KEY.partition("/")[2]
    metrics.forget_ready(NS, name)  # a new process's gauge starts empty
    world.restart()
    world.clock.advance(10)
    world.reconcile(denied)
    assert world.ready()["status"] == "False"
    assert _ready_gauge(name) == 0.0
