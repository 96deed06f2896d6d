"""Unit tests for the Himitsu API client, with `responses` standing in for the server.

What a mocked adapter cannot show (a trickling server, a reset, TLS, connection reuse)
is proven against a loopback server in test_himitsu_http.py.
"""

from __future__ import annotations

import email.utils
import json
import logging
import threading
import time
import traceback
from collections.abc import Callable, Iterator, MutableMapping
from typing import Any

import pytest
import requests
import responses
import structlog
from fakes import himitsu_clients
from structlog.testing import LogCapture
from structlog.tracebacks import ExceptionDictTransformer

from himitsu_controller import __version__, himitsu
from himitsu_controller.himitsu import (
    BadRequest,
    Fetched,
    Forbidden,
    HimitsuClient,
    InvalidInput,
    InvalidToken,
    NotFound,
    NotModified,
    RateLimited,
    ServerError,
    TransportError,
    Unauthorized,
    Undecodable,
    UnexpectedStatus,
)
from himitsu_controller.himitsu.http import new_session

TOKEN = "himi_0123456789abcdef_" + "CANARYtokenCANARYtokenCANARYtokenCANARY_-xy"
SECRET = "canary-secret-value-7f3a"
ENVELOPE_TEXT = "canary-envelope-message"
API = "http://himitsu.test"
PROJECT = "0b6f8a52-1c3e-4d5f-9a7b-2c4d6e8f0a1b"
ENV = "5d2e1f3a-7b8c-4d9e-8f0a-1b2c3d4e5f60"
URL = f"{API}/api/v1/projects/{PROJECT}/environments/{ENV}/secrets/runtime"
NOT_HIMITSU = "response was not a Himitsu API response"


@pytest.fixture
def outcomes() -> list[str]:
    return []


@pytest.fixture
def make_client(outcomes: list[str]) -> Iterator[Callable[..., HimitsuClient]]:
    with himitsu_clients(observer=outcomes.append) as make:
        yield make


@pytest.fixture
def mock(monkeypatch: pytest.MonkeyPatch) -> Iterator[responses.RequestsMock]:
    monkeypatch.delenv("REQUESTS_CA_BUNDLE", raising=False)
    monkeypatch.delenv("CURL_CA_BUNDLE", raising=False)
    with responses.RequestsMock(assert_all_requests_are_fired=False) as rsps:
        yield rsps


def fetch(client: HimitsuClient, known: int | None = None, **overrides: Any) -> himitsu.FetchResult:
    args: dict[str, Any] = {
        "api_url": API, "project_id": PROJECT, "environment_id": ENV, "token": TOKEN,
        "known_version": known,
    }
    args.update(overrides)
    return client.fetch(**args)


def runtime(version: int, secrets: dict[str, Any], **headers: str) -> dict[str, Any]:
    return {"json": {"data": {"configVersion": version, "secrets": secrets}}, "headers": headers}


def envelope(code: str, request_id: str = "req_123") -> dict[str, Any]:
    return {"error": {"code": code, "message": ENVELOPE_TEXT, "requestId": request_id}}


# --- local validation -------------------------------------------------------------


@pytest.mark.parametrize(("given", "expected"), [
    ("https://himitsu.example.com", "https://himitsu.example.com"),
    ("https://himitsu.example.com/", "https://himitsu.example.com"),
    ("  HTTPS://Himitsu.Example.COM:443/ ", "https://himitsu.example.com"),
    ("http://127.0.0.1:8080/prefix/", "http://127.0.0.1:8080/prefix"),
    ("http://[::1]:80", "http://[::1]"),
    ("https://[::1]:8443/api-gw", "https://[::1]:8443/api-gw"),
])
def test_validate_api_url_normalises(given: str, expected: str) -> None:
    assert himitsu.validate_api_url(given) == expected


@pytest.mark.parametrize("given", [
    "", "   ", "himitsu.example.com", "ftp://himitsu.example.com", "https://",
    "https://user:canary-pass@himitsu.example.com", "https://himitsu.example.com?x=1",
    "https://himitsu.example.com/#frag", "https://himitsu.example.com:99999",
    "https://himi tsu.example.com", "https://himitsu.example.com/a\nb", "https://h\x00.test",
    # Admitted by the CRD's pattern, yet no URL (urlsplit raised ValueError on these).
    "http://[::1", "https://h.example]", "https://[::1]]",
    # Not ASCII, a zone, an invisible character, or longer than the CRD allows.
    "https://b\u00fccher.example", "https://[fe80::1%25eth0]", "https://exa\u200bmple.com",
    "https://h.example/\x9b", "https://[v1.x]", "https://h.example/" + "a" * 2040,
])
def test_validate_api_url_rejects(given: str) -> None:
    with pytest.raises(InvalidInput) as caught:
        himitsu.validate_api_url(given)
    assert "canary-pass" not in str(caught.value)


