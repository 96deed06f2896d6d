"""Poll sharing and change propagation, proven by a deterministic simulation.

The schedule promises are emergent: they come from the reconciler's timing rules
(``_next_due``, ``_window``, ``_woken_idle``, ``_defer_after_restart``) and the shared
poller's cache acting together over many rounds, so no single-reconcile test can show
them. Here the real reconciler and the real ``SharedPoller`` run against a simulated
clock: a heap of wake times stands in for the workqueue (``requeue_after`` becomes a
wake, a target write becomes a watch echo), every status patch and Secret write costs a
random slice of simulated time, and a fake Himitsu answers 304/200 by a version that
bumps at random moments. No threads, no sleeps; each seed replays exactly.

A refresh round is 0.9..1.0 of refreshInterval long (the 10% jitter), so "one request
per source per round" is checked on the gaps between consecutive requests: never two in
one round (gap >= 0.9 interval), never a round skipped (gap <= interval + backlog).
"""

from __future__ import annotations

import functools
import heapq
import itertools
import math
import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import pytest
from fakes import FakeKube, b64, unb64
from reconcile_world import NS, TOKEN, SimClock, make_hsec

from himitsu_controller import api, himitsu
from himitsu_controller.sync.polling.polls import LocallyRateLimited, SharedPoller
from himitsu_controller.sync.polling.schedule import JITTER
from himitsu_controller.sync.reconciler import HimitsuSecretReconciler

TOKEN_B = "himi_0123456789abcdef_" + "B" * 43
EPS = 1e-6  # float slack when comparing moments computed in epoch seconds
INTERVAL = 10.0  # the refreshInterval of most scenarios, seconds


@dataclass(frozen=True)
class Reader:
    """One HimitsuSecret of the simulation (all read the same API URL, project, env)."""

    name: str
    interval: float
    token: str = TOKEN
    start: float = 0.0  # when it is created (first reconcile), simulated seconds


@dataclass(frozen=True)
class Answer:
    at: float  # the reconcile that used it
    answered: float  # when Himitsu gave it (the request's moment)
    timed: bool  # the wake was the reader's own timed requeue


@dataclass
class Trace:
    """Everything observable: requests per token, answers and target writes per reader."""

    requests: dict[str, list[float]] = field(default_factory=dict)
    full: dict[str, list[float]] = field(default_factory=dict)  # those answered 200
    answers: dict[str, list[Answer]] = field(default_factory=dict)
    writes: dict[str, list[tuple[float, int]]] = field(default_factory=dict)


class FakeHimitsu:
    """One environment per token whose version bumps at the given moments; 304 when the
    request names the current version. Records every request that reaches it."""

    def __init__(self, clock: SimClock, trace: Trace, bumps: Sequence[float]) -> None:
        self._clock, self._trace, self.bumps = clock, trace, sorted(bumps)

    def version(self, t: float) -> int:
        return 1 + sum(1 for bump in self.bumps if bump <= t)

    def fetch(
        self, *, api_url: str, project_id: str, environment_id: str, token: str,
        known_version: int | None,
    ) -> himitsu.FetchResult:
        self._trace.requests.setdefault(token, []).append(self._clock.t)
        version = self.version(self._clock.t)
        if known_version == version:
            return himitsu.NotModified(version=version)
        self._trace.full.setdefault(token, []).append(self._clock.t)
        tag = "b" if token == TOKEN_B else "a"
        return himitsu.Fetched(version=version, secrets={"VERSION": str(version), "TOKEN": tag})


class SimKube(FakeKube):
    """``FakeKube`` whose writes take simulated time and whose Secret writes echo back
    (the informer's watch event) as a wake of the HimitsuSecret that owns the target."""

    def __init__(self, sim: Simulation) -> None:
        super().__init__()
        self._sim = sim

    def patch_status(self, namespace: str, name: str, status: dict[str, Any], *,
                     uid: str = "") -> None:
        self._sim.spend()
        super().patch_status(namespace, name, status, uid=uid)

    def create_secret(self, namespace: str, body: dict[str, Any]) -> dict[str, Any]:
        self._sim.spend()
        return self._sim.written(super().create_secret(namespace, body))

    def update_secret(self, namespace: str, body: dict[str, Any]) -> dict[str, Any]:
        self._sim.spend()
        return self._sim.written(super().update_secret(namespace, body))


