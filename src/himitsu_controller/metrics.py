"""The Himitsu-specific Prometheus series, registered beside the runtime's own.

* Labels are bounded and carry no secret material: never a token, a key name or a value.
* Lag has no labels: a lateness histogram and two gauges computed at scrape time over
  every HimitsuSecret in the cache (``sync.polling.lag``).

Design: docs/design/metrics.md
"""

from __future__ import annotations

import sys
import threading
import weakref
from collections.abc import Callable, Iterable
from typing import Generic, TypeVar

from prometheus_client import Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from himitsu_controller.himitsu.client import OUTCOMES
from himitsu_controller.runtime.metrics import REGISTRY

api_requests = Counter(
    "himitsu_api_requests",
    "HTTP requests to the Himitsu API by outcome (200, 304, 4xx, 429, 5xx, transport_error, "
    "other).",
    ["outcome"], registry=REGISTRY,
)
for _outcome in OUTCOMES:
    api_requests.labels(outcome=_outcome)
syncs = Counter(
    "himitsu_syncs",
    "Reconciles of HimitsuSecrets by result (not_modified, written, unchanged, failed) and "
    "failure reason.",
    ["result", "reason"], registry=REGISTRY,
)
secret_writes = Counter(
    "himitsu_secret_writes",
    "Writes of target Secrets by operation (create, update: the data, relabel: only the "
    "operator's labels, annotations or ownerReference put back, delete: a type change).",
    ["operation"], registry=REGISTRY,
)
ROLLOUT_RESULTS = ("restarted", "coalesced", "skipped_unreferenced", "skipped_kind", "missing",
                   "failed")
rollout_restarts = Counter(
    "himitsu_rollout_restarts",
    "Rollout restarts of workloads named by rolloutRestartTargets, by result: restarted (one "
    "template patch), coalesced (a further data change or HimitsuSecret served by a restart), "
    "skipped_unreferenced (its pods do not read the Secret), skipped_kind (not a Deployment, "
    "StatefulSet or DaemonSet), missing (no such workload), failed (the patch was refused; "
    "retried with backoff).",
    ["result"], registry=REGISTRY,
)
for _result in ROLLOUT_RESULTS:
    rollout_restarts.labels(result=_result)

api_urls_unrestricted = Gauge(
    "himitsu_api_urls_unrestricted",
    "1 when the operator runs without --allowed-api-urls: any HimitsuSecret may have its "
    "token sent to any URL.",
    registry=REGISTRY,
)


poll_lateness = Histogram(
    "himitsu_poll_lateness_seconds",
    "How long after its due time each timed poll asked for its answer (a backlog in the "
    "work queue, Himitsu request pacing).",
    buckets=(0.1, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0),
    registry=REGISTRY,
)

_T = TypeVar("_T")


class _SourceCollector(Collector, Generic[_T]):
    """Gauges computed at scrape time by ``families`` from the latest source's reading
    (``idle`` without one), the source held weakly: a process has one, tests build many."""

    def __init__(self, families: Callable[[_T], list[GaugeMetricFamily]], idle: _T) -> None:
        self._families, self._idle = families, idle
        self._lock = threading.Lock()
        self._source: Callable[[], Callable[[], _T] | None] = lambda: None

    def watch(self, source: Callable[[], _T]) -> None:
        ref: Callable[[], Callable[[], _T] | None] = (
            weakref.WeakMethod(source) if hasattr(source, "__self__") else lambda: source)
        with self._lock:
            self._source = ref

    def describe(self) -> Iterable[GaugeMetricFamily]:
        return self._families(self._idle)

    def collect(self) -> Iterable[GaugeMetricFamily]:
        with self._lock:
            source = self._source()
        return self._families(source() if source is not None else self._idle)