def test_validate_token_strips_whitespace() -> None:
    assert himitsu.validate_token(f"  {TOKEN}\n") == TOKEN
    assert himitsu.TOKEN_PATTERN.fullmatch(TOKEN)


@pytest.mark.parametrize("bad", [
    TOKEN[:-1], TOKEN + "x", TOKEN.replace("0123", "ABCD"), TOKEN.replace("himi_", "HIMI_"),
    TOKEN[:30] + "\n" + TOKEN[31:], TOKEN[:-1] + "=", TOKEN + "\n" + TOKEN, "",
])
def test_validate_token_rejects_without_echoing(bad: str) -> None:
    with pytest.raises(InvalidToken) as caught:
        himitsu.validate_token(bad)
    message = str(caught.value)
    assert "CANARY" not in message and "0123456789abcdef" not in message
    # One message whatever the value, so nothing of it (not even its length) shows to
    # whoever may create a HimitsuSecret but not read the token Secret.
    with pytest.raises(InvalidToken) as other:
        himitsu.validate_token("x")
    assert message == str(other.value)
    assert "himi_<16 hex>_<43 base64url>" in message


@pytest.mark.parametrize("overrides", [
    {"project_id": "not-a-uuid"}, {"project_id": f"{{{PROJECT}}}"}, {"project_id": "../../x"},
    {"environment_id": ENV + "/"}, {"environment_id": ENV + "\n"}, {"environment_id": ""},
    {"api_url": "ftp://himitsu.test"}, {"api_url": "http://u:p@himitsu.test"},
])
def test_invalid_input_sends_nothing(
    mock: responses.RequestsMock, make_client: Callable[..., HimitsuClient],
    outcomes: list[str], overrides: dict[str, Any],
) -> None:
    mock.get(URL, **runtime(1, {}))
    with pytest.raises(InvalidInput):
        fetch(make_client(), **overrides)
    assert len(mock.calls) == 0
    assert outcomes == []


def test_invalid_token_sends_nothing(
    mock: responses.RequestsMock, make_client: Callable[..., HimitsuClient],
) -> None:
    mock.get(URL, **runtime(1, {}))
    with pytest.raises(InvalidToken) as caught:
        fetch(make_client(), token=TOKEN[:40])
    assert TOKEN[:40] not in str(caught.value)
    assert len(mock.calls) == 0


def test_missing_ca_file_is_rejected_up_front(tmp_path: Any) -> None:
    with pytest.raises(InvalidInput, match="CA file"):
        HimitsuClient(ca_file=str(tmp_path / "missing.pem"))


# --- the request --------------------------------------------------------------------


@pytest.mark.parametrize(("known", "sent"), [
    (None, None), (-3, None), (True, None), (7, '"himi-config-7"'),
])
def test_request_shape(
    mock: responses.RequestsMock, make_client: Callable[..., HimitsuClient],
    known: Any, sent: str | None,
) -> None:
    if sent is None:
        mock.get(URL, **runtime(7, {"A": "1"}, **{"X-Himitsu-Config-Version": "7"}))
        assert isinstance(fetch(make_client(), known=known), Fetched)
    else:
        mock.get(URL, status=304, headers={"X-Himitsu-Config-Version": "7"})
        assert fetch(make_client(), known=known) == NotModified(version=7)
    assert len(mock.calls) == 1
    request = mock.calls[0].request
    assert request.method == "GET"
    assert request.url == URL
    assert request.headers["Authorization"] == f"Bearer {TOKEN}"
    assert request.headers["Accept"] == "application/json"
    assert request.headers["User-Agent"] == himitsu.USER_AGENT == (
        f"himitsu-k8s-operator/{__version__}")
    assert request.headers["Accept-Encoding"] == "identity"
    assert "Content-Type" not in request.headers
    assert "Cookie" not in request.headers
    assert request.headers.get("If-None-Match") == sent
    assert request.body is None
    kwargs = request.req_kwargs  # type: ignore[attr-defined]
    assert kwargs["stream"] is True
    assert kwargs["timeout"] == (5, 15)
    assert kwargs["verify"] is True


