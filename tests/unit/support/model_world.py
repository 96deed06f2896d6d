"""The world of the model-based test: one simulated clock, an in-memory Kubernetes and
Himitsu, and an operator process built from the REAL parts, driven on one thread.

The process is what ``cli.run`` builds, minus threads and sockets: the real
``Informer``s (their stores, their event dispatch, listing at start) fed from the
apiserver's change log after a simulated lag; the real handlers wired by
``watches.wire_events``; the real ``KubeClient`` over ``ModelRest``; the real
``HimitsuClient`` over a session answered by ``ModelHimitsu``; the real ``SharedPoller``,
``HimitsuSecretReconciler``, ``RateLimitingQueue`` and ``Controller``. The worker loop is
the controller's own ``_worker`` body run single-threaded: take a key with
``queue.get(timeout=0)``, ``Controller._process`` it (the real Result -> queue mapping),
``queue.done``. Time only moves when something costs it (a request's latency) or when
the loop jumps to the next timer or informer delivery; every run with the same seed
replays exactly.

A restart throws the whole process away (memory, queue, caches, pollers, token cache)
and builds a new one over the same apiserver and Himitsu, as a rollout or a failover
does. The oracle (model_checks.py) watches every write and every Himitsu answer.
"""

from __future__ import annotations

import base64
import random
import threading
from collections import deque
from typing import Any, cast

from model_checks import Oracle
from model_himitsu import ModelHimitsu, session_for
from model_kube import HSEC, SECRET, ApiServer, Change, Crash, ModelRest, matches
from reconcile_world import T0_EPOCH, SimClock

from himitsu_controller import api, cli, himitsu, kube, watches
from himitsu_controller.runtime.cache.informer import Informer
from himitsu_controller.runtime.client.rest import RestClient
from himitsu_controller.runtime.controller import Controller, Result
from himitsu_controller.runtime.resync import DEFAULT_PERIOD, Resync
from himitsu_controller.runtime.workqueue import RateLimitingQueue
from himitsu_controller.sync import summary
from himitsu_controller.sync.polling import polls
from himitsu_controller.sync.reconciler import HimitsuSecretReconciler

NS = "apps"
API_URL = "https://himitsu.example.com"
PROJECT = "11111111-1111-1111-1111-111111111111"
ENVS = {"e1": "22222222-2222-2222-2222-222222222222",
        "e2": "33333333-3333-3333-3333-333333333333"}
TOKENS = {"tok-a": "himi_000000000000000a_" + "A" * 43,
          "tok-b": "himi_000000000000000b_" + "B" * 43}
SECRET_SELECTOR = f"{api.LABEL_MANAGED}=true"
LOOP_BUDGET = 5000  # reconciles per run_until: more is a livelock


class Feed:
    """One informer's watch: the changes its selector lets through, delivered in order
    after a lag, as ADDED / MODIFIED / DELETED events to the informer's own handling."""

    def __init__(self, informer: Informer, resource: str, selector: str | None) -> None:
        self.informer = informer
        self.resource = resource
        self.selector = selector
        self.pending: deque[tuple[float, dict[str, Any], Change]] = deque()

    def offer(self, change: Change, at: float) -> None:
        if change.resource != self.resource:
            return
        was, now = matches(change.old, self.selector), matches(change.new, self.selector)
        if now:
            kind, obj = ("MODIFIED" if was else "ADDED"), change.new
        elif was and change.old is not None:
            kind, obj = "DELETED", dict(change.old)
            obj["metadata"] = {**obj["metadata"], "resourceVersion": str(change.rv)}
        else:
            return
        at = max(at, self.pending[-1][0]) if self.pending else at
        self.pending.append((at, {"type": kind, "object": obj}, change))

    def due(self) -> float | None:
        return self.pending[0][0] if self.pending else None

    def deliver(self, now: float) -> list[Change]:
        delivered = []
        while self.pending and self.pending[0][0] <= now:
            _, event, change = self.pending.popleft()
            self.informer._handle_event(event)
            delivered.append(change)
        return delivered


