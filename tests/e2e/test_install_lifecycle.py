"""Installing, upgrading and removing the operator, on a control plane of its own.

What platform teams run, on a LocalCluster this module starts (removing the operator or
replacing the CRD never touches the session's): every chart value set and every shape
of `make deploy` passes `kubectl apply --dry-run=server` under restricted Pod Security;
users bound to `edit` may create HimitsuSecrets, `view` only read them; `helm install`,
the documented CRD upgrade and `helm uninstall`, and `make deploy` then `make undeploy`,
keep the CRD, every HimitsuSecret and the Secrets they own. No kubelet runs here: the
Secrets a sync writes are made as the operator makes them.
"""

from __future__ import annotations

import base64
import copy
import functools
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from himitsu_controller import api
from himitsu_controller.sync.target import targets
from installs import (
    chart_with,
    helm_binary,
    helm_template,
    make_deploy,
    rule_and_dashboard,
    value_sets,
)
from localcluster import DEFAULT_CONTROLLERS, LocalCluster

from . import cluster_setup
from .canary import Canary
from .cluster_setup import Cluster
from .kubehelp import REPO, KubeApi, hsec_path, kubectl, kubectl_binary, secret_path, wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.local_only]

CHART = REPO / "charts" / "himitsu-controller"
CRD = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/himitsusecrets.himitsu.io"
SYSTEM = "himitsu-system"
URL = "http://127.0.0.1:9"  # loopback's discard port: nothing here sends a token anyway
WAIT = 60.0
# Just enough of the Prometheus Operator's CRDs for a server-side dry run of the chart's
# ServiceMonitor and PrometheusRule (their schemas are not under test here).
MONITORING_CRDS = [
    {"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
     "metadata": {"name": f"{plural}.monitoring.coreos.com"},
     "spec": {"group": "monitoring.coreos.com", "scope": "Namespaced",
              "names": {"kind": kind, "plural": plural, "singular": plural[:-1],
                        "listKind": f"{kind}List"},
              "versions": [{"name": "v1", "served": True, "storage": True, "schema": {
                  "openAPIV3Schema": {"type": "object",
                                      "x-kubernetes-preserve-unknown-fields": True}}}]}}
    for kind, plural in (("ServiceMonitor", "servicemonitors"),
                         ("PrometheusRule", "prometheusrules"))]


@pytest.fixture(scope="module")
def own(cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[KubeApi]:
    # clusterrole-aggregation: what fills view/edit/admin from labelled ClusterRoles.
    local = LocalCluster(tmp_path_factory.mktemp("install") / "cluster",
                         bin_dir=cluster.local.bin_dir,
                         controllers=(*DEFAULT_CONTROLLERS, "clusterrole-aggregation"))
    try:
        local.start()
        local.wait_ready()
        yield KubeApi(local.kubeconfig_path)
    finally:
        local.stop()


def helm(kube: KubeApi, tmp: Path, *args: str, check: bool = True,
         ) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, **{f"HELM_{k}_HOME": str(tmp / f"helm-{k.lower()}")
                            for k in ("CACHE", "CONFIG", "DATA")}}
    result = subprocess.run([helm_binary(), f"--kubeconfig={kube.kubeconfig}", *args],
                            capture_output=True, text=True, timeout=180, check=False, env=env)
    if check:
        assert result.returncode == 0, f"helm {' '.join(args)}:\n{result.stdout}{result.stderr}"
    return result


def make(kube: KubeApi, target: str, *variables: str, check: bool = True,
         ) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "KUBECONFIG": str(kube.kubeconfig)}
    result = subprocess.run(["make", "--no-print-directory", target,
                             f"KUBECTL={kubectl_binary()}", *variables], cwd=REPO, env=env,
                            capture_output=True, text=True, timeout=180, check=False,
                            stdin=subprocess.DEVNULL)
    if check:
        assert result.returncode == 0, f"make {target}:\n{result.stdout}{result.stderr}"
    return result


def namespace(kube: KubeApi, name: str, **labels: str) -> str:
    cluster_setup.ensure_namespace(kube, name, labels=labels)
    return name


