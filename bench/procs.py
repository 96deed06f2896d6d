"""The Himitsu stand-in and the operator, each as a process of its own.

Why processes: the operator's CPU time and memory are read from /proc/<pid>, which is
only meaningful when nothing else (the benchmark's watches, the stand-in) runs in that
process; and a restart scenario needs a real restart. Every process is started in its
own session and stopped by its PID (SIGTERM, then SIGKILL), never by name.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import requests

from . import figures

REPO = Path(__file__).resolve().parent.parent
STANDIN_DIR = REPO / "hack" / "himitsu_standin"
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_until(check: Any, *, timeout: float, what: str, interval: float = 0.2) -> Any:
    """Poll ``check()`` until it returns something truthy; raise TimeoutError naming ``what``."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise TimeoutError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(interval)


class Child:
    """A child process in its own session, logging to a file, stopped by PID."""

    def __init__(self, name: str, argv: Sequence[str], log_path: Path, *,
                 env: Mapping[str, str] | None = None) -> None:
        self.name = name
        self.log_path = log_path
        with open(log_path, "ab") as log:
            self.popen = subprocess.Popen(
                list(argv), stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                cwd=REPO, env=dict(env) if env is not None else None, start_new_session=True)
        self.started_wall = time.time()

    @property
    def pid(self) -> int:
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None

    def stop(self, *, grace: float = 30.0) -> int | None:
        """SIGTERM, SIGKILL after ``grace`` seconds; the exit code."""
        if self.alive():
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGTERM)
            try:
                return self.popen.wait(grace)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(self.pid, signal.SIGKILL)
        return self.popen.wait(10)

    def tail(self, lines: int = 20) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:])


class Standin:
    """``python hack/himitsu_standin serve`` with Himitsu's real rate limits by default."""

    def __init__(self, workdir: Path, *, per_key_limit: int = 120,
                 per_ip_limit: int = 300) -> None:
        port_file = workdir / "standin.port"
        port_file.unlink(missing_ok=True)
        self.child = Child("standin", [
            sys.executable, str(STANDIN_DIR), "serve", "--port", "0",
            "--port-file", str(port_file), "--per-key-limit", str(per_key_limit),
            "--per-ip-limit", str(per_ip_limit)], workdir / "standin.log")
        try:
            port = wait_until(lambda: self._read_port(port_file), timeout=30,
                              what="the stand-in's port file")
        except BaseException:
            self.child.stop()
            raise
        self.url = f"http://127.0.0.1:{port}"
        self._session = requests.Session()
        self._session.trust_env = False

    def _read_port(self, path: Path) -> int | None:
        if not self.child.alive():
            raise RuntimeError(f"the stand-in exited:\n{self.child.tail()}")
        try:
            return int(path.read_text().strip())
        except (OSError, ValueError):
            return None

    def call(self, method: str, path: str, body: Any = None, **params: Any) -> Any:
        response = self._session.request(method, f"{self.url}/_standin{path}", json=body,
                                         params=params or None, timeout=60)
        if response.status_code != 200:
            raise RuntimeError(f"stand-in {method} {path}: {response.status_code} "
                               f"{response.text[:200]}")
        return response.json()

    def new_environment(self, secrets: Mapping[str, str]) -> tuple[str, str]:
        info = self.call("POST", "/environments", {})
        project, environment = str(info["project"]), str(info["environment"])
        self.set_secrets(project, environment, secrets)
        return project, environment

    def set_secrets(self, project: str, environment: str, values: Mapping[str, str]) -> int:
        info = self.call("PUT", f"/projects/{project}/environments/{environment}/secrets",
                         dict(values))
        return int(info["configVersion"])

    def add_token(self, project: str, environment: str) -> str:
        return str(self.call("POST", "/tokens", {"project": project,
                                                 "environment": environment})["token"])

    def requests_log(self) -> list[dict[str, Any]]:
        """Every API request the stand-in logged (time, environment, status, ...)."""
        records: list[dict[str, Any]] = self.call("GET", "/requests", limit=0)
        return records

    def stop(self) -> None:
        self._session.close()
        self.child.stop()


SERVICE_ACCOUNT_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
# In a private mount namespace: a tmpfs over /run (so nothing is created on the host),
# then the bench's ServiceAccount directory bind-mounted where a pod has it; exec keeps
# the PID, so /proc/<pid> is the operator's.
IN_CLUSTER_MOUNTS = ('mount -t tmpfs -o size=1m,mode=755 tmpfs /run && '
                     f'mkdir -p {SERVICE_ACCOUNT_DIR} && '
                     f'mount --bind "$0" {SERVICE_ACCOUNT_DIR} && exec "$@"')


@dataclass(frozen=True)
class InCluster:
    """A pod's view of the apiserver: the service's address and the ServiceAccount's
    directory (token, ca.crt, namespace), mounted where the in-cluster configuration
    reads it (as root, in a private mount namespace: ``unshare -m``)."""

    host: str
    port: int
    account_dir: Path


# What the image's final stage sets (Dockerfile ENV) that changes how the operator runs;
# tests/unit/test_deploy.py checks the two agree.
IMAGE_ENV = {"PYTHONUNBUFFERED": "1", "MALLOC_ARENA_MAX": "2"}


