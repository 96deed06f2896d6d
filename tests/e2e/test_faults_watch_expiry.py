"""Watches that cannot resume: relist, repair, go on; and /healthz says when none works.

``test_watch_expired_by_compaction_relists_and_repairs``: a watch resumed from a
compacted resourceVersion gets 410 Gone.

How the test gets there, soundly:

* This module's control plane serves Secret watches from etcd, not from the apiserver's
  watch cache (``--watch-cache-sizes=secrets#0``). Behind the cache, a rewatch from a
  recent resourceVersion is answered from the cache's own window whatever etcd did, so
  compaction could not be what expires it; from etcd, compaction is exactly what does.
* The operator is frozen (SIGSTOP), then kube-apiserver is restarted: its watch
  connections close while the operator cannot read, so no event reaches it.
* While it is frozen: one target is deleted and another edited through the API (changes
  its watch will never deliver), and etcd is compacted at its current revision, as
  kube-apiserver's own compactor does every ``--etcd-compaction-interval`` (5 min by
  default; done directly here so the test does not wait for it).
* SIGCONT: the informer finds its stream closed and rewatches from its last
  resourceVersion, which etcd no longer has: 410. It must relist, and the relist must
  synthesise the delete and the update it missed.

Both HimitsuSecrets refresh hourly, so nothing but the relist can repair their targets
within the deadline. The relist is proved twice: the operator's log ("resource version
too old, relisting" for the secrets informer) and a LIST of Secrets by the operator's
ServiceAccount in the audit log after the resume. A deletion after that is repaired
from its watch event: the new watch did not stall.

``test_a_refused_watch_relists_and_fails_healthz_until_a_watch_works``: the operator
may still list Secrets but no longer watch them (its ClusterRole loses ``watch``), and
kube-apiserver restarts, so every rewatch is refused with 403. As client-go's reflector,
the informer relists after each refusal (with a backoff), so a target deleted meanwhile
is still repaired (its HimitsuSecret refreshes hourly); after ``--watch-liveness-timeout``
without a working watch /healthz fails (the kubelet would restart the pod), and it
passes again once the verb is back and a watch works.
"""

from __future__ import annotations

import base64
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from .canary import Canary, LeakEvidence
from .faultkit import AuditLog, FaultCluster, dedicated_cluster, log_events, operator_user
from .kubehelp import REPO, secret_path, wait_for
from .standin_client import StandinClient

pytestmark = [pytest.mark.e2e, pytest.mark.local_only, pytest.mark.faults]

REPAIR_TIMEOUT = 30.0
# A relist comes at most one capped backoff (30 s) after the previous refusal.
RELIST_REPAIR_TIMEOUT = 75.0
LIVENESS = "10s"
CLUSTER_ROLE = "/apis/rbac.authorization.k8s.io/v1/clusterroles/" + yaml.safe_load(
    (REPO / "deploy" / "rbac" / "role.yaml").read_text())["metadata"]["name"]


@pytest.fixture(scope="module")
def fc(session_dir: Path, standin: StandinClient, canary: Canary,
       leak_evidence: LeakEvidence) -> Iterator[FaultCluster]:
    with dedicated_cluster(session_dir / "faults-watch-expiry", standin=standin, canary=canary,
                           leak_evidence=leak_evidence,
                           extra_apiserver_args=("--watch-cache-sizes=secrets#0",)) as cluster:
        yield cluster


