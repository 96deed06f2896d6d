"""Tests for status.py: the Ready condition, its Events, and the memory of our own writes.

The conventions users rely on: lastTransitionTime moves only when Ready flips, an Event
marks a transition or a data change (never every poll), the status of a failure keeps
what the last sync recorded, and a stale informer copy never hides our own last write.
"""

from __future__ import annotations

from typing import Any

import pytest
from fakes import FakeKube
from reconcile_world import Clock

from himitsu_controller import api
from himitsu_controller.runtime.metrics import REGISTRY
from himitsu_controller.sync.ports import KubeError
from himitsu_controller.sync.status import MAX_MESSAGE, StatusWriter

KEY = "apps/app-config"




@pytest.fixture
def kube() -> FakeKube:
    kube = FakeKube()
    kube.add_himitsu_secret({"metadata": {"namespace": "apps", "name": "app-config",
                                          "uid": "uid-1", "generation": 2}})
    return kube


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def writer(kube: FakeKube, clock: Clock) -> StatusWriter:
    return StatusWriter(kube, now=clock)


def obj(kube: FakeKube) -> dict[str, Any]:
    found = kube.get_himitsu_secret("apps", "app-config")
    assert found is not None
    return found


def synced(writer: StatusWriter, kube: FakeKube, *, version: int = 37, count: int = 14,
           changed: bool = True, force: str | None = None) -> None:
    writer.synced(KEY, obj(kube), version=version, secret_count=count, generation=2,
                  force_sync=force, data_changed=changed, target="app-secrets")


def failed(writer: StatusWriter, kube: FakeKube, reason: str = "FetchFailure",
           message: str = "the Himitsu API answered 503") -> None:
    writer.failed(KEY, obj(kube), reason=reason, message=message, generation=2)


def ready(kube: FakeKube) -> dict[str, Any]:
    (cond,) = kube.status("apps", "app-config")["conditions"]
    assert isinstance(cond, dict)
    return cond


def ready_series() -> dict[str, float]:
    """himitsu_secret_ready of apps/app-config: {reason: value}."""
    return {s.labels["reason"]: s.value for family in REGISTRY.collect() for s in family.samples
            if s.name == "himitsu_secret_ready"
            and (s.labels["hsec_namespace"], s.labels["name"]) == ("apps", "app-config")}


def gauge() -> float | None:
    series = ready_series()
    assert len(series) <= 1, series  # one series per object, whatever its reason
    return next(iter(series.values()), None)


def test_synced_writes_the_status_the_contract_shows(writer: StatusWriter,
                                                      kube: FakeKube) -> None:
    synced(writer, kube)
    status = kube.status("apps", "app-config")
    assert status["configVersion"] == 37
    assert status["secretCount"] == 14
    assert status["lastSyncTime"] == "2024-05-06T07:08:09Z"
    assert status["observedGeneration"] == 2
    assert "lastForceSync" not in status
    assert ready(kube) == {
        "type": "Ready", "status": "True", "reason": "Synced",
        "message": "Secret 'app-secrets' holds 14 keys at config version 37",
        "lastTransitionTime": "2024-05-06T07:08:09Z", "observedGeneration": 2,
    }
    assert gauge() == 1.0


def test_one_key_reads_as_one_key(writer: StatusWriter, kube: FakeKube) -> None:
    synced(writer, kube, count=1)
    assert ready(kube)["message"] == "Secret 'app-secrets' holds 1 key at config version 37"
    assert kube.events[0].message == "Wrote 1 key at config version 37 to Secret 'app-secrets'"


def test_data_change_gives_a_normal_event_and_polls_do_not(writer: StatusWriter,
                                                           kube: FakeKube,
                                                           clock: Clock) -> None:
    synced(writer, kube, changed=True)
    assert [(e.type, e.reason) for e in kube.events] == [("Normal", "Synced")]
    assert "Wrote 14 keys at config version 37 to Secret 'app-secrets'" in kube.events[0].message
    for _ in range(3):
        clock.advance(60)
        synced(writer, kube, changed=False)
    assert len(kube.events) == 1
    # Every poll still records lastSyncTime (the LAST SYNC column).
    assert kube.status("apps", "app-config")["lastSyncTime"] == "2024-05-06T07:11:09Z"
    synced(writer, kube, version=38, changed=True)
    assert len(kube.events) == 2


def test_recovery_without_data_change_is_a_transition_event(writer: StatusWriter,
                                                            kube: FakeKube) -> None:
    failed(writer, kube)
    synced(writer, kube, changed=False)
    assert [(e.type, e.reason) for e in kube.events] == [("Warning", "FetchFailure"),
                                                         ("Normal", "Synced")]


