"""Tests for reconciler.py: failures, timing, Events and secrecy.

Every Ready=False reason with its actionable message, the promise that no failure ever
empties or shrinks a target, the requeue and backoff schedule, one Event per transition
rather than per poll, and a canary proving that no token or secret value leaves through
a log line, an Event, a status message or an exception string.
"""

from __future__ import annotations

import base64
import copy
import io
import json
from collections.abc import Callable
from typing import Any

import pytest
import structlog
from fakes import b64
from reconcile_world import (
    CANARY,
    NAME,
    NS,
    TARGET,
    TOKEN,
    TOKEN_SECRET_PART,
    World,
    fetched,
    set_token,
    values,
)

from himitsu_controller import api, himitsu
from himitsu_controller.sync.polling import schedule
from himitsu_controller.sync.polling.polls import LocallyRateLimited
from himitsu_controller.sync.ports import Conflict, KubeError


@pytest.fixture
def world() -> World:
    return World()


# --- reasons ---------------------------------------------------------------------------


UNUSABLE = "key 'token' of Secret 'himitsu-token' does not hold a usable Himitsu API key"
AUTH_CASES: list[tuple[str, Callable[[World], None], list[Any], str]] = [
    ("missing secret", lambda w: set_token(w, None), [],
     "token Secret 'himitsu-token' not found in namespace 'apps'"),
    ("missing key", lambda w: set_token(w, {"other": b64(TOKEN)}), [], UNUSABLE),
    ("empty", lambda w: set_token(w, {"token": b64("  \n")}), [], UNUSABLE),
    ("binary", lambda w: set_token(w, {"token": "//79"}), [], UNUSABLE),
    ("malformed", lambda w: set_token(w, {"token": b64(TOKEN[:-3])}), [], UNUSABLE),
    ("401", lambda w: None, [himitsu.Unauthorized("the Himitsu API rejected the token (401)",
                                                  status=401)], "rejected the token"),
    ("403", lambda w: None, [himitsu.Forbidden("the token may not read this environment (403)",
                                               status=403)], "may not read"),
]


@pytest.mark.parametrize(("arrange", "script", "message"),
                         [c[1:] for c in AUTH_CASES], ids=[c[0] for c in AUTH_CASES])
def test_authentication_failures(
    world: World, arrange: Callable[[World], None], script: list[Any], message: str,
) -> None:
    arrange(world)
    result = world.reconcile(*script)
    assert result.error == "AuthenticationFailure"
    ready = world.ready()
    assert (ready["status"], ready["reason"]) == ("False", "AuthenticationFailure")
    assert message in ready["message"]
    if not script:
        assert world.fetcher.calls == []


def test_authsecretref_tells_nothing_of_a_secret_beyond_its_existence() -> None:
    """Whoever may create a HimitsuSecret, not read Secrets, probes another Secret of the
    namespace with authSecretRef: a missing key, an empty, binary or text value all read
    the same (the operator's log says which, with no value and no length)."""
    world = World()
    world.kube.put_secret({"metadata": {"namespace": NS, "name": "db-creds"}, "data": {
        "password": b64("hunter2"), "blob": "//79", "empty": ""}})
    seen: dict[str, str] = {}
    with structlog.testing.capture_logs() as logs:
        for key in ("password", "user", "blob", "empty"):
            world.edit_spec(authSecretRef={"name": "db-creds", "key": key})
            assert world.reconcile().error == "AuthenticationFailure"
            seen[key] = world.ready()["message"].replace(key, "K")
    assert len(set(seen.values())) == 1, seen
    details = {e["key"]: e["detail"] for e in logs if e["event"] == "token unusable"}
    assert len(set(details.values())) == 4, details  # the operator can tell them apart
    assert not any("hunter2" in str(e) or "7" in str(e.get("detail")) for e in logs)


def test_token_whitespace_is_trimmed(world: World) -> None:
    set_token(world, {"token": b64(f"  {TOKEN}\n")})
    world.sync(5)
    assert world.fetcher.calls[0].token == TOKEN


