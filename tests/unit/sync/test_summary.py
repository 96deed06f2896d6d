"""The Secret informer keeps summaries: no value of any Secret stays in memory.

What is proven: a summary (and the Secret informer's store, list and watch alike) holds
no value, neither from ``data`` nor from kubectl's last-applied annotation; its digest
tells a hand edit of a value from an intact target, across restarts too, yet reveals no
value of a Merge target's foreign keys (it covers none of them, and is keyed anyway); a
write reads its target afresh (one GET per write, none for a poll that writes nothing)
and builds on the whole Secret, so a Merge target keeps its foreign keys; and after
syncs and repairs the reconciler remembers no value either.
"""

from __future__ import annotations

import json
import os
import threading
from typing import Any

import pytest
from fake_apiserver import FakeApiServer
from fakes import b64
from reconcile_world import CANARY, NS, TARGET, World, fetched, make_hsec, merge_world, values

from himitsu_controller import api, himitsu
from himitsu_controller.runtime.cache.informer import Informer
from himitsu_controller.runtime.client.rest import HttpClient, Resource, RestClient
from himitsu_controller.sync import summary
from himitsu_controller.sync.target import targets
from himitsu_controller.sync.target.render import data_hash

SECRETS = Resource("", "v1", "secrets")


def applied_secret(value: str) -> dict[str, Any]:
    """A Secret as ``kubectl apply`` leaves it: its values twice, once in an annotation."""
    data = {"A": b64(value), "B": b64(value + "-b")}
    manifest = {"apiVersion": "v1", "kind": "Secret", "data": data,
                "metadata": {"name": "s", "namespace": NS}}
    return {"apiVersion": "v1", "kind": "Secret", "type": "Opaque", "data": data,
            "metadata": {"name": "s", "namespace": NS, "uid": "u", "resourceVersion": "7",
                         "labels": {api.LABEL_MANAGED: "true"},
                         "annotations": {summary.LAST_APPLIED: json.dumps(manifest),
                                         api.ANN_MANAGED_KEYS: "A"},
                         "finalizers": ["f"], "creationTimestamp": "2024-01-01T00:00:00Z"}}


def holds(text: str, value: str) -> bool:
    """``value`` (or its base64) anywhere in ``text``."""
    return value in text or b64(value) in text or b64(value)[:-4] in text


def test_a_summary_holds_no_value_only_keys_and_digests() -> None:
    secret = applied_secret(CANARY)
    kept = summary.secret(json.loads(json.dumps(secret)))
    assert not holds(json.dumps(kept), CANARY)
    assert summary.is_summary(kept) and "data" not in kept
    assert summary.keys_of(kept) == ["A", "B"]
    assert summary.holds_hash(kept, ["A"], data_hash({"A": secret["data"]["A"]}))
    assert not summary.holds_hash(kept, ["A"], data_hash({"A": b64("other")}))
    meta = kept["metadata"]
    assert (meta["name"], meta["namespace"], meta["uid"], meta["resourceVersion"]) == (
        "s", NS, "u", "7")
    assert meta["annotations"] == {api.ANN_MANAGED_KEYS: "A"}
    assert kept["type"] == "Opaque"


def merge_target(pin: str) -> dict[str, Any]:
    """A Merge target holding our key OURS and someone else's short PIN."""
    return {"metadata": {"name": "s", "namespace": NS, "resourceVersion": "1",
                         "annotations": {api.ANN_OWNED_BY: "app-config",
                                         api.ANN_MANAGED_KEYS: "OURS",
                                         api.ANN_DATA_HASH: data_hash({"OURS": "eA=="})}},
            "data": {"PIN": b64(pin), "OURS": "eA=="}}


def strings_of(value: Any) -> set[str]:
    if isinstance(value, dict):
        return set().union(*(strings_of(v) for v in value.values()), set(map(str, value)))
    if isinstance(value, list):
        return set().union(*(strings_of(v) for v in value))
    return {str(value)}


def test_a_merge_target_s_foreign_low_entropy_value_is_not_recoverable_from_its_summary(
        ) -> None:
    # Every 4-digit PIN tried against every string the summary holds, as any digest
    # over the foreign value would be found (alone, or with our key's value).
    pin = "4821"
    held = strings_of(summary.secret(merge_target(pin)))

    def digests(guess: str) -> set[str]:
        value = b64(guess)
        return {data_hash({"PIN": value, "OURS": "eA=="}),
                data_hash({"PIN": value})}

    assert [g for g in (f"{i:04d}" for i in range(10_000)) if digests(g) & held] == []


