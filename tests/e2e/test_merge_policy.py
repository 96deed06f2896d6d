"""creationPolicy Merge: our keys go into someone else's Secret; theirs are never touched."""

from __future__ import annotations

import pytest

from .harness import Harness, Sync
from .kubehelp import KubeApi, decoded, hsec_path, wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.usefixtures("default_operator")]

HELM = {"app.kubernetes.io/managed-by": "Helm"}
# The foreign Secret's consent to a Merge by the HimitsuSecret ``app`` (issue 27).
CONSENT = {"himitsu.io/allow-merge-by": "app"}


def _merged(h: Harness, ns: str, *keys: str) -> tuple[Sync, dict[str, str]]:
    """A Helm-style Secret with foreign keys, and a Merge HimitsuSecret synced into it."""
    foreign = h.canary.values("HELM_VALUE", "CHART_PASSWORD")
    h.secret(ns, "app-secrets", foreign, labels=dict(HELM), annotations=dict(CONSENT))
    sync = h.sync(ns, *keys, target="app-secrets", policy="Merge")
    h.wait_data(ns, "app-secrets", {**foreign, **sync.values})
    return sync, foreign


def test_merge_keeps_foreign_keys_and_a_foreign_managed_by_label(h: Harness, ns: str,
                                                                kube: KubeApi) -> None:
    sync, _foreign = _merged(h, ns, "API_KEY", "DB_PASSWORD")

    secret = kube.secret(ns, "app-secrets")
    assert secret is not None
    meta = secret["metadata"]
    assert meta["labels"]["app.kubernetes.io/managed-by"] == "Helm"
    assert meta["labels"]["himitsu.io/managed"] == "true"
    assert not meta.get("ownerReferences"), "a Merge target must not be owned"
    assert sorted(meta["annotations"]["himitsu.io/managed-keys"].split(",")) == sorted(
        sync.values)


def test_merge_removes_stale_managed_keys_only(h: Harness, ns: str) -> None:
    sync, foreign = _merged(h, ns, "API_KEY", "OLD_FLAG")

    h.standin.delete_secret(sync.env, "OLD_FLAG")

    h.wait_data(ns, "app-secrets", {**foreign, "API_KEY": sync.values["API_KEY"]}, timeout=30)


def test_merge_target_outlives_the_himitsu_secret(h: Harness, ns: str, kube: KubeApi) -> None:
    sync, foreign = _merged(h, ns, "API_KEY")
    owner = h.get_hsec(ns, sync.name)
    # A sentinel the garbage collector must delete with the HimitsuSecret: once it is
    # gone, the collector has acted on this owner, and the target must still be there.
    h.kube.create(f"/api/v1/namespaces/{ns}/secrets", {
        "apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": "gc-sentinel", "ownerReferences": [{
            "apiVersion": "himitsu.io/v1alpha1", "kind": "HimitsuSecret",
            "name": sync.name, "uid": owner["metadata"]["uid"]}]},
    })

    kube.delete(hsec_path(ns, sync.name))

    wait_for(lambda: kube.secret(ns, "gc-sentinel") is None, timeout=60,
             what="the garbage collector to delete the sentinel")
    target = kube.secret(ns, "app-secrets")
    assert target is not None, "the Merge target was deleted with its HimitsuSecret"
    assert decoded(target) == {**foreign, **sync.values}


def test_a_merge_target_that_would_outgrow_1_mib_is_invalid_spec_and_untouched(
    h: Harness, ns: str, kube: KubeApi,
) -> None:
    # The foreign keys alone are just under the limit; ours would tip it over.
    foreign = {"BUNDLE": h.canary.padded_value("bundle", 1024 * 1024 - 16)}
    before = h.secret(ns, "app-secrets", foreign, labels=dict(HELM),
                      annotations=dict(CONSENT))

    sync = h.sync(ns, "API_KEY", "DB_PASSWORD", target="app-secrets", policy="Merge",
                  wait=False)

    obj = h.wait_ready(ns, sync.name, reason="InvalidSpec", message_has="1048576 bytes")
    message = obj["status"]["conditions"][0]["message"]
    # Our size and that foreign keys count, never their size (a length oracle for values
    # the HimitsuSecret's author may not read).
    assert "the keys himitsu-operator does not manage count too" in message
    assert str(1024 * 1024 - 16) not in message
    assert kube.secret(ns, "app-secrets") == before
