"""Tests for targets.py: who owns a target, what we write into it, when it can be trusted.

These are the rules that protect users' data (never adopt or wipe a Secret we did not
create, never touch a foreign key of a Merge target, never confirm with a 304 data that
is not there), proved on plain dicts without a reconcile around them.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest
from fakes import b64

from himitsu_controller import api
from himitsu_controller.sync.target import targets
from himitsu_controller.sync.target.render import data_hash

OWNER = targets.Owner(namespace="apps", name="app-config", uid="uid-1")
SECRET_VALUE = "s3cr3t-VALUE-canary"


def make_spec(*, policy: str = "Owner", fmt: str = "KeyValue", target_type: str = "Opaque",
              environment: str = "22222222-2222-2222-2222-222222222222",
              labels: dict[str, str] | None = None,
              annotations: dict[str, str] | None = None) -> api.Spec:
    return api.parse_spec({"metadata": {"namespace": "apps"}, "spec": {
        "apiUrl": "https://himitsu.example.com",
        "projectId": "11111111-1111-1111-1111-111111111111",
        "environmentId": environment,
        "authSecretRef": {"name": "himitsu-token"},
        "target": {"name": "app-secrets", "type": target_type, "creationPolicy": policy,
                   "template": {"format": fmt, "labels": labels or {},
                                "annotations": annotations or {}}},
    }})


def foreign_secret(data: dict[str, str], **meta: Any) -> dict[str, Any]:
    return {
        "apiVersion": "v1", "kind": "Secret", "type": "Opaque",
        "metadata": {"name": "app-secrets", "namespace": "apps", "resourceVersion": "7",
                     "uid": "secret-uid", **meta},
        "data": {k: b64(v) for k, v in data.items()},
    }


RENDERED = {"A": b64("1"), "B": b64("2")}


def written(spec: api.Spec, rendered: dict[str, str] | None = None, *, version: int = 5,
            existing: dict[str, Any] | None = None) -> dict[str, Any]:
    return targets.desired_secret(existing, owner=OWNER, spec=spec,
                                  rendered=rendered or RENDERED, version=version,
                                  data_id="d1")


def never_exists(_name: str) -> bool:
    return False


def always_exists(_name: str) -> bool:
    return True


# --- ownership --------------------------------------------------------------------------


def test_missing_target_is_free() -> None:
    for policy in api.POLICIES:
        targets.check_ownership(None, owner=OWNER, policy=policy,
                                himitsu_secret_exists=always_exists)


def test_target_owned_by_another_existing_himitsu_secret_is_a_conflict() -> None:
    theirs = targets.desired_secret(
        None, owner=targets.Owner("apps", "other", "uid-2"), spec=make_spec(),
        rendered=RENDERED, version=1, data_id="d1")
    asked: list[str] = []

    def exists(name: str) -> bool:
        asked.append(name)
        return True

    for policy in api.POLICIES:
        with pytest.raises(targets.TargetConflict, match="already managed by HimitsuSecret "
                                                         "'other'"):
            targets.check_ownership(theirs, owner=OWNER, policy=policy,
                                    himitsu_secret_exists=exists)
    assert asked == ["other", "other"]


def test_a_target_created_for_a_himitsu_secret_that_is_gone_is_nobodys_to_take() -> None:
    """Created by the operator for another HimitsuSecret (gone, or moved elsewhere): an
    Owner write never adopts it (its data is whoever keeps it now) and a Merge needs its
    consent, whatever managed-by label or controller reference it carries."""
    theirs = targets.desired_secret(
        None, owner=targets.Owner("apps", "gone", "uid-2"), spec=make_spec(),
        rendered=RENDERED, version=1, data_id="d1")
    with pytest.raises(targets.TargetConflict, match="never adopts an existing Secret"):
        targets.check_ownership(theirs, owner=OWNER, policy="Owner",
                                himitsu_secret_exists=never_exists)
    with pytest.raises(targets.TargetConflict, match=api.ANN_ALLOW_MERGE_BY):
        targets.check_ownership(theirs, owner=OWNER, policy="Merge",
                                himitsu_secret_exists=never_exists)
    theirs["metadata"]["annotations"][api.ANN_ALLOW_MERGE_BY] = OWNER.name
    targets.check_ownership(theirs, owner=OWNER, policy="Merge",
                            himitsu_secret_exists=never_exists)
    with pytest.raises(targets.TargetConflict, match="never adopts an existing Secret"):
        targets.check_ownership(theirs, owner=OWNER, policy="Owner",
                                himitsu_secret_exists=never_exists)


def test_our_own_target_is_ours() -> None:
    ours = written(make_spec())
    targets.check_ownership(ours, owner=OWNER, policy="Owner",
                            himitsu_secret_exists=always_exists)


def _pruned(secret: dict[str, Any]) -> dict[str, Any]:
    """What a GitOps tool's prune leaves: no labels, no annotations (the ownerReference
    stays: it is not in the tool's manifests either, but tools leave it alone)."""
    out = copy.deepcopy(secret)
    out["metadata"].pop("labels", None)
    out["metadata"].pop("annotations", None)
    return out