def test_a_merge_target_s_summary_does_not_depend_on_its_foreign_values() -> None:
    # Nothing of a foreign value is digested at all, keyed or not: two PINs, one summary.
    assert summary.secret(merge_target("4821")) == summary.secret(merge_target("1234"))
    kept = summary.secret(merge_target("4821"))
    assert summary.holds_hash(kept, ["OURS"], data_hash({"OURS": "eA=="}))
    assert not summary.holds_hash(kept, ["OURS", "PIN"], data_hash({"OURS": "eA=="}))


def test_a_summary_made_under_another_process_s_key_still_matches_the_recorded_hash(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # The data-hash annotation a target carries was written by some earlier process:
    # it stays comparable whatever key this one drew.
    secret = merge_target("4821")
    recorded = secret["metadata"]["annotations"][api.ANN_DATA_HASH]
    before = summary.secret(json.loads(json.dumps(secret)))
    monkeypatch.setattr(summary, "_KEY", os.urandom(32))
    after = summary.secret(json.loads(json.dumps(secret)))
    assert before[summary.DIGEST] != after[summary.DIGEST]  # keyed: per process
    assert summary.holds_hash(after, ["OURS"], recorded)
    assert not summary.holds_hash(after, ["OURS"], data_hash({"OURS": "eQ=="}))


def test_the_secret_informer_store_holds_no_value_after_list_and_watch(
        server: FakeApiServer, api_client: HttpClient) -> None:
    server.put("listed", data=applied_secret(CANARY + "-listed")["data"])
    informer = Informer(RestClient(api_client), SECRETS, namespace="ns", rng=lambda: 0.0,
                        transform=summary.secret)
    handled: list[dict[str, Any]] = []
    informer.add_handler(on_add=handled.append, on_update=lambda _, new: handled.append(new))
    stop = threading.Event()
    thread = threading.Thread(target=informer.run, args=(stop,), daemon=True)
    thread.start()
    try:
        session = server.next_watch()
        assert informer.wait_for_sync(10)
        session.send({"type": "ADDED", "object": server.put(
            "watched", data=applied_secret(CANARY + "-added")["data"])})
        session.send({"type": "MODIFIED", "object": server.put(
            "watched", data=applied_secret(CANARY + "-modified")["data"])})
        session.close()
        server.next_watch()  # the events before the close were all handled
        assert len(handled) == 3
    finally:
        stop.set()
        thread.join(10)
    text = json.dumps([informer.store.list(), handled])
    for tag in ("listed", "added", "modified"):
        assert not holds(text, f"{CANARY}-{tag}")
    assert sorted(informer.store.keys()) == ["ns/listed", "ns/watched"]


def test_digests_tell_a_hand_edit_of_a_value_from_an_intact_target() -> None:
    world = World()
    world.sync()
    owner = targets.Owner(namespace=NS, name="app-config",
                          uid=world.hsec["metadata"]["uid"])
    spec = api.parse_spec(world.hsec)

    def intact() -> bool:
        cached = world.kube.get_secret(NS, TARGET, cached=True)
        assert summary.is_summary(cached)
        return targets.holds_data(cached, owner=owner, spec=spec, version=5)

    assert intact()
    edited = dict(world.target()["data"], KEY_0=b64("hand edit"))  # same keys
    world.kube.edit_secret(NS, TARGET, data=edited)
    assert not intact()


def test_a_merge_target_s_foreign_value_edit_is_not_drift_but_ours_is() -> None:
    world = merge_world()
    world.sync()
    owner = targets.Owner(namespace=NS, name="app-config",
                          uid=world.hsec["metadata"]["uid"])
    spec = api.parse_spec(world.hsec)

    def intact() -> bool:
        cached = world.kube.get_secret(NS, TARGET)
        assert summary.is_summary(cached)
        return targets.holds_data(cached, owner=owner, spec=spec, version=5)

    data = world.target()["data"]
    world.kube.edit_secret(NS, TARGET, data=dict(data, HELM_KEY=b64("helm 2")))
    assert intact()
    world.kube.edit_secret(NS, TARGET, data=dict(data, KEY_1=b64("hand edit")))
    assert not intact()


def test_a_value_edited_while_the_operator_was_down_is_repaired() -> None:
    # After a restart nothing is remembered: the summary's digest alone tells the edit
    # (an intact target would wait for its next poll, its data trusted).
    world = World()
    world.sync()
    world.kube.edit_secret(NS, TARGET, data=dict(world.target()["data"], KEY_0=b64("x")))
    world.restart()
    world.clock.advance(1)
    world.reconcile(fetched(5))
    assert world.fetcher.known_versions[-1] is None  # a full fetch, not a 304 on bad data
    assert world.data() == values()


@pytest.mark.parametrize("policy", api.POLICIES)
@pytest.mark.parametrize("key", [summary.LAST_APPLIED, "kubectl.kubernetes.io/restartedAt",
                                 "example.com/owner"])
def test_a_target_written_for_any_template_accepted_is_intact_as_the_cache_shows_it(
        policy: str, key: str) -> None:
    # A template annotation the cache dropped would never be seen stamped: the target
    # would look pruned at every poll (a full fetch, values on the wire, and a GET).
    # So a template may not ask for one: it is refused, naming the key.
    hsec = make_hsec(policy=policy, template={"annotations": {key: '{"kind":"Secret"}'}})
    try:
        spec = api.parse_spec(hsec)
    except api.InvalidSpec as exc:
        assert key in api.DROPPED_ANNOTATIONS and repr(key) in str(exc)
        return
    owner = targets.Owner(namespace=NS, name="app-config", uid="u")
    written = targets.desired_secret(None, owner=owner, spec=spec,
                                     rendered={"A": b64("a")}, version=3,
                                     data_id="d1")
    assert targets.is_consistent(summary.secret(written), owner=owner, spec=spec, version=3)


def test_a_poll_that_writes_nothing_reads_no_secret_and_a_write_reads_one() -> None:
    world = World()
    world.sync()
    before = world.kube.calls["get_secret_fresh"]
    world.poll(himitsu.NotModified(version=5))
    assert world.kube.calls["get_secret_fresh"] == before
    world.poll(fetched(6, values(tag="v6-")))
    assert world.kube.calls["get_secret_fresh"] == before + 1
    assert world.data() == values(tag="v6-")


def test_a_merge_write_keeps_the_foreign_values_a_summary_does_not_hold() -> None:
    world = merge_world()
    world.sync()
    world.poll(fetched(6, values(tag="v6-")))
    assert world.data() == {**values(tag="v6-"), "HELM_KEY": "helm-value"}


def test_a_write_on_a_summary_the_secret_outran_is_retried_on_the_fresh_read() -> None:
    world = merge_world()
    world.sync()
    world.kube.freeze_cache(NS, TARGET)  # the cache still shows our write...
    data = world.target()["data"]
    world.kube.edit_secret(NS, TARGET, data=dict(data, HELM_KEY=b64("helm 2")))  # ...not this
    writes = world.kube.writes()
    result = world.poll(fetched(6, values(tag="v6-")))
    assert world.kube.writes() == writes and result.requeue_after  # nothing written: retried
    world.reconcile(fetched(6, values(tag="v6-")))
    assert world.data() == {**values(tag="v6-"), "HELM_KEY": "helm 2"}


def test_after_syncs_and_repairs_the_reconciler_remembers_no_value() -> None:
    world = merge_world()
    world.sync()
    world.kube.delete_secret(NS, TARGET, uid=world.target()["metadata"]["uid"])
    world.reconcile(fetched(5))
    world.poll(fetched(6, values(tag="v6-")))
    world.poll(himitsu.NotModified(version=6))
    assert world.data()["KEY_0"] == f"{CANARY}-v6-0"
    assert not holds(_dump(vars(world.reconciler), skip=(world.fetcher,)), CANARY)


def _dump(obj: Any, *, skip: tuple[Any, ...], depth: int = 0) -> str:
    """Everything reachable from ``obj`` as text, but the fakes (they hold the world's
    truth, every value: not the reconciler's memory)."""
    if depth > 8 or any(obj is s for s in skip) or type(obj).__name__ == "FakeKube":
        return ""
    if isinstance(obj, dict):
        return " ".join(f"{k!r}:{_dump(v, skip=skip, depth=depth + 1)}" for k, v in obj.items())
    if isinstance(obj, list | tuple | set | frozenset):
        return " ".join(_dump(v, skip=skip, depth=depth + 1) for v in obj)
    if hasattr(obj, "__dict__"):
        return type(obj).__name__ + _dump(vars(obj), skip=skip, depth=depth + 1)
    return repr(obj)


def test_a_cached_himitsu_secret_keeps_what_the_reconcile_reads() -> None:
    obj = {"apiVersion": api.API_VERSION, "kind": api.KIND,
           "metadata": {"name": "h", "namespace": NS, "uid": "u", "resourceVersion": "3",
                        "generation": 2, "creationTimestamp": "2024-01-01T00:00:00Z",
                        "labels": {"team": "a"}, "finalizers": ["f"],
                        "annotations": {summary.LAST_APPLIED: f'{{"spec": "{CANARY}"}}',
                                        api.ANN_FORCE_SYNC: "1"}},
           "spec": {"apiUrl": "https://h"}, "status": {"configVersion": 4}}
    kept = summary.himitsu_secret(json.loads(json.dumps(obj)))
    assert kept["metadata"] == {"name": "h", "namespace": NS, "uid": "u",
                                "resourceVersion": "3", "generation": 2,
                                "annotations": {api.ANN_FORCE_SYNC: "1"}}
    assert (kept["spec"], kept["status"]) == (obj["spec"], obj["status"])
