"""charts/himitsu-controller against deploy/: one truth, rendered with every value set.

The chart reads its CRD and every RBAC rule from copies of deploy/'s files
(hack/chart_sync.py); these tests fail when a copy differs, when a value set renders a
grant no enabled feature needs, and when the Deployment drifts from deploy/manager.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

import himitsu_controller

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "hack"))
import chart_sync
from installs import (
    CHART,
    LEASE,
    RELEASE_NAMESPACE,
    ROOT,
    chart_with,
    expected_grants,
    helm_binary,
    helm_template,
    objects,
    one,
    operator_grants,
    render,
    render_values,
    rule_and_dashboard,
    value_sets,
)

URL = "https://himitsu.example.com"
BASE = ("--set", f"allowedApiUrls={{{URL}}}")


def deploy_doc(relative: str, kind: str | None = None) -> dict[str, Any]:
    docs = [d for d in yaml.safe_load_all((ROOT / relative).read_text()) if d]
    return one(docs, kind) if kind else docs[0]


# ---- one truth --------------------------------------------------------------------------


def test_the_chart_s_copies_equal_deploy_s_sources() -> None:
    assert chart_sync.differences() == []


def test_chart_sync_check_fails_on_a_copy_that_differs_and_sync_repairs_it(
        tmp_path: Path) -> None:
    for source, copy, _ in chart_sync.pairs():
        if source.exists():
            for path in (source, copy):
                target = tmp_path / path.relative_to(ROOT)
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(path, target)
    assert chart_sync.differences(tmp_path) == []
    edited = tmp_path / "deploy" / "rbac" / "role.yaml"
    edited.write_text(edited.read_text() + "  - apiGroups: [\"\"]\n")
    rule = tmp_path / "deploy" / "prometheus" / "prometheusrule.yaml"
    rule.parent.mkdir(parents=True, exist_ok=True)
    rule.write_text("kind: PrometheusRule\n")
    assert chart_sync.differences(tmp_path) == [
        "charts/himitsu-controller/files/rbac/role.yaml differs from deploy/rbac/role.yaml",
        "charts/himitsu-controller/files/prometheusrule.yaml differs from "
        "deploy/prometheus/prometheusrule.yaml"]
    chart_sync.sync(tmp_path)
    assert chart_sync.differences(tmp_path) == []
    rule.unlink()
    assert chart_sync.differences(tmp_path) == [
        "charts/himitsu-controller/files/prometheusrule.yaml has no source any more"]


def test_crds_are_deploy_s_crd() -> None:
    (crd,) = (CHART / "crds").iterdir()
    assert crd.read_bytes() == (ROOT / "deploy" / "crd" / crd.name).read_bytes()


def test_app_version_is_the_package_version() -> None:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert chart["appVersion"] == himitsu_controller.__version__ == "0.1.0"
    deployment = one(render(*BASE), "Deployment")
    (manager,) = deployment["spec"]["template"]["spec"]["containers"]
    assert manager["image"] == f"ghcr.io/himitsu-io/himitsu-controller:{chart['appVersion']}"


# ---- RBAC ---------------------------------------------------------------------------------


def _features(values: dict[str, Any]) -> dict[str, Any]:
    return {"watch": values.get("watchNamespace") or None,
            "restarts": bool((values.get("rolloutRestarts") or {}).get("enabled")),
            "leader": True,
            "secure": bool((values.get("metricsSecure") or {}).get("enabled"))}


@pytest.mark.parametrize("name", value_sets())
def test_each_value_set_grants_exactly_what_its_features_need(name: str) -> None:
    values = yaml.safe_load((CHART / "ci" / f"{name}-values.yaml").read_text())
    docs = render_values(name)
    assert operator_grants(docs) == expected_grants(**_features(values))
    if values.get("watchNamespace"):
        assert objects(docs, "ClusterRoleBinding") == []
        assert {r["metadata"]["name"] for r in objects(docs, "ClusterRole")} == {
            "himitsu-operator-view", "himitsu-operator-edit"}


@pytest.mark.parametrize(("args", "features"), [
    ((), {"watch": None, "restarts": False, "leader": True}),
    (("--set", "rolloutRestarts.enabled=true"), {"watch": None, "restarts": True,
                                                 "leader": True}),
    (("--set", "watchNamespace=apps"), {"watch": "apps", "restarts": False, "leader": True}),
    (("--set", "watchNamespace=apps", "--set", "rolloutRestarts.enabled=true",
      "--set", "replicaCount=1"), {"watch": "apps", "restarts": True, "leader": True}),
    (("--set", "replicaCount=1"), {"watch": None, "restarts": False, "leader": True}),
    (("--set", "metricsSecure.enabled=true", "--set", "watchNamespace=apps"),
     {"watch": "apps", "restarts": False, "leader": True, "secure": True}),
])
def test_rendered_rbac_follows_the_features_enabled(args: tuple[str, ...],
                                                     features: dict[str, Any]) -> None:
    assert operator_grants(render(*BASE, *args)) == expected_grants(**features)


def test_the_chart_s_rules_equal_deploy_rbac_s() -> None:
    docs = render(*BASE, "--set", "rolloutRestarts.enabled=true")
    pairs = [
        (one(docs, "ClusterRole", "himitsu-operator"), "deploy/rbac/role.yaml"),
        (one(docs, "ClusterRole", "himitsu-operator-rollout-restart"),
         "deploy/components/rollout-restarts/role.yaml"),
        (one(docs, "Role", "himitsu-operator-leader-election"),
         "deploy/rbac/leader_election_role.yaml"),
        (one(docs, "ClusterRole", "himitsu-operator-view"),
         "deploy/rbac/aggregate/himitsu_view.yaml"),
        (one(docs, "ClusterRole", "himitsu-operator-edit"),
         "deploy/rbac/aggregate/himitsu_edit.yaml"),
    ]
    for rendered, source in pairs:
        shipped = deploy_doc(source)
        assert rendered["rules"] == shipped["rules"], source
        aggregation = {k: v for k, v in shipped["metadata"]["labels"].items()
                       if k.startswith("rbac.authorization.k8s.io/")}
        assert aggregation.items() <= rendered["metadata"]["labels"].items(), source
    namespaced = render(*BASE, "--set", "watchNamespace=apps")
    assert one(namespaced, "Role", "himitsu-operator")["rules"] == deploy_doc(
        "deploy/namespaced/role.yaml")["rules"]


def test_aggregated_roles_read_for_view_and_write_for_edit_and_admin() -> None:
    docs = render(*BASE)
    view = one(docs, "ClusterRole", "himitsu-operator-view")
    edit = one(docs, "ClusterRole", "himitsu-operator-edit")
    assert view["rules"] == [{"apiGroups": ["himitsu.io"], "resources": ["himitsusecrets"],
                              "verbs": ["get", "list", "watch"]}]
    assert edit["rules"][0]["verbs"] == [
        "get", "list", "watch", "create", "update", "patch", "delete"]
    aggregate = "rbac.authorization.k8s.io/aggregate-to-"
    assert {k for k in view["metadata"]["labels"] if k.startswith(aggregate)} == {
        aggregate + "view"}
    assert {k for k in edit["metadata"]["labels"] if k.startswith(aggregate)} == {
        aggregate + "edit", aggregate + "admin"}
    off = render(*BASE, "--set", "aggregateRoles.enabled=false")
    assert [r["metadata"]["name"] for r in objects(off, "ClusterRole")] == ["himitsu-operator"]


# ---- the Deployment ---------------------------------------------------------------------


def _manager(docs: list[dict[str, Any]]) -> dict[str, Any]:
    (container,) = one(docs, "Deployment")["spec"]["template"]["spec"]["containers"]
    return dict(container)


def test_the_pod_is_deploy_manager_s_pod() -> None:
    """Security context, probes, resources, ports, volumes and grace: as deploy/manager."""
    shipped = one(list(yaml.safe_load_all((ROOT / "deploy/manager/manager.yaml").read_text())),
                  "Deployment")["spec"]["template"]["spec"]
    rendered = one(render(*BASE), "Deployment")["spec"]["template"]["spec"]
    for key in ("securityContext", "volumes", "terminationGracePeriodSeconds",
                "enableServiceLinks"):
        assert rendered[key] == shipped[key], key
    (want,) = shipped["containers"]
    (got,) = rendered["containers"]
    for key in ("securityContext", "livenessProbe", "readinessProbe", "resources", "ports",
                "volumeMounts", "imagePullPolicy", "name"):
        assert got[key] == want[key], key
    shipped_args = [a for a in want["args"] if not a.startswith("--allowed-api-urls")]
    assert [a for a in got["args"] if a in shipped_args] == shipped_args
    assert f"--allowed-api-urls={URL}" in got["args"]


def _lease_id(args: list[str]) -> str:
    (lease,) = [a.split("=", 1)[1] for a in args if a.startswith("--leader-election-id=")]
    return lease


@pytest.mark.parametrize("replicas", ["1", "2", "3"])
def test_every_replica_count_elects_and_rolls_so_one_replica_works_at_a_time(
        replicas: str) -> None:
    """Any count, and any change of count (1 -> 2 runs the old pod beside new ones while
    they roll): every pod elects on the one Lease its Role names, so only one works."""
    docs = render(*BASE, "--set", f"replicaCount={replicas}")
    args = _manager(docs)["args"]
    assert "--leader-elect" in args and _lease_id(args) == LEASE
    assert one(docs, "Deployment")["spec"]["strategy"] == {
        "type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}}
    lease_rules = one(docs, "Role", "himitsu-operator-leader-election")["rules"]
    assert [r.get("resourceNames") for r in lease_rules] == [[LEASE], None]


def test_leader_election_id_names_the_lease_in_the_arg_and_its_role() -> None:
    docs = render(*BASE, "--set", "leaderElection.id=team-a.example.com")
    assert _lease_id(_manager(docs)["args"]) == "team-a.example.com"
    lease_rules = one(docs, "Role", "himitsu-operator-leader-election")["rules"]
    assert [r.get("resourceNames") for r in lease_rules] == [["team-a.example.com"], None]


@pytest.mark.parametrize("extra", ['["--leader-elect"]', '["--leader-election-id=other"]',
                                   '["--leader-elect=false"]'])
def test_the_schema_refuses_leader_election_flags_in_extra_args(extra: str) -> None:
    """They would elect on a Lease the chart's Role does not name (a standby forever)."""
    result = helm_template(*BASE, "--set-json", f"extraArgs={extra}", check=False)
    assert result.returncode != 0 and "extraArgs" in result.stderr, result.stdout[-300:]


