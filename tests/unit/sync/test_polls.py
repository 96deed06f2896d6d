"""Shared polls: one request per source and window, never shared across tokens."""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from typing import Any

import pytest

from himitsu_controller import himitsu
from himitsu_controller.sync.polling.pacing import Pacer
from himitsu_controller.sync.polling.polls import (
    FAILURE_HOLD,
    Blocked,
    LocallyRateLimited,
    SharedPoller,
)

API = "https://himitsu.example.com"
PROJECT = "11111111-1111-1111-1111-111111111111"
ENV = "22222222-2222-2222-2222-222222222222"
ENV2 = "33333333-3333-3333-3333-333333333333"
TOKEN_A = "himi_aaaaaaaaaaaaaaaa_" + "A" * 43
TOKEN_B = "himi_bbbbbbbbbbbbbbbb_" + "B" * 43


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class FakeClient:
    """A Himitsu environment per (env, token) with 304 semantics; records every request."""

    def __init__(self) -> None:
        self.version = 5
        self.secrets: dict[str, dict[str, str]] = {TOKEN_A: {"K": "a"}, TOKEN_B: {"K": "b"}}
        self.calls: list[tuple[str, str, int | None]] = []
        self.gate: threading.Event | None = None
        self.error: Exception | None = None

    def fetch(
        self, *, api_url: str, project_id: str, environment_id: str, token: str,
        known_version: int | None,
    ) -> himitsu.FetchResult:
        self.calls.append((environment_id, token, known_version))
        if self.gate is not None:
            assert self.gate.wait(10)
        if self.error is not None:
            raise self.error
        if known_version == self.version:
            return himitsu.NotModified(self.version)
        return himitsu.Fetched(self.version, dict(self.secrets[token]))


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def client() -> FakeClient:
    return FakeClient()


@pytest.fixture
def poller(client: FakeClient, clock: Clock) -> SharedPoller:
    return SharedPoller(client, clock=clock)


def fetch(poller: SharedPoller, *, token: str = TOKEN_A, env: str = ENV,
          known: int | None = None, max_age: float = 6.0,
          reader: str | None = None) -> himitsu.FetchResult:
    return poller.fetch(api_url=API, project_id=PROJECT, environment_id=env, token=token,
                        known_version=known, max_age=max_age, reader=reader)


def secrets_of(result: himitsu.FetchResult) -> Mapping[str, str]:
    assert isinstance(result, himitsu.Fetched)
    return result.secrets


def test_readers_of_one_source_share_one_request(
    poller: SharedPoller, client: FakeClient, clock: Clock,
) -> None:
    first = fetch(poller)
    clock.now += 3
    second = fetch(poller, known=5)
    third = fetch(poller)
    assert len(client.calls) == 1
    assert secrets_of(first) == secrets_of(third) == {"K": "a"}
    assert second == himitsu.NotModified(5)
    assert second.age == pytest.approx(3)


def test_readers_of_one_answer_share_the_jitter_drawn_for_its_request(
    client: FakeClient, clock: Clock,
) -> None:
    draws = iter([0.25, 0.75])
    poller = SharedPoller(client, clock=clock, rng=lambda: next(draws))
    first = fetch(poller)
    clock.now += 3
    second = fetch(poller, known=5)
    assert first.jitter == second.jitter == 0.25
    clock.now += 7
    third = fetch(poller, known=5)  # a new request: a new draw for its readers
    assert len(client.calls) == 2 and third.jitter == 0.75


def test_different_tokens_never_share(poller: SharedPoller, client: FakeClient) -> None:
    a = fetch(poller, token=TOKEN_A)
    b = fetch(poller, token=TOKEN_B)
    assert [c[1] for c in client.calls] == [TOKEN_A, TOKEN_B]
    assert secrets_of(a) == {"K": "a"}
    assert secrets_of(b) == {"K": "b"}


def test_different_environments_never_share(poller: SharedPoller, client: FakeClient) -> None:
    fetch(poller, env=ENV)
    fetch(poller, env=ENV2)
    assert [c[0] for c in client.calls] == [ENV, ENV2]


def test_a_stale_answer_is_revalidated_with_the_pollers_own_version(
    poller: SharedPoller, client: FakeClient, clock: Clock,
) -> None:
    fetch(poller)
    clock.now += 7
    # The caller needs a full fetch (known None), yet the wire carries a conditional
    # request: the poller holds version 5's secrets and a 304 confirms them.
    result = fetch(poller, known=None)
    assert client.calls[-1][2] == 5
    assert secrets_of(result) == {"K": "a"}
    assert result.age == 0


def test_a_new_version_replaces_the_cached_secrets(
    poller: SharedPoller, client: FakeClient, clock: Clock,
) -> None:
    fetch(poller)
    client.version, client.secrets[TOKEN_A] = 6, {"K": "new"}
    clock.now += 7
    result = fetch(poller, known=5)
    assert isinstance(result, himitsu.Fetched)
    assert (result.version, dict(result.secrets)) == (6, {"K": "new"})