class Simulation:
    """One operator process (restartable) over a FakeKube and a fake Himitsu.

    ``latency``: the most one status patch or Secret write costs (uniform from 0).
    ``early``: a timed wake may fire up to this much before its deadline (clock skew).
    ``shared=False``: a poller per reader, as if each were polled by its own process.
    """

    def __init__(
        self, readers: Sequence[Reader], *, seed: int, bumps: Sequence[float] = (),
        latency: float = 0.05, early: float = 0.0, shared: bool = True,
    ) -> None:
        self.rng = random.Random(seed)
        self.readers = {r.name: r for r in readers}
        self.latency, self.early = latency, early
        self.clock = SimClock()
        self.trace = Trace()
        self.himitsu = FakeHimitsu(self.clock, self.trace, bumps)
        self.kube = SimKube(self)
        for secret, token in (("token-a", TOKEN), ("token-b", TOKEN_B)):
            self.kube.put_secret({"metadata": {"namespace": NS, "name": secret},
                                  "data": {"token": b64(token)}})
        for reader in readers:
            obj = make_hsec(refreshInterval=f"{reader.interval:g}s", authSecretRef={
                "name": "token-b" if reader.token == TOKEN_B else "token-a"})
            obj["metadata"]["name"] = reader.name
            obj["spec"]["target"]["name"] = reader.name
            self.kube.add_himitsu_secret(obj)
        self._wakes: list[tuple[int, int, str]] = []
        self._pending: dict[str, tuple[int, int, str]] = {}  # key -> (at, seq, reason)
        self._seq = itertools.count()
        self._reason = ""
        self._current = ""
        self._shared = shared
        self._pollers: dict[str, SharedPoller] = {}
        self.reconciler = HimitsuSecretReconciler(
            self.kube, self, now=self.clock.now, rng=self.rng.random)
        for reader in readers:
            self._wake(reader.name, self._us(reader.start), "created")

    # -- the process ------------------------------------------------------------------

    def restart(self) -> None:
        """A new process: no memory, no queued wakes, fresh pollers; every key is listed
        by the informer at once."""
        self._wakes.clear()
        self._pending.clear()
        self._pollers.clear()
        self._shared = True
        self.reconciler = HimitsuSecretReconciler(
            self.kube, self, now=self.clock.now, rng=self.rng.random)
        for name in self.readers:
            self._wake(name, self.clock.us, "restart")

    def run_until(self, end: float) -> None:
        end_us = self._us(end)
        rounds = (end - self.clock.t) / min(r.interval for r in self.readers.values()) + 2
        budget = int(4 * rounds * len(self.readers))  # a poll and an echo per round, twice
        while self._wakes and self._wakes[0][0] <= end_us:
            budget -= 1
            if budget < 0:
                last = self.trace.answers.get(self._current, [])[-3:]
                pytest.fail(f"livelock: {self._current} still reconciling at "
                            f"{self.clock.t:.6f} s; its last answers: {last}")
            at, seq, key = heapq.heappop(self._wakes)
            if self._pending.get(key, (0, -1, ""))[1] != seq:
                continue  # superseded by an earlier wake
            _, _, self._reason = self._pending.pop(key)
            self.clock.us = max(self.clock.us, at)
            self._current = key
            result = self.reconciler.reconcile(f"{NS}/{key}")
            assert result.error is None, (key, result, self.kube.status(NS, key))
            assert result.requeue_after is not None, f"{key} got no timed requeue"
            skew = self.rng.uniform(0, self.early)
            # A timer never fires before its deadline (1 us keeps float rounding honest);
            # ``early`` models a wall clock that moved relative to the queue's clock.
            self._wake(key, self.clock.us + math.ceil((result.requeue_after - skew) * 1e6) + 1,
                       "timer")
        self.clock.us = max(self.clock.us, end_us)

    # -- the Fetcher the reconciler sees (records what each reader was answered) -----

    def fetch(
        self, *, api_url: str, project_id: str, environment_id: str, token: str,
        known_version: int | None, max_age: float = 0.0, reader: str | None = None,
    ) -> himitsu.FetchResult:
        poller_key = "shared" if self._shared else self._current
        poller = self._pollers.get(poller_key)
        if poller is None:
            poller = self._pollers[poller_key] = SharedPoller(
                self.himitsu, clock=self.clock.epoch, rng=self.rng.random)
        try:
            result = poller.fetch(
                api_url=api_url, project_id=project_id, environment_id=environment_id,
                token=token, known_version=known_version, max_age=max_age, reader=reader)
        except LocallyRateLimited:  # a request too many: the promises below are broken
            pytest.fail(f"{self._current} at {self.clock.t:.3f}: request pace exceeded")
        self.trace.answers.setdefault(self._current, []).append(Answer(
            at=self.clock.t, answered=self.clock.t - result.age, timed=self._reason == "timer"))
        return result

    def remembered(
        self, *, api_url: str, project_id: str, environment_id: str, token: str,
    ) -> himitsu.Fetched | None:
        poller = self._pollers.get("shared" if self._shared else self._current)
        return None if poller is None else poller.remembered(
            api_url=api_url, project_id=project_id, environment_id=environment_id,
            token=token)

    def release(self, reader: str) -> None:
        for poller in self._pollers.values():
            poller.release(reader)

    # -- hooks for SimKube -----------------------------------------------------------

    def spend(self) -> None:
        self.clock.us += self._us(self.rng.uniform(0, self.latency))

    def written(self, secret: dict[str, Any]) -> dict[str, Any]:
        """Record a target write; each reader's target is named after it."""
        name = secret["metadata"]["name"]
        version = int(secret["metadata"]["annotations"][api.ANN_CONFIG_VERSION])
        self.trace.writes.setdefault(name, []).append((self.clock.t, version))
        self._wake(name, self.clock.us + self._us(self.rng.uniform(0.001, 0.02)), "echo")
        return secret

    # -- helpers ----------------------------------------------------------------------

    def backlog(self) -> float:
        """The most queueing and processing can delay a poll: every other key ahead of
        it once (the queue holds a key once), each paying a write and a status patch."""
        return 2 * len(self.readers) * self.latency + 0.001

    def _wake(self, key: str, at_us: int, reason: str) -> None:
        """The workqueue's add_after: one pending wake per key, the earliest wins."""
        pending = self._pending.get(key)
        if pending is not None and pending[0] <= at_us:
            return
        seq = next(self._seq)
        self._pending[key] = (at_us, seq, reason)
        heapq.heappush(self._wakes, (at_us, seq, key))

    @staticmethod
    def _us(seconds: float) -> int:
        return math.ceil(seconds * 1e6)


