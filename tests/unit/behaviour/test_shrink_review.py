"""Adversarial review of the issue-25 shrink: the status skip when the informer shows an
older write of ours (two writes built on one copy of the object)."""

from __future__ import annotations

import copy
from typing import Any

from fakes import FakeKube
from reconcile_world import Clock

from himitsu_controller.sync.status import StatusWriter

KEY = "apps/app-config"


def _snapshot(kube: FakeKube) -> dict[str, Any]:
    """The informer's copy of the HimitsuSecret as the apiserver holds it now."""
    found = kube.get_himitsu_secret("apps", "app-config")
    assert found is not None
    return copy.deepcopy(found)


def _synced(writer: StatusWriter, obj: dict[str, Any]) -> None:
    writer.synced(KEY, obj, version=37, secret_count=14, generation=2, force_sync=None,
                  data_changed=False, target="app-secrets")


def test_a_status_is_written_back_when_the_informer_shows_an_older_write_of_ours() -> None:
    """Synced (A), then a failure (B) while the informer still showed the copy before A;
    then the informer shows A (not yet B) and the sync succeeds again: the apiserver holds
    B, Ready=False, so A must be written, and the ready gauge must not say B."""
    kube, clock = FakeKube(), Clock()
    kube.add_himitsu_secret({"metadata": {"namespace": "apps", "name": "app-config",
                                          "uid": "uid-1", "generation": 2}})
    writer = StatusWriter(kube, now=clock)
    before = _snapshot(kube)
    _synced(writer, before)  # A
    shows_a = _snapshot(kube)
    writer.failed(KEY, before, reason="FetchFailure", message="Himitsu API answered 503",
                  generation=2)  # B, built on the copy the informer still showed
    assert kube.status("apps", "app-config")["conditions"][0]["status"] == "False"
    _synced(writer, shows_a)  # A again: the informer has caught up with A only
    assert kube.status("apps", "app-config")["conditions"][0]["status"] == "True"


def test_a_repeated_failure_seen_through_an_older_write_of_ours_costs_one_write_at_most(
        ) -> None:
    """Synced (A), then a failure (B) built on the copy before A; the same failure again
    on the copy holding A (the watch's intermediate event) writes B once more: the writer
    cannot tell that copy from another writer's (the price of repairing a wiped status).
    Once the informer shows B, the failure writes nothing."""
    kube, clock = FakeKube(), Clock()
    kube.add_himitsu_secret({"metadata": {"namespace": "apps", "name": "app-config",
                                          "uid": "uid-1", "generation": 2}})
    writer = StatusWriter(kube, now=clock)
    before = _snapshot(kube)
    _synced(writer, before)  # A
    shows_a = _snapshot(kube)
    for obj in (before, shows_a):  # B, then B again
        writer.failed(KEY, obj, reason="FetchFailure", message="Himitsu API answered 503",
                      generation=2)
    assert len(kube.status_patches) == 3
    writer.failed(KEY, _snapshot(kube), reason="FetchFailure",
                  message="Himitsu API answered 503", generation=2)
    assert len(kube.status_patches) == 3
