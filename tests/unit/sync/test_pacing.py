"""Pacing: the budget holds in every 60 s window, whoever asks and however late.

Himitsu's windows open at a key's first request after the last one expired, so a client
cannot align to them: the only budget that is safe is one no window position can
exceed. These tests drive the real ``Pacer`` on a simulated clock with arbitrary request
times (hypothesis), callers that come back late or never, and server headers, and
count what it let through in every window.
"""

from __future__ import annotations

import heapq
import itertools
import math
import random
from collections.abc import Iterator
from contextlib import nullcontext
from dataclasses import dataclass

import pytest
import responses
from fakes import SleepClock, himitsu_clients
from hypothesis import Phase, given, settings
from hypothesis import strategies as st
from pacing_world import most_in_any_window

from himitsu_controller import himitsu
from himitsu_controller.himitsu.wire import RateLimits
from himitsu_controller.sync.polling import pacing
from himitsu_controller.sync.polling.pacing import LATE, Pacer

API = "https://himitsu.example.com"
API2 = "https://other.example.com"
KEYS = ("key-a", "key-b", "key-c")
SERVER_WINDOW = 60.0


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_the_budgets_stay_below_himitsus_limits_with_margin() -> None:
    assert pacing.TOKEN_BUDGET <= 0.9 * 120  # per API key
    assert pacing.API_BUDGET <= 0.9 * 300  # per client IP, every token of ours together
    assert pacing.WINDOW >= SERVER_WINDOW + LATE


@dataclass(frozen=True)
class Step:
    gap: float  # seconds after the previous step
    ticket: int  # who asks (a source: it always reads with one key from one API URL)
    late: float  # a caller told to wait comes back this much after its place (or never)


steps = st.lists(st.builds(
    Step, gap=st.floats(0, 3), ticket=st.integers(0, 40),
    late=st.one_of(st.floats(0, 2 * LATE), st.just(float("inf")))), max_size=400)