def test_ids_are_lowercased_and_token_trimmed(
    mock: responses.RequestsMock, make_client: Callable[..., HimitsuClient],
) -> None:
    mock.get(URL, **runtime(1, {}))
    fetch(make_client(), project_id=PROJECT.upper(), environment_id=ENV.upper(),
          token=f"\t{TOKEN} \n", api_url=API + "/")
    assert mock.calls[0].request.url == URL
    assert mock.calls[0].request.headers["Authorization"] == f"Bearer {TOKEN}"


def test_no_content_type_even_if_the_session_has_one(
    mock: responses.RequestsMock, make_client: Callable[..., HimitsuClient],
) -> None:
    def factory() -> requests.Session:
        session = new_session()
        session.headers["Content-Type"] = "application/json"
        return session

    mock.get(URL, **runtime(1, {}))
    fetch(make_client(session_factory=factory))
    assert "Content-Type" not in mock.calls[0].request.headers


def test_ca_file_and_requests_ca_bundle(
    mock: responses.RequestsMock, make_client: Callable[..., HimitsuClient],
    monkeypatch: pytest.MonkeyPatch, tmp_path: Any,
) -> None:
    ours, env_bundle = tmp_path / "ours.pem", tmp_path / "env.pem"
    ours.write_text("x")
    env_bundle.write_text("x")
    monkeypatch.setenv("REQUESTS_CA_BUNDLE", str(env_bundle))
    mock.get(URL, **runtime(1, {}))
    fetch(make_client(ca_file=str(ours)))
    fetch(make_client())
    assert mock.calls[0].request.req_kwargs["verify"] == str(ours)  # type: ignore[attr-defined]
    assert mock.calls[1].request.req_kwargs["verify"] == str(env_bundle)  # type: ignore[attr-defined]


def test_one_session_per_base_url_created_once_under_concurrency(
    mock: responses.RequestsMock, make_client: Callable[..., HimitsuClient],
) -> None:
    created: list[str] = []
    second_entry = threading.Event()

    def factory() -> requests.Session:
        created.append("session")
        if len(created) == 1:
            # Give a racing thread the chance to enter too; with the lock it never does.
            second_entry.wait(timeout=0.3)
        else:
            second_entry.set()
        return new_session()

    mock.get(URL, **runtime(1, {}))
    mock.get(URL.replace("himitsu.test", "other.test"), **runtime(1, {}))
    client = make_client(session_factory=factory)
    barrier = threading.Barrier(6)

    def worker() -> None:
        barrier.wait()
        fetch(client)

    threads = [threading.Thread(target=worker) for _ in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=10)
    assert len(created) == 1
    fetch(client, api_url=API + "/")  # same base once normalised
    assert len(created) == 1
    fetch(client, api_url="http://other.test")
    assert len(created) == 2


def test_cookies_never_ride_along_with_another_request(
    mock: responses.RequestsMock, make_client: Callable[..., HimitsuClient],
) -> None:
    mock.get(URL, json={"data": {"configVersion": 1, "secrets": {}}},
             headers={"Set-Cookie": "sid=canary-cookie; Path=/"})
    client = make_client()
    fetch(client)
    fetch(client)
    assert "Cookie" not in mock.calls[1].request.headers


def test_redirects_are_not_followed(
    mock: responses.RequestsMock, make_client: Callable[..., HimitsuClient], outcomes: list[str],
) -> None:
    elsewhere = "http://elsewhere.test/steal"
    mock.get(URL, status=302, headers={"Location": elsewhere})
    mock.get(elsewhere, **runtime(1, {}))
    with pytest.raises(UnexpectedStatus, match="redirect not followed") as caught:
        fetch(make_client())
    assert len(mock.calls) == 1
    assert "elsewhere" not in str(caught.value)
    assert caught.value.status == 302
    assert outcomes == ["other"]


def test_closed_client_refuses(make_client: Callable[..., HimitsuClient]) -> None:
    client = make_client()
    client.close()
    with pytest.raises(RuntimeError):
        fetch(client)


# --- 200 and 304 -------------------------------------------------------------------