def crd_established(kube: KubeApi) -> None:
    def established() -> bool:
        conditions = (kube.get(CRD).get("status") or {}).get("conditions") or []
        return any(c["type"] == "Established" and c["status"] == "True" for c in conditions)

    wait_for(established, timeout=WAIT, what="the HimitsuSecret CRD Established")
    wait_for(lambda: kube.get("/apis/himitsu.io/v1alpha1"), timeout=WAIT,
             what="discovery of himitsu.io/v1alpha1")


def synced(kube: KubeApi, ns: str, canary: Canary) -> dict[str, Any]:
    """A token Secret, a HimitsuSecret, its Owner target (as the operator writes it) and
    a Merge target of its own; what must survive is returned, as read back."""
    token = canary.token().encode()
    kube.create(secret_path(ns), {"metadata": {"name": "himitsu-token"},
                                  "data": {"token": base64.b64encode(token).decode()}})
    hsec = kube.create(hsec_path(ns), {
        "apiVersion": api.API_VERSION, "kind": api.KIND, "metadata": {"name": "app"},
        "spec": {"apiUrl": URL, "projectId": "11111111-1111-1111-1111-111111111111",
                 "environmentId": "22222222-2222-2222-2222-222222222222",
                 "authSecretRef": {"name": "himitsu-token"}, "target": {"name": "app"}}})
    owned = targets.desired_secret(
        None, owner=targets.Owner(ns, "app", hsec["metadata"]["uid"]),
        spec=api.parse_spec(hsec), rendered={"API_KEY": base64.b64encode(b"k").decode()},
        version=1, data_id="0123456789abcdef")
    kube.create(secret_path(ns), owned)
    kube.create(secret_path(ns), {"metadata": {"name": "merged"},
                                  "data": {"OTHER": base64.b64encode(b"o").decode()}})
    return {path: kube.get(path) for path in (
        hsec_path(ns, "app"), secret_path(ns, "app"), secret_path(ns, "merged"))}


def assert_still_there(kube: KubeApi, kept: dict[str, Any]) -> None:
    crd = kube.get(CRD)
    assert "deletionTimestamp" not in crd["metadata"], "the CRD is being deleted"
    for path, before in kept.items():
        now = kube.get(path)
        assert "deletionTimestamp" not in now["metadata"], path
        assert now["metadata"]["uid"] == before["metadata"]["uid"], path
        assert now.get("data") == before.get("data") and now.get("spec") == before.get("spec")


OPERATOR_OBJECTS = [
    f"/apis/apps/v1/namespaces/{SYSTEM}/deployments/himitsu-operator",
    f"/api/v1/namespaces/{SYSTEM}/services/himitsu-operator-metrics",
    f"/api/v1/namespaces/{SYSTEM}/serviceaccounts/himitsu-operator",
    f"/apis/rbac.authorization.k8s.io/v1/namespaces/{SYSTEM}/roles/"
    "himitsu-operator-leader-election",
    "/apis/rbac.authorization.k8s.io/v1/clusterroles/himitsu-operator",
    "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings/himitsu-operator",
    "/apis/rbac.authorization.k8s.io/v1/clusterroles/himitsu-operator-rollout-restart",
]
DEPLOY_VIEW = "/apis/rbac.authorization.k8s.io/v1/clusterroles/himitsu-view"
CHART_VIEW = "/apis/rbac.authorization.k8s.io/v1/clusterroles/himitsu-operator-view"


def assert_operator_gone(kube: KubeApi, view: str) -> None:
    left = [p for p in [*OPERATOR_OBJECTS, view] if kube.get_or_none(p) is not None]
    assert left == [], f"still there: {left}"


# ---- dry runs -----------------------------------------------------------------------------


def server_dry_run(kube: KubeApi, manifests: str, what: str) -> None:
    result = kubectl(kube.kubeconfig, "apply", "--dry-run=server", "-f", "-", stdin=manifests,
                     check=False)
    assert result.returncode == 0, f"{what}:\n{result.stderr}"
    assert "would violate PodSecurity" not in result.stderr, f"{what}:\n{result.stderr}"


