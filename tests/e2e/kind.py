"""The kind variant of the suite's fixtures: port-forwards and the in-cluster operator.

Why apart from conftest: on kind (``E2E_KUBECONFIG`` set, driven by hack/kind/kind.sh)
the operator is the Deployment of the chart's release (``E2E_HELM_RELEASE``, installed
by kind.sh) and the Himitsu stand-in is a Pod;
the tests reach both through ``kubectl port-forward``. Nothing here runs on the local
control plane, so it is kept out of the way of the code that does.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
from pathlib import Path

import pytest
import requests

from .kubehelp import KubeApi, dies_with_caller, kubectl, kubectl_binary, wait_for
from .operator_proc import free_port

STANDIN_NAMESPACE = os.environ.get("E2E_STANDIN_NAMESPACE", "himitsu-standin")
STANDIN_SERVICE = os.environ.get("E2E_STANDIN_SERVICE", "himitsu-standin")
STANDIN_PORT = int(os.environ.get("E2E_STANDIN_PORT", "8700"))
OPERATOR_NAMESPACE = os.environ.get("E2E_OPERATOR_NAMESPACE", "himitsu-system")
OPERATOR_SELECTOR = "app.kubernetes.io/name=himitsu-operator"
LEASE = "himitsu-operator.himitsu.io"
PER_TEST_FLAGS = ("needs an operator started with its own flags; on kind the operator is "
                  "the in-cluster Deployment of the chart")
HELM_RELEASE = os.environ.get("E2E_HELM_RELEASE", "")
CHART = Path(__file__).resolve().parents[2] / "charts" / "himitsu-controller"


def helm(kubeconfig: str, *args: str, timeout: float = 300.0) -> subprocess.CompletedProcess[str]:
    """The helm kind.sh installed the release with, on the release's namespace."""
    from installs import helm_binary  # noqa: PLC0415

    binary = os.environ.get("E2E_HELM") or helm_binary()
    result = subprocess.run([binary, f"--kubeconfig={kubeconfig}", "--namespace",
                             OPERATOR_NAMESPACE, *args], capture_output=True, text=True,
                            timeout=timeout, check=False)
    assert result.returncode == 0, f"helm {' '.join(args)}:\n{result.stdout}{result.stderr}"
    return result


def standin_service_url() -> str:
    return f"http://{STANDIN_SERVICE}.{STANDIN_NAMESPACE}.svc:{STANDIN_PORT}"


class PortForward:
    """``kubectl port-forward`` to 127.0.0.1:<free port>, stopped by its PID (and by the
    kernel if this process dies first)."""

    def __init__(self, kubeconfig: str, namespace: str, target: str, remote_port: int,
                 log_path: Path) -> None:
        self.local_port = free_port()
        with open(log_path, "ab") as log:
            self._proc = subprocess.Popen(
                dies_with_caller([kubectl_binary(), f"--kubeconfig={kubeconfig}", "-n",
                                  namespace, "port-forward", "--address", "127.0.0.1",
                                  target, f"{self.local_port}:{remote_port}"]),
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                start_new_session=True)
        wait_for(self._accepting, timeout=30, what=f"port-forward to {namespace}/{target}")

    def _accepting(self) -> bool:
        if self._proc.poll() is not None:
            raise AssertionError(f"kubectl port-forward exited with {self._proc.returncode}")
        with socket.socket() as sock:
            return sock.connect_ex(("127.0.0.1", self.local_port)) == 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.local_port}"

    def stop(self) -> None:
        if self._proc.poll() is None:
            os.kill(self._proc.pid, signal.SIGTERM)
            try:
                self._proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.kill(self._proc.pid, signal.SIGKILL)
                self._proc.wait(timeout=10)


class InClusterOperator:
    """The Deployment's current leader, seen through port-forwards (metrics, probes, logs)."""

    def __init__(self, kube: KubeApi, log_dir: Path) -> None:
        self.kube = kube
        self.log_dir = log_dir
        self.name = "in-cluster"

    def leader_pod(self) -> str:
        lease = self.kube.get(f"/apis/coordination.k8s.io/v1/namespaces/{OPERATOR_NAMESPACE}"
                              f"/leases/{LEASE}")
        holder = str((lease.get("spec") or {}).get("holderIdentity") or "")
        if not holder:
            raise AssertionError("no replica holds the leader-election Lease")
        return holder.rsplit("_", 1)[0]  # identity = <hostname = pod name>_<uuid>

    def _get(self, remote_port: int, path: str) -> requests.Response:
        forward = PortForward(self.kube.kubeconfig, OPERATOR_NAMESPACE,
                              f"pod/{self.leader_pod()}", remote_port,
                              self.log_dir / "port-forward.log")
        try:
            return requests.get(f"{forward.url}{path}", timeout=10)
        finally:
            forward.stop()

    def scrape(self) -> str:
        response = self._get(8080, "/metrics")
        response.raise_for_status()
        return response.text

    def probe(self, path: str) -> int:
        try:
            return self._get(8081, path).status_code
        except requests.RequestException:
            return 0

    def log_text(self) -> str:
        result = kubectl(self.kube.kubeconfig, "-n", OPERATOR_NAMESPACE, "logs",
                         "-l", OPERATOR_SELECTOR, "--tail=-1", "--prefix", check=False)
        return result.stdout


class KindLauncher:
    """The kind counterpart of OperatorLauncher: nothing to start, one operator in-cluster."""

    def __init__(self, kube: KubeApi, log_dir: Path) -> None:
        self._operator = InClusterOperator(kube, log_dir)

    def start(self, *extra: str, name: str = "operator", kubeconfig: str | None = None,
              wait_ready: bool = True) -> InClusterOperator:
        """The in-cluster operator; skips the test when it asks for flags or an identity."""
        if extra or kubeconfig is not None:
            pytest.skip(PER_TEST_FLAGS)
        return self._operator

    def stop_all(self) -> None:
        """Nothing to stop: the Deployment outlives the suite."""


def standin_forward(kubeconfig: str, log_dir: Path) -> PortForward:
    return PortForward(kubeconfig, STANDIN_NAMESPACE, f"svc/{STANDIN_SERVICE}", STANDIN_PORT,
                       log_dir / "standin-port-forward.log")


def operator_logs(kube: KubeApi, log_dir: Path) -> str:
    """Both replicas' logs (empty if kubectl cannot get them: the scan then says so)."""
    with contextlib.suppress(AssertionError, subprocess.SubprocessError):
        return InClusterOperator(kube, log_dir).log_text()
    return ""