class Operator:
    """``python -m himitsu_controller`` as its own ServiceAccount, metrics on loopback.

    With ``in_cluster`` it runs as a pod does (the in-cluster configuration, no
    kubeconfig); else with ``kubeconfig``. The operator's code comes from ``src`` (this
    tree's ``src/`` unless another tree's is given, for a baseline measured in the same
    run)."""

    def __init__(self, workdir: Path, *, kubeconfig: Path | None = None,
                 in_cluster: InCluster | None = None, extra_args: Sequence[str] = (),
                 index: int = 0, src: Path | None = None,
                 python: Path = Path(sys.executable)) -> None:
        self.metrics_port, self.probe_port = free_port(), free_port()
        config = ["--kubeconfig", str(kubeconfig)] if in_cluster is None else []
        argv = [str(python), "-m", "himitsu_controller", *config,
                "--metrics-bind-address", f"127.0.0.1:{self.metrics_port}",
                "--health-probe-bind-address", f"127.0.0.1:{self.probe_port}",
                "--log-format", "json", "--log-level", "info",
                # The stand-in is plain http on loopback (production refuses http).
                "--allow-insecure-http", *extra_args]
        env = {k: v for k, v in os.environ.items() if k != "KUBECONFIG"}
        env.update(IMAGE_ENV)
        self.src = src or REPO / "src"
        env["PYTHONPATH"] = str(self.src)
        if in_cluster is not None:
            env["KUBERNETES_SERVICE_HOST"] = in_cluster.host
            env["KUBERNETES_SERVICE_PORT"] = str(in_cluster.port)
            argv = ["unshare", "-m", "--propagation", "private", "sh", "-c",
                    IN_CLUSTER_MOUNTS, str(in_cluster.account_dir), *argv]
        self.argv = argv
        self.child = Child(f"operator-{index}", argv, workdir / f"operator-{index}.log",
                           env=env)
        self._session = requests.Session()
        self._session.trust_env = False
        self.ready_wall = 0.0

    @property
    def pid(self) -> int:
        return self.child.pid

    def wait_ready(self, timeout: float = 120.0) -> None:
        def ready() -> bool:
            if not self.child.alive():
                raise RuntimeError(f"the operator exited:\n{self.child.tail()}")
            try:
                url = f"http://127.0.0.1:{self.probe_port}/readyz"
                return self._session.get(url, timeout=5).status_code == 200
            except requests.RequestException:
                return False

        wait_until(ready, timeout=timeout, what="the operator's /readyz", interval=0.05)
        self.ready_wall = time.time()

    def metrics(self) -> dict[figures.Sample, float]:
        url = f"http://127.0.0.1:{self.metrics_port}/metrics"
        response = self._session.get(url, timeout=30)
        response.raise_for_status()
        return figures.parse_prometheus(response.text)

    def cpu_seconds(self) -> float:
        """User + system CPU time of the whole process (every thread) so far."""
        return figures.cpu_ticks(Path(f"/proc/{self.pid}/stat").read_text()) / CLOCK_TICKS

    def memory_mib(self) -> dict[str, float]:
        status = Path(f"/proc/{self.pid}/status").read_text()
        return {"rss": figures.mib(figures.status_kib(status, "VmRSS")),
                "peak_rss": figures.mib(figures.status_kib(status, "VmHWM"))}

    def log_errors(self) -> list[str]:
        """Log lines at error level (JSON records), for the notes of a suspicious run."""
        found = []
        for line in self.child.tail(100_000).splitlines():
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if isinstance(record, dict) and record.get("level") in ("error", "critical"):
                found.append(str(record.get("event", ""))[:200])
        return found

    def stop(self) -> int | None:
        self._session.close()
        return self.child.stop(grace=45.0)


def py_spy_path() -> str | None:
    """py-spy from the virtualenv (``pip install py-spy``) or PATH; None when absent."""
    beside = Path(sys.executable).parent / "py-spy"
    if beside.exists():
        return str(beside)
    return shutil.which("py-spy")


class Profiler:
    """``py-spy record`` of a running process into a collapsed-stacks file.

    Non-blocking sampling (the target is never paused), so the profiled run costs the
    same as an unprofiled one apart from py-spy's own CPU on another core.
    """

    def __init__(self, pid: int, out: Path, *, log_path: Path, rate: int = 100) -> None:
        binary = py_spy_path()
        if binary is None:
            raise RuntimeError("py-spy not found: .venv/bin/pip install py-spy")
        self.out = out
        # --gil: only the thread holding the GIL is sampled, so the profile shows where
        # the process spends CPU, not where its threads wait. --function: one frame per
        # function, not per line, which keeps the file a tenth of the size.
        argv = [binary, "record", "--pid", str(pid), "--format", "raw", "--nonblocking",
                "--gil", "--function", "--rate", str(rate), "-o", str(out)]
        self.child = Child("py-spy", argv, log_path)

    def stop(self) -> str:
        """End the recording (SIGINT makes py-spy write its file); the collapsed stacks."""
        if self.child.alive():
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.child.pid, signal.SIGINT)
        try:
            self.child.popen.wait(30)
        except subprocess.TimeoutExpired:
            self.child.stop(grace=5)
        try:
            return self.out.read_text()
        except OSError:
            return ""
