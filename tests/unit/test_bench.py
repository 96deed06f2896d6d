"""Tests for the pure part of bench/: how each benchmark figure is counted and shown.

The benchmark's numbers are only as trustworthy as their arithmetic: one audit event per
request (not per stage), the operator's requests only, a percentile by interpolation,
CPU ticks from the right /proc fields, PASS/MISS at the printed precision. No cluster,
no clocks, no timings asserted.
"""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench import figures, memory, report  # noqa: E402
from bench.procs import IMAGE_ENV  # noqa: E402
from bench.report import Row, Target  # noqa: E402

OPERATOR = "system:serviceaccount:himitsu-system:himitsu-operator"


def audit_line(audit_id: str, *, stage: str = "ResponseComplete", user: str = OPERATOR,
               verb: str = "patch", resource: str | None = "himitsusecrets",
               subresource: str | None = "status", namespace: str = "ns", code: int = 200,
               received: str = "2026-01-01T00:00:10.500000Z",
               uri: str = "/apis/himitsu.io/v1alpha1/x") -> str:
    event: dict[str, Any] = {
        "kind": "Event", "apiVersion": "audit.k8s.io/v1", "level": "Metadata",
        "auditID": audit_id, "stage": stage, "requestURI": uri, "verb": verb,
        "user": {"username": user, "groups": ["system:serviceaccounts"]},
        "userAgent": "himitsu-controller/0.1.0", "responseStatus": {"metadata": {}, "code": code},
        "requestReceivedTimestamp": received, "stageTimestamp": received,
    }
    if resource is not None:
        ref: dict[str, Any] = {"resource": resource, "namespace": namespace, "name": "n"}
        if subresource:
            ref["subresource"] = subresource
        event["objectRef"] = ref
    return json.dumps(event)


# -- percentiles -------------------------------------------------------------------------


@pytest.mark.parametrize(("values", "q", "expected"), [
    ([1, 2, 3, 4], 50, 2.5),
    ([1, 2, 3, 4], 0, 1.0),
    ([1, 2, 3, 4], 100, 4.0),
    ([5], 99, 5.0),
    ([10, 0], 25, 2.5),  # order of the input does not matter
    (list(range(101)), 99, 99.0),
])
def test_percentile_interpolates_between_closest_ranks(values: list[float], q: float,
                                                       expected: float) -> None:
    assert figures.percentile(values, q) == pytest.approx(expected)


def test_percentile_of_nothing_or_out_of_range_is_an_error() -> None:
    with pytest.raises(ValueError):
        figures.percentile([], 50)
    with pytest.raises(ValueError):
        figures.percentile([1.0], 101)


def test_median_and_summary() -> None:
    assert figures.median([3, 1, 2]) == 2
    summary = figures.summarize([0.1, 0.2, 0.3, 0.4, 5.0])
    assert summary["n"] == 5 and summary["max"] == 5.0 and summary["p50"] == 0.3
    assert summary["p99"] == pytest.approx(0.4 + 0.96 * 4.6)
    assert figures.summarize([]) == {"n": 0, "p50": None, "p99": None, "max": None}


def test_per_unit_has_no_figure_without_units() -> None:
    assert figures.per_unit(10, 4) == 2.5
    assert figures.per_unit(10, 0) is None


def test_bucket_counts_ignores_times_outside_the_buckets() -> None:
    times = [99.0, 100.0, 100.9, 101.0, 105.5, 110.0]
    assert figures.bucket_counts(times, start=100.0, width=1.0, buckets=10) == \
        [2, 1, 0, 0, 0, 1, 0, 0, 0, 0]


# -- audit log ---------------------------------------------------------------------------


def test_an_audit_line_names_verb_resource_subresource_and_time() -> None:
    event = figures.parse_audit_line(audit_line("a1"))
    assert event is not None
    assert (event.verb, event.resource, event.namespace, event.code) == \
        ("patch", "himitsusecrets/status", "ns", 200)
    assert event.username == OPERATOR
    assert event.received == pytest.approx(1767225610.5)


def test_a_non_resource_request_is_named_by_its_path() -> None:
    event = figures.parse_audit_line(audit_line("a1", verb="get", resource=None,
                                                uri="/readyz?verbose=1"))
    assert event is not None and event.resource == "/readyz"


@pytest.mark.parametrize("line", ["", "not json", "[1, 2]", '{"kind": "Event"}',
                                  '{"kind": "EventList", "auditID": "x"}',
                                  audit_line("a1")[:40]])
def test_partial_or_foreign_lines_are_skipped(line: str) -> None:
    assert figures.parse_audit_line(line) is None


def test_a_watch_counts_once_although_it_logs_two_stages() -> None:
    lines = [audit_line("w1", stage="ResponseStarted", verb="watch", subresource=None),
             audit_line("w1", stage="ResponseComplete", verb="watch", subresource=None),
             audit_line("p1"), audit_line("p2")]
    events = figures.select(figures.parse_audit_lines(lines), username=OPERATOR)
    assert figures.by_verb(events) == {"watch himitsusecrets": 1,
                                       "patch himitsusecrets/status": 2}


