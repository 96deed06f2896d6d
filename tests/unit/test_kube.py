"""Tests for kube.py: the reconciler's Kubernetes port, against a recording RestClient.

What matters here is what reaches the apiserver: cached reads send nothing, a cache miss
or a fresh read is one GET, the token is re-read at most every five minutes and at once
after a forget, writes carry the right verb, path, body and content type, and errors
turn into the reconciler's types with messages that are safe to show.
"""

from __future__ import annotations

import base64
import builtins
import itertools
import json
import threading
from dataclasses import dataclass
from typing import Any

import pytest

from himitsu_controller import api, kube
from himitsu_controller.kube import TOKEN_TTL, KubeClient
from himitsu_controller.runtime.client.rest import (
    ApiError,
    RestClient,
    TransportError,
    WriteRefused,
)
from himitsu_controller.runtime.events import EventRecorder
from himitsu_controller.sync.ports import Conflict, KubeError, SecretNotFound
from himitsu_controller.sync.tokens import TokenNotAllowed, TokenReader

TIMEOUT = 10.0

SECRET_PATH = "/api/v1/namespaces/apps/secrets/app-secrets"
TOKEN_PATH = "/api/v1/namespaces/apps/secrets/himitsu-token"
TOKEN = "himi_0123456789abcdef_" + "T" * 43


@dataclass
class Sent:
    method: str
    path: str
    body: Any
    content_type: str | None
    query: Any = None


class RecordingRest:
    """Answers ``request`` from a table of (method, path) -> dict | ApiError."""

    def __init__(self) -> None:
        self.answers: dict[tuple[str, str], list[dict[str, Any] | Exception]] = {}
        self.sent: list[Sent] = []

    def answer(self, method: str, path: str, *answers: dict[str, Any] | Exception) -> None:
        self.answers.setdefault((method, path), []).extend(answers)

    def request(self, method: str, path: str, *, query: Any = None, body: Any = None,
                content_type: str | None = None, timeout: float = 30.0,
                verb: str | None = None) -> dict[str, Any]:
        self.sent.append(Sent(method, path, body, content_type, query))
        queue = self.answers.get((method, path))
        if not queue:
            raise AssertionError(f"unexpected {method} {path}")
        answer = queue.pop(0) if len(queue) > 1 else queue[0]
        if isinstance(answer, Exception):
            raise answer
        return answer


class DictStore:
    def __init__(self, objects: dict[str, dict[str, Any]] | None = None) -> None:
        self.objects = objects or {}

    def get(self, key: str) -> dict[str, Any] | None:
        return self.objects.get(key)

    def list(self) -> builtins.list[dict[str, Any]]:
        return builtins.list(self.objects.values())

    def by_index(self, index: str, value: str) -> builtins.list[dict[str, Any]]:
        assert index == kube.OWNER_INDEX
        return [o for o in self.objects.values() if value in kube.owner_uids(o)]


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def secret(name: str = "app-secrets", **data: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Secret",
            "metadata": {"namespace": "apps", "name": name, "resourceVersion": "5",
                         "uid": "u-1", "creationTimestamp": "2024-01-01T00:00:00Z",
                         "managedFields": [{"manager": "x"}]},
            "data": {k: base64.b64encode(v.encode()).decode() for k, v in data.items()}}


def error(status: int, message: str = "the server said something") -> ApiError:
    reasons = {403: "Forbidden", 404: "NotFound", 409: "Conflict", 422: "Invalid",
               500: "InternalError", 400: "BadRequest"}
    return ApiError(status, reasons.get(status, "Unknown"), message)


class Harness:
    def __init__(self) -> None:
        self.rest = RecordingRest()
        self.hsecs = DictStore()
        self.secrets = DictStore()
        self.clock = Clock()
        # KubeClient only calls RestClient.request; the recording double has that shape.
        rest: RestClient = self.rest  # type: ignore[assignment]
        self.client = KubeClient(rest, himitsu_secrets=self.hsecs, secrets=self.secrets,
                                 clock=self.clock, instance="pod-1")


@pytest.fixture
def h() -> Harness:
    return Harness()