@pytest.mark.parametrize("error", [
    himitsu.Unauthorized("401", status=401), himitsu.Forbidden("403", status=403)])
def test_rejected_token_is_re_read_at_once(world: World, error: Exception) -> None:
    world.reconcile(error)
    assert world.kube.forgotten == [(NS, "himitsu-token")]


FETCH_CASES: list[tuple[str, Exception, str]] = [
    ("404", himitsu.NotFound("environment not found (404 NOT_FOUND)", status=404),
     "not found"),
    ("5xx", himitsu.ServerError("the Himitsu API answered 503", status=503), "503"),
    ("transport", himitsu.TransportError("connection refused"), "connection refused"),
    ("undecodable", himitsu.Undecodable("the 200 answer is not the documented shape"),
     "documented shape"),
    ("unexpected", himitsu.UnexpectedStatus("unexpected status 302", status=302), "302"),
]


@pytest.mark.parametrize(("error", "message"), [c[1:] for c in FETCH_CASES],
                         ids=[c[0] for c in FETCH_CASES])
def test_fetch_failures(world: World, error: Exception, message: str) -> None:
    result = world.reconcile(error)
    assert result.error == "FetchFailure"
    assert world.ready()["reason"] == "FetchFailure"
    assert message in world.ready()["message"]


def test_rate_limited_waits_for_retry_after(world: World) -> None:
    result = world.reconcile(himitsu.RateLimited("rate limited", status=429, retry_after=42.0))
    assert result.error == "FetchFailure"
    assert result.requeue_after == 42.0
    assert world.ready()["message"] == "rate limited by the Himitsu API, retrying in 42 s"


INVALID_CASES: list[tuple[str, Callable[[World], None], list[Any], str]] = [
    ("bad spec", lambda w: w.edit_spec(refreshInterval="soon"), [], "not a Go duration"),
    ("bad url", lambda w: w.edit_spec(apiUrl="ftp://x"), [], "https://"),
    ("400", lambda w: None, [himitsu.BadRequest("the Himitsu API refused the request "
                                                "(400 INVALID_REQUEST)", status=400)],
     "400 INVALID_REQUEST"),
    ("bad keys", lambda w: None, [fetched(5, {"path/to:key": "v"})],
     "use template format Dotenv or Json"),
    ("too large", lambda w: None, [fetched(5, {"BIG": "x" * (1024 * 1024 + 1)})],
     "1 MiB"),
]


@pytest.mark.parametrize(("arrange", "script", "message"),
                         [c[1:] for c in INVALID_CASES], ids=[c[0] for c in INVALID_CASES])
def test_invalid_spec_failures(
    world: World, arrange: Callable[[World], None], script: list[Any], message: str,
) -> None:
    arrange(world)
    result = world.reconcile(*script)
    assert result.error == "InvalidSpec"
    assert world.ready()["reason"] == "InvalidSpec"
    assert message in world.ready()["message"]
    assert (NS, TARGET) not in world.kube.secrets


def test_secret_write_failure(world: World) -> None:
    world.kube.fail_next["create_secret"] = [
        KubeError("creating Secret 'app-secrets' failed: 403 Forbidden: denied", status=403)]
    result = world.reconcile(fetched(5))
    assert result.error == "WriteFailure"
    assert world.ready()["reason"] == "WriteFailure"
    assert "403 Forbidden" in world.ready()["message"]


def test_status_write_failure_is_a_write_failure(world: World) -> None:
    world.kube.fail_next["patch_status"] = [KubeError("updating status failed: 500", status=500)]
    result = world.reconcile(fetched(5))
    assert result.error == "WriteFailure"


