"""The kind path's own tooling, without docker or a cluster (fakes on PATH).

* a killed pytest leaves no ``kubectl port-forward`` behind (tests/e2e/kind.py).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
def _gone(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return True
    return state in {"Z", "X"}  # a zombie nobody reaped has exited


def _wait_gone(pid: int, timeout: float = 20.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if _gone(pid):
            return True
        time.sleep(0.05)
    return _gone(pid)


FAKE_KUBECTL = """\
#!{python}
import socket, sys, time
port = int(sys.argv[-1].split(":")[0])
server = socket.create_server(("127.0.0.1", port))
while True:
    time.sleep(1)
"""

PORT_FORWARD_USER = """\
import sys
sys.path.insert(0, {tests!r})
from pathlib import Path
from e2e.kind import PortForward
forward = PortForward("unused", "ns", "svc/x", 80, Path({log!r}))
print(forward._proc.pid, flush=True)
sys.stdin.read()
"""


def test_a_killed_test_process_leaves_no_port_forward_behind(tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    kubectl = bin_dir / "kubectl"
    kubectl.write_text(FAKE_KUBECTL.format(python=sys.executable))
    kubectl.chmod(0o755)
    code = PORT_FORWARD_USER.format(tests=str(ROOT / "tests"), log=str(tmp_path / "pf.log"))
    user = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "E2E_KUBE_BIN_DIR": str(bin_dir)})
    forward_pid = 0
    try:
        assert user.stdout is not None
        forward_pid = int(user.stdout.readline())
        assert not _gone(forward_pid)
        user.kill()  # as a CI timeout or a second Ctrl-C would: no teardown runs
        user.wait(timeout=10)
        assert _wait_gone(forward_pid), "kubectl port-forward outlived the killed pytest"
    finally:
        if user.poll() is None:
            user.kill()
        if forward_pid and not _gone(forward_pid):
            os.kill(forward_pid, signal.SIGKILL)
