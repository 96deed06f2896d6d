#!/usr/bin/env python3
"""Run a real Kubernetes control plane (etcd, kube-apiserver, kube-controller-manager) on 127.0.0.1.

Why: there is no Docker (hence no kind) on the development and CI machines, yet the e2e
suite and `make demo` need the real thing: admission, RBAC, resourceVersions, watches,
TokenRequest, and the garbage collector that deletes Owner-mode Secrets. The binaries are
built from Go modules by hack/kube/build.sh; this module only wires them together.

Why stdlib only: it runs before any virtualenv exists (`make cluster-up` on a fresh
machine, with the system python3) and is imported by the e2e fixtures as well.

Every process is ours: free ports on 127.0.0.1, files under one work directory, PIDs in
`<workdir>/cluster.json`, and stopping is by recorded PID (checked against the process
start time so a recycled PID is never signalled), never by process name.

    python3 hack/localcluster.py up --dir .local [--audit]
    python3 hack/localcluster.py status|restart-apiserver|down --dir .local
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import json
import os
import secrets
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_BIN_DIR = REPO_ROOT / "hack" / "kube" / "bin"
BUILD_SCRIPT = REPO_ROOT / "hack" / "kube" / "build.sh"
BINARIES = ("etcd", "kube-apiserver", "kube-controller-manager", "kubectl")
# Garbage collection (Owner-mode Secrets), namespace deletion, the `default`
# ServiceAccount and legacy token Secrets, and Deployments' ReplicaSets (one per pod
# template, so a rollout restart shows as a new revision; no replicaset controller: no
# Pods); nothing that needs a kubelet.
DEFAULT_CONTROLLERS = ("garbagecollector", "namespace", "serviceaccount", "serviceaccount-token",
                       "deployment")
SERVICE_CIDR = "10.0.0.0/24"
STATE_FILE = "cluster.json"
ADMIN_USER = "himitsu-local-admin"
CONTEXT = "himitsu-local"
STOP_ORDER = ("kube-controller-manager", "kube-apiserver", "etcd")
AUDIT_POLICY = """apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: ["RequestReceived"]
rules:
- level: Metadata
"""


class ClusterError(RuntimeError):
    """The control plane could not be started, reached or stopped; the message says why."""


def free_port() -> int:
    """A TCP port that was free on 127.0.0.1 a moment ago (the kernel picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def ensure_binaries(bin_dir: Path = DEFAULT_BIN_DIR) -> Path:
    """Build the binaries with hack/kube/build.sh unless they are all there already."""
    if any(not (bin_dir / name).exists() for name in BINARIES):
        if bin_dir.resolve() != DEFAULT_BIN_DIR.resolve():
            raise ClusterError(f"missing Kubernetes binaries in {bin_dir}")
        subprocess.run(["bash", str(BUILD_SCRIPT)], check=True)
    return bin_dir


def _fingerprint(pid: int) -> str | None:
    """Start time of a live (non-zombie) process, or None: a PID alone can be recycled."""
    if Path("/proc/self/stat").exists():
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            return None
        fields = stat[stat.rindex(")") + 2 :].split()
        return None if fields[0] in ("Z", "X") else fields[19]
    out = subprocess.run(
        ["ps", "-o", "stat=", "-o", "lstart=", "-p", str(pid)],
        capture_output=True, text=True, check=False,
    ).stdout.strip()
    return None if not out or out.startswith("Z") else out.split(None, 1)[1]


def _tail(path: Path, lines: int = 15) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return "(no log)"
    return "\n".join(text.splitlines()[-lines:])


class _Process:
    """One control-plane process: how to start it, where it logs, and which PID it has."""

    def __init__(self, name: str, argv: list[str], log: Path) -> None:
        self.name, self.argv, self.log = name, argv, log
        self.pid: int | None = None
        self.fingerprint: str | None = None
        self.popen: subprocess.Popen[bytes] | None = None

    def spawn(self, *, cwd: Path, truncate_log: bool) -> None:
        with open(self.log, "wb" if truncate_log else "ab") as log:
            self.popen = subprocess.Popen(
                self.argv, cwd=cwd, stdin=subprocess.DEVNULL, stdout=log,
                stderr=subprocess.STDOUT, start_new_session=True,  # outlives a CLI's Ctrl-C
            )
        self.pid = self.popen.pid
        self.fingerprint = _fingerprint(self.pid)

    def alive(self) -> bool:
        if self.popen is not None:
            return self.popen.poll() is None
        if self.pid is None or self.fingerprint is None:
            return False
        return _fingerprint(self.pid) == self.fingerprint

    def describe_death(self) -> str:
        code = self.popen.returncode if self.popen is not None else "unknown"
        return (f"{self.name} (pid {self.pid}) exited with code {code}; "
                f"last lines of {self.log}:\n{_tail(self.log)}")

    def stop(self, *, grace: float) -> None:
        """SIGTERM, then SIGKILL after `grace` seconds; only if the PID is still ours."""
        if self.pid is None or not self.alive():
            self.pid = self.popen = None
            return
        self._signal(signal.SIGTERM)
        if not self._wait_gone(grace):
            self._signal(signal.SIGKILL)
            if not self._wait_gone(10.0):
                raise ClusterError(f"{self.name} (pid {self.pid}) survived SIGKILL")
        self.pid = self.popen = None

    def _signal(self, signum: signal.Signals) -> None:
        assert self.pid is not None
        with contextlib.suppress(ProcessLookupError):  # it exited after the check
            os.kill(self.pid, signum)

    def _wait_gone(self, timeout: float) -> bool:
        if self.popen is not None:
            try:
                self.popen.wait(timeout)
            except subprocess.TimeoutExpired:
                return False
            return True
        deadline = time.monotonic() + timeout
        while self.alive():  # not our child: nothing to wait() on, so poll
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.05)
        return True

    def to_json(self) -> dict[str, Any]:
        return {"pid": self.pid, "fingerprint": self.fingerprint,
                "argv": self.argv, "log": str(self.log)}

    @classmethod
    def from_json(cls, name: str, data: dict[str, Any]) -> _Process:
        proc = cls(name, list(data["argv"]), Path(data["log"]))
        proc.pid, proc.fingerprint = data.get("pid"), data.get("fingerprint")
        return proc


