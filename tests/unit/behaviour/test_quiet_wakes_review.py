"""Adversarial review of issue 21 items 2, 3, 6, 7 (quiet wakes): wakes judged "not due"
that should have asked Himitsu, and statuses the identical-status skip gets wrong.

Findings: a status another writer wiped is written again (fixed); a replaced token waits
for the next due poll (documented); a 429 whose Retry-After varies rewrites Ready's
message, once per 429 (kept: design.md). The rest held and stay as regression tests."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from fakes import b64
from reconcile_world import KEY, NS, TARGET, TOKEN, World, values

from himitsu_controller import api, himitsu
from himitsu_controller.sync.polling.polls import SharedPoller


class TokenClient:
    """Himitsu at one version, recording the token of every request."""

    def __init__(self, version: int = 5) -> None:
        self.version = version
        self.tokens: list[str] = []

    def fetch(self, *, api_url: str, project_id: str, environment_id: str, token: str,
              known_version: int | None) -> himitsu.FetchResult:
        self.tokens.append(token)
        if known_version == self.version:
            return himitsu.NotModified(self.version)
        return himitsu.Fetched(version=self.version, secrets=values())


def polled(interval: str, **spec: Any) -> tuple[World, TokenClient]:
    world = World(refreshInterval=interval, **spec)
    client = TokenClient()
    world.fetcher = SharedPoller(client, clock=lambda: world.clock().timestamp())  # type: ignore[assignment]
    world.restart()
    world.reconciler.reconcile(KEY)
    assert world.ready()["reason"] == "Synced" and client.tokens == [TOKEN]
    return world, client


NEW = TOKEN.replace("Canary", "Fresh1")


@pytest.mark.parametrize("interval", ["1m", "1h"])
def test_a_token_replaced_in_its_secret_is_sent_by_the_next_due_poll_never_later(
        interval: str) -> None:
    """The token Secret is not watched (that would cache every Secret): a wake that is
    not due asks nothing, and the next due poll reads the Secret and sends the new token.
    (The adapter's token cache may hold the old value up to 5 minutes: test_kube.py.)"""
    world, client = polled(interval)
    world.clock.advance(10)
    world.kube.edit_secret(NS, "himitsu-token", data={"token": b64(NEW)})
    result = world.reconciler.reconcile(KEY)  # the periodic resync
    assert len(client.tokens) == 1
    assert result.requeue_after is not None
    world.clock.advance(result.requeue_after)
    world.reconciler.reconcile(KEY)
    assert len(client.tokens) == 2 and client.tokens.count(NEW) == 1  # no token in the output


@pytest.mark.parametrize("interval", ["0", "1h"])
@pytest.mark.parametrize("restarted", [False, True])
def test_target_data_edited_keeping_every_stamp_is_repaired(interval: str, restarted: bool) -> None:
    world, _ = polled(interval)
    good = world.target()["data"]
    if restarted:
        world.restart()
    world.clock.advance(30)
    world.kube.edit_secret(NS, TARGET, data={**good, "KEY_0": b64("tampered")})
    world.reconciler.reconcile(KEY)
    assert world.target()["data"] == good


@pytest.mark.parametrize("restarted", [False, True])
def test_a_key_added_to_an_owner_target_is_removed_at_interval_0(restarted: bool) -> None:
    world, _ = polled("0")
    good = world.target()["data"]
    if restarted:
        world.restart()
    world.clock.advance(30)
    world.kube.edit_secret(NS, TARGET, data={**good, "EXTRA": b64("by hand")})
    world.reconciler.reconcile(KEY)
    world.clock.advance(3)
    world.reconciler.reconcile(KEY)
    assert world.target()["data"] == good


def test_a_target_type_change_is_repaired_at_interval_0() -> None:
    world, _ = polled("0")
    world.clock.advance(30)
    target = copy.deepcopy(world.target())
    target["type"] = "kubernetes.io/tls"
    world.kube.put_secret(target)
    world.reconciler.reconcile(KEY)
    world.clock.advance(3)
    world.reconciler.reconcile(KEY)
    assert world.target().get("type", "Opaque") == "Opaque"


def test_a_template_format_edit_rewrites_the_target() -> None:
    world, _ = polled("1h")
    world.clock.advance(30)
    world.edit_target_spec(template={"format": "Dotenv", "dataKey": ".env"})
    world.reconciler.reconcile(KEY)
    assert ".env" in world.target()["data"], world.target()["data"].keys()


@pytest.mark.parametrize("field,value", [
    ("environmentId", "33333333-3333-3333-3333-333333333333"),
    ("projectId", "44444444-4444-4444-4444-444444444444")])
def test_a_source_edit_asks_himitsu(field: str, value: str) -> None:
    world, client = polled("1h")
    world.restart()
    world.reconciler.reconcile(KEY)
    world.clock.advance(30)
    world.hsec["spec"][field] = value
    world.hsec["metadata"]["generation"] += 1
    world.reconciler.reconcile(KEY)
    assert len(client.tokens) == 2


def test_a_force_sync_after_a_restart_at_interval_0_asks_himitsu() -> None:
    world, client = polled("0")
    world.restart()
    world.clock.advance(30)
    world.annotate(api.ANN_FORCE_SYNC, "now")
    world.reconciler.reconcile(KEY)
    assert len(client.tokens) == 2
    assert world.status().get("lastForceSync") == "now"


def test_another_writers_condition_survives_a_failure_and_a_recovery() -> None:
    world = World()
    world.sync(5)
    status = world.hsec["status"]
    status["conditions"] = [*status["conditions"],
                            {"type": "example.com/Audited", "status": "True", "reason": "Ok",
                             "message": "", "lastTransitionTime": "2024-05-06T07:08:09Z"}]
    world.clock.advance(60)
    world.reconcile(himitsu.ServerError("Himitsu API answered 500", status=500))
    world.clock.advance(60)
    world.reconcile(himitsu.NotModified(5))
    types = [c["type"] for c in world.status()["conditions"]]
    assert "example.com/Audited" in types, types
    assert world.ready()["status"] == "True"


def test_a_5xx_outage_is_retried_neither_never_nor_in_a_hot_loop() -> None:
    world = World(refreshInterval="1h")
    world.sync(5)
    world.clock.advance(3600)
    delays = []
    for _ in range(12):
        result = world.reconcile(himitsu.ServerError("Himitsu API answered 503", status=503))
        assert result.requeue_after is not None
        delays.append(result.requeue_after)
        world.clock.advance(result.requeue_after)
    assert delays[0] >= 0.5 and max(delays) <= 3600, delays
    assert sum(delays) >= 60, delays


def rate_limited(seconds: float) -> himitsu.RateLimited:
    return himitsu.RateLimited("Himitsu API answered 429 RATE_LIMITED", status=429,
                               code="RATE_LIMITED", retry_after=seconds)


class LimitedClient:
    """Himitsu answering once, then 429 with each of ``retry_afters`` in turn."""

    def __init__(self, *retry_afters: float) -> None:
        self.retry_afters = list(retry_afters)
        self.asked = 0

    def fetch(self, **_: Any) -> himitsu.FetchResult:
        self.asked += 1
        if self.asked == 1:
            return himitsu.Fetched(version=5, secrets=values())
        raise rate_limited(self.retry_afters.pop(0))


def test_a_rate_limit_that_repeats_writes_status_at_most_once_per_429_and_never_between(
        ) -> None:
    """Ready's message says "rate limited, retrying in N s" (design.md), so a 429 whose
    Retry-After differs from the last one rewrites status: at most one write per 429
    answer. A wake while the shared poller holds the source back writes nothing."""
    world = World()
    client = LimitedClient(30, 29, 41, 17, 55)
    world.fetcher = SharedPoller(client, clock=lambda: world.clock().timestamp())  # type: ignore[assignment]
    world.restart()
    world.reconciler.reconcile(KEY)
    world.clock.advance(60)
    while client.retry_afters:
        asked, patches = client.asked, len(world.kube.status_patches)
        result = world.reconciler.reconcile(KEY)
        assert client.asked == asked + 1  # one 429 answer
        assert len(world.kube.status_patches) <= patches + 1
        assert result.requeue_after is not None
        world.clock.advance(result.requeue_after / 2)
        patches = len(world.kube.status_patches)
        world.reconciler.reconcile(KEY)  # a wake before its Retry-After
        assert (client.asked, len(world.kube.status_patches)) == (asked + 1, patches)
        world.clock.advance(result.requeue_after / 2)
    assert world.ready()["reason"] == "FetchFailure"


def test_a_spec_edit_during_a_repeated_failure_still_records_its_generation() -> None:
    world = World()
    world.sync(5)
    world.clock.advance(60)
    world.reconcile(himitsu.ServerError("Himitsu API answered 500", status=500))
    world.edit_spec(refreshInterval="2m")
    world.clock.advance(60)
    world.reconcile(himitsu.ServerError("Himitsu API answered 500", status=500))
    # status.observedGeneration is the last synced one; Ready's says what it judged.
    assert world.ready()["observedGeneration"] == 2


def test_a_status_wiped_by_another_writer_is_written_again_by_a_repeated_failure() -> None:
    """The identical-status skip compares with the status the object holds: one another
    writer replaced (kubectl --subresource=status, a restore) while the same failure
    repeats is written again."""
    world = World()
    world.sync(5)
    world.clock.advance(60)
    world.reconcile(himitsu.ServerError("Himitsu API answered 500", status=500))
    world.hsec["status"] = {}
    world.clock.advance(60)
    world.reconcile(himitsu.ServerError("Himitsu API answered 500", status=500))
    assert world.status().get("conditions"), world.status()