class Process:
    """One operator process, wired as ``cli.run`` wires it (one worker)."""

    def __init__(self, world: World) -> None:
        rest = cast(RestClient, world.rest)
        clock = world.clock.epoch
        self.hsecs = Informer(rest, kube.HIMITSU_SECRETS, name="himitsusecrets",
                              indexers={watches.TARGET_INDEX: watches.target_index,
                                        watches.AUTH_INDEX: kube.token_refs}, clock=clock,
                              transform=summary.himitsu_secret, shared=summary.SHARED)
        self.secrets = Informer(rest, kube.SECRETS, name="secrets",
                                label_selector=SECRET_SELECTOR, clock=clock,
                                transform=summary.secret, shared=summary.SHARED,
                                indexers={kube.OWNER_INDEX: kube.owner_uids})
        self.kube = kube.KubeClient(rest, himitsu_secrets=self.hsecs.store,
                                    secrets=self.secrets.store, clock=clock, instance="model",
                                    events=world)
        self.client = himitsu.HimitsuClient(
            session_factory=lambda: session_for(world.himitsu), clock=clock)
        self.poller = polls.SharedPoller(self.client, clock=clock, rng=world.rng.random)
        self.reconciler = HimitsuSecretReconciler(
            self.kube, self.poller, allowed_api_urls=[API_URL], now=world.clock.now,
            rng=world.rng.random)
        self.queue = RateLimitingQueue(cli.CONTROLLER_NAME, controller=cli.CONTROLLER_NAME,
                                       clock=clock)
        self.ctrl = Controller(cli.CONTROLLER_NAME, world.reconcile, workers=1, queue=self.queue)
        watches.forget_tokens_with_their_users(self.hsecs, self.kube)
        watches.wire_events(self.ctrl, self.hsecs, self.secrets)
        # cli's safety net at its default period (it never fires in a run this short: the
        # invariants must hold without it).
        self.resync = Resync(self.hsecs.store.keys, self.ctrl.enqueue_after,
                             period=DEFAULT_PERIOD, rng=world.rng.random)
        self.resync_at = clock() + self.resync.next_wait()
        self.feeds = [Feed(self.hsecs, HSEC, None), Feed(self.secrets, SECRET, SECRET_SELECTOR)]
        never = threading.Event()
        for informer in (self.hsecs, self.secrets):
            informer._list_and_replace(never)  # what Informer.run does first

    def timers(self) -> list[float]:
        """When the queue's delayed keys become ready (epoch seconds)."""
        with self.queue._lock:
            return [at for at, _ in self.queue._waiting_entry.values()]

    def resync_due(self, now: float) -> None:
        if now >= self.resync_at:
            self.resync.tick()
            self.resync_at = now + self.resync.next_wait()

    def wake_of(self, key: str) -> float | None:
        """When ``key`` will be handed to a worker: now if queued or processing, its
        timer if delayed, None if the queue holds nothing for it."""
        with self.queue._lock:
            if key in self.queue._dirty or key in self.queue._processing:
                return 0.0
            entry = self.queue._waiting_entry.get(key)
        return entry[0] if entry is not None else None