def test_200_returns_every_secret_read_only(
    mock: responses.RequestsMock, make_client: Callable[..., HimitsuClient], outcomes: list[str],
) -> None:
    secrets = {"DATABASE_URL": "postgres://x", "lower.key": "", "ünï": "välue", "B": SECRET}
    mock.get(URL, **runtime(12, secrets, **{"X-Himitsu-Config-Version": "12",
                                           "ETag": '"himi-config-12"'}))
    result = fetch(make_client())
    assert result == Fetched(version=12, secrets=secrets)
    assert isinstance(result, Fetched)
    assert dict(result.secrets) == secrets
    with pytest.raises(TypeError):
        result.secrets["NEW"] = "x"  # type: ignore[index]
    assert SECRET not in repr(result)
    assert outcomes == ["200"]


@pytest.mark.parametrize(("headers", "expected"), [
    ({}, 7),
    ({"X-Himitsu-Config-Version": "9"}, 9),
    ({"X-Himitsu-Config-Version": "9", "ETag": '"himi-config-8"'}, 9),
    ({"ETag": '"himi-config-8"'}, 8),
    ({"ETag": 'W/"himi-config-8"'}, 8),
    ({"X-Himitsu-Config-Version": "nine", "ETag": '"himi-config-8"'}, 8),
    ({"X-Himitsu-Config-Version": "-1"}, 7),
    ({"ETag": '"something-else"'}, 7),
])
def test_200_version_header_wins_over_body(
    mock: responses.RequestsMock, make_client: Callable[..., HimitsuClient],
    headers: dict[str, str], expected: int,
) -> None:
    mock.get(URL, **runtime(7, {"A": "1"}, **headers))
    result = fetch(make_client())
    assert isinstance(result, Fetched) and result.version == expected


def test_empty_environment_at_version_zero(
    mock: responses.RequestsMock, make_client: Callable[..., HimitsuClient],
) -> None:
    mock.get(URL, **runtime(0, {}, **{"X-Himitsu-Config-Version": "0"}))
    assert fetch(make_client()) == Fetched(version=0, secrets={})


def test_version_zero_is_sent_as_if_none_match_and_a_304_confirms_it(
    mock: responses.RequestsMock, make_client: Callable[..., HimitsuClient],
) -> None:
    # The real server answers 304 to "himi-config-0" (an empty environment): without
    # it an empty environment was re-read in full, a secret.read audit event, every poll.
    mock.get(URL, status=304, headers={"X-Himitsu-Config-Version": "0",
                                       "ETag": '"himi-config-0"'})
    assert fetch(make_client(), known=0) == NotModified(version=0)
    assert mock.calls[0].request.headers.get("If-None-Match") == '"himi-config-0"'


BAD_200_BODIES = {
    "not json": f"<html>{SECRET}</html>".encode(),
    "array": b"[]",
    "data null": b'{"data": null}',
    "no version": json.dumps({"data": {"secrets": {"A": SECRET}}}).encode(),
    "negative version": json.dumps({"data": {"configVersion": -1, "secrets": {}}}).encode(),
    "bool version": json.dumps({"data": {"configVersion": True, "secrets": {}}}).encode(),
    "float version": json.dumps({"data": {"configVersion": 1.0, "secrets": {}}}).encode(),
    "string version": json.dumps({"data": {"configVersion": "1", "secrets": {}}}).encode(),
    "secrets list": json.dumps({"data": {"configVersion": 1, "secrets": [SECRET]}}).encode(),
    "no secrets": json.dumps({"data": {"configVersion": 1}}).encode(),
    "int value": json.dumps({"data": {"configVersion": 1, "secrets": {"A": SECRET, "B": 1}}})
    .encode(),
    "null value": json.dumps({"data": {"configVersion": 1, "secrets": {"B": None}}}).encode(),
    "object value": json.dumps({"data": {"configVersion": 1, "secrets": {"B": {}}}}).encode(),
    "duplicate secret": (
        '{"data": {"configVersion": 1, "secrets": {"A": "' + SECRET + '", "A": "2"}}}'
    ).encode(),
    "duplicate data": b'{"data": {"configVersion": 1, "secrets": {}}, "data": {}}',
    "truncated": ('{"data": {"configVersion": 1, "secrets": {"A": "' + SECRET).encode(),
    "not utf-8": b'{"data": {"configVersion": 1, "secrets": {"A": "\xff\xfe"}}}',
    "nan": b'{"data": {"configVersion": NaN, "secrets": {}}}',
    "lone surrogate": b'{"data": {"configVersion": 1, "secrets": {"A": "\\ud800"}}}',
    "bom": b'\xef\xbb\xbf{"data": {"configVersion": 1, "secrets": {}}}',
    "deep nesting": b"[" * 100_000 + b"]" * 100_000,
    "empty": b"",
}


