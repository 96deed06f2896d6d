"""Installing the operator's CRD and RBAC, and minting ServiceAccount identities for it.

Why the operator gets its own ServiceAccount (not the admin kubeconfig): the e2e suite
must fail when deploy/rbac lacks a permission the code uses. So the operator process
authenticates with a TokenRequest token of ``himitsu-system/himitsu-operator``, bound
exactly as deploy/rbac binds it. Extra identities serve two tests: a second replica
(``himitsu-operator-b``, same bindings) so the apiserver audit log tells the two writers
apart, and a Role-only identity for ``--namespace`` mode (deploy/namespaced/role.yaml).
The suite exercises rollout restarts, so the operator also gets their RBAC
(deploy/components/rollout-restarts), as an install that enables them does.
"""

from __future__ import annotations

import copy
import os
import secrets
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from .kubehelp import REPO, ApiError, KubeApi, kubectl, wait_for

OPERATOR_NAMESPACE = "himitsu-system"
OPERATOR_SA = "himitsu-operator"
CLUSTER_ROLE = "himitsu-operator"
RESTART_ROLE = "himitsu-operator-rollout-restart"
LEADER_ELECTION_ROLE = "himitsu-operator-leader-election"
CRD_NAME = "himitsusecrets.himitsu.io"
CRD_FILE = REPO / "deploy" / "crd" / "himitsu.io_himitsusecrets.yaml"
RBAC_DIR = REPO / "deploy" / "rbac"
RESTART_DIR = REPO / "deploy" / "components" / "rollout-restarts"
NAMESPACED_DIR = REPO / "deploy" / "namespaced"
TOKEN_SECONDS = 4 * 3600


@dataclass
class Cluster:
    """The cluster under test: admin kubeconfig, and the audit log when we started it."""

    kubeconfig: str
    on_kind: bool
    audit_log_path: Path | None = None
    local: Any = None  # the LocalCluster, when the suite started one


def ensure_namespace(kube: KubeApi, name: str, *, labels: dict[str, str] | None = None) -> None:
    body = {"apiVersion": "v1", "kind": "Namespace",
            "metadata": {"name": name, "labels": labels or {}}}
    try:
        kube.create("/api/v1/namespaces", body)
    except ApiError as exc:
        if exc.status != 409:
            raise


def install_crd(kube: KubeApi) -> None:
    kubectl(kube.kubeconfig, "apply", "-f", str(CRD_FILE))

    def established() -> bool:
        crd = kube.get(f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{CRD_NAME}")
        conditions = (crd.get("status") or {}).get("conditions") or []
        return any(c["type"] == "Established" and c["status"] == "True" for c in conditions)

    wait_for(established, timeout=60, what="the HimitsuSecret CRD to be Established")
    # Discovery lags the Established condition a little; kubectl needs discovery.
    wait_for(lambda: kube.get("/apis/himitsu.io/v1alpha1"), timeout=60,
             what="discovery of himitsu.io/v1alpha1")


def install_rbac(kube: KubeApi) -> None:
    """deploy/rbac as shipped: ServiceAccount, ClusterRole(+Binding), leader-election Role,
    and the rollout-restart ClusterRole(+Binding) of deploy/components/rollout-restarts."""
    ensure_namespace(kube, OPERATOR_NAMESPACE)
    kubectl(kube.kubeconfig, "apply", "-k", str(RBAC_DIR))
    kubectl(kube.kubeconfig, "apply", "-f", str(RESTART_DIR / "role.yaml"),
            "-f", str(RESTART_DIR / "role_binding.yaml"))


def lease_name(kube: KubeApi, prefix: str) -> str:
    """A fresh Lease name the operator's identities may use in OPERATOR_NAMESPACE.

    The shipped leader-election Role grants get and update on one Lease by name; tests
    that run their own elections use one Lease each, so each name is added to that
    rule's resourceNames (the rules are otherwise the shipped ones), and this returns
    once the authorizer lets the operator's ServiceAccount get it.
    """
    name = f"{prefix}-{secrets.token_hex(4)}"
    path = (f"/apis/rbac.authorization.k8s.io/v1/namespaces/{OPERATOR_NAMESPACE}/roles/"
            f"{LEADER_ELECTION_ROLE}")
    role = kube.get(path)
    (index,) = [i for i, rule in enumerate(role["rules"]) if rule.get("resourceNames")]
    kube.request("PATCH", path, body=[
        {"op": "add", "path": f"/rules/{index}/resourceNames/-", "value": name}],
        content_type="application/json-patch+json")

    def allowed() -> bool:
        review = kube.create("/apis/authorization.k8s.io/v1/subjectaccessreviews", {
            "apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
            "spec": {"user": username(OPERATOR_SA), "resourceAttributes": {
                "group": "coordination.k8s.io", "resource": "leases", "verb": "update",
                "name": name, "namespace": OPERATOR_NAMESPACE}}})
        return bool(review["status"].get("allowed"))

    wait_for(allowed, timeout=30, what=f"Lease {name} allowed by the leader-election Role")
    return name


def _apply(kube: KubeApi, *objects: dict[str, Any]) -> None:
    text = "\n---\n".join(yaml.safe_dump(o) for o in objects)
    kubectl(kube.kubeconfig, "apply", "-f", "-", stdin=text)


def add_service_account(kube: KubeApi, name: str) -> None:
    """Another identity with the shipped ClusterRoles and leader-election Role."""
    subject = {"kind": "ServiceAccount", "name": name, "namespace": OPERATOR_NAMESPACE}
    _apply(
        kube,
        {"apiVersion": "v1", "kind": "ServiceAccount",
         "metadata": {"name": name, "namespace": OPERATOR_NAMESPACE}},
        *({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
           "metadata": {"name": binding},
           "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                       "name": role},
           "subjects": [subject]}
          for binding, role in ((name, CLUSTER_ROLE), (f"{name}-restart", RESTART_ROLE))),
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
         "metadata": {"name": f"{name}-leader-election", "namespace": OPERATOR_NAMESPACE},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                     "name": LEADER_ELECTION_ROLE},
         "subjects": [subject]},
    )