def test_max_age_zero_always_asks_himitsu(poller: SharedPoller, client: FakeClient) -> None:
    fetch(poller)
    fetch(poller, known=5, max_age=0.0)
    assert len(client.calls) == 2


def test_concurrent_readers_wait_for_one_request(
    poller: SharedPoller, client: FakeClient,
) -> None:
    client.gate = threading.Event()
    results: list[himitsu.FetchResult] = []
    threads = [threading.Thread(target=lambda: results.append(fetch(poller, max_age=0.0)))
               for _ in range(8)]
    for t in threads:
        t.start()
    deadline = threading.Event()
    while not client.calls and not deadline.wait(0.01):
        pass
    client.gate.set()
    for t in threads:
        t.join(10)
    # max_age 0 for everyone, and still only the in-flight request is made: an answer
    # that arrives while a caller waits is as fresh as its own request would be.
    assert len(client.calls) == 1
    assert len(results) == 8


def test_a_failed_request_fails_its_waiters_and_is_not_cached(
    poller: SharedPoller, client: FakeClient, clock: Clock,
) -> None:
    client.error = himitsu.ServerError("the Himitsu API answered 503", status=503)
    with pytest.raises(himitsu.ServerError):
        fetch(poller)
    client.error = None
    clock.now += FAILURE_HOLD
    assert secrets_of(fetch(poller)) == {"K": "a"}
    assert len(client.calls) == 2


def test_a_429_holds_every_reader_of_the_source_until_retry_after(
    poller: SharedPoller, client: FakeClient, clock: Clock,
) -> None:
    client.error = himitsu.RateLimited("rate limited", retry_after=30)
    with pytest.raises(himitsu.RateLimited):
        fetch(poller)
    client.error = None
    clock.now += 10
    with pytest.raises(himitsu.RateLimited) as held:
        fetch(poller, max_age=0.0)
    assert held.value.retry_after == pytest.approx(20)
    assert len(client.calls) == 1
    clock.now += 21
    fetch(poller, max_age=0.0)
    assert len(client.calls) == 2


def test_a_paced_request_is_not_sent_and_keeps_its_place(
    client: FakeClient, clock: Clock,
) -> None:
    poller = SharedPoller(client, clock=clock,
                          pacer=Pacer(clock=clock, token_budget=30, window=60.0))  # burst 3
    envs = [f"4444444{i}-1111-1111-1111-111111111111" for i in range(5)]
    for env in envs[:3]:
        fetch(poller, env=env)
    with pytest.raises(LocallyRateLimited) as paced:
        fetch(poller, env=envs[3])
    assert len(client.calls) == 3  # the paced request was never sent
    fetch(poller, env=envs[3], token=TOKEN_B)  # another token has its own budget
    clock.now += paced.value.retry_after
    fetch(poller, env=envs[3])  # back at its place: sent
    assert len(client.calls) == 5


def test_requests_per_api_url_are_paced_across_tokens(client: FakeClient, clock: Clock) -> None:
    # Himitsu limits each client IP (before auth): every token this operator holds shares
    # that budget, so many tokens must not add up past it.
    for n in range(3):
        client.secrets[f"himi_{n:016d}_" + "C" * 43] = {"K": str(n)}
    tokens = [t for t in client.secrets if t.startswith("himi_0")]
    poller = SharedPoller(client, clock=clock,
                          pacer=Pacer(clock=clock, token_budget=50, api_budget=20))  # bursts 5, 2
    for token in tokens[:2]:
        poller.fetch(api_url=API, project_id=PROJECT, environment_id=ENV, token=token,
                     known_version=None)
    with pytest.raises(LocallyRateLimited):
        poller.fetch(api_url=API, project_id=PROJECT, environment_id=ENV, token=tokens[2],
                     known_version=None)
    assert len(client.calls) == 2
    other = "https://other.example.com"  # another API has its own budget
    poller.fetch(api_url=other, project_id=PROJECT, environment_id=ENV, token=tokens[2],
                 known_version=None)
    assert len(client.calls) == 3


# -- conditional after a restart, eviction and in-flight requests (issue 11, item 3) ------


@pytest.mark.parametrize("version", [5, 0])
def test_with_nothing_cached_the_version_the_caller_holds_goes_on_the_wire(
    poller: SharedPoller, client: FakeClient, version: int,
) -> None:
    # A fresh poller (a restart, a failover) and a target in sync at ``version``: a 304,
    # not a full fetch. Version 0 (an empty environment) too: Himitsu answers it 304.
    client.version = version
    result = fetch(poller, known=version)
    assert client.calls == [(ENV, TOKEN_A, version)]
    assert result == himitsu.NotModified(version)