@pytest.mark.parametrize("name", sorted(BAD_200_BODIES))
def test_200_that_is_not_the_documented_shape_is_undecodable(
    mock: responses.RequestsMock, make_client: Callable[..., HimitsuClient], name: str,
) -> None:
    mock.get(URL, body=BAD_200_BODIES[name], headers={"X-Himitsu-Config-Version": "1"})
    with pytest.raises(Undecodable) as caught:
        fetch(make_client())
    message = str(caught.value)
    assert "200" in message and NOT_HIMITSU in message
    assert SECRET not in message and "html" not in message
    assert caught.value.status == 200
    assert len(mock.calls) == 1  # one request


def test_content_encoded_body_is_not_read(
    mock: responses.RequestsMock, make_client: Callable[..., HimitsuClient],
) -> None:
    mock.get(URL, body=b"\x1f\x8b compressed", headers={"Content-Encoding": "gzip"})
    with pytest.raises(Undecodable, match=NOT_HIMITSU):
        fetch(make_client())


def test_other_2xx_is_undecodable(
    mock: responses.RequestsMock, make_client: Callable[..., HimitsuClient],
) -> None:
    mock.get(URL, status=204)
    with pytest.raises(Undecodable, match="204"):
        fetch(make_client())


@pytest.mark.parametrize("headers", [
    {"X-Himitsu-Config-Version": "5", "ETag": '"himi-config-5"'},
    {"ETag": '"himi-config-5"'},
    {"ETag": 'W/"himi-config-5"'},
])
def test_304_is_not_modified_never_an_empty_environment(
    mock: responses.RequestsMock, make_client: Callable[..., HimitsuClient],
    outcomes: list[str], headers: dict[str, str],
) -> None:
    mock.get(URL, status=304, headers=headers)
    result = fetch(make_client(), known=5)
    assert result == NotModified(version=5)
    assert not isinstance(result, Fetched)
    assert outcomes == ["304"]


@pytest.mark.parametrize(("known", "headers"), [
    (5, {}),
    (5, {"X-Himitsu-Config-Version": "x", "ETag": "himi-config-5"}),
    (5, {"X-Himitsu-Config-Version": "6"}),
    (None, {"X-Himitsu-Config-Version": "5"}),
    (0, {"X-Himitsu-Config-Version": "1"}),
])
def test_304_without_a_matching_version_is_undecodable(
    mock: responses.RequestsMock, make_client: Callable[..., HimitsuClient],
    known: int | None, headers: dict[str, str],
) -> None:
    mock.get(URL, status=304, headers=headers)
    with pytest.raises(Undecodable, match=f"304 but the {NOT_HIMITSU}"):
        fetch(make_client(), known=known)


# --- errors ----------------------------------------------------------------------


@pytest.mark.parametrize(("status", "code", "kind"), [
    (400, "INVALID_REQUEST", BadRequest),
    (400, "INVALID_INPUT", BadRequest),
    (401, "UNAUTHENTICATED", Unauthorized),
    (403, "FORBIDDEN", Forbidden),
    (403, "API_SCOPE_FORBIDDEN", Forbidden),
    (404, "NOT_FOUND", NotFound),
    (409, "CONFLICT", UnexpectedStatus),
    (429, "RATE_LIMITED", RateLimited),
    (500, "INTERNAL_ERROR", ServerError),
    (503, "UNAVAILABLE", ServerError),
])
def test_envelope_errors_are_typed_and_never_echo_the_message(
    mock: responses.RequestsMock, make_client: Callable[..., HimitsuClient],
    status: int, code: str, kind: type[himitsu.HimitsuError],
) -> None:
    mock.get(URL, status=status, json=envelope(code))
    with pytest.raises(kind) as caught:
        fetch(make_client())
    error = caught.value
    assert type(error) is kind
    assert (error.status, error.code, error.request_id) == (status, code, "req_123")
    assert str(error) == error.message
    assert str(status) in error.message and code in error.message and "req_123" in error.message
    assert ENVELOPE_TEXT not in error.message and ENVELOPE_TEXT not in repr(error)


