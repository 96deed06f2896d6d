"""Fixtures of the e2e suite: a cluster, the operator's identity, the stand-in, operators.

Two ways to run:
* local (default): a control plane (etcd, kube-apiserver with its audit log,
  kube-controller-manager) from hack/localcluster.py in a temporary directory, the
  Himitsu stand-in in this process on 127.0.0.1, and operators started as processes
  authenticated as the ``himitsu-system/himitsu-operator`` ServiceAccount;
* kind (``E2E_KUBECONFIG`` set, see hack/kind/kind.sh): the cluster, the in-cluster
  operator and the stand-in Pod are already there; tests marked ``local_only`` and tests
  that need their own operator flags are skipped.

Every value and token comes from the session's canary generator, and at session end the
operator logs, every Event and every HimitsuSecret status of the test namespaces
(collected before each namespace is deleted) are searched for them: a leak fails the run.
"""

from __future__ import annotations

import json
import os
import re
import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from himitsu_standin import StandIn
from localcluster import LocalCluster, ensure_binaries

from . import cluster_setup, kind
from .canary import Canary, LeakEvidence
from .cluster_setup import Cluster
from .harness import Harness
from .kubehelp import REPO, KubeApi
from .operator_proc import OperatorLauncher, OperatorProcess
from .standin_client import StandinClient

KIND_KUBECONFIG = os.environ.get("E2E_KUBECONFIG") or None
# E2E_KUBE_BIN_DIR: use control-plane binaries from elsewhere (e.g. a copy that a
# concurrent rebuild cannot touch); default hack/kube/bin, built on demand.
BIN_DIR = Path(os.environ.get("E2E_KUBE_BIN_DIR") or REPO / "hack" / "kube" / "bin")
# Generous stand-in limits: rate limiting is not what this suite is about, and every
# operator of the session shares one client IP.
STANDIN_LIMIT = 1_000_000


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for item in items:
        if here not in Path(str(item.fspath)).parents:
            continue
        if item.get_closest_marker("e2e") is None:
            raise pytest.UsageError(f"{item.nodeid}: every e2e test carries the e2e marker")
        if KIND_KUBECONFIG and item.get_closest_marker("local_only"):
            item.add_marker(pytest.mark.skip(reason="kills or restarts operator processes: "
                                                    "local control plane only"))
        if not KIND_KUBECONFIG and item.get_closest_marker("kind_only"):
            item.add_marker(pytest.mark.skip(reason="needs the in-cluster Deployment: "
                                                    "make e2e-kind"))


# -- evidence for the canary check -----------------------------------------------------------
@pytest.fixture(scope="session")
def canary() -> Canary:
    return Canary()


@pytest.fixture(scope="session")
def session_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("e2e")


@pytest.fixture(scope="session")
def leak_evidence() -> LeakEvidence:
    return LeakEvidence()


@pytest.fixture(scope="session", autouse=True)
def canary_check(request: pytest.FixtureRequest, canary: Canary,
                 leak_evidence: LeakEvidence, kube: KubeApi,
                 session_dir: Path) -> Iterator[None]:
    """At session end: no canary in operator logs, Events or HimitsuSecret statuses."""
    yield
    if not canary.issued and not any("h" in getattr(item, "fixturenames", ())
                                     for item in request.session.items):
        return  # no test ran the operator (the image's contents alone): nothing to scan
    if KIND_KUBECONFIG:
        logs = kind.operator_logs(kube, session_dir)
        assert logs, "could not read the in-cluster operator's logs for the canary check"
        leak_evidence.texts.append(("in-cluster operator logs", logs))
    for namespace in ("default", cluster_setup.OPERATOR_NAMESPACE):
        events = kube.get(f"/api/v1/namespaces/{namespace}/events")["items"]
        leak_evidence.texts.append((f"events in {namespace}", json.dumps(events)))
    assert canary.issued, "no canary values were issued: the check would prove nothing"
    leaks = leak_evidence.scan(canary)
    assert not leaks, "secret material leaked:\n" + "\n".join(leaks[:20])


# -- the cluster ------------------------------------------------------------------------------
@pytest.fixture(scope="session")
def cluster(session_dir: Path) -> Iterator[Cluster]:
    if KIND_KUBECONFIG:
        yield Cluster(kubeconfig=KIND_KUBECONFIG, on_kind=True)
        return
    # Builds hack/kube/bin with hack/kube/build.sh when a binary is missing (cached).
    local = LocalCluster(session_dir / "cluster", bin_dir=ensure_binaries(BIN_DIR), audit=True)
    try:
        local.start()
        local.wait_ready()
        yield Cluster(kubeconfig=str(local.kubeconfig_path), on_kind=False,
                      audit_log_path=local.audit_log_path, local=local)
    finally:
        local.stop()


@pytest.fixture(scope="session")
def kube(cluster: Cluster) -> KubeApi:
    """Admin access for the tests themselves."""
    return KubeApi(cluster.kubeconfig)