def test_our_controller_reference_keeps_a_pruned_target_ours() -> None:
    ours = _pruned(written(make_spec()))
    for policy in api.POLICIES:
        targets.check_ownership(ours, owner=OWNER, policy=policy,
                                himitsu_secret_exists=always_exists)


def test_our_uid_outranks_an_owned_by_annotation_naming_another() -> None:
    ours = written(make_spec())
    ours["metadata"]["annotations"][api.ANN_OWNED_BY] = "other"
    targets.check_ownership(ours, owner=OWNER, policy="Owner",
                            himitsu_secret_exists=always_exists)


def test_a_pruned_target_of_another_himitsu_secret_uid_is_not_ours() -> None:
    # Same name, but a HimitsuSecret deleted and recreated has a new uid: the old
    # object's target is not this one's (it is being garbage-collected).
    theirs = _pruned(written(make_spec()))
    theirs["metadata"]["ownerReferences"][0]["uid"] = "uid-of-an-earlier-app-config"
    with pytest.raises(targets.TargetConflict):
        targets.check_ownership(theirs, owner=OWNER, policy="Owner",
                                himitsu_secret_exists=never_exists)


def test_owner_never_adopts_a_secret_it_did_not_create() -> None:
    with pytest.raises(targets.TargetConflict) as info:
        targets.check_ownership(foreign_secret({"A": "x"}), owner=OWNER, policy="Owner",
                                himitsu_secret_exists=never_exists)
    message = str(info.value)
    assert "'app-secrets' already exists and was not created by himitsu-operator" in message
    assert "creationPolicy: Merge" in message
    # Merge is allowed to add keys to it, with its consent.
    consenting = foreign_secret({"A": "x"}, annotations={api.ANN_ALLOW_MERGE_BY: "*"})
    targets.check_ownership(consenting, owner=OWNER, policy="Merge",
                            himitsu_secret_exists=never_exists)


def test_owner_does_not_adopt_a_foreign_secret_we_only_merged_into() -> None:
    # A Helm Secret we merged keys into carries our label and owned-by, but we did not
    # create it: switching the HimitsuSecret to Owner must not wipe Helm's keys.
    helm = foreign_secret({"HELM_KEY": "h"}, labels={api.LABEL_MANAGED_BY: "Helm"})
    merged = written(make_spec(policy="Merge"), existing=helm)
    for holder_exists in (never_exists, always_exists):
        with pytest.raises(targets.TargetConflict, match="creationPolicy: Merge"):
            targets.check_ownership(merged, owner=OWNER, policy="Owner",
                                    himitsu_secret_exists=holder_exists)
    gone_owner = copy.deepcopy(merged)
    gone_owner["metadata"]["annotations"][api.ANN_OWNED_BY] = "gone"
    with pytest.raises(targets.TargetConflict):
        targets.check_ownership(gone_owner, owner=OWNER, policy="Owner",
                                himitsu_secret_exists=never_exists)


def test_a_merge_target_we_created_can_move_to_owner() -> None:
    created = written(make_spec(policy="Merge"))
    targets.check_ownership(created, owner=OWNER, policy="Owner",
                            himitsu_secret_exists=never_exists)


