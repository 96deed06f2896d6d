"""Tests for hack/himitsu_standin: the Himitsu stand-in must behave as the real API does.

The e2e tests, benchmarks and ``make demo`` trust this server's answers, so each rule of
spec/himitsu-api.md it imitates is proved here over real HTTP on 127.0.0.1 (port 0),
plus every fault kind, the counters and the HTTP control API. Rate-limit windows run on
an injected clock, never on sleeps.
"""

from __future__ import annotations

import http.client
import json
import os
import signal
import socket
import stat
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest

HACK = Path(__file__).resolve().parents[2] / "hack"
sys.path.insert(0, str(HACK))

from himitsu_standin import TOKEN_RE, StandIn, fingerprint, generate_token  # noqa: E402
from himitsu_standin.cli import main as cli_main  # noqa: E402
from himitsu_standin.control import handle_control  # noqa: E402
from himitsu_standin.core import Himitsu  # noqa: E402
from himitsu_standin.wire import Inbound, if_none_match_hits, is_loopback  # noqa: E402

SECRETS = {"API_KEY": "canary-k1", "DB_URL": "postgres://u:canary-pw@db/app"}


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@dataclass
class Reply:
    status: int
    headers: http.client.HTTPMessage
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


@dataclass
class World:
    standin: StandIn
    project: str
    env: str
    token: str


def call(standin: StandIn, method: str, path: str, *, headers: Mapping[str, str] | None = None,
         body: bytes | None = None, timeout: float = 5.0) -> Reply:
    conn = http.client.HTTPConnection("127.0.0.1", standin.port, timeout=timeout)
    try:
        conn.request(method, path, body=body, headers=dict(headers or {}))
        resp = conn.getresponse()
        return Reply(resp.status, resp.headers, resp.read())
    finally:
        conn.close()


def runtime(project: str, env: str) -> str:
    return f"/api/v1/projects/{project}/environments/{env}/secrets/runtime"


def fetch(world: World, *, token: str | None = None, env: str | None = None,
          project: str | None = None, **headers: str) -> Reply:
    sent = {"Authorization": f"Bearer {token or world.token}", **headers}
    return call(world.standin, "GET", runtime(project or world.project, env or world.env),
                headers=sent)


def control(standin: StandIn, method: str, path: str, payload: Any = None) -> Reply:
    body = None if payload is None else json.dumps(payload).encode()
    return call(standin, method, f"/_standin{path}", body=body)


def assert_envelope(reply: Reply, status: int, code: str) -> None:
    assert reply.status == status
    error = reply.json()["error"]
    assert error["code"] == code
    assert error["message"]
    uuid.UUID(error["requestId"])


@pytest.fixture
def standin() -> Iterator[StandIn]:
    with StandIn() as server:
        yield server


@pytest.fixture
def world(standin: StandIn) -> World:
    project, env = str(uuid.uuid4()), str(uuid.uuid4())
    token = standin.add_token(project=project, environment=env)
    standin.set_secrets(project, env, SECRETS)
    return World(standin, project, env, token)


# -- the runtime endpoint --------------------------------------------------------------------
def test_200_carries_every_secret_version_and_headers(world: World) -> None:
    reply = fetch(world)
    assert reply.status == 200
    assert reply.json() == {"data": {"configVersion": 2, "secrets": SECRETS}}
    assert reply.headers["ETag"] == '"himi-config-2"'
    assert reply.headers["X-Himitsu-Config-Version"] == "2"
    assert reply.headers["Content-Type"].startswith("application/json")
    assert reply.headers["Content-Length"] == str(len(reply.body))
    assert reply.headers["RateLimit-Policy"] == "120;w=60"
    assert reply.headers["RateLimit-Limit"] == "120"
    assert reply.headers["RateLimit-Remaining"] == "119"
    assert reply.headers["RateLimit-Reset"] == "60"


