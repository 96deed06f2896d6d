"""What the operator holds per object is small: shared strings, tuples, one copy per source.

Proven here: cached objects share their strings (every key, and the values that repeat
from object to object); the status writer remembers a flat tuple per object and still
gives back exactly what it wrote (a status with someone else's fields in it included);
a reconciler memory has no per-instance dict; the shared poller holds a source's
secrets once, as bytes, whatever the number of readers, and gives them back unchanged
(a lone surrogate included).
"""

from __future__ import annotations

import json
from typing import Any

from fakes import FakeKube
from reconcile_world import Clock

from himitsu_controller import himitsu
from himitsu_controller.runtime.cache.store import apply
from himitsu_controller.sync import summary
from himitsu_controller.sync.memory import Memory
from himitsu_controller.sync.polling import polls
from himitsu_controller.sync.status import StatusWriter

API = "https://himitsu.example.com"
PROJECT = "11111111-1111-1111-1111-111111111111"
ENV = "22222222-2222-2222-2222-222222222222"
TOKEN = "himi_aaaaaaaaaaaaaaaa_" + "A" * 43


def hsec(name: str) -> dict[str, Any]:
    """A HimitsuSecret as a watch event decodes it: a document of its own."""
    text = json.dumps({
        "apiVersion": "himitsu.io/v1alpha1", "kind": "HimitsuSecret",
        "metadata": {"name": name, "namespace": "apps", "uid": f"uid-{name}",
                     "resourceVersion": "7", "generation": 1},
        "spec": {"apiUrl": API, "projectId": PROJECT, "environmentId": ENV,
                 "authSecretRef": {"name": "token"}, "refreshInterval": "1m",
                 "target": {"name": f"{name}-secret", "creationPolicy": "Owner"}},
        "status": {"conditions": [{"type": "Ready", "status": "True", "reason": "Synced"}]}})
    decoded: dict[str, Any] = json.loads(text)
    return decoded


def test_cached_objects_share_their_keys_and_repeated_values() -> None:
    a, b = (apply(summary.himitsu_secret, hsec(n), informer="h", shared=summary.SHARED)
            for n in ("a", "b"))
    assert a is not None and b is not None
    for key_a, key_b in zip(a["spec"], b["spec"], strict=True):
        assert key_a is key_b
    for field in ("apiUrl", "projectId", "environmentId", "refreshInterval"):
        assert a["spec"][field] is b["spec"][field]
    assert a["metadata"]["namespace"] is b["metadata"]["namespace"]
    cond_a, cond_b = a["status"]["conditions"][0], b["status"]["conditions"][0]
    assert cond_a["reason"] is cond_b["reason"]
    assert a["metadata"]["uid"] == "uid-a"  # values not named stay as they were


def _writer_with(kube: FakeKube, status: dict[str, Any] | None = None,
                 ) -> tuple[StatusWriter, dict[str, Any]]:
    obj = {"metadata": {"namespace": "apps", "name": "app", "uid": "u", "generation": 2}}
    if status is not None:
        obj["status"] = status
    kube.add_himitsu_secret(obj)
    found = kube.get_himitsu_secret("apps", "app")
    assert found is not None
    return StatusWriter(kube, now=Clock()), found


def _flat(value: Any) -> bool:
    return isinstance(value, tuple) and not any(isinstance(v, dict | list | tuple)
                                                for v in value)


def test_the_status_writer_remembers_a_flat_tuple_and_gives_back_what_it_wrote() -> None:
    kube = FakeKube()
    writer, stale = _writer_with(kube)
    writer.synced("apps/app", stale, version=3, secret_count=2, generation=2,
                  force_sync="now", data_changed=True, target="t")
    writer.failed("apps/app", stale, reason="FetchFailure", message="503", generation=2)
    assert all(_flat(v) for v in writer._written.values())
    # The object the writer got is stale (no status): what it remembers is what it wrote.
    effective = writer.effective("apps/app", stale)
    written = kube.status("apps", "app")
    assert effective.config_version == written["configVersion"] == 3
    assert effective.last_force_sync == written["lastForceSync"] == "now"
    assert effective.ready is not None
    assert (effective.ready.status, effective.ready.reason) == ("False", "FetchFailure")
    assert effective.ready.last_transition_time == written["conditions"][0][
        "lastTransitionTime"]


def test_a_status_holding_someone_else_s_field_is_remembered_with_it() -> None:
    kube = FakeKube()
    writer, obj = _writer_with(kube, {"configVersion": 1, "theirs": {"x": 1}})
    writer.failed("apps/app", obj, reason="InvalidSpec", message="bad", generation=2)
    stale = {**obj, "status": {}}
    writer.failed("apps/app", stale, reason="FetchFailure", message="503", generation=2)
    assert kube.status_patches[-1][2]["theirs"] == {"x": 1}  # carried from the memory


def test_a_reconciler_memory_has_no_per_object_dict() -> None:
    assert not hasattr(Memory(uid="u"), "__dict__")


class _Client:
    def __init__(self, secrets: dict[str, str]) -> None:
        self.secrets = secrets
        self.calls = 0

    def fetch(self, *, api_url: str, project_id: str, environment_id: str, token: str,
              known_version: int | None) -> himitsu.FetchResult:
        self.calls += 1
        return himitsu.Fetched(version=4, secrets=dict(self.secrets))


def test_the_poller_holds_one_copy_of_a_source_s_secrets_as_bytes() -> None:
    secrets = {"A": "CANARY-one", "B": "CANARY-two \ud800 ü"}
    client = _Client(secrets)
    poller = polls.SharedPoller(client, clock=lambda: 1000.0)
    answers = [poller.fetch(api_url=API, project_id=PROJECT, environment_id=ENV, token=TOKEN,
                            known_version=None, max_age=60.0, reader=f"apps/r{i}")
               for i in range(50)]
    assert client.calls == 1
    for answer in answers:
        assert isinstance(answer, himitsu.Fetched) and dict(answer.secrets) == secrets
    (entry,) = poller._entries.values()
    assert isinstance(entry.secrets, bytes)
    assert entry.secrets.count(b"CANARY-one") == 1
    remembered = poller.remembered(api_url=API, project_id=PROJECT, environment_id=ENV,
                                   token=TOKEN)
    assert remembered is not None and dict(remembered.secrets) == secrets