class LocalCluster:
    """etcd + kube-apiserver + kube-controller-manager under `workdir`, admin by static token.

    `start()` always creates a fresh cluster (new etcd data, certificates, token, ports);
    `stop()` leaves the logs in place for a post-mortem. Usable as a context manager.
    """

    def __init__(self, workdir: Path, *, bin_dir: Path, audit: bool = False,
                 controllers: Sequence[str] = DEFAULT_CONTROLLERS,
                 extra_apiserver_args: Sequence[str] = ()) -> None:
        self.workdir = Path(workdir).resolve()
        self.bin_dir = Path(bin_dir).resolve()
        self.audit = audit
        self.controllers = tuple(controllers)
        # Appended last, so they override the defaults above (fault tests use them, e.g.
        # to serve a resource's watches from etcd rather than the watch cache).
        self.extra_apiserver_args = tuple(extra_apiserver_args)
        self.ports: dict[str, int] = {}
        self.processes: dict[str, _Process] = {}
        self._token = ""

    # -- paths and connection facts -------------------------------------------------
    @property
    def kubeconfig_path(self) -> Path:
        return self.workdir / "kubeconfig"

    @property
    def server_url(self) -> str:
        return f"https://127.0.0.1:{self.ports['apiserver']}"

    @property
    def etcd_url(self) -> str:
        return f"http://127.0.0.1:{self.ports['etcd']}"

    @property
    def admin_token(self) -> str:
        return self._token

    @property
    def token_auth_file(self) -> Path:
        return self.workdir / "tokens.csv"

    @property
    def ca_path(self) -> Path:
        """The apiserver's self-signed serving certificate (leaf + its CA): trust this."""
        return self.workdir / "certs" / "apiserver.crt"

    @property
    def service_account_key_path(self) -> Path:
        return self.workdir / "sa.key"

    @property
    def audit_log_path(self) -> Path | None:
        return self.workdir / "logs" / "audit.log" if self.audit else None

    @property
    def kubectl_path(self) -> Path:
        return self.workdir / "bin" / "kubectl"

    @property
    def log_paths(self) -> dict[str, Path]:
        return {name: proc.log for name, proc in self.processes.items()}

    @property
    def pids(self) -> dict[str, int | None]:
        return {name: proc.pid for name, proc in self.processes.items()}

    # -- lifecycle --------------------------------------------------------------------
    def __enter__(self) -> LocalCluster:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self, timeout: float = 180.0) -> None:
        """Start a fresh cluster and wait until it is ready; on failure stop what started."""
        if any(proc.alive() for proc in self.processes.values()):
            raise ClusterError(f"cluster in {self.workdir} is already running")
        for name in BINARIES:
            if not (self.bin_dir / name).exists():
                raise ClusterError(f"missing {self.bin_dir / name}: run hack/kube/build.sh")
        self._prepare_workdir()
        self._plan()
        try:
            self._spawn("etcd", timeout, lambda: self._get(f"{self.etcd_url}/health")[0] == 200)
            self._spawn("kube-apiserver", timeout, self._apiserver_ready)
            self.write_kubeconfig(self.kubeconfig_path, token=self._token)
            self._spawn("kube-controller-manager", timeout, self._controller_manager_healthy)
            self.wait_ready(timeout)
        except BaseException:
            self.stop()
            raise

    def stop(self, grace: float = 15.0) -> None:
        """Stop every process by PID (controller-manager, apiserver, etcd); idempotent."""
        try:
            for name in STOP_ORDER:
                if name in self.processes:
                    self.processes[name].stop(grace=grace)
        finally:
            if self.processes:
                self._save()

    def stop_apiserver(self, grace: float = 15.0) -> None:
        """Stop kube-apiserver alone: etcd keeps the data, controller-manager keeps retrying."""
        self.processes["kube-apiserver"].stop(grace=grace)
        self._save()

    def start_apiserver(self, timeout: float = 120.0) -> None:
        """Start kube-apiserver again with the same port, certificates, token and etcd."""
        proc = self.processes["kube-apiserver"]
        if proc.alive():
            raise ClusterError("kube-apiserver is already running")
        proc.spawn(cwd=self.workdir, truncate_log=False)
        self._save()
        self._wait_for("kube-apiserver /readyz", self._apiserver_ready, timeout)

    def wait_ready(self, timeout: float = 60.0) -> None:
        """Every process alive, /readyz 200, and the `default` ServiceAccount exists."""
        stopped = [name for name, proc in self.processes.items() if proc.pid is None]
        if stopped or not self.processes:
            raise ClusterError(f"not running: {', '.join(stopped) or 'no cluster started'}")
        deadline = time.monotonic() + timeout
        sa_path = "/api/v1/namespaces/default/serviceaccounts/default"
        for what, check in (
            ("kube-apiserver /readyz", self._apiserver_ready),
            ("kube-controller-manager /healthz", self._controller_manager_healthy),
            ("the default ServiceAccount", lambda: self._api("GET", sa_path)[0] == 200),
        ):
            self._wait_for(what, check, max(0.0, deadline - time.monotonic()))

    def alive(self) -> dict[str, bool]:
        return {name: proc.alive() for name, proc in self.processes.items()}

    # -- helpers for tests ------------------------------------------------------------
    def write_kubeconfig(self, path: Path, *, token: str, user: str = "admin",
                         namespace: str = "default") -> Path:
        """A kubeconfig for `token` (admin's, or a ServiceAccount's from create_token)."""
        ca_data = base64.b64encode(self.ca_path.read_bytes()).decode()
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(
            "apiVersion: v1\nkind: Config\n"
            f"clusters:\n- name: {CONTEXT}\n  cluster:\n    server: {self.server_url}\n"
            f"    certificate-authority-data: {ca_data}\n"
            f"users:\n- name: {user}\n  user:\n    token: {token}\n"
            f"contexts:\n- name: {CONTEXT}\n  context:\n    cluster: {CONTEXT}\n"
            f"    user: {user}\n    namespace: {namespace}\n"
            f"current-context: {CONTEXT}\n"
        )
        path.chmod(0o600)
        return path

    def create_token(self, namespace: str, service_account: str, *,
                     expiration_seconds: int = 3600) -> str:
        """A bound ServiceAccount token from the TokenRequest API (as `kubectl create token`)."""
        path = f"/api/v1/namespaces/{namespace}/serviceaccounts/{service_account}/token"
        body = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
                "spec": {"expirationSeconds": expiration_seconds}}
        status, data = self._api("POST", path, body)
        if status != 201:
            raise ClusterError(f"TokenRequest for {namespace}/{service_account}: HTTP {status}")
        return str(json.loads(data)["status"]["token"])

    # -- state file ---------------------------------------------------------------------
    @classmethod
    def attach(cls, workdir: Path) -> LocalCluster:
        """The cluster recorded in `<workdir>/cluster.json` (started by another process)."""
        state_path = Path(workdir) / STATE_FILE
        try:
            state = json.loads(state_path.read_text())
        except (OSError, ValueError) as exc:
            raise ClusterError(f"no usable {state_path}: {exc}") from exc
        cluster = cls(Path(workdir), bin_dir=Path(state["bin_dir"]), audit=state["audit"],
                      controllers=state["controllers"],
                      extra_apiserver_args=state.get("extra_apiserver_args", ()))
        cluster.ports = {k: int(v) for k, v in state["ports"].items()}
        cluster._token = state["admin_token"]
        cluster.processes = {name: _Process.from_json(name, data)
                             for name, data in state["processes"].items()}
        return cluster

    def _save(self) -> None:
        state = {
            "server_url": self.server_url, "etcd_url": self.etcd_url, "ports": self.ports,
            "admin_token": self._token, "kubeconfig": str(self.kubeconfig_path),
            "ca": str(self.ca_path), "kubectl": str(self.kubectl_path),
            "audit": self.audit, "audit_log": str(self.audit_log_path or "") or None,
            "bin_dir": str(self.bin_dir), "controllers": list(self.controllers),
            "extra_apiserver_args": list(self.extra_apiserver_args),
            "processes": {name: proc.to_json() for name, proc in self.processes.items()},
        }
        path = self.workdir / STATE_FILE
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(state, indent=2) + "\n")
        tmp.chmod(0o600)  # it holds the admin token
        tmp.replace(path)

    # -- start-up internals -------------------------------------------------------------
    def _prepare_workdir(self) -> None:
        """Fresh etcd data, certificates, token and signing key; logs start empty."""
        for sub in ("etcd-data", "certs"):
            shutil.rmtree(self.workdir / sub, ignore_errors=True)
        for sub in ("certs", "logs", "bin"):
            (self.workdir / sub).mkdir(parents=True, exist_ok=True)
        self.workdir.chmod(0o700)
        (self.workdir / "etcd-data").mkdir(mode=0o700)
        self._token = secrets.token_hex(32)
        self.token_auth_file.write_text(f'{self._token},{ADMIN_USER},{ADMIN_USER},"system:masters"\n')
        self.token_auth_file.chmod(0o600)
        self._generate_signing_key()
        if self.audit:
            (self.workdir / "audit-policy.yaml").write_text(AUDIT_POLICY)
            assert self.audit_log_path is not None
            self.audit_log_path.unlink(missing_ok=True)
        self.kubectl_path.unlink(missing_ok=True)
        try:
            self.kubectl_path.symlink_to(self.bin_dir / "kubectl")
        except OSError:
            shutil.copy2(self.bin_dir / "kubectl", self.kubectl_path)

    def _generate_signing_key(self) -> None:
        openssl = shutil.which("openssl")
        if openssl is None:
            raise ClusterError("openssl not found: it makes the ServiceAccount signing key "
                               "(Debian: apt-get install openssl)")
        key = self.service_account_key_path
        subprocess.run([openssl, "genrsa", "-out", str(key), "2048"], check=True,
                       capture_output=True)
        key.chmod(0o600)

    def _plan(self) -> None:
        """Choose free ports and write down every command line (kept for restarts)."""
        ports: set[int] = set()
        while len(ports) < 4:
            ports.add(free_port())
        self.ports = dict(zip(("etcd", "etcd_peer", "apiserver", "controller_manager"),
                              sorted(ports), strict=True))
        logs = self.workdir / "logs"
        self.processes = {name: _Process(name, argv, logs / f"{name}.log")
                          for name, argv in (("etcd", self._etcd_argv()),
                                             ("kube-apiserver", self._apiserver_argv()),
                                             ("kube-controller-manager", self._kcm_argv()))}

    def _etcd_argv(self) -> list[str]:
        peer = f"http://127.0.0.1:{self.ports['etcd_peer']}"
        return [str(self.bin_dir / "etcd"), "--name=himitsu-local",
                f"--data-dir={self.workdir / 'etcd-data'}",
                f"--listen-client-urls={self.etcd_url}", f"--advertise-client-urls={self.etcd_url}",
                f"--listen-peer-urls={peer}", f"--initial-advertise-peer-urls={peer}",
                f"--initial-cluster=himitsu-local={peer}", "--unsafe-no-fsync", "--log-level=warn"]

    def _apiserver_argv(self) -> list[str]:
        sa_key = self.service_account_key_path
        argv = [str(self.bin_dir / "kube-apiserver"), f"--etcd-servers={self.etcd_url}",
                "--bind-address=127.0.0.1", "--advertise-address=127.0.0.1",
                f"--secure-port={self.ports['apiserver']}", f"--cert-dir={self.workdir / 'certs'}",
                f"--token-auth-file={self.token_auth_file}", "--authorization-mode=RBAC",
                f"--service-account-issuer={self.server_url}",
                f"--service-account-key-file={sa_key}",
                f"--service-account-signing-key-file={sa_key}",
                f"--service-cluster-ip-range={SERVICE_CIDR}", "--allow-privileged=true",
                # Endpoints may not hold a loopback address: without this the apiserver
                # logs a failure to publish the `kubernetes` Service endpoints forever.
                "--endpoint-reconciler-type=none",
                # Close watches on SIGTERM: otherwise open watches (controller-manager's) hold
                # the HTTP server's shutdown for the whole --request-timeout (60 s).
                "--shutdown-watch-termination-grace-period=2s"]
        if self.audit:
            argv += [f"--audit-policy-file={self.workdir / 'audit-policy.yaml'}",
                     f"--audit-log-path={self.audit_log_path}"]
        return argv + list(self.extra_apiserver_args)

    def _kcm_argv(self) -> list[str]:
        kubeconfig = str(self.kubeconfig_path)
        return [str(self.bin_dir / "kube-controller-manager"), f"--kubeconfig={kubeconfig}",
                "--bind-address=127.0.0.1", f"--secure-port={self.ports['controller_manager']}",
                "--leader-elect=false", f"--controllers={','.join(self.controllers)}",
                "--use-service-account-credentials=false",
                f"--service-account-private-key-file={self.service_account_key_path}",
                f"--root-ca-file={self.ca_path}"]

    def _spawn(self, name: str, timeout: float, ready: Callable[[], bool]) -> None:
        self.processes[name].spawn(cwd=self.workdir, truncate_log=True)
        self._save()
        self._wait_for(f"{name} to serve", ready, timeout)

    def _wait_for(self, what: str, check: Callable[[], bool], timeout: float) -> None:
        """Poll `check` until the deadline, failing early (with its log) if a process died."""
        deadline = time.monotonic() + timeout
        while True:
            for proc in self.processes.values():
                if proc.pid is not None and not proc.alive():
                    raise ClusterError(proc.describe_death())
            if check():
                return
            if time.monotonic() >= deadline:
                raise ClusterError(f"timed out after {timeout:.0f}s waiting for {what}; logs in "
                                   f"{self.workdir / 'logs'}")
            time.sleep(0.1)

    # -- HTTP (stdlib, proxies disabled: everything is on loopback) ----------------------
    def _get(self, url: str, *, context: ssl.SSLContext | None = None,
             token: str | None = None) -> tuple[int, bytes]:
        return _request("GET", url, context=context, token=token)

    def _api(self, method: str, path: str, body: dict[str, Any] | None = None
             ) -> tuple[int, bytes]:
        context = ssl.create_default_context(cafile=str(self.ca_path))
        return _request(method, self.server_url + path, context=context, token=self._token,
                        body=body)

    def _apiserver_ready(self) -> bool:
        return self.ca_path.exists() and self._api("GET", "/readyz")[0] == 200

    def _controller_manager_healthy(self) -> bool:
        # Its serving certificate is generated in memory: nothing to verify it against.
        context = ssl._create_unverified_context()  # noqa: S323
        url = f"https://127.0.0.1:{self.ports['controller_manager']}/healthz"
        return self._get(url, context=context)[0] == 200


