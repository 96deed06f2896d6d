"""The operator image run the way deploy/manager's Deployment runs it, with ``docker run``.

Why: the image must work under the Deployment's security context (read-only root, user
65532, every capability dropped, no privilege escalation, /tmp the only writable path)
and with in-cluster configuration; without this, the first place to find out is a real
cluster. The docker flags are derived from the Deployment as shipped, never written down
a second time, so the manifest is tested as it is; a field this translation does not
know fails the test (teach it here) rather than being dropped in silence.

Every container is started with ``--cidfile`` and removed by its id, whatever happens.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import subprocess
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

# No e2e imports: tests/unit/test_image_run.py checks the translation without a cluster.
MANIFEST = Path(__file__).resolve().parents[2] / "deploy" / "manager" / "manager.yaml"
SERVICE_ACCOUNT_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
DOCKER = os.environ.get("DOCKER") or "docker"
_QUANTITY = re.compile(r"^(\d+(?:\.\d+)?)(m|Ki|Mi|Gi|Ti|k|M|G|T)?$")
_SUFFIX = {None: 1, "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40,
           "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12}


class Untranslated(AssertionError):
    """The Deployment uses a field that image_run.py cannot express as a docker flag."""


def deployment() -> dict[str, Any]:
    with MANIFEST.open(encoding="utf-8") as fh:
        (found,) = [d for d in yaml.safe_load_all(fh) if d and d.get("kind") == "Deployment"]
    return dict(found)


def quantity(text: str | int | float) -> float:
    """A Kubernetes resource quantity ("256Mi", "500m", "1") as a number."""
    match = _QUANTITY.match(str(text))
    if match is None:
        raise Untranslated(f"resource quantity {text!r}")
    number, suffix = float(match.group(1)), match.group(2)
    return number / 1000 if suffix == "m" else number * _SUFFIX[suffix]


@dataclass
class PodRun:
    """The manager container of the Deployment, as ``docker run`` flags and arguments."""

    image: str
    namespace: str
    uid: int
    gid: int | None
    flags: list[str]  # security context, resources, volumes, env
    args: list[str]  # the container args, $(VAR) expanded
    grace_seconds: int
    ports: dict[str, int]  # port name -> containerPort
    probes: dict[str, tuple[str, int]] = field(default_factory=dict)  # kind -> (path, port)


def pod_run(manifest: Mapping[str, Any], *, env: Mapping[str, str] | None = None) -> PodRun:
    """Translate the Deployment; ``env`` overrides the container's literal env values."""
    namespace = manifest["metadata"]["namespace"]
    pod = manifest["spec"]["template"]["spec"]
    (container,) = [c for c in pod["containers"] if c["name"] == "manager"]
    if container.get("command"):
        raise Untranslated("container command (the image's ENTRYPOINT is what runs)")
    ports = {p["name"]: int(p["containerPort"]) for p in container.get("ports", ())}
    values = _env(container.get("env", ()), namespace, dict(env or {}))
    uid, gid, security = _security(pod.get("securityContext") or {},
                                   container.get("securityContext") or {})
    flags = [*security, *_resources(container.get("resources") or {}),
             *_volumes(container.get("volumeMounts", ()), pod.get("volumes", ())),
             *(f"--env={k}={v}" for k, v in values.items())]
    probes = {}
    for kind in ("startupProbe", "readinessProbe", "livenessProbe"):
        if kind in container:
            http = container[kind].get("httpGet")
            if http is None:
                raise Untranslated(f"{kind} without httpGet")
            port = http["port"]
            probes[kind] = (http.get("path", "/"), ports[port] if isinstance(port, str)
                            else int(port))
    return PodRun(image=container["image"], namespace=namespace, uid=uid, gid=gid,
                  flags=flags, args=[_expand(a, values) for a in container.get("args", ())],
                  grace_seconds=int(pod.get("terminationGracePeriodSeconds", 30)),
                  ports=ports, probes=probes)


def _security(pod: Mapping[str, Any], ctr: Mapping[str, Any]) -> tuple[int, int | None, list[str]]:
    merged = {**pod, **ctr}  # container fields win, as with the kubelet
    flags: list[str] = []
    uid = merged.pop("runAsUser", None)
    gid = merged.pop("runAsGroup", None)
    if uid is None:
        raise Untranslated("no runAsUser: the smoke run needs the user id the pod runs as")
    flags.append(f"--user={uid}" + (f":{gid}" if gid is not None else ""))
    if merged.pop("runAsNonRoot", False) and int(uid) == 0:
        raise AssertionError("runAsNonRoot with runAsUser 0: the kubelet would refuse the pod")
    if merged.pop("readOnlyRootFilesystem", False):
        flags.append("--read-only")
    if merged.pop("allowPrivilegeEscalation", True) is False:
        flags.append("--security-opt=no-new-privileges")
    if merged.pop("privileged", False):
        raise Untranslated("privileged")
    caps = merged.pop("capabilities", {}) or {}
    flags += [f"--cap-drop={c}" for c in caps.pop("drop", ())]
    flags += [f"--cap-add={c}" for c in caps.pop("add", ())]
    seccomp = (merged.pop("seccompProfile", None) or {}).get("type", "RuntimeDefault")
    if seccomp == "Unconfined":
        flags.append("--security-opt=seccomp=unconfined")
    elif seccomp != "RuntimeDefault":  # RuntimeDefault: docker's own default profile
        raise Untranslated(f"seccompProfile {seccomp}")
    flags += [f"--group-add={g}" for g in merged.pop("supplementalGroups", ())]
    unknown = sorted({*merged, *caps})
    if unknown:
        raise Untranslated(f"securityContext fields {unknown}")
    return int(uid), None if gid is None else int(gid), flags