# --- Owner desired state ----------------------------------------------------------------


def test_owner_desired_secret_new() -> None:
    spec = make_spec(labels={"team": "a"}, annotations={"note": "n"})
    body = written(spec)
    meta = body["metadata"]
    assert body["data"] == RENDERED
    assert body["type"] == "Opaque"
    assert (meta["name"], meta["namespace"]) == ("app-secrets", "apps")
    assert meta["labels"] == {api.LABEL_MANAGED: "true",
                              api.LABEL_MANAGED_BY: api.MANAGED_BY_VALUE, "team": "a"}
    assert meta["annotations"] == {
        "note": "n",
        api.ANN_OWNED_BY: "app-config",
        api.ANN_OWNER_UID: "uid-1",
        api.ANN_CREATED_FOR: "uid-1",
        api.ANN_TEMPLATE_LABELS: "team",
        api.ANN_TEMPLATE_ANNOTATIONS: "note",
        api.ANN_CONFIG_VERSION: "5",
        api.ANN_PROJECT_ID: spec.project_id,
        api.ANN_ENVIRONMENT_ID: spec.environment_id,
        api.ANN_SOURCE: spec.source_hash(),
        api.ANN_DATA_HASH: data_hash(RENDERED),
        api.ANN_DATA_ID: "d1",
        api.ANN_DATA_ID_CHECK: api.data_id_check("d1", data_hash(RENDERED)),
    }
    assert meta["ownerReferences"] == [{
        "apiVersion": "himitsu.io/v1alpha1", "kind": "HimitsuSecret", "name": "app-config",
        "uid": "uid-1", "controller": True, "blockOwnerDeletion": True,
    }]


def test_owner_writes_exact_data_and_drops_keys_removed_upstream() -> None:
    spec = make_spec()
    before = written(spec, {"A": b64("1"), "GONE": b64("x")}, version=4)
    before["metadata"]["resourceVersion"] = "9"
    before["metadata"]["uid"] = "secret-uid"
    after = written(spec, {"A": b64("2")}, version=5, existing=before)
    assert after["data"] == {"A": b64("2")}
    # Built on the existing object, so the update is conditional on its version.
    assert after["metadata"]["resourceVersion"] == "9"
    assert after["metadata"]["uid"] == "secret-uid"
    assert api.ANN_MANAGED_KEYS not in after["metadata"]["annotations"]
    assert "stringData" not in after


def test_owner_reference_replaces_other_controllers_and_keeps_plain_references() -> None:
    spec = make_spec()
    existing = written(spec)
    existing["metadata"]["ownerReferences"] = [
        {"apiVersion": "v1", "kind": "ConfigMap", "name": "cm", "uid": "u"},
        {"apiVersion": "himitsu.io/v1alpha1", "kind": "HimitsuSecret", "name": "app-config",
         "uid": "old-uid", "controller": True},
    ]
    refs = written(spec, existing=existing)["metadata"]["ownerReferences"]
    assert [(r["kind"], r["uid"], r.get("controller")) for r in refs] == [
        ("ConfigMap", "u", None), ("HimitsuSecret", "uid-1", True)]


@pytest.mark.parametrize(("labels", "annotations"), [
    ({api.LABEL_MANAGED: "false"}, {}), ({api.LABEL_MANAGED_BY: api.MANAGED_BY_VALUE}, {}),
    ({}, {api.ANN_OWNED_BY: "someone"}), ({}, {api.ANN_CONFIG_VERSION: "1"}),
    # A token's binding: a Merge template could rebind (or block) another team's token.
    ({}, {api.ANN_ALLOWED_API_URLS: "https://evil.example.com"}),
    ({}, {api.ANN_ALLOWED_API_URLS: ""}), ({"x.himitsu.io/k": "v"}, {}),
])
def test_template_cannot_write_our_bookkeeping_or_a_binding(
    labels: dict[str, str], annotations: dict[str, str],
) -> None:
    with pytest.raises(api.InvalidSpec, match="is reserved"):
        make_spec(policy="Merge", labels=labels, annotations=annotations)