def _request(method: str, url: str, *, context: ssl.SSLContext | None, token: str | None,
             body: dict[str, Any] | None = None) -> tuple[int, bytes]:
    """(status, body); status 0 when nothing answered. Never puts the token in an error."""
    headers = {"Accept": "application/json"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    data = None
    if body is not None:
        data = json.dumps(body).encode()
        headers["Content-Type"] = "application/json"
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}),
                                         urllib.request.HTTPSHandler(context=context))
    # Only http(s) URLs this module builds for 127.0.0.1 reach here.
    req = urllib.request.Request(url, data=data, headers=headers, method=method)  # noqa: S310
    try:
        with opener.open(req, timeout=5) as resp:
            return int(resp.status), resp.read()
    except urllib.error.HTTPError as exc:
        return int(exc.code), exc.read()
    except (OSError, ssl.SSLError):
        return 0, b""


# -- CLI ---------------------------------------------------------------------------------
def _cmd_up(args: argparse.Namespace) -> int:
    workdir = Path(args.dir)
    if (workdir / STATE_FILE).exists():
        running = LocalCluster.attach(workdir)
        if running.processes and all(running.alive().values()):
            if args.audit and not running.audit:
                print(f"cluster in {workdir} runs without --audit: run `down` first",
                      file=sys.stderr)
                return 1
            running.wait_ready(min(args.timeout, 30.0))
            print(f"already running: {running.server_url} (KUBECONFIG={running.kubeconfig_path})")
            return 0
        running.stop()  # a partly dead cluster: clear the survivors before starting afresh
    bin_dir = ensure_binaries(Path(args.bin_dir))
    cluster = LocalCluster(workdir, bin_dir=bin_dir, audit=args.audit)
    started = time.monotonic()
    cluster.start(timeout=args.timeout)
    print(f"cluster ready in {time.monotonic() - started:.1f}s: {cluster.server_url}\n"
          f"  export KUBECONFIG={cluster.kubeconfig_path}\n  kubectl: {cluster.kubectl_path}")
    if cluster.audit_log_path:
        print(f"  audit log: {cluster.audit_log_path}")
    return 0


