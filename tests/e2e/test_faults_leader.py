"""The leader dies or is stopped under load: the standby takes over in time, never alongside.

test_leader_election.py shows that a killed leader is replaced and that SIGTERM releases
the Lease. This adds the bounds and the load: six HimitsuSecrets polled every second keep
both replicas' would-be writes (Secrets, status, Events) coming, and then

* SIGKILL the leader: the standby holds the Lease within LeaseDuration + RetryPeriod
  (with client-go's 1.2 jitter factor) plus slack, and syncs a change made upstream;
* the test, playing the Deployment, starts the killed replica again: it waits as standby;
* SIGTERM the new leader: the restarted replica leads within a few seconds, well inside
  the lease duration, which only a released Lease allows; it syncs the next change;
* the audit log, which names the ServiceAccount behind every write, shows the writes of
  the replicas as consecutive eras (first leader, standby, restarted replica) that never
  overlap: after one replica's first write, the one before it wrote nothing more.

And when only the leader's connections hang (a proxy in front of the apiserver for that
process freezes), it stops writing before its Lease can be taken, gives up within the
renew deadline, and writes nothing once its network comes back: reset, or restored
with whatever it had queued (it must have aborted its hung writes by then).
"""

from __future__ import annotations

import itertools
import signal
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import yaml

from . import cluster_setup
from .cluster_setup import Cluster
from .faultkit import AuditEntry, AuditLog, leading, log_events, operator_user
from .harness import Harness, Sync
from .kubehelp import KubeApi, wait_for
from .operator_proc import OperatorLauncher, OperatorProcess
from .tcpproxy import FreezableProxy

pytestmark = [pytest.mark.e2e, pytest.mark.local_only, pytest.mark.faults]

SECOND_SA = "himitsu-operator-b"
THIRD_SA = "himitsu-operator-c"
HUNG_SA = "himitsu-operator-d"
LEASE = ("12s", "8s", "1s")  # duration, renew deadline, retry period
LEASE_DURATION, RETRY_PERIOD = 12.0, 1.0
JITTER_FACTOR = 1.2  # client-go's, for the acquire loop
SLACK = 5.0
TAKEOVER_AFTER_KILL = LEASE_DURATION + RETRY_PERIOD * (1 + JITTER_FACTOR) + SLACK
HANDOVER_AFTER_TERM = 6.0  # half the lease duration: only a released Lease allows it
LOAD = 6
SHORT_LEASE = ("4s", "3s", "1s")
# The hung-leader test checks a margin: a write may run until renew deadline + half of
# (lease - renew deadline) after its renewal, the standby leads a lease later. With 4s/3s
# that is 0.5 s for a watchdog thread on a loaded 2-core machine; the defaults' shape
# (12s/8s: 2 s) keeps it a test of the rule rather than of the scheduler.
HANG_LEASE = LEASE
# Longer than it takes the standby to lead and write (lease duration + a poll), shorter
# than the Himitsu client's 15 s read timeout.
HELD_ANSWER = 12.0
LEASE_API = f"/apis/coordination.k8s.io/v1/namespaces/{cluster_setup.OPERATOR_NAMESPACE}/leases"


@pytest.fixture(scope="module")
def third_kubeconfig(kube: KubeApi, operator_kubeconfig: str, session_dir: Path) -> str:
    """An identity of this module's own, whose leader-election binding a test may revoke."""
    cluster_setup.add_service_account(kube, THIRD_SA)
    return str(cluster_setup.service_account_kubeconfig(
        kube, THIRD_SA, session_dir / "faults-operator-c.kubeconfig"))


@dataclass
class Proxied:
    proxy: FreezableProxy
    kubeconfig: str


@pytest.fixture
def proxied(kube: KubeApi, operator_kubeconfig: str, session_dir: Path) -> Iterator[Proxied]:
    """An identity of its own that reaches the apiserver through a FreezableProxy."""
    cluster_setup.add_service_account(kube, HUNG_SA)
    path = cluster_setup.service_account_kubeconfig(
        kube, HUNG_SA, session_dir / "faults-operator-d.kubeconfig")
    config = yaml.safe_load(path.read_text())
    server = urlsplit(config["clusters"][0]["cluster"]["server"])
    assert server.hostname and server.port, server
    proxy = FreezableProxy((server.hostname, server.port)).start()
    config["clusters"][0]["cluster"]["server"] = f"https://127.0.0.1:{proxy.port}"
    path.write_text(yaml.safe_dump(config))
    try:
        yield Proxied(proxy, str(path))
    finally:
        proxy.stop()


