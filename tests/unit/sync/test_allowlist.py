"""Tests for allowlist.py: where a token may go, and that the URL matched is the URL requested.

The example tests pin the rules (boundaries, normalisation, plain http, the token
Secret's annotation). The properties are the point: over generated apiUrls full of
what walks out of a prefix (``..``, ``%2e%2e``, ``//``, ``\\``, ``;``, case, default
ports, trailing slashes), whatever the allow-list accepts is requested, by the real
HimitsuClient through requests and urllib3, under that prefix, with nothing left that a
server would decode or resolve. One property watches the request line a loopback server
receives; the other the URL requests prepares, for https hosts a loopback server cannot
be. (That a refused apiUrl costs no token read and no request is tested through the
reconciler in test_reconciler.py.)
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, ClassVar
from urllib.parse import unquote, urlsplit

import pytest
import requests
import responses
from hypothesis import HealthCheck, event, example, given, settings
from hypothesis import strategies as st
from urllib3.util import parse_url

from himitsu_controller import api, himitsu
from himitsu_controller.sync.allowlist import (
    AllowList,
    InvalidPrefix,
    NotAllowed,
    check_token_binding,
)

TOKEN = "himi_0123456789abcdef_" + "CANARYtokenCANARYtokenCANARYtokenCANARY_-xy"
PROJECT = "0b6f8a52-1c3e-4d5f-9a7b-2c4d6e8f0a1b"
ENV = "5d2e1f3a-7b8c-4d9e-8f0a-1b2c3d4e5f60"
API_PATH = f"/api/v1/projects/{PROJECT}/environments/{ENV}/secrets/runtime"
BODY = json.dumps({"data": {"configVersion": 1, "secrets": {}}}).encode()


# --- the rules, by example -----------------------------------------------------------------


@pytest.mark.parametrize(("url", "allowed"), [
    ("https://himitsu.example.com", ("https://himitsu.example.com",)),
    ("https://himitsu.example.com/v2", ("https://himitsu.example.com/",)),
    ("https://himitsu.example.com", ("https://other.example", " https://himitsu.example.com")),
    ("https://HIMITSU.example.com:443/", ("https://himitsu.example.com",)),
    ("https://himitsu.example.com", ("https://Himitsu.Example.com:443",)),
    ("https://himitsu.example.com/himitsu/v1//", ("https://himitsu.example.com/himitsu",)),
    ("https://anything.example", ()),  # no list: any valid URL
    ("https://anything.example", ("", " ")),  # blank entries are no list either
])
def test_allowed_api_urls_permit(url: str, allowed: tuple[str, ...]) -> None:
    assert AllowList(allowed).check(url) == url.lower().replace(":443", "").rstrip("/")


@pytest.mark.parametrize(("url", "allowed"), [
    ("https://himitsu.example.com.evil", ("https://himitsu.example.com",)),
    ("https://himitsu.example.community", ("https://himitsu.example.com",)),
    ("https://himitsu.example.com:8443", ("https://himitsu.example.com",)),
    ("https://himitsu.example.com/other", ("https://himitsu.example.com/v2",)),
    ("https://himitsu.example.com/v2-evil", ("https://himitsu.example.com/v2",)),
    ("https://evil.example", ("https://himitsu.example.com",)),
])
def test_allowed_api_urls_refuse_outside_the_list(url: str, allowed: tuple[str, ...]) -> None:
    with pytest.raises(NotAllowed, match="--allowed-api-urls; ask the cluster administrator"):
        AllowList(allowed).check(url)


@pytest.mark.parametrize("walk", [
    "/..", "/../elsewhere", "/./..", "/x/../../elsewhere", "/%2e%2e/elsewhere",
    "/%2E%2E/elsewhere", "/.%2e/elsewhere", "/%2e/", "//elsewhere", "/x//y",
    "/%2f..%2felsewhere", "/..%2felsewhere", "/\\..\\elsewhere", "/..;/elsewhere",
    "/x;/../..", "/%5c..%5celsewhere", "/%00", "/caf\u00e9",
])
def test_a_path_a_client_or_server_would_rewrite_is_refused(walk: str) -> None:
    """The issue's reproduction first: with http://H/himitsu allowed, /himitsu/../elsewhere
    was accepted and requests sent /elsewhere/api/v1/..."""
    allowed = AllowList(["http://h.example/himitsu"], allow_insecure_http=True)
    with pytest.raises(NotAllowed, match="apiUrl's path"):
        allowed.check("http://h.example/himitsu" + walk)
    with pytest.raises(NotAllowed, match="apiUrl's path"):
        AllowList([], allow_insecure_http=True).check("http://h.example/himitsu" + walk)


def test_plain_http_only_with_the_flag() -> None:
    with pytest.raises(NotAllowed, match=r"plain http://.*--allow-insecure-http"):
        AllowList([]).check("http://himitsu.example.com")
    with pytest.raises(NotAllowed, match="plain http://"):
        AllowList(["https://himitsu.example.com"]).check("http://himitsu.example.com")
    insecure = AllowList(["http://127.0.0.1:8700"], allow_insecure_http=True)
    assert insecure.check("HTTP://127.0.0.1:8700/") == "http://127.0.0.1:8700"
    with pytest.raises(InvalidPrefix, match=r"plain http://.*--allow-insecure-http"):
        AllowList(["http://127.0.0.1:8700"])


@pytest.mark.parametrize("prefix", [
    "REPLACE-WITH-YOUR-HIMITSU-API-URLS", "himitsu.example.com", "ftp://h.example",
    "https://h.example/a/../b", "https://user:pw@h.example", "$(HIMITSU_API_URLS)",
])
def test_an_unusable_prefix_is_refused_up_front(prefix: str) -> None:
    """Not kept raw to match nothing (an operator that quietly refuses every apiUrl)."""
    with pytest.raises(InvalidPrefix, match="--allowed-api-urls entry") as refused:
        AllowList(["https://ok.example", prefix])
    assert "pw" not in str(refused.value)


def test_unrestricted_says_whether_there_is_a_list() -> None:
    assert AllowList([]).unrestricted and AllowList(["", " "]).unrestricted
    assert not AllowList(["https://himitsu.example.com"]).unrestricted


def test_an_invalid_api_url_is_refused_whatever_the_list() -> None:
    with pytest.raises(NotAllowed) as refused:
        AllowList(()).check("ftp://himitsu.example.com")
    assert "https:// or http://" in str(refused.value)


# --- the token Secret's own list -------------------------------------------------------------


@pytest.mark.parametrize(("annotation", "url"), [
    (None, "https://anywhere.example"),  # no annotation: no binding
    ("https://himitsu.example.com", "https://himitsu.example.com"),
    ("https://a.example, https://HIMITSU.example.com:443/", "https://himitsu.example.com/x"),
])
def test_a_token_binding_permits(annotation: str | None, url: str) -> None:
    check_token_binding(annotation, url, secret="team-a-token")


@pytest.mark.parametrize("annotation", [
    "https://himitsu.example.com/team-a",
    "https://himitsu.example.com.evil",
    "",  # present but blank: nowhere
    " , ",
    "https://himitsu.example.com/team-b,not a url",  # a broken entry: nowhere
])
def test_a_token_binding_refuses_and_fails_closed(annotation: str) -> None:
    """One message whatever the binding holds: a different one for a broken entry told
    whoever may create a HimitsuSecret what the Secret's annotation holds."""
    with pytest.raises(NotAllowed) as refused:
        check_token_binding(annotation, "https://himitsu.example.com/team-b",
                            secret="team-a-token")
    assert str(refused.value) == (
        "token Secret 'team-a-token' does not allow this apiUrl (its "
        f"{api.ANN_ALLOWED_API_URLS} annotation); use the Himitsu URL the token is meant "
        "for, or ask the token's owner")
    assert refused.value.detail  # for the operator's log