# --- reads -------------------------------------------------------------------------------


def test_himitsu_secret_comes_from_its_informer(h: Harness) -> None:
    h.hsecs.objects["apps/app-config"] = {"metadata": {"name": "app-config"}}
    assert h.client.get_himitsu_secret("apps", "app-config") == {
        "metadata": {"name": "app-config"}}
    assert h.client.get_himitsu_secret("apps", "other") is None
    assert h.rest.sent == []


def test_cached_secret_needs_no_request(h: Harness) -> None:
    h.secrets.objects["apps/app-secrets"] = secret()
    assert h.client.get_secret("apps", "app-secrets") == secret()
    assert h.rest.sent == []


def test_cache_miss_and_fresh_reads_go_to_the_apiserver(h: Harness) -> None:
    h.rest.answer("GET", SECRET_PATH, secret(A="direct"))
    assert h.client.get_secret("apps", "app-secrets") == secret(A="direct")
    h.secrets.objects["apps/app-secrets"] = secret(A="cached")
    assert h.client.get_secret("apps", "app-secrets", fresh=True) == secret(A="direct")
    assert [(s.method, s.path) for s in h.rest.sent] == [("GET", SECRET_PATH)] * 2


def test_missing_secret_is_none(h: Harness) -> None:
    h.rest.answer("GET", SECRET_PATH, error(404))
    assert h.client.get_secret("apps", "app-secrets") is None


def test_read_errors_are_kube_errors(h: Harness) -> None:
    h.rest.answer("GET", SECRET_PATH, error(500, "etcd is on fire"))
    with pytest.raises(KubeError) as info:
        h.client.get_secret("apps", "app-secrets")
    assert str(info.value) == "reading Secret 'app-secrets' failed: 500 InternalError"
    assert info.value.status == 500


# --- the token cache -------------------------------------------------------------------


def test_token_is_decoded_and_cached_for_five_minutes(h: Harness) -> None:
    h.rest.answer("GET", TOKEN_PATH, secret("himitsu-token", token=TOKEN))
    assert h.client.read_secret_value("apps", "himitsu-token", "token").value == TOKEN.encode()
    h.clock.now += TOKEN_TTL - 1
    assert h.client.read_secret_value("apps", "himitsu-token", "token").value == TOKEN.encode()
    assert len(h.rest.sent) == 1
    h.clock.now += 1
    h.client.read_secret_value("apps", "himitsu-token", "token")
    assert len(h.rest.sent) == 2


def test_token_is_read_from_the_apiserver_even_when_cached_by_the_informer(h: Harness) -> None:
    h.secrets.objects["apps/himitsu-token"] = secret("himitsu-token", token="stale")
    h.rest.answer("GET", TOKEN_PATH, secret("himitsu-token", token=TOKEN))
    assert h.client.read_secret_value("apps", "himitsu-token", "token").value == TOKEN.encode()


def test_forget_makes_the_next_read_fresh(h: Harness) -> None:
    h.rest.answer("GET", TOKEN_PATH, secret("himitsu-token", token="old"),
                  secret("himitsu-token", token="new"))
    assert h.client.read_secret_value("apps", "himitsu-token", "token").value == b"old"
    h.client.forget_secret_value("apps", "himitsu-token", "other-key")
    assert h.client.read_secret_value("apps", "himitsu-token", "token").value == b"old"
    h.client.forget_secret_value("apps", "himitsu-token", "token")
    assert h.client.read_secret_value("apps", "himitsu-token", "token").value == b"new"
    assert len(h.rest.sent) == 2


