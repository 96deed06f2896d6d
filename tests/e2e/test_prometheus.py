"""A real Prometheus scrapes the operator: both replicas up, one leader, reconciles counted.

Two variants of one check (tests/e2e/prometheus.py: check_two_replicas):
* kind (``make e2e-kind``): Prometheus in the cluster (hack/prometheus, deployed by
  hack/kind/kind.sh) discovers the Deployment from ``make deploy`` through nothing but what
  deploy/ ships, once per way it offers: the Pods' prometheus.io annotations, the metrics
  Service's annotations, and the ServiceMonitor translated to its scrape config;
* local control plane: ``prometheus`` from PATH on the host, a static scrape of two
  replicas started here with --leader-elect (what a kubelet-less machine can show: the
  server negotiates and ingests the exposition, and the series tell the replicas apart).
  It also loads the shipped alerts and every dashboard expression (hack/monitoring.py):
  each evaluates without error on the real series, no alert is pending or firing for
  the healthy pair, and each panel query shows data.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import monitoring  # hack/monitoring.py

from . import cluster_setup, kind
from .cluster_setup import Cluster
from .harness import Harness
from .kubehelp import KubeApi, wait_for
from .operator_proc import OperatorLauncher
from .prometheus import HostPrometheus, PrometheusApi, check_two_replicas

pytestmark = [pytest.mark.e2e]

# Set by hack/kind/kind.sh once it has deployed hack/prometheus: then the check must run.
PROMETHEUS_NAMESPACE = os.environ.get("E2E_PROMETHEUS_NAMESPACE", "")
PROMETHEUS_SERVICE, PROMETHEUS_PORT = "prometheus", 9090
# hack/prometheus/scrape_config.py's jobs as their `job` label reads, and their intervals:
# the global 5 s, and the ServiceMonitor's own (deploy/prometheus/servicemonitor.yaml;
# the Prometheus Operator names the job after the Service).
IN_CLUSTER_JOBS = {"kubernetes-pods": 5.0, "kubernetes-service-endpoints": 5.0,
                   "himitsu-operator-metrics": 30.0}
LOCAL_INTERVAL = 1.0
# The local job as the ServiceMonitor's (HimitsuControllerDown selects it), with the target
# label every scrape path deploy/ ships adds: the operator's own namespace.
LOCAL_JOB, LOCAL_TARGET_NAMESPACE = "himitsu-operator-metrics", "himitsu-system"


@pytest.fixture
def prometheus_in_cluster(cluster: Cluster, kube: KubeApi, session_dir: Path,
                          ) -> Iterator[PrometheusApi]:
    if not cluster.on_kind:
        pytest.skip("Prometheus discovers the operator's Pods: needs a kubelet (make e2e-kind)")
    if not PROMETHEUS_NAMESPACE:
        pytest.skip("E2E_PROMETHEUS_NAMESPACE not set: no in-cluster Prometheus to query "
                    "(hack/kind/kind.sh e2e deploys hack/prometheus and sets it)")
    forward = kind.PortForward(kube.kubeconfig, PROMETHEUS_NAMESPACE,
                               f"svc/{PROMETHEUS_SERVICE}", PROMETHEUS_PORT,
                               session_dir / "prometheus-port-forward.log")
    try:
        yield PrometheusApi(forward.url)
    finally:
        forward.stop()


def _running_replicas(kube: KubeApi) -> set[str]:
    pods = kube.get(f"/api/v1/namespaces/{kind.OPERATOR_NAMESPACE}/pods",
                    query={"labelSelector": kind.OPERATOR_SELECTOR})["items"]
    return {p["metadata"]["name"] for p in pods
            if p["status"].get("phase") == "Running"
            and not p["metadata"].get("deletionTimestamp")}


def test_prometheus_in_cluster_scrapes_both_replicas_through_deploy(
        prometheus_in_cluster: PrometheusApi, kube: KubeApi, h: Harness, ns: str) -> None:
    h.sync(ns, "API_KEY", refresh="2s")  # the leader reconciles every 2 s from here on
    replicas = _running_replicas(kube)
    assert len(replicas) == 2, f"the Deployment runs two replicas, found {sorted(replicas)}"
    check_two_replicas(prometheus_in_cluster, IN_CLUSTER_JOBS, "pod", replicas,
                       where=f'namespace="{kind.OPERATOR_NAMESPACE}"')


@pytest.mark.local_only
def test_prometheus_on_the_host_scrapes_two_local_replicas_and_evaluates_the_alerts(
        operator: OperatorLauncher, h: Harness, ns: str, session_dir: Path) -> None:
    if shutil.which("prometheus") is None:
        pytest.skip("prometheus not on PATH (Debian: apt-get install prometheus; CI installs it)")
    lease = cluster_setup.lease_name(h.kube, "e2e-prom")
    flags = ("--leader-elect", "--leader-election-namespace", cluster_setup.OPERATOR_NAMESPACE,
             "--leader-election-id", lease, f"--allowed-api-urls={h.standin.api_url}")
    replicas = [operator.start(*flags, name=f"replica-{i}") for i in "ab"]
    targets = [f"127.0.0.1:{r.metrics_port}" for r in replicas]
    workdir = session_dir / f"prometheus-{lease}"
    workdir.mkdir(parents=True)
    rule_files = monitoring.write_rule_files(workdir)
    config: dict[str, Any] = {
        "global": {"scrape_interval": f"{LOCAL_INTERVAL:.0f}s",
                   "evaluation_interval": f"{LOCAL_INTERVAL:.0f}s"},
        "rule_files": [str(f) for f in rule_files],
        "scrape_configs": [{"job_name": LOCAL_JOB, "static_configs": [
            {"targets": targets, "labels": {"namespace": LOCAL_TARGET_NAMESPACE}}]}],
    }
    # JSON is YAML: Prometheus reads it as its config file.
    prom = HostPrometheus(json.dumps(config, indent=2), workdir)
    try:
        h.sync(ns, "API_KEY", refresh="2s")
        check_two_replicas(prom.api, {LOCAL_JOB: LOCAL_INTERVAL}, "instance",
                           set(targets))
        wait_for(lambda: prom.api.query(f'himitsu_secret_ready{{hsec_namespace="{ns}"}} == 1'),
                 timeout=30, what=f"himitsu_secret_ready of {ns}, beside the target's namespace")
        _check_rules_evaluate(prom)
        _check_every_panel_shows_data(prom)
    finally:
        prom.stop()


def _check_rules_evaluate(prom: HostPrometheus) -> None:
    """Every alert and dashboard expression, evaluated by Prometheus on the operator's
    real series, evaluates without error; no alert is pending or firing (a healthy pair:
    one leader, a standby, a HimitsuSecret in sync, an allow-list)."""
    expected = len(monitoring.rule_expressions()) + len(monitoring.dashboard_expressions())
    seen: list[Any] = []

    def all_ok() -> bool:
        rules = prom.api.rules()
        seen[:] = [(r["name"], r.get("health"), r.get("lastError"), r.get("state"))
                   for r in rules if r.get("health") != "ok"
                   or r.get("state", "inactive") != "inactive"]
        return len(rules) == expected and not seen

    try:
        wait_for(all_ok, timeout=30, what=f"{expected} rules evaluated, health ok, no "
                 "alert pending or firing")
    except AssertionError as exc:
        raise AssertionError(f"{exc}\nnot ok: {seen}") from None


def _check_every_panel_shows_data(prom: HostPrometheus) -> None:
    """A panel query (but the one listing objects that are not Ready) returns series."""
    expressions = [(where, expr) for where, expr in monitoring.dashboard_expressions()
                   if not expr.rstrip().endswith("== 0")]
    empty: list[str] = []

    def shown() -> bool:
        empty[:] = [where for where, expr in expressions if not prom.api.query(expr)]
        return not empty

    try:
        wait_for(shown, timeout=30, what="every panel to show data")
    except AssertionError as exc:
        raise AssertionError(f"{exc}\nempty: {empty}") from None
