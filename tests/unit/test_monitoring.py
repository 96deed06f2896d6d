"""The alerts and the dashboard (hack/monitoring.py reads them): each alert says what it
means and links its runbook section, has a promtool test that fires it and one that
does not, and every expression parses. Their metric names are checked against a real
scrape in tests/e2e/test_metrics_probes.py; promtool runs in `make lint`."""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from himitsu_controller import himitsu, metrics
from himitsu_controller.runtime.metrics import REGISTRY

HACK = Path(__file__).resolve().parents[2] / "hack"
sys.path.insert(0, str(HACK))

import monitoring  # noqa: E402

RUNBOOKS = HACK.parent / "docs" / "runbooks.md"
RUNBOOK_BASE = ("https://github.com/himitsu-io/himitsu-controller/blob/main/"
                "docs/runbooks.md#")


def alerts() -> list[dict[str, Any]]:
    return [r for g in monitoring.rule_groups()["groups"] for r in g["rules"] if "alert" in r]


def test_every_alert_says_what_it_means_and_links_its_runbook_section() -> None:
    headings = {line[3:].strip().lower() for line in RUNBOOKS.read_text().splitlines()
                if line.startswith("## ")}
    for alert in alerts():
        notes = alert["annotations"]
        assert notes.get("summary") and notes.get("description"), alert["alert"]
        url = notes["runbook_url"]
        assert url.startswith(RUNBOOK_BASE), url
        assert url.removeprefix(RUNBOOK_BASE) == alert["alert"].lower()
        assert alert["alert"].lower() in headings, f"docs/runbooks.md lacks {alert['alert']}"
        assert alert["labels"]["severity"] in {"warning", "critical"}


def test_every_alert_has_a_promtool_test_that_fires_it_and_one_that_does_not() -> None:
    tests = yaml.safe_load(monitoring.RULE_TESTS.read_text())["tests"]
    fired: set[str] = set()
    quiet: set[str] = set()
    for test in tests:
        for case in test.get("alert_rule_test", []):
            (fired if case.get("exp_alerts") else quiet).add(case["alertname"])
    names = {a["alert"] for a in alerts()}
    assert names - fired == set(), "alerts no test fires"
    assert names - quiet == set(), "alerts no test keeps quiet"


@pytest.mark.parametrize(("where", "expr"),
                         monitoring.rule_expressions() + monitoring.dashboard_expressions())
def test_every_expression_parses_and_selects_named_metrics(where: str, expr: str) -> None:
    names = monitoring.metric_names(expr)
    assert names, f"{where}: selects no metric"
    assert all(re.fullmatch(r"[a-zA-Z_:][a-zA-Z0-9_:]*", n) for n in names), names


def test_a_parse_error_or_a_nameless_selector_is_caught() -> None:
    with pytest.raises(ValueError):
        monitoring.metric_names("sum(rate(himitsu_api_requests_total[5m])")
    with pytest.raises(ValueError):
        monitoring.metric_names('{__name__=~"himitsu_.*"}')
    assert monitoring.metric_names(
        'sum(rate(a_total[5m])) / on() max(b) or absent(up{job="j"} == 1)'
    ) == {"a_total", "b", "up"}


def test_exported_names_carry_the_suffixes_a_query_selects() -> None:
    families = {"himitsu_syncs": "counter", "himitsu_poll_lateness_seconds": "histogram",
                "workqueue_depth": "gauge"}
    assert monitoring.exported_names(families) == {
        "himitsu_syncs_total", "himitsu_poll_lateness_seconds_bucket",
        "himitsu_poll_lateness_seconds_count", "himitsu_poll_lateness_seconds_sum",
        "workqueue_depth"}


def test_the_dashboard_panels_have_unique_ids_and_titles_and_one_datasource() -> None:
    panels = monitoring.dashboard_panels()
    ids = [p["id"] for p in panels]
    assert len(ids) == len(set(ids))
    graphs = [p for p in panels if p["type"] != "row"]
    assert len({p["title"] for p in graphs}) == len(graphs)
    for panel in graphs:
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
        assert panel.get("description"), panel["title"]
        for target in panel["targets"]:
            assert 'job=~"$job"' in target["expr"], (panel["title"], target["expr"])


def test_every_himitsu_request_outcome_is_exported_before_its_first_request() -> None:
    """A counter child born with its first increment hides that increment from rate() and
    increase(): HimitsuApiRateLimited would miss the first 429s. Every outcome (a closed
    set) is a series from the start."""
    assert metrics.api_requests is not None  # imported: its series are registered
    exported = {s.labels["outcome"] for family in REGISTRY.collect() for s in family.samples
                if s.name == "himitsu_api_requests_total"}
    assert exported == set(himitsu.OUTCOMES)
