"""The measuring rig: control plane with an audit log, stand-in, operator, fleets of objects.

Why the operator runs as its own ServiceAccount (a TokenRequest token, RBAC exactly as
deploy/rbac grants it): the audit log then names it, so "kube-apiserver requests made
by the operator" is a filter on one username, with nothing of the benchmark's own
traffic (admin creations, watches) mixed in.

Why a fleet layout of N HimitsuSecrets over 50 namespaces and 20 environments with one
environment-scoped token per environment: it is the brief's shape, and it keeps every
token far below Himitsu's 120 requests a minute at a 10 s refreshInterval (one shared
poll per source), so a 429 in the figures means the operator misbehaved, not the rig.
Every tenth HimitsuSecret uses creationPolicy Merge into a pre-existing Secret holding a
foreign key, so drift repair covers both policies.
"""

from __future__ import annotations

import os
import secrets as rnd
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import figures
from .auditlog import AuditGap, AuditLog, check_complete
from .kubeapi import AdminApi, KubeError, b64, hsec_path, secret_path
from .procs import REPO, InCluster, Operator, Standin, wait_until

sys.path.insert(0, str(REPO / "hack"))
from localcluster import LocalCluster

BIN_DIR = REPO / "hack" / "kube" / "bin"
CRD_FILE = REPO / "deploy" / "crd" / "himitsu.io_himitsusecrets.yaml"
RBAC_DIR = REPO / "deploy" / "rbac"
OPERATOR_NAMESPACE = "himitsu-system"
OPERATOR_SA = "himitsu-operator"
OPERATOR_USER = f"system:serviceaccount:{OPERATOR_NAMESPACE}:{OPERATOR_SA}"
FLEET_LABEL = "bench.himitsu.io/fleet"
KEYS = tuple(f"KEY_{i:02d}" for i in range(20))
FOREIGN_KEY = "FOREIGN_KEY"
CREATE_THREADS = 8


@dataclass
class Env:
    """A Himitsu environment, its env-scoped token, and the values it holds now."""

    index: int
    project: str
    environment: str
    token: str
    values: dict[str, str]

    @property
    def secret_name(self) -> str:
        return f"himitsu-token-{self.index:02d}"


@dataclass(frozen=True)
class Member:
    namespace: str
    name: str
    env: int
    policy: str

    @property
    def target(self) -> str:
        return f"{self.name}-secret"

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


@dataclass
class Fleet:
    tag: str
    refresh: str
    namespaces: list[str]
    members: list[Member]
    created_seconds: float = 0.0
    timings: dict[str, float] = field(default_factory=dict)

    @property
    def selector(self) -> str:
        return f"{FLEET_LABEL}={self.tag}"


def random_values() -> dict[str, str]:
    return {key: rnd.token_hex(12) for key in KEYS}


def layout(tag: str, size: int, *, envs: Sequence[int], namespaces: int,
           merge_every: int) -> tuple[list[str], list[Member]]:
    """Namespaces and members of a fleet: member i in namespace i % namespaces, reading
    environment envs[i % len(envs)]; every merge_every-th one (0: none) uses Merge."""
    names = [f"bench-{tag}-{i:02d}" for i in range(namespaces)]
    members = [
        Member(names[i % namespaces], f"hs-{i:05d}", envs[i % len(envs)],
               "Merge" if merge_every and i % merge_every == merge_every - 1 else "Owner")
        for i in range(size)
    ]
    return names, members