def test_a_304_to_the_callers_version_does_not_serve_a_caller_needing_the_secrets(
    poller: SharedPoller, client: FakeClient,
) -> None:
    assert fetch(poller, known=5) == himitsu.NotModified(5)
    assert secrets_of(fetch(poller, known=None)) == {"K": "a"}  # a repair: the full data
    assert [c[2] for c in client.calls] == [5, None]
    assert fetch(poller, known=5, max_age=0.0) == himitsu.NotModified(5)
    assert client.calls[-1][2] == 5  # now conditional on what the poller holds


def test_more_than_64_sources_idle_for_hours_stay_conditional(
    poller: SharedPoller, client: FakeClient, clock: Clock,
) -> None:
    envs = [f"55555555-5555-5555-5555-{i:012d}" for i in range(70)]
    for env in envs:
        fetch(poller, env=env)
        clock.now += 1.0  # past the pace
    clock.now += 2 * 3600  # every entry idle past its eviction age
    client.calls.clear()
    for env in envs:
        assert fetch(poller, env=env, known=5) == himitsu.NotModified(5)
        clock.now += 1.0
    assert [c[2] for c in client.calls] == [5] * len(envs)


class GatedClient(FakeClient):
    """Holds requests for ``held`` environments until ``release_gate`` is set."""

    def __init__(self, held: str) -> None:
        super().__init__()
        self.held = held
        self.entered = threading.Event()
        self.release_gate = threading.Event()

    def fetch(
        self, *, api_url: str, project_id: str, environment_id: str, token: str,
        known_version: int | None,
    ) -> himitsu.FetchResult:
        if environment_id == self.held:
            self.entered.set()
            assert self.release_gate.wait(10)
        return super().fetch(api_url=api_url, project_id=project_id,
                             environment_id=environment_id, token=token,
                             known_version=known_version)


def in_flight(poller: SharedPoller, client: GatedClient, **kwargs: Any) -> Callable[[], Any]:
    """Start a fetch for the held environment in a thread; wait until it is on the wire.
    Returns a function that lets it finish and gives its result (or raises its error)."""
    outcome: list[Any] = []

    def run() -> None:
        try:
            outcome.append(fetch(poller, env=client.held, **kwargs))
        except Exception as exc:
            outcome.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    assert client.entered.wait(10)

    def finish() -> Any:
        client.release_gate.set()
        thread.join(10)
        if isinstance(outcome[0], Exception):
            raise outcome[0]
        return outcome[0]

    return finish


def test_an_eviction_never_races_a_request_in_flight(clock: Clock) -> None:
    client = GatedClient(held=ENV)
    poller = SharedPoller(client, clock=clock)
    client.release_gate.set()
    fetch(poller)  # ENV's entry, soon idle for hours
    client.release_gate.clear()
    clock.now += 2 * 3600
    finish = in_flight(poller, client, known=5, max_age=0.0)
    for i in range(70):  # other sources answered meanwhile: each runs the eviction
        clock.now += 1.0
        fetch(poller, env=f"66666666-6666-6666-6666-{i:012d}")
    assert finish() == himitsu.NotModified(5)


def test_a_release_during_a_request_in_flight_drops_the_entry_after_the_answer(
    clock: Clock,
) -> None:
    client = GatedClient(held=ENV)
    poller = SharedPoller(client, clock=clock)
    finish = in_flight(poller, client, known=None, reader="ns/a")
    poller.release("ns/a")
    assert secrets_of(finish()) == {"K": "a"}
    fetch(poller, reader="ns/b", max_age=float("inf"))  # nothing kept for a new reader
    assert [c[2] for c in client.calls] == [None, None]


# -- memory follows live readers (issue 12, item 3) -------------------------------------


def test_an_entry_goes_with_its_last_reader(
    poller: SharedPoller, client: FakeClient,
) -> None:
    fetch(poller, reader="ns/a")
    fetch(poller, reader="ns/b")
    poller.release("ns/a")
    fetch(poller, reader="ns/b")  # still remembered for ns/b
    assert len(client.calls) == 1
    poller.release("ns/b")
    poller.release("ns/b")  # twice, or never enlisted: harmless
    poller.release("ns/never")
    result = fetch(poller, reader="ns/c", max_age=float("inf"))
    assert secrets_of(result) == {"K": "a"}
    assert [c[2] for c in client.calls] == [None, None]  # asked again, in full


def test_a_reader_moving_to_another_source_leaves_the_old_one(
    poller: SharedPoller, client: FakeClient,
) -> None:
    fetch(poller, reader="ns/a", env=ENV)
    fetch(poller, reader="ns/a", env=ENV2)  # its spec now names another environment
    fetch(poller, reader="ns/b", env=ENV2)
    assert len(client.calls) == 2
    fetch(poller, reader="ns/b", env=ENV, max_age=float("inf"))
    assert [c[0] for c in client.calls] == [ENV, ENV2, ENV]  # ENV was forgotten


