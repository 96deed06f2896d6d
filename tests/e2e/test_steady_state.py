"""In steady state every poll is a conditional request answered 304, and nothing is rewritten
(nor read: the Secret cache's summary of the target tells it intact)."""

from __future__ import annotations

import time

import pytest

from .cluster_setup import Cluster
from .faultkit import AuditLog, operator_user
from .harness import Harness
from .kubehelp import KubeApi, rv, wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.usefixtures("default_operator")]

REFRESH_SECONDS = 2.0
POLLS = 5


def test_steady_state_answers_304_and_leaves_the_secret_alone(h: Harness, ns: str,
                                                               kube: KubeApi) -> None:
    sync = h.sync(ns, "API_KEY", "DB_PASSWORD", refresh="2s")
    wait_for(lambda: h.standin.count(sync.env, status=304) >= 1, timeout=30,
             what="the first conditional poll")
    secret_rv = rv(kube.secret(ns, sync.target))
    generation = h.get_hsec(ns, sync.name)["metadata"]["generation"]
    mark = h.standin.mark(sync.env)
    started = time.monotonic()

    wait_for(lambda: h.standin.count(sync.env, status=304, after=mark) >= POLLS, timeout=60,
             what=f"{POLLS} more polls answered 304")
    elapsed = time.monotonic() - started
    polls = h.standin.requests_after(sync.env, mark)

    version = h.standin.info(sync.env)["configVersion"]
    assert [p["status"] for p in polls] == [304] * len(polls)
    assert {p["if_none_match"] for p in polls} == {f'"himi-config-{version}"'}
    # One poll per refreshInterval: our own status writes must not cause extra polls.
    assert len(polls) <= elapsed / REFRESH_SECONDS + 2, (len(polls), elapsed)
    assert rv(kube.secret(ns, sync.target)) == secret_rv
    obj = h.get_hsec(ns, sync.name)
    assert obj["metadata"]["generation"] == generation
    assert obj["status"]["configVersion"] == version


def test_steady_state_polls_read_no_target_whatever_the_template_stamps(
        h: Harness, ns: str, kube: KubeApi, cluster: Cluster) -> None:
    # Every label and annotation a template stamps must be one the Secret cache keeps:
    # one it dropped would make the target look pruned at every poll (a full fetch and a
    # GET of the target each time, as a last-applied annotation did).
    if cluster.audit_log_path is None:
        pytest.skip("counts the operator's requests in the local control plane's audit log")
    sync = h.sync(ns, "API_KEY", refresh="2s", labels={"team": "payments"},
                  annotations={"example.com/owner": "payments",
                               "kubectl.kubernetes.io/restartedAt": "2024-01-01T00:00:00Z"})
    wait_for(lambda: h.standin.count(sync.env, status=304) >= 1, timeout=30,
             what="the first conditional poll")
    secret_rv = rv(kube.secret(ns, sync.target))
    audit = AuditLog(cluster.audit_log_path)
    mark = h.standin.mark(sync.env)
    wait_for(lambda: len(h.standin.requests_after(sync.env, mark)) >= POLLS, timeout=60,
             what=f"{POLLS} more polls")
    polls = h.standin.requests_after(sync.env, mark)
    gets = [e for e in audit.entries() if e.verb == "get" and e.resource == "secrets"
            and e.namespace == ns and e.name == sync.target and e.user == operator_user()]
    assert [p["status"] for p in polls] == [304] * len(polls), polls
    assert rv(kube.secret(ns, sync.target)) == secret_rv
    assert gets == [], f"{len(gets)} GETs of the target in {len(polls)} steady-state polls"
