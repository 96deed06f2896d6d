"""Prometheus metrics under controller-runtime's names, so existing dashboards just work.

* A private registry: ``/metrics`` is exactly what we define, and tests scrape it alone.
* In-progress work gauges are computed at scrape time, not pushed by a ticker.
* Names, types, labels and buckets follow controller-runtime.

Design: docs/design/metrics.md
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Iterable
from typing import Protocol

import prometheus_client
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.exposition import choose_encoder
from prometheus_client.registry import Collector

from .httpserver import Handler, HTTPServerHandle, serve
from .metricsauth import SecureServing
from .parts import InformerLike

# `_created` series double the exposition size and no controller-runtime dashboard uses them.
prometheus_client.disable_created_metrics()  # type: ignore[no-untyped-call]

REGISTRY = CollectorRegistry(auto_describe=True)

# controller-runtime's reconcile_time_seconds buckets: fine-grained below a second, where
# most reconciles land, then coarser up to a minute.
RECONCILE_TIME_BUCKETS: tuple[float, ...] = (
    0.005, 0.01, 0.025, 0.05, 0.1, 0.15, 0.2, 0.25, 0.3, 0.35, 0.4, 0.45, 0.5, 0.6, 0.7,
    0.8, 0.9, 1.0, 1.25, 1.5, 1.75, 2.0, 2.5, 3.0, 3.5, 4.0, 4.5, 5.0, 6.0, 7.0, 8.0, 9.0,
    10.0, 15.0, 20.0, 25.0, 30.0, 40.0, 50.0, 60.0,
)

# controller-runtime's workqueue histograms: ExponentialBuckets(10e-9, 10, 12), i.e. 10 ns
# up to 1000 s in decades.
WORKQUEUE_DURATION_BUCKETS: tuple[float, ...] = tuple(1e-8 * 10.0**i for i in range(12))

# Reconcile result label values (controller-runtime's labelError, labelRequeueAfter, ...).
RESULTS = ("success", "error", "requeue", "requeue_after")

reconcile_total = Counter("controller_runtime_reconcile_total",
                          "Total number of reconciliations per controller",
                          ["controller", "result"], registry=REGISTRY)
reconcile_errors_total = Counter("controller_runtime_reconcile_errors_total",
                                 "Total number of reconciliation errors per controller",
                                 ["controller"], registry=REGISTRY)
reconcile_panics_total = Counter("controller_runtime_reconcile_panics_total",
                                 "Total number of reconciliation panics per controller",
                                 ["controller"], registry=REGISTRY)
reconcile_time_seconds = Histogram("controller_runtime_reconcile_time_seconds",
                                   "Length of time per reconciliation per controller",
                                   ["controller"], buckets=RECONCILE_TIME_BUCKETS,
                                   registry=REGISTRY)
max_concurrent_reconciles = Gauge("controller_runtime_max_concurrent_reconciles",
                                  "Maximum number of concurrent reconciles per controller",
                                  ["controller"], registry=REGISTRY)
active_workers = Gauge("controller_runtime_active_workers",
                       "Number of currently used workers per controller",
                       ["controller"], registry=REGISTRY)

_QUEUE = ["name", "controller"]
workqueue_depth = Gauge("workqueue_depth",
                        "Current depth of workqueue by workqueue and priority",
                        [*_QUEUE, "priority"], registry=REGISTRY)
workqueue_adds_total = Counter("workqueue_adds_total",
                               "Total number of adds handled by workqueue",
                               _QUEUE, registry=REGISTRY)
workqueue_retries_total = Counter("workqueue_retries_total",
                                  "Total number of retries handled by workqueue",
                                  _QUEUE, registry=REGISTRY)
workqueue_queue_duration_seconds = Histogram(
    "workqueue_queue_duration_seconds",
    "How long in seconds an item stays in workqueue before being requested",
    _QUEUE, buckets=WORKQUEUE_DURATION_BUCKETS, registry=REGISTRY)
workqueue_work_duration_seconds = Histogram(
    "workqueue_work_duration_seconds",
    "How long in seconds processing an item from workqueue takes.",
    _QUEUE, buckets=WORKQUEUE_DURATION_BUCKETS, registry=REGISTRY)

events_total = Counter(
    "event_recorder_events_total",
    "Events handed to the Event recorder, by outcome (sent, dropped: queue full or "
    "shutdown, filtered: spam filter, failed: refused or unreachable after retries)",
    ["outcome"], registry=REGISTRY)
leader_election_master_status = Gauge(
    "leader_election_master_status",
    "Gauge of if the reporting system is master of the relevant lease, "
    "0 indicates backup, 1 indicates master. 'name' is the string used to identify the lease. "
    "Please make sure to group by name.",
    ["name"], registry=REGISTRY)


class QueueSource(Protocol):
    """A work queue as the scrape-time gauges see it."""

    metrics_labels: tuple[str, str]  # (name, controller)

    def in_flight_seconds(self) -> list[float]: ...  # each processing item's time so far


class _ScrapeTimeCollector(Collector):
    """The in-progress gauges, computed at scrape time from live queues and informers
    (held weakly: one dropped without shutting down stops reporting)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._queues: weakref.WeakSet[QueueSource] = weakref.WeakSet()
        self._informers: weakref.WeakSet[InformerLike] = weakref.WeakSet()

    def add_queue(self, source: QueueSource) -> None:
        with self._lock:
            self._queues.add(source)

    def add_informer(self, source: InformerLike) -> None:
        with self._lock:
            self._informers.add(source)

    def describe(self) -> Iterable[GaugeMetricFamily]:
        return self._families({}, {})

    def collect(self) -> Iterable[GaugeMetricFamily]:
        with self._lock:
            queues, informers = list(self._queues), list(self._informers)
        # Sources sharing labels (a test, a restarted controller) report as one would.
        totals: dict[tuple[str, str], tuple[float, float]] = {}
        for queue in queues:
            busy = queue.in_flight_seconds()
            total, longest = totals.get(queue.metrics_labels, (0.0, 0.0))
            totals[queue.metrics_labels] = (total + sum(busy), max([longest, *busy]))
        failing: dict[str, float] = {}
        for informer in informers:
            failing[informer.name] = max(failing.get(informer.name, 0.0),
                                         informer.unhealthy_for())
        return self._families(totals, failing)

    @staticmethod
    def _families(totals: dict[tuple[str, str], tuple[float, float]],
                  failing: dict[str, float]) -> list[GaugeMetricFamily]:
        unfinished = GaugeMetricFamily(
            "workqueue_unfinished_work_seconds",
            "How many seconds of work has been done that is in progress and hasn't been "
            "observed by work_duration. Large values indicate stuck threads. One can deduce "
            "the number of stuck threads by observing the rate at which this increases.",
            labels=_QUEUE)
        longest = GaugeMetricFamily(
            "workqueue_longest_running_processor_seconds",
            "How many seconds has the longest running processor for workqueue been running.",
            labels=_QUEUE)
        watch = GaugeMetricFamily(
            "informer_watch_failing_seconds",
            "Seconds since the informer's list/watch started failing without a working watch "
            "since (0: watching). /readyz fails past 30 s.",
            labels=["name"])
        for labels, (total, longest_seconds) in sorted(totals.items()):
            unfinished.add_metric(list(labels), total)
            longest.add_metric(list(labels), longest_seconds)
        for name, seconds in sorted(failing.items()):
            watch.add_metric([name], seconds)
        return [unfinished, longest, watch]