def test_last_transition_time_kept_while_ready_is_unchanged(writer: StatusWriter,
                                                           kube: FakeKube,
                                                           clock: Clock) -> None:
    synced(writer, kube)
    clock.advance(600)
    synced(writer, kube, changed=False)
    assert ready(kube)["lastTransitionTime"] == "2024-05-06T07:08:09Z"
    clock.advance(60)
    failed(writer, kube)
    assert ready(kube)["lastTransitionTime"] == "2024-05-06T07:19:09Z"
    clock.advance(60)
    failed(writer, kube, reason="AuthenticationFailure", message="401")
    # Still False: a different reason is not a transition of the condition's status.
    assert ready(kube)["lastTransitionTime"] == "2024-05-06T07:19:09Z"
    clock.advance(60)
    synced(writer, kube, changed=False)
    assert ready(kube)["lastTransitionTime"] == "2024-05-06T07:21:09Z"


def test_failure_events_only_on_transitions(writer: StatusWriter, kube: FakeKube) -> None:
    synced(writer, kube)
    kube.events.clear()
    failed(writer, kube)
    patches = len(kube.status_patches)
    failed(writer, kube)
    failed(writer, kube)
    assert [(e.type, e.reason) for e in kube.events] == [("Warning", "FetchFailure")]
    assert kube.events[0].message == "the Himitsu API answered 503"
    # An identical failure status is not rewritten.
    assert len(kube.status_patches) == patches
    failed(writer, kube, reason="AuthenticationFailure", message="token rejected (401)")
    assert [e.reason for e in kube.events] == ["FetchFailure", "AuthenticationFailure"]
    assert ready_series() == {"AuthenticationFailure": 0.0}


def test_the_ready_series_carries_the_reason_of_the_condition(
        writer: StatusWriter, kube: FakeKube) -> None:
    """An alert on himitsu_secret_ready == 0 says why, and a dashboard counts by reason:
    the series follows the Ready reason, one series per object."""
    synced(writer, kube)
    assert ready_series() == {"Synced": 1.0}
    failed(writer, kube)
    assert ready_series() == {"FetchFailure": 0.0}
    synced(writer, kube)
    assert ready_series() == {"Synced": 1.0}


def test_failure_keeps_what_the_last_sync_recorded(writer: StatusWriter,
                                                   kube: FakeKube) -> None:
    synced(writer, kube)
    failed(writer, kube, reason="WriteFailure", message="writing Secret failed: 403")
    status = kube.status("apps", "app-config")
    assert (status["configVersion"], status["secretCount"]) == (37, 14)
    assert status["lastSyncTime"] == "2024-05-06T07:08:09Z"
    cond = ready(kube)
    assert (cond["status"], cond["reason"], cond["message"]) == (
        "False", "WriteFailure", "writing Secret failed: 403")


def test_long_messages_are_bounded(writer: StatusWriter, kube: FakeKube) -> None:
    failed(writer, kube, message="x" * 10_000)
    assert len(ready(kube)["message"].encode()) == MAX_MESSAGE
    assert ready(kube)["message"].endswith("…")
    # In bytes, not characters (what etcd stores), and never a broken character; the
    # Event carries the same bounded message.
    failed(writer, kube, message="\u00e9" * 10_000, reason="InvalidSpec")
    message = ready(kube)["message"]
    assert len(message.encode()) <= MAX_MESSAGE
    assert message.startswith("\u00e9" * 500)
    assert kube.events[-1].message == message


def test_force_sync_value_is_recorded_and_cleared(writer: StatusWriter,
                                                  kube: FakeKube) -> None:
    synced(writer, kube, force="2024-05-06")
    assert kube.status("apps", "app-config")["lastForceSync"] == "2024-05-06"
    assert writer.effective(KEY, obj(kube)).last_force_sync == "2024-05-06"
    synced(writer, kube, force=None, changed=False)
    # A merge patch with null removes the field.
    assert kube.status_patches[-1][2]["lastForceSync"] is None
    assert "lastForceSync" not in kube.status("apps", "app-config")
    assert writer.effective(KEY, obj(kube)).last_force_sync is None


def test_effective_status_prefers_our_own_last_write(writer: StatusWriter,
                                                     kube: FakeKube) -> None:
    kube.freeze_himitsu_secret("apps", "app-config")  # the informer lags behind our patch
    synced(writer, kube)
    stale = obj(kube)
    assert "status" not in stale
    effective = writer.effective(KEY, stale)
    assert (effective.config_version, effective.observed_generation) == (37, 2)
    assert effective.ready is not None and effective.ready.status == "True"
    # A second sync builds on the remembered status, not on the stale copy.
    failed(writer, kube)
    assert kube.status("apps", "app-config")["configVersion"] == 37