def add_namespaced_service_account(kube: KubeApi, name: str, namespace: str) -> None:
    """An identity holding only deploy/namespaced/role.yaml, in ``namespace``."""
    role = yaml.safe_load((NAMESPACED_DIR / "role.yaml").read_text())
    binding = yaml.safe_load((NAMESPACED_DIR / "role_binding.yaml").read_text())
    role = copy.deepcopy(role)
    role["metadata"]["namespace"] = namespace
    binding["metadata"]["namespace"] = namespace
    binding["metadata"]["name"] = name
    binding["subjects"] = [{"kind": "ServiceAccount", "name": name,
                            "namespace": OPERATOR_NAMESPACE}]
    _apply(kube, {"apiVersion": "v1", "kind": "ServiceAccount",
                  "metadata": {"name": name, "namespace": OPERATOR_NAMESPACE}},
           role, binding)


def service_account_kubeconfig(kube: KubeApi, name: str, out: Path) -> Path:
    """A kubeconfig that authenticates as ``himitsu-system/<name>`` (TokenRequest token)."""
    request = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
               "spec": {"expirationSeconds": TOKEN_SECONDS}}
    path = f"/api/v1/namespaces/{OPERATOR_NAMESPACE}/serviceaccounts/{name}/token"
    token = wait_for(lambda: kube.create(path, request)["status"]["token"], timeout=30,
                     what=f"a TokenRequest token for ServiceAccount {name}")
    admin = yaml.safe_load(Path(kube.kubeconfig).read_text())
    context = next(c["context"] for c in admin["contexts"]
                   if c["name"] == admin["current-context"])
    cluster = next(c["cluster"] for c in admin["clusters"] if c["name"] == context["cluster"])
    config = {
        "apiVersion": "v1", "kind": "Config",
        "clusters": [{"name": "e2e", "cluster": cluster}],
        "users": [{"name": name, "user": {"token": token}}],
        "contexts": [{"name": name, "context": {"cluster": "e2e", "user": name}}],
        "current-context": name,
    }
    out.write_text(yaml.safe_dump(config))
    os.chmod(out, 0o600)
    return out


def username(service_account: str) -> str:
    """How the apiserver (and its audit log) names a ServiceAccount of ours."""
    return f"system:serviceaccount:{OPERATOR_NAMESPACE}:{service_account}"