@pytest.fixture(scope="session")
def operator_kubeconfig(cluster: Cluster, kube: KubeApi, session_dir: Path) -> str:
    """CRD and RBAC installed; a kubeconfig for the himitsu-operator ServiceAccount."""
    if cluster.on_kind:
        return ""  # the in-cluster operator has its own ServiceAccount token
    cluster_setup.install_crd(kube)
    cluster_setup.install_rbac(kube)
    path = session_dir / "operator.kubeconfig"
    return str(cluster_setup.service_account_kubeconfig(kube, cluster_setup.OPERATOR_SA, path))


# -- the Himitsu stand-in ----------------------------------------------------------------------
@pytest.fixture(scope="session")
def standin(cluster: Cluster, session_dir: Path) -> Iterator[StandinClient]:
    if cluster.on_kind:
        forward = kind.standin_forward(cluster.kubeconfig, session_dir)
        client = StandinClient(api_url=kind.standin_service_url(), control_url=forward.url)
        try:
            yield client
        finally:
            client.close()
            forward.stop()
        return
    server = StandIn("127.0.0.1", 0, per_key_limit=STANDIN_LIMIT, per_ip_limit=STANDIN_LIMIT)
    server.start()
    client = StandinClient(api_url=server.url, control_url=server.url)
    try:
        assert client.healthy(), "the stand-in does not answer its control API"
        yield client
    finally:
        client.close()
        server.stop()


@pytest.fixture(scope="session")
def h(kube: KubeApi, standin: StandinClient, canary: Canary,
      operator_kubeconfig: str) -> Harness:
    """Test helpers (environment, token Secret, HimitsuSecret, waits); CRD installed."""
    return Harness(kube, standin, canary)


# -- operators --------------------------------------------------------------------------------
def _launcher(cluster: Cluster, kube: KubeApi, kubeconfig: str, session_dir: Path,
              evidence: LeakEvidence) -> OperatorLauncher | kind.KindLauncher:
    if cluster.on_kind:
        return kind.KindLauncher(kube, session_dir)
    return OperatorLauncher(kubeconfig=kubeconfig, log_dir=session_dir,
                            on_log=evidence.logs.append)


@pytest.fixture(scope="module")
def module_launcher(cluster: Cluster, kube: KubeApi, operator_kubeconfig: str,
                    session_dir: Path, leak_evidence: LeakEvidence,
                    ) -> Iterator[OperatorLauncher | kind.KindLauncher]:
    launcher = _launcher(cluster, kube, operator_kubeconfig, session_dir, leak_evidence)
    yield launcher
    launcher.stop_all()


@pytest.fixture(scope="module")
def default_operator(module_launcher: OperatorLauncher | kind.KindLauncher,
                     ) -> OperatorProcess | kind.InClusterOperator:
    """One operator with default flags for the whole module (tests use separate namespaces)."""
    return module_launcher.start(name="module")


@pytest.fixture
def operator(cluster: Cluster, kube: KubeApi, operator_kubeconfig: str, session_dir: Path,
             leak_evidence: LeakEvidence) -> Iterator[OperatorLauncher | kind.KindLauncher]:
    """Factory: ``operator.start(*extra_flags, name=..., kubeconfig=...)``; all stopped after."""
    launcher = _launcher(cluster, kube, operator_kubeconfig, session_dir, leak_evidence)
    yield launcher
    launcher.stop_all()


# -- namespaces -------------------------------------------------------------------------------
@pytest.fixture
def ns(request: pytest.FixtureRequest, kube: KubeApi, h: Harness,
       leak_evidence: LeakEvidence) -> Iterator[str]:
    """A fresh namespace; its Events and statuses are kept for the canary check."""
    base = re.sub(r"[^a-z0-9-]+", "-", request.node.name.lower().removeprefix("test_"))
    name = f"e2e-{base[:40].strip('-')}-{secrets.token_hex(3)}"
    cluster_setup.ensure_namespace(kube, name, labels={"himitsu.test/e2e": "true"})
    yield name
    leak_evidence.collect_namespace(kube, name)
    kube.delete(f"/api/v1/namespaces/{name}")  # not waited for: the cluster finishes it


@pytest.fixture
def make_ns(kube: KubeApi, h: Harness, leak_evidence: LeakEvidence) -> Iterator[Any]:
    """Factory for extra namespaces in one test (same cleanup as ``ns``)."""
    created: list[str] = []

    def make(prefix: str = "extra") -> str:
        name = f"e2e-{prefix}-{secrets.token_hex(3)}"
        cluster_setup.ensure_namespace(kube, name, labels={"himitsu.test/e2e": "true"})
        created.append(name)
        return name

    yield make
    for name in created:
        leak_evidence.collect_namespace(kube, name)
        kube.delete(f"/api/v1/namespaces/{name}")