def _resources(resources: Mapping[str, Any]) -> list[str]:
    flags = []
    for name, value in (resources.get("limits") or {}).items():
        if name == "memory":
            flags.append(f"--memory={int(quantity(value))}")
        elif name == "cpu":
            flags.append(f"--cpus={quantity(value):g}")
        else:
            raise Untranslated(f"resource limit {name}")
    return flags  # requests only place the pod on a node


def _volumes(mounts: Any, volumes: Any) -> list[str]:
    by_name = {v["name"]: v for v in volumes}
    flags = []
    for mount in mounts:
        volume = dict(by_name[mount["name"]])
        volume.pop("name")
        if set(volume) != {"emptyDir"} or mount.get("subPath"):
            raise Untranslated(f"volume {mount['name']}: only emptyDir mounts are translated")
        # An emptyDir is a fresh, world-writable directory: a tmpfs of its size limit.
        size = (volume["emptyDir"] or {}).get("sizeLimit")
        options = ["ro" if mount.get("readOnly") else "rw", "exec", "nosuid", "nodev",
                   "mode=1777", *([f"size={int(quantity(size))}"] if size else [])]
        flags.append(f"--tmpfs={mount['mountPath']}:{','.join(options)}")
    return flags


def _env(entries: Any, namespace: str, overrides: dict[str, str]) -> dict[str, str]:
    values: dict[str, str] = {}
    for entry in entries:
        name = entry["name"]
        if "value" in entry:
            values[name] = overrides.pop(name, _expand(str(entry["value"]), values))
        elif (entry.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath")
              == "metadata.namespace"):
            values[name] = namespace
        else:
            raise Untranslated(f"env {name}: {entry}")
    if overrides:
        raise AssertionError(f"env overrides for variables the Deployment lacks: "
                             f"{sorted(overrides)}")
    return values


def _expand(text: str, values: Mapping[str, str]) -> str:
    """The kubelet's $(VAR) expansion: defined variables only; $$ escapes."""
    return re.sub(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_]*)\)",
                  lambda m: "$" if m.group(0) == "$$" else values.get(m.group(1), m.group(0)),
                  text)


# -- docker ----------------------------------------------------------------------------------
def unavailable(image: str) -> str | None:
    """Why the image cannot be run here (a skip reason), or None."""
    if shutil.which(DOCKER) is None:
        return f"no {DOCKER} CLI on PATH"
    version = subprocess.run([DOCKER, "version", "--format", "{{.Server.Version}}"],
                             capture_output=True, text=True, timeout=60, check=False)
    if version.returncode != 0:
        return f"no Docker daemon answers {DOCKER}: {version.stderr.strip()[:200]}"
    if inspect(image) is None:
        return f"image {image} is not built: run `make docker-build` (E2E_IMAGE=... for another)"
    return None


def inspect(ref: str) -> dict[str, Any] | None:
    out = subprocess.run([DOCKER, "inspect", ref], capture_output=True, text=True,
                         timeout=60, check=False)
    return json.loads(out.stdout)[0] if out.returncode == 0 else None


@dataclass
class Container:
    """One container we started; ``remove`` (by id) is always called by ``started``."""

    id: str

    def state(self) -> dict[str, Any]:
        found = inspect(self.id)
        assert found is not None, f"container {self.id[:12]} is gone"
        return dict(found["State"])

    def logs(self) -> str:
        out = subprocess.run([DOCKER, "logs", self.id], capture_output=True, text=True,
                             timeout=60, check=False)
        return out.stdout + out.stderr

    def signal(self, name: str) -> None:
        subprocess.run([DOCKER, "kill", f"--signal={name}", self.id], check=True,
                       capture_output=True, timeout=60)

    def wait(self, timeout: float) -> int:
        """The exit code; TimeoutExpired when it has not exited within ``timeout``."""
        out = subprocess.run([DOCKER, "wait", self.id], capture_output=True, text=True,
                             timeout=timeout, check=True)
        return int(out.stdout.strip())


@contextlib.contextmanager
def started(flags: list[str], image: str, args: list[str], *,
            workdir: Path) -> Iterator[Container]:
    """``docker run --detach`` the image; the container is removed by id on the way out."""
    cidfile = workdir / f"cid-{uuid.uuid4().hex}"
    name = f"himitsu-smoke-{uuid.uuid4().hex[:8]}"
    cmd = [DOCKER, "run", "--detach", f"--cidfile={cidfile}", f"--name={name}", *flags,
           image, *args]
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False)
        if out.returncode != 0:
            raise AssertionError(f"docker run exited {out.returncode}: {out.stderr.strip()}")
        yield Container(cidfile.read_text().strip())
    finally:
        if cidfile.exists() and cidfile.read_text().strip():
            subprocess.run([DOCKER, "rm", "--force", cidfile.read_text().strip()],
                           capture_output=True, timeout=60, check=False)


def run_once(flags: list[str], image: str, args: list[str], *, workdir: Path,
             timeout: float = 120.0) -> tuple[int, str]:
    """Run to completion (bounded by ``timeout``); exit code and output."""
    with started(flags, image, args, workdir=workdir) as container:
        code = container.wait(timeout)
        return code, container.logs()
