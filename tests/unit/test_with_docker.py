"""hack/kind/with-docker.sh: installs the daemon it needs and leaves the host's network as found."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "hack" / "kind" / "with-docker.sh"


def test_a_client_only_docker_still_gets_docker_io_installed(tmp_path: Path) -> None:
    """CI machines ship a docker CLIENT without dockerd: the script must install docker.io."""
    for tool in ("docker", "buildah", "mmdebstrap"):
        (tmp_path / tool).write_text("#!/bin/sh\nexit 1\n")
        (tmp_path / tool).chmod(0o755)
    calls = tmp_path / "apt-calls"
    (tmp_path / "apt-get").write_text(f'#!/bin/sh\necho "$@" >>{calls}\n[ "$1" = update ]\n')
    (tmp_path / "apt-get").chmod(0o755)
    subprocess.run(
        ["/bin/bash", str(SCRIPT), "true"],
        env={"PATH": str(tmp_path)},
        capture_output=True,
        timeout=30,
        check=False,
    )
    assert "docker.io" in calls.read_text()


DIRTY = """set -e
iptables -N DOCKER
iptables -t nat -N DOCKER
iptables -t nat -A POSTROUTING -s 172.17.0.0/16 -j MASQUERADE
iptables -P FORWARD DROP
iptables -A FORWARD -j DOCKER
sysctl -q -w net.ipv4.ip_forward=1
"""

CHECK = """set -e
sysctl -q -w net.ipv4.ip_forward=0
iptables -A INPUT -s 10.9.9.9 -j DROP
WITH_DOCKER_SELFTEST=net bash {script} bash {dirty}
iptables-save | grep -v '^#'
sysctl -n net.ipv4.ip_forward
"""


def _can_unshare() -> bool:
    if os.geteuid() != 0 or not shutil.which("unshare") or not shutil.which("iptables-save"):
        return False
    probe = subprocess.run(["unshare", "-n", "true"], capture_output=True, check=False)
    return probe.returncode == 0


@pytest.mark.skipif(not _can_unshare(), reason="needs root, unshare -n and iptables")
def test_what_dockerd_adds_to_a_fresh_host_is_removed_in_a_throwaway_netns(tmp_path: Path) -> None:
    """iptables-restore of an empty snapshot alone would keep Docker's chains and policy."""
    dirty = tmp_path / "dirty.sh"
    dirty.write_text(DIRTY)
    out = subprocess.run(
        ["unshare", "-n", "bash", "-c", CHECK.format(script=SCRIPT, dirty=dirty)],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    assert "-A INPUT -s 10.9.9.9/32 -j DROP" in out  # the host's own rule is back
    assert "DOCKER" not in out and "MASQUERADE" not in out
    assert ":FORWARD DROP" not in out
    assert out.strip().splitlines()[-1] == "0"  # ip_forward as found
