"""What each install renders: the chart (`helm template`) and deploy/ (`make deploy`).

Shared by tests/unit/test_chart.py, test_deploy_variants.py and the e2e dry runs: the
objects as they reach the apiserver, and the grants they give the operator's
ServiceAccount, computed from its bindings (a binding to a role that is not rendered is
an error, not nothing).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
CHART = ROOT / "charts" / "himitsu-controller"
CI_VALUES = CHART / "ci"
RELEASE_NAMESPACE = "himitsu-system"
SERVICE_ACCOUNT = "himitsu-operator"
LEASE = "himitsu-operator.himitsu.io"
URLS = "https://himitsu.example.com"

# (scope, apiGroup, resource, verb, resourceName): scope "*" is cluster-wide, else the
# namespace of a RoleBinding; resourceName "" is any object.
Grant = tuple[str, str, str, str, str]

# What each feature needs; tests/e2e/test_rbac_verbs_are_each_needed.py shows each verb is.
SYNC_GRANTS = {
    *{("himitsu.io", "himitsusecrets", v) for v in ("list", "watch")},
    ("himitsu.io", "himitsusecrets/status", "patch"),
    ("himitsu.io", "himitsusecrets/finalizers", "update"),
    *{("", "secrets", v) for v in ("get", "list", "watch", "create", "update", "delete")},
    ("", "events", "create"),
}
RESTART_GRANTS = {("apps", r, v) for r in ("deployments", "statefulsets", "daemonsets")
                  for v in ("get", "patch")}
# --metrics-secure: each scrape's token and grant reviewed (cluster-scoped kinds).
SECURE_METRICS_GRANTS = {("authentication.k8s.io", "tokenreviews", "create"),
                         ("authorization.k8s.io", "subjectaccessreviews", "create")}


def expected_grants(*, watch: str | None, restarts: bool, leader: bool,
                    secure: bool = False, namespace: str = RELEASE_NAMESPACE) -> set[Grant]:
    scope = watch or "*"
    grants = {(scope, *g, "") for g in SYNC_GRANTS}
    if secure:
        grants |= {("*", *g, "") for g in SECURE_METRICS_GRANTS}
    if restarts:
        grants |= {(scope, *g, "") for g in RESTART_GRANTS}
    if leader:
        grants |= {(namespace, "coordination.k8s.io", "leases", v, LEASE)
                   for v in ("get", "update")}
        grants.add((namespace, "coordination.k8s.io", "leases", "create", ""))
    return grants


def helm_binary() -> str:
    """hack/helm.sh's helm (`make helm` builds it; `make test-unit` and CI do)."""
    found = os.environ.get("HELM") or str(ROOT / ".local" / "bin" / "helm")
    if not Path(found).exists():
        found = shutil.which("helm") or ""
    if not found:
        raise AssertionError("no helm: run `make helm` (builds it into .local/bin)")
    return found


def helm_template(*args: str, chart: Path = CHART, check: bool = True,
                  ) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(
        [helm_binary(), "template", "himitsu", str(chart), "--namespace", RELEASE_NAMESPACE,
         *args], capture_output=True, text=True, timeout=120, check=False)
    if check:
        assert result.returncode == 0, result.stderr
    return result


def render(*args: str, chart: Path = CHART) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(helm_template(*args, chart=chart).stdout) if d]


def render_values(name: str, *args: str) -> list[dict[str, Any]]:
    """The chart with ci/<name>-values.yaml (the value sets `make lint` lints)."""
    return render("-f", str(CI_VALUES / f"{name}-values.yaml"), *args)


def value_sets() -> list[str]:
    return sorted(p.name.removesuffix("-values.yaml") for p in CI_VALUES.glob("*-values.yaml"))


def kubectl_binary() -> str | None:
    return shutil.which("kubectl") or next(
        (str(p) for p in [ROOT / "hack" / "kube" / "bin" / "kubectl"] if p.exists()), None)