def test_every_value_set_and_every_make_deploy_shape_passes_a_server_side_dry_run(
        own: KubeApi, tmp_path: Path) -> None:
    kubectl(own.kubeconfig, "apply", "-f", "-",
            stdin="\n---\n".join(yaml.safe_dump(c) for c in MONITORING_CRDS))
    kubectl(own.kubeconfig, "apply", "--server-side", "-f", str(CHART / "crds"))
    crd_established(own)
    def served(plural: str) -> bool:
        return kubectl(own.kubeconfig, "get", f"{plural}.monitoring.coreos.com", "-A",
                       check=False).returncode == 0

    for plural in ("servicemonitors", "prometheusrules"):
        wait_for(functools.partial(served, plural), timeout=WAIT, what=f"{plural} served")
    # warn: PodSecurity judges a Deployment's pod template in warn (and audit) mode only.
    restricted = {f"pod-security.kubernetes.io/{mode}": "restricted"
                  for mode in ("enforce", "warn")}
    namespace(own, SYSTEM, **restricted)
    namespace(own, "apps", **restricted)
    # The check can fail: a template the restricted standard refuses is warned about.
    loose = kubectl(own.kubeconfig, "apply", "--dry-run=server", "-f", "-", check=False,
                    stdin=helm_template("--set", f"allowedApiUrls={URL}", "--set",
                                        "securityContext.allowPrivilegeEscalation=true").stdout)
    assert "would violate PodSecurity" in loose.stderr, loose.stderr
    for name in value_sets():
        server_dry_run(own, helm_template("-f", str(CHART / "ci" / f"{name}-values.yaml")).stdout,
                       f"helm template -f ci/{name}-values.yaml")
    chart = chart_with(tmp_path, rule_and_dashboard())
    server_dry_run(own, helm_template("--set", f"allowedApiUrls={{{URL}}}",
                                      "--set", "prometheusRule.enabled=true",
                                      "--set", "grafanaDashboard.enabled=true",
                                      chart=chart).stdout, "PrometheusRule and dashboard")
    for variables in ((), ("ROLLOUT_RESTARTS=yes",), ("WATCH_NAMESPACE=apps",),
                      ("WATCH_NAMESPACE=apps", "ROLLOUT_RESTARTS=yes")):
        result, docs = make_deploy(tmp_path, f"HIMITSU_API_URLS={URL}", *variables,
                                   kubectl=kubectl_binary())
        assert result.returncode == 0, result.stderr
        server_dry_run(own, "\n---\n".join(yaml.safe_dump(d) for d in docs),
                       f"make deploy {' '.join(variables)}")


# ---- who may use HimitsuSecrets ---------------------------------------------------------------


def test_namespace_users_bound_to_edit_create_and_to_view_only_read(own: KubeApi) -> None:
    kubectl(own.kubeconfig, "apply", "--server-side", "-f", str(CHART / "crds"))
    crd_established(own)
    kubectl(own.kubeconfig, "apply", "-k", str(REPO / "deploy" / "rbac" / "aggregate"))
    ns = namespace(own, "team")
    for user, role in (("alice", "edit"), ("bob", "view")):
        own.create(f"/apis/rbac.authorization.k8s.io/v1/namespaces/{ns}/rolebindings", {
            "metadata": {"name": user},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                        "name": role},
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User",
                          "name": user}]})

    def allowed(user: str, verb: str) -> bool:
        review = own.create("/apis/authorization.k8s.io/v1/subjectaccessreviews", {
            "apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
            "spec": {"user": user, "groups": ["system:authenticated"], "resourceAttributes": {
                "group": "himitsu.io", "resource": "himitsusecrets", "verb": verb,
                "namespace": ns}}})
        return bool(review["status"].get("allowed"))

    # The clusterrole-aggregation controller copies the rules in shortly after.
    wait_for(lambda: allowed("alice", "create") and allowed("bob", "list"), timeout=WAIT,
             what="himitsu-edit/himitsu-view aggregated into edit/view")
    hsec = yaml.safe_dump({
        "apiVersion": api.API_VERSION, "kind": api.KIND,
        "metadata": {"name": "by-alice", "namespace": ns},
        "spec": {"apiUrl": URL, "projectId": "11111111-1111-1111-1111-111111111111",
                 "environmentId": "22222222-2222-2222-2222-222222222222",
                 "authSecretRef": {"name": "himitsu-token"}, "target": {"name": "app"}}})
    as_alice = ("--as=alice", "--as-group=system:authenticated", "-n", ns)
    as_bob = ("--as=bob", "--as-group=system:authenticated", "-n", ns)
    kubectl(own.kubeconfig, *as_alice, "create", "-f", "-", stdin=hsec)
    listed = kubectl(own.kubeconfig, *as_bob, "get", "hsec", "-o", "name")
    assert listed.stdout.split() == ["himitsusecret.himitsu.io/by-alice"]
    kubectl(own.kubeconfig, *as_bob, "get", "hsec", "by-alice", "-o", "yaml")
    refused = kubectl(own.kubeconfig, *as_bob, "create", "-f", "-",
                      stdin=hsec.replace("by-alice", "by-bob"), check=False)
    assert refused.returncode != 0 and "forbidden" in refused.stderr, refused.stderr
    refused = kubectl(own.kubeconfig, *as_bob, "delete", "hsec", "by-alice", check=False)
    assert refused.returncode != 0 and "forbidden" in refused.stderr, refused.stderr
    kubectl(own.kubeconfig, *as_alice, "delete", "hsec", "by-alice")
    kubectl(own.kubeconfig, "delete", "-k", str(REPO / "deploy" / "rbac" / "aggregate"))


