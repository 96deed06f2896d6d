"""`helm uninstall` on kind keeps every HimitsuSecret and every Secret it synced.

The release kind.sh installed (``E2E_HELM_RELEASE``) is uninstalled: the operator goes,
the CRD stays (Helm never deletes crds/), and with it every HimitsuSecret and, since
their owner stays, every Owner target Secret; a Merge target is never owned anyway. The
same values are then installed again, and the new operator takes the objects over: a
change in Himitsu reaches the Secret. (Kind only: `make e2e-kind`.)
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from .harness import Harness
from .kind import CHART, HELM_RELEASE, OPERATOR_NAMESPACE, helm
from .kubehelp import KubeApi, hsec_path, secret_path, wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.kind_only,
              pytest.mark.skipif(not HELM_RELEASE, reason="the operator was not installed "
                                 "with the chart (E2E_HELM_RELEASE unset)")]

CRD = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/himitsusecrets.himitsu.io"
DEPLOYMENT = f"/apis/apps/v1/namespaces/{OPERATOR_NAMESPACE}/deployments/himitsu-operator"
TIMEOUT = 240.0  # pods stopped and started on a busy 2-core node, not a performance figure


def _state(kube: KubeApi, paths: list[str]) -> dict[str, Any]:
    return {p: kube.get(p) for p in paths}


def _same(kube: KubeApi, before: dict[str, Any]) -> None:
    assert "deletionTimestamp" not in kube.get(CRD)["metadata"], "the CRD is being deleted"
    for path, old in before.items():
        now = kube.get(path)
        assert "deletionTimestamp" not in now["metadata"], path
        assert now["metadata"]["uid"] == old["metadata"]["uid"], path
        assert now.get("data") == old.get("data"), path


@pytest.mark.usefixtures("default_operator")
def test_helm_uninstall_keeps_every_himitsusecret_and_secret_and_a_reinstall_takes_over(
        h: Harness, ns: str, kube: KubeApi, tmp_path: Path) -> None:
    owned = h.sync(ns, "API_KEY", name="owned", target="owned-secrets", refresh="2s",
                   auth_name="owned-token")
    merged = h.sync(ns, "DB_PASSWORD", name="merged", target="merged-secrets", refresh="2s",
                    auth_name="merged-token",
                    policy="Merge")
    h.wait_data(ns, owned.target, owned.values)
    h.wait_data(ns, merged.target, merged.values)
    before = _state(kube, [hsec_path(ns, "owned"), hsec_path(ns, "merged"),
                           secret_path(ns, owned.target), secret_path(ns, merged.target)])
    values = tmp_path / "values.yaml"
    values.write_text(helm(kube.kubeconfig, "get", "values", HELM_RELEASE, "-o", "yaml").stdout)

    helm(kube.kubeconfig, "uninstall", HELM_RELEASE, "--wait", "--timeout", f"{TIMEOUT:.0f}s")
    try:
        wait_for(lambda: kube.get_or_none(DEPLOYMENT) is None, timeout=TIMEOUT,
                 what="the operator's Deployment gone")
        _same(kube, before)
    finally:
        helm(kube.kubeconfig, "install", HELM_RELEASE, str(CHART), "-f", str(values),
             "--wait", "--timeout", f"{TIMEOUT:.0f}s", timeout=TIMEOUT + 60)
    _same(kube, before)
    changed = {"API_KEY": h.canary.value("after-reinstall")}
    h.standin.set_secrets(owned.env, changed)
    h.wait_data(ns, owned.target, changed, timeout=TIMEOUT)
