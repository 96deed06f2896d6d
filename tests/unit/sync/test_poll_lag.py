"""Lag is visible (issue 11, item 8): in metrics, and in the HimitsuSecret's Ready message.

A target's promise is that its data is never older than refreshInterval. Its lag is how
far past that it is (0 while within it). The gauges show the worst lag and how many
targets lag, computed when scraped, so a target that nobody polls any more shows too;
each timed poll's lateness goes into a histogram. Ready's message says when a poll ran,
or is held back, more than an interval past the promise, at no cost in steady state:
the note rides on the status patch every poll makes anyway, and a held-back poll writes
it once.
"""

from __future__ import annotations

import pytest
from reconcile_world import NAME, NS, World, add_other, fetched

from himitsu_controller import himitsu
from himitsu_controller.runtime.metrics import REGISTRY
from himitsu_controller.sync.polling import lag
from himitsu_controller.sync.polling.polls import LocallyRateLimited


def sample(name: str) -> float:
    return REGISTRY.get_sample_value(name) or 0.0


def message(world: World) -> str:
    return str(world.ready()["message"])


@pytest.fixture
def world() -> World:
    w = World()  # refreshInterval 1m, rng 0: each poll due exactly 60 s after its answer
    w.sync(5)
    return w


def test_on_time_polls_show_no_lag_and_cost_one_status_patch_each(world: World) -> None:
    for _ in range(5):
        world.poll(himitsu.NotModified(5, age=2.0))
    assert world.reconciler.lag() == (0.0, 0, 0.0)
    assert sample("himitsu_poll_lag_seconds") == 0.0
    assert len(world.kube.status_patches) == 6  # the first sync and five polls
    assert message(world) == "Secret 'app-secrets' holds 2 keys at config version 5"


def test_a_target_nobody_polls_shows_a_growing_lag(world: World) -> None:
    world.clock.advance(60 + 90)  # its poll never came (a backlog, or a lost wake)
    assert world.reconciler.lag() == (90.0, 1, 1.5)
    assert sample("himitsu_poll_lag_seconds") == 90.0
    assert sample("himitsu_polls_overdue") == 1.0
    world.clock.advance(30)
    assert sample("himitsu_poll_lag_seconds") == 120.0


def test_a_failing_target_lags_from_its_last_good_answer(world: World) -> None:
    world.clock.advance(30)
    for _ in range(4):  # the poll at 60 s fails; retries keep failing; the data stays
        world.clock.advance(30)
        assert world.reconcile(himitsu.ServerError("503", status=503)).error is not None
    assert world.reconciler.lag() == (90.0, 1, 1.5)


def test_a_deleted_himitsu_secret_stops_counting(world: World) -> None:
    world.clock.advance(200)
    del world.kube.himitsu_secrets[(NS, NAME)]
    world.reconciler.reconcile(f"{NS}/{NAME}")
    assert world.reconciler.lag() == (0.0, 0, 0.0)


def test_a_himitsu_secret_being_deleted_does_not_lag() -> None:
    """The reconciler polls an object with a deletionTimestamp no more; a foreign finalizer
    may hold it for hours. Counted, himitsu_poll_lag_intervals would grow without bound and
    HimitsuSecretSyncLagging fire for an object the user deleted."""
    now = 1_700_000_000.0  # 2023-11-14T22:13:20Z
    synced = "2023-11-14T21:43:20Z"  # 30 min ago, refreshInterval 1m
    held = {"metadata": {"namespace": "apps", "name": "gone", "uid": "u1",
                         "deletionTimestamp": synced, "finalizers": ["example.com/hold"]},
            "spec": {"refreshInterval": "1m"}, "status": {"lastSyncTime": synced}}
    live = {**held, "metadata": {"namespace": "apps", "name": "live", "uid": "u2"}}
    assert lag.worst(now, [held], {}) == (0.0, 0, 0.0)
    assert lag.worst(now, [held, live], {}) == (1740.0, 1, 29.0)


def test_each_timed_poll_records_how_late_it_ran(world: World) -> None:
    count, total = (sample("himitsu_poll_lateness_seconds_count"),
                    sample("himitsu_poll_lateness_seconds_sum"))
    world.clock.advance(65)  # 5 s after its due time
    world.reconcile(himitsu.NotModified(5))
    assert sample("himitsu_poll_lateness_seconds_count") == count + 1
    assert sample("himitsu_poll_lateness_seconds_sum") == pytest.approx(total + 5.0)


