"""Pacing through the real reconcile: places in line, a short budget, a shared key.

``PacingWorld`` runs the real reconciler, SharedPoller, Pacer and HimitsuClient against
the Himitsu stand-in's core on one simulated clock, and counts reconcile attempts and
requests (never times measured on a wall clock).
"""

from __future__ import annotations

from collections import Counter
from itertools import pairwise

from pacing_world import PacingWorld, most_in_any_window

from himitsu_controller.sync.polling import pacing


def test_contending_sources_cost_reconcile_attempts_linear_in_their_number() -> None:
    # 40 sources, one key, a budget of 5 a window: 8 windows' worth of first polls. Each
    # paced source is told its own place and comes back once, at it: about two attempts
    # per source. (Told the same moment, all waiters came back together and all but a
    # few were turned away again: 841 attempts for 40, about N^2/2.)
    attempts = {}
    for count in (10, 20, 40):
        world = PacingWorld(count, refresh="1h", pacer={"token_budget": 5})
        world.run_until(count / 5 * pacing.WINDOW + 10)
        assert all(world.ready(name) for name in world.names)
        assert not world.trace.failures
        attempts[count] = world.trace.reconciles
        assert attempts[count] <= 2 * count + 2, attempts
    assert attempts[40] <= 4 * attempts[10] + 4, attempts  # linear, not quadratic


def test_a_short_budget_stretches_every_sources_polls_evenly_and_fails_none() -> None:
    # 19 sources at 10s on one key want 114 requests a minute, more than the pace of 100.
    world = PacingWorld(19, refresh="10s")
    world.run_until(600.0)
    ours = world.trace.ours()
    assert not world.trace.failures  # no FetchFailure, no Ready=False for our own pacing
    assert all(world.ready(name) for name in world.names)
    assert Counter(s.status for s in ours).get(429, 0) == 0
    assert most_in_any_window([s.at for s in ours]) <= pacing.TOKEN_BUDGET < 120
    # Every source is still polled, all about equally often and never far apart: first
    # come, first served, so the shortfall is spread over all of them.
    polls = {name: world.trace.polls[name] for name in world.names}
    counts = [len(times) for times in polls.values()]
    assert max(counts) - min(counts) <= 2, counts
    stretched = 19 * pacing.WINDOW / pacing.TOKEN_BUDGET  # the pace's share per source
    for name, times in polls.items():
        gaps = [b - a for a, b in pairwise(times[1:])]  # after the first round
        assert max(gaps) <= stretched + 10.0, (name, max(gaps))


def test_another_client_on_the_same_key_slows_us_down_before_the_server_says_429() -> None:
    # As measured against the real server: 19 sources at 10s on one key, and another
    # client that spends 70 of the key's 120 early in a window, twice.
    world = PacingWorld(19, refresh="10s")
    world.burst_at(3.0, 70)  # the key's window opened with our first polls at 0
    world.run_until(200.0)
    world.burst_at(world.window_end() + 3.0, 70)  # early in the next server window
    world.run_until(600.0)
    ours = world.trace.ours()
    others = [s for s in world.trace.sent if not s.ours]
    assert len(others) == 140 and all(s.status == 200 for s in others)
    assert Counter(s.status for s in ours).get(429, 0) == 0  # we left the key's rest alone
    assert not world.trace.failures
    assert all(world.ready(name) for name in world.names)
    for name in world.names:  # held for a window at most, then polled again
        times = world.trace.polls[name]
        assert max(b - a for a, b in pairwise(times)) <= 60.0 + 2 * 10.0 + 19 * 0.7, name