class Rig:
    """Everything a scenario needs; ``close()`` stops every process it started."""

    def __init__(self, workdir: Path, *, operator_args: Sequence[str] = (),
                 log: Callable[[str], None] = print, audit_log_maxsize: int = 0,
                 operator_python: Path = Path(sys.executable)) -> None:
        self.workdir = workdir
        self.operator_python = operator_python
        self.audit_log_maxsize = audit_log_maxsize
        self.operator_args = list(operator_args)
        self.log = log
        self.cluster: Any = None
        self.api: AdminApi | None = None
        self.standin: Standin | None = None
        self.operator: Operator | None = None
        self.audit: AuditLog | None = None
        self.envs: list[Env] = []
        self.operator_kubeconfig = workdir / "operator.kubeconfig"
        self.account_dir = workdir / "serviceaccount"
        self._operators_started = 0

    # -- lifecycle ------------------------------------------------------------------------
    def start(self, *, environments: int = 20) -> None:
        started = time.monotonic()
        extra = [f"--audit-log-maxsize={self.audit_log_maxsize}"] \
            if self.audit_log_maxsize else []
        self.cluster = LocalCluster(self.workdir / "cluster", bin_dir=BIN_DIR, audit=True,
                                    extra_apiserver_args=extra)
        self.cluster.start()
        self.api = AdminApi(self.cluster.server_url, token=self.cluster.admin_token,
                            ca_path=str(self.cluster.ca_path))
        self._install()
        self.audit = AuditLog(Path(self.cluster.audit_log_path), username=OPERATOR_USER)
        self.standin = Standin(self.workdir)
        for index in range(environments):
            self.envs.append(self.new_env(index))
        self.log(f"rig ready in {time.monotonic() - started:.0f} s "
                 f"(apiserver {self.cluster.server_url}, stand-in {self.standin.url})")

    def check_audit(self) -> None:
        """Raise AuditGap when the audit log may have lost requests (of anyone): the
        apiserver's own count of audit events, scraped first, against the lines read
        after it."""
        assert self.audit is not None
        text = self.kube.get_text("/metrics")
        samples = figures.parse_prometheus("\n".join(
            line for line in text.splitlines() if line.startswith("apiserver_audit_")))
        logged = figures.metric_sum(samples, "apiserver_audit_event_total")
        errors = figures.metric_sum(samples, "apiserver_audit_error_total")
        if ("apiserver_audit_event_total", frozenset()) not in samples:
            raise AuditGap("the apiserver's /metrics has no apiserver_audit_event_total: "
                           "cannot prove the audit log complete")
        for _ in range(3):  # an event is counted just before it is written: let it land
            self.audit.refresh()
            if self.audit.lines >= logged:
                break
            time.sleep(1.0)
        check_complete(self.audit, logged=logged, errors=errors)

    def close(self) -> None:
        """Stop the operator, the stand-in and the control plane, each by PID; idempotent."""
        for stop in (self.stop_operator, self._stop_standin, self._stop_cluster):
            try:
                stop()
            except Exception as exc:  # keep stopping the rest
                self.log(f"warning: stopping failed: {exc}")

    def _stop_standin(self) -> None:
        if self.standin is not None:
            self.standin.stop()
            self.standin = None

    def _stop_cluster(self) -> None:
        if self.api is not None:
            self.api.close()
        if self.cluster is not None:
            self.cluster.stop()
            self.cluster = None

    def _install(self) -> None:
        """CRD, the operator's namespace and RBAC (deploy/ as shipped), its token."""
        kubectl = [str(self.cluster.kubectl_path), "--kubeconfig",
                   str(self.cluster.kubeconfig_path)]
        subprocess.run([*kubectl, "apply", "-f", str(CRD_FILE)], check=True,
                       capture_output=True)
        self.kube.create("/api/v1/namespaces", namespace_body(OPERATOR_NAMESPACE),
                         exist_ok=True)
        subprocess.run([*kubectl, "apply", "-k", str(RBAC_DIR)], check=True,
                       capture_output=True)
        crd = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/himitsusecrets.himitsu.io"
        wait_until(lambda: any(
            c["type"] == "Established" and c["status"] == "True"
            for c in (self.kube.get(crd).get("status") or {}).get("conditions") or []),
            timeout=60, what="the CRD to be Established")
        wait_until(lambda: self.kube.request("GET", "/apis/himitsu.io/v1alpha1", ok404=True),
                   timeout=60, what="discovery of himitsu.io/v1alpha1")
        token = wait_until(self._operator_token, timeout=60, what="a TokenRequest token")
        self.cluster.write_kubeconfig(self.operator_kubeconfig, token=token, user=OPERATOR_SA,
                                      namespace=OPERATOR_NAMESPACE)
        # The same token as a pod's ServiceAccount directory (the in-cluster configuration).
        self.account_dir.mkdir(mode=0o700, exist_ok=True)
        (self.account_dir / "token").write_text(token)
        shutil.copyfile(self.cluster.ca_path, self.account_dir / "ca.crt")
        (self.account_dir / "namespace").write_text(OPERATOR_NAMESPACE)

    def _operator_token(self) -> str | None:
        try:
            return str(self.cluster.create_token(OPERATOR_NAMESPACE, OPERATOR_SA,
                                                 expiration_seconds=6 * 3600))
        except Exception:  # the ServiceAccount may not exist yet
            return None

    @property
    def kube(self) -> AdminApi:
        assert self.api is not None, "the rig is not started"
        return self.api

    @property
    def himitsu(self) -> Standin:
        assert self.standin is not None, "the rig is not started"
        return self.standin

    @property
    def op(self) -> Operator:
        assert self.operator is not None, "no operator is running"
        return self.operator

    # -- the operator ---------------------------------------------------------------------
    def start_operator(self, *, src: Path | None = None) -> Operator:
        """A fresh operator process, its code from ``src`` (default: this tree's)."""
        if self.operator is not None:
            raise RuntimeError("an operator is already running")
        self._operators_started += 1
        self.operator = Operator(self.workdir, kubeconfig=self.operator_kubeconfig,
                                 in_cluster=self._in_cluster(), extra_args=self.operator_args,
                                 index=self._operators_started, src=src,
                                 python=self.operator_python)
        try:
            self.operator.wait_ready()
        except BaseException:
            self.stop_operator()
            raise
        return self.operator

    def _in_cluster(self) -> InCluster | None:
        """The in-cluster configuration (the deployed path) where the bench may mount the
        ServiceAccount's files (root, ``unshare``); else None: the kubeconfig, noted."""
        if os.geteuid() != 0 or shutil.which("unshare") is None:
            self.log("note: not root (or no unshare): the operator runs with a kubeconfig, "
                     "not the in-cluster configuration users deploy")
            return None
        return InCluster("127.0.0.1", self.cluster.ports["apiserver"], self.account_dir)

    def stop_operator(self) -> None:
        if self.operator is not None:
            code = self.operator.stop()
            if code not in (0, None):
                self.log(f"warning: operator exited with {code}; "
                         f"log: {self.operator.child.log_path}")
            self.operator = None

    def restart_operator(self) -> Operator:
        self.stop_operator()
        return self.start_operator()

    # -- Himitsu --------------------------------------------------------------------------
    def new_env(self, index: int) -> Env:
        values = random_values()
        project, environment = self.himitsu.new_environment(values)
        return Env(index, project, environment, self.himitsu.add_token(project, environment),
                   values)

    def change_value(self, env: Env, key: str) -> str:
        value = rnd.token_hex(12)
        self.himitsu.set_secrets(env.project, env.environment, {key: value})
        env.values[key] = value
        return value

    # -- fleets ---------------------------------------------------------------------------
    def prepare_fleet(self, tag: str, size: int, *, refresh: str, envs: Sequence[Env],
                      namespaces: int = 50, merge_every: int = 10) -> Fleet:
        """Namespaces, token Secrets and Merge targets (not timed); no HimitsuSecret yet."""
        by_index = {env.index: env for env in envs}
        names, members = layout(tag, size, envs=sorted(by_index), namespaces=namespaces,
                                merge_every=merge_every)
        fleet = Fleet(tag, refresh, names, members)
        self.parallel(lambda ns: self.kube.create(
            "/api/v1/namespaces", namespace_body(ns, {FLEET_LABEL: tag}), exist_ok=True), names)
        pairs = sorted({(m.namespace, m.env) for m in members})
        self.parallel(lambda p: self.kube.create(secret_path(p[0]), secret_body(
            by_index[p[1]].secret_name, {"token": by_index[p[1]].token}), exist_ok=True), pairs)
        merge = [m for m in members if m.policy == "Merge"]
        self.parallel(lambda m: self.kube.create(secret_path(m.namespace), secret_body(
            m.target, {FOREIGN_KEY: "kept-by-someone-else"}), exist_ok=True), merge)
        return fleet

    def create_hsecs(self, fleet: Fleet, members: Sequence[Member] | None = None) -> float:
        """Create every HimitsuSecret of the fleet (or just ``members``) as fast as the
        apiserver takes them; seconds taken."""
        started = time.monotonic()
        self.parallel(lambda m: self.kube.create(hsec_path(m.namespace), self.hsec_body(
            fleet, m)), fleet.members if members is None else members)
        fleet.created_seconds = time.monotonic() - started
        return fleet.created_seconds

    def hsec_body(self, fleet: Fleet, member: Member) -> dict[str, Any]:
        env = self.env(member.env)
        return {
            "apiVersion": "himitsu.io/v1alpha1", "kind": "HimitsuSecret",
            "metadata": {"name": member.name, "labels": {FLEET_LABEL: fleet.tag}},
            "spec": {"apiUrl": self.himitsu.url, "projectId": env.project,
                     "environmentId": env.environment,
                     "authSecretRef": {"name": env.secret_name},
                     "refreshInterval": fleet.refresh,
                     "target": {"name": member.target, "creationPolicy": member.policy}},
        }

    def set_refresh(self, fleet: Fleet, refresh: str) -> None:
        fleet.refresh = refresh
        self.parallel(lambda m: self.kube.merge_patch(
            hsec_path(m.namespace, m.name), {"spec": {"refreshInterval": refresh}}),
            fleet.members)

    def delete_fleet(self, fleet: Fleet, *, timeout: float = 600.0) -> float:
        """Delete the fleet's namespaces and wait until they are gone; seconds taken."""
        started = time.monotonic()
        self.parallel(lambda ns: self.kube.delete(f"/api/v1/namespaces/{ns}"), fleet.namespaces)
        for ns in fleet.namespaces:
            wait_until(lambda ns=ns: self.kube.request(
                "GET", f"/api/v1/namespaces/{ns}", ok404=True) is None,
                timeout=max(1.0, timeout - (time.monotonic() - started)),
                what=f"namespace {ns} to be deleted", interval=0.5)
        return time.monotonic() - started

    def env(self, index: int) -> Env:
        for env in self.envs:
            if env.index == index:
                return env
        raise KeyError(index)

    @staticmethod
    def parallel(fn: Callable[[Any], Any], items: Sequence[Any],
                 threads: int = CREATE_THREADS) -> list[Any]:
        with ThreadPoolExecutor(max_workers=threads) as pool:
            return list(pool.map(fn, items))


def namespace_body(name: str, labels: dict[str, str] | None = None) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Namespace",
            "metadata": {"name": name, "labels": labels or {}}}


def secret_body(name: str, data: dict[str, str]) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Secret", "type": "Opaque", "metadata": {"name": name},
            "data": {k: b64(v) for k, v in data.items()}}


__all__ = ["OPERATOR_USER", "AuditGap", "AuditLog", "Env", "Fleet", "KubeError", "Member", "Rig"]