@pytest.mark.parametrize("policy", api.POLICIES)
@pytest.mark.parametrize("binding", ["https://himitsu.example.com", ""])
def test_a_token_secret_is_never_a_target(policy: str, binding: str) -> None:
    token = foreign_secret({"token": "himi_x"},
                           annotations={api.ANN_ALLOWED_API_URLS: binding})
    with pytest.raises(targets.TargetConflict, match="token Secret") as info:
        targets.check_ownership(token, owner=OWNER, policy=policy,
                                himitsu_secret_exists=never_exists)
    assert binding not in str(info.value) or not binding


# --- Merge desired state ----------------------------------------------------------------


def test_merge_into_foreign_secret() -> None:
    spec = make_spec(policy="Merge")
    helm = foreign_secret({"HELM_KEY": "h"}, labels={api.LABEL_MANAGED_BY: "Helm"},
                          annotations={"meta.helm.sh/release-name": "r"})
    body = written(spec, existing=helm)
    meta = body["metadata"]
    assert body["data"] == {"HELM_KEY": b64("h"), **RENDERED}
    assert "ownerReferences" not in meta
    assert meta["labels"] == {api.LABEL_MANAGED_BY: "Helm", api.LABEL_MANAGED: "true"}
    assert meta["annotations"]["meta.helm.sh/release-name"] == "r"
    assert meta["annotations"][api.ANN_MANAGED_KEYS] == "A,B"
    assert meta["annotations"][api.ANN_OWNED_BY] == "app-config"
    assert meta["resourceVersion"] == "7"


def test_merge_without_a_managed_by_label_does_not_add_one() -> None:
    body = written(make_spec(policy="Merge"), existing=foreign_secret({"X": "x"}))
    assert api.LABEL_MANAGED_BY not in body["metadata"]["labels"]


def test_merge_creates_a_missing_target_without_owner_reference() -> None:
    body = written(make_spec(policy="Merge"))
    assert body["data"] == RENDERED
    assert "ownerReferences" not in body["metadata"]
    assert body["metadata"]["labels"][api.LABEL_MANAGED_BY] == api.MANAGED_BY_VALUE
    assert body["metadata"]["annotations"][api.ANN_MANAGED_KEYS] == "A,B"


def test_merge_removes_our_stale_keys_and_keeps_foreign_ones() -> None:
    spec = make_spec(policy="Merge")
    first = written(spec, {"A": b64("1"), "STALE": b64("s")},
                    existing=foreign_secret({"HELM_KEY": "h"}))
    second = written(spec, {"A": b64("2")}, existing=first)
    assert second["data"] == {"HELM_KEY": b64("h"), "A": b64("2")}
    assert second["metadata"]["annotations"][api.ANN_MANAGED_KEYS] == "A"


def test_merge_collision_with_a_foreign_key_names_the_key_never_a_value() -> None:
    spec = make_spec(policy="Merge")
    existing = foreign_secret({"A": SECRET_VALUE, "K1": "x", "K2": "x", "K3": "x"})
    rendered = {"A": b64(SECRET_VALUE + "-new"), "B": b64("2")}
    with pytest.raises(targets.TargetConflict) as info:
        written(spec, rendered, existing=existing)
    message = str(info.value)
    assert "'A'" in message and "'app-secrets'" in message
    assert "'B'" not in message
    assert SECRET_VALUE not in message and b64(SECRET_VALUE) not in message
    # Several collisions: still one key, and no count. Whoever may create a HimitsuSecret
    # may not read this Secret; a list (or a count) would tell them its key names.
    many = {k: b64("v") for k in ("K1", "K2", "K3", "A")}
    with pytest.raises(targets.TargetConflict) as info:
        written(spec, many, existing=existing)
    message = str(info.value)
    assert sum(f"'{k}'" in message for k in ("K1", "K2", "K3", "A")) == 1
    assert "more" not in message and not any(c.isdigit() for c in message.split("'")[0])