def make_deploy(tmp_path: Path, *variables: str, kubectl: str) -> tuple[
        subprocess.CompletedProcess[str], list[dict[str, Any]]]:
    """`make deploy` with a kubectl stand-in that builds with the real kubectl and keeps
    what it was asked to apply, instead of applying it (its get finds nothing, its
    delete deletes nothing)."""
    applied = tmp_path / "applied.yaml"
    applied.unlink(missing_ok=True)
    stub = tmp_path / "kubectl"
    stub.write_text(f"""#!/bin/sh
case "$1 $*" in
  kustomize*) exec {kubectl} "$@";;
  apply*) cat >{applied};;
  *"-f -"*) cat >/dev/null;;
esac
""")
    stub.chmod(0o755)
    result = subprocess.run(["make", "--no-print-directory", "deploy", f"KUBECTL={stub}",
                             *variables], capture_output=True, text=True, timeout=120,
                            check=False, cwd=ROOT)
    docs = ([d for d in yaml.safe_load_all(applied.read_text()) if d]
            if applied.exists() else [])
    return result, docs


def objects(docs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [d for d in docs if d["kind"] == kind]


def one(docs: list[dict[str, Any]], kind: str, name: str | None = None) -> dict[str, Any]:
    found = [d for d in objects(docs, kind) if name is None or d["metadata"]["name"] == name]
    assert len(found) == 1, f"expected one {kind} {name or ''}, got {len(found)}"
    return found[0]


def rule_grants(rules: list[dict[str, Any]], scope: str) -> set[Grant]:
    return {(scope, g, r, v, n) for rule in rules for g in rule["apiGroups"]
            for r in rule["resources"] for v in rule["verbs"]
            for n in (rule.get("resourceNames") or [""])}


def operator_grants(docs: list[dict[str, Any]],
                    namespace: str = RELEASE_NAMESPACE) -> set[Grant]:
    """Everything the rendered bindings grant the operator's ServiceAccount."""
    subject = {"kind": "ServiceAccount", "name": SERVICE_ACCOUNT, "namespace": namespace}
    grants: set[Grant] = set()
    for binding in objects(docs, "ClusterRoleBinding") + objects(docs, "RoleBinding"):
        if subject not in binding["subjects"]:
            continue
        ref = binding["roleRef"]
        scope = "*" if binding["kind"] == "ClusterRoleBinding" else (
            binding["metadata"]["namespace"])
        roles = [d for d in objects(docs, ref["kind"]) if d["metadata"]["name"] == ref["name"]
                 and (ref["kind"] == "ClusterRole"
                      or d["metadata"]["namespace"] == binding["metadata"]["namespace"])]
        assert len(roles) == 1, (
            f"{binding['kind']} {binding['metadata']['name']} points at {ref['kind']} "
            f"{ref['name']}, which this install does not have")
        grants |= rule_grants(roles[0]["rules"], scope)
    return grants


SAMPLE_RULE = """apiVersion: monitoring.coreos.com/v1
kind: PrometheusRule
metadata: {name: himitsu-operator}
spec:
  groups:
    - name: himitsu
      rules:
        - alert: HimitsuSecretNotReady
          expr: sum(himitsu_secrets{ready="false"}) > 0
          for: 15m
"""
SAMPLE_DASHBOARD = '{"title": "himitsu-controller", "panels": []}'


def rule_and_dashboard() -> dict[str, str]:
    """deploy/'s PrometheusRule and dashboard when it has them (their chart copies'
    names as keys), else samples of the same shape."""
    rule = ROOT / "deploy" / "prometheus" / "prometheusrule.yaml"
    board = ROOT / "deploy" / "grafana" / "himitsu-controller.json"
    return {"prometheusrule.yaml": rule.read_text() if rule.exists() else SAMPLE_RULE,
            "grafana-dashboard.json": board.read_text() if board.exists()
            else SAMPLE_DASHBOARD}


def chart_with(tmp_path: Path, files: dict[str, str]) -> Path:
    """A copy of the chart whose files/ holds exactly these optional files."""
    chart = tmp_path / "himitsu-controller"
    shutil.copytree(CHART, chart)
    for name in ("prometheusrule.yaml", "grafana-dashboard.json"):
        (chart / "files" / name).unlink(missing_ok=True)
    for name, text in files.items():
        (chart / "files" / name).write_text(text)
    return chart
