"""The built image, run with deploy/manager's security context, leads, syncs and stops.

`make docker-smoke` (after `make docker-build`). The container gets what the kubelet
would give it, translated from the Deployment by image_run.py: read-only root, the pod's
user, every capability dropped, no privilege escalation, a tmpfs where the pod mounts an
emptyDir, its memory and CPU limits, its args and env; and in-cluster configuration, a
faked ServiceAccount mount (a TokenRequest token of himitsu-system/himitsu-operator, the
apiserver's CA, the namespace) with KUBERNETES_SERVICE_HOST/PORT pointing at the local
control plane. The differences, all forced by running beside the cluster rather than in
it: host networking (the apiserver and the stand-in listen on 127.0.0.1), bind addresses
on free loopback ports instead of :8080/:8081, HIMITSU_API_URLS set to the stand-in,
--allow-insecure-http (the stand-in is plain http) and a Lease of its own.

Skipped, with the reason, without docker, a daemon or the image (E2E_IMAGE, default the
Deployment's image).
"""

from __future__ import annotations

import base64
import json
import os
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import requests
import yaml

from himitsu_controller import __version__

from . import cluster_setup, image_run
from .canary import LeakEvidence
from .harness import Harness
from .kubehelp import KubeApi, wait_for
from .operator_proc import READY_TIMEOUT, free_port
from .standin_client import StandinClient

MANIFEST = image_run.deployment()
IMAGE = os.environ.get("E2E_IMAGE") or image_run.pod_run(MANIFEST).image
# Decided at collection, so a skipped module starts no control plane.
UNAVAILABLE = image_run.unavailable(IMAGE)

pytestmark = [pytest.mark.e2e, pytest.mark.image, pytest.mark.local_only,
              pytest.mark.skipif(UNAVAILABLE is not None, reason=UNAVAILABLE or "")]

# Imports what the operator imports at start, then checks that every loaded module from a
# .py file has bytecode matching its source (timestamp .pyc: mtime and size), so nothing
# is compiled at run time (nor written: the root is read-only anyway).
BYTECODE_CHECK = r"""
import importlib.util, json, os, sys
import himitsu_controller.cli
stale, checked = [], 0
for name, module in sorted(sys.modules.items()):
    source = getattr(module, "__file__", None) or ""
    if not source.endswith(".py"):
        continue
    checked += 1
    try:
        with open(importlib.util.cache_from_source(source), "rb") as fh:
            header = fh.read(16)
    except OSError:
        stale.append(name)
        continue
    st = os.stat(source)
    if int.from_bytes(header[4:8], "little") == 0 and (
            int.from_bytes(header[8:12], "little") != int(st.st_mtime) & 0xFFFFFFFF
            or int.from_bytes(header[12:16], "little") != st.st_size & 0xFFFFFFFF):
        stale.append(name)
print(json.dumps({"dont_write_bytecode": sys.flags.dont_write_bytecode,
                  "checked": checked, "stale": stale}))
"""


def test_image_user_and_cli_match_the_deployment(tmp_path: Path) -> None:
    run = image_run.pod_run(MANIFEST)
    found = image_run.inspect(IMAGE)
    assert found is not None
    # Without a securityContext (docker run, another orchestrator) it is the same user.
    assert found["Config"]["User"] == f"{run.uid}:{run.gid}"

    code, out = image_run.run_once(run.flags, IMAGE, ["--version"], workdir=tmp_path)
    assert (code, out.strip()) == (0, f"himitsu-controller {__version__}"), out
    code, out = image_run.run_once(run.flags, IMAGE, ["--help"], workdir=tmp_path)
    assert code == 0, out
    flags = {arg.split("=", 1)[0] for arg in run.args if arg.startswith("--")}
    assert flags, "the Deployment passes no flags: nothing to compare"
    missing = sorted(flag for flag in flags if not re.search(rf"{re.escape(flag)}\b", out))
    assert not missing, f"the image's CLI does not know the Deployment's flags {missing}"


def test_image_compiled_everything_it_imports_at_build_time(tmp_path: Path) -> None:
    run = image_run.pod_run(MANIFEST)
    code, out = image_run.run_once(
        [*run.flags, "--entrypoint=/opt/venv/bin/python"], IMAGE, ["-c", BYTECODE_CHECK],
        workdir=tmp_path)
    assert code == 0, out
    result = json.loads(out.strip().splitlines()[-1])
    assert result["dont_write_bytecode"] == 1
    assert result["checked"] > 100, result  # the operator, its dependencies, the stdlib
    assert result["stale"] == [], f"modules compiled at run time: {result['stale']}"


