"""Review 9 of 5230d54..d11bba1 (Memory's ``sure``, ``sent`` and ``id_for`` after a
lost write answer; ``before_change``): reproductions.

Each xfail is strict, named after the guarantee it shows broken; it passes (XPASS,
which fails the suite) the day the fix lands: then drop the mark."""

from __future__ import annotations

from typing import Any

from reconcile_world import fetched, values
from test_restarts import changed, data_id, restarts, rollout_world, tick

from himitsu_controller import api
from himitsu_controller.sync.memory import Memory
from himitsu_controller.sync.ports import KubeError


def _ann(data_id: str, digest: str) -> dict[str, str]:
    return {api.ANN_DATA_ID: data_id, api.ANN_DATA_HASH: digest}


def test_bytes_put_back_after_a_lost_write_that_landed_get_a_new_id() -> None:
    """docs/design/restarts.md: bytes put back (A, B, A) get a new id too. Here the
    write of B (id "b") lost its answer but landed, and the fresh read that would have
    told Memory so failed (after() only logs it); Himitsu then answers A's bytes again.
    Memory still holds "a" for them, and id_for stamps "a" on a target that held B:
    workloads recorded "a" whose pods started with B are owed nothing."""
    mem = Memory(uid="u")
    mem.target_holds(_ann("a", "digest-a"), since=10.0)
    mem.target_unknown("b", at=20.0)  # the write of B: its answer lost, it landed
    held = _ann("b", "digest-b")  # what the target (cache caught up) holds now
    assert mem.id_for(held, "digest-a") != "a"


def test_a_change_put_back_after_a_lost_write_answer_is_stamped_with_a_fresh_id() -> None:
    """The same through the reconciler: the write of B lands, its answer and the fresh
    read after it are lost; A's bytes put back then carry A's old id, so web (record A,
    pods possibly started with B) is owed nothing: the change and its undoing, meant to
    cost one restart, cost none."""
    world = rollout_world()
    world.sync(5)
    first = data_id(world)
    world.clock.advance(60)
    original = world.kube.update_secret

    def applied_then_lost(namespace: str, body: dict[str, Any]) -> dict[str, Any]:
        original(namespace, body)
        world.kube.update_secret = original  # type: ignore[method-assign]
        world.kube.fail_next["get_secret_fresh"] = [KubeError("timeout", status=0)]
        raise KubeError("connection reset by peer", status=0)

    world.kube.update_secret = applied_then_lost  # type: ignore[method-assign]
    result = world.reconcile(fetched(6, changed("b")))
    assert result.error == "WriteFailure" and world.data() == changed("b")
    assert data_id(world) != first
    world.clock.advance(3)
    world.annotate(api.ANN_FORCE_SYNC, "back")
    world.reconcile(fetched(7))  # A's bytes again
    assert world.data() == values()
    for _ in range(3):  # a window and more: the change and its undoing cost one restart
        world.clock.advance(6)
        tick(world)
    assert data_id(world) != first, "the id B replaced stamped again on A's bytes"
    assert len(restarts(world)) == 1, "B reached the Secret (and pods); no restart made"