def keys_of(step: Step) -> tuple[str, str]:
    return KEYS[step.ticket % 3], (API, API2)[step.ticket // 3 % 2]


def replay(pacer: Pacer, clock: Clock, plan: list[Step],
           limits: list[tuple[int, float]] | None = None) -> dict[str, list[float]]:
    """Run ``plan`` against ``pacer``; the moments each key and API URL really sent at."""
    sent: dict[str, list[float]] = {}
    returns: list[tuple[float, int, Step]] = []  # callers coming back to their place
    seq = itertools.count()
    moment = clock.now
    pending = list(plan)
    answers = iter(limits or [])

    def send(step: Step, at: float) -> None:
        key, api = keys_of(step)
        sent.setdefault(key, []).append(at)
        sent.setdefault(api, []).append(at)
        if (answer := next(answers, None)) is not None:  # the server's count, if scripted
            pacer.answered(api, key, RateLimits(120, *answer), elapsed=0.0)

    def ask(step: Step) -> None:
        key, api = keys_of(step)
        wait = pacer.admit(f"t{step.ticket}", api, key)
        if wait > 0:
            if step.late != float("inf"):  # late once: then back right at its new place
                again = Step(0.0, step.ticket, 0.0)
                heapq.heappush(returns, (clock.now + wait + step.late, next(seq), again))
            return
        send(step, clock.now)

    while pending or returns:
        due = moment + pending[0].gap if pending else float("inf")
        if returns and returns[0][0] <= due:
            clock.now, _, step = heapq.heappop(returns)
            ask(step)
            continue
        step = pending.pop(0)
        moment = clock.now = max(clock.now, due)
        ask(step)
    return sent


@settings(max_examples=150, deadline=None, phases=[Phase.generate, Phase.shrink])
@given(plan=steps, token_budget=st.integers(1, 6), api_budget=st.integers(1, 10),
       answers=st.lists(st.tuples(st.integers(0, 120), st.floats(0, 60)), max_size=50))
def test_no_window_anywhere_holds_more_than_the_budget(
    plan: list[Step], token_budget: int, api_budget: int, answers: list[tuple[int, float]],
) -> None:
    clock = Clock()
    sent = replay(Pacer(clock=clock, token_budget=token_budget, api_budget=api_budget),
                  clock, plan, answers)
    for name, times in sent.items():
        budget = api_budget if name.startswith("https://") else token_budget
        assert most_in_any_window(times, SERVER_WINDOW) <= budget, (name, sorted(times))


@settings(max_examples=15, deadline=None)
@given(seed=st.integers(0, 2**32), count=st.integers(400, 900))
def test_the_default_budgets_hold_in_every_window(seed: int, count: int) -> None:
    # Dense traffic (hundreds of sources, a request every 0.15 s on average, late
    # callers): well past both budgets. Drawn from a seed, as lists this long are too
    # slow for hypothesis to build element by element.
    rng = random.Random(seed)
    plan = [Step(gap=rng.uniform(0, 0.3), ticket=6 * rng.randrange(100) + rng.randrange(3),
                 late=rng.uniform(0, 2 * LATE)) for _ in range(count)]
    clock = Clock()
    sent = replay(Pacer(clock=clock), clock, plan)
    assert most_in_any_window(sent.get(API, []), SERVER_WINDOW) <= pacing.API_BUDGET < 300
    for key in KEYS:
        assert most_in_any_window(sent.get(key, []), SERVER_WINDOW) <= pacing.TOKEN_BUDGET < 120


def test_each_waiter_gets_its_own_place_in_line() -> None:
    clock = Clock()
    pacer = Pacer(clock=clock, token_budget=10, api_budget=100, window=60.0)
    spacing = 60.0 / 10  # a burst of one (10%), then the even pace that keeps the window
    assert pacer.admit("a", API, "k") == 0.0
    waits = [pacer.admit(name, API, "k") for name in "bcd"]
    assert waits == [spacing, 2 * spacing, 3 * spacing]  # not all told the same moment
    assert pacer.admit("c", API, "k") == 2 * spacing  # asking again keeps the place
    clock.now += spacing
    assert pacer.admit("b", API, "k") == 0.0  # back at its place: it goes
    assert pacer.admit("e", API, "k") == 3 * spacing  # behind c and d, not before them


def test_a_place_is_kept_for_a_late_caller_only_until_late() -> None:
    clock = Clock()
    pacer = Pacer(clock=clock, token_budget=1, api_budget=100, window=60.0)
    assert pacer.admit("a", API, "k") == 0.0
    assert pacer.admit("b", API, "k") == 60.0
    assert pacer.admit("c", API, "k") == 120.0
    clock.now += 60.0 + LATE / 2
    assert pacer.admit("b", API, "k") == 0.0  # a little late: its place still holds
    clock.now += 60.0 + LATE * 2
    assert pacer.admit("c", API, "k") == 0.0  # far too late: a new place (the line is empty)


def test_a_low_remaining_from_the_server_holds_our_requests_until_its_window_ends() -> None:
    clock = Clock()
    pacer = Pacer(clock=clock)
    assert pacer.admit("a", API, "k") == 0.0
    # Someone else has spent most of this key's window: 10 left, 30 s to go.
    pacer.answered(API, "k", RateLimits(limit=120, remaining=10, reset=30.0), elapsed=0.1)
    reserve = math.ceil(120 * pacing.RESERVE_FRACTION)  # for the key's other users
    waits = [pacer.admit(f"s{i}", API, "k") for i in range(50)]
    assert waits.count(0.0) == 10 - reserve
    assert all(w >= 30.0 - 1e-6 for w in waits if w)  # the rest: after the window ends
    clock.now += max(waits)
    assert pacer.admit(f"s{waits.index(max(waits))}", API, "k") == 0.0  # the line moves
    assert pacer.admit("other-key", API, "k2") == 0.0  # other keys were never held


def test_a_429s_headers_close_the_key_until_the_window_ends() -> None:
    clock = Clock()
    pacer = Pacer(clock=clock)
    pacer.answered(API, "k", RateLimits(limit=120, remaining=0, reset=12.0), elapsed=0.0)
    assert pacer.admit("a", API, "k") == pytest.approx(12.0)


def test_an_older_answer_does_not_undo_a_newer_count() -> None:
    clock = Clock()
    pacer = Pacer(clock=clock)
    pacer.answered(API, "k", RateLimits(limit=120, remaining=0, reset=20.0), elapsed=0.0)
    pacer.answered(API, "k", RateLimits(limit=120, remaining=90, reset=20.0), elapsed=5.0)
    assert pacer.admit("a", API, "k") == pytest.approx(20.0)


@pytest.fixture
def mock() -> Iterator[responses.RequestsMock]:
    with responses.RequestsMock(assert_all_requests_are_fired=False) as rsps:
        yield rsps


PROJECT = "0b6f8a52-1c3e-4d5f-9a7b-2c4d6e8f0a1b"
ENV = "5d2e1f3a-7b8c-4d9e-8f0a-1b2c3d4e5f60"
TOKEN = "himi_0123456789abcdef_" + "A" * 43
URL = f"{API}/api/v1/projects/{PROJECT}/environments/{ENV}/secrets/runtime"
ERROR = {"error": {"code": "INTERNAL_ERROR", "message": "m", "requestId": "r"}}


def fetch_with(pacer: Pacer, clock: SleepClock, known: int | None = None) -> himitsu.FetchResult:
    with himitsu_clients(clock=clock, pacing=pacer) as make:
        return make().fetch(api_url=API, project_id=PROJECT, environment_id=ENV, token=TOKEN,
                            known_version=known)


@pytest.mark.parametrize("status", [200, 304, 404, 429, 503])
def test_every_answer_tells_the_pacer_the_servers_count(
    mock: responses.RequestsMock, status: int,
) -> None:
    clock = SleepClock()
    pacer = Pacer(clock=clock)
    key = himitsu.pacing_key(API, TOKEN)
    # Another client spent the key: 6 left, which is the reserve, for the 30 s to go.
    headers = {"RateLimit-Limit": "120", "RateLimit-Remaining": "6", "RateLimit-Reset": "30",
               "X-Himitsu-Config-Version": "4"}
    body = {"data": {"configVersion": 4, "secrets": {}}} if status == 200 else ERROR
    mock.get(URL, status=status, headers=headers, json=None if status == 304 else body)
    assert pacer.admit("source", API, key) == 0.0
    with pytest.raises(himitsu.HimitsuError) if status >= 400 else nullcontext():
        fetch_with(pacer, clock, known=4)
    assert pacer.admit("next", API, key) == pytest.approx(30.0, abs=1.0)


def test_headroom_is_the_smallest_share_of_a_budget_left_in_the_window() -> None:
    """himitsu_api_rate_limit_headroom_ratio: 1 when nothing was asked, falling with the
    requests sent or placed on the busiest key (and URL), back to 1 once they age out."""
    clock = Clock()
    pacer = Pacer(clock=clock, token_budget=10, api_budget=40, window=60.0)
    assert pacer.headroom() == {"api_key": 1.0, "api_url": 1.0}
    # Sent or placed in line ahead (one request at once, then an even pace): both count.
    waits = [pacer.admit(f"a{ticket}", API, "key-a") for ticket in range(4)]
    assert waits[0] == 0.0 and waits[-1] > 0
    pacer.admit("b0", API, "key-b")
    assert pacer.headroom() == {"api_key": pytest.approx(0.6), "api_url": pytest.approx(0.875)}
    for ticket in range(4, 14):  # demand beyond the budget leaves nothing
        pacer.admit(f"a{ticket}", API, "key-a")
    assert pacer.headroom()["api_key"] == 0.0
    clock.now += 1000.0
    assert pacer.headroom() == {"api_key": 1.0, "api_url": 1.0}


def test_headroom_follows_the_servers_count_when_another_client_spends_the_key() -> None:
    clock = Clock()
    pacer = Pacer(clock=clock)
    assert pacer.admit("t", API, "k") == 0.0
    # The server says 10 of 120 remain (another client spent the rest); 6 are our reserve.
    pacer.answered(API, "k", RateLimits(limit=120, remaining=10, reset=30.0), elapsed=0.1)
    assert pacer.headroom()["api_key"] == pytest.approx((10 - 6) / 120)
    clock.now += 31.0  # the server's window ended: our own count alone
    assert pacer.headroom()["api_key"] == pytest.approx(1 - 1 / pacing.TOKEN_BUDGET)