# --- properties: the URL matched is the URL requested ------------------------------------------

# Path pieces: plain ones, and ones that walk, hide a walk, or merely look odd.
PLAIN = st.sampled_from(["himitsu", "HIMITSU", "himitsu-evil", "v1", "elsewhere", "...",
                         "~", "-", "_", "a.b", ".x", "x."])
TRICKY = st.sampled_from([
    "", ".", "..", "%2e", "%2E%2e", ".%2e", "%2f", "%2F..", "%5c", "\\", "..\\", ";",
    "..;", "a;b", "%00", "%41", "%", "@", ":", "a:b", "!", "$", "caf\u00e9", "x%20y",
])
SUFFIXES = st.sampled_from(["", "/", "//", "?", "?x=1", "#", "#frag", "/.", "/.."])


def walks(head: str) -> st.SearchStrategy[str]:
    """``head`` + a path that mostly starts under the prefix, then wanders: about half
    of them plainly (so that many are accepted), the others with tricks mixed in."""
    return st.builds(
        lambda lead, pieces, suffix: head + "/" + "/".join([*lead, *pieces]) + suffix,
        st.sampled_from([["himitsu"], ["himitsu"], ["HIMITSU"], ["himitsu", "v1"], []]),
        st.lists(PLAIN, max_size=4) | st.lists(PLAIN | TRICKY, max_size=5),
        st.sampled_from(["", "/"]) | SUFFIXES)