def test_select_keeps_the_operators_requests_inside_the_window() -> None:
    lines = [
        audit_line("early", received="2026-01-01T00:00:09.999999Z"),
        audit_line("start", received="2026-01-01T00:00:10Z"),
        audit_line("admin", user="himitsu-local-admin"),
        audit_line("other-ns", namespace="elsewhere"),
        audit_line("end", received="2026-01-01T00:00:20Z"),
    ]
    start = figures.parse_timestamp("2026-01-01T00:00:10Z")
    events = figures.select(figures.parse_audit_lines(lines), username=OPERATOR,
                            since=start, until=start + 10)
    assert sorted(e.audit_id for e in events) == ["other-ns", "start"]
    events = figures.select(figures.parse_audit_lines(lines), namespaces=["ns"],
                            since=start, until=start + 10)
    assert sorted(e.audit_id for e in events) == ["admin", "start"]


def test_count_status_finds_429s() -> None:
    events = list(figures.parse_audit_lines(
        [audit_line("a", code=429), audit_line("b"), audit_line("c", code=429)]))
    assert figures.count_status(events, 429) == 2


# -- Prometheus text ---------------------------------------------------------------------

METRICS = """\
# HELP himitsu_syncs_total Reconciles of HimitsuSecrets by result
# TYPE himitsu_syncs_total counter
himitsu_syncs_total{reason="",result="not_modified"} 90.0
himitsu_syncs_total{reason="FetchFailure",result="failed"} 3.0
himitsu_syncs_total{reason="",result="written"} 7.0
controller_runtime_reconcile_total{controller="himitsusecret",result="success"} 12.0
workqueue_depth{controller="himitsusecret",name="himitsusecret",priority=""} 0.0
process_start 1.7e9
"""


def test_prometheus_samples_are_summed_over_matching_series() -> None:
    samples = figures.parse_prometheus(METRICS)
    assert figures.metric_sum(samples, "himitsu_syncs_total") == 100.0
    assert figures.metric_sum(samples, "himitsu_syncs_total", result="failed") == 3.0
    assert figures.metric_sum(samples, "workqueue_depth", priority="") == 0.0
    assert figures.metric_sum(samples, "process_start") == 1.7e9
    assert figures.metric_sum(samples, "absent_total") == 0.0


def test_metric_delta_between_two_scrapes() -> None:
    before = figures.parse_prometheus(METRICS)
    after = figures.parse_prometheus(METRICS.replace("90.0", "140.0"))
    assert figures.metric_delta(before, after, "himitsu_syncs_total") == 50.0
    assert figures.metric_delta({}, after, "controller_runtime_reconcile_total") == 12.0


# -- /proc -------------------------------------------------------------------------------


def test_cpu_ticks_are_utime_plus_stime_even_with_spaces_in_the_name() -> None:
    fields = ["S"] + [str(i) for i in range(4, 53)]  # fields 3..52; 14 -> "14", 15 -> "15"
    stat = "4242 (python -m x) " + " ".join(fields)
    assert figures.cpu_ticks(stat) == 14 + 15


def test_status_fields_are_read_in_kib() -> None:
    status = "Name:\tpython\nVmHWM:\t  204800 kB\nVmRSS:\t  102400 kB\nThreads:\t9\n"
    assert figures.status_kib(status) == 102400
    assert figures.mib(figures.status_kib(status, "VmHWM")) == 200.0
    with pytest.raises(ValueError):
        figures.status_kib("Name:\tx\n")


# -- py-spy profiles ---------------------------------------------------------------------


def test_top_frames_counts_self_and_total_shares() -> None:
    collapsed = "\n".join([
        "run (t.py:1);work (t.py:5);encode (j.py:9) 6",
        "run (t.py:1);work (t.py:5) 2",
        "run (t.py:1);idle (t.py:8);idle (t.py:8) 2",  # recursion counts once in total
        "garbage line",
    ])
    top = figures.top_frames(collapsed, limit=3)
    assert top["self"][0] == ("encode (j.py:9)", 60.0)
    assert dict(top["total"])["run (t.py:1)"] == 100.0
    assert dict(figures.top_frames(collapsed)["total"])["idle (t.py:8)"] == 20.0
    assert figures.top_frames("") == {"self": [], "total": []}


# -- targets and the table ---------------------------------------------------------------


@pytest.mark.parametrize(("value", "target", "digits", "verdict"), [
    (1.004, Target("<=", 1), 2, "PASS"),   # printed as 1.00: judged as printed
    (1.006, Target("<=", 1), 2, "MISS"),   # printed as 1.01
    (0.0, Target("==", 0), 0, "PASS"),
    (3.0, Target("==", 0), 0, "MISS"),
    (25.0, Target("<", 20), 1, "MISS"),
    (None, Target("<=", 1), 2, "n/a"),
    (5.0, None, 2, ""),
])
def test_verdicts_compare_at_the_printed_precision(value: float | None, target: Target | None,
                                                   digits: int, verdict: str) -> None:
    assert Row("s", "f", value, digits=digits, target=target).verdict == verdict


