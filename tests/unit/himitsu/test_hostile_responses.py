"""Hostile Himitsu responses, from a real socket through to the HimitsuSecret's status.

test_himitsu_client.py and test_himitsu_http.py prove the client's typed errors one by
one. This file proves the end-to-end promise on top: whatever a server (or a proxy, or
a broken network) sends, the real ``HimitsuClient`` behind the real ``SharedPoller``
behind the real reconciler ends in Ready=False FetchFailure with a message of our own,
the target Secret keeps exactly what it held, and the controller's worker threads
survive it all. Each answer comes from a small http.server on 127.0.0.1 (port 0, its
own, stopped by its fixture): wrong types, missing fields, non-UTF-8, duplicate keys,
100 MB bodies (declared and chunked), a trickle, a truncated body, garbage instead of
HTTP, a proxy's HTML page; and hypothesis sends arbitrary bytes and near-miss JSON.

Bounds are asserted without a stopwatch: the error type says which bound tripped (the
deadline, the size cap), and the server counts the bytes it managed to send, so a client
that read a 100 MB body to the end would fail the test.
"""

from __future__ import annotations

import itertools
import json
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from reconcile_world import ENV, KEY, PROJECT, TOKEN, World, values

from himitsu_controller import himitsu
from himitsu_controller.runtime.controller import Controller
from himitsu_controller.sync.polling.polls import SharedPoller

CAP = 256 * 1024
HUNDRED_MB = 100 * 1024 * 1024
DEADLINE = 1.0
CANARY = "HOSTILE-BODY-CANARY"
PATH = f"/api/v1/projects/{PROJECT}/environments/{ENV}/secrets/runtime"

Behaviour = Callable[["Reply"], None]


# --- the server ----------------------------------------------------------------------------


class Reply:
    """One request's answer channel: raw bytes out, counted, stopping at a broken pipe."""

    def __init__(self, handler: BaseHTTPRequestHandler, server: HostileServer) -> None:
        self.handler = handler
        self.server = server
        self.broken = False

    def write(self, data: bytes) -> bool:
        if self.broken or self.server.stopping.is_set():
            return False
        try:
            self.handler.wfile.write(data)
            self.handler.wfile.flush()
        except OSError:
            self.broken = True
            return False
        with self.server.lock:
            self.server.sent += len(data)
        return True

    def head(self, status: int, headers: dict[str, str]) -> None:
        lines = [f"HTTP/1.1 {status} X\r\n"] + [f"{k}: {v}\r\n" for k, v in headers.items()]
        self.write(("".join(lines) + "\r\n").encode("latin-1"))

    def whole(self, status: int, body: bytes, **headers: str) -> None:
        self.head(status, {"Content-Length": str(len(body)), "Connection": "close",
                           "Content-Type": "application/json", **headers})
        self.write(body)


@dataclass
class HostileServer:
    url: str = ""
    behaviour: Behaviour = field(default=lambda reply: reply.whole(500, b""))
    requests: int = 0
    sent: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)
    stopping: threading.Event = field(default_factory=threading.Event)

    def reset(self, behaviour: Behaviour) -> None:
        with self.lock:
            self.behaviour, self.requests, self.sent = behaviour, 0, 0


@pytest.fixture(scope="module")
def server() -> Iterator[HostileServer]:
    state = HostileServer()

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        timeout = 10

        def do_GET(self) -> None:
            with state.lock:
                state.requests += 1
                behaviour = state.behaviour
            assert self.path == PATH
            behaviour(Reply(self, state))
            self.close_connection = True

        def log_message(self, *args: Any) -> None:
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    httpd.daemon_threads = True
    httpd.handle_error = lambda *args: None  # type: ignore[method-assign]
    state.url = f"http://127.0.0.1:{httpd.server_address[1]}"
    thread = threading.Thread(target=httpd.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        yield state
    finally:
        state.stopping.set()
        httpd.shutdown()
        httpd.server_close()
        thread.join(timeout=10)


@pytest.fixture(autouse=True)
def no_proxies(monkeypatch: pytest.MonkeyPatch) -> None:
    # Loopback only: a proxy in the developer's environment must not reroute the client.
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy",
                 "all_proxy"):
        monkeypatch.delenv(name, raising=False)


# --- behaviours ------------------------------------------------------------------------------


def runtime_body(version: int, secrets: Any) -> bytes:
    return json.dumps({"data": {"configVersion": version, "secrets": secrets}}).encode()


def answer(body: bytes, status: int = 200, headers: dict[str, str] | None = None) -> Behaviour:
    return lambda reply: reply.whole(status, body, **(headers or {}))


