"""Tests for the write path under hostile answers (review of issue 11 items 1/5 and issue
12 item 4): a refusal never costs the application its Secret, a terminating target is
never deleted again, lost races are paced and reported, and no value we sent comes back
through a refusal's message into status, Events or the log.
"""

from __future__ import annotations

import base64
import io
import json

import pytest
from fakes import b64
from reconcile_world import CANARY, NS, TARGET, World, fetched, merge_world

from himitsu_controller import api
from himitsu_controller.runtime.metrics import REGISTRY
from himitsu_controller.sync.ports import Conflict, KubeError
from himitsu_controller.sync.reconciler import CONFLICT_REQUEUE, RACES_REPORTED
from himitsu_controller.sync.target import scrub

TLS = {"tls.crt": f"{CANARY}-crt", "tls.key": f"{CANARY}-key"}
WRITES = ("dry_run_create_secret", "create_secret", "update_secret", "delete_secret")


def writes_of(world: World) -> list[str]:
    return [call for call in world.kube.order if call in WRITES]


# --- a terminating target (finalizers) --------------------------------------------------


def test_a_type_change_on_a_secret_with_a_finalizer_deletes_it_once_and_waits() -> None:
    # On main: 20 DELETEs in 10 s against a Secret its finalizer held, Ready True.
    world = World()
    world.sync(5, TLS)
    world.kube.edit_secret(NS, TARGET, metadata={
        **world.target()["metadata"], "finalizers": ["example.com/hold"]})
    world.edit_target_spec(type="kubernetes.io/tls")
    world.kube.order.clear()

    results = [world.reconcile(fetched(5, TLS)) for _ in range(6)]

    assert writes_of(world).count("delete_secret") == 1
    assert writes_of(world).count("dry_run_create_secret") == 1
    assert world.target()["metadata"]["deletionTimestamp"]
    assert world.data() == TLS, "the terminating Secret still holds the data"
    ready = world.ready()
    assert (ready["status"], ready["reason"]) == ("False", "WriteFailure")
    assert "waiting for the Secret's finalizers" in ready["message"]
    assert "example.com/hold" in ready["message"]
    delays = [r.requeue_after or 0.0 for r in results[1:]]
    assert delays == sorted(delays) and delays[-1] > delays[0], "no backoff"

    world.kube.finish_deletion(NS, TARGET)
    world.sync(5, TLS)
    assert world.target()["type"] == "kubernetes.io/tls" and world.data() == TLS
    assert world.ready()["reason"] == "Synced"


def test_a_terminating_target_is_never_written() -> None:
    world = World()
    world.sync(5)
    world.kube.edit_secret(NS, TARGET, metadata={
        **world.target()["metadata"], "finalizers": ["example.com/hold"],
        "deletionTimestamp": "2024-05-06T07:08:09Z"})
    world.kube.order.clear()
    world.clock.advance(60)
    result = world.reconcile(fetched(6, {"KEY_0": "new"}))
    assert result.error == "WriteFailure"
    assert writes_of(world) == []


# --- lost races ------------------------------------------------------------------------------


def test_races_lost_in_a_row_back_off_and_are_reported() -> None:
    # On main: a create refused as "already exists" forever was a silent 0.5 s requeue
    # with Ready still True.
    world = World()
    world.sync(5)
    del world.kube.secrets[(NS, TARGET)]
    world.clock.advance(60)
    world.kube.fail_next["create_secret"] = [
        Conflict(f"Secret {TARGET!r} already exists", status=409) for _ in range(20)]

    results = [world.reconcile(fetched(6)) for _ in range(RACES_REPORTED + 2)]

    quiet = results[:RACES_REPORTED - 1]
    assert [r.error for r in quiet] == [None] * len(quiet)
    assert [r.requeue_after for r in quiet] == [
        CONFLICT_REQUEUE * 2 ** i for i in range(len(quiet))]
    assert all(r.error == "WriteFailure" for r in results[RACES_REPORTED - 1:])
    ready = world.ready()
    assert (ready["status"], ready["reason"]) == ("False", "WriteFailure")
    assert f"last {RACES_REPORTED + 2} writes" in ready["message"]

    world.kube.fail_next["create_secret"].clear()
    world.sync(6)
    assert world.ready()["reason"] == "Synced"
    world.kube.fail_next["update_secret"] = [Conflict("changed", status=409)]
    world.clock.advance(60)
    assert world.reconcile(fetched(7)).requeue_after == CONFLICT_REQUEUE  # counted anew


# --- a replacement the apiserver refuses after the delete ---------------------------------


def test_a_replacement_refused_after_the_delete_puts_the_old_secret_back() -> None:
    # A webhook that judges a dry run otherwise than the real create.
    world = World()
    world.sync(5, TLS)
    before = world.target()
    world.edit_target_spec(type="kubernetes.io/tls")
    world.kube.fail_next["create_secret"] = [KubeError(
        "creating Secret 'app-secrets' failed: 403 Forbidden: admission webhook "
        '"x.example.com" denied the request', status=403, reason="Forbidden")]

    result = world.reconcile(fetched(5, TLS))

    assert result.error == "WriteFailure"
    restored = world.target()
    assert restored["type"] == before["type"] and restored["data"] == before["data"]
    assert restored["metadata"]["labels"] == before["metadata"]["labels"]
    assert restored["metadata"]["annotations"] == before["metadata"]["annotations"]
    assert "created again as it was" in world.ready()["message"]