@pytest.mark.parametrize(("if_none_match", "status"), [
    ('"himi-config-2"', 304),
    ('"himi-config-1", "himi-config-2"', 304),
    ('"himi-config-1","himi-config-2"', 304),
    ('W/"himi-config-2"', 304),
    ("*", 304),
    ('"himi-config-1"', 200),
    ('"himi-config-3"', 200),
    ("himi-config-2", 200),
    ('"other-2"', 200),
    ('"himi-config-1", himi-config-2', 200),
])
def test_if_none_match_rules(world: World, if_none_match: str, status: int) -> None:
    reply = fetch(world, **{"If-None-Match": if_none_match})
    assert reply.status == status
    assert reply.headers["ETag"] == '"himi-config-2"'
    assert reply.headers["X-Himitsu-Config-Version"] == "2"
    assert reply.headers["RateLimit-Limit"] == "120"
    if status == 304:
        assert reply.body == b""
    else:
        assert reply.json()["data"]["secrets"] == SECRETS


def test_if_none_match_parser_directly() -> None:
    assert if_none_match_hits(' W/"himi-config-0" ', 0)
    assert not if_none_match_hits(None, 0)
    assert not if_none_match_hits("", 0)
    assert not if_none_match_hits('"himi-config-x"', 0)


def test_new_environment_is_version_0_and_never_304_for_positive_versions(
        standin: StandIn) -> None:
    project, env = str(uuid.uuid4()), str(uuid.uuid4())
    token = standin.add_token(project=project, environment=env)
    w = World(standin, project, env, token)
    reply = fetch(w, **{"If-None-Match": '"himi-config-1", W/"himi-config-2"'})
    assert reply.status == 200
    assert reply.json() == {"data": {"configVersion": 0, "secrets": {}}}
    assert reply.headers["ETag"] == '"himi-config-0"'


def test_non_uuid_ids_are_400(world: World) -> None:
    assert_envelope(fetch(world, project="not-a-uuid"), 400, "INVALID_REQUEST")
    assert_envelope(fetch(world, env=world.env[:-1]), 400, "INVALID_REQUEST")


def test_json_content_type_is_harmless_on_a_get_and_500_on_a_bodyless_post(world: World) -> None:
    reply = fetch(world, **{"Content-Type": "application/json"})
    assert reply.status == 200
    assert world.standin.requests()[-1].content_type_sent
    for method in ("POST", "DELETE"):
        reply = call(world.standin, method, runtime(world.project, world.env),
                     headers={"Authorization": f"Bearer {world.token}",
                              "Content-Type": "application/json"})
        assert_envelope(reply, 500, "INTERNAL_ERROR")


def test_unknown_route_and_method_get_the_frameworks_404_not_the_envelope(world: World) -> None:
    replies = [call(world.standin, "GET", "/api/v1/nope"),
               call(world.standin, "POST", runtime(world.project, world.env), body=b"{}",
                    headers={"Authorization": f"Bearer {world.token}"})]
    for reply in replies:
        assert reply.status == 404
        body = reply.json()
        assert "error" in body and not isinstance(body["error"], dict)
        assert body["statusCode"] == 404 and "message" in body


def test_http_server_errors_also_use_the_envelope(standin: StandIn) -> None:
    with socket.create_connection(("127.0.0.1", standin.port), timeout=5) as sock:
        sock.sendall(b"GET / extra HTTP/1.1\r\n")  # refused at the request line
        raw = b""
        while chunk := sock.recv(4096):
            raw += chunk
    head, _, body = raw.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 400")
    assert json.loads(body)["error"]["code"] == "INVALID_REQUEST"


# -- tokens and scopes ----------------------------------------------------------------------
@pytest.mark.parametrize("authorization", [
    None, "", "Bearer", "Basic dXNlcjpwYXNz", "Bearer himi_short",
    "Bearer " + generate_token(),  # well-formed but never registered
])
def test_bad_credentials_are_401(world: World, authorization: str | None) -> None:
    headers = {} if authorization is None else {"Authorization": authorization}
    reply = call(world.standin, "GET", runtime(world.project, world.env), headers=headers)
    assert_envelope(reply, 401, "UNAUTHENTICATED")
    assert "himi_" not in reply.body.decode()


