"""Review 9 of 5230d54..d11bba1 (Memory's ``sure``, ``sent`` and ``id_for`` after a
lost write answer; ``before_change``): reproductions.

Each xfail is strict, named after the guarantee it shows broken; it passes (XPASS,
which fails the suite) the day the fix lands: then drop the mark."""

from __future__ import annotations

import pytest

from himitsu_controller import api
from himitsu_controller.sync.memory import Memory


def _ann(data_id: str, digest: str) -> dict[str, str]:
    return {api.ANN_DATA_ID: data_id, api.ANN_DATA_HASH: digest}


@pytest.mark.xfail(strict=True, reason="id_for re-stamps the id a lost write replaced")
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