@pytest.fixture(scope="module")
def second_kubeconfig(kube: KubeApi, operator_kubeconfig: str, session_dir: Path) -> str:
    cluster_setup.add_service_account(kube, SECOND_SA)
    return str(cluster_setup.service_account_kubeconfig(
        kube, SECOND_SA, session_dir / "faults-operator-b.kubeconfig"))


@dataclass
class Replicas:
    """Starts replicas on one fresh Lease, as one ServiceAccount or the other."""

    launcher: OperatorLauncher
    kubeconfigs: dict[str, str]
    lease: str

    def start(self, service_account: str, name: str,
              timings: tuple[str, str, str] = LEASE) -> OperatorProcess:
        flags = ("--leader-elect",
                 "--leader-election-namespace", cluster_setup.OPERATOR_NAMESPACE,
                 "--leader-election-id", self.lease,
                 "--leader-election-lease-duration", timings[0],
                 "--leader-election-renew-deadline", timings[1],
                 "--leader-election-retry-period", timings[2])
        return self.launcher.start(*flags, name=name,
                                   kubeconfig=self.kubeconfigs[service_account])


@pytest.fixture
def replicas(operator: OperatorLauncher, operator_kubeconfig: str, kube: KubeApi,
             second_kubeconfig: str, third_kubeconfig: str) -> Replicas:
    return Replicas(operator, lease=cluster_setup.lease_name(kube, "faults"), kubeconfigs={
        cluster_setup.OPERATOR_SA: operator_kubeconfig, SECOND_SA: second_kubeconfig,
        THIRD_SA: third_kubeconfig})


def _identity(op: OperatorProcess) -> str:
    found = log_events(op, "became leader")
    assert found, f"{op.name} never logged 'became leader'"
    return str(found[-1]["identity"])


def _holder(kube: KubeApi, lease: str) -> str:
    return str(kube.get(f"{LEASE_API}/{lease}")["spec"].get("holderIdentity") or "")


def _change_upstream(h: Harness, sync: Sync) -> None:
    changed = h.canary.values("API_KEY")
    h.standin.set_secrets(sync.env, changed)
    h.wait_data(sync.namespace, sync.target, changed, timeout=20)


def _eras(writes: list[AuditEntry]) -> list[list[AuditEntry]]:
    """Consecutive runs of writes by one user, in order of receipt."""
    eras: list[list[AuditEntry]] = []
    for entry in writes:
        if eras and eras[-1][0].user == entry.user:
            eras[-1].append(entry)
        else:
            eras.append([entry])
    return eras