scrape_time = _ScrapeTimeCollector()
REGISTRY.register(scrape_time)
# process_cpu_seconds_total, process_resident_memory_bytes, ...: as every Go operator has.
prometheus_client.ProcessCollector(registry=REGISTRY)


class _MetricsHandler(Handler):
    """Serves our REGISTRY at /metrics (text exposition, or OpenMetrics if asked)."""

    secure: SecureServing | None = None

    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        if self.secure is not None:  # before anything else, the 404 included
            status, reason = self.secure.authorize(self.headers.get("Authorization"))
            if status != 200:
                self.reply(status, f"{reason}\n".encode())
                return
        if self.path.split("?", 1)[0] != "/metrics":
            self.reply(404, b"not found\n")
            return
        encoder, content_type = choose_encoder(self.headers.get("Accept", ""))
        self.reply(200, encoder(REGISTRY), content_type)


def start_metrics_server(addr: str, *, secure: SecureServing | None = None,
                         ) -> HTTPServerHandle | None:
    """Serve ``/metrics`` from REGISTRY on ``addr`` (":8080", "127.0.0.1:0"; "0" disables);
    ``secure``: over HTTPS, to authorized scrapers only (--metrics-secure)."""
    handler = type("_MetricsHandler", (_MetricsHandler,), {"secure": secure})
    return serve(addr, handler, thread_name="metrics-server",
                 tls=None if secure is None else secure.tls)
