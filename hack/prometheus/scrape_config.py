"""prometheus.yml for the Prometheus check: scrape the operator with only what deploy/ ships.

Three jobs, one per way deploy/ offers to be scraped (each replica is scraped once per job;
the check queries them apart by job):

* ``kubernetes-pods``: the Pods' ``prometheus.io/scrape``, ``/port``, ``/path``
  annotations, the annotation-driven job of Prometheus' example Kubernetes configuration
  (documentation/examples/prometheus-kubernetes.yml), written here in its spirit;
* ``kubernetes-service-endpoints``: the same annotations on the metrics Service, resolved to
  its endpoints (that example's job of the same name);
* ``serviceMonitor/<namespace>/<name>/<i>``: deploy/prometheus/servicemonitor.yaml translated
  as the Prometheus Operator translates a ServiceMonitor (role endpointslice, the service's
  labels kept by the selector, the endpoint's port by name, its path, interval and scheme;
  the operator's target labels namespace, service, pod, container, endpoint, job = the
  Service's name). Read from the file at every run, so a ServiceMonitor that drifts from the
  Service (a label or port renamed) scrapes nothing and the check fails. A ServiceMonitor
  field this translation does not know is an error, never silently dropped.

    python hack/prometheus/scrape_config.py [--deploy DIR] [--scrape-interval 5s] > prometheus.yml
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[2]
SERVICE_MONITOR = "prometheus/servicemonitor.yaml"

# What this translation implements; anything else in a ServiceMonitor is refused.
_SPEC_KEYS = {"selector", "namespaceSelector", "endpoints"}
_SELECTOR_KEYS = {"matchLabels", "matchExpressions"}
_NAMESPACE_SELECTOR_KEYS = {"matchNames", "any"}
_ENDPOINT_KEYS = {"port", "path", "interval", "scrapeTimeout", "scheme", "honorLabels"}

# Phases whose Pods have no process to scrape (the example config drops them too).
_NOT_RUNNING = "Pending|Succeeded|Failed|Completed"


def annotation_jobs() -> list[dict[str, Any]]:
    """The two annotation-driven jobs: Pods, and Services resolved to their endpoints."""
    def annotated(kind: str) -> list[dict[str, Any]]:
        meta = f"__meta_kubernetes_{kind}_annotation_prometheus_io"
        return [
            {"source_labels": [f"{meta}_scrape"], "action": "keep", "regex": "true"},
            {"source_labels": [f"{meta}_scheme"], "action": "replace",
             "target_label": "__scheme__", "regex": "(https?)"},
            {"source_labels": [f"{meta}_path"], "action": "replace",
             "target_label": "__metrics_path__", "regex": "(.+)"},
            {"source_labels": ["__address__", f"{meta}_port"], "action": "replace",
             "target_label": "__address__", "regex": r"([^:]+)(?::\d+)?;(\d+)",
             "replacement": "$1:$2"},
        ]

    common = [
        {"source_labels": ["__meta_kubernetes_namespace"], "target_label": "namespace"},
        {"source_labels": ["__meta_kubernetes_pod_name"], "target_label": "pod"},
        {"source_labels": ["__meta_kubernetes_pod_phase"], "regex": _NOT_RUNNING,
         "action": "drop"},
    ]
    return [
        {"job_name": "kubernetes-pods",
         "kubernetes_sd_configs": [{"role": "pod"}],
         # One target per container port; the port annotation makes them all the same
         # address, and Prometheus keeps one target per distinct label set.
         "relabel_configs": [
             *annotated("pod"),
             {"action": "labelmap", "regex": "__meta_kubernetes_pod_label_(.+)"},
             *common]},
        {"job_name": "kubernetes-service-endpoints",
         "kubernetes_sd_configs": [{"role": "endpointslice"}],
         "relabel_configs": [
             *annotated("service"),
             {"action": "labelmap", "regex": "__meta_kubernetes_service_label_(.+)"},
             {"source_labels": ["__meta_kubernetes_service_name"], "target_label": "service"},
             *common]},
    ]


def _label_name(key: str) -> str:
    """A Kubernetes label key as Prometheus spells it in meta labels."""
    return re.sub(r"[^a-zA-Z0-9_]", "_", key)


def _refuse_unknown(where: str, got: dict[str, Any], known: set[str]) -> None:
    unknown = sorted(set(got) - known)
    if unknown:
        raise SystemExit(f"scrape_config.py: {where} has {unknown}, which this translation "
                         f"does not implement (it knows {sorted(known)})")


def _selector_keeps(selector: dict[str, Any]) -> list[dict[str, Any]]:
    _refuse_unknown("spec.selector", selector, _SELECTOR_KEYS)
    keeps: list[dict[str, Any]] = []
    for key, value in sorted((selector.get("matchLabels") or {}).items()):
        name = _label_name(key)
        keeps.append({"action": "keep",
                      "source_labels": [f"__meta_kubernetes_service_label_{name}",
                                        f"__meta_kubernetes_service_labelpresent_{name}"],
                      "regex": f"({re.escape(str(value))});true"})
    for expr in selector.get("matchExpressions") or []:
        name = _label_name(expr["key"])
        values = "|".join(re.escape(str(v)) for v in expr.get("values") or [])
        present = f"__meta_kubernetes_service_labelpresent_{name}"
        label = f"__meta_kubernetes_service_label_{name}"
        rule = {"In": {"action": "keep", "source_labels": [label, present],
                       "regex": f"({values});true"},
                "NotIn": {"action": "drop", "source_labels": [label, present],
                          "regex": f"({values});true"},
                "Exists": {"action": "keep", "source_labels": [present], "regex": "true"},
                "DoesNotExist": {"action": "drop", "source_labels": [present],
                                 "regex": "true"}}.get(expr.get("operator", ""))
        if rule is None:
            raise SystemExit(f"scrape_config.py: unknown matchExpressions operator {expr!r}")
        keeps.append(rule)
    return keeps


def service_monitor_jobs(monitor: dict[str, Any]) -> list[dict[str, Any]]:
    """The scrape jobs the Prometheus Operator generates for one ServiceMonitor."""
    meta, spec = monitor["metadata"], monitor.get("spec") or {}
    _refuse_unknown("spec", spec, _SPEC_KEYS)
    namespace_selector = spec.get("namespaceSelector") or {}
    _refuse_unknown("spec.namespaceSelector", namespace_selector, _NAMESPACE_SELECTOR_KEYS)
    sd: dict[str, Any] = {"role": "endpointslice"}
    if not namespace_selector.get("any"):
        sd["namespaces"] = {"names": namespace_selector.get("matchNames") or
                            [meta["namespace"]]}
    jobs = []
    for i, endpoint in enumerate(spec.get("endpoints") or []):
        _refuse_unknown(f"spec.endpoints[{i}]", endpoint, _ENDPOINT_KEYS)
        if "port" not in endpoint:
            raise SystemExit(f"scrape_config.py: spec.endpoints[{i}] names no port")
        port = str(endpoint["port"])
        job: dict[str, Any] = {
            "job_name": f"serviceMonitor/{meta['namespace']}/{meta['name']}/{i}",
            "honor_labels": bool(endpoint.get("honorLabels", False)),
            "kubernetes_sd_configs": [sd],
            "metrics_path": endpoint.get("path", "/metrics"),
            "scheme": endpoint.get("scheme", "http"),
        }
        for key, field in (("scrape_interval", "interval"), ("scrape_timeout", "scrapeTimeout")):
            if field in endpoint:
                job[key] = endpoint[field]
        target = "__meta_kubernetes_endpointslice_address_target"
        job["relabel_configs"] = [
            *_selector_keeps(spec.get("selector") or {}),
            {"action": "keep", "source_labels": ["__meta_kubernetes_endpointslice_port_name"],
             "regex": re.escape(port)},
            {"source_labels": [f"{target}_kind", f"{target}_name"], "separator": ";",
             "regex": "Node;(.*)", "replacement": "${1}", "target_label": "node"},
            {"source_labels": [f"{target}_kind", f"{target}_name"], "separator": ";",
             "regex": "Pod;(.*)", "replacement": "${1}", "target_label": "pod"},
            {"source_labels": ["__meta_kubernetes_namespace"], "target_label": "namespace"},
            {"source_labels": ["__meta_kubernetes_service_name"], "target_label": "service"},
            {"source_labels": ["__meta_kubernetes_pod_name"], "target_label": "pod"},
            {"source_labels": ["__meta_kubernetes_pod_container_name"],
             "target_label": "container"},
            {"source_labels": ["__meta_kubernetes_pod_phase"], "regex": "(Failed|Succeeded)",
             "action": "drop"},
            {"source_labels": ["__meta_kubernetes_service_name"], "target_label": "job",
             "replacement": "${1}"},
            {"target_label": "endpoint", "replacement": port},
        ]
        jobs.append(job)
    return jobs


def config(deploy: Path, scrape_interval: str) -> dict[str, Any]:
    with open(deploy / SERVICE_MONITOR, encoding="utf-8") as fh:
        monitors = [d for d in yaml.safe_load_all(fh)
                    if d and d.get("kind") == "ServiceMonitor"]
    if not monitors:
        raise SystemExit(f"scrape_config.py: no ServiceMonitor in {deploy / SERVICE_MONITOR}")
    return {
        "global": {"scrape_interval": scrape_interval, "evaluation_interval": scrape_interval},
        "scrape_configs": [
            *annotation_jobs(),
            *(job for monitor in monitors for job in service_monitor_jobs(monitor)),
        ],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--deploy", type=Path, default=REPO / "deploy",
                        help="the deploy/ directory to read (default: this checkout's)")
    parser.add_argument("--scrape-interval", default="5s",
                        help="global scrape interval; a ServiceMonitor's own interval wins")
    args = parser.parse_args(argv)
    sys.stdout.write("# Generated by hack/prometheus/scrape_config.py from "
                     f"{SERVICE_MONITOR} and the annotation conventions: do not edit.\n")
    yaml.safe_dump(config(args.deploy, args.scrape_interval), sys.stdout, sort_keys=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