def _cmd_down(args: argparse.Namespace) -> int:
    if not (Path(args.dir) / STATE_FILE).exists():
        print(f"no cluster in {args.dir}")
        return 0
    LocalCluster.attach(Path(args.dir)).stop()
    print(f"stopped the cluster in {args.dir} (logs kept in {Path(args.dir) / 'logs'})")
    return 0


def _cmd_status(args: argparse.Namespace) -> int:
    cluster = LocalCluster.attach(Path(args.dir))
    alive = cluster.alive()
    for name, proc in cluster.processes.items():
        print(f"{name:24} pid={proc.pid or '-':<8} {'running' if alive[name] else 'stopped'}")
    ready = all(alive.values()) and cluster._apiserver_ready()
    print(f"apiserver {cluster.server_url} {'ready' if ready else 'not ready'}; "
          f"KUBECONFIG={cluster.kubeconfig_path}")
    return 0 if ready else 1


def _cmd_restart_apiserver(args: argparse.Namespace) -> int:
    cluster = LocalCluster.attach(Path(args.dir))
    cluster.stop_apiserver()
    cluster.start_apiserver(args.timeout)
    cluster.wait_ready(args.timeout)
    print(f"kube-apiserver restarted (pid {cluster.pids['kube-apiserver']})")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    sub = parser.add_subparsers(dest="command", required=True)
    commands = {"up": _cmd_up, "down": _cmd_down, "status": _cmd_status,
                "restart-apiserver": _cmd_restart_apiserver}
    for name in commands:
        cmd = sub.add_parser(name)
        cmd.add_argument("--dir", default=".local", help="work directory (default .local)")
        cmd.add_argument("--timeout", type=float, default=180.0, help="seconds to wait")
        if name == "up":
            cmd.add_argument("--audit", action="store_true", help="Metadata-level audit log")
            cmd.add_argument("--bin-dir", default=str(DEFAULT_BIN_DIR))
    args = parser.parse_args(argv)
    try:
        return commands[args.command](args)
    except ClusterError as exc:
        print(f"localcluster: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
