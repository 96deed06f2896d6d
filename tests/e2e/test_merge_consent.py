"""A Merge needs the target's consent (issue 27), on a real apiserver: the reviewer's three
cases of a HimitsuSecret author (who may not write Secrets) merging into another team's
Secret are each refused, Ready=False TargetConflict naming the annotation to add, a Warning
Event, and the Secret left byte for byte; a Secret the operator created for a HimitsuSecret
since deleted is nobody's to take, as Owner or by consent once withdrawn; and a renamed
Merge target gives the old Secret back as it was before the merge (issue 21)."""

from __future__ import annotations

import base64
from typing import Any

import pytest

from himitsu_controller import api

from .harness import Harness
from .kubehelp import KubeApi, decoded, hsec_path, ready, secret_path, wait_for
from .test_rollout_restart import WEB, deployment, deployment_path

pytestmark = [pytest.mark.e2e, pytest.mark.usefixtures("default_operator")]

VICTIM = "team-a-config"


def _victim(h: Harness, ns: str) -> dict[str, Any]:
    return h.secret(ns, VICTIM, h.canary.values("DB_PASSWORD"),
                    labels={api.LABEL_MANAGED_BY: "Helm"},
                    annotations={"meta.helm.sh/release-name": "team-a"})


def _refused(h: Harness, ns: str, kube: KubeApi, before: dict[str, Any], name: str) -> None:
    h.wait_ready(ns, name, reason="TargetConflict",
                 message_has=f"{api.ANN_ALLOW_MERGE_BY}: {name}")
    wait_for(lambda: [e for e in h.events(ns, name)
                      if (e["type"], e["reason"]) == ("Warning", "TargetConflict")],
             timeout=30, what="a Warning TargetConflict Event")
    assert kube.secret(ns, VICTIM) == before, "the Secret was changed"


def test_a_node_options_key_into_another_teams_secret_is_refused(
        h: Harness, ns: str, kube: KubeApi) -> None:
    before = _victim(h, ns)
    sync = h.sync(ns, "NODE_OPTIONS", target=VICTIM, policy="Merge", wait=False)
    _refused(h, ns, kube, before, sync.name)
    assert h.standin.requests_naming(sync.env) == []  # refused before Himitsu is asked


def test_a_replicator_annotation_into_another_teams_secret_is_refused(
        h: Harness, ns: str, kube: KubeApi) -> None:
    before = _victim(h, ns)
    sync = h.sync(ns, "API_KEY", target=VICTIM, policy="Merge", wait=False, annotations={
        "replicator.v1.mittwald.de/replicate-to": "attacker-ns"})
    _refused(h, ns, kube, before, sync.name)


def test_another_teams_workload_named_for_a_restart_is_left_alone(
        h: Harness, ns: str, kube: KubeApi) -> None:
    before = _victim(h, ns)
    h.kube.create(deployment_path(ns), deployment(VICTIM))
    workload = h.kube.get(deployment_path(ns, WEB))
    sync = h.sync(ns, "API_KEY", target=VICTIM, policy="Merge", wait=False)
    h.kube.merge_patch(hsec_path(ns, sync.name), {"spec": {
        "rolloutRestartTargets": [{"kind": "Deployment", "name": WEB}],
        "minRestartInterval": "1s"}})
    _refused(h, ns, kube, before, sync.name)
    after = h.kube.get(deployment_path(ns, WEB))
    assert after["metadata"]["generation"] == workload["metadata"]["generation"]
    assert after["spec"]["template"] == workload["spec"]["template"]