def test_revoked_token_is_401(world: World) -> None:
    world.standin.revoke_token(world.token)
    assert_envelope(fetch(world), 401, "UNAUTHENTICATED")


def test_a_restored_token_reads_again_over_the_control_api(world: World) -> None:
    control(world.standin, "POST", "/tokens/revoke", {"token": world.token})
    assert_envelope(fetch(world), 401, "UNAUTHENTICATED")
    control(world.standin, "POST", "/tokens/restore", {"fingerprint": fingerprint(world.token)})
    assert fetch(world).status == 200


def test_the_request_log_is_followed_from_a_count_of_records_read(world: World) -> None:
    for _ in range(3):
        fetch(world)
    first = control(world.standin, "GET", "/requests").json()
    fetch(world)
    world.standin.revoke_token(world.token)
    fetch(world)
    after = control(world.standin, "GET", f"/requests?after={len(first)}").json()
    assert len(first) == 3
    assert [r["status"] for r in after] == [200, 401]
    assert control(world.standin, "GET", "/requests?after=5").json() == []


def test_a_follower_of_a_bounded_request_log_gets_what_is_left() -> None:
    himitsu = Himitsu(log_limit=2)
    for n in range(5):
        himitsu.serve_api(Inbound(method="GET", path=f"/nope/{n}", client_ip="127.0.0.1",
                                  token=None))
    assert himitsu.logged() == 5
    assert [r.path for r in himitsu.requests(after=1)] == ["/nope/3", "/nope/4"]
    assert [r.path for r in himitsu.requests(after=4)] == ["/nope/4"]


def test_token_format_is_checked_and_generated_tokens_conform(standin: StandIn) -> None:
    assert TOKEN_RE.match(standin.add_token())
    with pytest.raises(ValueError, match="format"):
        standin.add_token(token="himi_0123456789abcdef_tooshort")
    with pytest.raises(ValueError, match="project"):
        standin.add_token(environment=str(uuid.uuid4()))


def test_scope_mismatch_is_403_api_scope_forbidden(world: World) -> None:
    other_env = str(uuid.uuid4())
    world.standin.set_secrets(world.project, other_env, {"X": "1"})
    assert_envelope(fetch(world, env=other_env), 403, "API_SCOPE_FORBIDDEN")
    project_token = world.standin.add_token(project=world.project)
    assert fetch(world, token=project_token, env=other_env).status == 200
    foreign = world.standin.add_token(project=str(uuid.uuid4()))
    assert_envelope(fetch(world, token=foreign), 403, "API_SCOPE_FORBIDDEN")
    org = world.standin.add_token()
    assert fetch(world, token=org, env=other_env).json()["data"]["secrets"] == {"X": "1"}


def test_a_demoted_creators_key_still_reads(world: World) -> None:
    world.standin.set_demoted(fingerprint(world.token))
    assert fetch(world).status == 200


def test_unknown_environment_or_wrong_project_is_404(world: World) -> None:
    org = world.standin.add_token()
    assert_envelope(fetch(world, token=org, env=str(uuid.uuid4())), 404, "NOT_FOUND")
    assert_envelope(fetch(world, token=org, project=str(uuid.uuid4())), 404, "NOT_FOUND")