def test_write_conflict_is_retried_promptly_without_a_failure(world: World) -> None:
    world.sync(5)
    world.kube.edit_secret(NS, TARGET, data={"x": b64("y")})  # someone else wrote
    world.kube.freeze_cache(NS, TARGET)
    world.kube.fail_next["update_secret"] = [Conflict("changed while writing", status=409)]
    events = len(world.kube.events)
    result = world.reconcile(fetched(5))
    assert result.error is None
    assert result.requeue_after is not None and result.requeue_after <= 1.0
    assert world.ready()["status"] == "True"
    assert len(world.kube.events) == events


# --- a failure never empties or shrinks a target ------------------------------------------


def _break_token(w: World) -> None:
    set_token(w, {"token": b64("nope")})


def _break_spec(w: World) -> None:
    w.edit_spec(projectId="nope")


def _break_write(w: World) -> None:
    w.kube.fail_next["update_secret"] = [KubeError("updating failed: 500", status=500)]


FAILURES: list[tuple[str, Callable[[World], None], list[Any]]] = [
    ("token missing", lambda w: set_token(w, None), []),
    ("token malformed", _break_token, []),
    ("401", lambda w: None, [himitsu.Unauthorized("401", status=401)]),
    ("403", lambda w: None, [himitsu.Forbidden("403", status=403)]),
    ("404", lambda w: None, [himitsu.NotFound("404", status=404)]),
    ("429", lambda w: None, [himitsu.RateLimited("429", status=429, retry_after=5)]),
    ("5xx", lambda w: None, [himitsu.ServerError("500", status=500)]),
    ("transport", lambda w: None, [himitsu.TransportError("reset")]),
    ("undecodable", lambda w: None, [himitsu.Undecodable("bad")]),
    ("400", lambda w: None, [himitsu.BadRequest("400", status=400)]),
    ("bad spec", _break_spec, []),
    ("empty environment with bad keys", lambda w: None, [fetched(6, {"a b": "x"})]),
    ("too large", lambda w: None, [fetched(6, {"BIG": "x" * (1024 * 1024 + 1)})]),
    ("write failure", _break_write, [fetched(6, {"KEY_0": "only"})]),
]


@pytest.mark.parametrize(("arrange", "script"), [c[1:] for c in FAILURES],
                         ids=[c[0] for c in FAILURES])
def test_a_failure_never_empties_or_shrinks_the_target(
    world: World, arrange: Callable[[World], None], script: list[Any],
) -> None:
    world.sync(5, values(3))
    before = world.target()
    arrange(world)
    world.annotate(api.ANN_FORCE_SYNC, "now")  # a 200 may come back: it must not be written
    result = world.reconcile(*script)
    assert result.error is not None
    assert world.target() == before
    status = world.status()
    assert (status["configVersion"], status["secretCount"]) == (5, 3)


# --- timing ----------------------------------------------------------------------------


@pytest.mark.parametrize(("rng", "expected"), [(0.0, 60.0), (0.5, 57.0), (0.999999, 54.0)])
def test_requeue_after_refresh_interval_minus_jitter(rng: float, expected: float) -> None:
    world = World(rng=rng)
    result = world.sync(5)
    assert result.requeue_after == pytest.approx(expected, abs=1e-3)
    assert result.requeue_after is not None and result.requeue_after <= 60.0


def test_a_shared_answer_aligns_the_next_poll_on_its_request(world: World) -> None:
    world.sync(5)
    result = world.poll(himitsu.NotModified(5, age=4.0))
    assert result.requeue_after == pytest.approx(56.0)
    assert world.fetcher.max_ages[-1] == pytest.approx(30.0)  # half the interval


