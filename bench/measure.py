"""Measuring windows and watching for outcomes: the shared instruments of every scenario.

Why windows of wall-clock time: three independent sources describe one stretch of time
(the stand-in's request log, the apiserver's audit log, the operator's /metrics and
/proc), and wall-clock bounds are the one thing all three can be cut by. Durations
inside the benchmark use the monotonic clock.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from . import figures
from .kubeapi import Watcher, decode_data, hsec_path
from .rig import Fleet, Rig

AUDIT_SETTLE = 1.5  # the apiserver writes an event when the response completes: let it land


@dataclass(frozen=True)
class Snapshot:
    wall: float
    mono: float
    cpu: float
    metrics: Mapping[figures.Sample, float]


def snapshot(rig: Rig) -> Snapshot:
    op = rig.op
    return Snapshot(time.time(), time.monotonic(), op.cpu_seconds(), op.metrics())


@dataclass
class WindowFigures:
    """What one stretch of time cost: polls, requests on both sides, CPU."""

    seconds: float
    polls: float
    failed_polls: float
    reconciles: float
    himitsu: int
    himitsu_429: int
    kube: Counter[str]
    kube_429: int
    cpu_ms: float
    himitsu_times: list[float] = field(default_factory=list)
    kube_times: list[float] = field(default_factory=list)

    @property
    def kube_total(self) -> int:
        return sum(self.kube.values())

    def kube_without_watches(self) -> int:
        return sum(n for verb, n in self.kube.items() if verb.split()[0] not in ("list", "watch"))

    def per_poll(self) -> dict[str, float | None]:
        return {
            "himitsu": figures.per_unit(self.himitsu, self.polls),
            "kube": figures.per_unit(self.kube_total, self.polls),
            "cpu_ms": figures.per_unit(self.cpu_ms, self.polls),
            **{f"kube[{verb}]": figures.per_unit(n, self.polls)
               for verb, n in sorted(self.kube.items())},
        }

    def to_json(self) -> dict[str, Any]:
        return {"seconds": self.seconds, "polls": self.polls, "failed_polls": self.failed_polls,
                "reconciles": self.reconciles, "himitsu_requests": self.himitsu,
                "himitsu_429": self.himitsu_429, "kube_requests": dict(self.kube),
                "kube_429": self.kube_429, "cpu_ms": self.cpu_ms, "per_poll": self.per_poll()}


def himitsu_records(rig: Rig, since: float, until: float, *,
                    environments: Iterable[str] | None = None) -> list[dict[str, Any]]:
    wanted = {e.lower() for e in environments} if environments is not None else None
    return [r for r in rig.himitsu.requests_log()
            if since <= float(r["time"]) < until
            and (wanted is None or str(r.get("environment") or "") in wanted)]


def window(rig: Rig, a: Snapshot, b: Snapshot, *, cpu: bool = True) -> WindowFigures:
    """Figures between two snapshots of the same operator process."""
    time.sleep(max(0.0, AUDIT_SETTLE - (time.time() - b.wall)))
    assert rig.audit is not None
    rig.check_audit()  # AuditGap rather than a figure counted from a log with holes
    kube = rig.audit.window(a.wall, b.wall)
    records = himitsu_records(rig, a.wall, b.wall)
    syncs = "himitsu_syncs_total"
    return WindowFigures(
        seconds=b.mono - a.mono,
        polls=figures.metric_delta(a.metrics, b.metrics, syncs),
        failed_polls=figures.metric_delta(a.metrics, b.metrics, syncs, result="failed"),
        reconciles=figures.metric_delta(a.metrics, b.metrics,
                                        "controller_runtime_reconcile_total"),
        himitsu=len(records), himitsu_429=sum(1 for r in records if r.get("status") == 429),
        kube=figures.by_verb(kube), kube_429=figures.count_status(kube, 429),
        cpu_ms=(b.cpu - a.cpu) * 1000.0 if cpu else 0.0,
        himitsu_times=[float(r["time"]) for r in records],
        kube_times=[e.received for e in kube],
    )


def is_ready(obj: Mapping[str, Any]) -> bool:
    """Ready=True/Synced for the object's current generation."""
    meta, status = obj.get("metadata") or {}, obj.get("status") or {}
    if status.get("observedGeneration") != meta.get("generation"):
        return False
    return any(c.get("type") == "Ready" and c.get("status") == "True"
               and c.get("reason") == "Synced" for c in status.get("conditions") or [])


class ReadyTracker:
    """Watches a fleet's HimitsuSecrets and notes when each first becomes Ready."""

    def __init__(self, rig: Rig, fleet: Fleet) -> None:
        self.expected = {m.key for m in fleet.members}
        self.ready_at: dict[str, float] = {}
        self._done = threading.Event()
        self._lock = threading.Lock()
        self._watch = Watcher(rig.kube, hsec_path(), self._on_event,
                              label_selector=fleet.selector, name=f"ready-{fleet.tag}")

    def _on_event(self, at: float, kind: str, obj: dict[str, Any]) -> None:
        meta = obj.get("metadata") or {}
        key = f"{meta.get('namespace')}/{meta.get('name')}"
        if kind == "DELETED" or key not in self.expected or not is_ready(obj):
            return
        with self._lock:
            self.ready_at.setdefault(key, at)
            if len(self.ready_at) >= len(self.expected):
                self._done.set()

    def __enter__(self) -> ReadyTracker:
        self._watch.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._watch.stop()

    def wait(self, timeout: float) -> bool:
        return self._done.wait(timeout)

    @property
    def last(self) -> float:
        with self._lock:
            return max(self.ready_at.values()) if self.ready_at else float("nan")


SecretCheck = Callable[[float, str, str, dict[str, str] | None], None]


class SecretWatch:
    """Every change to a Secret labelled himitsu.io/managed=true, as (time, type, key, data);
    data is None for a deletion."""

    def __init__(self, rig: Rig, on_change: SecretCheck) -> None:
        self._on_change = on_change
        self._watch = Watcher(rig.kube, "/api/v1/secrets", self._on_event,
                              label_selector="himitsu.io/managed=true", name="secrets")

    def _on_event(self, at: float, kind: str, obj: dict[str, Any]) -> None:
        meta = obj.get("metadata") or {}
        key = f"{meta.get('namespace')}/{meta.get('name')}"
        self._on_change(at, kind, key, None if kind == "DELETED" else decode_data(obj))

    def __enter__(self) -> SecretWatch:
        self._watch.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._watch.stop()


def wait_for(done: Callable[[], bool], *, timeout: float, interval: float = 0.2) -> bool:
    """Poll a condition until a deadline; False (not an exception) when it never held."""
    deadline = time.monotonic() + timeout
    while not done():
        if time.monotonic() >= deadline:
            return False
        time.sleep(interval)
    return True