def _service_account(operator_kubeconfig: str, namespace: str, into: Path) -> tuple[Path, str]:
    """The ServiceAccount mount a pod gets (token, ca.crt, namespace); and the server URL."""
    config = yaml.safe_load(Path(operator_kubeconfig).read_text())
    cluster = config["clusters"][0]["cluster"]
    into.mkdir(mode=0o755)
    files = {"token": config["users"][0]["user"]["token"],
             "ca.crt": base64.b64decode(cluster["certificate-authority-data"]).decode(),
             "namespace": namespace}
    for name, text in files.items():
        (into / name).write_text(text)
        (into / name).chmod(0o644)  # a projected volume's default mode; the pod's user reads it
    return into, str(cluster["server"])


def _records(logs: str) -> list[dict[str, Any]]:
    records = []
    for line in logs.splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict):
            records.append(record)
    return records


@dataclass
class Smoke:
    """The in-cluster run: the Deployment's container plus what running beside it needs."""

    run: image_run.PodRun
    flags: list[str]
    args: list[str]
    host_port: dict[int, int]  # containerPort -> the loopback port it is bound to
    lease: str
    log_dir: Path

    def probe(self, kind: str) -> int:
        path, port = self.run.probes[kind]
        try:
            return requests.get(f"http://127.0.0.1:{self.host_port[port]}{path}",
                                timeout=5).status_code
        except requests.RequestException:
            return 0

    @property
    def lease_path(self) -> str:
        return (f"/apis/coordination.k8s.io/v1/namespaces/{self.run.namespace}"
                f"/leases/{self.lease}")


@pytest.fixture
def smoke(operator_kubeconfig: str, standin: StandinClient, kube: KubeApi,
          tmp_path: Path) -> Smoke:
    run = image_run.pod_run(MANIFEST, env={"HIMITSU_API_URLS": standin.api_url})
    assert "--leader-elect" in run.args, "the Deployment no longer elects a leader"
    # The token is that ServiceAccount's, bound as deploy/rbac binds it there.
    assert run.namespace == cluster_setup.OPERATOR_NAMESPACE
    sa_dir, server = _service_account(operator_kubeconfig, run.namespace, tmp_path / "sa")
    url = urlsplit(server)
    # Each bind address on a containerPort moves to a free loopback port (host network).
    host_port: dict[int, int] = {}
    args = []
    for given in run.args:
        bind = re.fullmatch(r"(--[a-z-]+-bind-address)=(.*):(\d+)", given)
        if bind and int(bind.group(3)) in run.ports.values():
            host_port[int(bind.group(3))] = port = free_port()
            args.append(f"{bind.group(1)}=127.0.0.1:{port}")
        else:
            args.append(given)
    lease = cluster_setup.lease_name(kube, "e2e-image")
    args += ["--allow-insecure-http", f"--leader-election-id={lease}"]
    flags = [*run.flags, "--network=host",
             f"--volume={sa_dir}:{image_run.SERVICE_ACCOUNT_DIR}:ro",
             f"--env=KUBERNETES_SERVICE_HOST={url.hostname}",
             f"--env=KUBERNETES_SERVICE_PORT={url.port}"]
    return Smoke(run, flags, args, host_port, lease, tmp_path)


def test_in_cluster_the_image_leads_syncs_and_stops_on_sigterm(
        h: Harness, ns: str, kube: KubeApi, smoke: Smoke, leak_evidence: LeakEvidence) -> None:
    run = smoke.run
    with image_run.started(smoke.flags, IMAGE, smoke.args, workdir=smoke.log_dir) as container:
        log_path = smoke.log_dir / f"image-{container.id[:12]}.log"
        leak_evidence.logs.append(log_path)  # the session's canary scan reads it
        try:
            def ready() -> bool:
                state = container.state()
                if not state["Running"]:
                    raise AssertionError(f"the container exited with {state['ExitCode']}")
                return smoke.probe("readinessProbe") == 200

            wait_for(ready, timeout=READY_TIMEOUT, what="the container's readiness probe")
            assert smoke.probe("livenessProbe") == 200

            sync = h.sync(ns, "API_KEY", "DB_PASSWORD")
            h.wait_data(ns, sync.target, sync.values)
            holder = kube.get(smoke.lease_path)["spec"]["holderIdentity"]
            led = [r for r in _records(container.logs()) if r.get("event") == "became leader"]
            assert [r.get("identity") for r in led] == [holder], led

            container.signal("TERM")
            try:
                code = container.wait(timeout=run.grace_seconds)
            except subprocess.TimeoutExpired:
                raise AssertionError(f"still running {run.grace_seconds} s after SIGTERM "
                                     "(terminationGracePeriodSeconds): the kubelet would "
                                     "SIGKILL it") from None
            state = container.state()
            assert (code, state["OOMKilled"]) == (0, False), state
            assert not kube.get(smoke.lease_path)["spec"].get("holderIdentity"), \
                "the Lease was not released on SIGTERM"
        finally:
            log_path.write_text(container.logs())
    assert h.data(ns, sync.target) == sync.values  # stopping leaves the Secret as it was
