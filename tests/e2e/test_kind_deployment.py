"""The operator's Deployment on a kubelet: hand-over, rolling update, readiness.

What users rely on and only a real node shows (kind only: `make e2e-kind`): the standby (or
the replacement pod) takes the Lease when the leader's pod is deleted and syncs; a rolling
update (a `helm upgrade` with changed values, when the chart installed it) loses no change
and never has two leaders; a replica whose caches cannot sync is kept
out of Ready by its probe (and stays alive). Two writers are ruled out from the Lease's
history (every acquisition seen, leaseTransitions agreeing) and each replica's own log of
its terms as leader (kind_watch.py), the audit log being off on kind.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from .harness import Harness, Sync
from .kind import CHART, HELM_RELEASE, OPERATOR_NAMESPACE, OPERATOR_SELECTOR, PortForward, helm
from .kind_watch import LeaseWatch, PodLogs, lease_spec, pod_of
from .kubehelp import KubeApi, kubectl, wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.kind_only]

DEPLOYMENT = f"/apis/apps/v1/namespaces/{OPERATOR_NAMESPACE}/deployments/himitsu-operator"
PODS = f"/api/v1/namespaces/{OPERATOR_NAMESPACE}/pods"
CLUSTER_ROLE = "/apis/rbac.authorization.k8s.io/v1/clusterroles/himitsu-operator"
SYNC_TIMEOUT = 60.0  # a 2 s refresh on a busy 2-core machine, not a performance figure
ROLLOUT_TIMEOUT = 240.0


def pods(kube: KubeApi) -> list[dict[str, Any]]:
    return list(kube.get(PODS, labelSelector=OPERATOR_SELECTOR)["items"])


def is_pod_ready(pod: dict[str, Any]) -> bool:
    return any(c["type"] == "Ready" and c["status"] == "True"
               for c in (pod.get("status") or {}).get("conditions") or [])


def rolled_out(kube: KubeApi) -> bool:
    """The Deployment's last change is fully rolled out: every replica new and Ready."""
    deploy = kube.get(DEPLOYMENT)
    status, want = deploy.get("status") or {}, deploy["spec"]["replicas"]
    return bool(status.get("observedGeneration") == deploy["metadata"]["generation"]
                and status.get("updatedReplicas") == want == status.get("readyReplicas")
                == status.get("replicas") and len(pods(kube)) == want)


def leader(kube: KubeApi) -> str:
    holder = str(lease_spec(kube).get("holderIdentity") or "")
    return pod_of(holder) if holder else ""


@pytest.fixture
def settled(kube: KubeApi) -> Iterator[None]:
    """Two Ready replicas, one leading, before and after the test."""
    def steady() -> bool:
        return rolled_out(kube) and leader(kube) in {p["metadata"]["name"] for p in pods(kube)}

    wait_for(steady, timeout=ROLLOUT_TIMEOUT, what="the Deployment settled, a replica leading")
    yield
    wait_for(steady, timeout=ROLLOUT_TIMEOUT, what="the Deployment settled after the test")


def change(h: Harness, sync: Sync, n: int) -> dict[str, str]:
    values = {**sync.values, "API_KEY": h.canary.value(f"change-{n}")}
    h.standin.set_secrets(sync.env, {"API_KEY": values["API_KEY"]})
    return values


@pytest.mark.usefixtures("default_operator", "settled")
def test_deleting_the_leader_pod_hands_the_lease_to_another_replica_which_syncs(
        h: Harness, ns: str, kube: KubeApi, session_dir: Path) -> None:
    sync = h.sync(ns, "API_KEY", refresh="2s")
    old = leader(kube)
    (standby,) = [p["metadata"]["name"] for p in pods(kube) if p["metadata"]["name"] != old]

    with LeaseWatch(kube) as lease, PodLogs(kube, session_dir) as logs:
        kubectl(kube.kubeconfig, "-n", OPERATOR_NAMESPACE, "delete", "pod", old, "--wait=false")
        wait_for(lambda: leader(kube) not in {"", old}, timeout=60,
                 what=f"a replica other than {old} holding the Lease")
        h.wait_data(ns, sync.target, change(h, sync, 1), timeout=SYNC_TIMEOUT)
        wait_for(lambda: kube.get_or_none(f"{PODS}/{old}") is None, timeout=60,
                 what=f"pod {old} gone")

    # The standby usually wins, but the Deployment's replacement pod may: either is fine,
    # the old pod is not (and never comes back).
    new = leader(kube)
    assert new not in {"", old}, f"expected a replica other than {old} to lead: {lease.changes}"
    holders = lease.holders()
    assert holders[0] == old and old not in holders[1:] and holders[-1] == new, lease.changes
    assert set(holders[1:]) <= {standby, new}, lease.changes
    assert lease.errors == [], lease.errors
    lease.assert_no_unseen_holder()
    terms = logs.assert_one_leader_at_a_time()
    assert old in logs.pods(), f"the old leader's log was not followed: {logs.pods()}"
    assert any(t.pod == old and t.released for t in terms), terms


