"""Consumers restarted on a kubelet (issue 16, kind only: `make e2e-kind`), as a new user
tries it: a Deployment of two replicas reads the target Secret through ``envFrom`` and
prints API_KEY when it starts; its HimitsuSecret names it in rolloutRestartTargets.

* a value changed in Himitsu: every pod is replaced (new UIDs, the old pods gone), the new
  pods print the new value, and the change is one rollout (the Deployment's generation and
  ``deployment.kubernetes.io/revision`` each moved by one, one new ReplicaSet);
* nothing changed for several polls (each answered 304 by the stand-in): no new
  ReplicaSet, the template annotation as it was;
* three values rotated within minRestartInterval (its default, 1m): one more rollout, and
  its pods print the last value.

test_rollout_restart.py proves the rule on the template annotation on every run (also
here); this file proves what it is for: pods with the new environment, one rollout.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest

from himitsu_controller import api
from himitsu_controller.sync.restarts.scheduler import record_of

from .harness import Harness, hsec_body
from .kind import OPERATOR_NAMESPACE
from .kubehelp import KubeApi, hsec_path, kubectl, wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.kind_only, pytest.mark.usefixtures("default_operator")]

CONSUMER = "consumer"
TARGET = "app-secrets"
REPLICAS = 2
ROLLOUT_TIMEOUT = 180.0  # pods started on a busy 2-core node, not a performance figure
SYNC_TIMEOUT = 25.0
REVISION = "deployment.kubernetes.io/revision"
# The consumer: prints what it was started with, then answers its readiness probe (TCP)
# until SIGTERM (PID 1 has no default handler for it).
CONSUMER_SCRIPT = """\
import os, signal, socket, sys
signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
print("API_KEY=" + os.environ["API_KEY"], flush=True)
server = socket.create_server(("", 8080))
while True:
    server.accept()[0].close()
"""


def operator_image(kube: KubeApi) -> str:
    """The operator's image: loaded into the node already, and it has python3."""
    deploy = kube.get(f"/apis/apps/v1/namespaces/{OPERATOR_NAMESPACE}/deployments/"
                      "himitsu-operator")
    return str(deploy["spec"]["template"]["spec"]["containers"][0]["image"])


def consumer(image: str) -> dict[str, Any]:
    labels = {"app": CONSUMER}
    container = {
        "name": "app", "image": image, "imagePullPolicy": "Never",
        "command": ["python3", "-c", CONSUMER_SCRIPT],
        "envFrom": [{"secretRef": {"name": TARGET}}],
        "ports": [{"name": "probe", "containerPort": 8080}],
        "readinessProbe": {"tcpSocket": {"port": "probe"}, "periodSeconds": 1},
        "securityContext": {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                            "capabilities": {"drop": ["ALL"]}},
    }
    return {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": CONSUMER},
            "spec": {"replicas": REPLICAS, "selector": {"matchLabels": labels},
                     "template": {"metadata": {"labels": labels}, "spec": {
                         "containers": [container], "enableServiceLinks": False,
                         "automountServiceAccountToken": False,
                         "terminationGracePeriodSeconds": 5,
                         "securityContext": {"runAsNonRoot": True, "runAsUser": 65534,
                                             "seccompProfile": {"type": "RuntimeDefault"}}}}}}


@dataclass(frozen=True)
class Snapshot:
    """What a rollout changes, at one moment."""

    generation: int
    revision: int
    restarted_at: str | None
    replica_sets: frozenset[str]
    pod_uids: dict[str, str]  # name -> uid