def test_merge_keys_of_a_vanished_owner_are_kept_or_overwritten_never_removed() -> None:
    # Issue 21 item 1: the keys another writer recorded are not ours to remove; one of
    # the same name is overwritten and becomes ours.
    spec = make_spec(policy="Merge")
    theirs = targets.desired_secret(
        foreign_secret({"HELM_KEY": "h"}), owner=targets.Owner("apps", "gone", "u2"),
        spec=spec, rendered={"OLD": b64("o"), "A": b64("0")}, version=1, data_id="d1")
    body = written(spec, {"A": b64("1")}, existing=theirs)
    assert body["data"] == {"HELM_KEY": b64("h"), "OLD": b64("o"), "A": b64("1")}
    assert body["metadata"]["annotations"][api.ANN_MANAGED_KEYS] == "A"


def test_owner_target_moved_to_merge_keeps_its_keys_as_ours() -> None:
    owner_target = written(make_spec(), {"A": b64("1"), "OLD": b64("o")})
    body = written(make_spec(policy="Merge"), {"A": b64("2")}, existing=owner_target)
    assert body["data"] == {"A": b64("2")}
    assert body["metadata"]["annotations"][api.ANN_MANAGED_KEYS] == "A"
    # Merge sets no controller reference: the Secret now outlives the HimitsuSecret.
    assert "ownerReferences" not in body["metadata"]


def test_a_key_added_to_an_owner_target_before_its_first_merge_write_is_kept() -> None:
    # Switched to Merge, and another writer adds a key before the first Merge write
    # records our keys: the data no longer hashes to what we wrote, so only the keys we
    # write now are known to be ours; the added one is foreign and untouched.
    owner_target = written(make_spec(), {"A": b64("1"), "B": b64("2")})
    owner_target["data"]["theirs"] = b64("t")
    body = written(make_spec(policy="Merge"), {"A": b64("1"), "B": b64("2")},
                   existing=owner_target)
    assert body["data"] == {"A": b64("1"), "B": b64("2"), "theirs": b64("t")}
    assert body["metadata"]["annotations"][api.ANN_MANAGED_KEYS] == "A,B"


def test_a_merge_successor_overwrites_a_key_of_another_himitsu_secrets_owner_target() -> None:
    # Found by the model test ('settled'): the Owner writer moved on, and its keys, not
    # recorded in managed-keys, were refused as foreign (TargetConflict) instead of taken
    # over by name as a Merge predecessor's are.
    other = targets.Owner(namespace="apps", name="other", uid="uid-2")
    theirs = targets.desired_secret(None, owner=other, spec=make_spec(),
                                    rendered={"A": b64("0"), "OLD": b64("o")}, version=4,
                                    data_id="d0")
    theirs["metadata"]["annotations"][api.ANN_ALLOW_MERGE_BY] = "*"
    body = written(make_spec(policy="Merge"), {"A": b64("1")}, existing=theirs)
    assert body["data"] == {"A": b64("1"), "OLD": b64("o")}
    assert body["metadata"]["annotations"][api.ANN_MANAGED_KEYS] == "A"


def test_merge_keeps_other_owner_references() -> None:
    existing = foreign_secret({"X": "x"}, ownerReferences=[
        {"apiVersion": "apps/v1", "kind": "Deployment", "name": "d", "uid": "u"}])
    body = written(make_spec(policy="Merge"), existing=existing)
    assert body["metadata"]["ownerReferences"] == existing["metadata"]["ownerReferences"]


def test_merge_target_without_its_managed_keys_record_claims_nothing() -> None:
    # Someone deleted the managed-keys annotation: we can no longer tell our keys from
    # foreign ones, so every key is treated as foreign (a conflict, never a deletion).
    merged = written(make_spec(policy="Merge"), existing=foreign_secret({"HELM_KEY": "h"}))
    del merged["metadata"]["annotations"][api.ANN_MANAGED_KEYS]
    assert targets.our_previous_keys(merged, policy="Merge", owner=OWNER) == []
    with pytest.raises(targets.TargetConflict):
        written(make_spec(policy="Merge"), existing=merged)


# --- consistency: when a conditional request is safe -------------------------------------