@pytest.mark.usefixtures("default_operator", "settled")
def test_a_rolling_update_loses_no_change_and_never_has_two_leaders(
        h: Harness, ns: str, kube: KubeApi, session_dir: Path) -> None:
    sync = h.sync(ns, "API_KEY", refresh="2s")
    before = {p["metadata"]["name"] for p in pods(kube)}
    # Changed values (a pod annotation): a new pod template, same behaviour.
    stamp = f"himitsu\\.test/rolled={ns}"

    with LeaseWatch(kube) as lease, PodLogs(kube, session_dir) as logs:
        if HELM_RELEASE:
            helm(kube.kubeconfig, "upgrade", HELM_RELEASE, str(CHART), "--reuse-values",
                 "--set-string", f"podAnnotations.{stamp}")
        else:  # an install of deploy/ (`make deploy`)
            patch = [{"op": "add", "path": "/spec/template/spec/containers/0/args/-",
                      "value": "--log-level=info"}]
            kubectl(kube.kubeconfig, "-n", OPERATOR_NAMESPACE, "patch", "deployment",
                    "himitsu-operator", "--type=json", "-p", json.dumps(patch))
        n = 0
        while not rolled_out(kube):  # every change made mid-rollout is synced
            n += 1
            assert n <= 40, "the rollout did not finish within 40 synced changes"
            h.wait_data(ns, sync.target, change(h, sync, n), timeout=SYNC_TIMEOUT)
        h.wait_data(ns, sync.target, change(h, sync, n + 1), timeout=SYNC_TIMEOUT)

    after = {p["metadata"]["name"] for p in pods(kube)}
    assert not after & before, f"pods {after & before} survived the rollout"
    assert leader(kube) in after
    assert lease.errors == [], lease.errors
    lease.assert_no_unseen_holder()
    terms = logs.assert_one_leader_at_a_time()
    assert [t.pod for t in terms if t.pod in before] and all(
        t.released for t in terms if t.pod in before), terms


# Secrets, not HimitsuSecrets: the start-up check lists HimitsuSecrets and exits on a 403
# (a crash loop is not the case under test); the Secret informer's list then fails.
def _without_list_of_secrets(role: dict[str, Any]) -> dict[str, Any]:
    stripped = copy.deepcopy(role)
    for rule in stripped["rules"]:
        if rule.get("apiGroups") == [""] and "secrets" in rule.get("resources", []):
            rule["verbs"] = [v for v in rule["verbs"] if v != "list"]
    return stripped


def _may_list_secrets(kube: KubeApi) -> bool:
    review = kube.create("/apis/authorization.k8s.io/v1/subjectaccessreviews", {
        "apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
        "spec": {"user": f"system:serviceaccount:{OPERATOR_NAMESPACE}:himitsu-operator",
                 "resourceAttributes": {"resource": "secrets", "verb": "list"}}})
    return bool(review["status"].get("allowed"))


def _probe(kube: KubeApi, pod: str, path: str, session_dir: Path) -> int:
    forward = PortForward(kube.kubeconfig, OPERATOR_NAMESPACE, f"pod/{pod}", 8081,
                          session_dir / "probe-port-forward.log")
    try:
        return requests.get(f"{forward.url}{path}", timeout=10).status_code
    finally:
        forward.stop()


def _probe_answered_not_ready(kube: KubeApi, pod: str) -> bool:
    """The kubelet's readiness probe reached the server and got an error status (not a
    refused connection: the process is up and says it is not ready)."""
    events = kube.get(f"/api/v1/namespaces/{OPERATOR_NAMESPACE}/events",
                      fieldSelector=f"involvedObject.name={pod}")["items"]
    return any(e.get("reason") == "Unhealthy"
               and "Readiness probe failed: HTTP probe failed with statuscode"
               in e.get("message", "") for e in events)


def _restarts(kube: KubeApi, pod: str) -> int:
    statuses = (kube.get(f"{PODS}/{pod}").get("status") or {}).get("containerStatuses") or []
    return sum(int(s.get("restartCount") or 0) for s in statuses)


@pytest.mark.usefixtures("default_operator", "settled")
def test_a_replica_whose_caches_cannot_sync_is_alive_but_not_ready(
        kube: KubeApi, session_dir: Path) -> None:
    original = kube.get(CLUSTER_ROLE)
    before = {p["metadata"]["name"] for p in pods(kube)}
    scale = ["-n", OPERATOR_NAMESPACE, "scale", "deployment/himitsu-operator"]
    try:
        try:
            kube.replace(CLUSTER_ROLE, _without_list_of_secrets(original))
            wait_for(lambda: not _may_list_secrets(kube), timeout=30,
                     what="the ServiceAccount no longer allowed to list Secrets")
            kubectl(kube.kubeconfig, *scale, "--replicas=3")
            new = wait_for(lambda: [p["metadata"]["name"] for p in pods(kube)
                                    if p["metadata"]["name"] not in before], timeout=60,
                           what="the third replica's pod")[0]

            wait_for(lambda: _probe_answered_not_ready(kube, new), timeout=90,
                     what=f"the kubelet's readiness probe of {new} answered not ready")
            assert not is_pod_ready(kube.get(f"{PODS}/{new}"))
            assert _probe(kube, new, "/readyz", session_dir) != 200
            assert _probe(kube, new, "/healthz", session_dir) == 200
            assert _restarts(kube, new) == 0, "alive: neither exited nor killed by liveness"
            assert kube.get(DEPLOYMENT)["status"].get("readyReplicas") == 2
        finally:
            current = kube.get(CLUSTER_ROLE)
            kube.replace(CLUSTER_ROLE, {**original, "metadata": {
                **original["metadata"],
                "resourceVersion": current["metadata"]["resourceVersion"]}})
        # Allowed again: its informer's next list succeeds and the probe lets it in.
        wait_for(lambda: is_pod_ready(kube.get(f"{PODS}/{new}")), timeout=120,
                 what=f"{new} Ready once it may list again")
    finally:
        kubectl(kube.kubeconfig, *scale, "--replicas=2")