def test_memory_is_per_object_identity(writer: StatusWriter, kube: FakeKube) -> None:
    synced(writer, kube)
    recreated = obj(kube)
    recreated["metadata"]["uid"] = "uid-2"
    recreated.pop("status")
    assert writer.effective(KEY, recreated).config_version is None


def test_forget_drops_memory_and_the_ready_series(writer: StatusWriter,
                                                  kube: FakeKube) -> None:
    kube.freeze_himitsu_secret("apps", "app-config")
    synced(writer, kube)
    assert gauge() == 1.0
    writer.forget(KEY)
    assert writer.effective(KEY, obj(kube)).config_version is None
    assert gauge() is None


def test_event_failures_never_fail_the_sync(writer: StatusWriter, kube: FakeKube) -> None:
    kube.fail_next["record_event"] = [KubeError("recording an Event failed: 403 Forbidden")]
    synced(writer, kube)
    assert kube.status("apps", "app-config")["configVersion"] == 37


def test_status_write_errors_propagate_and_are_not_remembered(writer: StatusWriter,
                                                              kube: FakeKube) -> None:
    kube.fail_next["patch_status"] = [KubeError("updating status failed: 500", status=500)]
    with pytest.raises(KubeError):
        synced(writer, kube)
    assert writer.effective(KEY, obj(kube)).config_version is None


def test_status_round_trips_through_parse_status(writer: StatusWriter, kube: FakeKube) -> None:
    synced(writer, kube, force="f")
    parsed = api.parse_status(obj(kube))
    assert parsed == writer.effective(KEY, obj(kube))


# -- what the status patch leaves alone (issue 21, items 3 and 7) ---------------------------


def test_a_condition_another_writer_added_after_our_write_is_kept(
        writer: StatusWriter, kube: FakeKube) -> None:
    synced(writer, kube)
    theirs = {"type": "Compliant", "status": "True", "reason": "PolicyPassed",
              "lastTransitionTime": "2024-05-06T07:00:00Z"}
    kube.himitsu_secrets[("apps", "app-config")]["status"]["conditions"].append(theirs)
    failed(writer, kube)  # a transition: Ready changes, theirs stays
    conditions = kube.status("apps", "app-config")["conditions"]
    assert [c["type"] for c in conditions] == ["Ready", "Compliant"]
    assert conditions[1] == theirs and conditions[0]["reason"] == "FetchFailure"


def test_a_status_that_would_not_change_is_not_written_yet_reported(
        writer: StatusWriter, kube: FakeKube) -> None:
    synced(writer, kube, changed=False)
    patches = len(kube.status_patches)
    synced(writer, kube, changed=False)  # the same answer again (a wake that was not due)
    assert len(kube.status_patches) == patches
    assert gauge() == 1.0


def test_a_status_write_whose_answer_was_lost_is_not_undone_by_the_rollout_entries(
        writer: StatusWriter, kube: FakeKube, monkeypatch: pytest.MonkeyPatch) -> None:
    # Found by the model (review3, seed 23): a TargetConflict patch applied but its answer
    # lost, then the reconcile's rollout entries written over the status the writer last
    # knew: Ready=True Synced again, reported as a sync after a force-sync.
    synced(writer, kube)
    writer.rollouts(KEY, obj(kube), [{"kind": "Deployment", "name": "web"}])
    stale = obj(kube)  # the reconcile's copy
    applied = kube.patch_status

    def lost(*args: Any, **kwargs: Any) -> None:
        applied(*args, **kwargs)
        raise KubeError("updating status of HimitsuSecret 'app-config' failed: 0", status=0)

    monkeypatch.setattr(kube, "patch_status", lost)
    with pytest.raises(KubeError):
        writer.failed(KEY, stale, reason="TargetConflict", message="not ours", generation=2)
    monkeypatch.setattr(kube, "patch_status", applied)
    writer.rollouts(KEY, stale, [])  # the same reconcile: its workloads named no more

    assert kube.status("apps", "app-config")["conditions"][0]["reason"] == "TargetConflict"
    # The next reconcile writes both.
    writer.failed(KEY, obj(kube), reason="TargetConflict", message="not ours", generation=2)
    writer.rollouts(KEY, obj(kube), [])
    status = kube.status("apps", "app-config")
    assert status["conditions"][0]["reason"] == "TargetConflict"
    assert "rolloutRestarts" not in status