@pytest.mark.parametrize("for_url", [None, "https://himitsu.example.com"])
def test_concurrent_readers_of_one_token_send_one_get(for_url: str | None) -> None:
    rest = RecordingRest()
    rest.answer("GET", TOKEN_PATH, secret("himitsu-token", token=TOKEN))
    readers = 4
    # No reader gets past its first cache check (a lookup, then the clock) before all
    # have missed: without one reader per token, each of them would send a GET.
    everyone_missed = threading.Barrier(readers)
    ticks = itertools.count()

    def clock() -> float:
        if next(ticks) < readers:
            everyone_missed.wait(timeout=10)
        return 1000.0

    client = KubeClient(rest, himitsu_secrets=DictStore(),  # type: ignore[arg-type]
                        secrets=DictStore(), clock=clock, instance="pod-1")
    results: list[bytes | None] = []
    threads = [threading.Thread(target=lambda: results.append(
        client.read_secret_value("apps", "himitsu-token", "token", for_url=for_url).value))
        for _ in range(readers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    assert results == [TOKEN.encode()] * readers
    assert len(rest.sent) == 1


def test_a_binding_added_after_the_token_was_cached_holds_at_once_for_a_new_url(
    h: Harness,
) -> None:
    """The review's case: the token is cached (no binding) from team A's polls; its owner
    then binds it to Himitsu; team B points it at another URL. The cached binding would
    have let it go there for up to TOKEN_TTL: a URL the value has not gone to is a
    fresh read. Polls of a URL it has gone to cost no request."""
    himitsu_url, other = "https://himitsu.example.com", "https://evil.example"
    bound = secret("himitsu-token", token=TOKEN)
    bound["metadata"]["annotations"] = {api.ANN_ALLOWED_API_URLS: himitsu_url}
    h.rest.answer("GET", TOKEN_PATH, secret("himitsu-token", token=TOKEN), bound, bound)
    reader = TokenReader(h.client)
    assert reader.read("apps", "himitsu-token", "token", api_url=himitsu_url) == TOKEN
    for _ in range(3):
        reader.read("apps", "himitsu-token", "token", api_url=himitsu_url)
    assert len(h.rest.sent) == 1  # the steady state: no request per poll
    with pytest.raises(TokenNotAllowed):
        reader.read("apps", "himitsu-token", "token", api_url=other)
    assert len(h.rest.sent) == 2
    # The refusal dropped the cache: the allowed URL reads afresh once, then is cached.
    assert reader.read("apps", "himitsu-token", "token", api_url=himitsu_url) == TOKEN
    reader.read("apps", "himitsu-token", "token", api_url=himitsu_url)
    assert len(h.rest.sent) == 3


def test_token_cache_is_per_key(h: Harness) -> None:
    h.rest.answer("GET", TOKEN_PATH, secret("himitsu-token", token="a", other="b"))
    assert h.client.read_secret_value("apps", "himitsu-token", "token").value == b"a"
    assert h.client.read_secret_value("apps", "himitsu-token", "other").value == b"b"


def test_token_comes_with_its_secrets_allowed_api_urls_cached_alongside(h: Harness) -> None:
    bound = secret("himitsu-token", token=TOKEN)
    bound["metadata"]["annotations"] = {api.ANN_ALLOWED_API_URLS: "https://himitsu.example.com"}
    h.rest.answer("GET", TOKEN_PATH, bound)
    first = h.client.read_secret_value("apps", "himitsu-token", "token")
    assert first.allowed_api_urls == "https://himitsu.example.com"
    assert h.client.read_secret_value("apps", "himitsu-token", "token") == first
    assert len(h.rest.sent) == 1
    assert TOKEN not in repr(first)
    h.client.forget_secret_value("apps", "himitsu-token", "token")
    h.rest.answers.clear()
    h.rest.answer("GET", TOKEN_PATH, secret("himitsu-token", token=TOKEN))
    assert h.client.read_secret_value("apps", "himitsu-token", "token").allowed_api_urls is None


def test_missing_token_secret_and_key(h: Harness) -> None:
    h.rest.answer("GET", TOKEN_PATH, error(404))
    with pytest.raises(SecretNotFound):
        h.client.read_secret_value("apps", "himitsu-token", "token")
    h.rest.answers.clear()
    h.rest.answer("GET", TOKEN_PATH, secret("himitsu-token", other="x"))
    assert h.client.read_secret_value("apps", "himitsu-token", "token").value is None
    # A missing key is not cached: adding it is picked up at the next reconcile.
    h.rest.answers.clear()
    h.rest.answer("GET", TOKEN_PATH, secret("himitsu-token", token=TOKEN))
    assert h.client.read_secret_value("apps", "himitsu-token", "token").value == TOKEN.encode()


def test_undecodable_token_value_reads_as_empty(h: Harness) -> None:
    broken = secret("himitsu-token")
    broken["data"]["token"] = "not base64!"
    h.rest.answer("GET", TOKEN_PATH, broken)
    assert h.client.read_secret_value("apps", "himitsu-token", "token").value == b""


def test_token_read_denied_keeps_the_apiserver_reason(h: Harness) -> None:
    h.rest.answer("GET", TOKEN_PATH, error(403, 'secrets "himitsu-token" is forbidden'))
    with pytest.raises(KubeError) as info:
        h.client.read_secret_value("apps", "himitsu-token", "token")
    assert "403 Forbidden: secrets \"himitsu-token\" is forbidden" in str(info.value)


# --- writes ----------------------------------------------------------------------------


def test_create_strips_server_fields(h: Harness) -> None:
    h.rest.answer("POST", "/api/v1/namespaces/apps/secrets", secret(A="1"))
    assert h.client.create_secret("apps", secret(A="1")) == secret(A="1")
    (sent,) = h.rest.sent
    assert sent.body["metadata"] == {"namespace": "apps", "name": "app-secrets"}
    assert sent.body["data"] == secret(A="1")["data"]


def already_exists(name: str = "app-secrets") -> ApiError:
    """The apiserver's own answer to a create whose name is taken (kube-apiserver 1.36)."""
    body = {"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": 409,
            "reason": "AlreadyExists", "message": f'secrets "{name}" already exists',
            "details": {"name": name, "kind": "secrets"}}
    return ApiError.from_response(409, json.dumps(body).encode())


def webhook_409(**details: str) -> ApiError:
    """A webhook's denial with code 409 and reason AlreadyExists (a uniqueness rule)."""
    body = {"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": 409,
            "reason": "AlreadyExists", "details": details,
            "message": 'admission webhook "unique-tls.example.com" denied the request: '
                       'a TLS Secret for host "shop.example.com" already exists'}
    return ApiError.from_response(409, json.dumps(body).encode())


def test_create_conflict(h: Harness) -> None:
    h.rest.answer("POST", "/api/v1/namespaces/apps/secrets", already_exists())
    with pytest.raises(Conflict):
        h.client.create_secret("apps", secret())


def test_dry_run_create_is_a_create_with_dry_run_all_under_the_real_name(h: Harness) -> None:
    h.rest.answer("POST", "/api/v1/namespaces/apps/secrets", secret(A="1"))
    h.client.dry_run_create_secret("apps", secret(A="1"))  # no error: it would be created
    (sent,) = h.rest.sent
    assert sent.query == {"dryRun": "All"}
    assert sent.body["metadata"] == {"namespace": "apps", "name": "app-secrets"}


def test_dry_run_already_exists_means_admission_and_validation_passed(h: Harness) -> None:
    # The apiserver validates (422) and admits before it looks for the name (409): on
    # kube-apiserver 1.36 a dry-run create of an existing name answers 422 for bad data
    # and AlreadyExists for good data.
    h.rest.answer("POST", "/api/v1/namespaces/apps/secrets", already_exists())
    h.client.dry_run_create_secret("apps", secret())


@pytest.mark.parametrize("answer", [
    webhook_409(), webhook_409(kind="secrets", name="app-secrets"),
    already_exists("other-secret"),
    ApiError(409, "AlreadyExists", 'secrets "app-secrets" already exists'),  # no details
])
def test_only_the_apiservers_own_already_exists_is_would_be_created(
    h: Harness, answer: ApiError,
) -> None:
    # A webhook denying with 409 AlreadyExists was read as "would succeed": the operator
    # deleted the Secret and the real create was denied (review of issue 11 item 1).
    h.rest.answer("POST", "/api/v1/namespaces/apps/secrets", answer)
    with pytest.raises(KubeError) as info:
        h.client.dry_run_create_secret("apps", secret())
    assert not isinstance(info.value, Conflict)
    assert info.value.status == 409
    with pytest.raises(KubeError) as info:
        h.client.create_secret("apps", secret())
    assert not isinstance(info.value, Conflict), "a webhook's 409 is no race to retry"
    if "unique-tls" in answer.message:
        assert "unique-tls.example.com" in str(info.value)
        assert "shop.example.com" not in str(info.value)  # the webhook's text is withheld


def test_update_is_conditional_on_the_resource_version(h: Harness) -> None:
    h.rest.answer("PUT", SECRET_PATH, secret(A="2"))
    h.client.update_secret("apps", secret(A="2"))
    (sent,) = h.rest.sent
    assert sent.body["metadata"]["resourceVersion"] == "5"


@pytest.mark.parametrize("status", [404, 409])
def test_update_races_are_conflicts(h: Harness, status: int) -> None:
    h.rest.answer("PUT", SECRET_PATH, error(status))
    with pytest.raises(Conflict) as info:
        h.client.update_secret("apps", secret())
    assert info.value.status == 409


def test_delete_carries_a_uid_precondition(h: Harness) -> None:
    h.rest.answer("DELETE", SECRET_PATH, {})
    h.client.delete_secret("apps", "app-secrets", uid="u-1")
    assert h.rest.sent[0].body["preconditions"] == {"uid": "u-1"}
    h.rest.answers.clear()
    h.rest.answer("DELETE", SECRET_PATH, error(404))
    h.client.delete_secret("apps", "app-secrets", uid="u-1")  # already gone: fine
    h.rest.answers.clear()
    h.rest.answer("DELETE", SECRET_PATH, error(409))
    with pytest.raises(Conflict):
        h.client.delete_secret("apps", "app-secrets", uid="u-1")


def test_status_patch_is_a_merge_patch_on_the_status_subresource(h: Harness) -> None:
    path = "/apis/himitsu.io/v1alpha1/namespaces/apps/himitsusecrets/app-config/status"
    h.rest.answer("PATCH", path, {})
    h.client.patch_status("apps", "app-config", {"configVersion": 3, "lastForceSync": None})
    (sent,) = h.rest.sent
    assert sent.content_type == "application/merge-patch+json"
    assert sent.body == {"status": {"configVersion": 3, "lastForceSync": None}}
    h.rest.answers.clear()
    h.rest.answer("PATCH", path, error(500, "boom"))
    with pytest.raises(KubeError, match="updating status of HimitsuSecret 'app-config' failed"):
        h.client.patch_status("apps", "app-config", {})


@pytest.mark.parametrize(("status", "shown"), [
    (403, True), (422, True), (400, False), (500, False), (409, True)])
def test_only_denials_conflicts_and_validation_errors_show_the_apiserver_message(
    h: Harness, status: int, shown: bool,
) -> None:
    h.rest.answer("POST", "/api/v1/namespaces/apps/secrets",
                  error(status, 'Secret "app-secrets" is invalid: APISERVER-TEXT'))
    with pytest.raises(KubeError) as info:
        h.client.create_secret("apps", secret())
    assert ("APISERVER-TEXT" in str(info.value)) is shown
    assert not isinstance(info.value, Conflict)  # not the apiserver's AlreadyExists
    assert str(info.value).startswith(f"creating Secret 'app-secrets' failed: {status} ")


CANARY = "Q2FuYXJ5VmFsdWUtN2YzYQ=="  # what a Secret value looks like on the wire


@pytest.mark.parametrize("message", [
    # Validation quotes the value it refused (real kube-apiserver 1.36 messages).
    f'Secret "app-secrets" is invalid: metadata.labels: Invalid value: "{CANARY}": a valid '
    "label must be an empty string or consist of alphanumeric characters",
    f'Secret "app-secrets" is invalid: [data[A]: Invalid value: "{CANARY}", '
    f'metadata.annotations: Duplicate value: "{CANARY}"]',
    f'Secret "app-secrets" is invalid: spec.x: Unsupported value: "{CANARY}": supported '
    'values: "a", "b"',
    # Admission webhooks write free text, quoting what they disliked.
    f'admission webhook "policy.example.com" denied the request: value "{CANARY}" of key '
    '"A" is not allowed',
    # A message cut inside a quote.
    f'Secret "app-secrets" is invalid: data[A]: Invalid value: "{CANARY}',
    f'Secret "app-secrets" is invalid: x: Invalid value: map[string]string{{"A":"{CANARY}"}}',
])
@pytest.mark.parametrize("status", [422, 403])
def test_canary_quoted_values_never_reach_a_kube_error(
    h: Harness, message: str, status: int,
) -> None:
    body = json.dumps({"kind": "Status", "code": status, "reason": "Invalid",
                       "message": message}).encode()
    h.rest.answer("PUT", SECRET_PATH, ApiError.from_response(status, body))
    with pytest.raises(KubeError) as info:
        h.client.update_secret("apps", secret())
    shown = str(info.value)
    assert CANARY not in shown and CANARY[:12] not in shown
    assert CANARY not in repr(info.value.__cause__) and info.value.__suppress_context__
    assert shown.startswith(f"updating Secret 'app-secrets' failed: {status} Invalid: ")
    # What the user needs stays: the field path, the webhook, the explanation.
    for kept in ("metadata.labels", "data[A]", "policy.example.com", "supported values"):
        if kept in message:
            assert kept in shown


def test_names_users_and_resources_stay_in_a_denial(h: Harness) -> None:
    message = ('secrets "app-secrets" is forbidden: User "system:serviceaccount:himitsu-'
               'system:himitsu-operator" cannot update resource "secrets" in API group "" '
               'in the namespace "apps"')
    h.rest.answer("PUT", SECRET_PATH, ApiError(403, "Forbidden", message))
    with pytest.raises(KubeError) as info:
        h.client.update_secret("apps", secret())
    assert str(info.value).endswith(message)


def test_long_apiserver_messages_are_cut(h: Harness) -> None:
    h.rest.answer("PUT", SECRET_PATH, error(422, "x" * 5000))
    with pytest.raises(KubeError) as info:
        h.client.update_secret("apps", secret())
    assert len(str(info.value)) < 400


# --- events ----------------------------------------------------------------------------


def test_event_shape(h: Harness) -> None:
    h.rest.answer("POST", "/api/v1/namespaces/apps/events", {})
    obj = {"metadata": {"namespace": "apps", "name": "app-config", "uid": "u-9",
                        "resourceVersion": "77"}}
    h.client.record_event(obj, type="Warning", reason="FetchFailure", message="m" * 5000)
    (sent,) = h.rest.sent
    event = sent.body
    assert event["metadata"] == {"generateName": "app-config.", "namespace": "apps"}
    assert event["involvedObject"] == {
        "apiVersion": api.API_VERSION, "kind": api.KIND, "namespace": "apps",
        "name": "app-config", "uid": "u-9", "resourceVersion": "77"}
    assert (event["type"], event["reason"]) == ("Warning", "FetchFailure")
    assert len(event["message"]) == 1024
    assert event["source"] == {"component": "himitsu-operator"}
    assert event["reportingInstance"] == "pod-1"
    assert event["firstTimestamp"] == event["lastTimestamp"]
    assert event["count"] == 1


def test_event_errors_are_kube_errors(h: Harness) -> None:
    h.rest.answer("POST", "/api/v1/namespaces/apps/events", error(403, "no events for you"))
    with pytest.raises(KubeError, match="recording an Event failed: 403 Forbidden"):
        h.client.record_event({"metadata": {"namespace": "apps", "name": "x"}},
                              type="Normal", reason="Synced", message="m")


class FakeSink:
    def __init__(self) -> None:
        self.events: list[tuple[dict[str, Any], str, str, str]] = []

    def event(self, obj: Any, *, type: str, reason: str, message: str) -> None:
        self.events.append((dict(obj), type, reason, message))


HSEC = {"metadata": {"namespace": "apps", "name": "app-config", "uid": "u-9",
                     "resourceVersion": "77"},
        "spec": {"apiUrl": "https://himitsu.example.com"}, "status": {"secretCount": 3}}


def test_with_a_recorder_events_are_handed_off_and_nothing_is_sent(h: Harness) -> None:
    sink = FakeSink()
    rest: RestClient = h.rest  # type: ignore[assignment]
    client = KubeClient(rest, himitsu_secrets=h.hsecs, secrets=h.secrets, events=sink)
    client.record_event(HSEC, type="Warning", reason="FetchFailure", message="m")
    assert h.rest.sent == []
    # The generic recorder reads the kind from the object: KubeClient names it.
    assert sink.events == [({"apiVersion": api.API_VERSION, "kind": api.KIND,
                             "metadata": HSEC["metadata"]}, "Warning", "FetchFailure", "m")]


def test_the_recorder_sends_the_same_event_the_synchronous_path_does(h: Harness) -> None:
    h.rest.answer("POST", "/api/v1/namespaces/apps/events", {})
    h.client.record_event(HSEC, type="Normal", reason="Synced", message="m" * 5000)
    recorder = EventRecorder(h.rest, component=kube.COMPONENT, instance="pod-1",
                             reporting_controller=kube.REPORTING_CONTROLLER)
    rest: RestClient = h.rest  # type: ignore[assignment]
    client = KubeClient(rest, himitsu_secrets=h.hsecs, secrets=h.secrets, events=recorder)
    recorder.start()
    client.record_event(HSEC, type="Normal", reason="Synced", message="m" * 5000)
    assert recorder.stop(10.0)
    direct, queued = (sent.body for sent in h.rest.sent)
    assert queued["reportingComponent"] == "himitsu.io/himitsu-operator"
    stamps = ("firstTimestamp", "lastTimestamp")
    assert {k: v for k, v in queued.items() if k not in stamps} == \
        {k: v for k, v in direct.items() if k not in stamps}


@pytest.mark.parametrize(("method", "path", "named"), [
    ("POST", "/api/v1/namespaces/apps/secrets", "POST secrets"),
    ("PUT", SECRET_PATH, "PUT secrets/app-secrets"),
    ("PATCH", "/apis/himitsu.io/v1alpha1/namespaces/apps/himitsusecrets/app/status",
     "PATCH himitsusecrets/app/status"),
])
def test_an_unreachable_apiserver_names_the_object_not_the_namespace(
        h: Harness, method: str, path: str, named: str) -> None:
    h.rest.answer(method, path, TransportError("connection refused"))
    with pytest.raises(KubeError) as info:
        if method == "POST":
            h.client.create_secret("apps", secret())
        elif method == "PUT":
            h.client.update_secret("apps", secret())
        else:
            h.client.patch_status("apps", "app", {"x": 1})
    assert str(info.value) == f"{named}: Kubernetes API unreachable"
    assert info.value.reason == "Unreachable"


def test_a_write_the_gate_refused_says_not_the_leader_not_unreachable(h: Harness) -> None:
    """WriteRefused is a TransportError to the runtime; in status and logs it must not read
    as an apiserver outage."""
    h.rest.answer("PUT", SECRET_PATH, WriteRefused("PUT ...: not sent"))
    with pytest.raises(KubeError) as info:
        h.client.update_secret("apps", secret())
    assert str(info.value) == "PUT secrets/app-secrets: not the leader any more: write refused"
    assert info.value.reason == "NotLeader"


# --- memory follows live objects -----------------------------------------------------------


def token_path(name: str) -> str:
    return f"/api/v1/namespaces/apps/secrets/{name}"


def hsec_naming(token_secret: str, key: str | None = None) -> dict[str, Any]:
    ref = {"name": token_secret} if key is None else {"name": token_secret, "key": key}
    return {"metadata": {"namespace": "apps", "name": f"uses-{token_secret}"},
            "spec": {"authSecretRef": ref, "target": {"name": "t"}}}


def read_tokens(h: Harness, count: int, prefix: str = "tok") -> None:
    for i in range(count):
        h.rest.answer("GET", token_path(f"{prefix}-{i}"), secret(f"{prefix}-{i}", token=TOKEN))
        assert h.client.read_secret_value("apps", f"{prefix}-{i}", "token").value \
            == TOKEN.encode()


def test_reader_locks_live_only_while_a_read_is_under_way(h: Harness) -> None:
    read_tokens(h, 1000)
    assert h.client.cache_sizes() == {"tokens": 1000, "readers": 0}


def test_token_values_unused_for_a_ttl_are_swept_out(h: Harness) -> None:
    read_tokens(h, 1000)
    h.clock.now += TOKEN_TTL
    read_tokens(h, 1, prefix="still-used")  # any miss sweeps (at most once per TTL)
    assert h.client.cache_sizes() == {"tokens": 1, "readers": 0}


def test_a_token_no_himitsu_secret_names_any_more_is_dropped(h: Harness) -> None:
    read_tokens(h, 2)
    named = {"apps/tok-0/token"}
    h.client.forget_token_of(hsec_naming("tok-0"), still_named=named.__contains__)
    assert h.client.cache_sizes()["tokens"] == 2  # another HimitsuSecret still names it
    h.client.forget_token_of(hsec_naming("tok-1"), still_named=named.__contains__)
    assert h.client.cache_sizes()["tokens"] == 1
    sent = len(h.rest.sent)
    h.client.read_secret_value("apps", "tok-0", "token")
    assert len(h.rest.sent) == sent  # the one still named is still served from the cache


def test_a_deleted_token_secret_takes_its_cached_value_along(h: Harness) -> None:
    read_tokens(h, 1)
    h.clock.now += TOKEN_TTL
    h.rest.answers.clear()
    h.rest.answer("GET", token_path("tok-0"), error(404))
    with pytest.raises(SecretNotFound):
        h.client.read_secret_value("apps", "tok-0", "token")
    assert h.client.cache_sizes() == {"tokens": 0, "readers": 0}


def test_token_refs_name_the_namespace_secret_and_key_with_the_default_key() -> None:
    assert kube.token_refs(hsec_naming("himitsu-token")) == ["apps/himitsu-token/token"]
    assert kube.token_refs(hsec_naming("himitsu-token", "api")) == ["apps/himitsu-token/api"]
    assert kube.token_refs({"metadata": {"namespace": "apps"}, "spec": {}}) == []
    assert kube.token_refs({"metadata": {"namespace": "apps"},
                            "spec": {"authSecretRef": "oops"}}) == []


def test_a_token_read_in_flight_when_its_last_user_goes_keeps_no_value(h: Harness) -> None:
    # A reconcile is mid-GET of its token when its HimitsuSecret is deleted: the forget
    # runs first; the read must not cache the value afterwards (nothing would sweep it).
    in_get, release = threading.Event(), threading.Event()
    inner = h.rest.request

    def held_request(method: str, path: str, **kwargs: Any) -> dict[str, Any]:
        in_get.set()
        assert release.wait(TIMEOUT)
        return inner(method, path, **kwargs)

    h.rest.request = held_request  # type: ignore[method-assign]
    h.rest.answer("GET", token_path("tok-0"), secret("tok-0", token=TOKEN))
    reader = threading.Thread(target=h.client.read_secret_value,
                              args=("apps", "tok-0", "token"))
    reader.start()
    assert in_get.wait(TIMEOUT)
    h.client.forget_token_of(hsec_naming("tok-0"), still_named=lambda ref: False)
    release.set()
    reader.join(TIMEOUT)
    assert not reader.is_alive()
    assert h.client.cache_sizes() == {"tokens": 0, "readers": 0}


def test_a_token_read_for_a_himitsu_secret_already_gone_keeps_no_value(h: Harness) -> None:
    # Deleted (and forgotten) after its reconcile read it from the cache, before the
    # token read began: no forget can come later, so the read asks who still names it.
    named = {"apps/tok-1/token"}
    h.client.track_token_users(named.__contains__)
    read_tokens(h, 2)
    assert h.client.cache_sizes() == {"tokens": 1, "readers": 0}
    sent = len(h.rest.sent)
    h.client.read_secret_value("apps", "tok-1", "token")
    assert len(h.rest.sent) == sent  # the one still named is cached