def huge_declared(reply: Reply) -> None:
    reply.head(200, {"Content-Length": str(HUNDRED_MB), "Content-Type": "application/json"})
    chunk = b'{"data": {"secrets": {"A": "' + b"x" * (64 * 1024)
    for _ in range(HUNDRED_MB // len(chunk)):
        if not reply.write(chunk):
            return


def huge_chunked(reply: Reply) -> None:
    reply.head(200, {"Transfer-Encoding": "chunked", "Content-Type": "application/json"})
    data = b"x" * (64 * 1024)
    frame = f"{len(data):x}\r\n".encode() + data + b"\r\n"
    for _ in range(HUNDRED_MB // len(data)):
        if not reply.write(frame):
            return
    reply.write(b"0\r\n\r\n")


def trickle(reply: Reply) -> None:
    reply.head(200, {"Content-Length": "100000", "Content-Type": "application/json"})
    reply.write(b'{"data": {"configVersion": 9, "secrets": {"A": "' + CANARY.encode())
    while reply.write(b"x"):
        reply.server.stopping.wait(0.05)  # the server's pacing, not a test wait


def truncated(reply: Reply) -> None:
    reply.head(200, {"Content-Length": "500", "Content-Type": "application/json"})
    reply.write(b'{"data": {"configVersion": 9, "secrets": {"A": "' + CANARY.encode())


def garbage(reply: Reply) -> None:
    reply.write(b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + CANARY.encode() + b"\r\n\r\n")


PROXY_HTML = (b"<html><head><title>502 Bad Gateway</title></head><body><h1>Bad Gateway</h1>"
              b"<p>" + CANARY.encode() + b" upstream reset</p></body></html>")

# name, behaviour, client error type, words in the status message
CASES: list[tuple[str, Behaviour, type[himitsu.HimitsuError], str]] = [
    ("version is a string", answer(runtime_body(9, {"A": CANARY}).replace(b"9", b'"9"', 1)),
     himitsu.Undecodable, "configVersion is not a non-negative integer"),
    ("version is a bool", answer(b'{"data": {"configVersion": true, "secrets": {}}}'),
     himitsu.Undecodable, "configVersion"),
    ("version is negative", answer(runtime_body(-1, {})), himitsu.Undecodable, "configVersion"),
    ("version has 5000 digits",
     answer(b'{"data": {"configVersion": ' + b"9" * 5000 + b', "secrets": {}}}'),
     himitsu.Undecodable, "not JSON"),
    ("version is NaN", answer(b'{"data": {"configVersion": NaN, "secrets": {}}}'),
     himitsu.Undecodable, "not JSON"),
    ("secret value is a number", answer(runtime_body(9, {"A": 1})),
     himitsu.Undecodable, "not a string"),
    ("secret value is null", answer(runtime_body(9, {"A": None})),
     himitsu.Undecodable, "not a string"),
    ("secret value is an object", answer(runtime_body(9, {"A": {"v": CANARY}})),
     himitsu.Undecodable, "not a string"),
    ("secrets is a list", answer(runtime_body(9, [CANARY])),
     himitsu.Undecodable, "secrets is not an object"),
    ("no secrets", answer(b'{"data": {"configVersion": 9}}'), himitsu.Undecodable, "secrets"),
    ("no data", answer(b'{"secrets": {"A": "x"}, "configVersion": 9}'),
     himitsu.Undecodable, "no data object"),
    ("empty object", answer(b"{}"), himitsu.Undecodable, "no data object"),
    ("a list", answer(b"[]"), himitsu.Undecodable, "no data object"),
    ("null", answer(b"null"), himitsu.Undecodable, "no data object"),
    ("empty body", answer(b""), himitsu.Undecodable, "not JSON"),
    ("not UTF-8", answer(b'{"data": {"configVersion": 9, "secrets": {"A": "\xff\xfe"}}}'),
     himitsu.Undecodable, "not UTF-8"),
    ("UTF-16", answer(runtime_body(9, {"A": "x"}).decode().encode("utf-16")),
     himitsu.Undecodable, "not UTF-8"),
    ("lone surrogate", answer(b'{"data": {"configVersion": 9, "secrets": {"A": "\\ud800"}}}'),
     himitsu.Undecodable, "not valid UTF-8"),
    ("duplicate secret", answer(
        b'{"data": {"configVersion": 9, "secrets": {"A": "1", "A": "' + CANARY.encode()
        + b'"}}}'), himitsu.Undecodable, "duplicate JSON keys"),
    ("duplicate version", answer(
        b'{"data": {"configVersion": 9, "configVersion": 10, "secrets": {}}}'),
     himitsu.Undecodable, "duplicate JSON keys"),
    ("nested 100000 deep", answer(b"[" * 100_000 + b"]" * 100_000),
     himitsu.Undecodable, "not JSON"),
    ("gzip we did not ask for", answer(b"\x1f\x8b\x08\x00" + CANARY.encode(),
                                       200, {"Content-Encoding": "gzip"}),
     himitsu.Undecodable, "encoded body"),
    ("HTML from a proxy, 200", answer(PROXY_HTML, 200, {"Content-Type": "text/html"}),
     himitsu.Undecodable, "not a Himitsu API response"),
    ("HTML from a proxy, 502", answer(PROXY_HTML, 502, {"Content-Type": "text/html"}),
     himitsu.ServerError, "answered 502, but the response was not a Himitsu API response"),
    ("proxy wants credentials", answer(PROXY_HTML, 407), himitsu.UnexpectedStatus, "407"),
    ("a 206", answer(runtime_body(9, {"A": CANARY}), 206), himitsu.Undecodable, "206"),
    ("a redirect away", answer(b"", 302, {"Location": "http://evil.test/steal"}),
     himitsu.UnexpectedStatus, "redirect not followed"),
    ("100 MB declared", huge_declared, himitsu.TransportError, f"larger than {CAP} bytes"),
    ("100 MB chunked", huge_chunked, himitsu.TransportError, f"larger than {CAP} bytes"),
    ("slow trickle", trickle, himitsu.TransportError, "deadline"),
    ("truncated body", truncated, himitsu.TransportError, "before it was complete"),
    ("garbage instead of HTTP", garbage, himitsu.TransportError, "did not answer with HTTP"),
]
IDS = [c[0] for c in CASES]


# --- the pieces under test ------------------------------------------------------------------


def make_client() -> himitsu.HimitsuClient:
    # Small bounds so a hostile answer trips them quickly.
    return himitsu.HimitsuClient(deadline=DEADLINE, read_timeout=DEADLINE,
                                 max_response_bytes=CAP)


def synced_world(url: str, client: himitsu.HimitsuClient) -> World:
    """A HimitsuSecret whose target holds version 5, now fetching through ``client``."""
    world = World(apiUrl=url, insecure_http=True)  # a loopback server: plain http
    world.sync(5, values(3))
    world.fetcher = SharedPoller(client)  # type: ignore[assignment]
    world.restart()
    world.clock.advance(61)  # past the next poll: a restarted reconciler would wait for it
    return world


def assert_untouched_failure(world: World, before: dict[str, Any], writes: int) -> str:
    ready = world.ready()
    assert (ready["status"], ready["reason"]) == ("False", "FetchFailure"), ready
    assert world.target() == before
    assert world.kube.writes() == writes
    assert world.data() == values(3)
    message = str(ready["message"])
    assert CANARY not in message and "<html" not in message.lower()
    assert all(CANARY not in e.message for e in world.kube.events)
    assert len(message.encode()) <= 1024
    return message


# --- each hostile answer: the client's type, then the reconciler's outcome -----------------------


@pytest.mark.timeout(60)
@pytest.mark.parametrize(("behaviour", "error", "words"), [c[1:] for c in CASES], ids=IDS)
def test_hostile_answer_is_a_typed_error(
    server: HostileServer, behaviour: Behaviour, error: type[himitsu.HimitsuError], words: str,
) -> None:
    server.reset(behaviour)
    with make_client() as client, pytest.raises(error) as caught:
        client.fetch(api_url=server.url, project_id=PROJECT, environment_id=ENV, token=TOKEN,
                     known_version=None)
    assert type(caught.value) is error  # the exact type: the reconciler branches on it
    assert words in str(caught.value)
    assert CANARY not in str(caught.value)
    if behaviour in (huge_declared, huge_chunked):
        # The client stopped reading near the cap: far less than the 100 MB the server
        # wanted to send got out (socket buffers hold a few MB at most), in one request.
        assert server.sent < HUNDRED_MB // 4, server.sent
        assert server.requests == 1


@pytest.mark.timeout(60)
@pytest.mark.parametrize(("behaviour", "error", "words"), [c[1:] for c in CASES], ids=IDS)
def test_hostile_answer_is_a_fetch_failure_that_leaves_the_target_alone(
    server: HostileServer, behaviour: Behaviour, error: type[himitsu.HimitsuError], words: str,
) -> None:
    with make_client() as client:
        world = synced_world(server.url, client)
        before, writes = world.target(), world.kube.writes()
        server.reset(behaviour)
        result = world.reconciler.reconcile(KEY)
    assert server.requests >= 1  # the answer really came over the socket
    assert result.error == "FetchFailure"
    assert result.requeue_after is not None and result.requeue_after >= 1.0
    message = assert_untouched_failure(world, before, writes)
    assert words in message


# --- arbitrary answers ---------------------------------------------------------------------------

secret_keys = st.text(min_size=1, max_size=8)
near_miss_bodies = st.fixed_dictionaries({
    "data": st.fixed_dictionaries({
        "configVersion": st.integers(-3, 2**70) | st.booleans() | st.floats() | st.text(
            max_size=3) | st.none(),
        "secrets": st.dictionaries(secret_keys, st.text(max_size=8) | st.integers() | st.none(),
                                   max_size=3) | st.lists(st.text(max_size=3), max_size=2),
    }),
}).map(lambda d: json.dumps(d).encode())
mangled_bodies = st.tuples(st.integers(0, 60), st.binary(min_size=1, max_size=4)).map(
    lambda cut: runtime_body(9, {"A": "x"})[:cut[0]] + cut[1])
bodies = st.binary(max_size=300) | near_miss_bodies | mangled_bodies


@pytest.mark.timeout(120)
@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(body=bodies, status=st.sampled_from([200, 200, 200, 203, 500, 418]))
@example(body=b'{"data": {"configVersion": 1, "secrets": {"A": "\\udfff"}}}', status=200)
@example(body=runtime_body(2**64, {"A": "x"}), status=200)
def test_any_answer_either_syncs_exactly_or_leaves_the_target_alone(
    server: HostileServer, body: bytes, status: int,
) -> None:
    server.reset(answer(body, status))
    with make_client() as client:
        world = synced_world(server.url, client)
        before, writes = world.target(), world.kube.writes()
        result = world.reconciler.reconcile(KEY)
    reason = world.ready()["reason"]
    message = str(world.ready()["message"])
    assert len(message.encode()) <= 1024
    if reason == "Synced":
        # Only a well-formed body syncs, and then the target holds exactly its secrets.
        payload = json.loads(body)
        assert status == 200 and result.error is None
        assert world.data() == payload["data"]["secrets"]
        return
    # Keys that cannot be Secret data keys are the spec's problem (use Dotenv or Json).
    assert reason in ("FetchFailure", "InvalidSpec"), message
    assert world.target() == before
    assert world.kube.writes() == writes


# --- inside the controller: workers survive a stream of hostile answers ---------------------------


@pytest.mark.timeout(120)
def test_controller_workers_survive_hostile_answers(server: HostileServer) -> None:
    server.reset(answer(runtime_body(5, values(3))))
    finished = threading.Condition()
    seen: list[tuple[str, str]] = []  # (behaviour name at the start, reason at the end)
    current = ["good"]
    with make_client() as client:
        world = World(apiUrl=server.url, insecure_http=True)
        # A poller whose clock leaps an hour per reading, and a reconciler an hour on
        # at every run: its poll is due and the shared answer too old, so every
        # reconcile asks the server (no annotation edits needed, which would race with
        # the workers reading the object).
        ticks = itertools.count(step=3600)
        world.fetcher = SharedPoller(client, clock=lambda: float(next(ticks)))  # type: ignore[assignment]
        reconciler = world.restart()

        def reconcile(key: str) -> Any:
            name = current[0]
            try:
                return reconciler.reconcile(key)
            finally:
                with finished:
                    seen.append((name, str(world.ready().get("reason", ""))))
                    finished.notify_all()

        def run(name: str, behaviour: Behaviour) -> str:
            with finished:
                server.reset(behaviour)  # first: a reconcile that sees the name sees this
                current[0] = name
                world.clock.advance(3600)
            controller.enqueue(KEY)
            with finished:
                assert finished.wait_for(lambda: any(n == name for n, _ in seen), timeout=30), \
                    f"no reconcile ran for {name}"
                return next(r for n, r in seen if n == name)

        controller = Controller("hostile-answers", reconcile, workers=2)
        controller.start()
        try:
            assert run("good", answer(runtime_body(5, values(3)))) == "Synced"
            before, writes = world.target(), world.kube.writes()
            for name, behaviour, _, _ in CASES:
                assert run(name, behaviour) == "FetchFailure", name
                assert controller.workers_alive(), name
            assert world.target() == before and world.kube.writes() == writes
            assert world.data() == values(3)
        finally:
            assert controller.stop(drain_timeout=30)
    assert all(r in ("Synced", "FetchFailure") for _, r in seen), seen
