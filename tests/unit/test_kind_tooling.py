"""The kind path's own tooling, without docker or a cluster (fakes on PATH).

* a killed pytest leaves no ``kubectl port-forward`` behind (tests/e2e/kind.py);
* hack/kind/kind.sh finds kind's default node image in the kind binary itself (a kind on
  PATH, a cleaned Go module cache), takes a kind of its version from PATH instead of
  building one, and routes docker through hack/kind/offline/docker only for the failure
  that wrapper stands in for (the caps error, CAP_SYS_RESOURCE missing), saying why not.
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
KIND_SH = ROOT / "hack" / "kind" / "kind.sh"
NODE = "kindest/node:v1.2.3@sha256:" + "ab" * 32
CAPS_ERROR = ("docker: Error response from daemon: failed to create shim task: OCI runtime "
              "create failed: runc create failed: unable to start container process: "
              "unable to apply caps: operation not permitted: unknown.")


def _gone(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return True
    return state in {"Z", "X"}  # a zombie nobody reaped has exited


def _wait_gone(pid: int, timeout: float = 20.0) -> bool:
    """Whether ``pid`` exits within ``timeout``: its pidfd turns readable when it does."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return True
    try:
        select.select([fd], [], [], timeout)
    finally:
        os.close(fd)
    return _gone(pid)


FAKE_KUBECTL = """\
#!{python}
import signal, socket, sys
port = int(sys.argv[-1].split(":")[0])
server = socket.create_server(("127.0.0.1", port))
while True:
    signal.pause()
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


def _fake(path: Path, body: str) -> None:
    path.write_text("#!/bin/bash\n" + textwrap.dedent(body))
    path.chmod(0o755)


def _kind_up(tmp_path: Path, *, privileged_error: str = "", kind_on_path: bool = False,
             capbnd: str = "") -> subprocess.CompletedProcess[str]:
    """``kind.sh up NAME`` with fakes: a kind of the right version whose cluster exists
    (so nothing is created and no host state touched), docker, and a go that fails
    (no module cache, no network)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    calls = tmp_path / "calls"
    kind = (bin_dir if kind_on_path else tmp_path) / "kind"
    _fake(kind, f"""\
        # the default node image, compiled in: {NODE}
        case "$1" in
          version) echo "kind v0.33.0 go1.24 linux/amd64" ;;
          get) echo e2e-test ;;
        esac
        """)
    _fake(bin_dir / "go", f'echo "go $*" >>{calls}; exit 1\n')
    _fake(bin_dir / "docker", f"""\
        echo "docker $*" >>{calls}
        if [[ "$1" == run && " $* " == *" --privileged "* && -n "$PRIV_ERROR" ]]; then
          echo "$PRIV_ERROR" >&2; exit 125
        fi
        exit 0
        """)
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "HOME": str(tmp_path),
           "PRIV_ERROR": privileged_error, "HIMITSU_KIND_CAPBND": capbnd,
           "KIND": str(tmp_path / "absent" / "kind") if kind_on_path else str(kind)}
    result = subprocess.run(["/bin/bash", str(KIND_SH), "up", "e2e-test"], env=env,
                            capture_output=True, text=True, timeout=60, check=False)
    result.stdout = calls.read_text() if calls.exists() else ""
    return result


def test_the_default_node_image_comes_from_the_kind_binary_not_the_module_cache(
        tmp_path: Path) -> None:
    result = _kind_up(tmp_path)
    assert result.returncode == 0, result.stderr
    assert f"docker image inspect {NODE}" in result.stdout
    assert "go " not in result.stdout  # neither `go env GOMODCACHE` nor a build


def test_a_kind_of_the_version_on_path_is_used_rather_than_built(tmp_path: Path) -> None:
    result = _kind_up(tmp_path, kind_on_path=True)
    assert result.returncode == 0, result.stderr
    assert "go install" not in result.stdout
    assert "already exists" in result.stderr


def test_a_privileged_failure_other_than_missing_caps_is_reported_not_wrapped(
        tmp_path: Path) -> None:
    result = _kind_up(tmp_path, privileged_error="docker: Error response from daemon: "
                                                 "no space left on device.")
    assert result.returncode == 1
    assert "not for a missing capability" in result.stderr
    assert "no space left on device" in result.stderr
    assert "hack/kind/offline/docker" not in result.stderr


FULL = (1 << (int(Path("/proc/sys/kernel/cap_last_cap").read_text()) + 1)) - 1


@pytest.mark.parametrize(("bounding", "wrapped"), [
    (FULL & ~(1 << 24), True),                  # these sandboxes: no CAP_SYS_RESOURCE
    (FULL & ~(1 << 24) & ~(1 << 21), False),    # CAP_SYS_ADMIN missing too
    (FULL, False),                              # nothing missing: the error is not ours
], ids=["sys-resource-only", "sys-admin-too", "none-missing"])
def test_the_caps_error_takes_the_wrapper_only_when_it_fits_the_bounding_set(
        tmp_path: Path, bounding: int, wrapped: bool) -> None:
    result = _kind_up(tmp_path, privileged_error=CAPS_ERROR, capbnd=f"{bounding:016x}")
    if wrapped:
        assert result.returncode == 0, result.stderr
        assert "kind runs through hack/kind/offline/docker" in result.stderr
    else:
        assert result.returncode == 1
        assert "stands in" in result.stderr and f"CapBnd {bounding:016x}" in result.stderr