class World:
    """The apiserver, Himitsu, the oracle, and the current operator process."""

    def __init__(self, *, seed: int, kube_latency: float, himitsu_latency: float,
                 informer_lag: float) -> None:
        self.rng = random.Random(seed)
        self.clock = SimClock()
        self.informer_lag = informer_lag
        self.kube_latency = kube_latency
        self.events: list[tuple[str, str, str]] = []
        self.server = ApiServer(on_change=self._changed)
        self.himitsu = ModelHimitsu(
            now=lambda: self.clock.t, spend=self.clock.advance,
            latency=lambda: self.rng.uniform(0, himitsu_latency))
        self.oracle = Oracle(self)
        self.himitsu.on_answer = self.oracle.answered
        self.rest = ModelRest(self.server, auditor=self.oracle, spend=self._spend_kube)
        self.current: str | None = None  # the key being reconciled
        self.current_obj: dict[str, Any] | None = None  # ... as its reconcile read it
        self.results: list[tuple[float, str, Result]] = []
        self.process: Process | None = None
        for name, token in TOKENS.items():
            self.server.create(SECRET, NS, {"metadata": {"name": name}, "data": {
                "token": base64.b64encode(token.encode()).decode()}})
        self.himitsu.add_environment(ENVS["e1"], {"A": "a0", "B": "b0"})
        self.himitsu.add_environment(ENVS["e2"])  # empty: version 0
        self.himitsu.tokens = {t: frozenset(ENVS.values()) for t in TOKENS.values()}
        self.process = Process(self)

    # -- the operator's loop ------------------------------------------------------------

    def reconcile(self, key: str) -> Result:
        """The reconcile the controller calls: the real one, watched by the oracle."""
        assert self.process is not None
        self.current, self.current_obj = key, self.process.hsecs.store.get(key)
        self.oracle.reconcile_started(key)
        try:
            result = self.process.reconciler.reconcile(key)
        except Exception as exc:
            self.oracle.violation(f"raised: reconcile of {key} raised {type(exc).__name__}: {exc}")
            raise
        finally:
            self.oracle.reconcile_ended(key)
            self.current = self.current_obj = None
        self.results.append((self.clock.t, key, result))
        return result

    def run_until(self, end: float) -> None:
        """Run the process until simulated time ``end`` (seconds since T0)."""
        end_epoch = T0_EPOCH + end
        for _ in range(LOOP_BUDGET):
            self._deliver()
            self.server.collect_garbage()
            assert self.process is not None
            self.process.resync_due(self.clock.epoch())
            try:
                if self._work_one():
                    continue
            except Crash:  # SIGKILL after a write: a new process (or leader) takes over
                self.restart()
                continue
            process = self.process
            times = [*process.timers(), process.resync_at,
                     *(t for f in process.feeds if (t := f.due()) is not None)]
            if not times or min(times) > end_epoch:
                break
            if min(times) <= self.clock.epoch():  # due, yet nothing was handed out
                q = process.queue
                self.oracle.violation(
                    f"livelock: a timer is due but the queue hands out nothing: waiting "
                    f"{q._waiting_entry}, processing {q._processing}, dirty {q._dirty}")
                break
            self.clock.reach(min(times))
        else:
            self.oracle.violation(f"livelock: {LOOP_BUDGET} reconciles before {end:.3f} s; "
                                  f"last results {self.results[-5:]}")
        self.clock.reach(max(self.clock.epoch(), end_epoch))

    def _work_one(self) -> bool:
        assert self.process is not None
        queue = self.process.queue
        key, _ = queue.get(timeout=0)
        if key is None:
            return False
        try:
            self.process.ctrl._process(key)
        finally:
            queue.done(key)
        return True

    def _deliver(self) -> None:
        assert self.process is not None
        now = self.clock.epoch()
        for feed in self.process.feeds:
            for change in feed.deliver(now):
                self.oracle.delivered(change)

    def _changed(self, change: Change) -> None:
        if self.process is None:
            return
        at = self.clock.epoch() + self.rng.uniform(0, self.informer_lag)
        for feed in self.process.feeds:
            feed.offer(change, at)

    def _spend_kube(self) -> None:
        self.clock.advance(self.rng.uniform(0, self.kube_latency))

    def restart(self) -> None:
        """A new operator process (rollout, crash, failover): nothing survives but the
        apiserver and Himitsu. Listing the caches enqueues every HimitsuSecret."""
        if self.process is not None:
            self.process.client.close()
        self.oracle.restarting()
        self.process = None
        self.process = Process(self)

    # -- the EventSink the KubeClient is given --------------------------------------------

    def event(self, obj: Any, *, type: str, reason: str, message: str) -> None:
        meta = obj.get("metadata") or {}
        self.events.append((str(meta.get("name")), type, reason))
