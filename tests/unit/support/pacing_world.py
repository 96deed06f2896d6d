"""A simulated-clock world for pacing: the real reconciler, SharedPoller, Pacer and
HimitsuClient against the Himitsu stand-in's own core (its fixed per-key windows, its
``RateLimit-*`` headers, its 429s), with ``responses`` carrying each request to it.

A heap of wake times stands in for the workqueue (``requeue_after`` becomes a wake), so
every reconcile attempt is counted and nothing really waits: the client's deadline,
the pacer, the poller and the stand-in's windows all read one simulated clock. Another
client of the same key is a scheduled burst of direct requests to the stand-in.
"""

from __future__ import annotations

import heapq
import itertools
import math
import re
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import requests
import responses
from fakes import FakeKube, b64
from reconcile_world import API, NS, PROJECT, T0, TOKEN, make_hsec

from himitsu_controller import himitsu
from himitsu_controller.runtime.controller import Result
from himitsu_controller.sync.polling.pacing import Pacer
from himitsu_controller.sync.polling.polls import SharedPoller
from himitsu_controller.sync.reconciler import HimitsuSecretReconciler

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "hack"))
from himitsu_standin import Himitsu
from himitsu_standin.wire import Inbound

OTHER_AGENT = "another-client/1.0"


def env_id(i: int) -> str:
    return f"22222222-2222-2222-2222-{i:012d}"


@dataclass(frozen=True)
class Sent:
    at: float  # simulated seconds since T0
    status: int
    ours: bool  # the operator's (else the other client's)
    reset: float | None = None  # RateLimit-Reset: seconds left in the server's window


@dataclass
class Trace:
    sent: list[Sent] = field(default_factory=list)
    reconciles: int = 0
    failures: list[tuple[float, str, Result]] = field(default_factory=list)
    polls: dict[str, list[float]] = field(default_factory=dict)  # requests per source

    def ours(self) -> list[Sent]:
        return [s for s in self.sent if s.ours]


