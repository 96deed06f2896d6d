"""Each shape of the kubectl/kustomize install (`make deploy` with WATCH_NAMESPACE and
ROLLOUT_RESTARTS) grants exactly what its features need, the same as the chart with the
same features; `make undeploy` selects everything but the CRD and the Namespace;
`make uninstall-crd` asks first."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "hack"))
from installs import (
    ROOT,
    expected_grants,
    kubectl_binary,
    make_deploy,
    objects,
    one,
    operator_grants,
    render,
)

KUBECTL = kubectl_binary()
pytestmark = [
    pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed"),
    pytest.mark.skipif(KUBECTL is None, reason="no kubectl on PATH and none in hack/kube/bin"),
]
URLS = "https://himitsu.example.com"
UNDEPLOY_SELECTOR = "app.kubernetes.io/name=himitsu-operator"

# (make variables, chart values, features)
VARIANTS: list[tuple[tuple[str, ...], tuple[str, ...], dict[str, Any]]] = [
    ((), (), {"watch": None, "restarts": False}),
    (("ROLLOUT_RESTARTS=yes",), ("--set", "rolloutRestarts.enabled=true"),
     {"watch": None, "restarts": True}),
    (("WATCH_NAMESPACE=apps",), ("--set", "watchNamespace=apps"),
     {"watch": "apps", "restarts": False}),
    (("WATCH_NAMESPACE=apps", "ROLLOUT_RESTARTS=yes"),
     ("--set", "watchNamespace=apps", "--set", "rolloutRestarts.enabled=true"),
     {"watch": "apps", "restarts": True}),
]
IDS = ["default", "rollout-restarts", "namespaced", "namespaced-rollout-restarts"]


def deployed(tmp_path: Path, *variables: str) -> list[dict[str, Any]]:
    assert KUBECTL is not None
    result, docs = make_deploy(tmp_path, f"HIMITSU_API_URLS={URLS}", *variables,
                               kubectl=KUBECTL)
    assert result.returncode == 0, result.stderr
    return docs


@pytest.mark.parametrize(("variables", "values", "features"), VARIANTS, ids=IDS)
def test_make_deploy_grants_exactly_what_its_features_need_and_what_the_chart_does(
        tmp_path: Path, variables: tuple[str, ...], values: tuple[str, ...],
        features: dict[str, Any]) -> None:
    docs = deployed(tmp_path, *variables)
    assert "REPLACE-WITH" not in str(docs)
    assert operator_grants(docs) == expected_grants(**features, leader=True)
    chart = render("--set", f"allowedApiUrls={{{URLS}}}", *values)
    assert operator_grants(chart) == operator_grants(docs)
    (manager,) = one(docs, "Deployment")["spec"]["template"]["spec"]["containers"]
    if features["watch"]:
        assert f"--namespace={features['watch']}" in manager["args"]
        # No binding to a ClusterRole this mode does not have.
        assert objects(docs, "ClusterRoleBinding") == []
        assert {r["metadata"]["name"] for r in objects(docs, "ClusterRole")} == {
            "himitsu-view", "himitsu-edit"}
    else:
        assert not [a for a in manager["args"] if a.startswith("--namespace")]


def test_make_deploy_refuses_a_watch_namespace_that_is_not_a_name(tmp_path: Path) -> None:
    assert KUBECTL is not None
    for variables in (("WATCH_NAMESPACE=Apps",), ("WATCH_NAMESPACE=a|b",),
                      ("ROLLOUT_RESTARTS=maybe",)):
        result, docs = make_deploy(tmp_path, f"HIMITSU_API_URLS={URLS}", *variables,
                                   kubectl=KUBECTL)
        assert result.returncode != 0 and "make deploy: " in result.stderr, variables
        assert docs == []


@pytest.mark.parametrize(("variables", "values", "features"), VARIANTS, ids=IDS)
def test_undeploy_s_selector_takes_all_but_the_crd_and_the_namespace(
        tmp_path: Path, variables: tuple[str, ...], values: tuple[str, ...],
        features: dict[str, Any]) -> None:
    docs = deployed(tmp_path, *variables)
    kept = [(d["kind"], d["metadata"]["name"]) for d in docs
            if (d["metadata"].get("labels") or {}).get("app.kubernetes.io/name")
            != "himitsu-operator"]
    assert sorted(kept) == [("CustomResourceDefinition", "himitsusecrets.himitsu.io"),
                            ("Namespace", "himitsu-system")]


def _make_with_stub(tmp_path: Path, target: str, *variables: str, found: str = "",
                    ) -> tuple[subprocess.CompletedProcess[str], str, str]:
    """`make <target>` with a kubectl that builds for real and records the rest; its
    `get` prints `found`."""
    calls, stdin = tmp_path / "calls", tmp_path / "stdin"
    stub = tmp_path / "kubectl"
    stub.write_text(f"""#!/bin/sh