def _release(release: str, *args: str) -> list[dict[str, Any]]:
    out = subprocess.run([helm_binary(), "template", release, str(CHART), "--namespace",
                          RELEASE_NAMESPACE, *BASE, *args], capture_output=True, text=True,
                         timeout=120, check=True).stdout
    return [d for d in yaml.safe_load_all(out) if d]


def test_a_second_release_with_its_own_fullname_shares_no_cluster_object_or_lease() -> None:
    cluster_scoped = {"ClusterRole", "ClusterRoleBinding"}
    first = _release("himitsu", "--set", "rolloutRestarts.enabled=true",
                     "--set", "metricsSecure.enabled=true")
    second = _release("team-a", "--set", "fullnameOverride=himitsu-team-a",
                      "--set", "rolloutRestarts.enabled=true",
                      "--set", "metricsSecure.enabled=true")
    names = [{(d["kind"], d["metadata"]["name"]) for d in docs if d["kind"] in cluster_scoped}
             for docs in (first, second)]
    assert names[0] and names[0] & names[1] == set()
    assert _lease_id(_manager(first)["args"]) != _lease_id(_manager(second)["args"])
    assert _lease_id(_manager(second)["args"]) == "himitsu-team-a.himitsu.io"


def test_image_digest_pins_the_image_and_a_digest_is_no_tag() -> None:
    digest = "sha256:" + "0" * 64
    pinned = render(*BASE, "--set", f"image.digest={digest}", "--set", "image.tag=0.1.0")
    assert _manager(pinned)["image"] == f"ghcr.io/himitsu-io/himitsu-controller@{digest}"
    for tag in (digest, "0.1.0@" + digest, "a/b", "-x"):
        result = helm_template(*BASE, "--set", f"image.tag={tag}", check=False)
        assert result.returncode != 0 and "image" in result.stderr, tag


