"""deploy/components/{metrics-secure,metrics-cert-manager,network-policy}, rendered with the
default install and the ServiceMonitor as a user's overlay would: the pieces agree with
each other and with the CLI, and the RBAC they add grants the reviews and nothing else."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from himitsu_controller.cli import build_parser

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
KUBECTL = shutil.which("kubectl") or next(
    (str(p) for p in [ROOT / "hack" / "kube" / "bin" / "kubectl"] if p.exists()), None)
pytestmark = pytest.mark.skipif(KUBECTL is None, reason="no kubectl (make kube-build)")


@pytest.fixture(scope="module")
def rendered(tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[str, str], Any]:
    overlay = tmp_path_factory.mktemp("overlay")
    rel = os.path.relpath(DEPLOY, overlay)
    (overlay / "kustomization.yaml").write_text(yaml.safe_dump({
        "resources": [rel, f"{rel}/prometheus"],
        "components": [f"{rel}/components/{c}" for c in
                       ("metrics-secure", "metrics-cert-manager", "network-policy")]}))
    assert KUBECTL is not None
    built = subprocess.run([KUBECTL, "kustomize", str(overlay)], capture_output=True,
                           text=True, timeout=60, check=False)
    assert built.returncode == 0, built.stderr
    return {(d["kind"], d["metadata"]["name"]): d for d in yaml.safe_load_all(built.stdout)}


def grants(rules: list[Any]) -> set[tuple[str, ...]]:
    return {(group, resource, verb) for rule in rules for group in rule.get("apiGroups", [])
            for resource in rule.get("resources", []) for verb in rule["verbs"]} | {
        ("url", url, verb) for rule in rules for url in rule.get("nonResourceURLs", [])
        for verb in rule["verbs"]}


def test_the_operator_gets_the_two_reviews_and_readers_get_metrics_only(
        rendered: dict[tuple[str, str], Any]) -> None:
    auth = rendered["ClusterRole", "himitsu-operator-metrics-auth"]
    assert grants(auth["rules"]) == {("authentication.k8s.io", "tokenreviews", "create"),
                                     ("authorization.k8s.io", "subjectaccessreviews", "create")}
    binding = rendered["ClusterRoleBinding", "himitsu-operator-metrics-auth"]
    assert binding["roleRef"]["name"] == "himitsu-operator-metrics-auth"
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "himitsu-operator",
                                    "namespace": "himitsu-system"}]
    reader = rendered["ClusterRole", "himitsu-operator-metrics-reader"]
    assert grants(reader["rules"]) == {("url", "/metrics", "get")}


def test_the_deployment_serves_https_from_the_mounted_certificate(
        rendered: dict[tuple[str, str], Any]) -> None:
    pod = rendered["Deployment", "himitsu-operator"]["spec"]["template"]
    (manager,) = pod["spec"]["containers"]
    args = build_parser().parse_args(
        [a.replace("$(HIMITSU_API_URLS)", "https://h.example") for a in manager["args"]])
    assert args.metrics_secure
    (mount,) = [m for m in manager["volumeMounts"] if m["mountPath"] == args.metrics_cert_dir]
    (volume,) = [v for v in pod["spec"]["volumes"] if v["name"] == mount["name"]]
    secret = volume["secret"]["secretName"]
    assert {i["path"] for i in volume["secret"]["items"]} == {"tls.crt", "tls.key"}
    # cert-manager writes that Secret, for the metrics Service's name.
    cert = rendered["Certificate", "himitsu-operator-metrics-cert"]
    assert cert["spec"]["secretName"] == secret
    service = rendered["Service", "himitsu-operator-metrics"]
    host = f"{service['metadata']['name']}.{service['metadata']['namespace']}.svc"
    assert host in cert["spec"]["dnsNames"]
    # The ServiceMonitor scrapes that Service over HTTPS, checks that name against the
    # Secret's CA, and sends Prometheus's ServiceAccount token.
    (endpoint,) = rendered["ServiceMonitor", "himitsu-operator"]["spec"]["endpoints"]
    assert endpoint["scheme"] == "https"
    assert endpoint["bearerTokenFile"] == "/var/run/secrets/kubernetes.io/serviceaccount/token"
    assert endpoint["tlsConfig"]["serverName"] == host
    assert endpoint["tlsConfig"]["ca"]["secret"] == {"name": secret, "key": "ca.crt"}
    assert "insecureSkipVerify" not in endpoint["tlsConfig"]


def test_the_network_policy_admits_only_scrapes_of_the_metrics_port(
        rendered: dict[tuple[str, str], Any]) -> None:
    policy = rendered["NetworkPolicy", "himitsu-operator"]["spec"]
    pod = rendered["Deployment", "himitsu-operator"]["spec"]["template"]
    assert policy["podSelector"]["matchLabels"].items() <= pod["metadata"]["labels"].items()
    assert policy["policyTypes"] == ["Ingress"]
    (rule,) = policy["ingress"]
    assert rule["ports"] == [{"port": "metrics", "protocol": "TCP"}]
    (manager,) = pod["spec"]["containers"]
    assert "metrics" in {p["name"] for p in manager["ports"]}
    (source,) = rule["from"]
    assert set(source) == {"namespaceSelector"}  # labelled namespaces, nothing wider
    assert source["namespaceSelector"]["matchLabels"] == {"himitsu.io/metrics-scraper": "true"}