# ---- removing the operator keeps every HimitsuSecret and Secret ------------------------------


def old_chart(tmp_path: Path) -> Path:
    """The chart as an older release shipped it: its CRD without the `hsec` short name
    and with another schema (a field Helm sets, so the upgrade must take it over)."""
    chart = tmp_path / "old-chart"
    shutil.copytree(CHART, chart)
    (path,) = (chart / "crds").iterdir()
    crd = yaml.safe_load(path.read_text())
    crd["spec"]["names"].pop("shortNames")
    schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    schema["properties"]["spec"]["description"] = "an older release's wording"
    path.write_text(yaml.safe_dump(crd))
    return chart


def documented_crd_upgrade() -> list[str]:
    """The command NOTES.txt gives (README and docs give the same), as kubectl args."""
    notes = (CHART / "templates" / "NOTES.txt").read_text()
    (line,) = [ln.split() for ln in notes.splitlines() if "kubectl apply" in ln]
    assert line[0] == "kubectl" and line[-1] == "charts/himitsu-controller/crds/", line
    return [*line[1:-1], str(CHART / "crds")]


def test_helm_install_crd_upgrade_and_uninstall_keep_every_himitsusecret_and_secret(
        own: KubeApi, tmp_path: Path, canary: Canary) -> None:
    if own.get_or_none(CRD) is not None:  # Helm installs crds/ only where there is none
        make(own, "uninstall-crd", "CONFIRM=yes")
        wait_for(lambda: own.get_or_none(CRD) is None, timeout=WAIT, what="the CRD gone")
    helm(own, tmp_path, "install", "himitsu", str(old_chart(tmp_path)), "--namespace", SYSTEM,
         "--create-namespace", "--set", f"allowedApiUrls={{{URL}}}",
         "--set", "rolloutRestarts.enabled=true")
    crd_established(own)
    assert "shortNames" not in own.get(CRD)["spec"]["names"]
    kept = synced(own, namespace(own, "helm-apps"), canary)

    # The documented upgrade: Helm never touches crds/ again after the install.
    kubectl(own.kubeconfig, *documented_crd_upgrade())
    shipped = yaml.safe_load((CHART / "crds" / "himitsu.io_himitsusecrets.yaml").read_text())
    upgraded = own.get(CRD)["spec"]
    assert upgraded["names"]["shortNames"] == ["hsec"]
    assert [v["schema"] for v in upgraded["versions"]] == [
        v["schema"] for v in shipped["spec"]["versions"]]
    assert_still_there(own, kept)

    helm(own, tmp_path, "uninstall", "himitsu", "--namespace", SYSTEM, "--wait")
    wait_for(lambda: own.get_or_none(OPERATOR_OBJECTS[0]) is None, timeout=WAIT,
             what="the operator's Deployment gone")
    assert_operator_gone(own, CHART_VIEW)
    assert_still_there(own, kept)


