"""SIGKILL in the middle of a cold sync of big payloads, restart: it converges, cleanly.

Many HimitsuSecrets, each with four values near Himitsu's 64 KiB limit (a Secret of
about 340 KB once base64-encoded), exist before any operator runs. The operator starts,
and when the audit log shows a random number of its target creations (so some writes
are done and others are in flight or queued) it is killed with SIGKILL; the test, as the
Deployment, starts it again, kills it once more at another random point, and starts it
a last time. In the end:

* every HimitsuSecret is Ready with exactly its environment's data;
* every target has exactly one ownerReference, the controller reference to its own
  HimitsuSecret (a restart that lost track would add a second or adopt wrongly);
* the namespace holds the targets and the token Secrets and nothing else;
* the audit log shows one create per target that took effect and no update at all: a
  process that restarts next to a target its predecessor wrote (perhaps without living
  to see the answer, or to record the status) recognises it instead of writing it
  again. A create cut short by the kill is audited as 504 "context canceled" although
  etcd may have stored it; either way no second create (201 or 409) may follow it.
"""

from __future__ import annotations

import os
import random
import signal
from typing import Any

import pytest

from .cluster_setup import Cluster
from .faultkit import WRITE_VERBS, AuditLog, operator_user
from .harness import Harness, Sync
from .kubehelp import KubeApi, decoded, secret_path, wait_for
from .operator_proc import OperatorLauncher

pytestmark = [pytest.mark.e2e, pytest.mark.local_only, pytest.mark.faults]

COUNT = int(os.environ.get("FAULTS_CRASH_SECRETS", "20"))
KILLS = int(os.environ.get("FAULTS_CRASH_KILLS", "2"))
KEYS = ("CERT", "KEY", "BUNDLE", "CONFIG")
VALUE_SIZE = 60_000  # Himitsu allows 65536 bytes per value
CONVERGE_TIMEOUT = 120.0


def _created(audit: AuditLog, ns: str, targets: set[str]) -> set[str]:
    return {e.name for e in audit.writes(ns, resource="secrets", user_prefix=operator_user(""))
            if e.verb == "create" and e.name in targets}


def _one_controller_reference(secret: dict[str, Any], hsec: dict[str, Any]) -> str | None:
    refs = secret["metadata"].get("ownerReferences") or []
    if len(refs) != 1:
        return f"{len(refs)} ownerReferences"
    ref = refs[0]
    if (ref.get("kind"), ref.get("name"), ref.get("uid"), ref.get("controller")) != (
            "HimitsuSecret", hsec["metadata"]["name"], hsec["metadata"]["uid"], True):
        return f"ownerReference {ref} does not name its HimitsuSecret as controller"
    return None


def _kill_at(operator: OperatorLauncher, audit: AuditLog, ns: str, targets: set[str],
             created: int, *, name: str) -> None:
    """Start an operator and SIGKILL it once ``created`` targets exist."""
    op = operator.start(name=name, wait_ready=False)
    wait_for(lambda: len(_created(audit, ns, targets)) >= created or not op.alive(),
             timeout=CONVERGE_TIMEOUT, what=f"{created} targets to be created",
             interval=0.02)
    assert op.alive(), f"the operator exited by itself:\n{op.log_tail()}"
    op.stop(signal.SIGKILL)
    assert len(_created(audit, ns, targets)) < len(targets), \
        "the cold sync finished before the kill: nothing was interrupted"


def test_killed_mid_cold_sync_converges_without_duplicates(
        h: Harness, ns: str, kube: KubeApi, cluster: Cluster,
        operator: OperatorLauncher) -> None:
    assert cluster.audit_log_path is not None
    audit = AuditLog(cluster.audit_log_path)
    syncs: list[Sync] = []
    for index in range(COUNT):
        values = {key: h.canary.padded_value(f"big{index}", VALUE_SIZE) for key in KEYS}
        env = h.standin.new_environment(values)
        token = h.token_for(env)
        h.token_secret(ns, token, name=f"token{index}")
        h.hsec(ns, f"app{index}", env, target=f"app{index}-secrets", refresh="1m",
               auth_name=f"token{index}")
        syncs.append(Sync(ns, f"app{index}", f"app{index}-secrets", env, token, values))
    targets = {s.target for s in syncs}

    rng = random.Random()
    for round_ in range(KILLS):
        done = len(_created(audit, ns, targets))
        if COUNT - done < 4:
            break  # too little left to interrupt
        # Somewhere in the first half of what is left: the kill lands mid-sync even if
        # a few more creations complete between two looks at the audit log.
        _kill_at(operator, audit, ns, targets, rng.randint(done + 1, done + (COUNT - done) // 2),
                 name=f"cold-{round_}")

    last = operator.start(name="cold-last")
    for sync in syncs:
        h.wait_ready(ns, sync.name, timeout=CONVERGE_TIMEOUT)
    assert last.alive()

    problems = []
    for sync in syncs:
        secret = kube.secret(ns, sync.target)
        hsec = h.get_hsec(ns, sync.name)
        if secret is None:
            problems.append(f"{sync.target}: missing")
            continue
        if decoded(secret) != sync.values:
            problems.append(f"{sync.target}: wrong data (keys {sorted(decoded(secret))})")
        wrong_ref = _one_controller_reference(secret, hsec)
        if wrong_ref:
            problems.append(f"{sync.target}: {wrong_ref}")
    assert not problems, problems

    names = {s["metadata"]["name"] for s in kube.get(secret_path(ns))["items"]}
    tokens = {f"token{index}" for index in range(COUNT)}
    assert names == targets | tokens, f"stray Secrets: {sorted(names - targets - tokens)}"

    # Every Secret write the operator attempted, whatever the answer. A create cut short
    # by the kill is audited 504 ("context canceled") although etcd may have stored it:
    # such a target must then be recognised, never created again (409) or rewritten.
    attempts = [e for e in audit.entries()
                if e.namespace == ns and e.resource == "secrets" and e.verb in WRITE_VERBS
                and e.user.startswith(operator_user(""))]
    problems = []
    for target in sorted(targets):
        creates = [e.code for e in attempts if e.verb == "create" and e.name == target]
        if creates.count(201) > 1 or 409 in creates:
            problems.append(f"{target} created more than once: {creates}")
        if 201 not in creates and 504 not in creates:
            problems.append(f"{target} was not created by the operator: {creates}")
    rewrites = [f"{e.verb} {e.name} {e.code}" for e in attempts if e.verb != "create"]
    assert not problems and not rewrites, (problems, rewrites)