def test_killed_and_stopped_leaders_hand_over_without_two_writers(
        h: Harness, ns: str, kube: KubeApi, cluster: Cluster, replicas: Replicas) -> None:
    assert cluster.audit_log_path is not None
    audit = AuditLog(cluster.audit_log_path)
    lease = replicas.lease
    started = [(replicas.start(sa, f"replica-{sa}"), sa)
               for sa in (cluster_setup.OPERATOR_SA, SECOND_SA)]
    (leader, leader_sa), (standby, standby_sa) = wait_for(
        lambda: next(((one, other) for one, other in (started, started[::-1])
                      if leading(one[0], lease)), None),
        timeout=30, what="a leader")
    syncs = [h.sync(ns, "API_KEY", name=f"app{i}", target=f"app{i}-secrets", refresh="1s",
                    auth_name=f"token{i}", wait=False) for i in range(LOAD)]
    for sync in syncs:
        h.wait_data(ns, sync.target, sync.values)

    leader.stop(signal.SIGKILL)
    wait_for(lambda: leading(standby, lease), timeout=TAKEOVER_AFTER_KILL,
             what="the standby to take over from the killed leader")
    assert _holder(kube, lease) == _identity(standby)
    _change_upstream(h, syncs[0])

    restarted = replicas.start(leader_sa, "replica-restarted")
    wait_for(lambda: log_events(restarted, "lease holder observed"), timeout=30,
             what="the restarted replica to see the current holder")
    assert not leading(restarted, lease)

    assert standby.stop(signal.SIGTERM) == 0
    wait_for(lambda: leading(restarted, lease), timeout=HANDOVER_AFTER_TERM,
             what="the restarted replica to take the released Lease")
    _change_upstream(h, syncs[1])
    # A few more rounds of polls by the last leader, then read the timeline.
    settled = time.time()
    wait_for(lambda: any(e.received > settled + 2 for e in audit.writes(ns)), timeout=20,
             what="the last leader's writes")

    writes = audit.writes(ns, user_prefix=operator_user(""))
    eras = _eras(writes)
    users = [era[0].user for era in eras]
    first, second = operator_user(leader_sa), operator_user(standby_sa)
    assert users == [first, second, first], (
        f"writers interleave or a leader did not write: {users}")
    for before, after in itertools.pairwise(eras):
        last = max(e.completed for e in before)
        assert last <= after[0].received, (
            f"{before[-1].user} was still writing ({last}) when {after[0].user} began "
            f"({after[0].received})")


def test_a_leader_that_cannot_renew_stops_writing_before_a_standby_leads(
        h: Harness, ns: str, kube: KubeApi, cluster: Cluster, replicas: Replicas) -> None:
    """The leader loses its Lease while a reconcile of it waits on a slow Himitsu answer.

    Its renewals are refused (its leader-election RoleBinding is revoked; everything else
    it may still do), so it gives up after the renew deadline, and a standby may lead one
    lease duration after its last renewal. The reconcile in flight must not complete its
    writes after that: a replica that lost its Lease exits without draining.
    """
    assert cluster.audit_log_path is not None
    audit = AuditLog(cluster.audit_log_path)
    lease = replicas.lease
    leader = replicas.start(THIRD_SA, "doomed", timings=SHORT_LEASE)
    wait_for(lambda: leading(leader, lease), timeout=30, what="the doomed replica to lead")
    standby = replicas.start(SECOND_SA, "standby", timings=SHORT_LEASE)
    busy = h.sync(ns, "API_KEY", name="busy", target="busy-secrets", refresh="1s",
                  auth_name="busy-token")
    held = h.sync(ns, "API_KEY", name="held", target="held-secrets", refresh="2s",
                  auth_name="held-token")
    mark = h.standin.mark(held.env)
    h.standin.fault("delay", env=held.env, seconds=HELD_ANSWER, count=1)
    wait_for(lambda: h.standin.requests_after(held.env, mark), timeout=30,
             what="the leader to ask Himitsu for the held HimitsuSecret")

    kube.delete(f"/apis/rbac.authorization.k8s.io/v1/namespaces/"
                f"{cluster_setup.OPERATOR_NAMESPACE}/rolebindings/{THIRD_SA}-leader-election")
    wait_for(lambda: leading(standby, lease), timeout=30,
             what="the standby to take over from the leader that cannot renew")
    exit_code = leader.proc.wait(timeout=60)
    assert exit_code != 0
    h.wait_ready(ns, busy.name)
    # Past the moment the held answer came: whatever the old leader would still write.
    wait_for(lambda: h.standin.count(held.env, after=mark) >= 2, timeout=30,
             what="the new leader to poll the held HimitsuSecret")
    # Its status patch follows that request by milliseconds: wait for it in the audit log
    # rather than read the log in between (then the new leader may have written nothing).
    wait_for(lambda: any(e.user == operator_user(SECOND_SA) and e.name == held.name
                         for e in audit.writes(ns, user_prefix=operator_user(""))),
             timeout=30, what="the new leader's first write for the held HimitsuSecret")
    writes = audit.writes(ns, user_prefix=operator_user(""))
    users = [era[0].user for era in _eras(writes)]
    assert users == [operator_user(THIRD_SA), operator_user(SECOND_SA)], (
        f"the replica that lost its Lease wrote after the new leader began: {users}")