def test_an_unknown_comparison_is_refused() -> None:
    with pytest.raises(ValueError):
        Target("~", 1.0)


def test_the_table_aligns_columns_and_shows_units_targets_and_verdicts() -> None:
    rows = [Row("steady 1000", "CPU per poll", 2.345, "ms", 2, Target("<=", 3), "median"),
            Row("cold sync 1000", "seconds until all Ready", 31.0, "s", 1, Target("<=", 20)),
            Row("restart", "downtime", None, "s")]
    lines = report.format_table(rows).splitlines()
    assert lines[0].split() == ["scenario", "figure", "measured", "target", "note"]
    assert "2.35 ms" in lines[2] and "<= 3 ms" in lines[2] and "PASS" in lines[2]
    assert lines[2].endswith("median")
    assert "31.0 s" in lines[3] and "MISS" in lines[3]
    assert "n/a" in lines[4]
    # Columns line up: every figure starts where the header's "figure" does.
    column = lines[0].index("figure")
    assert all(line[column - 2:column] == "  " for line in lines[2:])


def test_the_json_document_keeps_rows_verdicts_and_raw_results(tmp_path: Path) -> None:
    rows = [Row("a", "x", 1.0, target=Target("<=", 2)), Row("a", "y", 5.0, target=Target("<", 1)),
            Row("a", "z", None, target=Target("<", 1))]
    doc = report.document(rows, meta={"cpus": 2}, scenarios={"a": {"raw": [1, 2]}})
    assert doc["summary"] == {"PASS": 1, "MISS": 1, "n/a": 1}
    assert doc["rows"][0]["target"] == "<= 2" and doc["rows"][1]["verdict"] == "MISS"
    path = report.write_json(tmp_path / "results" / "bench.json", doc)
    assert json.loads(path.read_text())["scenarios"] == {"a": {"raw": [1, 2]}}


# -- the memory scenario's figures ---------------------------------------------------------


def test_the_slope_is_a_least_squares_line() -> None:
    fit = figures.linear_fit([(1000, 86.0), (5000, 211.0), (1000, 88.0), (3000, 149.0)])
    assert fit is not None
    slope, intercept = fit
    assert slope * 1000 == pytest.approx(31.0) and intercept == pytest.approx(56.0)
    assert figures.linear_fit([(1000, 86.0), (1000, 87.0)]) is None


def _memory_data(rss: dict[str, dict[int, list[float]]]) -> dict[str, Any]:
    return {"trees": {label: f"/src/{label}" for label in rss},
            "imports": {label: {"rss": 50.0, "runs": [50.0]} for label in rss},
            "runs": {label: {size: [{"rss": v, "peak_rss": v + 5, "synced_seconds": 10.0,
                                     "idle_seconds": 12.0, "kube_per_object": 3.0} for v in values]
                             for size, values in sizes.items()}
                     for label, sizes in rss.items()},
            "growth": {}, "control_plane_mib": {1000: {"etcd": 60.0}}}


def test_memory_rows_hold_the_issue_targets_and_medians() -> None:
    rows = memory.memory_rows(_memory_data({"this tree": {1000: [61.0, 58.0, 59.0],
                                                   5000: [120.0], 10000: [150.0]}}))
    rss = {r.scenario: r for r in rows if r.figure == "RSS after a cold sync"}
    assert (rss["memory 1000"].value, rss["memory 1000"].verdict) == (59.0, "PASS")
    assert (rss["memory 5000"].verdict, rss["memory 10000"].verdict) == ("MISS", "PASS")
    assert [str(rss[f"memory {n}"].target) for n in (1000, 5000, 10000)] == \
        ["<= 60", "<= 100", "<= 160"]
    slope = next(r for r in rows if r.scenario == "memory slope")
    assert slope.value is not None and slope.value > 0
    assert not any("baseline" in r.figure for r in rows)


def test_memory_rows_with_a_baseline_give_both_and_the_ratio() -> None:
    rows = memory.memory_rows(_memory_data({"baseline": {1000: [86.0]},
                                            "this tree": {1000: [43.0]}}))
    by_figure = {r.figure: r for r in rows if r.scenario == "memory 1000"}
    assert by_figure["RSS after a cold sync"].value == 43.0
    assert by_figure["RSS after a cold sync, baseline"].value == 86.0
    assert by_figure["RSS ratio (this tree / baseline)"].value == pytest.approx(0.5)
    imports = [r.figure for r in rows if r.scenario == "memory imports"]
    assert imports == ["RSS of the imports alone", "RSS of the imports alone, baseline"]


def test_the_bench_runs_the_operator_with_the_image_s_runtime_environment() -> None:
    text = (REPO / "Dockerfile").read_text()
    final = text[text.index("FROM scratch"):].replace("\\\n", " ")
    env = dict(pair.split("=", 1) for line in final.splitlines() if line.startswith("ENV ")
               for pair in shlex.split(line[4:]))
    assert {k: env[k] for k in IMAGE_ENV} == IMAGE_ENV
    assert env["MALLOC_ARENA_MAX"] == "2"

