"""The soak's processes: control plane (audit log on), stand-in, two operator replicas.

Each replica is a process of its own with a ServiceAccount of its own (same bindings as
deploy/rbac), so the audit log names who wrote what, and reaches the apiserver through a
TCP proxy of its own on loopback, which a fault can hang or cut. A supervisor per replica
plays the Deployment: whatever exits is started again. Secret watches are served from
etcd (``--watch-cache-sizes=secrets#0``), so a compaction expires them (410).
"""

from __future__ import annotations

import contextlib
import os
import signal
from pathlib import Path
from typing import Any

import yaml
from bench.procs import Standin

from e2e import cluster_setup
from e2e.faultkit import Etcd, Supervisor, bin_dir, leading
from e2e.kubehelp import KubeApi
from e2e.operator_proc import OperatorLauncher, OperatorProcess
from e2e.tcpproxy import FreezableProxy
from localcluster import DEFAULT_CONTROLLERS, LocalCluster

from .schedule import REPLICAS

SA_PREFIX = "himitsu-operator-"
LEASE = "himitsu-operator.himitsu.io"
CONTROLLERS = (*DEFAULT_CONTROLLERS, "deployment", "replicaset")


class Replica:
    def __init__(self, name: str, proxy: FreezableProxy, supervisor: Supervisor) -> None:
        self.name, self.proxy, self.supervisor = name, proxy, supervisor
        self.peak_rss_kib = 0

    @property
    def process(self) -> OperatorProcess:
        return self.supervisor.current

    def sample_rss(self) -> None:
        proc = self.process
        with contextlib.suppress(OSError, ValueError):
            for line in Path(f"/proc/{proc.pid}/status").read_text().splitlines():
                if line.startswith("VmHWM:"):
                    self.peak_rss_kib = max(self.peak_rss_kib, int(line.split()[1]))


class Rig:
    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        workdir.mkdir(parents=True, exist_ok=True)
        self.local = LocalCluster(workdir / "cluster", bin_dir=bin_dir(), audit=True,
                                  controllers=CONTROLLERS,
                                  extra_apiserver_args=("--watch-cache-sizes=secrets#0",))
        self.kube: KubeApi | None = None
        self.etcd: Etcd | None = None
        self.standin: Standin | None = None
        self.replicas: dict[str, Replica] = {}
        self.launchers: list[OperatorLauncher] = []
        self.rss_sampled = 0.0

    def sample_rss(self, now: float) -> None:
        self.rss_sampled = now
        for replica in self.replicas.values():
            replica.sample_rss()

    @property
    def operator_users(self) -> frozenset[str]:
        return frozenset(cluster_setup.username(SA_PREFIX + r) for r in REPLICAS)

    def start_control_plane(self) -> KubeApi:
        self.local.start()
        self.kube = KubeApi(self.local.kubeconfig_path)
        cluster_setup.install_crd(self.kube)
        cluster_setup.install_rbac(self.kube)
        for replica in REPLICAS:
            cluster_setup.add_service_account(self.kube, SA_PREFIX + replica)
        self.etcd = Etcd(self.local.etcd_url)
        self.standin = Standin(self.workdir, per_key_limit=600, per_ip_limit=1_000_000)
        return self.kube

    def start_operators(self) -> None:
        assert self.kube is not None
        port = self.local.ports["apiserver"]
        for replica in REPLICAS:
            proxy = FreezableProxy(("127.0.0.1", port)).start()
            path = cluster_setup.service_account_kubeconfig(
                self.kube, SA_PREFIX + replica, self.workdir / f"operator-{replica}.kubeconfig")
            config: dict[str, Any] = yaml.safe_load(path.read_text())
            config["clusters"][0]["cluster"]["server"] = f"https://127.0.0.1:{proxy.port}"
            path.write_text(yaml.safe_dump(config))
            launcher = OperatorLauncher(kubeconfig=str(path), log_dir=self.workdir)
            self.launchers.append(launcher)
            supervisor = Supervisor(
                launcher, "--leader-elect", "--leader-election-namespace",
                cluster_setup.OPERATOR_NAMESPACE, "--log-level", "info",
                name=f"replica-{replica}")
            supervisor.start()
            self.replicas[replica] = Replica(replica, proxy, supervisor)

    def leader(self) -> Replica | None:
        for replica in self.replicas.values():
            if leading(replica.process, LEASE):
                return replica
        return None

    def signal(self, replica: Replica, signum: int) -> None:
        proc = replica.process
        if proc.alive():
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signum)

    def etcd_signal(self, signum: int) -> None:
        pid = self.local.pids.get("etcd")
        if pid:
            os.kill(pid, signum)

    def log_paths(self) -> list[Path]:
        return sorted(self.workdir.glob("replica-*.log"))

    def stop(self) -> None:
        for replica in self.replicas.values():
            replica.supervisor.stop()
        for replica in self.replicas.values():  # a frozen process cannot hear SIGTERM
            with contextlib.suppress(ProcessLookupError):
                os.kill(replica.process.pid, signal.SIGCONT)
        for launcher in self.launchers:
            with contextlib.suppress(Exception):
                launcher.stop_all()
        for replica in self.replicas.values():
            replica.proxy.stop()
        if self.standin is not None:
            self.standin.stop()
        if self.etcd is not None:
            self.etcd.close()
        with contextlib.suppress(ProcessLookupError, OSError):
            self.etcd_signal(signal.SIGCONT)
        self.local.stop()