def normalised_path(path: str) -> str:
    """RFC 3986 remove_dot_segments, as a server would apply it."""
    out: list[str] = []
    for segment in path.split("/")[1:]:
        if segment == "..":
            if out:
                out.pop()
        elif segment != ".":
            out.append(segment)
    tail = "/" if path.endswith(("/.", "/..")) else ""
    return "/" + "/".join(out) + tail


def assert_under(path: str, prefix_path: str, checked: str) -> None:
    assert path == urlsplit(checked).path + API_PATH, (path, checked)
    assert path.startswith(prefix_path + "/"), (path, prefix_path)
    # Nothing left for a server to rewrite: no escapes to decode, no dots to resolve.
    assert unquote(path) == path and "\\" not in path and ";" not in path
    assert normalised_path(path) == path


class Recorder(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    lines: ClassVar[list[str]] = []

    def do_GET(self) -> None:
        # The request line as received: http.server rewrites a leading "//" in self.path.
        Recorder.lines.append(self.requestline)
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(BODY)))
        self.end_headers()
        self.wfile.write(BODY)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture(scope="module")
def loopback() -> Iterator[str]:
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Recorder)
    httpd.daemon_threads = True
    thread = threading.Thread(target=httpd.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    with pytest.MonkeyPatch.context() as patch:
        for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "NO_PROXY", "http_proxy",
                     "https_proxy", "all_proxy", "no_proxy"):
            patch.delenv(name, raising=False)
        try:
            yield f"127.0.0.1:{httpd.server_address[1]}"
        finally:
            httpd.shutdown()
            httpd.server_close()
            thread.join(timeout=10)


@pytest.fixture(scope="module")
def client() -> Iterator[himitsu.HimitsuClient]:
    with himitsu.HimitsuClient(deadline=10, read_timeout=10) as made:
        yield made


def fetch(client: himitsu.HimitsuClient, api_url: str) -> None:
    client.fetch(api_url=api_url, project_id=PROJECT, environment_id=ENV, token=TOKEN,
                 known_version=None)


