"""Review 4: model runs with HIMITSU_MODEL_SEED=46 HIMITSU_MODEL_EXAMPLES=1000 that fail on
b9304df; each case is replayed here as a strict xfail named after the guarantee it shows
broken (diagnosis not done by review4: the lead's to triage)."""

from __future__ import annotations

import pytest
from test_model_based import SyncModel


def _merge_then_owner_with_a_dropped_record(settles: int = 5) -> tuple[SyncModel, int]:
    """Seed 46's start: a Merge target turned Owner, the workload's record dropped by
    another tool, a wake before any poll is due."""
    model = SyncModel()
    (slot,) = model.start(seed=0, kube_latency=0.0, himitsu_latency=0.0, informer_lag=0.5,
                          first=[(0, "e1", "tok-a", "10s", "Merge", "Opaque", "KeyValue")])
    for _ in range(settles):
        model.settle()
        model.nothing_broken()
    model.set_value(env="e1", key="A", value="v1")
    model.nothing_broken()
    model.edit_spec(edit=(("target", "creationPolicy"), "Owner"), slot=slot)
    model.nothing_broken()
    model.record_dropped_by_another_tool(slot=slot)
    model.nothing_broken()
    model.wake_not_due(how="annotate_target", n=0, slot=slot)
    model.nothing_broken()
    return model, slot


# review4, seed 46 (the ORACLE): the restart owed for the change at t=101 was made at t=104.4
# while the user had just deleted the target, before its repair; the oracle took the new
# pods to hold "not ours", though pods of a workload whose Secret is missing wait for it
# and start with what the repair writes. Fixed in model_rollout.workload_patched.
def test_a_workload_gets_the_target_s_data_after_a_dropped_record_and_a_deleted_target(
) -> None:
    model, slot = _merge_then_owner_with_a_dropped_record()
    model.edit_target(how="delete", slot=slot)
    model.nothing_broken()
    model.settle()
    model.nothing_broken()
    model.teardown()


@pytest.mark.xfail(strict=True, reason=(
    "review4, seed 46: the same start, the target's value edited, Himitsu failing twice "
    "and slow, then a leader change while a restart is owed: the new leader's next wake "
    "comes after the restart's due time (wake t=85.7, due by t=85.4)"))
def test_a_new_leader_wakes_in_time_for_a_restart_owed_after_a_dropped_record() -> None:
    model, slot = _merge_then_owner_with_a_dropped_record(settles=4)
    model.edit_target(how="value", slot=slot)
    model.nothing_broken()
    model.himitsu_fails(count=1)
    model.nothing_broken()
    model.himitsu_fails(count=1)
    model.nothing_broken()
    model.himitsu_slow(count=1, seconds=0.5)
    model.nothing_broken()
    model.leader_change_while_a_restart_is_owed(after=0.2, key="A", slot=slot, value="v8")
    model.nothing_broken()
    model.teardown()
