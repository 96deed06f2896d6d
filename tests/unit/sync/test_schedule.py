"""Tests for schedule.py: the timing rules on their own (the simulation in
test_poll_schedule.py proves what they add up to with the reconciler and the poller)."""

from __future__ import annotations

import pytest

from himitsu_controller.sync.polling import schedule


def test_next_due_counts_from_the_answer_and_is_never_late() -> None:
    assert schedule.next_due(60.0, answered=1000.0, fraction=0.0) == 1060.0
    assert schedule.next_due(60.0, answered=1000.0, fraction=0.5) == pytest.approx(1057.0)
    assert schedule.next_due(60.0, answered=1000.0, fraction=0.999) == pytest.approx(1054.006)


def test_refresh_interval_zero_has_no_next_poll() -> None:
    assert schedule.next_due(0.0, answered=1000.0, fraction=0.3) is None


def window(interval: float = 60.0, *, now: float, due: float | None = 1060.0,
           answered: float | None = 1000.0, intact: bool = True) -> float:
    return schedule.share_window(interval, now=now, due=due, answered=answered,
                                 intact=intact)


def test_a_timed_poll_shares_half_an_interval_plus_its_lateness() -> None:
    assert window(now=1060.0) == 30.0
    assert window(now=1065.0) == 35.0


def test_a_timed_poll_never_takes_its_own_last_answer() -> None:
    # due at least 90% of an interval after the answer: older than any window it gets
    for fraction in (0.0, 0.5, 0.999):
        due = schedule.next_due(10.0, answered=0.0, fraction=fraction)
        assert due is not None
        for late in (0.0, 0.5, 30.0):
            assert due + late - 0.0 > window(10.0, now=due + late, due=due, answered=0.0)


def test_a_wake_just_before_the_due_time_is_the_poll() -> None:
    # not the intact-target window, which would cover the held answer
    assert window(now=1059.99) == 30.0


def test_a_spec_edit_with_the_target_intact_takes_an_answer_as_recent_as_the_held_one() -> None:
    assert window(now=1040.0) == 40.0
    assert window(now=1010.0) == 30.0


def test_a_first_sync_or_a_repair_takes_only_an_answer_seconds_old() -> None:
    # Before the poll, at the poll, late, without memory, and whatever the interval:
    # a target that must be (re)written gets Himitsu's data of seconds ago.
    for now, due, answered in ((1040.0, 1060.0, 1000.0), (1060.0, 1060.0, 1000.0),
                               (1090.0, 1060.0, 1000.0), (1040.0, None, None)):
        for interval in (10.0, 60.0, 3600.0):
            assert window(interval, now=now, due=due, answered=answered,
                          intact=False) == schedule.FRESH
    assert schedule.FRESH <= 5.0


def test_without_memory_only_the_share_window_applies() -> None:
    assert window(now=1040.0, due=None, answered=None) == 30.0


def test_backoff_doubles_from_one_second_capped_by_the_interval_and_five_minutes() -> None:
    assert [schedule.backoff(n, 3600.0) for n in (1, 2, 3, 9, 10, 60)] == [
        1.0, 2.0, 4.0, 256.0, 300.0, 300.0]
    assert schedule.backoff(10, 30.0) == 30.0
    assert schedule.backoff(10, 0.5) == 1.0  # never below a second
    assert schedule.backoff(10, 0.0) == 300.0  # refreshInterval 0: the 5 minute cap


def test_a_late_poll_never_takes_an_answer_its_next_poll_would_already_be_due_after() -> None:
    # An answer 90% of an interval old leaves the next poll due at once: ask Himitsu.
    for late in (0.0, 20.0, 40.0, 600.0):
        assert window(now=1060.0 + late) <= (1 - schedule.JITTER) * 60.0 - schedule.MIN_REQUEUE
    assert window(0.05, now=10.0, due=10.0, answered=9.95) == 0.0


def test_a_due_time_in_the_past_means_poll_now_never_no_poll() -> None:
    assert schedule.requeue_delay(1000.0, 1060.0) == 60.0
    assert schedule.requeue_delay(1000.0, 1000.0) == schedule.MIN_REQUEUE
    assert schedule.requeue_delay(1000.0, 900.0) == schedule.MIN_REQUEUE > 0
