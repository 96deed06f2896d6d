"""client-go's Lease-based leader election, with a release on shutdown.

* Acquire a Lease that is absent, released, ours, or unchanged for its duration by our
  own monotonic clock (never the remote renewTime); every write carries the Lease's
  resourceVersion, so of two racing candidates one gets 409.
* Renew every retry period within one renew deadline (each request gets what is left);
  open the write gate after each success, close it on a loss or a release.
* On stop, release the Lease once no admitted write is in flight or unanswered.
* Use a RestClient of its own, without hidden retries.

Design: docs/design/leader-election.md
"""

from __future__ import annotations

import copy
import random
import socket
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any, Protocol

import structlog

from himitsu_controller.runtime.client.errors import ApiError, describe_exception
from himitsu_controller.runtime.client.rest import Resource
from himitsu_controller.runtime.leader.writegate import WriteGate
from himitsu_controller.runtime.metrics import leader_election_master_status

__all__ = ["LEASES", "LeaderElectionConfig", "LeaderElector", "LeaseClient", "default_identity"]

log = structlog.get_logger(__name__)

LEASES = Resource("coordination.k8s.io", "v1", "leases")
# client-go's wait.JitterUntil factor for the acquire loop.
JITTER_FACTOR = 1.2
# The release on shutdown is a courtesy (the Lease expires anyway): it gets this long,
# after waiting at most SETTLE_TIMEOUT for admitted writes still in flight.
RELEASE_TIMEOUT = 2.0
SETTLE_TIMEOUT = 1.0
# Of lease_duration - renew_deadline, the share an admitted write may still run after
# the gate closed; the rest is margin before the earliest takeover.
WRITE_OVERRUN_SHARE = 0.5


def default_identity() -> str:
    """"hostname_uuid4": unique even when two replicas share a hostname."""
    return f"{socket.gethostname()}_{uuid.uuid4()}"


@dataclass(frozen=True)
class LeaderElectionConfig:
    namespace: str
    name: str
    identity: str
    lease_duration: float = 15.0
    renew_deadline: float = 10.0
    retry_period: float = 2.0

    def __post_init__(self) -> None:
        # client-go's NewLeaderElector checks: the leader must give up (renew_deadline)
        # before a standby may take over (lease_duration).
        if not self.identity:
            raise ValueError("leader election needs an identity")
        if min(self.lease_duration, self.renew_deadline, self.retry_period) <= 0:
            raise ValueError("lease duration, renew deadline and retry period must be > 0")
        if self.lease_duration != int(self.lease_duration):
            raise ValueError(f"lease duration must be whole seconds (the Lease stores "
                             f"leaseDurationSeconds), not {self.lease_duration:g}s")
        if self.lease_duration <= self.renew_deadline:
            raise ValueError("lease duration must be greater than the renew deadline")
        if self.renew_deadline <= JITTER_FACTOR * self.retry_period:
            raise ValueError("renew deadline must be greater than 1.2 x the retry period")


class LeaseClient(Protocol):
    """The three calls the elector makes (RestClient satisfies it)."""

    def get(self, resource: Resource, name: str, *, namespace: str | None = ...,
            timeout: float = ...) -> dict[str, Any]: ...

    def create(self, resource: Resource, body: Mapping[str, Any], *,
               namespace: str | None = ..., timeout: float = ...) -> dict[str, Any]: ...

    def update(self, resource: Resource, body: Mapping[str, Any], *,
               namespace: str | None = ..., timeout: float = ...) -> dict[str, Any]: ...


@dataclass(frozen=True)
class _Record:
    """The Lease spec fields the algorithm reads and writes."""

    holder: str
    duration: int
    acquire_time: str | None
    renew_time: str | None
    transitions: int

    @classmethod
    def from_spec(cls, spec: Mapping[str, Any]) -> _Record:
        return cls(holder=str(spec.get("holderIdentity") or ""),
                   duration=int(spec.get("leaseDurationSeconds") or 0),
                   acquire_time=spec.get("acquireTime"), renew_time=spec.get("renewTime"),
                   transitions=int(spec.get("leaseTransitions") or 0))

    def to_spec(self) -> dict[str, Any]:
        return {"holderIdentity": self.holder or None, "leaseDurationSeconds": self.duration,
                "acquireTime": self.acquire_time, "renewTime": self.renew_time,
                "leaseTransitions": self.transitions}


