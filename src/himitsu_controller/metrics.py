"""The Himitsu-specific Prometheus series, registered beside the runtime's own.

Labels are bounded and carry no secret material: an outcome class, a sync result, a
Ready reason, and for the Ready gauge the HimitsuSecret's namespace and name (object
names, as kube-state-metrics exports them). Never a token, a key name or a value.
"""

from __future__ import annotations

import contextlib

from prometheus_client import Counter, Gauge

from himitsu_controller.runtime.metrics import REGISTRY

api_requests = Counter(
    "himitsu_api_requests",
    "HTTP requests to the Himitsu API by outcome (200, 304, 4xx, 429, 5xx, transport_error).",
    ["outcome"], registry=REGISTRY,
)
syncs = Counter(
    "himitsu_syncs",
    "Reconciles of HimitsuSecrets by result (not_modified, written, unchanged, failed) and "
    "failure reason.",
    ["result", "reason"], registry=REGISTRY,
)
secret_writes = Counter(
    "himitsu_secret_writes",
    "Writes of target Secrets by operation (create, update).",
    ["operation"], registry=REGISTRY,
)
ready = Gauge(
    "himitsu_secret_ready",
    "1 when the HimitsuSecret's Ready condition is True, else 0.",
    ["namespace", "name"], registry=REGISTRY,
)


def count_request(outcome: str) -> None:
    api_requests.labels(outcome=outcome).inc()


def count_sync(result: str, reason: str = "") -> None:
    syncs.labels(result=result, reason=reason).inc()


def count_write(operation: str) -> None:
    secret_writes.labels(operation=operation).inc()


def set_ready(namespace: str, name: str, is_ready: bool) -> None:
    ready.labels(namespace=namespace, name=name).set(1 if is_ready else 0)


def forget_ready(namespace: str, name: str) -> None:
    with contextlib.suppress(KeyError):
        ready.remove(namespace, name)