def test_deleted_environment_401_for_env_keys_404_for_others_then_restore(world: World) -> None:
    project_token = world.standin.add_token(project=world.project)
    org = world.standin.add_token()
    assert world.standin.delete_environment(world.project, world.env) == 4  # +1 per secret
    assert_envelope(fetch(world), 401, "UNAUTHENTICATED")
    assert_envelope(fetch(world, token=project_token), 404, "NOT_FOUND")
    assert_envelope(fetch(world, token=org), 404, "NOT_FOUND")
    assert world.standin.restore_environment(world.project, world.env) == 6
    reply = fetch(world, **{"If-None-Match": '"himi-config-2"'})
    assert reply.status == 200
    assert reply.headers["X-Himitsu-Config-Version"] == "6"


def test_config_version_counts_every_write(world: World) -> None:
    s = world.standin
    assert s.set_secrets(world.project, world.env, {"API_KEY": "canary-k1"}) == 3  # unchanged
    assert s.set_secrets(world.project, world.env, {"A": "", "b/c:d": "x"}) == 5
    assert s.delete_secret(world.project, world.env, "A") == 6
    with pytest.raises(KeyError):
        s.delete_secret(world.project, world.env, "A")
    for bad_key in ("", "HAS SPACE", "A=B", "CTRL\x01", "K" * 256):
        with pytest.raises(ValueError, match="keys"):
            s.set_secrets(world.project, world.env, {bad_key: "v"})
    with pytest.raises(ValueError, match="values"):
        s.set_secrets(world.project, world.env, {"BIG": "x" * 65537})
    assert s.config_version(world.project, world.env) == 6
    assert fetch(world).headers["ETag"] == '"himi-config-6"'


# -- rate limits ------------------------------------------------------------------------------
def test_per_key_limit_counts_304s_then_429_until_the_window_ends() -> None:
    clock = FakeClock()
    with StandIn(per_key_limit=3, clock=clock) as standin:
        project, env = str(uuid.uuid4()), str(uuid.uuid4())
        w = World(standin, project, env, standin.add_token(project=project, environment=env))
        assert fetch(w).status == 200
        clock.now += 10
        assert fetch(w, **{"If-None-Match": '"himi-config-0"'}).status == 304
        assert fetch(w).headers["RateLimit-Remaining"] == "0"
        limited = fetch(w)
        assert_envelope(limited, 429, "RATE_LIMITED")
        assert limited.headers["Retry-After"] == "50"
        assert limited.headers["RateLimit-Reset"] == "50"
        assert limited.headers["RateLimit-Policy"] == "3;w=50"  # seconds left, as Reset
        other = standin.add_token(project=project, environment=env)
        assert fetch(w, token=other).status == 200  # budgets are per key
        clock.now += 50
        fresh = fetch(w)
        assert fresh.status == 200
        assert fresh.headers["RateLimit-Remaining"] == "2"
        standin.reset_rate_limits()


def test_every_answer_counts_down_the_window_the_keys_first_request_opened() -> None:
    # spec/himitsu-api.md: RateLimit-Policy's w is the seconds left in the current window
    # (not its length), on every answer (304s and errors too), and a window opens at the
    # key's first request after the previous one expired, not on the clock's minute.
    clock = FakeClock()
    with StandIn(clock=clock) as standin:
        project, env = str(uuid.uuid4()), str(uuid.uuid4())
        w = World(standin, project, env, standin.add_token(project=project, environment=env))
        clock.now += 17.5  # no request yet: nothing has started
        assert fetch(w).headers["RateLimit-Policy"] == "120;w=60"
        clock.now += 25
        unchanged = fetch(w, **{"If-None-Match": '"himi-config-0"'})
        assert unchanged.status == 304
        assert (unchanged.headers["RateLimit-Policy"], unchanged.headers["RateLimit-Reset"],
                unchanged.headers["RateLimit-Remaining"]) == ("120;w=35", "35", "118")
        assert standin.key_window(w.token) == (35.0, 2)  # what a test may wait on
        clock.now += 10
        denied = fetch(w, env=str(uuid.uuid4()))  # out of the key's scope: still counted
        assert denied.status == 403
        assert (denied.headers["RateLimit-Policy"], denied.headers["RateLimit-Remaining"]) == (
            "120;w=25", "117")
        clock.now += 25 + 7  # the window ended 7 s ago: this request opens the next one
        fresh = fetch(w)
        assert (fresh.headers["RateLimit-Policy"], fresh.headers["RateLimit-Remaining"]) == (
            "120;w=60", "119")
        standin.reset_rate_limits()