# -- the promises, as checks over a trace ------------------------------------------------


def assert_one_request_per_round(
    sim: Simulation, *, since: float, until: float, token: str = TOKEN,
    interval: float = INTERVAL,
) -> None:
    """From ``since`` on: never two requests in one round, never a round without one.

    Counted from a round after the last reader's first sync at the earliest: a first sync
    takes only an answer seconds old (schedule.FRESH), so readers created apart each ask
    Himitsu once, and the group meets on one answer in the rounds after."""
    first_syncs = [answers[0].at for answers in sim.trace.answers.values() if answers]
    since = max([since, *(t + interval for t in first_syncs)])
    times, slack = sorted(sim.trace.requests[token]), sim.backlog()
    after = [i for i, t in enumerate(times) if t >= since]
    assert after, f"no request after {since:.3f} s"
    for i in after:
        if i == 0:
            continue
        gap = times[i] - times[i - 1]
        assert gap >= (1 - JITTER) * interval - EPS, (
            f"two requests in one round: at {times[i - 1]:.3f} s and {times[i]:.3f} s")
        assert gap <= interval + slack, (
            f"a round without a request: {times[i - 1]:.3f} s to {times[i]:.3f} s")
    assert until - times[-1] <= interval + slack, f"no request after {times[-1]:.3f} s"