def test_values_reach_the_pod() -> None:
    docs = render_values("rollout-restarts", "--set", "image.tag=dev",
                         "--set", "image.repository=registry.example.com/himitsu",
                         "--set", "imagePullSecrets={regcred}",
                         "--set", "watchNamespace=apps", "--set", "nodeSelector.disk=ssd")
    pod = one(docs, "Deployment")["spec"]["template"]
    manager = _manager(docs)
    assert manager["image"] == "registry.example.com/himitsu:dev"
    assert pod["spec"]["imagePullSecrets"] == [{"name": "regcred"}]
    assert "--workers=4" in manager["args"] and "--namespace=apps" in manager["args"]
    assert {"name": "HTTPS_PROXY", "value": "http://proxy.example.com:3128"} in manager["env"]
    assert pod["metadata"]["annotations"]["example.com/team"] == "platform"
    assert pod["spec"]["nodeSelector"] == {"disk": "ssd"}
    (spread,) = pod["spec"]["topologySpreadConstraints"]
    assert spread["labelSelector"]["matchLabels"] == one(docs, "Deployment")["spec"][
        "selector"]["matchLabels"]


def test_allowed_api_urls_are_required_and_the_failure_says_what_to_set() -> None:
    result = helm_template(check=False)
    assert result.returncode != 0
    assert "allowedApiUrls is required" in result.stderr
    assert "--set allowedApiUrls=https://himitsu.example.com" in result.stderr
    both = "--allowed-api-urls=https://a.example.com,https://b.example.com"
    for value in ("{https://a.example.com,https://b.example.com}",  # a list
                  "https://a.example.com\\,https://b.example.com"):  # one string
        assert both in helm_template("--set", f"allowedApiUrls={value}").stdout, value
    one_url = helm_template("--set", "allowedApiUrls=https://himitsu.example.com").stdout
    assert "--allowed-api-urls=https://himitsu.example.com\n" in one_url


