"""What a first sync and a force-sync hold while Himitsu refuses (the model test's ``fresh``).

docs/syncing.md: a first sync holds Himitsu's current data, but while
Himitsu refuses (429, 5xx, unreachable, our own pacing) it writes what the operator
holds in memory for that very source at once and asks again as soon as it may; a
force-sync asks Himitsu itself, so it is not acknowledged (``status.lastForceSync``)
until Himitsu answers. The model-based test found both shapes (a spec edit onto another
environment, a force-sync, under a spent budget) and flagged them; they are the contract,
and these pin it: what is written meanwhile, and that the next answer brings the change.
"""

from __future__ import annotations

from reconcile_world import ENV, NS, OTHER_ENV
from test_reconciler_polls import Operator, bump_spec, ready

from himitsu_controller import api, himitsu


def _version(op: Operator, name: str) -> int:
    return int(op.kube.status(NS, name)["configVersion"])


def test_a_source_switch_during_a_429_writes_memory_then_the_change_at_retry_after() -> None:
    op = Operator()
    op.add("a1")  # ENV's secrets are in memory
    op.add("b1", env=OTHER_ENV)
    op.reconcile("a1", "b1")
    old = op.data("a1")
    op.clock.advance(5)
    current = op.himitsu.change(ENV, {"KEY_0": "rotated"})
    op.clock.advance(7)
    op.himitsu.error = himitsu.RateLimited("429", retry_after=30)
    bump_spec(op, "b1", environmentId=ENV)  # a first sync of ENV for b1
    result = op.reconciler.reconcile(f"{NS}/b1")
    # At once, from memory (same token): the documented fallback, not a failure.
    assert result.error is None and op.data("b1") == old and ready(op, "b1") == "True"
    assert result.requeue_after is not None and 30 <= result.requeue_after <= 31
    op.himitsu.error = None
    op.clock.advance(result.requeue_after)
    op.reconcile("b1")
    assert op.data("b1")["KEY_0"] == "rotated" and _version(op, "b1") == current


def test_a_force_sync_while_the_source_is_blocked_waits_for_himitsu() -> None:
    op = Operator()
    op.add("a1")
    op.add("a2")
    op.reconcile("a1", "a2")
    old, held = op.data("a2"), _version(op, "a2")
    current = op.himitsu.change(ENV, {"KEY_0": "rotated"})
    op.clock.advance(60)
    op.himitsu.error = himitsu.RateLimited("429", retry_after=30)
    assert op.reconciler.reconcile(f"{NS}/a1").error == "FetchFailure"  # its own 429
    op.himitsu.error = None  # the poller still holds the source back until Retry-After
    mark = len(op.himitsu.requests)
    op.kube.himitsu_secrets[(NS, "a2")]["metadata"]["annotations"] = {
        api.ANN_FORCE_SYNC: "1"}
    result = op.reconciler.reconcile(f"{NS}/a2")
    status = op.kube.status(NS, "a2")
    # Not acknowledged from memory: nothing asked, nothing written, the request kept.
    assert result.error is None and len(op.himitsu.requests) == mark
    assert status.get("lastForceSync") != "1" and _version(op, "a2") == held
    assert op.data("a2") == old
    assert result.requeue_after is not None and result.requeue_after <= 31
    op.clock.advance(result.requeue_after)
    op.reconcile("a2")
    status = op.kube.status(NS, "a2")
    assert status.get("lastForceSync") == "1" and _version(op, "a2") == current
    assert op.data("a2")["KEY_0"] == "rotated"


def test_a_first_sync_refused_on_data_from_memory_asks_himitsu_at_retry_after() -> None:
    # Found by the model test ('settled'): a basic-auth target failing on its data backs
    # off to refreshInterval; the key it needs arrives in Himitsu while the source is
    # rate limited, and the retry judged memory's old answer and waited another interval.
    op = Operator()
    op.add("a1")  # ENV's secrets (no 'username') are in memory
    op.reconcile("a1")
    op.add("auth", target_type="kubernetes.io/basic-auth")
    for _ in range(8):  # InvalidSpec on Himitsu's own answers: the backoff reaches 1m
        result = op.reconciler.reconcile(f"{NS}/auth")
        assert result.error == "InvalidSpec" and result.requeue_after is not None
        op.clock.advance(result.requeue_after)
    assert result.requeue_after == 60
    current = op.himitsu.change(ENV, {"username": "app"})
    op.himitsu.error = himitsu.RateLimited("429", retry_after=5)
    result = op.reconciler.reconcile(f"{NS}/auth")
    # Judged on memory's old answer: asked again once Himitsu may be, not in a minute.
    assert result.error == "InvalidSpec"
    assert result.requeue_after is not None and result.requeue_after <= 5
    op.himitsu.error = None
    op.clock.advance(result.requeue_after)
    op.reconcile("auth")
    assert op.data("auth")["username"] == "app" and _version(op, "auth") == current


def test_a_first_sync_that_keeps_failing_asks_himitsu_again_not_an_old_shared_answer() -> None:
    # Found by the model test ('settled'): a first sync that took another reader's answer
    # is revalidated, but while its write kept failing any answer since that moment was
    # taken, ever older: the key it needed, added in Himitsu since, never arrived.
    op = Operator()
    op.add("a1")
    op.reconcile("a1")
    op.add("auth", target_type="kubernetes.io/basic-auth")
    op.clock.advance(1)
    assert op.reconciler.reconcile(f"{NS}/auth").error == "InvalidSpec"  # a1's answer
    op.clock.advance(0.5)
    op.kube.himitsu_secrets[(NS, "a1")]["metadata"]["annotations"] = {api.ANN_FORCE_SYNC: "1"}
    op.reconcile("a1")  # another reader's answer, after the revalidation was asked for
    current = op.himitsu.change(ENV, {"username": "app"})
    for _ in range(3):
        op.clock.advance(3)
        if op.reconciler.reconcile(f"{NS}/auth").error is None:
            break
    assert op.data("auth")["username"] == "app" and _version(op, "auth") == current