def assert_changes_arrive_within_an_interval(sim: Simulation, *, until: float) -> None:
    """Every bump at c is in every reader's target by c + refreshInterval + backlog."""
    slack = sim.backlog()
    for name, reader in sim.readers.items():
        writes = sim.trace.writes.get(name, [])
        versions = [v for _, v in writes]
        assert versions == sorted(versions), f"{name}'s target went back: {writes}"
        for bump in sim.himitsu.bumps:
            deadline = bump + reader.interval + slack
            if deadline > until:
                continue
            wanted = sim.himitsu.version(bump)
            arrived = next((t for t, v in writes if v >= wanted), math.inf)
            assert arrived <= deadline, (
                f"{name} (every {reader.interval:g} s): version {wanted} from {bump:.3f} s "
                f"arrived at {arrived:.3f} s, due by {deadline:.3f} s; writes {writes}")


def assert_answers_advance(sim: Simulation) -> None:
    """A timed poll never takes the reader's own previous answer (or any older one)."""
    for name, answers in sim.trace.answers.items():
        for before, after in itertools.pairwise(answers):
            assert after.answered >= before.answered - EPS, (
                f"{name} went back to an older answer: {before} then {after}")
            if after.timed:
                assert after.answered > before.answered + EPS, (
                    f"{name}'s timed poll at {after.at:.6f} s reused its answer of "
                    f"{before.answered:.6f} s (previous poll at {before.at:.6f} s)")


# -- scenarios --------------------------------------------------------------------------

SEEDS = range(5)


def readers(rng: random.Random, count: int, *, interval: float = INTERVAL,
            token: str = TOKEN, prefix: str = "reader") -> list[Reader]:
    """``count`` readers created at random moments over one whole interval."""
    return [Reader(f"{prefix}-{i}", interval, token, start=rng.uniform(0, interval))
            for i in range(count)]


def bumps(rng: random.Random, count: int, *, until: float) -> list[float]:
    return sorted(rng.uniform(0, until) for _ in range(count))


@functools.cache
def drifted_then_restarted(
    seed: int, *, count: int = 6, latency: float | None = None, early: float = 0.0,
) -> tuple[Simulation, float, float]:
    """Readers that polled on their own (nothing shared, so their polls spread over a
    whole interval), then an operator restart at a random moment that shares from then
    on; Himitsu changes four times meanwhile. Returns the simulation, the restart moment
    and the end of the run (cached: several promises are read off the same runs)."""
    rng = random.Random(seed)
    until = 10 * INTERVAL
    sim = Simulation(
        readers(rng, count), seed=seed, bumps=bumps(rng, 4, until=until), shared=False,
        latency=0.01 + seed % 4 * 0.03 if latency is None else latency, early=early)
    restart = rng.uniform(INTERVAL, 2 * INTERVAL)
    sim.run_until(restart)
    sim.restart()
    sim.run_until(until)
    return sim, restart, until


@pytest.mark.parametrize("seed", SEEDS)
def test_readers_created_apart_converge_to_one_request_per_round(seed: int) -> None:
    sim = Simulation(readers(random.Random(seed), 6), seed=seed)
    sim.run_until(10 * INTERVAL)
    assert_one_request_per_round(sim, since=2 * INTERVAL, until=10 * INTERVAL)


@pytest.mark.parametrize("seed", SEEDS)
def test_readers_drifted_apart_converge_within_two_rounds_of_a_restart(seed: int) -> None:
    sim, restart, until = drifted_then_restarted(seed)
    assert_one_request_per_round(sim, since=restart + 2 * INTERVAL, until=until)


@pytest.mark.parametrize("seed", SEEDS)
def test_a_restart_keeps_converged_readers_at_one_request_per_round(seed: int) -> None:
    rng = random.Random(seed)
    sim = Simulation(readers(rng, 6), seed=seed)
    sim.run_until(rng.uniform(3 * INTERVAL, 4 * INTERVAL))
    sim.restart()
    sim.run_until(10 * INTERVAL)
    assert_one_request_per_round(sim, since=2 * INTERVAL, until=10 * INTERVAL)