def test_per_ip_limit_applies_before_auth() -> None:
    with StandIn(per_ip_limit=2, per_key_limit=100, clock=FakeClock()) as standin:
        w = World(standin, str(uuid.uuid4()), str(uuid.uuid4()), generate_token())
        assert fetch(w).status == 401
        assert fetch(w).headers["RateLimit-Policy"] == "2;w=60"
        limited = fetch(w)
        assert_envelope(limited, 429, "RATE_LIMITED")
        assert limited.headers["Retry-After"] == "60"
        standin.reset_rate_limits()
        assert fetch(w).status == 401


# -- faults -----------------------------------------------------------------------------------
def test_error_fault_for_k_requests_on_one_environment(world: World) -> None:
    other_env = str(uuid.uuid4())
    other = world.standin.add_token(project=world.project, environment=other_env)
    world.standin.fault("error", environment=world.env, status=503, count=2)
    assert_envelope(fetch(world), 503, "SERVICE_UNAVAILABLE")
    assert fetch(world, token=other, env=other_env).status == 200
    assert_envelope(fetch(world), 503, "SERVICE_UNAVAILABLE")
    assert fetch(world).status == 200
    assert [r.fault for r in world.standin.requests()] == ["error", None, "error", None]


def test_garbage_fault_is_not_an_envelope(world: World) -> None:
    world.standin.fault("garbage", count=1)
    reply = fetch(world)
    assert reply.status == 502
    assert reply.headers["Content-Type"] == "text/html"
    assert reply.body.startswith(b"<html>")
    world.standin.fault("garbage", status=500, body="oops", count=1)
    assert (fetch(world).status, fetch(world).status) == (500, 200)


def test_rate_limit_fault_until_cleared(world: World) -> None:
    fault_id = world.standin.fault("rate_limit", retry_after=7)
    for _ in range(3):
        reply = fetch(world)
        assert_envelope(reply, 429, "RATE_LIMITED")
        assert reply.headers["Retry-After"] == "7"
        assert reply.headers["RateLimit-Remaining"] == "0"
    world.standin.clear_faults(fault_id)
    assert fetch(world).status == 200
    with pytest.raises(KeyError):
        world.standin.clear_faults(fault_id)


def test_reset_fault_closes_without_an_answer(world: World) -> None:
    world.standin.fault("reset", count=1)
    with pytest.raises(ConnectionError):
        fetch(world)
    assert fetch(world).status == 200
    assert world.standin.stats()["by_status"] == {"reset": 1, "200": 1}
    assert world.standin.requests()[0].status is None


def test_huge_fault_is_a_valid_body_of_that_size(world: World) -> None:
    world.standin.fault("huge", size_mb=1.5, count=1)
    reply = fetch(world)
    assert reply.status == 200
    assert len(reply.body) > 1.5 * 1024 * 1024
    assert int(reply.headers["Content-Length"]) == len(reply.body)
    data = reply.json()["data"]
    assert data["configVersion"] == 2
    assert set(data["secrets"]) == {"HUGE"}


def test_wrong_shape_fault(world: World) -> None:
    world.standin.fault("wrong_shape", count=1)
    reply = fetch(world)
    assert reply.status == 200
    assert not isinstance(reply.json()["data"]["secrets"], dict)