class Consumer:
    """The consuming Deployment and its HimitsuSecret in one namespace."""

    def __init__(self, h: Harness, ns: str, *, refresh: str,
                 window: str | None = None) -> None:
        self.h, self.ns, self.kube = h, ns, h.kube
        self.apps = f"/apis/apps/v1/namespaces/{ns}"
        self.env, self.values = h.environment("API_KEY", "DB_PASSWORD")
        h.token_secret(ns, h.token_for(self.env))
        # The workload first, as a user has it: its pods wait for the Secret to exist.
        self.kube.create(f"{self.apps}/deployments", consumer(operator_image(self.kube)))
        body = hsec_body("app", self.env, api_url=h.standin.api_url, target=TARGET,
                         refresh=refresh)
        body["spec"]["rolloutRestartTargets"] = [{"kind": "Deployment", "name": CONSUMER}]
        if window is not None:
            body["spec"]["minRestartInterval"] = window
        self.kube.create(hsec_path(ns), body)
        h.wait_ready(ns, "app")
        wait_for(self.recorded, timeout=SYNC_TIMEOUT,
                 what="the Deployment to record the data its pods have")

    # -- what is observed ---------------------------------------------------------------
    def deployment(self) -> dict[str, Any]:
        found: dict[str, Any] = self.kube.get(f"{self.apps}/deployments/{CONSUMER}")
        return found

    def pods(self) -> list[dict[str, Any]]:
        return list(self.kube.get(f"/api/v1/namespaces/{self.ns}/pods",
                                  labelSelector=f"app={CONSUMER}")["items"])

    def snapshot(self) -> Snapshot:
        deploy = self.deployment()
        template = deploy["spec"]["template"].get("metadata") or {}
        replica_sets = self.kube.get(f"{self.apps}/replicasets",
                                     labelSelector=f"app={CONSUMER}")["items"]
        return Snapshot(
            generation=int(deploy["metadata"]["generation"]),
            revision=int((deploy["metadata"].get("annotations") or {}).get(REVISION, "0")),
            restarted_at=(template.get("annotations") or {}).get(api.ANN_RESTARTED_AT),
            replica_sets=frozenset(rs["metadata"]["name"] for rs in replica_sets),
            pod_uids={p["metadata"]["name"]: p["metadata"]["uid"] for p in self.pods()})

    def recorded(self) -> bool:
        """The Deployment's record (himitsu.io/started-with) names the data id the target
        holds: no restart is owed."""
        secret = self.kube.get(f"/api/v1/namespaces/{self.ns}/secrets/{TARGET}")
        held = (secret["metadata"].get("annotations") or {}).get(api.ANN_DATA_ID)
        return bool(held) and record_of(self.deployment()).get("app") == held

    def rolled_out(self) -> Snapshot | None:
        """The Deployment's current template on every replica, Ready, and no other pod
        (an old one terminating counts): the snapshot then, else None."""
        deploy = self.deployment()
        status = deploy.get("status") or {}
        done = (status.get("observedGeneration") == deploy["metadata"]["generation"]
                and status.get("updatedReplicas") == status.get("readyReplicas")
                == status.get("availableReplicas") == status.get("replicas") == REPLICAS)
        if not done:
            return None
        snap = self.snapshot()
        return snap if len(snap.pod_uids) == REPLICAS else None

    def wait_rolled_out(self) -> Snapshot:
        return wait_for(self.rolled_out, timeout=ROLLOUT_TIMEOUT,
                        what=f"Deployment {self.ns}/{CONSUMER} rolled out, {REPLICAS} Ready")

    def printed(self, pod: str) -> str:
        """The API_KEY a pod printed when it started ("" before it did)."""
        text = kubectl(self.kube.kubeconfig, "-n", self.ns, "logs", f"pod/{pod}",
                       check=False).stdout
        lines = [line for line in text.splitlines() if line.startswith("API_KEY=")]
        return lines[-1].removeprefix("API_KEY=") if lines else ""

    def assert_pods_print(self, snap: Snapshot, value: str) -> None:
        for pod in snap.pod_uids:
            # not printed in the message: the values are canaries
            assert self.printed(pod) == value, f"pod {pod} did not start with the value"

    def restarted_events(self) -> int:
        return sum(int(e.get("count") or 1) for e in self.h.events(self.ns, "app")
                   if e["reason"] == "RolloutRestarted")

    # -- what is done -------------------------------------------------------------------
    def polls_pass(self, n: int) -> None:
        """Until ``n`` more polls were answered 304: each one a chance to restart."""
        seen = self.h.standin.count(self.env, status=304)
        wait_for(lambda: self.h.standin.count(self.env, status=304) >= seen + n,
                 timeout=SYNC_TIMEOUT * n, what=f"{n} more polls answered 304")

    def rotate(self, tag: str) -> str:
        """A new API_KEY in Himitsu, waited for in the Secret; the value."""
        value = self.h.canary.value(tag)
        self.h.standin.set_secrets(self.env, {"API_KEY": value})
        self.values = {**self.values, "API_KEY": value}
        self.h.wait_data(self.ns, TARGET, self.values, timeout=SYNC_TIMEOUT)
        return value


