"""Building blocks of the fault suite (tests/e2e/test_faults_*.py).

Why a kit of its own: the fault tests need things no other e2e test does. A control plane
of their own, because stopping kube-apiserver or compacting etcd under the session
cluster would disturb every other test; etcd itself, to change what the apiserver
serves while it is down and to compact history; the apiserver audit log read as a
timeline (who wrote what, when); and a stand-in for the Deployment controller that
restarts an operator process when it exits. Fault *durations* are parameters (module
constants overridable by environment variables, short by default), and every wait is a
poll against a deadline: a fault lasting N seconds is a condition held and checked for N
seconds, never a bare sleep.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import re
import secrets
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import requests
from prometheus_client.parser import text_string_to_metric_families

from localcluster import LocalCluster, ensure_binaries

from . import cluster_setup
from .canary import Canary, LeakEvidence
from .harness import Harness
from .kubehelp import REPO, KubeApi
from .operator_proc import OperatorLauncher, OperatorProcess
from .standin_client import StandinClient

WRITE_VERBS = frozenset({"create", "update", "patch", "delete"})
HOLD_INTERVAL = 0.25


def bin_dir() -> Path:
    """The control-plane binaries, as conftest finds them (built on demand)."""
    return ensure_binaries(Path(os.environ.get("E2E_KUBE_BIN_DIR")
                                or REPO / "hack" / "kube" / "bin"))


def env_seconds(name: str, default: float) -> float:
    """A fault duration: ``$name`` if set (seconds), else ``default``."""
    raw = os.environ.get(name)
    return float(raw) if raw else default


# -- holding a condition for the length of a fault ------------------------------------------
def hold(check: Callable[[], str | None], *, seconds: float, what: str,
         until: Callable[[], bool] | None = None, limit: float | None = None,
         interval: float = HOLD_INTERVAL) -> int:
    """Check ``check`` (None = fine, else the problem) throughout a fault; the checks made.

    Lasts ``seconds``, and then, with ``until``, on until ``until()`` holds too (at most
    ``limit`` seconds in all). A problem fails at once, naming ``what``.
    """
    started = time.monotonic()
    checks = 0
    while True:
        problem = check()
        checks += 1
        if problem is not None:
            raise AssertionError(f"{what}: {problem} "
                                 f"({time.monotonic() - started:.1f} s into the fault)")
        elapsed = time.monotonic() - started
        if elapsed >= seconds and (until is None or until()):
            return checks
        if limit is not None and elapsed >= limit:
            raise AssertionError(f"{what}: the condition that ends the fault never came "
                                 f"within {limit:.0f} s")
        time.sleep(interval)


# -- the apiserver audit log as a timeline ----------------------------------------------------
@dataclass(frozen=True)
class AuditEntry:
    """One completed request, as the apiserver's audit log records it."""

    verb: str
    user: str
    resource: str
    namespace: str
    name: str
    code: int
    received: float  # epoch seconds, the apiserver's clock (this machine's)
    completed: float

    @property
    def is_write(self) -> bool:
        return self.verb in WRITE_VERBS and 200 <= self.code < 300


def _epoch(stamp: str) -> float:
    return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


class AuditLog:
    """Incremental reader of a kube-apiserver audit log (JSON lines, Metadata level)."""

    def __init__(self, path: Path, *, from_end: bool = True) -> None:
        self.path = path
        self._offset = path.stat().st_size if from_end and path.exists() else 0
        self._entries: list[AuditEntry] = []

    def entries(self) -> list[AuditEntry]:
        """Every ResponseComplete entry read so far, after reading what was appended."""
        with open(self.path, "rb") as fh:
            fh.seek(self._offset)
            chunk = fh.read()
        complete = chunk[:chunk.rfind(b"\n") + 1]  # a half-written last line waits
        self._offset += len(complete)
        for line in complete.splitlines():
            entry = _parse_audit(line)
            if entry is not None:
                self._entries.append(entry)
        return list(self._entries)

    def writes(self, namespace: str, *, resource: str | None = None,
               name: str | None = None, user_prefix: str = "") -> list[AuditEntry]:
        """Successful writes in ``namespace``, oldest first (by receipt)."""
        found = [e for e in self.entries()
                 if e.is_write and e.namespace == namespace
                 and (resource is None or e.resource == resource)
                 and (name is None or e.name == name) and e.user.startswith(user_prefix)]
        return sorted(found, key=lambda e: e.received)