def test_forbidden_messages_tell_scope_from_permission(
    mock: responses.RequestsMock, make_client: Callable[..., HimitsuClient],
) -> None:
    mock.get(URL, status=403, json=envelope("API_SCOPE_FORBIDDEN"))
    with pytest.raises(Forbidden, match="scope does not cover"):
        fetch(make_client())
    mock.replace(responses.GET, URL, status=403, json=envelope("FORBIDDEN"))
    with pytest.raises(Forbidden, match="creator no longer has permission"):
        fetch(make_client())


NON_ENVELOPES = {
    "html": f"<html><body>502 Bad Gateway {SECRET}</body></html>".encode(),
    "empty": b"",
    "other json": json.dumps({"message": SECRET}).encode(),
    "lowercase code": json.dumps({"error": {"code": "oops", "message": SECRET}}).encode(),
    "no message": json.dumps({"error": {"code": "NOT_FOUND"}}).encode(),
    "error string": json.dumps({"error": SECRET}).encode(),
}


@pytest.mark.parametrize("name", sorted(NON_ENVELOPES))
@pytest.mark.parametrize(("status", "kind"), [
    (400, BadRequest), (401, Unauthorized), (403, Forbidden), (404, NotFound),
    (418, UnexpectedStatus), (429, RateLimited), (500, ServerError), (502, ServerError),
])
def test_non_envelope_error_bodies_are_named_not_echoed(
    mock: responses.RequestsMock, make_client: Callable[..., HimitsuClient],
    name: str, status: int, kind: type[himitsu.HimitsuError],
) -> None:
    mock.get(URL, status=status, body=NON_ENVELOPES[name])
    with pytest.raises(kind) as caught:
        fetch(make_client())
    error = caught.value
    assert (error.status, error.code, error.request_id) == (status, None, None)
    assert str(status) in error.message and NOT_HIMITSU in error.message
    assert SECRET not in error.message and "Bad Gateway" not in error.message


def test_odd_request_id_is_dropped(
    mock: responses.RequestsMock, make_client: Callable[..., HimitsuClient],
) -> None:
    mock.get(URL, status=404, json=envelope("NOT_FOUND", request_id=f"<{SECRET}> x"))
    with pytest.raises(NotFound) as caught:
        fetch(make_client())
    assert caught.value.request_id is None and SECRET not in str(caught.value)


def _http_date(seconds_from_now: float) -> str:
    return email.utils.formatdate(time.time() + seconds_from_now, usegmt=True)


@pytest.mark.parametrize(("headers", "low", "high"), [
    ({"Retry-After": "12"}, 12, 12),
    ({"Retry-After": "12", "RateLimit-Reset": "40"}, 12, 12),
    ({"RateLimit-Reset": "40"}, 40, 40),
    ({"Retry-After": "2.5"}, 2.5, 2.5),
    ({}, 60, 60),
    ({"Retry-After": "soon", "RateLimit-Reset": "later"}, 60, 60),
    ({"Retry-After": "0"}, 1, 1),
    ({"Retry-After": "999999"}, 3600, 3600),
    ({"Retry-After": "HTTP-DATE+300"}, 200, 300),
])
def test_429_raises_at_once_with_its_delay(
    *, mock: responses.RequestsMock, make_client: Callable[..., HimitsuClient],
    outcomes: list[str], headers: dict[str, str], low: float, high: float,
) -> None:
    if headers.get("Retry-After") == "HTTP-DATE+300":  # built now, not at collection time
        headers = {"Retry-After": _http_date(300)}
    mock.get(URL, status=429, json=envelope("RATE_LIMITED"), headers=headers)
    with pytest.raises(RateLimited) as caught:
        fetch(make_client())
    assert low <= caught.value.retry_after <= high
    assert "retry in" in str(caught.value)
    assert len(mock.calls) == 1
    assert outcomes == ["429"]


# --- one request per fetch ---------------------------------------------------------


