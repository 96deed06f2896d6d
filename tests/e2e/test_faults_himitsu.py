"""Himitsu misbehaves for a while: the Secret holds, retries back off, recovery is prompt.

Each fault gets its own environment (and token, and HimitsuSecret refreshing every 5 s),
so several faults run side by side in one window and the stand-in's request log tells
them apart. When a fault starts, the environment also gets new values: every answer
would carry a body (a trickle needs one to trickle), and recovery must bring the new
data, not merely a 304. Throughout the fault:

* the target keeps its last good data byte for byte, and its resourceVersion (nothing
  rewrote it, not even with the same bytes);
* the HimitsuSecret reports Ready=False FetchFailure with a message that says what went
  wrong in our own words (status, deadline), never a byte of the body;
* the stand-in sees at most the requests the backoff schedule allows: the reconciler's
  1 s doubling, capped at the refresh interval, one request per attempt (the client
  retries nothing on its own: one layer owns the retries), and at least two (the
  operator keeps trying).

After the fault: Ready with the new data within one refresh interval plus slack.
A 429 is different: Retry-After is a promise to keep, so no request for that source may
reach the stand-in before it has elapsed, and then no burst.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import pytest

from himitsu_controller.api import ANN_FORCE_SYNC

from .faultkit import env_seconds, hold
from .harness import Harness, Sync
from .kubehelp import KubeApi, hsec_path, is_ready, ready, rv, wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.local_only, pytest.mark.faults,
              pytest.mark.usefixtures("default_operator")]

REFRESH = "5s"
REFRESH_SECONDS = 5.0
FAULT_SECONDS = env_seconds("FAULTS_HIMITSU_SECONDS", 12.0)
RETRY_AFTER = int(env_seconds("FAULTS_RETRY_AFTER", 6))
# The Himitsu client's overall deadline per fetch, and its attempts per fetch (no retry
# of its own: the reconcile's backoff owns them): HimitsuClient's defaults, which the
# operator uses.
CLIENT_DEADLINE = 30.0
ATTEMPTS_PER_FETCH = 1
SLACK = 10.0


@dataclass(frozen=True)
class Fault:
    label: str
    options: dict[str, Any]
    says: tuple[str, ...]  # the message names one of these
    never_says: tuple[str, ...] = ()
    fewest_requests: int = 2  # the operator keeps trying: this many at least


QUICK = (
    Fault("5xx", {"kind": "error", "status": 503}, ("503",)),
    Fault("reset", {"kind": "reset"}, ("connection",)),
    Fault("garbage", {"kind": "garbage", "status": 502}, ("502",), ("<html", "<h1>")),
    Fault("wrong shape", {"kind": "wrong_shape"}, ("200",), ("NOT", "A_MAP")),
)
# Count-limited. Each delayed request trips the read timeout (one fetch each, the second
# the reconcile's retry); the trickled 200 runs into the deadline.
SLOW = (
    Fault("timeout", {"kind": "delay", "seconds": CLIENT_DEADLINE + 10, "count": 2},
          ("deadline", "timed out")),
    Fault("trickle", {"kind": "trickle", "bytes_per_second": 1, "count": 1}, ("deadline",),
          fewest_requests=1),  # a deadline is not retried within the fetch
)


def max_attempts(window: float, *, refresh: float) -> int:
    """Reconcile attempts that fit in ``window`` s: a first one, then retries after 1, 2,
    4 ... s, each delay capped at min(refresh, 300 s) (the design's failure backoff)."""
    cap = min(refresh, 300.0)
    attempts, elapsed, delay = 1, 0.0, 1.0
    while elapsed + min(delay, cap) <= window:
        elapsed += min(delay, cap)
        attempts += 1
        delay *= 2
    return attempts


@dataclass
class Victim:
    fault: Fault
    sync: Sync
    before: dict[str, Any]
    new_values: dict[str, str] = field(default_factory=dict)
    mark: int = 0
    message: str = ""


def _arm(h: Harness, ns: str, faults: tuple[Fault, ...], *,
         refresh: str = REFRESH) -> list[Victim]:
    victims = []
    for index, fault in enumerate(faults):
        sync = h.sync(ns, "API_KEY", "DB_PASSWORD", name=f"v{index}",
                      target=f"v{index}-secrets", refresh=refresh, auth_name=f"v{index}-token")
        victims.append(Victim(fault, sync, h.wait_data(ns, sync.target, sync.values)))
    for victim in victims:
        victim.mark = h.standin.mark(victim.sync.env)
        h.standin.fault(env=victim.sync.env, **victim.fault.options)
        victim.new_values = h.canary.values("API_KEY", "DB_PASSWORD")
        h.standin.set_secrets(victim.sync.env, victim.new_values)
    return victims


def _unchanged(kube: KubeApi, victims: list[Victim]) -> str | None:
    for victim in victims:
        now = kube.secret(victim.sync.namespace, victim.sync.target)
        if now is None:
            return f"{victim.fault.label}: the target is gone"
        if now.get("data") != victim.before.get("data") or rv(now) != rv(victim.before):
            return f"{victim.fault.label}: the target changed (resourceVersion {rv(now)})"
    return None


def _all_failing(h: Harness, victims: list[Victim]) -> bool:
    """Every victim reports FetchFailure and has made the fewest requests its fault allows
    (a victim can fail on its first request: the hold must not end before its retries)."""
    for victim in victims:
        if not victim.message:
            obj = h.kube.hsec(victim.sync.namespace, victim.sync.name)
            if is_ready(obj, reason="FetchFailure"):
                victim.message = str((ready(obj) or {}).get("message", ""))
    return all(victim.message and len(h.standin.requests_after(victim.sync.env, victim.mark))
               >= victim.fault.fewest_requests for victim in victims)


def _check_during(h: Harness, victims: list[Victim], *, started: float, ended: float,
                  refresh: float = REFRESH_SECONDS) -> None:
    window = ended - started
    bound = ATTEMPTS_PER_FETCH * max_attempts(window, refresh=refresh) + 1
    for victim in victims:
        label, message = victim.fault.label, victim.message
        assert any(word in message for word in victim.fault.says), (label, message)
        assert not any(word in message for word in victim.fault.never_says), (label, message)
        sent = [r for r in h.standin.requests_after(victim.sync.env, victim.mark)
                if r["time"] <= ended]
        fewest = victim.fault.fewest_requests
        assert fewest <= len(sent) <= bound, (
            f"{label}: {len(sent)} requests in {window:.1f} s; the backoff allows "
            f"{fewest}..{bound}")


def _check_recovered(h: Harness, victims: list[Victim], *, timeout: float) -> None:
    for victim in victims:
        sync = victim.sync
        h.wait_ready(sync.namespace, sync.name, timeout=timeout)
        h.wait_data(sync.namespace, sync.target, victim.new_values, timeout=SLACK)


def test_errors_resets_and_garbage_keep_the_secret_and_back_off(h: Harness, ns: str,
                                                                kube: KubeApi) -> None:
    victims = _arm(h, ns, QUICK)
    started = time.time()
    try:
        hold(lambda: _unchanged(kube, victims), seconds=FAULT_SECONDS,
             until=lambda: _all_failing(h, victims), limit=FAULT_SECONDS + 60,
             what="the targets while Himitsu fails")
    finally:
        ended = time.time()
        h.standin.clear_faults()
    _check_during(h, victims, started=started, ended=ended)
    _check_recovered(h, victims, timeout=REFRESH_SECONDS + SLACK)


def test_hung_and_trickling_answers_hit_the_deadline_and_keep_the_secret(
        h: Harness, ns: str, kube: KubeApi) -> None:
    # No timed poll may take the count-limited faults (a 304 has no body to trickle):
    # an hourly refresh, and a force-sync starts the one fetch the faults cover.
    victims = _arm(h, ns, SLOW, refresh="1h")
    started = time.time()
    for victim in victims:
        kube.merge_patch(hsec_path(ns, victim.sync.name),
                         {"metadata": {"annotations": {ANN_FORCE_SYNC: str(started)}}})
    try:
        hold(lambda: _unchanged(kube, victims), seconds=0,
             until=lambda: _all_failing(h, victims), limit=2 * CLIENT_DEADLINE + SLACK,
             what="the targets while Himitsu hangs")
    finally:
        ended = time.time()
        h.standin.clear_faults()
    _check_during(h, victims, started=started, ended=ended, refresh=3600.0)
    # Each fault covered exactly one fetch, which ended with the failure just seen; the
    # retry after it (1 s) is well within the slack.
    _check_recovered(h, victims, timeout=SLACK)


def test_429_retry_after_is_honoured_without_a_burst(h: Harness, ns: str,
                                                     kube: KubeApi) -> None:
    # Three HimitsuSecrets read one source; each would poll every ~2 s on its own.
    env, values = h.environment("API_KEY")
    h.token_secret(ns, h.token_for(env))
    names = ("a", "b", "c")
    for name in names:
        h.hsec(ns, name, env, target=f"{name}-secrets", refresh="2s")
    before = {name: h.wait_data(ns, f"{name}-secrets", values) for name in names}
    mark = h.standin.mark(env)
    h.standin.fault("rate_limit", env=env, retry_after=RETRY_AFTER, count=1)

    refused = wait_for(lambda: next((r for r in h.standin.requests_after(env, mark)
                                     if r["status"] == 429), None),
                       timeout=30, what="the stand-in to answer 429")
    until = float(refused["time"]) + RETRY_AFTER

    said: set[str] = set()

    def unchanged() -> str | None:
        for name in names:
            now = kube.secret(ns, f"{name}-secrets")
            if now is None or rv(now) != rv(before[name]):
                return f"target {name}-secrets changed while rate limited"
            obj = kube.hsec(ns, name)
            if is_ready(obj, reason="FetchFailure"):
                said.add(str((ready(obj) or {}).get("message", "")))
        return None

    # Watch the Retry-After pass, and one refresh interval beyond it.
    hold(unchanged, seconds=max(0.0, until + 2.0 - time.time()),
         what="the targets while rate limited")
    assert any(f"rate limited by the Himitsu API, retrying in {RETRY_AFTER} s" in m
               for m in said), said

    after = [r for r in h.standin.requests_after(env, mark) if r["time"] > refused["time"]]
    early = [round(r["time"] - refused["time"], 2) for r in after if r["time"] < until]
    assert not early, f"requests {early} s after a 429 with Retry-After: {RETRY_AFTER}"
    assert after, "nothing was asked after Retry-After elapsed"
    burst = [r for r in after if r["time"] < float(after[0]["time"]) + 1.0]
    assert len(burst) <= len(names), f"{len(burst)} requests in the second after Retry-After"
    for name in names:
        h.wait_ready(ns, name, timeout=REFRESH_SECONDS + SLACK)