@settings(max_examples=300, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
@example(data=None)
def test_what_is_accepted_under_a_prefix_is_requested_under_it(
    loopback: str, client: himitsu.HimitsuClient, data: st.DataObject | None,
) -> None:
    """The request line a real server receives, for every apiUrl the list accepts."""
    prefix_path = "/himitsu"
    prefix = f"http://{loopback}{prefix_path}"
    host, port = loopback.split(":")
    heads = [f"http://{loopback}", f"HTTP://{loopback}", f"http://{host}:0{port}",
             f"Http://{host}:{port}"]
    if data is None:  # the reproduction
        url = f"http://{loopback}/himitsu/../elsewhere"
    else:
        url = data.draw(st.sampled_from(heads).flatmap(walks), label="apiUrl")
    allowed = AllowList([prefix], allow_insecure_http=True)
    try:
        checked = allowed.check(url)
    except NotAllowed:
        event("refused")
        return
    event("accepted")  # --hypothesis-show-statistics: most examples are either
    Recorder.lines.clear()
    fetch(client, checked)
    fetch(client, url)  # the client normalises the raw URL to the very same request
    assert len(Recorder.lines) == 2 and Recorder.lines[0] == Recorder.lines[1]
    method, target, _ = Recorder.lines[0].split(" ")
    assert method == "GET"
    assert_under(target, prefix_path, checked)


PREFIXES = ["https://himitsu.example.com/himitsu", "https://[2001:db8::1]:8443/himitsu",
            "https://himitsu.example.com"]
HOSTS = st.sampled_from([
    "himitsu.example.com", "HIMITSU.Example.COM", "himitsu.example.com:443",
    "[2001:db8::1]:8443", "[2001:DB8:0::1]:8443",
]) | st.sampled_from([
    "himitsu.example.com", "HIMITSU.Example.COM", "himitsu.example.com:443",
    "himitsu.example.com:0443", "himitsu.example.com:", "himitsu.example.com.",
    "himitsu.example.com.evil", "himitsu.example.com:8443", "evil.example",
    "[2001:db8::1]:8443", "[2001:DB8:0::1]:8443", "[2001:db8::1]", "127.0.0.1",
    "himitsu.example.com\\@evil.example", "evil.example#@himitsu.example.com",
])


@settings(max_examples=300, deadline=None)
@given(prefix=st.sampled_from(PREFIXES),
       url=st.builds(lambda scheme, host: f"{scheme}://{host}",
                     st.sampled_from(["https", "HTTPS", "https", "http"]), HOSTS)
       .flatmap(walks))
@example(prefix=PREFIXES[0], url="https://himitsu.example.com/himitsu/%2e%2e/elsewhere")
@example(prefix=PREFIXES[1], url="https://[2001:DB8::1]:8443/himitsu/")
def test_what_is_accepted_goes_to_the_prefixs_host_and_path(prefix: str, url: str) -> None:
    """The URL requests prepares (what urllib3 then connects to and sends), for hosts no
    loopback server can be: scheme, host and port are the prefix's, the path under it."""
    try:
        checked = AllowList([prefix]).check(url)
    except NotAllowed:
        event("refused")
        return
    event("accepted")
    sent: list[str] = []

    def answer(request: requests.PreparedRequest) -> tuple[int, dict[str, str], bytes]:
        sent.append(str(request.url))
        return 200, {}, BODY

    with responses.RequestsMock() as mock, himitsu.HimitsuClient() as client:
        mock.add_callback(responses.GET, re.compile(r".*"), callback=answer)
        fetch(client, checked)
    (prepared,) = sent
    got, want = parse_url(prepared), parse_url(prefix)
    assert (got.scheme, got.host, got.port or 443) == (want.scheme, want.host, want.port or 443)
    assert got.query is None and got.fragment is None and got.auth is None
    assert_under(got.path or "", want.path or "", checked)


@settings(max_examples=200, deadline=None)
@given(url=st.builds(lambda scheme, host: f"{scheme}://{host}",
                     st.sampled_from(["https", "HTTP"]), HOSTS).flatmap(walks))
def test_normalising_twice_changes_nothing(url: str) -> None:
    """What is matched is normalised once and for all: the client, normalising again
    before the request, gets the same URL (so the fingerprint and the pool agree too)."""
    try:
        once = himitsu.validate_api_url(url)
    except himitsu.InvalidInput:
        return
    assert himitsu.validate_api_url(once) == once
