"""A target that no longer holds what was written is repaired at once, with full data.

refreshInterval is an hour in these tests, so nothing but the drift (a watch event on
the target, a spec change, a force-sync) makes the operator act. A conditional request
answered 304 cannot repair anything, so a repaired target proves the operator did not
trust its recorded version once the target stopped matching it. (The operator may
serve that full data from its shared poll cache, validated by a 304 for the version the
cache holds, so the stand-in is not required to see an unconditional request here; it
is where no cache can apply: a different environment, and a force-sync.)
"""

from __future__ import annotations

import base64
from typing import Any

import pytest

from himitsu_controller.sync.polling import schedule

from .harness import Harness, Sync
from .kubehelp import KubeApi, hsec_path, kubectl, secret_path, wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.usefixtures("default_operator")]

REPAIR_TIMEOUT = 30.0


def _settled(h: Harness, ns: str, *, policy: str | None = None) -> Sync:
    """A synced HimitsuSecret that will not poll on its own during the test."""
    sync = h.sync(ns, "API_KEY", "DB_PASSWORD", refresh="1h", policy=policy)
    h.wait_data(ns, sync.target, sync.values)
    return sync


def _version_annotation(kube: KubeApi, ns: str, name: str) -> str | None:
    secret = kube.secret(ns, name)
    return None if secret is None else secret["metadata"]["annotations"].get(
        "himitsu.io/config-version")


@pytest.mark.parametrize("policy", ["Owner", "Merge"])
def test_deleted_target_is_restored(h: Harness, ns: str, kube: KubeApi, policy: str) -> None:
    sync = _settled(h, ns, policy=policy)
    old_uid = kube.secret(ns, sync.target)["metadata"]["uid"]  # type: ignore[index]

    kube.delete(secret_path(ns, sync.target))

    restored = h.wait_data(ns, sync.target, sync.values, timeout=REPAIR_TIMEOUT)
    assert restored["metadata"]["uid"] != old_uid
    version = str(h.standin.info(sync.env)["configVersion"])
    assert restored["metadata"]["annotations"]["himitsu.io/config-version"] == version
    h.wait_ready(ns, sync.name)


def test_a_target_deleted_after_a_change_comes_back_with_the_new_value(
        h: Harness, ns: str, kube: KubeApi) -> None:
    # Deleting a Secret to pick up a change: the repair holds Himitsu's current data,
    # not the answer the target held (refreshInterval is an hour: no poll helps here).
    sync = _settled(h, ns)
    h.wait_answers_older_than(sync.env, schedule.FRESH)  # no answer young enough to share
    changed = {**sync.values, "API_KEY": h.canary.value("rotated")}
    h.standin.set_secrets(sync.env, {"API_KEY": changed["API_KEY"]})
    mark = h.standin.mark(sync.env)

    kube.delete(secret_path(ns, sync.target))

    h.wait_data(ns, sync.target, changed, timeout=REPAIR_TIMEOUT)
    # asked conditionally, at the version the operator held: the change came as a 200
    assert [r["status"] for r in h.standin.requests_after(sync.env, mark)][:1] == [200]
    assert h.standin.full_fetches(sync.env, after=mark) == []


def test_a_target_deleted_while_himitsu_fails_comes_back_from_memory_at_once(
        h: Harness, ns: str, kube: KubeApi) -> None:
    # No failure ever leaves a Secret missing that the operator can rebuild: its memory
    # holds this source's data, so the repair writes it now and asks Himitsu again later.
    sync = _settled(h, ns)
    h.wait_answers_older_than(sync.env, schedule.FRESH)  # the repair must revalidate
    fault = h.standin.fault("error", env=sync.env, status=503)
    try:
        kube.delete(secret_path(ns, sync.target))
        h.wait_data(ns, sync.target, sync.values, timeout=REPAIR_TIMEOUT)
        h.wait_ready(ns, sync.name)
    finally:
        h.standin.clear_faults(fault)


def test_edited_config_version_annotation_is_repaired_by_a_full_sync(h: Harness, ns: str,
                                                                    kube: KubeApi) -> None:
    sync = _settled(h, ns)
    version = str(h.standin.info(sync.env)["configVersion"])

    kube.merge_patch(secret_path(ns, sync.target),
                     {"metadata": {"annotations": {"himitsu.io/config-version": "999999"}}})

    wait_for(lambda: _version_annotation(kube, ns, sync.target) == version,
             timeout=REPAIR_TIMEOUT, what=f"config-version annotation back at {version}")
    assert h.data(ns, sync.target) == sync.values


def test_data_edited_by_hand_is_restored(h: Harness, ns: str, kube: KubeApi) -> None:
    sync = _settled(h, ns)
    tampered = base64.b64encode(h.canary.value("tampered").encode()).decode()

    kube.merge_patch(secret_path(ns, sync.target), {"data": {"API_KEY": tampered}})

    h.wait_data(ns, sync.target, sync.values, timeout=REPAIR_TIMEOUT)


