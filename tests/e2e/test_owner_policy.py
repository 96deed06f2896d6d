"""creationPolicy Owner: the operator is the target's sole author, and never adopts."""

from __future__ import annotations

from typing import Any

import pytest

from .harness import Harness
from .kubehelp import KubeApi, decoded, hsec_path, rv, wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.usefixtures("default_operator")]

GC_TIMEOUT = 60.0  # the garbage collector's informers are not ours to hurry


def test_deleting_the_himitsu_secret_garbage_collects_the_secret(h: Harness, ns: str,
                                                                kube: KubeApi) -> None:
    sync = h.sync(ns, "API_KEY")
    h.wait_data(ns, sync.target, sync.values)

    kube.delete(hsec_path(ns, sync.name))

    wait_for(lambda: kube.secret(ns, sync.target) is None, timeout=GC_TIMEOUT,
             what="the garbage collector to delete the Owner target")


def test_key_removed_upstream_disappears_from_the_secret(h: Harness, ns: str) -> None:
    sync = h.sync(ns, "API_KEY", "OLD_FLAG", refresh="2s")
    h.wait_data(ns, sync.target, sync.values)

    h.standin.delete_secret(sync.env, "OLD_FLAG")

    h.wait_data(ns, sync.target, {"API_KEY": sync.values["API_KEY"]}, timeout=30)
    wait_for(lambda: h.get_hsec(ns, sync.name)["status"]["secretCount"] == 1, timeout=30,
             what="status.secretCount 1")


def test_pre_existing_foreign_secret_is_refused_and_left_untouched(h: Harness, ns: str,
                                                                  kube: KubeApi) -> None:
    foreign = h.secret(ns, "app-secrets", h.canary.values("PASSWORD", "USERNAME"),
                       labels={"app.kubernetes.io/managed-by": "Helm"},
                       annotations={"meta.helm.sh/release-name": "app"})

    sync = h.sync(ns, "API_KEY", target="app-secrets", wait=False)

    obj = h.wait_ready(ns, sync.name, reason="TargetConflict")
    assert "app-secrets" in obj["status"]["conditions"][0]["message"]
    after = kube.secret(ns, "app-secrets")
    assert after == foreign, "the foreign Secret was modified"
    assert rv(after) == rv(foreign)
    wait_for(lambda: any(e["reason"] == "TargetConflict" and e["type"] == "Warning"
                         for e in h.events(ns, sync.name)),
             timeout=30, what="a Warning TargetConflict Event")


def test_a_type_the_data_cannot_satisfy_keeps_the_secret_byte_for_byte(
    h: Harness, ns: str, kube: KubeApi,
) -> None:
    # KeyValue writes TLS_CRT / TLS_KEY as they are: no tls.crt, which kubernetes.io/tls
    # requires. Deleting first would leave the application without its Secret.
    sync = h.sync(ns, "TLS_CRT", "TLS_KEY")
    h.wait_data(ns, sync.target, sync.values)
    before = kube.secret(ns, sync.target)

    kube.merge_patch(hsec_path(ns, sync.name), {"spec": {"target": {"type": "kubernetes.io/tls"}}})

    obj = h.wait_ready(ns, sync.name, reason="InvalidSpec", message_has="'tls.crt'")
    message = obj["status"]["conditions"][0]["message"]
    assert "'tls.key'" in message and "'TLS_CRT'" in message
    assert kube.secret(ns, sync.target) == before, "the working Secret was touched"
    wait_for(lambda: any(e["reason"] == "InvalidSpec" and e["type"] == "Warning"
                         for e in h.events(ns, sync.name)),
             timeout=30, what="a Warning InvalidSpec Event")
    assert kube.secret(ns, sync.target) == before


def test_a_type_the_data_satisfies_replaces_the_secret(h: Harness, ns: str,
                                                       kube: KubeApi) -> None:
    sync = h.sync(ns, "tls.crt", "tls.key")
    before = h.wait_data(ns, sync.target, sync.values)
    assert before["type"] == "Opaque"

    kube.merge_patch(hsec_path(ns, sync.name), {"spec": {"target": {"type": "kubernetes.io/tls"}}})

    def replaced() -> dict[str, Any] | None:
        secret = kube.secret(ns, sync.target)
        return secret if secret is not None and secret["type"] == "kubernetes.io/tls" else None

    after = wait_for(replaced, timeout=30, what="the target replaced with type kubernetes.io/tls")
    assert after["metadata"]["uid"] != before["metadata"]["uid"]
    assert decoded(after) == sync.values
    owner = h.get_hsec(ns, sync.name)
    assert [r["uid"] for r in after["metadata"]["ownerReferences"]] == [owner["metadata"]["uid"]]
    h.wait_ready(ns, sync.name)
