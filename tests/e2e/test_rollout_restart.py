"""rolloutRestartTargets on a real apiserver (issues 16, 22): a Deployment consuming the
target records the data id its pods were started with (himitsu.io/started-with, the
target's himitsu.io/data-id) and is restarted (its pod template's himitsu.io/restartedAt
changes, in the same patch as the record) exactly once per data change, never on a 304
poll, a repair or a force-sync that changes nothing; three quick rotations are one
restart; a workload that does not read the Secret (a secret volume no container mounts
does not count) is warned about and left alone, unless its owner allows the
HimitsuSecret on the workload itself (himitsu.io/allow-restart-by).

The local control plane runs no kubelet, so no pod starts: what is proved is the template
annotation (what `kubectl rollout restart` changes) and the Deployment's revision: its
controller makes one ReplicaSet per pod template, so ``revision - 1`` counts every
restart anyone made (``generation`` would also count the record, an annotation).
"""

from __future__ import annotations

from typing import Any

import pytest

from himitsu_controller import api
from himitsu_controller.kube import KubeClient
from himitsu_controller.runtime.cache.store import Store
from himitsu_controller.runtime.client.rest import RestClient, load_api_client
from himitsu_controller.sync.ports import Conflict
from himitsu_controller.sync.restarts.scheduler import record_of

from .harness import Harness, hsec_body
from .kubehelp import KubeApi, hsec_path, wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.usefixtures("default_operator")]

WEB = "web"
REVISION = "deployment.kubernetes.io/revision"


def deployment(reads: str | None, *, unmounted: str | None = None) -> dict[str, Any]:
    """``reads`` through envFrom; ``unmounted``: a secret volume of it no container mounts."""
    container: dict[str, Any] = {"name": "app", "image": "example.com/app:1"}
    if reads is not None:
        container["envFrom"] = [{"secretRef": {"name": reads}}]
    labels = {"app": WEB}
    pod: dict[str, Any] = {"containers": [container]}
    if unmounted is not None:
        pod["volumes"] = [{"name": "unused", "secret": {"secretName": unmounted}}]
    return {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": WEB},
            "spec": {"replicas": 1, "selector": {"matchLabels": labels},
                     "template": {"metadata": {"labels": labels}, "spec": pod}}}


def deployment_path(ns: str, name: str | None = None) -> str:
    base = f"/apis/apps/v1/namespaces/{ns}/deployments"
    return f"{base}/{name}" if name else base


def revisions(kube: KubeApi, ns: str) -> int:
    """Deployment ``web``'s revision once its controller has seen its latest spec: one per
    pod template it ever had (the first, and one per restart)."""
    def observed() -> dict[str, Any] | None:
        found: dict[str, Any] = kube.get(deployment_path(ns, WEB))
        seen = (found.get("status") or {}).get("observedGeneration")
        revision = (found["metadata"].get("annotations") or {}).get(REVISION)
        return found if seen == found["metadata"]["generation"] and revision else None
    deploy = wait_for(observed, timeout=30, what="the deployment controller to see Deployment web")
    return int(deploy["metadata"]["annotations"][REVISION])