@pytest.mark.timeout(30)  # a stop() that waited out the fault would blow this deadline
def test_delay_fault_outlasts_a_client_timeout_and_stop_cuts_it_short(world: World) -> None:
    world.standin.fault("delay", seconds=600)
    path = runtime(world.project, world.env)
    with socket.create_connection(("127.0.0.1", world.standin.port), timeout=0.2) as sock:
        sock.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\n"
                     f"Authorization: Bearer {world.token}\r\n\r\n".encode())
        with pytest.raises(TimeoutError):
            sock.recv(4096)
        assert world.standin.wait_for_requests(1)
        assert world.standin.requests()[0].fault == "delay"
        world.standin.stop()
        sock.settimeout(10)
        assert sock.recv(4096) == b""  # closed, never answered


@pytest.mark.timeout(30)
def test_trickle_fault_sends_the_body_in_pieces_and_stop_cuts_it_short(world: World) -> None:
    world.standin.fault("trickle", bytes_per_second=2)
    conn = http.client.HTTPConnection("127.0.0.1", world.standin.port, timeout=10)
    try:
        conn.request("GET", runtime(world.project, world.env),
                     headers={"Authorization": f"Bearer {world.token}"})
        resp = conn.getresponse()  # headers are not held back
        first = resp.read1(1 << 16)
        assert 0 < len(first) < int(resp.headers["Content-Length"])
        world.standin.stop()
        with pytest.raises(http.client.IncompleteRead):
            resp.read()
    finally:
        conn.close()


def test_trickled_body_arrives_intact_with_a_delayed_error(world: World) -> None:
    world.standin.fault("trickle", bytes_per_second=400, count=1)
    world.standin.fault("delay", seconds=0.01, count=1)
    world.standin.fault("error", status=500, code="BOOM", count=1)
    assert_envelope(fetch(world), 500, "BOOM")
    assert world.standin.requests()[-1].fault == "trickle,delay,error"
    assert fetch(world).json()["data"]["secrets"] == SECRETS


def test_invalid_faults_are_refused(standin: StandIn) -> None:
    for kind, options in [("nope", {}), ("trickle", {}), ("huge", {}), ("delay", {}),
                          ("error", {"status": 200}), ("error", {"count": 0})]:
        with pytest.raises(ValueError):
            standin.fault(kind, **options)  # type: ignore[arg-type]


# -- counters and the request log -----------------------------------------------------------
def test_counters_and_log_identify_tokens_by_fingerprint_only(world: World) -> None:
    other = world.standin.add_token()
    fetch(world, **{"User-Agent": "himitsu-operator/test"})
    fetch(world, **{"If-None-Match": '"himi-config-2"'})
    fetch(world, token=other, env=str(uuid.uuid4()))
    call(world.standin, "GET", "/api/v1/elsewhere")
    stats = world.standin.stats()
    assert stats["total"] == 4
    assert stats["by_status"] == {"200": 1, "304": 1, "404": 2}
    assert stats["by_environment"][world.env] == 2
    assert stats["by_environment"]["-"] == 1
    assert stats["by_token"] == {fingerprint(world.token): 2, fingerprint(other): 1, "-": 1}
    first, second = world.standin.requests(environment=world.env)
    assert first.user_agent == "himitsu-operator/test"
    assert (first.method, first.status, first.if_none_match) == ("GET", 200, None)
    assert second.if_none_match == '"himi-config-2"'
    assert not first.content_type_sent
    assert first.path == runtime(world.project, world.env)
    dumped = json.dumps([stats, [r.__dict__ for r in world.standin.requests()]])
    assert world.token not in dumped and other not in dumped and "canary" not in dumped
    assert len(world.standin.requests(limit=1)) == 1
    world.standin.reset_stats()
    assert world.standin.stats()["total"] == 0
    assert world.standin.requests() == []


def test_wait_for_requests_wakes_on_a_matching_request(world: World) -> None:
    assert not world.standin.wait_for_requests(1, timeout=0.01)
    threading.Thread(target=fetch, args=(world,), daemon=True).start()
    assert world.standin.wait_for_requests(1, environment=world.env, status=200, timeout=15)
    assert not world.standin.wait_for_requests(1, status=304, timeout=0.01)