def test_make_undeploy_keeps_the_crd_every_himitsusecret_and_secret(
        own: KubeApi, canary: Canary) -> None:
    make(own, "deploy", f"HIMITSU_API_URLS={URL}", "ROLLOUT_RESTARTS=yes")
    crd_established(own)
    for path in [*OPERATOR_OBJECTS, DEPLOY_VIEW]:
        own.get(path)
    kept = synced(own, namespace(own, "kubectl-apps"), canary)
    kept_system = copy.deepcopy(own.get(f"/api/v1/namespaces/{SYSTEM}"))

    make(own, "undeploy")
    assert_operator_gone(own, DEPLOY_VIEW)
    assert_still_there(own, kept)
    assert own.get(f"/api/v1/namespaces/{SYSTEM}")["metadata"]["uid"] == (
        kept_system["metadata"]["uid"])

    refused = make(own, "uninstall-crd", check=False)
    assert refused.returncode != 0 and "CONFIRM=yes" in refused.stderr
    assert_still_there(own, kept)


# ---- the two install paths never mix -------------------------------------------------------

RBAC = "/apis/rbac.authorization.k8s.io/v1"


def test_make_deploy_and_undeploy_refuse_to_touch_a_helm_release_s_objects(
        own: KubeApi, tmp_path: Path) -> None:
    """Same names (the chart's defaults are deploy/'s): make deploy would rebind the
    release's ClusterRoleBinding, make undeploy delete its cluster RBAC."""
    ns = namespace(own, "himitsu-helm")
    helm(own, tmp_path, "upgrade", "--install", "himitsu", str(CHART), "--namespace", ns,
         "--set", f"allowedApiUrls={{{URL}}}", "--set", "rolloutRestarts.enabled=true")
    release = [f"{RBAC}/{kind}/{name}" for kind in ("clusterroles", "clusterrolebindings")
               for name in ("himitsu-operator", "himitsu-operator-rollout-restart")]
    release += [f"{RBAC}/clusterroles/himitsu-operator-{r}" for r in ("view", "edit")]
    try:
        for target, *variables in (("deploy", f"HIMITSU_API_URLS={URL}"), ("undeploy",)):
            refused = make(own, target, *variables, check=False)
            assert refused.returncode != 0, refused.stdout
            assert "ClusterRoleBinding himitsu-operator: Helm release himitsu" in refused.stderr
            assert [p for p in release if own.get_or_none(p) is None] == [], target
            binding = own.get(f"{RBAC}/clusterrolebindings/himitsu-operator")
            assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "himitsu-operator",
                                            "namespace": ns}], binding["subjects"]
    finally:
        helm(own, tmp_path, "uninstall", "himitsu", "--namespace", ns, "--wait", check=False)


def _may_list_secrets_in(kube: KubeApi, ns: str) -> bool:
    review = kube.create("/apis/authorization.k8s.io/v1/subjectaccessreviews", {
        "apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
        "spec": {"user": f"system:serviceaccount:{SYSTEM}:himitsu-operator",
                 "resourceAttributes": {"namespace": ns, "resource": "secrets",
                                        "verb": "list"}}})
    return bool(review["status"].get("allowed"))


def test_switching_make_deploy_to_one_namespace_leaves_no_cluster_wide_secret_access(
        own: KubeApi) -> None:
    namespace(own, "apps")
    try:
        make(own, "deploy", f"HIMITSU_API_URLS={URL}", "ROLLOUT_RESTARTS=yes")
        make(own, "deploy", f"HIMITSU_API_URLS={URL}", "WATCH_NAMESPACE=apps")
        assert not _may_list_secrets_in(own, "kube-system")
        assert _may_list_secrets_in(own, "apps")
        make(own, "deploy", f"HIMITSU_API_URLS={URL}")  # and back: no Role left in apps
        assert own.get_or_none(f"{RBAC}/namespaces/apps/rolebindings/himitsu-operator") is None
    finally:  # undeploy of either shape removes both
        make(own, "undeploy", "WATCH_NAMESPACE=apps")
        left = [p for p in OPERATOR_OBJECTS if own.get_or_none(p) is not None]
        make(own, "undeploy")
    assert left == [], f"make undeploy WATCH_NAMESPACE=apps left {left}"
