"""--namespace mode runs on the namespaced Role alone and ignores every other namespace."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from . import cluster_setup
from .harness import Harness
from .kubehelp import KubeApi, wait_for
from .operator_proc import OperatorLauncher

pytestmark = [pytest.mark.e2e]

NAMESPACED_SA = "himitsu-operator-namespaced"
SENTINEL_POLLS = 3


def test_namespace_mode_with_only_a_role_syncs_there_and_ignores_other_namespaces(
        h: Harness, kube: KubeApi, operator: OperatorLauncher,
        make_ns: Callable[[str], str], session_dir: Path) -> None:
    watched, other = make_ns("watched"), make_ns("other")
    cluster_setup.add_namespaced_service_account(kube, NAMESPACED_SA, watched)
    kubeconfig = cluster_setup.service_account_kubeconfig(
        kube, NAMESPACED_SA, session_dir / f"{NAMESPACED_SA}.kubeconfig")
    operator.start("--namespace", watched, name="namespaced", kubeconfig=str(kubeconfig))

    ignored = h.sync(other, "API_KEY", wait=False)
    synced = h.sync(watched, "API_KEY", "DB_PASSWORD", refresh="1s")
    h.wait_data(watched, synced.target, synced.values)
    mark = h.standin.mark(synced.env)
    wait_for(lambda: h.standin.count(synced.env, after=mark) >= SENTINEL_POLLS, timeout=30,
             what=f"{SENTINEL_POLLS} polls in the watched namespace")

    assert h.standin.requests(ignored.env) == []
    assert kube.secret(other, ignored.target) is None
    assert not h.get_hsec(other, ignored.name).get("status")
