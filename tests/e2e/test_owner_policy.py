"""creationPolicy Owner: the operator is the target's sole author, and never adopts."""

from __future__ import annotations

import pytest

from .harness import Harness
from .kubehelp import KubeApi, hsec_path, rv, wait_for

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