if [ "$1" = kustomize ]; then exec {KUBECTL} "$@"; fi
echo "$1" >>{calls}
if [ "$1" = get ]; then printf '%s' '{found}'; fi
if [ "$1" = delete ]; then echo "$@" >>{calls}; fi
case "$*" in *"-f -"*) cat >>{stdin};; esac
""")
    stub.chmod(0o755)
    result = subprocess.run(["make", "--no-print-directory", target, f"KUBECTL={stub}",
                             *variables], capture_output=True, text=True, timeout=120,
                            check=False, cwd=ROOT, stdin=subprocess.DEVNULL)
    return (result, calls.read_text() if calls.exists() else "",
            stdin.read_text() if stdin.exists() else "")


CLUSTER_SHAPE = " ".join(f"{kind}/himitsu-operator{suffix}"
                         for kind in ("clusterrolebinding", "clusterrole")
                         for suffix in ("", "-rollout-restart"))
NAMESPACED_SHAPE = ("role,rolebinding --all-namespaces -l app.kubernetes.io/name=himitsu-operator,"
                    "app.kubernetes.io/managed-by!=Helm --field-selector "
                    "metadata.name!=himitsu-operator-leader-election")


@pytest.mark.parametrize(("variables", "other_shape"), [
    ((), NAMESPACED_SHAPE), (("WATCH_NAMESPACE=apps",), CLUSTER_SHAPE)])
def test_make_undeploy_deletes_by_the_operator_s_label_and_the_other_shape_s_grants(
        tmp_path: Path, variables: tuple[str, ...], other_shape: str) -> None:
    result, calls, stdin = _make_with_stub(tmp_path, "undeploy", *variables)
    assert result.returncode == 0, result.stderr
    deletes = [c for c in calls.splitlines() if c.startswith("delete ")]
    assert deletes == [f"delete --ignore-not-found -l {UNDEPLOY_SELECTOR} -f -",
                       f"delete --ignore-not-found {other_shape}"]
    # What it hands over includes the rollout-restart RBAC, enabled or not.
    assert "name: himitsu-operator-rollout-restart" in stdin


@pytest.mark.parametrize(("variables", "other_shape"), [
    ((), NAMESPACED_SHAPE), (("WATCH_NAMESPACE=apps",), CLUSTER_SHAPE)])
def test_switching_make_deploy_s_shape_removes_the_other_shape_s_grants(
        tmp_path: Path, variables: tuple[str, ...], other_shape: str) -> None:
    result, calls, _ = _make_with_stub(tmp_path, "deploy", f"HIMITSU_API_URLS={URLS}",
                                       *variables)
    assert result.returncode == 0, result.stderr
    assert [c for c in calls.splitlines() if c.startswith("delete ")] == [
        f"delete --ignore-not-found {other_shape}"]
    assert calls.splitlines().index("apply") < calls.splitlines().index("delete")


@pytest.mark.parametrize("target", ["deploy", "undeploy"])
def test_make_deploy_and_undeploy_refuse_objects_a_helm_release_owns(
        tmp_path: Path, target: str) -> None:
    result, calls, _ = _make_with_stub(
        tmp_path, target, f"HIMITSU_API_URLS={URLS}",
        found="  ClusterRoleBinding himitsu-operator: Helm release himitsu")
    assert result.returncode == 2
    assert "ClusterRoleBinding himitsu-operator: Helm release himitsu" in result.stderr
    assert "apply" not in calls and "delete" not in calls, calls


def test_make_uninstall_crd_says_what_it_deletes_and_needs_confirm(tmp_path: Path) -> None:
    result, calls, _ = _make_with_stub(tmp_path, "uninstall-crd")
    assert result.returncode != 0 and calls == ""
    assert "every" in result.stderr and "HimitsuSecret" in result.stderr
    assert "garbage collection" in result.stderr and "CONFIRM=yes" in result.stderr
    result, calls, _ = _make_with_stub(tmp_path, "uninstall-crd", "CONFIRM=yes")
    assert result.returncode == 0, result.stderr
    assert [c for c in calls.splitlines() if c.startswith("delete ")] == [
        "delete --ignore-not-found -f deploy/crd/himitsu.io_himitsusecrets.yaml"]