class Rollout:
    """One HimitsuSecret naming Deployment ``web``, and what to watch on it."""

    def __init__(self, h: Harness, ns: str, *, reads: str | None = "app-secrets",
                 unmounted: str | None = None, window: str = "2s") -> None:
        self.h, self.ns = h, ns
        self.h.kube.create(deployment_path(ns), deployment(reads, unmounted=unmounted))
        self.env, self.values = h.environment("API_KEY", "DB_PASSWORD")
        h.token_secret(ns, h.token_for(self.env))
        body = hsec_body("app", self.env, api_url=h.standin.api_url, target="app-secrets",
                         refresh="1s")
        body["spec"].update(minRestartInterval=window,
                            rolloutRestartTargets=[{"kind": "Deployment", "name": WEB}])
        h.kube.create(hsec_path(ns), body)
        h.wait_ready(ns, "app")
        if reads == "app-secrets":  # a workload that may not be restarted is never touched
            wait_for(self.recorded, timeout=30,
                     what="the Deployment to record the data its pods have")

    def workload(self) -> dict[str, Any]:
        found: dict[str, Any] = self.h.kube.get(deployment_path(self.ns, WEB))
        return found

    def recorded(self) -> bool:
        """The Deployment's record names the data id the target holds."""
        secret = self.h.kube.get(f"/api/v1/namespaces/{self.ns}/secrets/app-secrets")
        held = (secret["metadata"].get("annotations") or {}).get(api.ANN_DATA_ID)
        return bool(held) and record_of(self.workload()).get("app") == held

    def restarts(self) -> int:
        """Every change of the pod template so far, by anyone (``revisions``)."""
        return revisions(self.h.kube, self.ns) - 1

    def restarted_at(self) -> str | None:
        meta = self.workload()["spec"]["template"].get("metadata") or {}
        value = (meta.get("annotations") or {}).get(api.ANN_RESTARTED_AT)
        return str(value) if value is not None else None

    def entry(self) -> dict[str, Any]:
        status = self.h.get_hsec(self.ns, "app").get("status") or {}
        (found,) = status.get("rolloutRestarts") or [{}]
        return dict(found)

    def polls_pass(self, n: int) -> None:
        """Until ``n`` more polls were answered 304 (each one more chance to restart)."""
        seen = self.h.standin.count(self.env, status=304)
        wait_for(lambda: self.h.standin.count(self.env, status=304) >= seen + n, timeout=60,
                 what=f"{n} more polls answered 304")

    def rotate(self, tag: str) -> dict[str, str]:
        value = self.h.canary.value(tag)
        self.h.standin.set_secrets(self.env, {"API_KEY": value})
        self.values = {**self.values, "API_KEY": value}
        self.h.wait_data(self.ns, "app-secrets", self.values)
        return self.values


def test_one_restart_per_data_change_and_none_for_polls_repairs_or_force_syncs(
        h: Harness, ns: str) -> None:
    rollout = Rollout(h, ns)
    rollout.polls_pass(4)
    assert rollout.restarts() == 0 and rollout.restarted_at() is None

    h.kube.delete(f"/api/v1/namespaces/{ns}/secrets/app-secrets")  # a repair: same bytes
    h.wait_data(ns, "app-secrets", rollout.values)
    h.kube.merge_patch(hsec_path(ns, "app"), {"metadata": {"annotations": {
        api.ANN_FORCE_SYNC: "1"}}})
    wait_for(lambda: (h.get_hsec(ns, "app").get("status") or {}).get("lastForceSync") == "1",
             timeout=30, what="the force-sync to be honoured")
    rollout.polls_pass(4)
    assert rollout.restarts() == 0 and rollout.restarted_at() is None

    rollout.rotate("first")
    first = wait_for(rollout.restarted_at, timeout=30, what="the restart for the change")
    rollout.polls_pass(4)
    assert (rollout.restarts(), rollout.restarted_at()) == (1, first)
    assert rollout.recorded() and rollout.entry()["lastRestart"]

    rollout.rotate("second")
    wait_for(lambda: rollout.restarted_at() != first, timeout=30, what="the second restart")
    rollout.polls_pass(4)
    assert rollout.restarts() == 2
    assert any(e["reason"] == "RolloutRestarted" for e in h.events(ns, "app"))
    h.wait_ready(ns, "app")


def test_three_quick_rotations_are_one_restart(h: Harness, ns: str) -> None:
    rollout = Rollout(h, ns, window="8s")
    for tag in ("one", "two", "three"):
        rollout.rotate(tag)  # each reaches the Secret (a poll of its own) before the next
    wait_for(rollout.restarted_at, timeout=30, what="the restart for the three changes")
    rollout.polls_pass(10)  # past another window
    assert rollout.restarts() == 1 and rollout.recorded()


def test_a_workload_not_reading_the_secret_is_warned_about_and_not_restarted(
        h: Harness, ns: str) -> None:
    rollout = Rollout(h, ns, reads="some-other-secret", window="0")
    wait_for(lambda: [e for e in h.events(ns, "app")
                      if e["type"] == "Warning" and e["reason"] == "RolloutRestartSkipped"],
             timeout=30, what="a Warning Event about the workload")
    assert "does not read Secret 'app-secrets'" in rollout.entry()["warning"]
    rollout.rotate("ignored")
    rollout.polls_pass(4)
    assert rollout.restarts() == 0 and rollout.restarted_at() is None
    h.wait_ready(ns, "app")