def test_a_poll_more_than_an_interval_late_says_so_then_the_next_clears_it(
    world: World,
) -> None:
    world.clock.advance(60 + 90)  # 90 s past the promise: more than refreshInterval
    world.reconcile(himitsu.NotModified(5))
    ready = world.ready()
    assert (ready["status"], ready["reason"]) == ("True", "Synced")
    assert message(world) == ("Secret 'app-secrets' holds 2 keys at config version 5; this "
                              "poll ran 1m30s later than refreshInterval 1m allows")
    world.poll(himitsu.NotModified(5))
    assert message(world) == "Secret 'app-secrets' holds 2 keys at config version 5"
    assert len(world.kube.status_patches) == 3  # one per poll, the note included
    assert [e.reason for e in world.kube.events] == ["Synced"]  # the first write only


def test_a_late_poll_within_an_interval_of_its_promise_leaves_ready_alone(world: World) -> None:
    world.clock.advance(60 + 50)
    world.reconcile(himitsu.NotModified(5))
    assert message(world) == "Secret 'app-secrets' holds 2 keys at config version 5"


def test_a_poll_held_back_by_pacing_says_it_is_overdue_once(world: World) -> None:
    world.clock.advance(60 + 61)
    paced = LocallyRateLimited("paced", retry_after=5.0)
    assert world.reconcile(paced).error is None
    ready = world.ready()
    assert (ready["status"], ready["reason"]) == ("True", "Synced")
    assert message(world) == (
        "Secret 'app-secrets' holds 2 keys at config version 5; polls are overdue: the last "
        "answer, from 2024-05-06T07:08:09Z, is more than twice refreshInterval 1m old "
        "(Himitsu request pacing holds polls back)")
    patches = len(world.kube.status_patches)
    for _ in range(3):  # still held back: the note is there already
        world.clock.advance(5)
        world.reconcile(LocallyRateLimited("paced", retry_after=5.0))
    assert len(world.kube.status_patches) == patches == 2
    world.clock.advance(5)
    world.reconcile(himitsu.NotModified(5))
    assert message(world).startswith(
        "Secret 'app-secrets' holds 2 keys at config version 5; this poll ran 1m21s later")


def test_pacing_within_the_promise_writes_nothing(world: World) -> None:
    world.clock.advance(60 + 30)
    world.reconcile(LocallyRateLimited("paced", retry_after=5.0))
    assert len(world.kube.status_patches) == 1


def test_a_failing_target_held_back_by_pacing_keeps_its_failure_message(world: World) -> None:
    world.clock.advance(60)
    world.reconcile(himitsu.ServerError("the Himitsu API answered 503", status=503))
    world.clock.advance(120)
    world.reconcile(LocallyRateLimited("paced", retry_after=5.0))
    ready = world.ready()
    assert (ready["status"], ready["reason"]) == ("False", "FetchFailure")
    assert ready["message"] == "the Himitsu API answered 503"


# -- after a restart or a failover: memory is empty, the target's data is not new --------


def test_after_a_restart_a_poll_held_back_shows_the_targets_lag(world: World) -> None:
    world.clock.advance(600)  # the operator was down for ten minutes (refreshInterval 1m)
    world.restart()  # memory lost; status.lastSyncTime still says t=0
    assert world.reconcile(LocallyRateLimited("paced", retry_after=5.0)).error is None
    assert world.reconciler.lag() == (540.0, 1, 9.0)
    assert (sample("himitsu_poll_lag_seconds"), sample("himitsu_polls_overdue")) == (540.0, 1.0)
    assert "polls are overdue" in message(world)
    for _ in range(3):  # ... and Himitsu keeps failing: the lag keeps growing
        world.clock.advance(60)
        world.reconcile(himitsu.ServerError("503", status=503))
    assert world.reconciler.lag() == (720.0, 1, 12.0)


def test_after_a_restart_the_first_poll_records_how_late_it_ran(world: World) -> None:
    count, total = (sample("himitsu_poll_lateness_seconds_count"),
                    sample("himitsu_poll_lateness_seconds_sum"))
    world.clock.advance(600)
    world.restart()
    world.reconcile(LocallyRateLimited("paced", retry_after=5.0))
    world.clock.advance(5)
    world.reconcile(himitsu.NotModified(5))  # due at 60, ran at 605
    assert sample("himitsu_poll_lateness_seconds_count") == count + 1
    assert sample("himitsu_poll_lateness_seconds_sum") == pytest.approx(total + 545.0)
    assert message(world) == ("Secret 'app-secrets' holds 2 keys at config version 5; this "
                              "poll ran 9m5s later than refreshInterval 1m allows")