# -- HTTP plumbing ----------------------------------------------------------------------------
def test_keep_alive_survives_200_and_304(world: World) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", world.standin.port, timeout=5)
    auth = {"Authorization": f"Bearer {world.token}"}
    try:
        statuses = []
        for extra in ({}, {"If-None-Match": '"himi-config-2"'}, {}):
            conn.request("GET", runtime(world.project, world.env), headers={**auth, **extra})
            resp = conn.getresponse()
            resp.read()
            statuses.append(resp.status)
            if len(statuses) == 1:
                sock = conn.sock
            assert sock is not None and conn.sock is sock  # one connection, never reopened
        assert statuses == [200, 304, 200]
    finally:
        conn.close()


def test_binding_off_loopback_needs_an_explicit_flag() -> None:
    with pytest.raises(ValueError, match="loopback"):
        StandIn("0.0.0.0")  # noqa: S104 (proving it is refused)
    assert all(map(is_loopback, ["127.0.0.1", "127.9.9.9", "::1", "localhost",
                                  "::ffff:127.0.0.1"]))
    assert not any(map(is_loopback, ["0.0.0.0", "10.1.2.3", "::", "example.com"]))  # noqa: S104


def test_control_api_refuses_remote_clients_but_answers_their_health_probe(
        standin: StandIn) -> None:
    def ask(path: str, allow: bool) -> int:
        return handle_control(standin, method="GET", path=f"/_standin/{path}", query="",
                              body=b"", client_ip="10.0.0.5", allow_remote=allow).status
    assert (ask("stats", False), ask("stats", True)) == (403, 200)
    assert ask("health", False) == 200


def test_control_api_drives_everything_over_http(standin: StandIn) -> None:
    assert control(standin, "GET", "/health").json() == {"ok": True}
    info = control(standin, "POST", "/environments", {}).json()
    project, env = info["project"], info["environment"]
    assert info["configVersion"] == 0
    base = f"/projects/{project}/environments/{env}"
    info = control(standin, "PUT", f"{base}/secrets", {"A": "1", "path/to:key": "2"}).json()
    assert (info["configVersion"], info["keys"]) == (2, ["A", "path/to:key"])
    info = control(standin, "DELETE", f"{base}/secrets/{quote('path/to:key', safe='')}").json()
    assert (info["configVersion"], info["keys"]) == (3, ["A"])
    minted = control(standin, "POST", "/tokens", {"project": project, "environment": env})
    token = minted.json()["token"]
    assert minted.json()["fingerprint"] == fingerprint(token)
    w = World(standin, project, env, token)
    assert fetch(w).json()["data"] == {"configVersion": 3, "secrets": {"A": "1"}}

    fault = control(standin, "POST", "/faults", {"kind": "error", "status": 503}).json()["id"]
    assert fetch(w).status == 503
    assert control(standin, "DELETE", f"/faults/{fault}").status == 200
    control(standin, "POST", "/faults", {"kind": "garbage"})
    assert control(standin, "DELETE", "/faults").status == 200
    assert fetch(w).status == 200

    assert control(standin, "DELETE", base).json()["deleted"] is True
    assert fetch(w).status == 401
    assert control(standin, "POST", f"{base}/restore").json()["configVersion"] == 5
    control(standin, "POST", "/tokens/demote", {"token": token})
    assert fetch(w).status == 200  # a demoted creator's key still reads
    control(standin, "POST", "/tokens/demote", {"fingerprint": fingerprint(token),
                                                "demoted": False})
    control(standin, "POST", "/tokens/revoke", {"fingerprint": fingerprint(token)})
    assert fetch(w).status == 401

    assert control(standin, "POST", "/wait", {"count": 6, "timeout": 5}).json()["ok"] is True
    stats = control(standin, "GET", "/stats").json()
    assert stats["by_status"] == {"200": 3, "503": 1, "401": 2}
    log = control(standin, "GET", f"/requests?environment={env}&limit=2").json()
    assert [r["status"] for r in log] == [200, 401]
    assert control(standin, "DELETE", "/stats").status == 200
    assert control(standin, "GET", "/requests").json() == []
    assert control(standin, "DELETE", "/rate-limits").status == 200
    assert standin.stats()["total"] == 0  # control requests are never logged