@pytest.mark.parametrize("policy", api.POLICIES)
def test_what_we_wrote_is_consistent(policy: str) -> None:
    spec = make_spec(policy=policy)
    existing = foreign_secret({"HELM_KEY": "h"}) if policy == "Merge" else None
    body = written(spec, existing=existing)
    assert targets.is_consistent(body, owner=OWNER, spec=spec, version=5)


def _edit(body: dict[str, Any], path: str, value: Any) -> dict[str, Any]:
    out = copy.deepcopy(body)
    node = out
    *parents, last = path.split("|")
    for part in parents:
        node = node[int(part)] if isinstance(node, list) else node[part]
    if value is None:
        node.pop(last, None)
    else:
        node[last] = value
    return out


@pytest.mark.parametrize(
    ("name", "path", "value"),
    [
        ("no managed label", f"metadata|labels|{api.LABEL_MANAGED}", None),
        ("owned by another", f"metadata|annotations|{api.ANN_OWNED_BY}", "other"),
        ("version differs", f"metadata|annotations|{api.ANN_CONFIG_VERSION}", "4"),
        ("other source", f"metadata|annotations|{api.ANN_SOURCE}", "x"),
        ("no data hash", f"metadata|annotations|{api.ANN_DATA_HASH}", None),
        ("hand-edited value", "data|A", b64("edited")),
        ("deleted key", "data|A", None),
        ("added key", "data|EXTRA", b64("x")),
        ("other type", "type", "kubernetes.io/tls"),
        # What a GitOps prune or a hand edit of the metadata does: each is put back.
        ("no ownerReference", "metadata|ownerReferences", None),
        ("no controller flag", "metadata|ownerReferences|0|controller", None),
        ("another owner uid", "metadata|ownerReferences|0|uid", "uid-2"),
        ("no managed-by label", f"metadata|labels|{api.LABEL_MANAGED_BY}", None),
        ("no template label", "metadata|labels|team", None),
        ("edited template label", "metadata|labels|team", "b"),
        ("no template annotation", "metadata|annotations|note", None),
        ("no project annotation", f"metadata|annotations|{api.ANN_PROJECT_ID}", None),
        ("no environment annotation", f"metadata|annotations|{api.ANN_ENVIRONMENT_ID}", None),
        ("no owned-by", f"metadata|annotations|{api.ANN_OWNED_BY}", None),
    ],
)
def test_owner_target_inconsistent(name: str, path: str, value: Any) -> None:
    spec = make_spec(labels={"team": "a"}, annotations={"note": "n"})
    body = written(spec)
    assert targets.is_consistent(body, owner=OWNER, spec=spec, version=5)
    body = _edit(body, path, value)
    assert not targets.is_consistent(body, owner=OWNER, spec=spec, version=5), name


@pytest.mark.parametrize(("path", "value"), [
    (f"metadata|labels|{api.LABEL_MANAGED}", None),
    ("metadata|labels|team", None),
    ("metadata|annotations|note", None),
])
def test_merge_target_with_pruned_metadata_is_inconsistent(path: str, value: Any) -> None:
    spec = make_spec(policy="Merge", labels={"team": "a"}, annotations={"note": "n"})
    body = written(spec, existing=foreign_secret({"HELM_KEY": "h"}))
    assert targets.is_consistent(body, owner=OWNER, spec=spec, version=5)
    assert not targets.is_consistent(_edit(body, path, value), owner=OWNER, spec=spec,
                                     version=5)


def test_foreign_metadata_does_not_make_a_target_inconsistent() -> None:
    spec = make_spec(policy="Merge", labels={"team": "a"})
    body = written(spec, existing=foreign_secret({"HELM_KEY": "h"}))
    for path, value in [("metadata|labels|other", "x"), ("metadata|annotations|other", "y"),
                        ("metadata|ownerReferences", [{"kind": "ConfigMap", "uid": "u"}])]:
        assert targets.is_consistent(_edit(body, path, value), owner=OWNER, spec=spec,
                                     version=5), path