def assert_one_rollout(before: Snapshot, after: Snapshot) -> None:
    assert after.generation == before.generation + 1, (before, after)
    assert after.revision == before.revision + 1, (before, after)
    assert after.restarted_at is not None and after.restarted_at != before.restarted_at
    assert len(after.replica_sets - before.replica_sets) == 1, (before, after)
    assert before.replica_sets <= after.replica_sets, (before, after)


def assert_replaced(c: Consumer, before: Snapshot, after: Snapshot) -> None:
    assert not set(after.pod_uids.values()) & set(before.pod_uids.values()), (before, after)
    assert not set(after.pod_uids) & set(before.pod_uids), (before, after)
    for pod in before.pod_uids:
        assert c.kube.get_or_none(f"/api/v1/namespaces/{c.ns}/pods/{pod}") is None, pod


def test_a_changed_value_rolls_the_deployment_once_and_no_change_rolls_nothing(
        h: Harness, ns: str) -> None:
    c = Consumer(h, ns, refresh="5s", window="2s")
    first = c.wait_rolled_out()
    c.assert_pods_print(first, c.values["API_KEY"])
    c.polls_pass(2)  # the first sync restarts nothing: the pods started with its data
    assert c.snapshot() == first and first.restarted_at is None

    value = c.rotate("changed")
    wait_for(lambda: c.snapshot().restarted_at, timeout=SYNC_TIMEOUT,
             what="the Deployment restarted for the change")
    rolled = c.wait_rolled_out()
    assert_one_rollout(first, rolled)
    assert_replaced(c, first, rolled)
    c.assert_pods_print(rolled, value)
    wait_for(c.restarted_events, timeout=SYNC_TIMEOUT, what="a RolloutRestarted Event")

    c.polls_pass(4)  # four refresh intervals, nothing changed in Himitsu
    assert c.snapshot() == rolled
    assert c.recorded()
    assert c.restarted_events() == 1
    h.wait_ready(ns, "app")


def test_three_quick_rotations_are_one_rollout_with_the_last_values(
        h: Harness, ns: str) -> None:
    # minRestartInterval left to its default (1m): the rotations, each waited for in the
    # Secret (SYNC_TIMEOUT each), fall within the window the first one opens.
    c = Consumer(h, ns, refresh="2s")
    first = c.wait_rolled_out()
    values = []
    for tag in ("one", "two", "three"):
        values.append(c.rotate(tag))
        assert not c.recorded(), "the record names the new data: no restart owed"
        assert c.snapshot().restarted_at is None, \
            "restarted before the last rotation: the window did not batch them"

    wait_for(lambda: c.snapshot().restarted_at, timeout=api.DEFAULT_MIN_RESTART_SECONDS
             + SYNC_TIMEOUT, what="the one restart for the three changes")
    rolled = c.wait_rolled_out()
    assert_one_rollout(first, rolled)
    assert_replaced(c, first, rolled)
    c.assert_pods_print(rolled, values[-1])

    wait_for(c.recorded, timeout=SYNC_TIMEOUT,
             what="no restart owed after the one for the three changes")
    c.polls_pass(3)
    assert c.snapshot() == rolled
    assert c.restarted_events() == 1
    h.wait_ready(ns, "app")