def test_live_readers_keep_their_source_however_long_idle(
    poller: SharedPoller, client: FakeClient, clock: Clock,
) -> None:
    # Memory follows live objects, not age: a refreshInterval of a day, or 0, keeps its
    # entry, so a repair is still a 304 rebuilt from memory (no secret on the wire).
    envs = [f"77777777-7777-7777-7777-{i:012d}" for i in range(70)]
    for env in envs:
        fetch(poller, env=env, reader=f"ns/{env}")
        clock.now += 1.0
    clock.now += 2 * 3600
    client.calls.clear()
    for env in envs:
        secrets_of(fetch(poller, env=env, reader=f"ns/{env}", known=None, max_age=0.0))
        clock.now += 1.0
    assert [c[2] for c in client.calls] == [5] * len(envs)


def test_a_429_takes_nothing_away_from_an_answer_the_caller_may_still_take(
    poller: SharedPoller, client: FakeClient, clock: Clock,
) -> None:
    # Issue 11 review E: the block was checked before the cache, so one 429 (a repair's
    # request) failed every reader of the source, even those asking for an answer it
    # already held (a label-only spec edit takes one up to half an interval old).
    fetch(poller, reader="ns/a")
    clock.now += 10
    client.error = himitsu.RateLimited("rate limited", retry_after=30)
    with pytest.raises(himitsu.RateLimited):
        fetch(poller, max_age=0.0, reader="ns/b")
    assert secrets_of(fetch(poller, max_age=30.0, reader="ns/c")) == {"K": "a"}
    assert isinstance(fetch(poller, known=5, max_age=30.0), himitsu.NotModified)
    with pytest.raises(Blocked):  # not sent: the caller waits, as for our own pacing
        fetch(poller, max_age=5.0)
    assert len(client.calls) == 2


@pytest.mark.parametrize("error", [
    himitsu.ServerError("the Himitsu API answered 503", status=503),
    himitsu.TransportError("connection refused"),
])
def test_a_failed_source_is_not_asked_again_for_a_moment(
    poller: SharedPoller, client: FakeClient, clock: Clock, error: Exception,
) -> None:
    # A mass repair during an outage: one request per source, not one per object.
    client.error = error
    with pytest.raises(type(error)):
        fetch(poller, max_age=0.0)
    for _ in range(10):
        with pytest.raises(Blocked) as held:
            fetch(poller, max_age=2.0)
        assert 0 < held.value.retry_after <= FAILURE_HOLD
    assert len(client.calls) == 1
    clock.now += FAILURE_HOLD
    client.error = None
    assert secrets_of(fetch(poller, max_age=0.0)) == {"K": "a"}


def test_remembered_gives_the_secrets_of_exactly_this_source(
    poller: SharedPoller, client: FakeClient, clock: Clock,
) -> None:
    def remembered(token: str, env: str = ENV) -> himitsu.Fetched | None:
        return poller.remembered(api_url=API, project_id=PROJECT, environment_id=env,
                                 token=token)

    assert remembered(TOKEN_A) is None
    fetch(poller, reader="ns/a")
    clock.now += 100
    held = remembered(TOKEN_A)
    assert held is not None and held.secrets == {"K": "a"} and held.age == 100
    assert remembered(TOKEN_B) is None and remembered(TOKEN_A, env=ENV2) is None
    poller.release("ns/a")
    assert remembered(TOKEN_A) is None


def test_an_answers_age_counts_from_when_its_request_was_sent(
    poller: SharedPoller, client: FakeClient, clock: Clock,
) -> None:
    # A caller that joins a flight sent before it arrived sees an age above zero: Himitsu
    # answered from before the caller began (the reconciler revalidates a repair then).
    client.gate = threading.Event()
    results: list[himitsu.FetchResult] = []
    leader = threading.Thread(target=lambda: results.append(fetch(poller, max_age=0.0)))
    leader.start()
    deadline = threading.Event()
    while not client.calls and not deadline.wait(0.01):
        pass
    clock.now += 3.0  # the request is on the wire for 3 s
    (flight,) = poller._flights.values()
    waiting = threading.Event()

    class Done(threading.Event):
        def wait(self, timeout: float | None = None) -> bool:
            waiting.set()
            return super().wait(timeout)

    flight.done = Done()
    joiner = threading.Thread(target=lambda: results.append(fetch(poller, max_age=2.0)))
    joiner.start()
    assert waiting.wait(10)  # the joiner waits on the flight
    client.gate.set()
    leader.join(10)
    joiner.join(10)
    assert len(client.calls) == 1
    assert [r.age for r in results] == [3.0, 3.0]