def test_consent_lets_the_merge_in_and_a_rename_gives_the_secret_back(
        h: Harness, ns: str, kube: KubeApi) -> None:
    before = _victim(h, ns)
    sync = h.sync(ns, "API_KEY", target=VICTIM, policy="Merge", wait=False)
    h.wait_ready(ns, sync.name, reason="TargetConflict")
    kube.merge_patch(f"/api/v1/namespaces/{ns}/secrets/{VICTIM}", {"metadata": {
        "annotations": {api.ANN_ALLOW_MERGE_BY: sync.name}}})
    h.wait_data(ns, VICTIM, {**decoded(before), **sync.values})

    kube.merge_patch(hsec_path(ns, sync.name), {"spec": {"target": {"name": "app-own"}}})
    h.wait_data(ns, "app-own", sync.values)
    h.wait_data(ns, VICTIM, decoded(before))
    old = kube.secret(ns, VICTIM)
    assert old is not None
    assert old["metadata"]["labels"] == before["metadata"]["labels"]
    assert old["metadata"]["annotations"] == {**before["metadata"]["annotations"],
                                              api.ANN_ALLOW_MERGE_BY: sync.name}
    wait_for(lambda: [e for e in h.events(ns, sync.name)
                      if (e["type"], e["reason"]) == ("Normal", "PreviousTargetReleased")],
             timeout=30, what="a Normal PreviousTargetReleased Event")


TEAM_SECRET = "team-config"


def _orphaned_merge_target(h: Harness, ns: str, kube: KubeApi) -> None:
    """The team's Merge HimitsuSecret had the operator create its target; the team added
    a key and deleted the HimitsuSecret, keeping the Secret (it outlives a Merge one)."""
    team = h.sync(ns, "DB_URL", name="team", target=TEAM_SECRET, policy="Merge")
    h.wait_data(ns, TEAM_SECRET, team.values)
    kube.merge_patch(secret_path(ns, TEAM_SECRET), {"data": {
        "THEIRS": base64.b64encode(b"team-value").decode()}})
    kube.delete(hsec_path(ns, "team"))
    wait_for(lambda: kube.hsec(ns, "team") is None or None, timeout=30,
             what="the team's HimitsuSecret gone")


def test_an_owner_himitsu_secret_never_adopts_a_secret_created_for_another(
        h: Harness, ns: str, kube: KubeApi) -> None:
    _orphaned_merge_target(h, ns, kube)
    before = kube.secret(ns, TEAM_SECRET)
    h.sync(ns, "NODE_OPTIONS", name="evil", target=TEAM_SECRET, policy="Owner",
           auth_name="evil-token", wait=False)
    h.wait_ready(ns, "evil", reason="TargetConflict", message_has="delete it")
    after = kube.secret(ns, TEAM_SECRET)
    assert after == before, "the team's Secret was rewritten for the attacker"


def test_withdrawn_consent_stops_a_merge_into_a_secret_created_for_another(
        h: Harness, ns: str, kube: KubeApi) -> None:
    """The docs: "removing the annotation later stops every further write"."""
    _orphaned_merge_target(h, ns, kube)
    kube.merge_patch(secret_path(ns, TEAM_SECRET), {"metadata": {"annotations": {
        api.ANN_ALLOW_MERGE_BY: "b"}}})
    before = decoded(kube.secret(ns, TEAM_SECRET))
    b = h.sync(ns, "B_KEY", name="b", target=TEAM_SECRET, policy="Merge",
               auth_name="b-token")
    h.wait_data(ns, TEAM_SECRET, {**before, **b.values})
    kube.merge_patch(secret_path(ns, TEAM_SECRET), {"metadata": {"annotations": {
        api.ANN_ALLOW_MERGE_BY: None}}})
    before = decoded(kube.secret(ns, TEAM_SECRET))
    h.standin.set_secrets(b.env, {**b.values, "NODE_OPTIONS": "--require /tmp/x.js"})
    wait_for(lambda: "NODE_OPTIONS" in decoded(kube.secret(ns, TEAM_SECRET))
             or (ready(kube.hsec(ns, "b")) or {}).get("reason") == "TargetConflict" or None,
             timeout=60, what="b written or refused")
    assert decoded(kube.secret(ns, TEAM_SECRET)) == before, (
        "b kept writing into the Secret after its consent was withdrawn")
