"""Two HimitsuSecrets naming one target: the incumbent keeps it, the loser waits its turn."""

from __future__ import annotations

import pytest

from .harness import Harness
from .kubehelp import KubeApi, hsec_path, rv

pytestmark = [pytest.mark.e2e, pytest.mark.usefixtures("default_operator")]


def test_second_himitsu_secret_on_a_target_conflicts_and_takes_over_when_freed(
        h: Harness, ns: str, kube: KubeApi) -> None:
    first = h.sync(ns, "API_KEY", name="first", target="shared")
    incumbent = h.wait_data(ns, "shared", first.values)

    env, values = h.environment("API_KEY", "OTHER_KEY")
    h.token_secret(ns, h.token_for(env), name="second-token")
    h.hsec(ns, "second", env, target="shared", auth_name="second-token")

    obj = h.wait_ready(ns, "second", reason="TargetConflict")
    assert "first" in obj["status"]["conditions"][0]["message"]
    assert rv(kube.secret(ns, "shared")) == rv(incumbent), "the incumbent's target changed"
    h.wait_ready(ns, "first")

    kube.delete(hsec_path(ns, "first"))

    h.wait_data(ns, "shared", values, timeout=60)
    h.wait_ready(ns, "second", timeout=60)
    secret = kube.secret(ns, "shared")
    assert secret is not None
    assert secret["metadata"]["annotations"]["himitsu.io/owned-by"] == "second"
    owners = [r["name"] for r in secret["metadata"]["ownerReferences"] if r.get("controller")]
    assert owners == ["second"]
