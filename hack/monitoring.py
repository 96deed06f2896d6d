#!/usr/bin/env python3
"""The alerts and the dashboard, checked: `make lint` runs `python hack/monitoring.py`.

It runs `promtool check rules` on the PrometheusRule's spec.groups and on every dashboard
expression (as recording rules: Prometheus' own parser), then `promtool test rules` on
tests/prometheus/alerts_test.yaml. The tests import the expression readers to check the
metric names against a real /metrics scrape (tests/e2e/test_metrics_probes.py).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import promql_parser
import yaml

ROOT = Path(__file__).resolve().parents[1]
RULES = ROOT / "deploy" / "prometheus" / "prometheusrule.yaml"
DASHBOARD = ROOT / "deploy" / "grafana" / "himitsu-controller.json"
RULE_TESTS = ROOT / "tests" / "prometheus" / "alerts_test.yaml"
# Grafana's variables, as Grafana would put them in (a job regex, its rate window).
GRAFANA_VARIABLES = {"$__rate_interval": "2m", "$__interval": "30s", "$job": ".+"}
# Series Prometheus makes itself, not the operator.
PROMETHEUS_SERIES = frozenset({"up"})


def rule_groups(path: Path = RULES) -> dict[str, Any]:
    """A Prometheus rule file ({"groups": [...]}) from the PrometheusRule's spec."""
    (rule,) = [d for d in yaml.safe_load_all(path.read_text()) if d]
    return {"groups": rule["spec"]["groups"]}


def rule_expressions(path: Path = RULES) -> list[tuple[str, str]]:
    return [(str(r.get("alert") or r.get("record")), str(r["expr"]))
            for g in rule_groups(path)["groups"] for r in g["rules"]]


def dashboard_panels(path: Path = DASHBOARD) -> list[dict[str, Any]]:
    panels: list[dict[str, Any]] = []
    for panel in json.loads(path.read_text())["panels"]:
        panels += [panel, *panel.get("panels", [])]
    return panels


def dashboard_expressions(path: Path = DASHBOARD) -> list[tuple[str, str]]:
    """(panel title / refId, expression with Grafana's variables filled in)."""
    found = []
    for panel in dashboard_panels(path):
        for target in panel.get("targets", []):
            expr = str(target["expr"])
            for variable, value in GRAFANA_VARIABLES.items():
                expr = expr.replace(variable, value)
            found.append((f"{panel['title']}/{target['refId']}", expr))
    return found


def metric_names(expr: str) -> set[str]:
    """The metric names an expression selects, from its parse tree (promql-parser)."""
    names: set[str] = set()

    def visit(node: promql_parser.Expr) -> None:
        if isinstance(node, promql_parser.VectorSelector):
            if node.name is None:
                raise ValueError(f"a selector without a metric name in {expr!r}")
            names.add(node.name)

    promql_parser.walk(promql_parser.parse(expr), pre_visit=visit)
    return names


def exported_names(families: dict[str, str]) -> set[str]:
    """Names a query may select, from {family name: type} of a /metrics scrape."""
    suffixes = {"counter": ("_total",), "histogram": ("_bucket", "_count", "_sum"),
                "summary": ("", "_count", "_sum")}
    return {name + suffix for name, kind in families.items()
            for suffix in suffixes.get(kind, ("",))}


def write_rule_files(directory: Path) -> tuple[Path, Path]:
    """The alerts as a Prometheus rule file, and every dashboard expression as a recording
    rule (``dashboard:expression_<i>``, in dashboard_expressions() order): for promtool,
    and for a real Prometheus to evaluate."""
    alerts, dashboard = directory / "rules.yaml", directory / "dashboard.yaml"
    alerts.write_text(yaml.safe_dump(rule_groups()))
    recorded = [{"record": f"dashboard:expression_{i}", "expr": expr}
                for i, (_, expr) in enumerate(dashboard_expressions())]
    dashboard.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": recorded}]}))
    return alerts, dashboard


def _promtool(*args: str) -> None:
    print("promtool", *args, flush=True)
    subprocess.run(["promtool", *args], check=True)


def main() -> int:
    if shutil.which("promtool") is None:
        print("monitoring.py: promtool not found (Debian package `prometheus`)", file=sys.stderr)
        return 1
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        alerts, dashboard = write_rule_files(work)
        shutil.copy(RULE_TESTS, work / "alerts_test.yaml")
        try:
            _promtool("check", "rules", str(alerts), str(dashboard))
            _promtool("test", "rules", str(work / "alerts_test.yaml"))
        except subprocess.CalledProcessError as exc:
            print(f"monitoring.py: {exc}", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