@pytest.mark.parametrize(("answer", "kind", "outcome"), [
    *[({"status": status, "json": envelope("SOMETHING")}, himitsu.HimitsuError,
       "429" if status == 429 else "4xx")
      for status in (400, 401, 403, 404, 405, 409, 410, 422, 429)],
    ({"status": 500, "json": envelope("INTERNAL_ERROR")}, ServerError, "5xx"),
    ({"status": 503, "json": envelope("UNAVAILABLE")}, ServerError, "5xx"),
    ({"body": requests.ConnectionError("refused")}, TransportError, "transport_error"),
])
def test_one_fetch_is_one_request_whatever_the_failure(
    *, mock: responses.RequestsMock, make_client: Callable[..., HimitsuClient],
    outcomes: list[str], answer: dict[str, Any], kind: type[himitsu.HimitsuError],
    outcome: str,
) -> None:
    """The reconcile's backoff owns the retries (issue 21 item 6): during an outage one
    attempt is one request, not three."""
    mock.get(URL, **answer)
    mock.get(URL, **runtime(3, {"A": "1"}))
    with pytest.raises(kind):
        fetch(make_client())
    assert len(mock.calls) == 1
    assert outcomes == [outcome]


def test_the_failure_gist_drops_only_the_request_id(
    mock: responses.RequestsMock, make_client: Callable[..., HimitsuClient],
) -> None:
    mock.get(URL, status=500, json=envelope("INTERNAL_ERROR", request_id="req-7"))
    with pytest.raises(ServerError) as caught:
        fetch(make_client())
    assert caught.value.request_id == "req-7" and "req-7" in caught.value.message
    assert caught.value.gist == caught.value.message.removesuffix(" (requestId req-7)")
    assert "req-7" not in caught.value.gist and caught.value.gist.startswith("Himitsu API")


def test_transport_failure_does_not_echo_the_library(
    mock: responses.RequestsMock, make_client: Callable[..., HimitsuClient], outcomes: list[str],
) -> None:
    mock.get(URL, body=requests.ConnectionError(f"boom {SECRET} {TOKEN}"))
    with pytest.raises(TransportError) as caught:
        fetch(make_client())
    assert "himitsu.test" in str(caught.value)
    assert SECRET not in str(caught.value) and TOKEN not in str(caught.value)
    assert caught.value.status is None
    assert outcomes == ["transport_error"]


def test_body_over_the_cap_is_a_transport_error(
    mock: responses.RequestsMock, make_client: Callable[..., HimitsuClient],
) -> None:
    body = json.dumps({"data": {"configVersion": 1, "secrets": {"A": SECRET * 200}}})
    mock.get(URL, body=body)
    with pytest.raises(TransportError, match="larger than 1024 bytes") as caught:
        fetch(make_client(max_response_bytes=1024))
    assert len(mock.calls) == 1
    assert SECRET not in str(caught.value)


def test_a_failing_observer_does_not_fail_the_fetch(
    mock: responses.RequestsMock, make_client: Callable[..., HimitsuClient],
) -> None:
    def broken(_outcome: str) -> None:
        raise RuntimeError("metrics down")

    mock.get(URL, **runtime(1, {}))
    assert fetch(make_client(observer=broken)) == Fetched(version=1, secrets={})


def test_outcome_labels_are_a_closed_set() -> None:
    assert set(himitsu.OUTCOMES) == {"200", "304", "4xx", "429", "5xx", "transport_error", "other"}


# --- no token, no secret value, anywhere -----------------------------------------------


class Hidden:
    """Carries the canary token without showing it in this test's own frame locals."""

    def __init__(self, value: str) -> None:
        self.value = value

    def __repr__(self) -> str:
        return "<hidden>"


def _fetch_error(client: HimitsuClient, token: Hidden, api_url: str, known: int | None) -> Any:
    try:
        client.fetch(api_url=api_url, project_id=PROJECT, environment_id=ENV,
                     token=token.value, known_version=known)
    except himitsu.HimitsuError as exc:
        return exc
    pytest.fail("expected a HimitsuError")


@pytest.fixture
def structlog_entries() -> Iterator[list[MutableMapping[str, Any]]]:
    previous = structlog.get_config()
    capture = LogCapture()
    structlog.configure(
        processors=[capture], wrapper_class=structlog.make_filtering_bound_logger(logging.DEBUG),
        cache_logger_on_first_use=False,
    )
    try:
        yield capture.entries
    finally:
        structlog.configure(**previous)