@pytest.mark.parametrize("seed", SEEDS)
def test_a_restart_with_targets_in_sync_reads_no_secret_again(seed: int) -> None:
    # A rollout or a failover: a fresh poller holds nothing, yet every first poll is
    # conditional on the version the target holds, so Himitsu answers 304s only (no
    # secret material on the wire, no secret.read audit event per source).
    rng = random.Random(seed)
    group = readers(rng, 4, prefix="a") + readers(rng, 4, token=TOKEN_B, prefix="b")
    sim = Simulation(group, seed=seed)
    sim.run_until(rng.uniform(3 * INTERVAL, 4 * INTERVAL))
    restart = sim.clock.t
    sim.restart()
    sim.run_until(10 * INTERVAL)
    for token in (TOKEN, TOKEN_B):
        assert [t for t in sim.trace.full[token] if t >= restart] == []
        assert any(t >= restart for t in sim.trace.requests[token])


@pytest.mark.parametrize("seed", range(3))
def test_polls_running_late_behind_a_backlog_still_share_one_request_per_round(
    seed: int,
) -> None:
    # 16 readers whose status patches take up to 0.8 s: the last of a round runs some
    # 6 s late, past half an interval, and must still take the round's answer.
    sim = Simulation(readers(random.Random(seed), 16), seed=seed, latency=0.8)
    sim.run_until(10 * INTERVAL)
    assert_one_request_per_round(sim, since=2 * INTERVAL, until=10 * INTERVAL)


@pytest.mark.parametrize("seed", range(10))
def test_a_change_reaches_every_target_within_one_interval(seed: int) -> None:
    sim, _, until = drifted_then_restarted(seed)
    assert_changes_arrive_within_an_interval(sim, until=until)


@pytest.mark.parametrize("seed", SEEDS)
def test_a_timed_poll_never_reuses_the_readers_own_answer(seed: int) -> None:
    # Heavy processing (up to 0.2 s a write): polls run late, which widens their window.
    sim, _, _ = drifted_then_restarted(seed, count=8, latency=0.2)
    assert_answers_advance(sim)


@pytest.mark.parametrize("seed", range(2))
def test_a_timed_poll_woken_just_before_its_due_time_never_reuses_its_own_answer(
    seed: int,
) -> None:
    # _woken_idle takes a wake within DUE_SLACK of the due time as the poll; _window must
    # too, or it allows any answer as recent as the held one: the reader's own.
    sim, _, _ = drifted_then_restarted(seed, early=0.01)  # timers up to 10 ms early
    assert_answers_advance(sim)


@pytest.mark.parametrize("seed", SEEDS)
def test_different_tokens_never_share(seed: int) -> None:
    rng = random.Random(seed)
    group = readers(rng, 4, prefix="a") + readers(rng, 4, token=TOKEN_B, prefix="b")
    sim = Simulation(group, seed=seed)
    sim.run_until(10 * INTERVAL)
    for token in (TOKEN, TOKEN_B):  # so two requests per round, one per token
        assert_one_request_per_round(sim, since=2 * INTERVAL, until=10 * INTERVAL, token=token)
    for reader in group:
        tag = "b" if reader.token == TOKEN_B else "a"
        assert unb64(sim.kube.secret(NS, reader.name)["data"])["TOKEN"] == tag, reader


@pytest.mark.parametrize("seed", range(4))
def test_readers_at_10s_and_60s_on_one_source_each_keep_their_bounds(seed: int) -> None:
    rng = random.Random(seed)
    until = 360.0
    group = readers(rng, 4, prefix="fast") + readers(rng, 4, interval=60.0, prefix="slow")
    sim = Simulation(group, seed=seed, bumps=bumps(rng, 6, until=until))
    sim.run_until(until)
    # The 60 s readers always find an answer from the 10 s readers' last round: they
    # add no request, and still see every change within their own 60 s.
    assert_one_request_per_round(sim, since=2 * INTERVAL, until=until)
    assert_changes_arrive_within_an_interval(sim, until=until)
    assert_answers_advance(sim)