def micro_time(moment: datetime) -> str:
    """metav1.MicroTime: RFC 3339 in UTC with microseconds."""
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class LeaderElector:
    """Campaigns for one Lease and runs callbacks when leadership starts and stops."""

    def __init__(self, rest: LeaseClient, config: LeaderElectionConfig, *,
                 on_started_leading: Callable[[], None],
                 on_stopped_leading: Callable[[], None],
                 gate: WriteGate | None = None,
                 clock: Callable[[], float] = time.monotonic,
                 wall_clock: Callable[[], datetime] = lambda: datetime.now(UTC),
                 rng: Callable[[], float] = random.random,
                 wait: Callable[[threading.Event, float], bool] | None = None) -> None:
        """``gate`` (on the same clock) is opened while this replica may write;
        ``wait(stop, seconds)`` pauses the loops (True when stop is set)."""
        self._rest = rest
        self.gate = gate if gate is not None else WriteGate(clock=clock)
        self._wait = wait if wait is not None else threading.Event.wait
        self.config = config
        self._lease_id = f"{config.namespace}/{config.name}"  # for logs
        self._on_started_leading = on_started_leading
        self._on_stopped_leading = on_stopped_leading
        self._clock = clock
        self._wall_clock = wall_clock
        self._rng = rng
        self._lease: dict[str, Any] | None = None  # last Lease read or written (its RV)
        self._observed: _Record | None = None
        self._observed_spec: dict[str, Any] | None = None
        self._observed_time = 0.0
        self._renewed_at = float("-inf")  # when our last successful write was sent
        self._leading = False
        self._gauge = leader_election_master_status.labels(name=config.name)

    def is_leader(self) -> bool:
        """True between on_started_leading and on_stopped_leading."""
        return self._leading

    def run(self, stop: threading.Event) -> bool:
        """Campaign, lead, and return: True on a requested stop, False if leadership was lost.
        on_started_leading must return promptly: renewals happen on this thread."""
        self._set_leading(False)
        log.info("campaigning for leadership", lease=self._lease_id,
                 identity=self.config.identity)
        if not self._acquire(stop):
            return True
        self._set_leading(True)
        log.info("became leader", lease=self._lease_id, identity=self.config.identity)
        stopped: bool | None = None  # None: on_started_leading failed
        try:
            try:
                self._on_started_leading()
            except Exception:
                log.exception("on_started_leading failed: giving up leadership")
            else:
                stopped = self._renew_loop(stop)
        finally:
            self.gate.close()  # before anything else, however we leave: no write from here
        self._set_leading(False)
        if stopped:
            self._release()
        elif stopped is False:
            log.error("leadership lost: could not renew the lease in time",
                      lease=self._lease_id, renew_deadline=self.config.renew_deadline)
        try:
            self._on_stopped_leading()
        except Exception:
            log.exception("on_stopped_leading failed")
        return bool(stopped)

    def try_acquire_or_renew(self, *, timeout: float | None = None) -> bool:
        """One attempt (client-go's tryAcquireOrRenew); True if we hold the Lease after it.
        Its requests share one deadline, ``timeout`` (default renew_deadline) from now."""
        deadline = self._clock() + (timeout if timeout is not None
                                    else self.config.renew_deadline)
        stamp = micro_time(self._wall_clock())
        desired = _Record(self.config.identity, int(self.config.lease_duration), stamp, stamp, 0)
        observed = self._observed
        # Fast path: a leader with a still-valid lease updates its last known Lease
        # directly, one request instead of two. Any failure falls back to reading it.
        if observed is not None and self._holds(observed) and self._lease_valid():
            renewal = replace(desired, acquire_time=observed.acquire_time,
                              transitions=observed.transitions)
            if self._write(renewal, deadline=deadline, quiet=True):
                return True
        found, spec = self._read(deadline=deadline)
        if not found:
            return self._create(desired, deadline=deadline)
        if spec is None:
            return False
        observed = self._observe(spec)
        if self._holds(observed):
            desired = replace(desired, acquire_time=observed.acquire_time,
                              transitions=observed.transitions)
        elif observed.holder and self._lease_valid():
            return False  # someone else holds a lease that has not expired for us
        else:
            desired = replace(desired, transitions=observed.transitions + 1)
        return self._write(desired, deadline=deadline)

    def _acquire(self, stop: threading.Event) -> bool:
        while not stop.is_set():
            if self.try_acquire_or_renew():
                return True
            delay = self.config.retry_period * (1.0 + self._rng() * JITTER_FACTOR)
            if self._wait(stop, delay):
                break
        return False

    def _renew_loop(self, stop: threading.Event) -> bool:
        """Renew until stop (True) or until renew_deadline passes without a renewal (False),
        counted from when the last successful renewal was sent, as the gate's."""
        while not self._wait(stop, self.config.retry_period):
            deadline = self._renewed_at + self.config.renew_deadline
            while (remaining := deadline - self._clock()) > 0:
                if self.try_acquire_or_renew(timeout=remaining):
                    break
                observed = self._observed
                if observed is not None and observed.holder and not self._holds(observed):
                    return False  # someone else already holds it: no point retrying
                pause = min(self.config.retry_period, max(0.0, deadline - self._clock()))
                if self._wait(stop, pause):
                    return True
            else:  # the deadline passed
                return False
        return True

    def _release(self) -> None:
        observed = self._observed
        if observed is None or not self._holds(observed) or self._lease is None:
            return
        # A release lets a standby lead at once: not while a write we let through may
        # still land. Expiry gives such a write lease_duration after our last renewal.
        if not self.gate.settle(SETTLE_TIMEOUT):
            log.warning("not releasing the lease: writes still in flight, it expires instead",
                        lease=self._lease_id, in_flight=self.gate.in_flight)
            return
        if self.gate.unanswered_within(self.config.lease_duration):
            log.warning("not releasing the lease: a write got no answer, it expires instead",
                        lease=self._lease_id)
            return
        # Logged BEFORE the write: the gate is closed and settled, so this ends our term
        # (a standby may log "became leader" before we log "released the lease").
        log.info("releasing the lease", lease=self._lease_id)
        stamp = micro_time(self._wall_clock())
        released = _Record("", 1, stamp, stamp, observed.transitions)
        deadline = self._clock() + min(RELEASE_TIMEOUT, self.config.renew_deadline)
        if self._write(released, deadline=deadline):
            log.info("released the lease", lease=self._lease_id)

    # Lease I/O. Each request gets what is left until ``deadline``; none once it passed.

    def _left(self, deadline: float) -> float | None:
        remaining = deadline - self._clock()
        return remaining if remaining > 0 else None

    def _read(self, *, deadline: float) -> tuple[bool, Mapping[str, Any] | None]:
        """(found, spec): (False, None) if there is no Lease, (True, None) if unreadable."""
        timeout = self._left(deadline)
        if timeout is None:
            return True, None
        try:
            lease = self._rest.get(LEASES, self.config.name, namespace=self.config.namespace,
                                   timeout=timeout)
        except Exception as exc:
            if isinstance(exc, ApiError) and exc.status == 404:
                return False, None
            log.warning("cannot read the lease", lease=self._lease_id,
                        error=str(exc) if isinstance(exc, ApiError) else describe_exception(exc))
            return True, None
        self._lease = lease
        spec = lease.get("spec")
        return True, spec if isinstance(spec, dict) else {}

    def _create(self, desired: _Record, *, deadline: float) -> bool:
        body = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                "metadata": {"name": self.config.name, "namespace": self.config.namespace},
                "spec": desired.to_spec()}
        return self._store(self._rest.create, body, desired, deadline=deadline,
                           report=log.info, verb="create")

    def _write(self, record: _Record, *, deadline: float, quiet: bool = False) -> bool:
        if self._lease is None:
            return False
        body = copy.deepcopy(self._lease)
        body["spec"] = {**(body.get("spec") or {}), **record.to_spec()}
        return self._store(self._rest.update, body, record, deadline=deadline,
                           report=log.debug if quiet else log.info, verb="update")

    def _store(self, call: Callable[..., dict[str, Any]], body: dict[str, Any],
               record: _Record, *, deadline: float, report: Callable[..., Any],
               verb: str) -> bool:
        timeout = self._left(deadline)
        if timeout is None:
            return False
        sent = self._clock()
        try:
            stored = call(LEASES, body, namespace=self.config.namespace, timeout=timeout)
        except Exception as exc:  # 409: another candidate was first, or the Lease changed
            report(f"cannot {verb} the lease", lease=self._lease_id,
                   error=describe_exception(exc))
            return False
        self._accept(stored, record, sent)
        return True

    def _accept(self, lease: dict[str, Any], record: _Record, sent: float) -> None:
        """Our write of ``record``, sent at ``sent``, was stored."""
        self._lease = lease
        spec = lease.get("spec")
        self._observed_spec = copy.deepcopy(spec) if isinstance(spec, dict) else record.to_spec()
        self._observed = record
        self._observed_time = self._clock()
        if self._holds(record):
            # No standby saw this record before it was sent, so none may take the Lease
            # before sent + lease_duration; we write until sent + renew_deadline.
            self._renewed_at = sent
            closes = sent + self.config.renew_deadline
            margin = self.config.lease_duration - self.config.renew_deadline
            self.gate.open_until(closes, writes_end=closes + margin * WRITE_OVERRUN_SHARE)

    def _observe(self, spec: Mapping[str, Any]) -> _Record:
        """Adopt the server's record; restart our lease timer only if it changed."""
        if spec != self._observed_spec or self._observed is None:
            record = _Record.from_spec(spec)
            previous = self._observed
            if previous is None or previous.holder != record.holder:
                log.info("lease holder observed", lease=self._lease_id,
                         holder=record.holder or None)
            self._observed = record
            self._observed_spec = copy.deepcopy(dict(spec))
            self._observed_time = self._clock()
        return self._observed

    def _lease_valid(self) -> bool:
        observed = self._observed
        return observed is not None and self._observed_time + observed.duration > self._clock()

    def _holds(self, record: _Record) -> bool:
        return record.holder == self.config.identity

    def _set_leading(self, leading: bool) -> None:
        self._leading = leading
        self._gauge.set(1 if leading else 0)