LEAKY = f"{SECRET} {TOKEN}"
SWEEP: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {
    # name: (responses.get kwargs, fetch/client overrides)
    "non-string value": ({"json": {"data": {"configVersion": 1, "secrets": {"A": SECRET, "B": 2}}}},
                         {}),
    "truncated json": ({"body": '{"data": {"configVersion": 1, "secrets": {"A": "' + SECRET}, {}),
    "duplicate key": ({"body": '{"data": {"configVersion": 1, "secrets": {"A": "' + SECRET
                       + '", "A": "x"}}}'}, {}),
    "401 envelope": ({"status": 401, "json": {"error": {"code": "UNAUTHENTICATED",
                                                         "message": LEAKY, "requestId": "r"}}}, {}),
    "403 html": ({"status": 403, "body": f"<html>{LEAKY}</html>"}, {}),
    "429": ({"status": 429, "json": {"error": {"code": "RATE_LIMITED", "message": LEAKY}},
             "headers": {"Retry-After": "3"}}, {}),
    "500 repeated": ({"status": 500, "body": LEAKY}, {}),
    "302": ({"status": 302, "headers": {"Location": f"http://x.test/{SECRET}"}}, {}),
    "connection error": ({"body": requests.ConnectionError(LEAKY)}, {}),
    "too large": (
        {"body": json.dumps({"data": {"configVersion": 1, "secrets": {"A": LEAKY * 99}}})},
        {"max_response_bytes": 1024},
    ),
    "304 mismatch": ({"status": 304, "headers": {"X-Himitsu-Config-Version": "9"}}, {"known": 4}),
    "invalid token": ({"json": {}}, {"token": TOKEN + "x"}),
}


@pytest.mark.parametrize("name", sorted(SWEEP))
def test_no_token_or_secret_in_errors_tracebacks_or_logs(
    mock: responses.RequestsMock, make_client: Callable[..., HimitsuClient],
    structlog_entries: list[MutableMapping[str, Any]], caplog: pytest.LogCaptureFixture, name: str,
) -> None:
    caplog.set_level(logging.DEBUG)
    response, overrides = SWEEP[name]
    mock.get(URL, **response)
    options = {k: v for k, v in overrides.items() if k == "max_response_bytes"}
    error = _fetch_error(
        make_client(**options), Hidden(overrides.get("token", TOKEN)),
        overrides.get("api_url", API), overrides.get("known"),
    )
    rendered = ExceptionDictTransformer(
        show_locals=True, use_rich=False, locals_max_string=10**7, locals_max_length=10**7,
    )((type(error), error, error.__traceback__))
    texts = [
        str(error), repr(error), repr(error.args), error.message,
        "".join(traceback.format_exception(error)),
        json.dumps(rendered, default=str),  # every frame's locals, as dict_tracebacks logs them
        json.dumps(structlog_entries, default=str), caplog.text,
    ]
    for text in texts:
        assert SECRET not in text
        assert "CANARYtoken" not in text
    assert error.__cause__ is None and error.__context__ is None
    if mock.calls:
        assert any(entry["event"] == "himitsu_attempt" for entry in structlog_entries)


def test_success_path_logs_nothing_secret(
    mock: responses.RequestsMock, make_client: Callable[..., HimitsuClient],
    structlog_entries: list[MutableMapping[str, Any]], caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    mock.get(URL, **runtime(2, {"A": SECRET}))
    result = fetch(make_client())
    assert isinstance(result, Fetched) and result.secrets["A"] == SECRET
    logged = json.dumps(structlog_entries, default=str) + caplog.text
    assert structlog_entries and SECRET not in logged and "CANARYtoken" not in logged


# --- source fingerprint ---------------------------------------------------------------


def test_source_fingerprint() -> None:
    base = himitsu.source_fingerprint(API, PROJECT, ENV, TOKEN)
    assert len(base) == 64 and int(base, 16) >= 0
    same = himitsu.source_fingerprint(API.upper() + "/", PROJECT.upper(), ENV, f" {TOKEN}\n")
    assert base == same
    others = {
        himitsu.source_fingerprint("http://other.test", PROJECT, ENV, TOKEN),
        himitsu.source_fingerprint(API, ENV, PROJECT, TOKEN),
        himitsu.source_fingerprint(API, PROJECT, PROJECT, TOKEN),
        himitsu.source_fingerprint(API, PROJECT, ENV, TOKEN[:-1] + "z"),
        himitsu.source_fingerprint(API + "/prefix", PROJECT, ENV, TOKEN),
    }
    assert base not in others and len(others) == 5
    assert TOKEN not in base and "CANARY" not in base


def test_public_names_exist() -> None:
    # The reconciler codes against these names: a rename must fail here first.
    missing = [name for name in himitsu.__all__ if not hasattr(himitsu, name)]
    assert missing == []