def test_control_api_errors(standin: StandIn) -> None:
    assert_envelope(control(standin, "GET", "/nope"), 404, "NOT_FOUND")
    assert_envelope(control(standin, "POST", "/faults", {"kind": "nope"}), 400, "INVALID_INPUT")
    assert_envelope(control(standin, "POST", "/faults", {"kind": "error", "x": 1}), 400,
                    "INVALID_INPUT")
    assert_envelope(control(standin, "POST", "/tokens/revoke", {"token": generate_token()}),
                    404, "NOT_FOUND")
    assert_envelope(control(standin, "PUT", f"/projects/{uuid.uuid4()}/environments/x/secrets",
                            {"A": "1"}), 400, "INVALID_INPUT")
    assert_envelope(call(standin, "POST", "/_standin/tokens", body=b"{not json"), 400,
                    "INVALID_INPUT")
    missing = f"/projects/{uuid.uuid4()}/environments/{uuid.uuid4()}"
    assert_envelope(control(standin, "GET", missing), 404, "NOT_FOUND")


# -- command line -----------------------------------------------------------------------------
def test_cli_help_and_token(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        cli_main(["serve", "--help"])
    assert exited.value.code == 0
    out = capsys.readouterr().out
    for option in ("--host", "--port", "--seed-file", "--port-file", "--allow-remote",
                   "--tokens-out", "--per-key-limit", "--window"):
        assert option in out
    assert cli_main(["token"]) == 0
    assert TOKEN_RE.match(capsys.readouterr().out.strip())
    assert cli_main(["serve", "--host", "0.0.0.0", "--port", "0"]) == 2  # noqa: S104
    assert "loopback" in capsys.readouterr().err


def test_cli_serves_a_seed_and_stops_on_sigterm(tmp_path: Path) -> None:
    project, env = str(uuid.uuid4()), str(uuid.uuid4())
    given = generate_token()
    seed = {"environments": [{"project": project, "environment": env, "secrets": SECRETS}],
            "tokens": [{"name": "given", "token": given, "project": project,
                        "environment": env},
                       {"name": "generated"}]}
    (tmp_path / "seed.json").write_text(json.dumps(seed))
    proc = subprocess.Popen(
        [sys.executable, str(HACK / "himitsu_standin"), "serve", "--port", "0",
         "--port-file", str(tmp_path / "port"), "--seed-file", str(tmp_path / "seed.json"),
         "--tokens-out", str(tmp_path / "tokens.json")],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**os.environ})
    try:
        assert proc.stdout is not None
        printed = ""
        while "serving" not in (line := proc.stdout.readline()):  # printed once it serves
            assert line, proc.communicate()  # EOF: it exited instead
            printed += line
        port = int((tmp_path / "port").read_text())
        tokens = json.loads((tmp_path / "tokens.json").read_text())
        assert tokens["given"] == given and TOKEN_RE.match(tokens["generated"])
        assert stat.S_IMODE((tmp_path / "tokens.json").stat().st_mode) == 0o600
        for token in tokens.values():
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
            conn.request("GET", runtime(project, env), headers={"Authorization": f"Bearer {token}"})
            resp = conn.getresponse()
            assert (resp.status, json.loads(resp.read())["data"]["secrets"]) == (200, SECRETS)
            conn.close()
    finally:
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=20)
    assert proc.returncode == 0, err
    assert f"serving http://127.0.0.1:{port}" in line
    printed += line + out + err
    assert given not in printed and tokens["generated"] not in printed
    assert fingerprint(given) in printed
