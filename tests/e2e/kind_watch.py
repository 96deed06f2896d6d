"""Watching the in-cluster Deployment while a test disturbs it (kind only).

Why apart from kind.py: these record history for the invariants of the kind-only tests
(test_kind_deployment.py): who held the Lease, and in what order, and each replica's own
account of when it led. A pod the test deletes takes its logs with it, so PodLogs
follows every operator pod from the moment it appears.
"""

from __future__ import annotations

import abc
import itertools
import json
import signal
import subprocess
import threading
import time
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from types import TracebackType
from typing import Any, Self

from .kind import LEASE, OPERATOR_NAMESPACE, OPERATOR_SELECTOR
from .kubehelp import ApiError, KubeApi, dies_with_caller, kubectl_binary

LEASE_PATH = f"/apis/coordination.k8s.io/v1/namespaces/{OPERATOR_NAMESPACE}/leases/{LEASE}"
POLL = 0.2


def pod_of(identity: str) -> str:
    return identity.rsplit("_", 1)[0]  # identity = <hostname = pod name>_<uuid>


def lease_spec(kube: KubeApi) -> dict[str, Any]:
    return dict(kube.get(LEASE_PATH).get("spec") or {})


class _Poller(abc.ABC):
    def __init__(self) -> None:
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self.errors: list[str] = []

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self._stop.set()
        self._thread.join(timeout=30)
        self.close()

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self.poll()
            except (ApiError, OSError, ValueError) as error:
                self.errors.append(repr(error))
            self._stop.wait(POLL)

    @abc.abstractmethod
    def poll(self) -> None:
        """One look at what the poller follows."""

    def close(self) -> None:  # noqa: B027 (a hook: most pollers hold nothing)
        """Release what the poller holds."""


class LeaseWatch(_Poller):
    """Every change of (holder, leaseTransitions) of the operator's Lease, in order."""

    def __init__(self, kube: KubeApi) -> None:
        super().__init__()
        self._kube = kube
        self.changes: list[tuple[str, int]] = []
        self.poll()  # the state before the test acts

    def poll(self) -> None:
        spec = lease_spec(self._kube)
        seen = (str(spec.get("holderIdentity") or ""), int(spec.get("leaseTransitions") or 0))
        if not self.changes or self.changes[-1] != seen:
            self.changes.append(seen)

    def holders(self) -> list[str]:
        """The successive non-empty holders (pod names)."""
        out: list[str] = []
        for holder, _ in self.changes:
            if holder and (not out or out[-1] != pod_of(holder)):
                out.append(pod_of(holder))
        return out

    def assert_no_unseen_holder(self) -> None:
        """Each acquisition by a new identity bumps leaseTransitions by one: a count
        larger than the acquisitions seen means a holder came and went unobserved."""
        acquisitions = 0
        previous = ""
        for holder, _ in self.changes:
            if holder and holder != previous:
                acquisitions += 1
            if holder:
                previous = holder
        first_transitions = self.changes[0][1]
        last_transitions = self.changes[-1][1]
        already_held = 1 if self.changes[0][0] else 0
        assert last_transitions - first_transitions == acquisitions - already_held, (
            f"leaseTransitions went {first_transitions} -> {last_transitions} but "
            f"{acquisitions - already_held} acquisitions were seen: {self.changes}")


@dataclass
class Leadership:
    pod: str
    began: datetime
    ended: datetime | None  # None: still leading when its log was last read
    released: bool


class PodLogs(_Poller):
    """Follows the manager log of every operator pod into ``log_dir``."""

    def __init__(self, kube: KubeApi, log_dir: Path) -> None:
        super().__init__()
        self._kube = kube
        self._dir = log_dir / f"pod-logs-{time.monotonic_ns()}"
        self._dir.mkdir(parents=True)
        self._followers: dict[str, subprocess.Popen[bytes]] = {}
        self.poll()

    def poll(self) -> None:
        pods = self._kube.get(f"/api/v1/namespaces/{OPERATOR_NAMESPACE}/pods",
                              labelSelector=OPERATOR_SELECTOR)["items"]
        for pod in pods:
            name = pod["metadata"]["name"]
            started = any(s.get("state", {}).get("running") or s.get("state", {}).get("terminated")
                          for s in (pod.get("status") or {}).get("containerStatuses") or [])
            if name in self._followers or not started:
                continue
            with open(self._dir / f"{name}.log", "ab") as out:
                self._followers[name] = subprocess.Popen(
                    dies_with_caller([kubectl_binary(), f"--kubeconfig={self._kube.kubeconfig}",
                                      "-n", OPERATOR_NAMESPACE, "logs", "-f", "-c", "manager",
                                      f"pod/{name}"]),
                    stdout=out, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL,
                    start_new_session=True)

    def close(self) -> None:
        for proc in self._followers.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                proc.wait(timeout=10)

    def pods(self) -> list[str]:
        return sorted(self._followers)

    def records(self, pod: str) -> list[dict[str, Any]]:
        out = []
        for line in (self._dir / f"{pod}.log").read_text(errors="replace").splitlines():
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if isinstance(record, dict):
                out.append(record)
        return out

    def leaderships(self) -> list[Leadership]:
        """Each pod's terms as leader, by its own log, in order of their start."""
        terms: list[Leadership] = []
        for pod in self.pods():
            current: Leadership | None = None
            for record in self.records(pod):
                event, stamp = str(record.get("event", "")), record.get("timestamp")
                if not stamp:
                    continue
                at = datetime.fromisoformat(str(stamp).replace("Z", "+00:00"))
                if event == "became leader":
                    current = Leadership(pod, at, None, released=False)
                    terms.append(current)
                elif current is not None and event == "releasing the lease":
                    current.ended = at  # gate closed and settled, logged before the write
                elif current is not None and event == "released the lease":
                    current.ended, current.released = current.ended or at, True
                    current = None
                elif current is not None and event.startswith("leadership lost"):
                    current.ended = current.ended or at
                    current = None
        return sorted(terms, key=lambda term: term.began)

    def assert_one_leader_at_a_time(self) -> list[Leadership]:
        """No term begins before the previous one ended. A released term ends at
        "releasing the lease", logged with the write gate closed and settled and before the
        release write: "released the lease" comes after it, possibly after the standby's
        "became leader"."""
        terms = self.leaderships()
        for before, after in itertools.pairwise(terms):
            assert before.ended is not None and before.ended <= after.began, (
                f"{after.pod} began leading at {after.began} while {before.pod} (from "
                f"{before.began}) had not ended its term ({before.ended})")
        return terms
