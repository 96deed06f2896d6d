"""The operator under test as a separate process: start, probe, scrape, signal, stop.

Why a real process (``python -m himitsu_controller``), not an in-process Manager: the
e2e suite must prove what users run, including signal handling, leader election between
processes, exit codes and the flags themselves. Every process is started in its own
session and stopped by its PID (never by name), and its stdout/stderr go to a log file
that the canary scan reads at the end of the session.

On kind the operator runs in-cluster (``make deploy``); ``InClusterOperator`` stands in
for the handle there, and tests that need their own flags are skipped.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import requests

from .kubehelp import REPO, wait_for

READY_TIMEOUT = 60.0
STOP_TIMEOUT = 45.0  # the graceful drain is bounded at 30 s by default


def free_port() -> int:
    """A port free on 127.0.0.1 right now (the kernel picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class OperatorProcess:
    """One running ``himitsu-controller``."""

    name: str
    proc: subprocess.Popen[bytes]
    metrics_port: int
    probe_port: int
    log_path: Path
    args: list[str]

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def url(self, path: str, *, probes: bool = False) -> str:
        port = self.probe_port if probes else self.metrics_port
        return f"http://127.0.0.1:{port}{path}"

    def probe(self, path: str) -> int:
        """HTTP status of /healthz or /readyz (0 when nothing answers)."""
        try:
            return requests.get(self.url(path, probes=True), timeout=5).status_code
        except requests.RequestException:
            return 0

    def scrape(self) -> str:
        response = requests.get(self.url("/metrics"), timeout=10)
        response.raise_for_status()
        return response.text

    def log_text(self) -> str:
        return self.log_path.read_text(encoding="utf-8", errors="replace")

    def log_records(self) -> list[dict[str, Any]]:
        """The JSON log lines (anything else, such as a traceback, is skipped)."""
        records = []
        for line in self.log_text().splitlines():
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if isinstance(record, dict):
                records.append(record)
        return records

    def log_tail(self, lines: int = 40) -> str:
        return "\n".join(self.log_text().splitlines()[-lines:])

    def stop(self, sig: int = signal.SIGTERM, *, timeout: float = STOP_TIMEOUT) -> int | None:
        """Send ``sig`` and wait for the exit (SIGKILL after ``timeout``); the exit code."""
        if self.alive():
            os.kill(self.pid, sig)
            try:
                return self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                os.kill(self.pid, signal.SIGKILL)
        return self.proc.wait(timeout=timeout)

    def kill(self) -> int | None:
        return self.stop(signal.SIGKILL)


class OperatorLauncher:
    """Starts operators for a test or a module and stops every one of them at teardown."""

    def __init__(self, *, kubeconfig: str, log_dir: Path,
                 on_log: Callable[[Path], None] = lambda _p: None) -> None:
        self.kubeconfig = kubeconfig
        self.log_dir = log_dir
        self._on_log = on_log
        self._started: list[OperatorProcess] = []

    def start(self, *extra: str, name: str = "operator", kubeconfig: str | None = None,
              wait_ready: bool = True) -> OperatorProcess:
        metrics_port, probe_port = free_port(), free_port()
        log_path = self.log_dir / f"{name}-{len(self._started)}-{int(time.time())}.log"
        args = [
            sys.executable, "-m", "himitsu_controller",
            "--kubeconfig", kubeconfig or self.kubeconfig,
            "--metrics-bind-address", f"127.0.0.1:{metrics_port}",
            "--health-probe-bind-address", f"127.0.0.1:{probe_port}",
            "--log-format", "json", "--log-level", "debug",
            # The stand-in is plain http on loopback (production refuses http).
            "--allow-insecure-http", *extra,
        ]
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        env.pop("KUBECONFIG", None)  # only --kubeconfig may decide who the operator is
        self._on_log(log_path)
        with open(log_path, "wb") as log_file:
            proc = subprocess.Popen(args, stdout=log_file, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, cwd=REPO, env=env,
                                    start_new_session=True)
        handle = OperatorProcess(name, proc, metrics_port, probe_port, log_path, args)
        self._started.append(handle)
        if wait_ready:
            wait_until_ready(handle)
        return handle

    def stop_all(self) -> None:
        for handle in reversed(self._started):
            handle.stop()
        self._started.clear()


def wait_until_ready(handle: OperatorProcess, *, timeout: float = READY_TIMEOUT) -> None:
    def ready() -> bool:
        if not handle.alive():
            raise AssertionError(f"operator {handle.name} exited with {handle.proc.returncode}"
                                 f" before it was ready; log tail:\n{handle.log_tail()}")
        return handle.probe("/readyz") == 200

    try:
        wait_for(ready, timeout=timeout, what=f"/readyz of operator {handle.name}")
    except AssertionError as exc:
        raise AssertionError(f"{exc}\nlog tail:\n{handle.log_tail()}") from None