def test_missing_target_or_unknown_version_is_inconsistent() -> None:
    spec = make_spec()
    assert not targets.is_consistent(None, owner=OWNER, spec=spec, version=5)
    assert not targets.is_consistent(written(spec), owner=OWNER, spec=spec, version=None)
    assert not targets.is_consistent(written(spec), owner=OWNER, spec=spec, version=6)


def test_target_written_for_another_environment_is_inconsistent() -> None:
    old = make_spec(environment="33333333-3333-3333-3333-333333333333")
    assert not targets.is_consistent(written(old), owner=OWNER, spec=make_spec(), version=5)
    other_format = make_spec(fmt="Json")
    assert not targets.is_consistent(written(make_spec()), owner=OWNER, spec=other_format,
                                     version=5)


def test_merge_consistency_looks_at_our_keys_only() -> None:
    spec = make_spec(policy="Merge")
    body = written(spec, existing=foreign_secret({"HELM_KEY": "h"}))
    foreign_edit = _edit(body, "data|HELM_KEY", b64("changed"))
    assert targets.is_consistent(foreign_edit, owner=OWNER, spec=spec, version=5)
    foreign_added = _edit(body, "data|NEW_FOREIGN", b64("x"))
    assert targets.is_consistent(foreign_added, owner=OWNER, spec=spec, version=5)
    for ours in (_edit(body, "data|A", b64("edited")), _edit(body, "data|B", None)):
        assert not targets.is_consistent(ours, owner=OWNER, spec=spec, version=5)


def test_same_content() -> None:
    spec = make_spec()
    body = written(spec)
    assert targets.same_content(body, copy.deepcopy(body))
    assert targets.same_content(_edit(body, "metadata|resourceVersion", "99"), body)
    for path, value in [("data|A", b64("x")), ("metadata|labels|x", "y"),
                        ("metadata|annotations|x", "y"), ("metadata|ownerReferences", [])]:
        assert not targets.same_content(_edit(body, path, value), body), path


def test_managed_keys_parsing() -> None:
    secret = {"metadata": {"annotations": {api.ANN_MANAGED_KEYS: "B,A,,A"}}}
    assert targets.managed_keys(secret) == ["A", "B"]
    assert targets.managed_keys(None) == []
    # no owned-by: not ours
    assert targets.our_previous_keys(secret, policy="Merge", owner=OWNER) == []


def test_a_rewrite_keeps_the_data_id_check_so_an_id_edited_by_hand_stays_told_apart() -> None:
    """The check is written with each new id only: a rewrite of the same bytes (a repair of
    the labels, say) must not bind an id edited by hand to the data (issue 22)."""
    spec = make_spec()
    first = written(spec)
    first["metadata"]["annotations"][api.ANN_DATA_ID] = "edited"
    again = targets.desired_secret(first, owner=OWNER, spec=spec, rendered=RENDERED,
                                   version=5, data_id="edited")
    check = again["metadata"]["annotations"][api.ANN_DATA_ID_CHECK]
    assert check == api.data_id_check("d1", data_hash(RENDERED)) != api.data_id_check(
        "edited", data_hash(RENDERED))
    fresh = targets.desired_secret(first, owner=OWNER, spec=spec, rendered=RENDERED,
                                   version=6, data_id="d2")
    assert fresh["metadata"]["annotations"][api.ANN_DATA_ID_CHECK] == api.data_id_check(
        "d2", data_hash(RENDERED))


def test_a_key_added_to_another_himitsu_secret_s_owner_target_is_never_overwritten_by_merge(
) -> None:
    """Its data hash no longer holds: which key was added cannot be told, so none counts
    as the predecessor's and the Merge write is refused rather than touch the owner's key."""
    other = targets.Owner(namespace="apps", name="other", uid="uid-2")
    theirs = targets.desired_secret(None, owner=other, spec=make_spec(),
                                    rendered={"A": b64("0")}, version=4, data_id="d0")
    theirs["data"]["USERKEY"] = b64("precious")
    theirs["metadata"]["annotations"][api.ANN_ALLOW_MERGE_BY] = "*"
    with pytest.raises(targets.TargetConflict):
        written(make_spec(policy="Merge"), {"A": b64("1"), "USERKEY": b64("himitsu")},
                existing=theirs)