def test_the_next_poll_counts_from_the_answer_not_from_the_end_of_the_reconcile(
    world: World, monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Readers of one answer whose status patches queue behind each other (client-side
    # QPS, a busy apiserver) must still come back together, or the group splits.
    world.sync(5)
    patch = world.kube.patch_status

    def slow_patch(namespace: str, name: str, status: dict[str, Any], *, uid: str = "") -> None:
        world.clock.advance(5.0)
        patch(namespace, name, status, uid=uid)

    monkeypatch.setattr(world.kube, "patch_status", slow_patch)
    result = world.poll(himitsu.NotModified(5, age=1.0))
    assert result.requeue_after == pytest.approx(60.0 - 1.0 - 5.0)


def test_a_repair_before_the_poll_takes_only_an_answer_seconds_old(world: World) -> None:
    # A deleted target is rebuilt from Himitsu's current data (the contract: a missing
    # target forces a full fetch), not from the answer the target held 30 s ago.
    world.sync(5)
    world.clock.advance(30)
    del world.kube.secrets[(NS, TARGET)]
    world.sync(5)
    assert world.fetcher.max_ages[-1] == schedule.FRESH
    world.clock.advance(60)  # the timed poll: the last half interval only
    world.reconcile(himitsu.NotModified(5))
    assert world.fetcher.max_ages[-1] == pytest.approx(30.0)


def test_a_spec_edit_keeping_the_source_rewrites_the_target_from_its_own_data(
    world: World,
) -> None:
    # A Helm upgrade touching every HimitsuSecret (here a template label) leaves the data
    # where it was: the stamps are put back around the data the target holds (its
    # data-hash vouches for it), asking Himitsu nothing, even with nothing in memory.
    world.sync(5)
    data = world.data()
    world.clock.advance(40)
    world.restart()
    world.reconcile()  # the new process's first look: nothing due
    world.edit_target_spec(template={"labels": {"team": "a"}})
    world.reconcile()
    assert len(world.fetcher.calls) == 1
    assert world.target()["metadata"]["labels"]["team"] == "a"
    assert world.data() == data and world.status()["observedGeneration"] == 2


def test_a_spec_edit_keeping_the_source_asks_nothing_with_workloads_to_restart_too(
    world: World,
) -> None:
    # The stamps go back around the data held, its data id with it: nothing to restart,
    # nothing to ask Himitsu.
    world.edit_spec(rolloutRestartTargets=[{"kind": "Deployment", "name": "web"}])
    world.sync(5)
    held = world.target()["metadata"]["annotations"][api.ANN_DATA_ID]
    world.clock.advance(40)
    world.edit_target_spec(template={"labels": {"team": "a"}})
    world.reconcile()
    assert len(world.fetcher.calls) == 1
    assert world.target()["metadata"]["labels"]["team"] == "a"
    assert world.target()["metadata"]["annotations"][api.ANN_DATA_ID] == held


def test_last_sync_time_is_when_himitsu_answered(world: World) -> None:
    # Readers of one shared answer record the same second, so after a restart they come
    # due together and share the first request again.
    world.sync(5)
    world.poll(himitsu.NotModified(5, age=4.0))
    assert world.status()["lastSyncTime"] == "2024-05-06T07:09:05Z"  # T0 + 60 s - 4 s


def test_a_wake_before_the_poll_with_nothing_changed_costs_nothing(world: World) -> None:
    # The echo of our own write (the target's watch event), a resync, a label edit.
    world.sync(5)
    patches, calls = len(world.kube.status_patches), dict(world.kube.calls)
    world.clock.advance(20)
    world.annotate("example.com/unrelated", "x")
    result = world.reconcile()  # no fetch scripted: none may be made
    assert result.error is None and result.requeue_after == pytest.approx(40.0)
    assert len(world.kube.status_patches) == patches
    assert world.kube.calls["get_secret"] == calls.get("get_secret", 0)  # no direct read
    assert world.kube.writes() == 1


def test_a_wake_before_the_poll_after_a_failure_retries(world: World) -> None:
    world.sync(5)
    world.poll(himitsu.ServerError("the Himitsu API answered 503", status=503))
    result = world.reconcile(himitsu.NotModified(5))
    assert result.error is None and world.ready()["reason"] == "Synced"


def test_readers_of_a_shared_answer_use_its_jitter_not_their_own() -> None:
    # Their own draws would spread them over the 10% window and split the group at its
    # edge every round; the answer's one draw brings them all back together.
    world = World(rng=0.9)
    world.sync(5)
    result = world.poll(himitsu.NotModified(5, age=4.0, jitter=0.5))
    assert result.requeue_after == pytest.approx(60.0 - 4.0 - 3.0)


def test_a_late_poll_accepts_answers_fetched_since_its_window_began(world: World) -> None:
    world.sync(5)  # rng 0: the next poll is due in exactly 60 s
    world.clock.advance(63)  # the queue had a backlog: 3 s late
    world.reconcile(himitsu.NotModified(5, age=8.0))
    assert world.fetcher.max_ages[-1] == pytest.approx(30.0 + 3.0)


def test_a_retry_after_a_failure_gets_no_lateness_allowance(world: World) -> None:
    world.sync(5)
    world.clock.advance(70)
    world.reconcile(himitsu.ServerError("503"))
    world.clock.advance(5)
    world.reconcile(himitsu.NotModified(5))
    assert world.fetcher.max_ages[-1] == pytest.approx(30.0)


def test_force_sync_never_takes_a_shared_answer(world: World) -> None:
    world.sync(5)
    world.annotate(api.ANN_FORCE_SYNC, "now")
    world.sync(5)
    assert world.fetcher.max_ages[-1] == 0.0


def test_local_pacing_requeues_quietly(world: World) -> None:
    world.sync(5)
    result = world.poll(LocallyRateLimited("paced", retry_after=3.0))
    assert result.error is None and result.requeue_after == pytest.approx(3.0)
    assert world.ready()["reason"] == "Synced"


def test_refresh_interval_zero_syncs_once() -> None:
    world = World(refreshInterval="0")
    result = world.sync(5)
    assert result.requeue_after is None and not result.requeue
    # A drift event still repairs the target.
    del world.kube.secrets[(NS, TARGET)]
    world.sync(5)
    assert world.data() == values()


def test_refresh_interval_zero_is_not_woken_into_a_poll_by_its_own_write() -> None:
    world = World(refreshInterval="0")
    world.sync(5)
    # The watch event of our own write wakes the reconciler: nothing to ask Himitsu.
    result = world.reconcile()
    assert world.fetcher.known_versions == [None]
    assert result.requeue_after is None and result.error is None
    # A force-sync still asks (and a full fetch it is).
    world.annotate(api.ANN_FORCE_SYNC, "now")
    world.sync(5)
    assert world.fetcher.known_versions == [None, None]


@pytest.mark.parametrize(("interval", "expected"), [
    ("1m", [1, 2, 4, 8, 16, 32, 60, 60]),
    ("1h", [1, 2, 4, 8, 16, 32, 64, 128, 256, 300, 300]),
    ("0", [1, 2, 4, 8, 16, 32, 64, 128, 256, 300, 300]),
    ("1s", [1, 1, 1]),
])
def test_failures_back_off_exponentially_capped(interval: str, expected: list[float]) -> None:
    world = World(refreshInterval=interval)
    delays = [world.reconcile(himitsu.ServerError("503", status=503)).requeue_after
              for _ in expected]
    assert delays == expected


def test_success_resets_the_backoff(world: World) -> None:
    for _ in range(3):
        world.reconcile(himitsu.TransportError("reset"))
    world.sync(5)
    assert world.poll(himitsu.TransportError("reset")).requeue_after == 1.0


def test_invalid_spec_before_parse_backs_off_too(world: World) -> None:
    world.edit_spec(refreshInterval="nonsense")
    assert [world.reconcile().requeue_after for _ in range(3)] == [1, 2, 4]


# --- events ----------------------------------------------------------------------------


def test_events_on_changes_and_transitions_not_per_poll(world: World) -> None:
    world.sync(5)
    for _ in range(3):
        world.poll(himitsu.NotModified(5))
    for _ in range(3):
        world.poll(himitsu.ServerError("the Himitsu API answered 503", status=503))
    world.annotate(api.ANN_FORCE_SYNC, "x")
    world.sync(6, values(1))
    assert [(e.type, e.reason) for e in world.kube.events] == [
        ("Normal", "Synced"), ("Warning", "FetchFailure"), ("Normal", "Synced")]
    assert all(e.name == NAME for e in world.kube.events)


def test_a_version_bump_with_the_same_data_records_no_event(world: World) -> None:
    world.sync(5)
    world.annotate(api.ANN_FORCE_SYNC, "again")
    world.sync(6)  # Himitsu bumped the version; the values are the same
    assert world.target()["metadata"]["annotations"][api.ANN_CONFIG_VERSION] == "6"
    assert [(e.type, e.reason) for e in world.kube.events] == [("Normal", "Synced")]


def test_ready_transition_time_kept_across_polls(world: World) -> None:
    world.sync(5)
    since = world.ready()["lastTransitionTime"]
    world.clock.advance(60)
    world.reconcile(himitsu.NotModified(5))
    assert world.ready()["lastTransitionTime"] == since
    assert world.status()["lastSyncTime"] != since


# --- the canary: no token or secret value ever leaves through a side channel -------------


def _to_merge(w: World) -> None:
    w.edit_target_spec(creationPolicy="Merge")


def _to_merge_over_foreign_values(w: World) -> None:
    # A foreign Secret whose keys collide with ours and whose values are canaries too.
    del w.kube.secrets[(NS, TARGET)]
    w.kube.put_secret({"metadata": {"namespace": NS, "name": TARGET},
                       "data": {"KEY_0": b64(CANARY + "-foreign")}})
    _to_merge(w)


def _canary_paths() -> list[tuple[Callable[[World], None], list[Any]]]:
    paths: list[tuple[Callable[[World], None], list[Any]]] = [
        (arrange, script) for _, arrange, script in FAILURES]
    paths += [(arrange, script) for _, arrange, script, _ in AUTH_CASES]
    paths += [
        (lambda w: set_token(w, {"token": b64(TOKEN + CANARY)}), []),
        (lambda w: set_token(w, {"token": b64("x" + TOKEN)}), []),
        (lambda w: set_token(w, {"token": base64.b64encode(b"\xff" + TOKEN.encode()).decode()}),
         []),
        (lambda w: None, [fetched(6, {"path/to:key": CANARY})]),
        (lambda w: w.edit_target_spec(template={"format": "Dotenv"}),
         [fetched(6, {"BAD KEY": CANARY})]),
        (lambda w: w.edit_target_spec(type="kubernetes.io/tls"), [fetched(6)]),
        (_to_merge, [fetched(6, values(3))]),
        (_to_merge_over_foreign_values, [fetched(6, values(3))]),
    ]
    return paths


def test_canary_never_leaves_through_logs_events_status_or_errors(
    log_stream: io.StringIO,
) -> None:
    outputs: list[str] = []
    for arrange, script in _canary_paths():
        world = World()
        world.sync(5, values(3))
        arrange(world)
        world.annotate(api.ANN_FORCE_SYNC, "now")
        try:
            result = world.reconcile(*copy.copy(script))
        except Exception as exc:  # an escaping exception is an output too
            outputs.append(f"{type(exc).__name__}: {exc!r} {exc}")
        else:
            outputs.append(repr(result))
        outputs.append(json.dumps(world.kube.himitsu_secrets[(NS, NAME)].get("status")))
        outputs.extend(repr(e) for e in world.kube.events)
    logged = log_stream.getvalue()
    assert "sync failed" in logged  # the capture works
    everything = "\n".join([*outputs, logged])
    # Any 8 consecutive characters of the token's secret part is a leak (a tail, a
    # prefix, a slice), as is any value or its base64 form.
    for start in range(len(TOKEN_SECRET_PART) - 8):
        assert TOKEN_SECRET_PART[start:start + 8] not in everything
    assert CANARY not in everything
    assert b64(CANARY)[:16] not in everything