def test_watch_expired_by_compaction_relists_and_repairs(fc: FaultCluster) -> None:
    h, kube, ns = fc.h, fc.kube, fc.namespace("expiry")
    launcher = fc.launcher()
    try:
        op = launcher.start(name="expiry")
        gone = h.sync(ns, "API_KEY", name="gone", target="gone-secrets", refresh="1h",
                      auth_name="gone-token")
        edited = h.sync(ns, "API_KEY", name="edited", target="edited-secrets", refresh="1h",
                        auth_name="edited-token")
        h.wait_data(ns, gone.target, gone.values)
        h.wait_data(ns, edited.target, edited.values)
        audit = AuditLog(fc.audit_log_path)

        os.kill(op.pid, signal.SIGSTOP)
        try:
            fc.local.stop_apiserver()
            fc.local.start_apiserver()
            kube.delete(secret_path(ns, gone.target))
            tampered = base64.b64encode(h.canary.value("tampered").encode()).decode()
            kube.merge_patch(secret_path(ns, edited.target), {"data": {"API_KEY": tampered}})
            revision = fc.etcd.revision()
            fc.etcd.compact(revision)
            assert fc.etcd.compacted_past(revision)
        finally:
            resumed = time.time()
            os.kill(op.pid, signal.SIGCONT)

        h.wait_data(ns, gone.target, gone.values, timeout=REPAIR_TIMEOUT)
        h.wait_data(ns, edited.target, edited.values, timeout=REPAIR_TIMEOUT)

        assert log_events(op, "resource version too old, relisting", informer="secrets"), \
            "the secrets informer never saw its resourceVersion expire"
        relists = [e for e in audit.entries()
                   if e.verb == "list" and e.resource == "secrets" and e.namespace == ""
                   and e.user == operator_user() and e.received >= resumed]
        assert relists, "no LIST of Secrets by the operator after it resumed"

        kube.delete(secret_path(ns, gone.target))
        h.wait_data(ns, gone.target, gone.values, timeout=REPAIR_TIMEOUT)
        h.wait_ready(ns, gone.name)
        h.wait_ready(ns, edited.name)
        assert op.alive()
    finally:
        launcher.stop_all()


def _without_secret_watch(rules: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{**rule, "verbs": [v for v in rule["verbs"] if v != "watch"]}
            if rule.get("apiGroups") == [""] and "secrets" in rule.get("resources", [])
            else rule for rule in rules]


def test_a_refused_watch_relists_and_fails_healthz_until_a_watch_works(
        fc: FaultCluster) -> None:
    h, kube, ns = fc.h, fc.kube, fc.namespace("refused")
    rules = kube.get(CLUSTER_ROLE)["rules"]
    launcher = fc.launcher()
    try:
        op = launcher.start("--watch-liveness-timeout", LIVENESS, name="refused")
        denied = h.sync(ns, "API_KEY", name="denied", target="denied-secrets", refresh="1h",
                        auth_name="denied-token")
        h.wait_data(ns, denied.target, denied.values)
        audit = AuditLog(fc.audit_log_path)
        kube.merge_patch(CLUSTER_ROLE, {"rules": _without_secret_watch(rules)})
        try:
            fc.local.stop_apiserver()  # ends the watches; every rewatch is now a 403
            fc.local.start_apiserver()
            refused_since = time.time()
            kube.delete(secret_path(ns, denied.target))  # no watch will ever say so
            h.wait_data(ns, denied.target, denied.values, timeout=RELIST_REPAIR_TIMEOUT)
            assert log_events(op, "watch failed, relisting after a backoff",
                              informer="secrets"), "a refused watch did not relist"
            relists = [e for e in audit.entries()
                       if e.verb == "list" and e.resource == "secrets" and e.code == 200
                       and e.user == operator_user() and e.received >= refused_since]
            assert relists, "no LIST of Secrets by the operator while its watch was refused"
            wait_for(lambda: op.probe("/healthz") == 500, timeout=60.0,
                     what=f"/healthz to fail after {LIVENESS} without a working watch")
        finally:
            kube.merge_patch(CLUSTER_ROLE, {"rules": rules})
        wait_for(lambda: op.probe("/healthz") == 200, timeout=60.0,
                 what="/healthz to pass once a watch works again")
        kube.delete(secret_path(ns, denied.target))  # now the watch sees it
        h.wait_data(ns, denied.target, denied.values, timeout=REPAIR_TIMEOUT)
        h.wait_ready(ns, denied.name)
        assert op.alive()
    finally:
        launcher.stop_all()
