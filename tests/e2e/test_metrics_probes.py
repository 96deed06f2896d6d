"""/metrics speaks Prometheus with controller-runtime's series; /healthz and /readyz answer."""

from __future__ import annotations

import shutil
import subprocess
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

import monitoring  # hack/monitoring.py

from .canary import LeakEvidence
from .harness import Harness
from .kubehelp import wait_for

pytestmark = [pytest.mark.e2e]

CONTROLLER = "himitsusecret"
# Sample names (as exposed, suffixes included) a controller-runtime dashboard relies on.
RUNTIME_SAMPLES = (
    "controller_runtime_reconcile_total",
    "controller_runtime_reconcile_errors_total",
    "controller_runtime_reconcile_time_seconds_bucket",
    "controller_runtime_max_concurrent_reconciles",
    "controller_runtime_active_workers",
    "workqueue_depth",
    "workqueue_adds_total",
    "workqueue_retries_total",
    "workqueue_queue_duration_seconds_bucket",
    "workqueue_work_duration_seconds_bucket",
    "workqueue_unfinished_work_seconds",
    "workqueue_longest_running_processor_seconds",
)


def _samples(text: str) -> list[Any]:
    return [s for family in text_string_to_metric_families(text) for s in family.samples]


def _value(samples: list[Any], metric: str, **labels: str) -> float:
    return float(sum(s.value for s in samples
                     if s.name == metric and labels.items() <= s.labels.items()))


def test_metrics_expose_controller_runtime_and_himitsu_series(
        h: Harness, ns: str, default_operator: Any, leak_evidence: LeakEvidence) -> None:
    sync = h.sync(ns, "API_KEY", refresh="2s")
    wait_for(lambda: h.standin.count(sync.env, status=304) >= 1, timeout=30,
             what="a poll answered 304")

    def scraped_after_a_304() -> str | None:
        text: str = default_operator.scrape()
        counted = _value(_samples(text), "himitsu_api_requests_total", outcome="304")
        return text if counted > 0 else None

    text = wait_for(scraped_after_a_304, timeout=30,
                    what='himitsu_api_requests_total{outcome="304"} > 0')
    leak_evidence.texts.append(("metrics", text))
    samples = _samples(text)

    names = {s.name for s in samples}
    missing = [n for n in RUNTIME_SAMPLES if n not in names]
    assert not missing, f"missing series: {missing}"
    assert _value(samples, "controller_runtime_reconcile_total",
                  controller=CONTROLLER, result="success") > 0 or _value(
        samples, "controller_runtime_reconcile_total", controller=CONTROLLER,
        result="requeue_after") > 0
    assert _value(samples, "workqueue_adds_total", name=CONTROLLER, controller=CONTROLLER) > 0
    depth = [s for s in samples if s.name == "workqueue_depth"]
    assert depth and set(depth[0].labels) == {"name", "controller", "priority"}
    assert _value(samples, "himitsu_api_requests_total", outcome="200") > 0
    assert _value(samples, "himitsu_secret_ready", hsec_namespace=ns, name=sync.name) == 1
    assert "himitsu_syncs_total" in names
    assert "himitsu_secret_writes_total" in names
    lag = ("himitsu_poll_lag_seconds", "himitsu_polls_overdue",
           "himitsu_poll_lateness_seconds_count")
    assert all(n in names for n in lag), f"missing lag series: {set(lag) - names}"


def test_health_and_readiness_probes_answer_200(default_operator: Any) -> None:
    assert default_operator.probe("/healthz") == 200
    assert default_operator.probe("/readyz") == 200


def test_metrics_pass_promtool_check_metrics(h: Harness, ns: str, default_operator: Any) -> None:
    """Prometheus' own linter accepts the exposition: help text on every family, counters
    ending in _total, base units, snake_case names. On a scrape after a sync was written and
    polled again, so the counters, histograms and the Ready gauge carry labelled samples."""
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool not on PATH (Debian: apt-get install prometheus; CI installs it)")
    sync = h.sync(ns, "API_KEY", refresh="2s")
    wait_for(lambda: h.standin.count(sync.env, status=304) >= 1, timeout=30,
             what="a poll answered 304")

    def scraped_with_the_sync_ready() -> str | None:
        text: str = default_operator.scrape()
        ready = _value(_samples(text), "himitsu_secret_ready", hsec_namespace=ns, name=sync.name)
        return text if ready == 1 else None

    text = wait_for(scraped_with_the_sync_ready, timeout=30,
                    what=f"himitsu_secret_ready{{hsec_namespace={ns!r}}} == 1")
    result = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True,
                            text=True, timeout=60, check=False)
    assert result.returncode == 0, (
        f"promtool check metrics (exit {result.returncode}):\n{result.stdout}{result.stderr}")


def test_the_alerts_and_the_dashboard_select_only_series_the_operator_exports(
        h: Harness, ns: str, default_operator: Any) -> None:
    """Every metric name in deploy/prometheus/prometheusrule.yaml and in the Grafana
    dashboard, read from each expression's parse tree, is one this operator's /metrics
    exposes (a family, with its type's suffixes), or Prometheus' own `up`. A series renamed
    on either side fails here."""
    sync = h.sync(ns, "API_KEY", refresh="2s")
    wait_for(lambda: h.standin.count(sync.env, status=304) >= 1, timeout=30,
             what="a poll answered 304")
    text: str = default_operator.scrape()
    families = {f.name: f.type for f in text_string_to_metric_families(text)}
    exported = monitoring.exported_names(families) | monitoring.PROMETHEUS_SERIES
    expressions = monitoring.rule_expressions() + monitoring.dashboard_expressions()
    assert len(expressions) > 30
    unknown = {where: sorted(monitoring.metric_names(expr) - exported)
               for where, expr in expressions}
    assert {where: names for where, names in unknown.items() if names} == {}
