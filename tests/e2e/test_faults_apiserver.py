"""kube-apiserver goes away for a while and comes back: nothing is lost, nothing doubled.

These tests stop kube-apiserver, so they run on a control plane of their own (one per
module), never the session's. Three kinds of work are in flight when it goes:

* a HimitsuSecret whose reconcile is mid-way (its Himitsu answer is held back a few
  seconds, so the Secret write lands in the outage): it must fail, be retried, and end
  Ready, its target written exactly once, after the apiserver returned;
* a target deleted while the apiserver is down. Nothing can delete through the API then,
  so the test deletes it in etcd, behind the apiserver's back: a change the operator's
  watch cannot have seen. Its HimitsuSecret refreshes hourly, so only the informer
  (rewatch or relist on reconnect) can bring the target back within the deadline;
* a steady HimitsuSecret, whose target must not be rewritten by the recovery.

Without ``--leader-elect`` the process rides the outage out: alive, /healthz 200, /readyz
failing once its watches have failed to reconnect for 30 s (the design's threshold, so
the outage lasts at least that long; ``FAULTS_APISERVER_OUTAGE`` sets a longer one), and
ready again after. With ``--leader-elect`` the leader cannot renew, exits non-zero, and
the test, playing the Deployment, starts it again until it leads and converges.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from himitsu_controller.runtime.manager import UNHEALTHY_WATCH_THRESHOLD

from . import cluster_setup
from .canary import Canary, LeakEvidence
from .faultkit import (
    AuditLog,
    FaultCluster,
    Supervisor,
    dedicated_cluster,
    env_seconds,
    hold,
    leading,
    log_events,
    operator_user,
)
from .harness import Harness, Sync
from .kubehelp import rv, secret_path, wait_for
from .operator_proc import OperatorProcess
from .standin_client import StandinClient

pytestmark = [pytest.mark.e2e, pytest.mark.local_only, pytest.mark.faults]

# At least this long; without leader election the outage lasts until /readyz has failed.
OUTAGE_SECONDS = env_seconds("FAULTS_APISERVER_OUTAGE", 15.0)
LE_OUTAGE_SECONDS = env_seconds("FAULTS_APISERVER_OUTAGE_LE", 15.0)
# How long Himitsu holds the in-flight reconcile's answer: longer than stopping the
# apiserver takes (about a second here), so its Secret write meets the outage.
IN_FLIGHT_DELAY = 6.0
LEASE = ("4s", "3s", "1s")  # duration, renew deadline, retry period
RENEW_DEADLINE = 3.0
RECOVERY_TIMEOUT = 60.0


@pytest.fixture(scope="module")
def fc(session_dir: Path, standin: StandinClient, canary: Canary,
       leak_evidence: LeakEvidence) -> Iterator[FaultCluster]:
    with dedicated_cluster(session_dir / "faults-apiserver", standin=standin, canary=canary,
                           leak_evidence=leak_evidence) as cluster:
        yield cluster


def _start_in_flight(h: Harness, ns: str, name: str) -> Sync:
    """A new HimitsuSecret whose reconcile is waiting on Himitsu when this returns."""
    env, values = h.environment("API_KEY")
    token = h.token_for(env)
    h.token_secret(ns, token, name=f"{name}-token")
    h.standin.fault("delay", env=env, seconds=IN_FLIGHT_DELAY, count=1)
    h.hsec(ns, name, env, target=f"{name}-secrets", refresh="3s", auth_name=f"{name}-token")
    wait_for(lambda: h.standin.requests(env), timeout=30,
             what=f"the operator to ask Himitsu for {name}")
    return Sync(ns, name, f"{name}-secrets", env, token, values)


def _target_writes(audit: AuditLog, ns: str, target: str) -> list[float]:
    return [e.received for e in audit.writes(ns, resource="secrets", name=target,
                                              user_prefix=operator_user(""))]


def test_outage_without_leader_election(fc: FaultCluster) -> None:
    h, ns = fc.h, fc.namespace("outage")
    launcher = fc.launcher()
    try:
        op = launcher.start(name="outage")
        audit = AuditLog(fc.audit_log_path)
        steady = h.sync(ns, "API_KEY", name="steady", target="steady-secrets", refresh="3s",
                        auth_name="steady-token")
        victim = h.sync(ns, "API_KEY", name="victim", target="victim-secrets", refresh="1h",
                        auth_name="victim-token")
        steady_before = h.wait_data(ns, steady.target, steady.values)
        h.wait_data(ns, victim.target, victim.values)
        fresh = _start_in_flight(h, ns, "fresh")

        fc.local.stop_apiserver()
        try:
            fc.etcd.delete_secret(ns, victim.target)
            readyz: list[int] = []

            def alive_and_live() -> str | None:
                if not op.alive():
                    return f"the operator exited with {op.proc.returncode}"
                if op.probe("/healthz") != 200:
                    return "/healthz failed: a kubelet would restart a healthy process"
                readyz.append(op.probe("/readyz"))
                return None

            hold(alive_and_live, seconds=OUTAGE_SECONDS, until=lambda: 500 in readyz,
                 limit=max(OUTAGE_SECONDS, UNHEALTHY_WATCH_THRESHOLD) + 30,
                 what="the operator while kube-apiserver is down")
        finally:
            back = time.time()  # it serves writes before its /readyz passes
            fc.local.start_apiserver()

        wait_for(lambda: op.probe("/readyz") == 200, timeout=RECOVERY_TIMEOUT,
                 what="/readyz to pass again")
        h.wait_ready(ns, fresh.name, timeout=RECOVERY_TIMEOUT)
        h.wait_data(ns, fresh.target, fresh.values)
        h.wait_data(ns, victim.target, victim.values, timeout=RECOVERY_TIMEOUT)
        h.wait_ready(ns, steady.name, timeout=RECOVERY_TIMEOUT)
        assert readyz[0] == 200, "/readyz failed at once; the design allows 30 s of retries"
        assert op.alive(), "the operator exited after the outage"

        # The in-flight reconcile failed in the outage and was retried: one write, after.
        assert log_events(op, "sync failed", key=f"{ns}/{fresh.name}",
                          reason="WriteFailure"), "the in-flight write did not meet the outage"
        fresh_writes = _target_writes(audit, ns, fresh.target)
        assert len(fresh_writes) == 1 and fresh_writes[0] >= back, fresh_writes
        # Recovery rewrote nothing that was right.
        assert rv(fc.kube.secret(ns, steady.target)) == rv(steady_before)
        assert len(_target_writes(audit, ns, steady.target)) == 1  # its creation
        victim_writes = _target_writes(audit, ns, victim.target)
        assert len(victim_writes) == 2 and victim_writes[1] >= back, victim_writes

        # The watches are live again: a deletion now is repaired from its watch event
        # (the hourly refresh could not do it in time).
        fc.kube.delete(secret_path(ns, victim.target))
        h.wait_data(ns, victim.target, victim.values, timeout=30)
    finally:
        launcher.stop_all()


def test_outage_with_leader_election(fc: FaultCluster) -> None:
    h, ns = fc.h, fc.namespace("outage-le")
    lease = cluster_setup.lease_name(fc.kube, "faults")
    flags = ("--leader-elect", "--leader-election-namespace", cluster_setup.OPERATOR_NAMESPACE,
             "--leader-election-id", lease, "--leader-election-lease-duration", LEASE[0],
             "--leader-election-renew-deadline", LEASE[1],
             "--leader-election-retry-period", LEASE[2])
    launcher = fc.launcher()
    supervisor = Supervisor(launcher, *flags, name="le-outage")
    try:
        audit = AuditLog(fc.audit_log_path)
        first = supervisor.start()
        wait_for(lambda: leading(first, lease), timeout=30, what="the first process to lead")
        steady = h.sync(ns, "API_KEY", name="steady", target="steady-secrets", refresh="2s",
                        auth_name="steady-token")
        h.wait_data(ns, steady.target, steady.values)
        fresh = _start_in_flight(h, ns, "fresh")

        fc.local.stop_apiserver()
        down = time.monotonic()
        try:
            exits = wait_for(lambda: list(supervisor.exits), timeout=RENEW_DEADLINE + 30,
                             what="the leader to give up once it cannot renew")
            assert exits[0] != 0, "a leader that lost its Lease must exit non-zero"

            def nobody_leads() -> str | None:
                current = supervisor.current
                if time.monotonic() - down > RENEW_DEADLINE + 2 and leading(current, lease):
                    return f"{current.name} claims to lead with no apiserver to renew with"
                return None

            hold(nobody_leads, seconds=LE_OUTAGE_SECONDS,
                 what="the replicas while kube-apiserver is down")
        finally:
            back = time.time()  # it serves writes before its /readyz passes
            fc.local.start_apiserver()

        leader: OperatorProcess = wait_for(
            lambda: supervisor.current if leading(supervisor.current, lease) else None,
            timeout=RECOVERY_TIMEOUT, what="a restarted process to lead")
        assert leader is not first
        h.wait_ready(ns, fresh.name, timeout=RECOVERY_TIMEOUT)
        h.wait_data(ns, fresh.target, fresh.values)
        synced_after = h.wait_ready(ns, steady.name, timeout=RECOVERY_TIMEOUT)
        # The new leader keeps polling: lastSyncTime moves on past the recovery.
        wait_for(lambda: h.get_hsec(ns, steady.name)["status"]["lastSyncTime"]
                 != synced_after["status"]["lastSyncTime"], timeout=30,
                 what="the new leader to poll the steady HimitsuSecret")

        # Nothing written twice: each target was written once, by whoever led then.
        assert len(_target_writes(audit, ns, steady.target)) == 1
        fresh_writes = _target_writes(audit, ns, fresh.target)
        assert len(fresh_writes) == 1 and fresh_writes[0] >= back, fresh_writes
        assert all(code != 0 for code in supervisor.exits), supervisor.exits
    finally:
        supervisor.stop()
        launcher.stop_all()

