"""The periodic resync (controller-runtime's SyncPeriod): a safety net that queues every
HimitsuSecret again each period, so an object the reconciler lost track of is polled
within one period; and what it costs: nothing for an object whose poll is not due."""

from __future__ import annotations

import itertools
from typing import Any

import pytest
from fakes import FakeFetcher, FakeKube, b64
from reconcile_world import NS, TOKEN, Clock, fetched, make_hsec

from himitsu_controller import api, cli, himitsu
from himitsu_controller.runtime.resync import DEFAULT_PERIOD, JITTER, Resync
from himitsu_controller.runtime.workqueue import RateLimitingQueue
from himitsu_controller.sync.reconciler import HimitsuSecretReconciler

_names = itertools.count()


class Ticks:
    """A stop event whose wait() returns at once: False ``ticks`` times, then True."""

    def __init__(self, ticks: int) -> None:
        self.left = ticks
        self.waits: list[float] = []

    def wait(self, timeout: float | None = None) -> bool:
        assert timeout is not None
        self.waits.append(timeout)
        self.left -= 1
        return self.left < 0


def test_every_key_is_queued_once_per_period() -> None:
    keys = ["a/one", "a/two", "b/three"]
    queued: list[tuple[str, float]] = []
    draws = iter([0.0, 0.5, 0.999, 0.2])
    resync = Resync(lambda: keys, lambda key, delay: queued.append((key, delay)),
                    period=3600.0, rng=lambda: next(draws))
    stop = Ticks(3)
    resync.run(stop)  # type: ignore[arg-type]
    assert queued == [(key, 0.0) for key in keys] * 3
    assert len(stop.waits) == 4  # three ticks, then stopped while waiting
    assert all((1 - JITTER) * 3600.0 <= w <= 3600.0 for w in stop.waits), stop.waits


def test_the_period_defaults_to_ten_hours_and_the_flag_takes_go_durations() -> None:
    assert DEFAULT_PERIOD == 36000.0
    parser = cli.build_parser()
    assert parser.parse_args([]).sync_period == DEFAULT_PERIOD
    assert parser.parse_args(["--sync-period", "1h30m"]).sync_period == 5400.0
    assert parser.parse_args(["--sync-period", "0"]).sync_period == 0.0  # off
    with pytest.raises(SystemExit):
        parser.parse_args(["--sync-period", "10"])  # a Go duration needs its unit
    with pytest.raises(ValueError, match="positive"):
        Resync(list, lambda key, delay: None, period=0.0)


@pytest.mark.parametrize("period", ["1ms", "100ms", "1s", "59s"])
def test_a_sync_period_under_a_minute_is_a_flag_error(
    period: str, capsys: pytest.CaptureFixture[str],
) -> None:
    """A resync queues every HimitsuSecret: at 1ms it would be a hot loop over the cache."""
    with pytest.raises(SystemExit):
        cli.build_parser().parse_args(["--sync-period", period])
    assert (f"argument --sync-period: {period!r} is shorter than 1m" in capsys.readouterr().err)
    assert cli.build_parser().parse_args(["--sync-period", "1m"]).sync_period == 60.0


def test_a_key_the_queue_no_longer_holds_comes_back_at_the_next_resync() -> None:
    now = [1000.0]
    queue = RateLimitingQueue(f"resync-{next(_names)}", clock=lambda: now[0])
    resync = Resync(lambda: ["apps/lost", "apps/timed"], queue.add_after, period=60.0)
    queue.add_after("apps/timed", 30.0)  # a timed poll still pending
    resync.tick()
    got = {queue.get(timeout=0)[0], queue.get(timeout=0)[0]}
    assert got == {"apps/lost", "apps/timed"}
    for key in got:
        assert key is not None
        queue.done(key)
    assert queue.get(timeout=0) == (None, False)  # each key once, however often asked


class Cluster:
    """Several HimitsuSecrets of every kind, synced, on one simulated clock."""

    def __init__(self) -> None:
        self.kube, self.fetcher, self.clock = FakeKube(), FakeFetcher(), Clock()
        self.kube.put_secret({"metadata": {"namespace": NS, "name": "himitsu-token"},
                              "data": {"token": b64(TOKEN)}})
        self.kube.put_secret({"metadata": {"namespace": NS, "name": "merged", "annotations": {
                                  api.ANN_ALLOW_MERGE_BY: "merge"}},
                              "type": "Opaque", "data": {"OTHER": b64("x")}})
        self.keys: list[str] = []
        for name, over in [("owner-1m", {}), ("owner-1h", {"refreshInterval": "1h"}),
                           ("merge", {"policy": "Merge"}), ("once", {"refreshInterval": "0"})]:
            obj = make_hsec(**over)
            obj["metadata"]["name"] = name
            obj["spec"]["target"]["name"] = "merged" if name == "merge" else f"{name}-secrets"
            self.kube.add_himitsu_secret(obj)
            self.keys.append(f"{NS}/{name}")
        self.reconciler = HimitsuSecretReconciler(self.kube, self.fetcher, now=self.clock,
                                                  rng=lambda: 0.0)
        for key in self.keys:
            self.fetcher.then(fetched(5))
            assert self.reconciler.reconcile(key).error is None
        for key in self.keys:  # the watch echoes of the first writes
            self.reconciler.reconcile(key)

    def counts(self) -> dict[str, Any]:
        calls = self.kube.calls
        return {"fetches": len(self.fetcher.calls), "patches": len(self.kube.status_patches),
                "writes": self.kube.writes(), "events": len(self.kube.events),
                "uncached reads": calls["get_secret"] + calls["get_secret_fresh"]}


def test_a_resync_of_objects_whose_poll_is_not_due_costs_nothing() -> None:
    cluster = Cluster()
    before = cluster.counts()
    cluster.clock.advance(30)  # within every object's interval
    queued: list[str] = []
    Resync(lambda: cluster.keys, lambda key, delay: queued.append(key)).tick()
    for key in queued:
        result = cluster.reconciler.reconcile(key)
        assert result.error is None
        if key != f"{NS}/once":  # the rest go back to sleep until their own poll
            assert result.requeue_after is not None and 0 < result.requeue_after <= 3600
    assert queued == cluster.keys
    assert cluster.counts() == before  # no Himitsu request, no kube request, no Event


def test_a_resync_of_an_object_whose_wake_was_lost_polls_it() -> None:
    cluster = Cluster()
    cluster.clock.advance(600)  # owner-1m's timed wake never came
    cluster.fetcher.then(himitsu.NotModified(5))
    result = cluster.reconciler.reconcile(f"{NS}/owner-1m")
    assert result.error is None and cluster.fetcher.known_versions[-1] == 5
    assert cluster.kube.status(NS, "owner-1m")["lastSyncTime"] == "2024-05-06T07:18:09Z"
    assert result.requeue_after == pytest.approx(60.0)
