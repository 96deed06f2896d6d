"""A crash between the target's write and the restart (issue 22, local control plane).

Two replicas share a Lease. The leader is SIGKILLed right after the audit log shows its
update of the target with the new data, long before its minRestartInterval (1m) closes,
so it made no restart. The standby takes the Lease over and finds the truth where the
design keeps it: the target holds a new data id, the Deployment's record the old one. It
restarts the Deployment exactly once, at once (it cannot know when the change reached
the Secret), in one patch of restartedAt and the record; the polls after that restart
nothing. The control plane's controller-manager makes the Deployment's ReplicaSets (no
kubelet, no Pods): restarts are counted by the Deployment's revision, one per template.
"""

from __future__ import annotations

import signal
from typing import Any

import pytest

from himitsu_controller import api
from himitsu_controller.sync.restarts.scheduler import record_of

from . import cluster_setup
from .cluster_setup import Cluster
from .faultkit import AuditLog, leading, operator_user
from .harness import Harness, hsec_body
from .kubehelp import KubeApi, hsec_path, wait_for
from .operator_proc import OperatorLauncher
from .test_rollout_restart import deployment, deployment_path, revisions

pytestmark = [pytest.mark.e2e, pytest.mark.local_only, pytest.mark.faults]

# Lease duration, renew deadline, retry period: a standby leads ~4 s after a SIGKILL.
LEASE = ("4s", "3s", "1s")
WINDOW = "1m"  # far longer than the takeover: a restart seen was made by the new leader


def _flags(lease: str) -> tuple[str, ...]:
    return ("--leader-elect", "--leader-election-namespace", cluster_setup.OPERATOR_NAMESPACE,
            "--leader-election-id", lease, "--leader-election-lease-duration", LEASE[0],
            "--leader-election-renew-deadline", LEASE[1],
            "--leader-election-retry-period", LEASE[2])


def test_a_leader_killed_right_after_the_secret_write_is_followed_by_one_restart(
        h: Harness, ns: str, kube: KubeApi, cluster: Cluster,
        operator: OperatorLauncher) -> None:
    assert cluster.audit_log_path is not None
    lease = cluster_setup.lease_name(kube, "rollout-crash")
    first = operator.start(*_flags(lease), name="leader")
    wait_for(lambda: leading(first, lease), timeout=30, what="the first replica to lead")
    standby = operator.start(*_flags(lease), name="standby")

    kube.create(deployment_path(ns), deployment("app-secrets"))
    env, values = h.environment("API_KEY", "DB_PASSWORD")
    h.token_secret(ns, h.token_for(env))
    body = hsec_body("app", env, api_url=h.standin.api_url, target="app-secrets", refresh="1s")
    body["spec"].update(minRestartInterval=WINDOW,
                        rolloutRestartTargets=[{"kind": "Deployment", "name": "web"}])
    kube.create(hsec_path(ns), body)
    h.wait_ready(ns, "app")

    def web() -> dict[str, Any]:
        found: dict[str, Any] = kube.get(deployment_path(ns, "web"))
        return found

    def held() -> str | None:
        secret = kube.get(f"/api/v1/namespaces/{ns}/secrets/app-secrets")
        return (secret["metadata"].get("annotations") or {}).get(api.ANN_DATA_ID)

    def restarted_at() -> str | None:
        meta = web()["spec"]["template"].get("metadata") or {}
        return (meta.get("annotations") or {}).get(api.ANN_RESTARTED_AT)

    wait_for(lambda: record_of(web()).get("app") == held(), timeout=30,
             what="the Deployment to record the data its pods have")
    revision, before = revisions(kube, ns), held()

    audit = AuditLog(cluster.audit_log_path)
    values = {**values, "API_KEY": h.canary.value("after-the-crash")}
    h.standin.set_secrets(env, {"API_KEY": values["API_KEY"]})
    wait_for(lambda: [e for e in audit.writes(ns, resource="secrets",
                                              user_prefix=operator_user(""))
                      if e.verb == "update" and e.name == "app-secrets" and e.code == 200],
             timeout=30, interval=0.02, what="the leader's write of the new data")
    first.stop(signal.SIGKILL)
    h.wait_data(ns, "app-secrets", values)
    assert held() != before and restarted_at() is None, "restarted before the kill"

    wait_for(restarted_at, timeout=60, what="the new leader's restart")
    assert leading(standby, lease), "the restart was made by someone else"
    seen = h.standin.count(env, status=304)
    wait_for(lambda: h.standin.count(env, status=304) >= seen + 5, timeout=60,
             what="five more polls answered 304")
    assert revisions(kube, ns) == revision + 1
    assert record_of(web()).get("app") == held()
    (entry,) = h.get_hsec(ns, "app")["status"]["rolloutRestarts"]
    assert entry["lastRestart"] == restarted_at()
