"""What a restart costs the apiserver in Secret GETs, counted as the real adapter sends them.

The bench's memory scenario is a restart whose targets are gone: HimitsuSecrets synced
before (a status with configVersion), their Secrets deleted, a fresh process. Each target
is to be created with at most one GET of it first (the informer misses it: deleted, or
only unlabelled), and a restart whose targets are all there, like every steady poll,
reads none directly. ``FakeKube.direct_reads`` counts what ``kube.KubeClient`` would send:
every fresh read, and every read the Secret informer (labelled Secrets) cannot answer.
"""

from __future__ import annotations

from typing import Any

from fakes import FakeFetcher, FakeKube, b64, unb64
from reconcile_world import NS, TOKEN, Clock, fetched, make_hsec, values

from himitsu_controller import api, himitsu
from himitsu_controller.sync.reconciler import HimitsuSecretReconciler

N = 12


class Fleet:
    """N HimitsuSecrets in one namespace, each with its own Owner target."""

    def __init__(self, **spec: Any) -> None:
        self.kube = FakeKube()
        self.fetcher = FakeFetcher()
        self.clock = Clock()
        self.kube.put_secret({"metadata": {"namespace": NS, "name": "himitsu-token"},
                              "data": {"token": b64(TOKEN)}})
        for i in range(N):
            obj = make_hsec(refreshInterval="1h", **spec)
            obj["metadata"]["name"] = f"app-{i}"
            obj["spec"]["target"]["name"] = f"target-{i}"
            self.kube.add_himitsu_secret(obj)
        self.restart()

    def restart(self) -> None:
        self.reconciler = HimitsuSecretReconciler(self.kube, self.fetcher, now=self.clock,
                                                  rng=lambda: 0.0)

    def reconcile_all(self, *answers: himitsu.FetchResult) -> None:
        for i in range(N):
            self.fetcher.then(*answers)
            result = self.reconciler.reconcile(f"{NS}/app-{i}")
            assert result.error is None, self.kube.status(NS, f"app-{i}")
            assert not self.fetcher.script, "the scripted fetch was not made"

    def targets(self) -> list[dict[str, Any] | None]:
        return [self.kube.secrets.get((NS, f"target-{i}")) for i in range(N)]


def _synced_then_targets_deleted(**spec: Any) -> Fleet:
    fleet = Fleet(**spec)
    fleet.reconcile_all(fetched(5))
    fleet.reconcile_all()  # the echoes of the creates: nothing to ask
    for i in range(N):
        del fleet.kube.secrets[(NS, f"target-{i}")]
    fleet.restart()
    fleet.kube.calls.clear()
    fleet.kube.direct_reads = 0
    return fleet


def test_a_restart_creates_each_missing_target_after_at_most_one_get() -> None:
    fleet = _synced_then_targets_deleted()

    fleet.reconcile_all(fetched(5))  # the cold sync: a full fetch each (no target)

    assert fleet.kube.calls["create_secret"] == N
    assert fleet.kube.direct_reads <= N, f"{fleet.kube.direct_reads} GETs for {N} targets"
    for target in fleet.targets():
        assert target is not None and unb64(target["data"]) == values()
    # The echoes of the creates, then a timed poll each (304): no GET at all.
    fleet.kube.direct_reads = 0
    fleet.reconcile_all()
    fleet.clock.advance(3600)
    fleet.reconcile_all(himitsu.NotModified(5))
    assert fleet.kube.direct_reads == 0
    assert fleet.kube.calls["create_secret"] == N and fleet.kube.calls["update_secret"] == 0


def test_a_restart_with_every_target_in_place_reads_none_directly() -> None:
    fleet = Fleet()
    fleet.reconcile_all(fetched(5))
    fleet.restart()
    fleet.kube.direct_reads = 0
    fleet.reconcile_all()  # healthy, not due: each waits for its poll, nothing asked
    assert fleet.kube.direct_reads == 0
    assert fleet.fetcher.calls[N:] == []


def test_a_foreign_secret_in_a_deleted_targets_place_is_never_written() -> None:
    # Someone else's Secret of the same name (not labelled: the informer misses it) took
    # the place of a target deleted while the operator was down.
    fleet = _synced_then_targets_deleted()
    foreign = fleet.kube.put_secret({"metadata": {"namespace": NS, "name": "target-0"},
                                     "type": "Opaque", "data": {"OTHER": b64("theirs")}})
    for i in range(N):
        fleet.fetcher.then(fetched(5))
        fleet.reconciler.reconcile(f"{NS}/app-{i}")
    fleet.fetcher.script.clear()
    assert fleet.kube.secrets[(NS, "target-0")] == foreign
    ready = fleet.kube.status(NS, "app-0")["conditions"][0]
    assert (ready["status"], ready["reason"]) == ("False", "TargetConflict")
    assert fleet.kube.direct_reads <= N


def test_a_merge_target_is_written_on_its_values_read_at_that_moment() -> None:
    # A Merge target's foreign key added while the operator was down survives the restart's
    # write, which reads the Secret's values itself (the informer keeps none).
    fleet = Fleet(policy="Merge")
    for i in range(N):
        fleet.kube.put_secret({"metadata": {"namespace": NS, "name": f"target-{i}",
                                            "annotations": {api.ANN_ALLOW_MERGE_BY: "*"}},
                               "type": "Opaque", "data": {"HELM_KEY": b64("v1")}})
    fleet.reconcile_all(fetched(5))
    for i in range(N):
        target = fleet.kube.secret(NS, f"target-{i}")
        target["data"]["LATE_KEY"] = b64("added while down")
        fleet.kube.edit_secret(NS, f"target-{i}", data=target["data"])
    fleet.restart()
    fleet.clock.advance(3600)
    fleet.kube.direct_reads = 0
    fleet.reconcile_all(fetched(6, values(3)))
    for written in fleet.targets():
        assert written is not None
        data = unb64(written["data"])
        assert data == {"HELM_KEY": "v1", "LATE_KEY": "added while down", **values(3)}
        assert written["metadata"]["annotations"][api.ANN_CONFIG_VERSION] == "6"
    assert fleet.kube.direct_reads <= N