def test_after_a_cold_start_targets_not_reconciled_yet_show_their_lag(world: World) -> None:
    # A new process (a restart, the standby taking over, a backlog in its queue) that has
    # not reconciled the object: its lag comes from status.lastSyncTime in the cache.
    world.clock.advance(60 + 90)
    world.restart()
    assert world.reconciler.lag() == (90.0, 1, 1.5)
    assert (sample("himitsu_poll_lag_seconds"), sample("himitsu_polls_overdue")) == (90.0, 1.0)


def test_a_target_never_synced_or_synced_once_does_not_lag(world: World) -> None:
    world.edit_spec(refreshInterval="0")
    world.reconcile()  # a spec edit keeping the source: nothing asked
    add_other(world)  # a new HimitsuSecret, not reconciled yet: no answer, no promise
    world.clock.advance(3600)
    world.restart()
    assert world.reconciler.lag() == (0.0, 0, 0.0)


# -- lateness belongs to timed polls, measured with the interval they were due under -----


def test_a_shortened_refresh_interval_is_not_reported_as_a_late_poll() -> None:
    world = World(refreshInterval="1h")
    world.sync(5)
    world.clock.advance(3000)  # 50 min on, the user lowers refreshInterval to 1m
    world.edit_spec(refreshInterval="1m")
    count = sample("himitsu_poll_lateness_seconds_count")
    world.reconcile(fetched(5))  # reconciled at once: the spec changed
    assert message(world) == "Secret 'app-secrets' holds 2 keys at config version 5"
    assert sample("himitsu_poll_lateness_seconds_count") == count  # not a timed poll
    assert world.reconciler.lag() == (0.0, 0, 0.0)
    world.clock.advance(60 + 90)  # from now on the promise is the new interval's
    world.reconcile(himitsu.NotModified(5))
    assert "this poll ran 1m30s later than refreshInterval 1m allows" in message(world)


def test_a_spec_edit_held_back_by_pacing_is_not_overdue_under_the_new_interval() -> None:
    world = World(refreshInterval="1h")
    world.sync(5)
    world.clock.advance(3000)
    world.edit_spec(refreshInterval="1m")
    world.reconcile(LocallyRateLimited("paced", retry_after=5.0))
    assert message(world) == "Secret 'app-secrets' holds 2 keys at config version 5"


# -- a chronic shortfall: every poll late, still one status patch per poll ---------------


def test_under_a_chronic_pacing_shortfall_each_poll_costs_one_status_patch(world: World) -> None:
    def held_back_poll() -> None:  # held back ~2 intervals past its answer, then runs
        world.clock.advance(121)
        world.reconcile(LocallyRateLimited("paced", retry_after=5.0))
        world.clock.advance(5)
        world.reconcile(himitsu.NotModified(5))

    held_back_poll()  # the first: "polls are overdue" once, then "this poll ran ... later"
    before = len(world.kube.status_patches)
    for _ in range(5):
        held_back_poll()
        assert message(world) == ("Secret 'app-secrets' holds 2 keys at config version 5; "
                                  "this poll ran 1m6s later than refreshInterval 1m allows")
    assert len(world.kube.status_patches) - before == 5
    # ... and the message never went back to "polls are overdue" in between.
    assert not any("overdue" in str(patch) for patch in world.kube.status_patches[before:])


def test_the_lag_in_intervals_is_each_targets_own_lag_over_its_own_interval() -> None:
    """himitsu_poll_lag_intervals: an alert bound that holds for any refreshInterval. A
    target 10 min behind an hourly refresh lags less, in its own terms, than one 2 min
    behind a 1m refresh, though more in seconds."""
    def obj(name: str, interval: str, synced: str) -> dict[str, object]:
        return {"metadata": {"namespace": "apps", "name": name, "uid": name},
                "spec": {"refreshInterval": interval}, "status": {"lastSyncTime": synced}}

    now = 1_700_000_000.0  # 2023-11-14T22:13:20Z
    hourly = obj("hourly", "1h", "2023-11-14T21:03:20Z")  # 70 min old: 10 min past its hour
    minutely = obj("minutely", "1m", "2023-11-14T22:10:20Z")  # 3 min old: 2 past its minute
    largest, lagging, intervals = lag.worst(now, [hourly, minutely], {})
    assert (largest, lagging) == (600.0, 2)
    assert intervals == pytest.approx(2.0)