@pytest.mark.parametrize("args", [
    ("--set", "replicaCount=two"),
    ("--set", "rolloutRestarts.enabled=yes please"),
    ("--set", "allowedApiUrls=5"),
    ("--set", "allowedApiUrls=himitsu.example.com"),  # no scheme
    ("--set", "watchNamespace=Not_A_Namespace"),
    ("--set", "logLevel=verbose"),
])
def test_a_wrong_type_fails_at_install(args: tuple[str, ...]) -> None:
    result = helm_template(*BASE, *args, check=False)
    assert result.returncode != 0
    assert "values don't meet the specifications of the schema" in result.stderr


# ---- monitoring -------------------------------------------------------------------------


def test_metrics_service_and_service_monitor_select_the_pods() -> None:
    docs = render_values("servicemonitor")
    service, monitor = one(docs, "Service"), one(docs, "ServiceMonitor")
    assert service["metadata"]["annotations"] == {
        "prometheus.io/scrape": "true", "prometheus.io/port": "8080",
        "prometheus.io/path": "/metrics"}
    pod_labels = one(docs, "Deployment")["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= pod_labels.items()
    assert monitor["spec"]["selector"]["matchLabels"].items() <= (
        service["metadata"]["labels"].items())
    assert monitor["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    assert monitor["spec"]["namespaceSelector"] == {"matchNames": [RELEASE_NAMESPACE]}
    assert objects(render(*BASE), "ServiceMonitor") == []


def test_network_policy_opens_the_metrics_probes_apiserver_and_himitsu_ports_only() -> None:
    policy = one(render_values("networkpolicy"), "NetworkPolicy")["spec"]
    ingress = {p["port"]: rule["from"] for rule in policy["ingress"] for p in rule["ports"]}
    assert set(ingress) == {8080, 8081}
    assert ingress[8080] == [{"namespaceSelector": {"matchLabels": {
        "kubernetes.io/metadata.name": "monitoring"}}}]
    egress = [sorted(p["port"] for p in rule["ports"]) for rule in policy["egress"]]
    # DNS, the apiserver, and allowedApiUrls' ports: 443 (https default) and :8700.
    assert egress == [[53, 53], [443, 6443], [443, 8700]]
    assert policy["egress"][1]["to"] == [{"ipBlock": {"cidr": "10.96.0.1/32"}}]


def test_prometheus_rule_and_dashboard_come_from_deploy_s_files(tmp_path: Path) -> None:
    files = rule_and_dashboard()
    chart = chart_with(tmp_path, files)
    docs = render(*BASE, "--set", "prometheusRule.enabled=true",
                  "--set", "prometheusRule.labels.release=prom",
                  "--set", "grafanaDashboard.enabled=true",
                  "--set", "grafanaDashboard.namespace=monitoring", chart=chart)
    rule = one(docs, "PrometheusRule")
    assert rule["spec"] == yaml.safe_load(files["prometheusrule.yaml"])["spec"]
    assert rule["metadata"]["labels"]["release"] == "prom"
    board = one(docs, "ConfigMap")
    assert board["metadata"]["namespace"] == "monitoring"
    assert board["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert board["data"] == {"himitsu-controller.json": files["grafana-dashboard.json"].rstrip(
        "\n")}


def test_enabling_a_missing_rule_or_dashboard_fails_naming_chart_sync(tmp_path: Path) -> None:
    chart = chart_with(tmp_path, {})
    for value in ("prometheusRule.enabled=true", "grafanaDashboard.enabled=true"):
        result = helm_template(*BASE, "--set", value, chart=chart, check=False)
        assert result.returncode != 0 and "make chart-sync" in result.stderr, value
    assert objects(render(*BASE, chart=chart), "PrometheusRule") == []


def test_make_chart_sync_check_passes_in_lint() -> None:
    result = subprocess.run([sys.executable, str(ROOT / "hack" / "chart_sync.py"), "--check"],
                            capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 0, result.stderr


def test_the_kind_run_allows_its_stand_in_and_nothing_else() -> None:
    """hack/kind/kind.sh: `helm install` with hack/kind/values.yaml, the image it loaded."""
    from himitsu_controller.cli import build_parser  # noqa: PLC0415
    from himitsu_controller.sync.allowlist import AllowList  # noqa: PLC0415

    script = (ROOT / "hack" / "kind" / "kind.sh").read_text()
    assert '-f "$here/values.yaml"' in script
    docs = render("-f", str(ROOT / "hack" / "kind" / "values.yaml"))
    (svc,) = [d for d in yaml.safe_load_all((ROOT / "hack" / "kind" / "standin.yaml").read_text())
              if d["kind"] == "Service"]
    standin = (f"http://{svc['metadata']['name']}.{svc['metadata']['namespace']}.svc:"
               f"{svc['spec']['ports'][0]['port']}")
    parsed = build_parser().parse_args(_manager(docs)["args"])
    assert parsed.allowed_api_urls == standin and parsed.allow_insecure_http
    allowed = AllowList(parsed.allowed_api_urls.split(","),
                        allow_insecure_http=parsed.allow_insecure_http)
    assert allowed.check(standin) == standin
    assert operator_grants(docs) == expected_grants(watch=None, restarts=True, leader=True)


def test_secure_metrics_serve_https_with_deploy_s_review_rules() -> None:
    docs = render(*BASE, "--set", "metricsSecure.enabled=true",
                  "--set", "serviceMonitor.enabled=true")
    for name, source in (("himitsu-operator-metrics-auth", "metrics_auth_role.yaml"),
                         ("himitsu-operator-metrics-reader", "metrics_reader_role.yaml")):
        shipped = deploy_doc(f"deploy/components/metrics-secure/{source}")
        assert one(docs, "ClusterRole", name)["rules"] == shipped["rules"], source
    manager = _manager(docs)
    assert {"--metrics-secure", "--metrics-cert-dir=/etc/himitsu/metrics-cert"} <= set(
        manager["args"])
    pod = one(docs, "Deployment")["spec"]["template"]
    (volume,) = [v for v in pod["spec"]["volumes"] if v["name"] == "metrics-cert"]
    assert volume["secret"]["secretName"] == "himitsu-operator-metrics-cert"
    for annotated in (pod["metadata"], one(docs, "Service")["metadata"]):
        assert annotated["annotations"]["prometheus.io/scheme"] == "https"
    (endpoint,) = one(docs, "ServiceMonitor")["spec"]["endpoints"]
    assert endpoint["scheme"] == "https" and endpoint["tlsConfig"]["ca"]["secret"] == {
        "name": "himitsu-operator-metrics-cert", "key": "ca.crt"}
    plain = render(*BASE)
    assert "--metrics-secure" not in _manager(plain)["args"]
    assert not [r for r in objects(plain, "ClusterRole") if "metrics" in r["metadata"]["name"]]
