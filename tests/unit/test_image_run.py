"""tests/e2e/image_run.py: the Deployment's container as `docker run` flags.

The image smoke test (tests/e2e/test_image.py) runs the image with these flags, so they
must say what the manifest says; and a field the translation does not know must stop the
test rather than vanish. Both are checked here without docker or a cluster.
"""

from __future__ import annotations

import copy
import sys
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from e2e import image_run


def manifest(**container: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "kind": "Deployment", "metadata": {"name": "op", "namespace": "ops"},
        "spec": {"template": {"spec": {
            "terminationGracePeriodSeconds": 40,
            "securityContext": {"runAsNonRoot": True, "runAsUser": 1000, "runAsGroup": 2000,
                                "seccompProfile": {"type": "RuntimeDefault"}},
            "containers": [{
                "name": "manager", "image": "example/op:1",
                "args": ["--url=$(URL)", "--ns=$(POD_NAMESPACE)", "--keep=$$(URL)",
                         "--probe-bind-address=:8081"],
                "env": [{"name": "POD_NAMESPACE",
                         "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
                        {"name": "URL", "value": "placeholder"}],
                "ports": [{"name": "probes", "containerPort": 8081}],
                "readinessProbe": {"httpGet": {"path": "/readyz", "port": "probes"}},
                "resources": {"limits": {"cpu": "500m", "memory": "256Mi"},
                              "requests": {"cpu": "50m"}},
                "securityContext": {"readOnlyRootFilesystem": True,
                                    "allowPrivilegeEscalation": False,
                                    "capabilities": {"drop": ["ALL"]}},
                "volumeMounts": [{"name": "tmp", "mountPath": "/tmp"}],
                **container,
            }],
            "volumes": [{"name": "tmp", "emptyDir": {"sizeLimit": "64Mi"}}],
        }}},
    }
    return base


def test_a_restricted_container_becomes_the_matching_docker_flags() -> None:
    run = image_run.pod_run(manifest(), env={"URL": "http://127.0.0.1:9"})

    assert run.flags == [
        "--user=1000:2000", "--read-only", "--security-opt=no-new-privileges",
        "--cap-drop=ALL", "--cpus=0.5", f"--memory={256 * 2**20}",
        f"--tmpfs=/tmp:rw,exec,nosuid,nodev,mode=1777,size={64 * 2**20}",
        "--env=POD_NAMESPACE=ops", "--env=URL=http://127.0.0.1:9",
    ]
    # The kubelet's expansion: defined variables replaced, $$ escapes one $.
    assert run.args == ["--url=http://127.0.0.1:9", "--ns=ops", "--keep=$(URL)",
                        "--probe-bind-address=:8081"]
    assert (run.image, run.namespace, run.uid, run.gid) == ("example/op:1", "ops", 1000, 2000)
    assert run.grace_seconds == 40
    assert run.probes == {"readinessProbe": ("/readyz", 8081)}


@pytest.mark.parametrize("change", [
    {"securityContext": {"procMount": "Unmasked"}},
    {"securityContext": {"capabilities": {"drop": ["ALL"], "unknown": ["X"]}}},
    {"securityContext": {"seccompProfile": {"type": "Localhost"}}},
    {"securityContext": {"privileged": True}},
    {"resources": {"limits": {"ephemeral-storage": "1Gi"}}},
    {"env": [{"name": "T", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}}]},
    {"volumeMounts": [{"name": "tmp", "mountPath": "/tmp", "subPath": "x"}]},
    {"command": ["/bin/sh"]},
    {"livenessProbe": {"exec": {"command": ["true"]}}},
])
def test_a_field_without_a_docker_translation_stops_the_smoke_test(
        change: dict[str, Any]) -> None:
    changed = manifest()
    container = changed["spec"]["template"]["spec"]["containers"][0]
    for key, value in change.items():
        if key == "securityContext":
            container[key] = {**container[key], **copy.deepcopy(value)}
        else:
            container[key] = copy.deepcopy(value)

    with pytest.raises(image_run.Untranslated):
        image_run.pod_run(changed)


def test_a_volume_other_than_an_empty_dir_stops_the_smoke_test() -> None:
    changed = manifest()
    changed["spec"]["template"]["spec"]["volumes"] = [{"name": "tmp",
                                                        "secret": {"secretName": "s"}}]
    with pytest.raises(image_run.Untranslated):
        image_run.pod_run(changed)


def test_root_with_run_as_non_root_is_refused_as_the_kubelet_would() -> None:
    changed = manifest()
    changed["spec"]["template"]["spec"]["securityContext"]["runAsUser"] = 0
    with pytest.raises(AssertionError, match="runAsNonRoot"):
        image_run.pod_run(changed)


def test_the_shipped_deployment_translates_completely() -> None:
    # Drift in deploy/manager (a new securityContext field, volume, env source) fails
    # here, in the unit suite, before the smoke test would need docker to say so.
    run = image_run.pod_run(image_run.deployment())
    assert "--read-only" in run.flags and any(f.startswith("--user=") for f in run.flags)
    assert set(run.probes) == {"readinessProbe", "livenessProbe"}