def test_an_unmounted_volume_is_no_reference_and_the_workload_s_consent_allows_a_restart(
        h: Harness, ns: str) -> None:
    rollout = Rollout(h, ns, reads=None, unmounted="app-secrets", window="0")
    wait_for(lambda: [e for e in h.events(ns, "app")
                      if e["type"] == "Warning" and e["reason"] == "RolloutRestartSkipped"],
             timeout=30, what="a Warning Event about the workload")
    assert f"{api.ANN_ALLOW_RESTART_BY}=app" in rollout.entry()["warning"]
    rollout.rotate("ignored")
    rollout.polls_pass(4)
    assert rollout.restarts() == 0 and rollout.restarted_at() is None

    h.kube.merge_patch(deployment_path(ns, WEB), {"metadata": {"annotations": {
        api.ANN_ALLOW_RESTART_BY: "app"}}})  # the workload's owner consents
    consented = rollout.restarts()
    rollout.rotate("allowed")
    wait_for(rollout.restarted_at, timeout=30, what="the restart the workload allows")
    rollout.polls_pass(4)
    assert rollout.restarts() == consented + 1 and "warning" not in rollout.entry()
    h.wait_ready(ns, "app")


def test_every_min_restart_interval_the_apiserver_admits_the_operator_accepts(
        h: Harness, ns: str) -> None:
    """CEL's duration() is Go's time.ParseDuration, which drops a fraction of a
    nanosecond: "24h0.1ns" is exactly 24h to the apiserver (admitted), and so it must be
    to the operator, or the whole sync stops (InvalidSpec) over a batching knob."""
    env, _ = h.environment("API_KEY")
    for i, window in enumerate(("24h0.1ns", "24h0.0000000001s")):
        body = hsec_body(f"long-{i}", env, api_url=h.standin.api_url,
                         target=f"long-{i}-secrets", refresh="1m")
        body["spec"]["minRestartInterval"] = window
        h.kube.create(hsec_path(ns), body)  # the apiserver admits it...
        assert api.parse_spec(body).rollout.min_interval == 24 * 3600  # ...the operator too


def test_the_restart_patch_applies_only_to_the_workload_as_read(
        kube: KubeApi, operator_kubeconfig: str, ns: str) -> None:
    """The record is one annotation for every HimitsuSecret: a patch computed from a read
    the workload has moved on from (another writer's record, a kubectl edit) must be
    refused, not merged over it. The strategic merge patch's resourceVersion is that
    precondition on kube-apiserver; the current one applies record and restart at once."""
    created = kube.create(deployment_path(ns), deployment("app-secrets"))
    client = KubeClient(RestClient(load_api_client(operator_kubeconfig)),
                        himitsu_secrets=Store(), secrets=Store())
    kube.merge_patch(deployment_path(ns, WEB), {"metadata": {"annotations": {
        api.ANN_STARTED_WITH: "other=0123456789abcdef"}}})
    with pytest.raises(Conflict):
        client.patch_workload(ns, "Deployment", WEB,
                              resource_version=created["metadata"]["resourceVersion"],
                              annotations={api.ANN_STARTED_WITH: "app=fedcba9876543210"},
                              template={api.ANN_RESTARTED_AT: "2026-12-01T12:00:00.000000Z"})
    for _ in range(5):  # the controller-manager's status writes also move it on
        current = kube.get(deployment_path(ns, WEB))
        assert record_of(current) == {"other": "0123456789abcdef"}
        assert api.ANN_RESTARTED_AT not in str(current["spec"]["template"])
        try:
            patched = client.patch_workload(
                ns, "Deployment", WEB, resource_version=current["metadata"]["resourceVersion"],
                annotations={api.ANN_STARTED_WITH: "app=fedcba9876543210,other=0123456789abcdef"},
                template={api.ANN_RESTARTED_AT: "2026-12-01T12:00:00.000000Z"})
            break
        except Conflict:
            continue
    else:
        pytest.fail("the patch of the workload as read was refused five times")
    assert record_of(patched) == {"app": "fedcba9876543210", "other": "0123456789abcdef"}
    assert patched["spec"]["template"]["metadata"]["annotations"][api.ANN_RESTARTED_AT] == \
        "2026-12-01T12:00:00.000000Z"