def test_spec_pointed_at_another_environment_fetches_the_new_data(h: Harness, ns: str,
                                                                 kube: KubeApi) -> None:
    env, values = h.environment("API_KEY", "DB_PASSWORD")
    other_values = h.canary.values("API_KEY", "QUEUE_URL", "SMTP_PASSWORD")
    other = h.standin.new_environment(other_values, project=env.project)
    h.token_secret(ns, h.token_for(env, project_only=True))
    h.hsec(ns, "app", env, target="app-secrets", refresh="1h")
    h.wait_data(ns, "app-secrets", values)
    h.wait_ready(ns, "app")

    kube.merge_patch(hsec_path(ns, "app"), {"spec": {"environmentId": other.environment}})

    h.wait_data(ns, "app-secrets", other_values, timeout=REPAIR_TIMEOUT)
    first = h.standin.requests(other)[0]
    assert (first["status"], first["if_none_match"]) == (200, None), \
        "a version of one environment was sent to another"
    obj = h.wait_ready(ns, "app")
    wait_for(lambda: h.get_hsec(ns, "app")["status"]["secretCount"] == 3, timeout=30,
             what="status.secretCount 3")
    assert obj["status"]["observedGeneration"] == obj["metadata"]["generation"]


def test_force_sync_annotation_asks_himitsu_at_once(h: Harness, ns: str, kube: KubeApi) -> None:
    sync = _settled(h, ns)
    # Changed upstream: with an hour's refreshInterval only a force-sync brings it now.
    changed = {**sync.values, "API_KEY": h.canary.value("rotated")}
    h.standin.set_secrets(sync.env, {"API_KEY": changed["API_KEY"]})
    mark = h.standin.mark(sync.env)

    kubectl(kube.kubeconfig, "-n", ns, "annotate", "hsec", sync.name,
            "himitsu.io/force-sync=first", "--overwrite")

    h.wait_data(ns, sync.target, changed, timeout=REPAIR_TIMEOUT)
    assert [r["status"] for r in h.standin.requests_after(sync.env, mark)][:1] == [200]
    wait_for(lambda: h.get_hsec(ns, sync.name)["status"].get("lastForceSync") == "first",
             timeout=REPAIR_TIMEOUT, what="status.lastForceSync 'first'")


def _ready_since(h: Harness, ns: str, name: str) -> str:
    condition = h.get_hsec(ns, name)["status"]["conditions"][0]
    assert (condition["status"], condition["reason"]) == ("True", "Synced")
    return str(condition["lastTransitionTime"])


def test_a_target_pruned_by_a_gitops_tool_is_relabelled_and_stays_ready(
    h: Harness, ns: str, kube: KubeApi,
) -> None:
    # A prune drops every label and annotation the tool's manifests lack, ours included;
    # the ownerReference stays. Without our label the informer no longer sees the target.
    sync = _settled(h, ns)
    before = kube.secret(ns, sync.target)
    assert before is not None
    since = _ready_since(h, ns, sync.name)
    meta = before["metadata"]
    kube.merge_patch(secret_path(ns, sync.target), {"metadata": {
        "labels": dict.fromkeys(meta["labels"]),
        "annotations": dict.fromkeys(meta["annotations"])}})

    def relabelled() -> dict[str, Any] | None:
        secret = kube.secret(ns, sync.target)
        labels = (secret or {}).get("metadata", {}).get("labels") or {}
        return secret if labels.get("himitsu.io/managed") == "true" else None

    after = wait_for(relabelled, timeout=REPAIR_TIMEOUT, what="the himitsu.io labels back")
    assert after["metadata"]["uid"] == meta["uid"], "recreated instead of relabelled"
    assert after["metadata"]["labels"] == meta["labels"]
    assert after["metadata"]["annotations"] == meta["annotations"]
    assert after["data"] == before["data"]
    assert _ready_since(h, ns, sync.name) == since, "Ready left True"
    assert not [e for e in h.events(ns, sync.name) if e["type"] == "Warning"]


def test_a_removed_owner_reference_is_put_back(h: Harness, ns: str, kube: KubeApi) -> None:
    # Without it the Secret would outlive its HimitsuSecret (no garbage collection).
    sync = _settled(h, ns)
    owner_uid = h.get_hsec(ns, sync.name)["metadata"]["uid"]
    since = _ready_since(h, ns, sync.name)

    kube.merge_patch(secret_path(ns, sync.target), {"metadata": {"ownerReferences": None}})

    def owned() -> list[dict[str, Any]] | None:
        refs = ((kube.secret(ns, sync.target) or {}).get("metadata") or {}).get(
            "ownerReferences") or []
        return refs or None

    refs = wait_for(owned, timeout=REPAIR_TIMEOUT, what="the ownerReference back")
    assert [(r["uid"], r.get("controller")) for r in refs] == [(owner_uid, True)]
    assert h.data(ns, sync.target) == sync.values
    assert _ready_since(h, ns, sync.name) == since