def _parse_audit(line: bytes) -> AuditEntry | None:
    try:
        raw = json.loads(line)
    except ValueError:
        return None
    if raw.get("stage") != "ResponseComplete":
        return None
    ref = raw.get("objectRef") or {}
    return AuditEntry(
        verb=str(raw.get("verb", "")), user=str((raw.get("user") or {}).get("username", "")),
        resource=str(ref.get("resource", "")), namespace=str(ref.get("namespace", "")),
        name=str(ref.get("name", "")),
        code=int((raw.get("responseStatus") or {}).get("code", 0)),
        received=_epoch(raw["requestReceivedTimestamp"]), completed=_epoch(raw["stageTimestamp"]))


def operator_user(service_account: str = cluster_setup.OPERATOR_SA) -> str:
    return cluster_setup.username(service_account)


# -- etcd, behind the apiserver's back ---------------------------------------------------------
class Etcd:
    """etcd's v3 JSON gateway: what the apiserver stores, reached without the apiserver.

    Two uses: a change made while kube-apiserver is down (nothing else can write then),
    and compaction at a chosen revision (what kube-apiserver's compactor does every
    ``--etcd-compaction-interval``, done now instead of within two intervals).
    """

    PREFIX = "/registry"

    def __init__(self, url: str) -> None:
        self.url = url.rstrip("/")
        self._session = requests.Session()
        self._session.trust_env = False  # loopback only; never a proxy

    def close(self) -> None:
        self._session.close()

    def _call(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        response = self._session.post(f"{self.url}/v3/{path}", json=body, timeout=10)
        if response.status_code != 200:
            raise AssertionError(f"etcd {path}: {response.status_code} {response.text[:200]}")
        found: dict[str, Any] = response.json()
        return found

    @staticmethod
    def _key(key: str) -> str:
        return base64.b64encode(key.encode()).decode()

    def revision(self) -> int:
        return int(self._call("kv/range", {"key": self._key("/")})["header"]["revision"])

    def delete_secret(self, namespace: str, name: str) -> None:
        key = f"{self.PREFIX}/secrets/{namespace}/{name}"
        deleted = int(self._call("kv/deleterange", {"key": self._key(key)}).get("deleted", 0))
        assert deleted == 1, f"etcd held no {key}"

    def compact(self, revision: int) -> None:
        self._call("kv/compaction", {"revision": str(revision), "physical": True})

    def compacted_past(self, revision: int) -> bool:
        """Whether history before ``revision`` is gone (a read at revision - 1 fails)."""
        response = self._session.post(
            f"{self.url}/v3/kv/range",
            json={"key": self._key("/"), "revision": str(revision - 1)}, timeout=10)
        return response.status_code != 200 and "compacted" in response.text


# -- the Deployment controller's part: restart what exits -------------------------------------
class Supervisor:
    """Restarts an operator process whenever it exits, with a kubelet-like backoff.

    The test plays the Deployment: a leader that exits non-zero after losing its Lease is
    started again, as is a process that fails to start while the apiserver is away (a
    crash loop, backing off 0.5 s doubling to ``max_backoff``).
    """

    def __init__(self, launcher: OperatorLauncher, *flags: str, name: str,
                 max_backoff: float = 4.0) -> None:
        self._launcher = launcher
        self._flags = flags
        self._name = name
        self._max_backoff = max_backoff
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._current: OperatorProcess | None = None
        self._thread: threading.Thread | None = None
        self.exits: list[int] = []  # exit codes, in order

    @property
    def current(self) -> OperatorProcess:
        with self._lock:
            assert self._current is not None, "the supervisor was not started"
            return self._current

    def start(self) -> OperatorProcess:
        first = self._spawn(wait_ready=True)
        self._thread = threading.Thread(target=self._run, name=f"supervise-{self._name}",
                                        daemon=True)
        self._thread.start()
        return first

    def stop(self) -> None:
        """Stop restarting (the launcher stops the processes themselves)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)

    def _spawn(self, *, wait_ready: bool) -> OperatorProcess:
        handle = self._launcher.start(*self._flags, name=self._name, wait_ready=wait_ready)
        with self._lock:
            self._current = handle
        return handle

    def _run(self) -> None:
        backoff = 0.5
        while not self._stop.is_set():
            handle = self.current
            started = time.monotonic()
            while handle.proc.poll() is None:
                if self._stop.wait(0.1):
                    return
            with self._lock:
                self.exits.append(int(handle.proc.returncode))
            if time.monotonic() - started > 10 * self._max_backoff:
                backoff = 0.5  # it ran for a while: a fresh crash starts the backoff over
            if self._stop.wait(backoff):
                return
            backoff = min(backoff * 2, self._max_backoff)
            self._spawn(wait_ready=False)


def leading(op: OperatorProcess, lease: str) -> bool:
    """What the replica's own ``leader_election_master_status`` gauge says."""
    if not op.alive():
        return False
    try:
        text = op.scrape()
    except requests.RequestException:
        return False
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "leader_election_master_status" and \
                    sample.labels.get("name") == lease:
                return sample.value == 1
    return False


def log_events(op: OperatorProcess, event: str, **fields: Any) -> list[dict[str, Any]]:
    """The operator's JSON log records with this ``event`` (and these field values)."""
    return [r for r in op.log_records()
            if r.get("event") == event and all(r.get(k) == v for k, v in fields.items())]


# -- a control plane of the fault suite's own --------------------------------------------------
@dataclass
class FaultCluster:
    """A dedicated local control plane with the CRD, RBAC and the operator's identity."""

    local: LocalCluster
    kube: KubeApi
    h: Harness
    operator_kubeconfig: str
    log_dir: Path
    leak_evidence: LeakEvidence
    etcd: Etcd
    namespaces: list[str] = field(default_factory=list)

    @property
    def audit_log_path(self) -> Path:
        assert self.local.audit_log_path is not None
        return self.local.audit_log_path

    def launcher(self) -> OperatorLauncher:
        return OperatorLauncher(kubeconfig=self.operator_kubeconfig, log_dir=self.log_dir,
                                on_log=self.leak_evidence.logs.append)

    def namespace(self, prefix: str) -> str:
        name = f"fault-{re.sub(r'[^a-z0-9-]+', '-', prefix.lower())[:30].strip('-')}-" \
               f"{secrets.token_hex(3)}"
        cluster_setup.ensure_namespace(self.kube, name, labels={"himitsu.test/e2e": "true"})
        self.namespaces.append(name)
        return name

    def collect_evidence(self) -> None:
        """Events and statuses of every namespace used, for the session's canary scan."""
        for name in (*self.namespaces, "default", cluster_setup.OPERATOR_NAMESPACE):
            with contextlib.suppress(Exception):  # a dead cluster has nothing to add
                self.leak_evidence.collect_namespace(self.kube, name)


@contextlib.contextmanager
def dedicated_cluster(workdir: Path, *, standin: StandinClient,
                      canary: Canary, leak_evidence: LeakEvidence,
                      extra_apiserver_args: tuple[str, ...] = ()) -> Iterator[FaultCluster]:
    """Start a LocalCluster (audit log on), install CRD and RBAC; stop it all after."""
    local = LocalCluster(workdir / "cluster", bin_dir=bin_dir(), audit=True,
                         extra_apiserver_args=extra_apiserver_args)
    etcd: Etcd | None = None
    try:
        local.start()
        local.wait_ready()
        kube = KubeApi(local.kubeconfig_path)
        cluster_setup.install_crd(kube)
        cluster_setup.install_rbac(kube)
        kubeconfig = cluster_setup.service_account_kubeconfig(
            kube, cluster_setup.OPERATOR_SA, workdir / "operator.kubeconfig")
        etcd = Etcd(local.etcd_url)
        fault_cluster = FaultCluster(local, kube, Harness(kube, standin, canary),
                                     str(kubeconfig), workdir, leak_evidence, etcd)
        try:
            yield fault_cluster
        finally:
            fault_cluster.collect_evidence()
    finally:
        if etcd is not None:
            etcd.close()
        local.stop()

