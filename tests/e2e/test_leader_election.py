"""Two replicas with --leader-elect: one Lease holder, only it writes, and hand-over works.

Telling the writers apart: both replicas send the same User-Agent and poll Himitsu with
the same token, so neither the stand-in nor the User-Agent can say who wrote. The two
replicas therefore run as distinct ServiceAccounts with identical bindings
(``himitsu-operator`` and ``himitsu-operator-b``), and the kube-apiserver audit log,
which records the authenticated user of every request, says who wrote what.
Which replica leads is read from its own ``leader_election_master_status`` gauge.
"""

from __future__ import annotations

import json
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from . import cluster_setup
from .cluster_setup import Cluster
from .harness import Harness
from .kubehelp import KubeApi, wait_for
from .operator_proc import OperatorLauncher, OperatorProcess

pytestmark = [pytest.mark.e2e, pytest.mark.local_only]

SECOND_SA = "himitsu-operator-b"
WRITE_VERBS = {"create", "update", "patch", "delete"}
FAST = ("4s", "3s", "1s")  # lease duration, renew deadline, retry period
LEASE_API = f"/apis/coordination.k8s.io/v1/namespaces/{cluster_setup.OPERATOR_NAMESPACE}/leases"


@pytest.fixture(scope="module")
def second_kubeconfig(kube: KubeApi, operator_kubeconfig: str, session_dir: Path) -> str:
    cluster_setup.add_service_account(kube, SECOND_SA)
    return str(cluster_setup.service_account_kubeconfig(
        kube, SECOND_SA, session_dir / "operator-b.kubeconfig"))


Pair = tuple[tuple[OperatorProcess, str], tuple[OperatorProcess, str]]


@pytest.fixture
def start_pair(operator: OperatorLauncher, operator_kubeconfig: str, kube: KubeApi,
               second_kubeconfig: str) -> Callable[..., tuple[str, Pair]]:
    """Start two replicas on a fresh Lease: ((process, ServiceAccount), ...) and its name."""
    def start(timings: tuple[str, str, str] = FAST) -> tuple[str, Pair]:
        lease = cluster_setup.lease_name(kube, "e2e")
        flags = ("--leader-elect",
                 "--leader-election-namespace", cluster_setup.OPERATOR_NAMESPACE,
                 "--leader-election-id", lease,
                 "--leader-election-lease-duration", timings[0],
                 "--leader-election-renew-deadline", timings[1],
                 "--leader-election-retry-period", timings[2])
        a = operator.start(*flags, name="replica-a", kubeconfig=operator_kubeconfig)
        b = operator.start(*flags, name="replica-b", kubeconfig=second_kubeconfig)
        return lease, ((a, cluster_setup.OPERATOR_SA), (b, SECOND_SA))

    return start


def _leading(op: OperatorProcess, lease: str) -> bool:
    if not op.alive():
        return False
    for family in text_string_to_metric_families(op.scrape()):
        for sample in family.samples:
            if sample.name == "leader_election_master_status" and \
                    sample.labels.get("name") == lease:
                return sample.value == 1
    return False


def _sole_leader(pair: Pair, lease: str, *, timeout: float = 30.0,
                 ) -> tuple[tuple[OperatorProcess, str], tuple[OperatorProcess, str]]:
    """(leader, follower) once exactly one live replica reports itself leader."""
    def check() -> Any:
        leaders = [r for r in pair if _leading(r[0], lease)]
        if len(leaders) != 1:
            return None
        follower = pair[1] if leaders[0] is pair[0] else pair[0]
        return leaders[0], follower

    found: tuple[tuple[OperatorProcess, str], tuple[OperatorProcess, str]] = wait_for(
        check, timeout=timeout, what=f"exactly one leader of Lease {lease}")
    return found


def _identity(op: OperatorProcess) -> str:
    """The identity this replica campaigned with (from its 'became leader' log line)."""
    for record in op.log_records():
        if record.get("event") == "became leader":
            return str(record["identity"])
    raise AssertionError(f"{op.name} never logged 'became leader'")


def _holder(kube: KubeApi, lease: str) -> str:
    return str(kube.get(f"{LEASE_API}/{lease}")["spec"].get("holderIdentity") or "")


def _audit_writers(cluster: Cluster, ns: str, *, after: int = 0) -> tuple[set[str], int]:
    """Users that wrote Secrets, HimitsuSecrets or Events in ``ns`` (from audit line
    ``after`` on), and the number of lines read."""
    assert cluster.audit_log_path is not None, "the local cluster runs without an audit log"
    lines = cluster.audit_log_path.read_text().splitlines()
    writers = set()
    for line in lines[after:]:
        entry = json.loads(line)
        ref = entry.get("objectRef") or {}
        if (entry.get("stage") == "ResponseComplete" and ref.get("namespace") == ns
                and entry.get("verb") in WRITE_VERBS
                and ref.get("resource") in ("secrets", "himitsusecrets", "events")
                and entry["user"]["username"].startswith(
                    cluster_setup.username("himitsu-operator"))):
            writers.add(entry["user"]["username"])
    return writers, len(lines)


def test_one_replica_holds_the_lease_and_only_it_writes(
        h: Harness, ns: str, kube: KubeApi, cluster: Cluster,
        start_pair: Callable[..., tuple[str, Pair]]) -> None:
    lease, pair = start_pair()
    (leader, leader_sa), _follower = _sole_leader(pair, lease)
    assert _holder(kube, lease) == _identity(leader)

    sync = h.sync(ns, "API_KEY", refresh="2s")
    h.wait_data(ns, sync.target, sync.values)
    wait_for(lambda: h.standin.count(sync.env, status=304) >= 2, timeout=30,
             what="two polls answered 304 (each followed by a status write)")

    writers, _ = _audit_writers(cluster, ns)
    assert writers == {cluster_setup.username(leader_sa)}


def test_killed_leader_is_replaced_by_the_standby(
        h: Harness, ns: str, kube: KubeApi, cluster: Cluster,
        start_pair: Callable[..., tuple[str, Pair]]) -> None:
    lease, pair = start_pair()
    (leader, _), (follower, follower_sa) = _sole_leader(pair, lease)
    sync = h.sync(ns, "API_KEY", refresh="2s")
    h.wait_data(ns, sync.target, sync.values)

    leader.stop(signal.SIGKILL)

    _sole_leader(pair, lease, timeout=60)
    assert _holder(kube, lease) == _identity(follower)
    _, mark = _audit_writers(cluster, ns)
    changed = {"API_KEY": h.canary.value("after-failover")}
    h.standin.set_secrets(sync.env, changed)
    h.wait_data(ns, sync.target, changed, timeout=30)
    writers, _ = _audit_writers(cluster, ns, after=mark)
    assert writers == {cluster_setup.username(follower_sa)}


def test_sigterm_releases_the_lease_and_the_standby_takes_over_at_once(
        h: Harness, ns: str, kube: KubeApi,
        start_pair: Callable[..., tuple[str, Pair]]) -> None:
    # A long lease: the standby can only take over within the deadline if it was released.
    lease, pair = start_pair(("60s", "40s", "1s"))
    (leader, _), (follower, _) = _sole_leader(pair, lease)
    leader_identity = _identity(leader)

    assert leader.stop(signal.SIGTERM) == 0
    # Released: no holder, or the standby already took it on its next retry.
    assert _holder(kube, lease) != leader_identity

    _sole_leader(pair, lease, timeout=20)
    assert _holder(kube, lease) == _identity(follower)
    sync = h.sync(ns, "API_KEY", refresh="2s")
    h.wait_data(ns, sync.target, sync.values)