class PacingWorld:
    """``count`` HimitsuSecrets, each reading its own environment with one token (so
    none share a poll and all share the key's budget), created at t=0."""

    def __init__(self, count: int, *, refresh: str = "10s", pacer: dict[str, Any] | None = None,
                 per_key_limit: int = 120) -> None:
        self.us = 0
        self.trace = Trace()
        self.server = Himitsu(per_key_limit=per_key_limit, per_ip_limit=300, window=60.0,
                              clock=self.epoch)
        self.server.add_token(project=PROJECT, token=TOKEN)
        self.kube = FakeKube()
        self.kube.put_secret({"metadata": {"namespace": NS, "name": "himitsu-token"},
                              "data": {"token": b64(TOKEN)}})
        self.names = [f"reader-{i}" for i in range(count)]
        self._env_of: dict[str, str] = {}
        for i, name in enumerate(self.names):
            self.server.set_secrets(PROJECT, env_id(i), {"VALUE": f"v{i}"})
            self._env_of[env_id(i)] = name
            obj = make_hsec(refreshInterval=refresh, environmentId=env_id(i))
            obj["metadata"]["name"] = name
            obj["spec"]["target"]["name"] = name
            self.kube.add_himitsu_secret(obj)
        self.pacer = Pacer(clock=self.epoch, **(pacer or {}))
        self.client = himitsu.HimitsuClient(clock=self.epoch, pacing=self.pacer)
        self.poller = SharedPoller(self.client, clock=self.epoch, pacer=self.pacer,
                                   rng=lambda: 0.5)
        self.reconciler = HimitsuSecretReconciler(self.kube, self.poller, now=self.now,
                                                  rng=lambda: 0.5)
        self._wakes: list[tuple[int, int, str]] = []
        self._pending: dict[str, tuple[int, int]] = {}
        self._seq = itertools.count()
        self._bursts: list[tuple[int, int, int]] = []  # (at_us, seq, count)
        for name in self.names:
            self._wake(name, 0)

    # -- the clock --------------------------------------------------------------------------
    @property
    def t(self) -> float:
        return self.us / 1e6

    def now(self) -> datetime:
        return T0 + timedelta(microseconds=self.us)

    def epoch(self) -> float:
        return self.now().timestamp()

    # -- the other client -------------------------------------------------------------------
    def burst_at(self, at: float, count: int) -> None:
        """Another client spends ``count`` requests of the same key at ``at``."""
        heapq.heappush(self._bursts, (math.ceil(at * 1e6), next(self._seq), count))

    def window_end(self) -> float:
        """When the server's current window of the key ends, by its last answer to us."""
        last = next(s for s in reversed(self.trace.sent) if s.ours and s.reset is not None)
        assert last.reset is not None
        return last.at + last.reset

    def _burst(self, count: int) -> None:
        for _ in range(count):
            answer = self.server.serve_api(Inbound(
                method="GET", path=_runtime_path(env_id(0)), client_ip="127.0.0.2",
                token=TOKEN, user_agent=OTHER_AGENT))
            self.trace.sent.append(Sent(self.t, answer.status, ours=False))

    # -- the run ----------------------------------------------------------------------------
    @contextmanager
    def wired(self) -> Iterator[None]:
        with responses.RequestsMock(assert_all_requests_are_fired=False) as mock:
            mock.add_callback(responses.GET, re.compile(re.escape(API) + "/.*"),
                              callback=self._answer)
            yield

    def run_until(self, end: float) -> None:
        end_us = math.ceil(end * 1e6)
        with self.wired():
            while True:
                wake = self._wakes[0][0] if self._wakes else math.inf
                burst = self._bursts[0][0] if self._bursts else math.inf
                if min(wake, burst) > end_us:
                    break
                if burst <= wake:
                    at, _, count = heapq.heappop(self._bursts)
                    self.us = max(self.us, at)
                    self._burst(count)
                    continue
                at, seq, key = heapq.heappop(self._wakes)
                if self._pending.get(key, (0, -1))[1] != seq:
                    continue
                del self._pending[key]
                self.us = max(self.us, at)
                self.trace.reconciles += 1
                result = self.reconciler.reconcile(f"{NS}/{key}")
                if result.error is not None:
                    self.trace.failures.append((self.t, key, result))
                assert result.requeue_after is not None, f"{key} got no timed requeue"
                self._wake(key, self.us + math.ceil(result.requeue_after * 1e6) + 1)
        self.us = max(self.us, end_us)

    def ready(self, name: str) -> bool:
        conditions = self.kube.status(NS, name).get("conditions") or [{}]
        return bool(conditions[0].get("status") == "True")

    def _wake(self, key: str, at_us: int) -> None:
        pending = self._pending.get(key)
        if pending is not None and pending[0] <= at_us:
            return
        seq = next(self._seq)
        self._pending[key] = (at_us, seq)
        heapq.heappush(self._wakes, (at_us, seq, key))

    def _answer(self, request: requests.PreparedRequest) -> tuple[int, dict[str, str], bytes]:
        scheme, _, credential = str(request.headers.get("Authorization", "")).partition(" ")
        path = urlsplit(str(request.url)).path
        answer = self.server.serve_api(Inbound(
            method="GET", path=path, client_ip="127.0.0.1",
            token=credential if scheme.lower() == "bearer" else None,
            if_none_match=request.headers.get("If-None-Match"),
            user_agent=request.headers.get("User-Agent")))
        reset = answer.headers.get("RateLimit-Reset")
        self.trace.sent.append(Sent(self.t, answer.status, ours=True,
                                    reset=float(reset) if reset is not None else None))
        env = path.split("/")[6]
        self.trace.polls.setdefault(self._env_of[env], []).append(self.t)
        return answer.status, dict(answer.headers), answer.body


def _runtime_path(env: str) -> str:
    return f"/api/v1/projects/{PROJECT}/environments/{env}/secrets/runtime"


def most_in_any_window(times: list[float], window: float = 60.0) -> int:
    """The most of ``times`` that one window [a, a + window) holds, over every a."""
    times = sorted(times)
    best, lo = 0, 0
    for hi, t in enumerate(times):
        while t - times[lo] >= window:
            lo += 1
        best = max(best, hi - lo + 1)
    return best