def test_a_replacement_keeps_foreign_metadata_and_immutable() -> None:
    world = World()
    world.sync(5, TLS)
    meta = world.target()["metadata"]
    world.kube.edit_secret(NS, TARGET, immutable=True, metadata={
        **meta, "labels": {**meta["labels"], "team": "shop"},
        "annotations": {**meta["annotations"], "reloader.stakater.com/match": "true"}})
    world.edit_target_spec(type="kubernetes.io/tls")
    world.sync(5, TLS)
    target = world.target()
    assert target["type"] == "kubernetes.io/tls" and target.get("immutable") is True
    assert target["metadata"]["labels"]["team"] == "shop"
    assert target["metadata"]["labels"][api.LABEL_MANAGED] == "true"
    assert target["metadata"]["annotations"]["reloader.stakater.com/match"] == "true"


# --- service-account-token ---------------------------------------------------------------


def test_merging_into_an_existing_service_account_token_secret_still_works() -> None:
    world = merge_world(target_type="kubernetes.io/service-account-token")
    sa = world.target()
    world.kube.edit_secret(NS, TARGET, type="kubernetes.io/service-account-token", metadata={
        **sa["metadata"], "annotations": {"kubernetes.io/service-account.name": "default",
                                         api.ANN_ALLOW_MERGE_BY: "*"}},
        data={"token": b64("sa-token"), "ca.crt": b64("ca"), "namespace": b64(NS)})
    world.sync(5, {"EXTRA": "x"})
    assert world.data()["EXTRA"] == "x" and world.data()["token"] == "sa-token"


def test_creating_a_service_account_token_secret_is_still_refused() -> None:
    world = World(target_type="kubernetes.io/service-account-token")
    assert world.reconcile(fetched(5, {"token": "t"})).error == "InvalidSpec"
    assert writes_of(world) == []


# --- redaction by content ------------------------------------------------------------------


def _echoes(value: str) -> list[str]:
    """Ways a denial may print a value we sent: bare, base64, Go %q, JSON, one line."""
    raw = value.encode()
    return [
        f"got {value}", f"got {base64.b64encode(raw).decode()}",
        "got " + json.dumps(value)[1:-1], f"value={value};",
        f"first line {value.splitlines()[0]}",
    ]


MULTILINE = f"-----BEGIN KEY-----\n{CANARY}-line-one\n\"quoted\"\t{CANARY}\n-----END KEY-----"


@pytest.mark.parametrize("echo", _echoes(MULTILINE) + _echoes(f"{CANARY}-plain"))
@pytest.mark.parametrize("call", ["dry_run_create_secret", "create_secret", "update_secret"])
def test_no_value_we_sent_reaches_status_events_or_the_log(
    echo: str, call: str, log_stream: io.StringIO,
) -> None:
    secrets = {"tls.crt": MULTILINE, "tls.key": f"{CANARY}-plain"}
    world = World()
    if call != "create_secret":
        world.sync(5, secrets)
    if call == "dry_run_create_secret":
        world.edit_target_spec(type="kubernetes.io/tls")
    if call == "update_secret":
        secrets = {**secrets, "tls.key": f"{CANARY}-plain-2"}
        echo = echo.replace(f"{CANARY}-plain", f"{CANARY}-plain-2")
        world.clock.advance(60)
    world.kube.fail_next[call] = [KubeError(
        f"writing failed: 403 Forbidden: a shape nobody redacts: {echo}",
        status=403, reason="Forbidden")]

    result = world.reconcile(fetched(6, secrets))

    assert result.error == "WriteFailure"
    shown = json.dumps(world.status()) + json.dumps([e.message for e in world.kube.events])
    shown += log_stream.getvalue()
    assert "a shape nobody redacts" in shown
    assert CANARY not in shown
    assert "Q0FOQVJZ" not in shown  # base64 of the canary


def test_scrub_replaces_the_longest_form_first() -> None:
    forms = scrub.forms_of([b64("abcd"), b64("abcdefgh")])
    assert scrub.scrub("x abcdefgh y abcd", forms) == "x [redacted] y [redacted]"
    assert scrub.forms_of([b64("abc")]) == ["YWJj"]  # "abc" itself is too short to scrub


# --- a GitOps fight is visible -----------------------------------------------------------


def _writes(operation: str) -> float:
    return REGISTRY.get_sample_value(
        "himitsu_secret_writes_total", {"operation": operation}) or 0.0


def test_putting_back_pruned_stamps_counts_as_a_relabel_not_an_update() -> None:
    world = World()
    world.sync(5)
    updates, relabels = _writes("update"), _writes("relabel")
    for _ in range(3):  # a GitOps tool prunes our labels and annotations, we put them back
        meta = world.target()["metadata"]
        meta.pop("labels")
        meta.pop("annotations")
        world.kube.edit_secret(NS, TARGET, metadata=meta)
        world.sync(5)
        assert world.target()["metadata"]["labels"][api.LABEL_MANAGED] == "true"
    assert (_writes("update"), _writes("relabel")) == (updates, relabels + 3)
    world.clock.advance(60)
    world.sync(6, {"KEY_0": "changed"})
    assert (_writes("update"), _writes("relabel")) == (updates + 1, relabels + 3)