def _lag_families(reading: tuple[float, int, float]) -> list[GaugeMetricFamily]:
    lag, overdue, intervals = reading
    return [
        GaugeMetricFamily(
            "himitsu_poll_lag_seconds",
            "How far the target furthest behind is past its promise: seconds since its "
            "data, from Himitsu's answer, became older than refreshInterval (0: none).",
            value=lag),
        GaugeMetricFamily(
            "himitsu_polls_overdue",
            "How many targets hold data older than their refreshInterval.",
            value=overdue),
        GaugeMetricFamily(
            "himitsu_poll_lag_intervals",
            "The largest lag in units of its target's own refreshInterval: 1 means a "
            "target's data is twice its refreshInterval old (0: none lags).",
            value=intervals),
    ]


def _headroom_families(headroom: dict[str, float]) -> list[GaugeMetricFamily]:
    """The smallest share of a budget left, over API keys and over API URLs (no key or
    URL in a label: a key's hash is not a dashboard's business)."""
    family = GaugeMetricFamily(
        "himitsu_api_rate_limit_headroom_ratio",
        "The smallest share of a Himitsu rate-limit budget left in the current 60 s "
        "window, over API keys (scope=api_key: our pace, or the server's "
        "RateLimit-Remaining when less) and over API URLs (scope=api_url); 1: unused, "
        "0: every request waits for the next window.",
        labels=["scope"])
    for scope in ("api_key", "api_url"):
        family.add_metric([scope], headroom.get(scope, 1.0))
    return [family]


_lag = _SourceCollector(_lag_families, (0.0, 0, 0.0))
REGISTRY.register(_lag)
_headroom: _SourceCollector[dict[str, float]] = _SourceCollector(_headroom_families, {})
REGISTRY.register(_headroom)
# Let the gauges read a source: (largest lag in seconds, targets lagging, largest lag in
# refreshIntervals); {"api_key": ratio, "api_url": ratio}.
report_lag, report_headroom = _lag.watch, _headroom.watch


class _ReadyCollector(Collector):
    """``himitsu_secret_ready{hsec_namespace,name,reason}`` (not ``namespace``: scrape configs
    set that): ~100 bytes an object (a dict entry under the caches' interned key, a shared
    reason), where a labelled Gauge child costs ~800."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._ready: dict[str, tuple[bool, str]] = {}

    def set(self, namespace: str, name: str, is_ready: bool, reason: str) -> None:
        key = sys.intern(f"{namespace}/{name}")
        with self._lock:
            self._ready[key] = (is_ready, sys.intern(reason))

    def forget(self, namespace: str, name: str) -> None:
        with self._lock:
            self._ready.pop(f"{namespace}/{name}", None)

    def describe(self) -> Iterable[GaugeMetricFamily]:
        return [self._family()]

    def collect(self) -> Iterable[GaugeMetricFamily]:
        with self._lock:
            ready = list(self._ready.items())
        family = self._family()
        for key, (is_ready, reason) in ready:
            namespace, _, name = key.partition("/")
            family.add_metric([namespace, name, reason], 1.0 if is_ready else 0.0)
        return [family]

    @staticmethod
    def _family() -> GaugeMetricFamily:
        return GaugeMetricFamily(
            "himitsu_secret_ready",
            "1 when the HimitsuSecret's Ready condition is True, else 0; reason: the "
            "condition's reason (Synced, AuthenticationFailure, FetchFailure, ...).",
            labels=["hsec_namespace", "name", "reason"])


_ready = _ReadyCollector()
REGISTRY.register(_ready)
set_ready, forget_ready = _ready.set, _ready.forget


def count_request(outcome: str) -> None:
    api_requests.labels(outcome=outcome).inc()


def count_sync(result: str, reason: str = "") -> None:
    syncs.labels(result=result, reason=reason).inc()


def count_write(operation: str) -> None:
    secret_writes.labels(operation=operation).inc()


def count_rollout(result: str, n: int = 1) -> None:
    if n > 0:
        rollout_restarts.labels(result=result).inc(n)


def observe_lateness(seconds: float) -> None:
    poll_lateness.observe(max(0.0, seconds))