def _logged_at(record: dict[str, object]) -> float:
    return datetime.fromisoformat(str(record["timestamp"]).replace("Z", "+00:00")).timestamp()


@pytest.mark.parametrize("comeback", ["cut", "thaw"])
def test_a_leader_whose_connections_hang_writes_nothing_once_its_lease_can_be_taken(
        h: Harness, ns: str, cluster: Cluster, replicas: Replicas, proxied: Proxied, *,
        comeback: str) -> None:
    """Only the leader's connections hang, the standby's work; later they come back.

    The leader's renewals get no answer, nor do its reconciles' writes. It must stop
    writing before the standby may take the Lease (renew deadline after its last renewal
    was sent) and give up within the renew deadline however its requests hang. Then its
    network comes back, in one of two ways:

    * ``cut``, once the new leader wrote: the hung connections are reset and new ones
      forwarded; a leader that still thought it led (its renewals waiting out retries)
      would now write next to the new one;
    * ``thaw``, as soon as the standby leads: nothing is reset, and whatever the old
      leader had queued on its hung connections is delivered, unless it aborted them:
      a write it let through and then left waiting would land after the takeover. Its
      writes must all have been aborted (reset) before the Lease could be taken.
    """
    assert cluster.audit_log_path is not None
    audit = AuditLog(cluster.audit_log_path)
    lease = replicas.lease
    replicas.kubeconfigs[HUNG_SA] = proxied.kubeconfig
    leader = replicas.start(HUNG_SA, "hung-leader", timings=HANG_LEASE)
    wait_for(lambda: leading(leader, lease), timeout=30, what="the proxied replica to lead")
    standby = replicas.start(SECOND_SA, "standby", timings=HANG_LEASE)
    wait_for(lambda: log_events(standby, "lease holder observed"), timeout=30,
             what="the standby to see the leader's Lease")
    syncs = [h.sync(ns, "API_KEY", name=f"hung{i}", target=f"hung{i}-secrets", refresh="1s",
                    auth_name=f"hung-token{i}", wait=False) for i in range(3)]
    for sync in syncs:
        h.wait_data(ns, sync.target, sync.values)
    old, new = operator_user(HUNG_SA), operator_user(SECOND_SA)

    proxied.proxy.freeze()
    frozen_at = time.time()
    wait_for(lambda: leading(standby, lease), timeout=TAKEOVER_AFTER_KILL,
             what="the standby to take over from the leader whose connections hang")
    if comeback == "thaw":
        proxied.proxy.thaw()  # the old leader's network is back, nothing reset
    wait_for(lambda: any(e.user == new for e in audit.writes(ns, user_prefix=new)),
             timeout=30, what="the new leader's first write")
    if comeback == "cut":
        proxied.proxy.cut()  # the old leader's network is back
    exit_code = leader.proc.wait(timeout=60)
    assert exit_code != 0
    exited = time.time()
    # The audit log is complete up to the old leader's exit once a later write is in it.
    wait_for(lambda: any(e.received > exited for e in audit.writes(ns, user_prefix=new)),
             timeout=30, what="a write of the new leader after the old one exited")
    writes = audit.writes(ns, user_prefix=operator_user(""))
    users = [era[0].user for era in _eras(writes)]
    taken = min(e.completed for e in audit.writes(cluster_setup.OPERATOR_NAMESPACE,
                                                  resource="leases")
                if e.user == new and e.name == lease)
    late = [(e.verb, e.resource, e.name, round(e.received - taken, 2)) for e in writes
            if e.user == old and e.completed > taken]
    assert not late, f"the old leader's writes landed after the standby took the Lease: {late}"
    assert users == [old, new], (
        f"the leader whose connections hung wrote after the new leader began: {users}")
    (lost,) = log_events(leader, "leadership lost: could not renew the lease in time")
    last_old = max((e.completed for e in writes if e.user == old), default=frozen_at)
    print(f"{comeback}: leader stopped leading {_logged_at(lost) - frozen_at:.1f} s after its "
          f"connections hung (lease {HANG_LEASE[0]}, renew deadline {HANG_LEASE[1]}); "
          f"its last write completed {taken - last_old:.2f} s before the takeover")
