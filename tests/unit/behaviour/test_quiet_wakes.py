"""Wakes that are not due cost no Himitsu request and no status write (issue 21, items 2
and 3), through the real SharedPoller: only a missing or edited target, a changed source,
a force-sync and a due poll ask Himitsu. Repeated failures (item 6) rewrite nothing."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from fakes import b64
from reconcile_world import KEY, NS, TARGET, TOKEN, World, merge_world, values

from himitsu_controller import api, himitsu
from himitsu_controller.sync.polling.polls import SharedPoller


class CountingClient:
    """Himitsu at one version: answers 304 to that version, else the secrets."""

    def __init__(self, version: int = 5) -> None:
        self.version = version
        self.requests: list[int | None] = []

    def fetch(self, *, api_url: str, project_id: str, environment_id: str, token: str,
              known_version: int | None) -> himitsu.FetchResult:
        self.requests.append(known_version)
        if known_version == self.version:
            return himitsu.NotModified(self.version)
        return himitsu.Fetched(version=self.version, secrets=values())


def polled_world(interval: str, **spec: Any) -> tuple[World, CountingClient]:
    world = World(refreshInterval=interval, **spec)
    client = CountingClient()
    world.fetcher = SharedPoller(client, clock=lambda: world.clock().timestamp())  # type: ignore[assignment]
    world.restart()
    wake(world)  # the first sync: one request
    assert world.ready()["reason"] == "Synced" and client.requests == [None]
    return world, client


def wake(world: World) -> None:
    """A reconcile through the real poller (``World.reconcile`` scripts a fake one)."""
    world.reconciler.reconcile(KEY)


def annotate_target(world: World, key: str, value: str) -> None:
    meta = copy.deepcopy(world.target()["metadata"])
    meta.setdefault("annotations", {})[key] = value
    world.kube.edit_secret(NS, TARGET, metadata=meta)


@pytest.mark.parametrize("interval", ["0", "1h"])
@pytest.mark.parametrize("restarted", [False, True])
def test_foreign_annotations_on_the_target_ask_himitsu_nothing(
        interval: str, restarted: bool) -> None:
    world, client = polled_world(interval)
    patches = len(world.kube.status_patches)
    if restarted:  # a new process: nothing in the poller's memory
        world.restart()
        wake(world)
    for n in range(5):
        world.clock.advance(7)
        annotate_target(world, f"example.com/note-{n}", "x")
        wake(world)
    assert client.requests == [None]
    assert len(world.kube.status_patches) == patches  # nothing changed: nothing written
    assert world.ready()["reason"] == "Synced"


def test_a_foreign_key_written_into_a_merge_target_asks_himitsu_nothing() -> None:
    world = merge_world(refreshInterval="0")  # a Helm-owned Secret (that consents)
    client = CountingClient()
    world.fetcher = SharedPoller(client, clock=lambda: world.clock().timestamp())  # type: ignore[assignment]
    world.restart()
    wake(world)
    patches = len(world.kube.status_patches)
    target = world.target()
    world.kube.edit_secret(NS, TARGET, data={**target["data"], "OTHER": b64("someone's")})
    world.clock.advance(30)
    wake(world)
    assert client.requests == [None]
    assert len(world.kube.status_patches) == patches


def test_a_spec_edit_keeping_the_source_asks_himitsu_nothing_even_after_a_restart() -> None:
    world, client = polled_world("0")
    world.restart()
    wake(world)  # the new process's first look (its informer lists every object)
    world.clock.advance(30)
    world.edit_spec(refreshInterval="0s")
    wake(world)
    assert client.requests == [None]
    assert world.status()["observedGeneration"] == 2  # the one write that says something


def test_what_still_asks_himitsu_a_force_sync_an_edited_target_and_a_due_poll() -> None:
    world, client = polled_world("1m")
    world.annotate(api.ANN_FORCE_SYNC, "now")
    wake(world)
    world.clock.advance(3)  # a repair takes an answer at most 2 s old
    target = world.target()
    world.kube.edit_secret(NS, TARGET, data={**target["data"], "EXTRA": b64("by hand")})
    wake(world)
    world.clock.advance(60)
    wake(world)
    assert len(client.requests) == 4, client.requests


def test_a_due_poll_that_changes_only_last_sync_time_still_writes_it() -> None:
    world, _ = polled_world("1m")
    patches = len(world.kube.status_patches)
    world.clock.advance(60)
    wake(world)
    assert len(world.kube.status_patches) == patches + 1  # the contract's LAST SYNC


@pytest.mark.parametrize("removed", ["labels|team", "ownerReferences"])
def test_a_new_process_asks_conditionally_for_intact_data_and_puts_lost_stamps_back(
        removed: str) -> None:
    """A template label or the controller reference dropped from the target, then a new
    process (no poller memory): its data still matches its hash at the status's version,
    so If-None-Match is sent, and the 304 puts the stamps back around that data."""
    world, client = polled_world("1m", template={"labels": {"team": "a"}})
    before = copy.deepcopy(world.target())
    meta = copy.deepcopy(before["metadata"])
    part, _, key = removed.partition("|")
    (meta[part] if key else meta).pop(key or part)
    world.kube.edit_secret(NS, TARGET, metadata=meta)
    world.fetcher = SharedPoller(client, clock=lambda: world.clock().timestamp())  # type: ignore[assignment]
    world.restart()
    world.clock.advance(5)
    wake(world)
    assert client.requests == [None, 5]  # no secret read
    after = world.target()
    assert after["metadata"][part] == before["metadata"][part]
    assert (after["data"], after["metadata"]["uid"]) == (before["data"], before["metadata"]["uid"])
    assert world.ready()["reason"] == "Synced"


def test_a_304_puts_stamps_back_only_on_the_target_as_read_now_never_on_a_stale_copy(
) -> None:
    """The cache shows the target without its template label; someone has written it
    since: the 304 writes nothing on that copy, and the next wake puts the label back on
    the copy read now (and reads that one: the cache still lags), keeping the new note."""
    world, client = polled_world("1m", template={"labels": {"team": "a"}})
    meta = copy.deepcopy(world.target()["metadata"])
    meta["labels"].pop("team")
    world.kube.edit_secret(NS, TARGET, metadata=meta)
    world.kube.freeze_cache(NS, TARGET)
    annotate_target(world, "example.com/note", "x")
    world.fetcher = SharedPoller(client, clock=lambda: world.clock().timestamp())  # type: ignore[assignment]
    world.restart()
    world.clock.advance(5)
    updates = world.kube.calls["update_secret"]
    result = world.reconciler.reconcile(KEY)
    assert world.kube.calls["update_secret"] == updates and result.requeue_after is not None
    world.clock.advance(result.requeue_after)
    wake(world)
    target = world.target()
    assert target["metadata"]["labels"]["team"] == "a"
    assert target["metadata"]["annotations"]["example.com/note"] == "x"
    assert None not in client.requests[1:] and world.ready()["reason"] == "Synced"


# -- failures that repeat ---------------------------------------------------------------


def server_error(request_id: str) -> himitsu.ServerError:
    return himitsu.ServerError(
        f"Himitsu API answered 500 INTERNAL_ERROR: server error (requestId {request_id})",
        status=500, code="INTERNAL_ERROR", request_id=request_id)


def test_a_failure_that_repeats_writes_status_once_and_its_request_id_goes_to_the_event(
) -> None:
    world = World()
    world.sync(5)
    patches = len(world.kube.status_patches)
    for n in range(5):
        world.clock.advance(60)
        world.reconcile(server_error(f"req-{n}t"))
    ready = world.ready()
    assert (ready["reason"], "requestId" in ready["message"]) == ("FetchFailure", False)
    assert len(world.kube.status_patches) == patches + 1
    warnings = [e for e in world.kube.events if e.type == "Warning"]
    assert len(warnings) == 1 and "(requestId req-0t)" in warnings[0].message


def unauthorized() -> himitsu.Unauthorized:
    return himitsu.Unauthorized("Himitsu API answered 401 UNAUTHENTICATED (requestId r-1)",
                                status=401, code="UNAUTHENTICATED", request_id="r-1")


def test_a_refused_token_is_not_sent_again_until_its_backoff_ends_nor_status_rewritten(
) -> None:
    world = World(refreshInterval="10s")
    world.sync(5)
    world.clock.advance(10)
    result = world.reconcile(unauthorized())
    assert world.ready()["reason"] == "AuthenticationFailure"
    patches, sent, elapsed = len(world.kube.status_patches), 1, 0.0
    while elapsed < 3600:  # an hour of retries with the same token in its Secret
        assert result.requeue_after is not None and result.requeue_after <= 10
        world.clock.advance(result.requeue_after)
        elapsed += result.requeue_after
        before = len(world.fetcher.calls)
        world.fetcher.then(unauthorized())
        result = world.reconciler.reconcile(KEY)
        if len(world.fetcher.calls) > before:
            sent += 1
        else:
            world.fetcher.script.clear()
    assert sent <= 14, sent  # 1 s doubling to 30 min, not 360 (one per 10 s)
    assert len(world.kube.status_patches) == patches


def test_a_replaced_token_is_sent_within_seconds_however_long_it_was_refused() -> None:
    """Driven by the requeues the reconciler asks for, as the work queue would; the token
    Secret is replaced 20 minutes into the refusals, between two of them."""
    world = World(refreshInterval="5m")
    world.sync(5)
    world.clock.advance(300)
    new = TOKEN.replace("Canary", "Fresh1")
    answer: himitsu.FetchResult | Exception = unauthorized()
    elapsed, replace_at = 0.0, 1200.0
    while True:
        world.fetcher.then(answer)
        sent = len(world.fetcher.calls)
        result = world.reconciler.reconcile(KEY)
        world.fetcher.script.clear()
        if elapsed >= replace_at and len(world.fetcher.calls) > sent:
            break
        assert result.requeue_after is not None
        step = result.requeue_after
        if elapsed < replace_at <= elapsed + step:
            world.clock.advance(replace_at - elapsed)
            world.kube.put_secret({"metadata": {"namespace": NS, "name": "himitsu-token"},
                                   "data": {"token": b64(new)}})
            answer = himitsu.Fetched(version=5, secrets=values())
            step, elapsed = elapsed + step - replace_at, replace_at
        world.clock.advance(step)
        elapsed += step
    assert world.fetcher.calls[-1].token == new
    assert elapsed - replace_at <= 10, elapsed - replace_at
    assert world.ready()["reason"] == "Synced"


def test_a_repair_written_from_memory_while_himitsu_fails_is_revalidated_at_interval_0(
) -> None:
    """The one wake refreshInterval 0 still owes Himitsu: the revalidation of an answer
    written from memory while Himitsu refused (it must not be sent back to sleep)."""
    world, client = polled_world("0")
    world.clock.advance(30)
    failing = client.fetch

    def refuse(**kwargs: Any) -> himitsu.FetchResult:
        client.requests.append(kwargs["known_version"])
        raise himitsu.ServerError("Himitsu API answered 500", status=500)

    client.fetch = refuse  # type: ignore[method-assign]
    del world.kube.secrets[(NS, TARGET)]  # deleted: a repair, Himitsu failing
    result = world.reconciler.reconcile(KEY)
    assert world.target() and len(client.requests) == 2  # rebuilt from memory
    client.fetch = failing  # type: ignore[method-assign]
    assert result.requeue_after is not None
    world.clock.advance(result.requeue_after)
    wake(world)
    assert len(client.requests) == 3  # asked again once Himitsu may be asked
