"""/metrics exposes controller-runtime's names, types, labels and buckets, from our own
registry, with the in-flight gauges computed at scrape time."""

from __future__ import annotations

import itertools
import urllib.error
import urllib.request
from collections.abc import Iterator

import pytest
from prometheus_client.parser import text_string_to_metric_families

from himitsu_controller.runtime import metrics
from himitsu_controller.runtime.controller import Controller, Result
from himitsu_controller.runtime.httpserver import HTTPServerHandle, parse_bind_address
from himitsu_controller.runtime.workqueue import RateLimitingQueue

_names = itertools.count()

EXPECTED_TYPES = {
    "controller_runtime_reconcile_total": "counter",
    "controller_runtime_reconcile_errors_total": "counter",
    "controller_runtime_reconcile_panics_total": "counter",
    "controller_runtime_reconcile_time_seconds": "histogram",
    "controller_runtime_max_concurrent_reconciles": "gauge",
    "controller_runtime_active_workers": "gauge",
    "workqueue_depth": "gauge",
    "workqueue_adds_total": "counter",
    "workqueue_retries_total": "counter",
    "workqueue_queue_duration_seconds": "histogram",
    "workqueue_work_duration_seconds": "histogram",
    "workqueue_unfinished_work_seconds": "gauge",
    "workqueue_longest_running_processor_seconds": "gauge",
    "leader_election_master_status": "gauge",
}


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def server() -> Iterator[HTTPServerHandle]:
    handle = metrics.start_metrics_server("127.0.0.1:0")
    assert handle is not None
    yield handle
    handle.stop()


def scrape(handle: HTTPServerHandle, path: str = "/metrics") -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{handle.port}{path}", timeout=10) as resp:
        body: bytes = resp.read()
        return body.decode()


def value(metric: str, /, **labels: str) -> float | None:
    return metrics.REGISTRY.get_sample_value(metric, labels)


def unique(prefix: str) -> str:
    return f"{prefix}-{next(_names)}"


def test_exposes_controller_runtime_names_and_types(server: HTTPServerHandle) -> None:
    name = unique("names")
    Controller(name, lambda key: Result(), workers=2)
    metrics.leader_election_master_status.labels(name=name).set(1)
    text = scrape(server)
    types = dict(
        line.split()[2:4] for line in text.splitlines() if line.startswith("# TYPE ")
    )
    for metric, kind in EXPECTED_TYPES.items():
        assert types.get(metric) == kind, metric
    assert "_created" not in text
    assert f'controller_runtime_max_concurrent_reconciles{{controller="{name}"}} 2.0' in text
    assert f'leader_election_master_status{{name="{name}"}} 1.0' in text
    # A new controller starts every result series at zero, as controller-runtime does.
    for result in ("success", "error", "requeue", "requeue_after"):
        assert value("controller_runtime_reconcile_total", controller=name, result=result) == 0


def test_labels_match_controller_runtime(server: HTTPServerHandle) -> None:
    name = unique("labels")
    RateLimitingQueue(name).add("k")
    families = {f.name: f for f in text_string_to_metric_families(scrape(server))}
    depth = [s for s in families["workqueue_depth"].samples if s.labels["name"] == name]
    assert depth[0].labels == {"name": name, "controller": name, "priority": ""}
    adds = [s for s in families["workqueue_adds"].samples if s.labels.get("name") == name]
    assert adds[0].labels == {"name": name, "controller": name}


def test_histogram_buckets_match_controller_runtime() -> None:
    assert metrics.RECONCILE_TIME_BUCKETS[:4] == (0.005, 0.01, 0.025, 0.05)
    assert metrics.RECONCILE_TIME_BUCKETS[-4:] == (30.0, 40.0, 50.0, 60.0)
    assert len(metrics.RECONCILE_TIME_BUCKETS) == 40
    # ExponentialBuckets(10e-9, 10, 12): 1e-8 .. 1e3
    assert len(metrics.WORKQUEUE_DURATION_BUCKETS) == 12
    assert metrics.WORKQUEUE_DURATION_BUCKETS[0] == pytest.approx(1e-8)
    assert metrics.WORKQUEUE_DURATION_BUCKETS[-1] == pytest.approx(1e3)
    name = unique("buckets")
    metrics.reconcile_time_seconds.labels(name).observe(0.3)
    bucket = "controller_runtime_reconcile_time_seconds_bucket"
    assert value(bucket, controller=name, le="0.3") == 1
    assert value(bucket, controller=name, le="0.25") == 0


def test_queue_counts_adds_depth_retries_and_durations() -> None:
    clock = FakeClock()
    name = unique("queue")
    queue = RateLimitingQueue(name, controller="ctl", clock=clock)
    labels = {"name": name, "controller": "ctl"}
    queue.add("a")
    queue.add("a")  # deduplicated: not an add
    queue.add("b")
    assert value("workqueue_adds_total", **labels) == 2
    assert value("workqueue_depth", priority="", **labels) == 2
    clock.now += 2.0
    queue.get(timeout=0)
    assert value("workqueue_depth", priority="", **labels) == 1
    assert value("workqueue_queue_duration_seconds_sum", **labels) == pytest.approx(2.0)
    clock.now += 0.5
    queue.done("a")
    assert value("workqueue_work_duration_seconds_sum", **labels) == pytest.approx(0.5)
    assert value("workqueue_work_duration_seconds_count", **labels) == 1
    queue.add_after("c", 10)
    queue.add_rate_limited("d")
    assert value("workqueue_retries_total", **labels) == 2


def test_in_flight_gauges_are_computed_at_scrape_time() -> None:
    clock = FakeClock()
    name = unique("inflight")
    queue = RateLimitingQueue(name, clock=clock)
    labels = {"name": name, "controller": name}
    assert value("workqueue_unfinished_work_seconds", **labels) == 0
    queue.add("a")
    queue.add("b")
    queue.get(timeout=0)
    clock.now += 3.0
    queue.get(timeout=0)
    clock.now += 1.0
    assert value("workqueue_unfinished_work_seconds", **labels) == pytest.approx(5.0)
    assert value("workqueue_longest_running_processor_seconds", **labels) == pytest.approx(4.0)
    queue.done("a")
    queue.done("b")
    assert value("workqueue_unfinished_work_seconds", **labels) == 0
    assert value("workqueue_longest_running_processor_seconds", **labels) == 0


def test_metrics_endpoint_only_serves_metrics(server: HTTPServerHandle) -> None:
    with pytest.raises(urllib.error.HTTPError) as err:
        scrape(server, "/other")
    assert err.value.code == 404


def test_disabled_metrics_server() -> None:
    assert metrics.start_metrics_server("0") is None


@pytest.mark.parametrize(
    ("addr", "expected"),
    [
        (":8080", ("", 8080)),
        ("127.0.0.1:0", ("127.0.0.1", 0)),
        ("[::1]:9443", ("::1", 9443)),
        ("0", None),
        ("", None),
    ],
)
def test_parse_bind_address(addr: str, expected: tuple[str, int] | None) -> None:
    assert parse_bind_address(addr) == expected


@pytest.mark.parametrize("addr", ["8080", "host:port", ":70000"])
def test_parse_bind_address_rejects_nonsense(addr: str) -> None:
    with pytest.raises(ValueError, match="bind address"):
        parse_bind_address(addr)
