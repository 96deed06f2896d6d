"""Hostile and malformed HimitsuSecret specs, through the real reconciler.

test_api.py proves that ``parse_spec`` only ever raises InvalidSpec. What a user (or an
attacker with create rights in one namespace) actually meets is the whole reconcile:
parsing, the apiUrl check, the token read, the fetch, the write, the status and the
Event. So every spec here goes through ``HimitsuSecretReconciler.reconcile`` in the
shared fakes (reconcile_world.py) and the promises are checked on what comes out:

* nothing escapes ``reconcile()``: a worker would log a traceback and retry forever
  without ever telling the user what is wrong;
* the outcome is a Ready condition with one of the contract's reasons, and its message
  (and the Event's) is at most 1 KiB, however large the input;
* a spec that is invalid never costs a Himitsu request and never writes a Secret;
* an invalid spec is recognised even where the CRD schema did not catch it (objects
  stored before a schema change, clusters where the CRD's validation was edited away,
  and rules a pattern cannot express), and a spec the CRD admits never crashes anything.

Hypothesis generates the specs: URL pieces (schemes, userinfo, IPv6, unicode hosts,
ports, whitespace, huge paths), names, durations, and values of the wrong JSON type,
plus strings drawn from the CRD's own patterns, which are looser than they look.
"""

from __future__ import annotations

import copy
from typing import Any
from urllib.parse import urlsplit

from fakes import FakeFetcher
from hypothesis import example, given, settings
from hypothesis import strategies as st
from reconcile_world import API, KEY, NAME, NS, TARGET, World, fetched
from test_deploy_crd import admit, node, validate

from himitsu_controller import api, himitsu

REASONS = {"Synced", "InvalidSpec", "AuthenticationFailure", "FetchFailure", "WriteFailure",
           "TargetConflict"}
MAX_MESSAGE_BYTES = 1024
HUGE = 50_000

# --- generators ------------------------------------------------------------------------

json_scalars = (st.none() | st.booleans() | st.integers() | st.floats()
                | st.text(max_size=12))
json_values = st.recursive(
    json_scalars,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner,
                                                                max_size=3),
    max_leaves=8,
)

dns_label = st.from_regex(r"[a-z0-9]([a-z0-9-]{0,14}[a-z0-9])?", fullmatch=True)
dns_host = st.lists(dns_label, min_size=1, max_size=4).map(".".join)
ipv4 = st.tuples(*[st.integers(0, 255)] * 4).map(lambda t: ".".join(map(str, t)))
ipv6 = st.sampled_from(["[::1]", "[2001:db8::1]", "[::ffff:127.0.0.1]", "[fe80::1]"])
clean_path = st.lists(st.from_regex(r"[A-Za-z0-9._~-]{1,12}", fullmatch=True)
                      .filter(lambda p: p not in (".", "..")),
                      max_size=3).map(lambda parts: "".join("/" + p for p in parts))
clean_url = st.builds(
    lambda scheme, host, port, path, slash: f"{scheme}://{host}{port}{path}{slash}",
    st.sampled_from(["https", "http"]), dns_host | ipv4 | ipv6,
    st.sampled_from(["", ":443", ":80", ":8443", ":1", ":65535"]), clean_path,
    st.sampled_from(["", "/"]),
)

# Pieces no apiUrl may have: each one alone makes a URL invalid.
DANGEROUS_URLS = st.one_of(
    # Not http(s).
    st.sampled_from([
        "javascript:alert(1)", "file:///etc/passwd", "ftp://himitsu.example.com",
        "data:text/plain,x", "gopher://h.example", "ws://h.example", "//h.example",
        "himitsu.example.com", "https:himitsu.example.com", "https:/himitsu.example.com",
        "https:\\\\h.example", "mailto:a@h.example",
    ]),
    # Credentials.
    st.builds(lambda user, host: f"https://{user}@{host}",
              st.sampled_from(["u", "u:p", ":p", "u:", "a%40b", "", "h.example:443"]), dns_host),
    # Whitespace or control characters inside (surrounding whitespace is trimmed).
    st.builds(lambda c, i: "https://himitsu.example.com/api"[:i] + c
              + "https://himitsu.example.com/api"[i:],
              st.sampled_from([" ", "\t", "\n", "\r", "\x00", "\x1b", "\x7f", "\x85",
                               "\u00a0", "\u2028", "\u3000"]),
              st.integers(9, 30)),
    # Query or fragment.
    st.builds(lambda url, tail: url + tail, clean_url,
              st.sampled_from(["?", "?token=x", "#", "#frag", "/?a=b", "/#"])),
    # No host, or a port no server can have.
    st.sampled_from(["https://", "https:///path", "https://:443", "http://:8080/x",
                     "https://[]", "https://h.example:65536", "https://h.example:99999",
                     "https://h.example:-1", "https://h.example:abc",
                     "https://h.example:+443", "https://h.example:\u0664\u0664\u0663"]),
    # Brackets the parser cannot make sense of.
    st.sampled_from(["http://[::1", "https://::1]/", "https://[::1]]", "https://[[::1]]",
                     "https://h.example]", "http://[::1:80/x"]),
    # A host that is not ASCII (the CRD's pattern allows none: write IDNs as xn--).
    st.builds(lambda host: f"https://{host}.example",
              st.text(st.characters(min_codepoint=0xA1, max_codepoint=0x2FFFF,
                                    exclude_categories=("Cs", "Zs", "Zl", "Zp", "Cc")),
                      min_size=1, max_size=8)),
    st.sampled_from(["https://b\u00fccher.example", "https://exa\u200bmple.com",
                     "https://\uff45\uff58\uff41\uff4d\uff50\uff4c\uff45.com"]),
    # Longer than the CRD's 2048 characters.
    st.builds(lambda n: "https://h.example/" + "a" * n, st.integers(2031, HUGE)),
    # A path a client or a server would rewrite (the CRD's pattern admits them all).
    st.builds(lambda url, walk: url.rstrip("/") + walk, clean_url,
              st.sampled_from(["/..", "/.", "/a/../b", "/%2e%2e", "/%2E%2e/x", "//x",
                               "/a//b", "/a%2fb", "/a\\b", "/..;/x", "/a;b", "/%41",
                               "/caf\u00e9", "/a b"])),
)

bad_names = st.one_of(
    st.sampled_from(["", " ", "A", "App", "-a", "a-", "a_b", "a..b", ".a", "a.", "a/b",
                     "..", ".", "a\x00b", "s\u00e9cret", "\uff41\uff42", "a\u200bb",
                     "\u202eterces", "a b", "a" * 254, "a" * HUGE]),
    st.text(st.characters(min_codepoint=0x80), min_size=1, max_size=20),
)
bad_keys = st.one_of(
    st.sampled_from(["a/b", "a b", "", " ", "..", ".", "k\u00e9y", "a\nb", "a:b",
                     "x" * 254, "x" * HUGE]),
    st.text(st.characters(min_codepoint=0x80), min_size=1, max_size=20),
)
bad_durations = st.sampled_from([
    "", " ", "soon", "1", "1d", "1w", "-1s", "-0s", "- 1s", "1 m", "m", "1m1", "1e9s",
    "NaN", "inf", "1.5.5s", "1ms1", "P1M", "PT1M", "\u0661\u0662s", "\uff11m", "1\u00a0m",
    "9" * 400 + "h", "1" * HUGE + "s", "8785h", "1000000000000h", "0x10s",
    "1ns", "500ms", "0.999s",
])
wrong_types = st.one_of(st.integers(), st.floats(), st.booleans(),
                        st.lists(st.text(max_size=3), max_size=2),
                        st.dictionaries(st.text(max_size=3), st.text(max_size=3), max_size=2))

PATHS: dict[tuple[str, ...], st.SearchStrategy[Any]] = {
    ("apiUrl",): DANGEROUS_URLS | clean_url,
    ("projectId",): bad_names | st.just("1111111-1111-1111-1111-111111111111"),
    ("environmentId",): bad_names | st.just("{22222222-2222-2222-2222-222222222222}"),
    ("refreshInterval",): bad_durations,
    ("authSecretRef",): wrong_types,
    ("authSecretRef", "name"): bad_names,
    ("authSecretRef", "key"): bad_keys,
    ("authSecretRef", "namespace"): st.sampled_from(["other", "kube-system", "Apps"]),
    ("target",): wrong_types,
    ("target", "name"): bad_names | st.just("himitsu-token"),
    ("target", "type"): st.sampled_from(["", " ", "my type", "a\tb", "x" * 254]),
    ("target", "creationPolicy"): st.sampled_from(["Adopt", "owner", "merge", "", "Orphan"]),
    ("target", "template"): st.sampled_from(["Json", ["a"], 1]),
    ("target", "template", "format"): st.sampled_from(["Yaml", "json", "", "KeyValue "]),
    ("target", "template", "key"): bad_keys,
    ("target", "template", "labels"): st.sampled_from([
        {"bad key": "v"}, {"a/b/c": "v"}, {"k": "bad value!"}, {"k": "v" * 64},
        {"-k": "v"}, {"x" * 64: "v"}, {("p" * 254) + "/k": "v"}, {"": "v"}, {"k\u00e9": "v"},
        {"UPPER.example.com/k": "v"}, {"k": "\u00e9"}, {"k\n": "v"}, {"k": "v\n"},
        {"example.com/\n": "v"}]),
    ("target", "template", "annotations"): st.sampled_from([
        {"bad key": "v"}, {"a/b/c": "v"}, {"": "v"}, {"x" * 64: "v"},
        {"big": "v" * (256 * 1024)}, {"k\u00e9": "v"}, {"k\n": "v"}]),
}


def hostile_value(path: tuple[str, ...]) -> st.SearchStrategy[Any]:
    return PATHS[path] | wrong_types | json_values


edits = st.lists(
    st.sampled_from(sorted(PATHS)).flatmap(
        lambda path: st.tuples(st.just(path), hostile_value(path))),
    min_size=1, max_size=3,
)


def apply_edit(spec: dict[str, Any], path: tuple[str, ...], value: Any) -> None:
    node_: Any = spec
    for part in path[:-1]:
        if not isinstance(node_.get(part), dict):
            node_[part] = {}
        node_ = node_[part]
    node_[path[-1]] = copy.deepcopy(value)


# --- running one spec --------------------------------------------------------------------


def world_with(spec: Any, *, allowed: tuple[str, ...] = (), insecure_http: bool = True) -> World:
    # Plain http allowed unless a test says otherwise: the URLs here probe validation,
    # and test_allowlist.py proves the http rule.
    world = World(allowed=allowed, insecure_http=insecure_http)
    world.hsec["spec"] = copy.deepcopy(spec)
    # Whatever spec we are given, a fetch made for it succeeds: a spec that slips through
    # validation shows up as a fetch and a write, never as a fetch failure.
    world.fetcher = FakeFetcher(*[fetched(7) for _ in range(3)])
    world.restart()
    return world


def base_spec() -> dict[str, Any]:
    world_spec: dict[str, Any] = copy.deepcopy(World().hsec["spec"])
    return world_spec


def outcome(world: World) -> tuple[str, str]:
    """Reconcile once; check the promises every outcome keeps; (reason, message)."""
    secrets_before = copy.deepcopy(world.kube.secrets)
    result = world.reconciler.reconcile(KEY)  # an exception here fails the test
    ready = world.ready()
    reason, message = ready.get("reason", ""), ready.get("message", "")
    assert reason in REASONS, ready
    assert message, ready
    assert len(message.encode("utf-8")) <= MAX_MESSAGE_BYTES, len(message.encode("utf-8"))
    for event in world.kube.events:
        assert len(event.message.encode("utf-8")) <= MAX_MESSAGE_BYTES, event.reason
    assert (result.error is None) == (reason == "Synced")
    if reason == "InvalidSpec":
        assert world.fetcher.calls == [], "an invalid spec made a Himitsu request"
        assert world.kube.writes() == 0
        assert world.kube.secrets == secrets_before
    for call in world.fetcher.calls:  # what reached the Himitsu client was a valid URL
        assert_safe_url(himitsu.validate_api_url(call.api_url))
    return reason, message


def assert_safe_url(url: str) -> None:
    parts = urlsplit(url)
    assert parts.scheme in ("http", "https")
    assert parts.hostname and parts.hostname.isascii()
    assert not (parts.username or parts.password or parts.query or parts.fragment)
    assert len(url) <= 2048
    assert not any(c.isspace() or not c.isprintable() for c in url)


# --- properties --------------------------------------------------------------------------


@settings(max_examples=120, deadline=None)
@given(edits=edits)
@example(edits=[(("apiUrl",), "http://[::1")])
@example(edits=[(("target", "name"), "himitsu-token")])
@example(edits=[(("authSecretRef", "key"), "k" * HUGE)])
@example(edits=[(("target", "template", "labels"), {"bad key": "v"})])
def test_any_spec_ends_in_a_bounded_ready_condition(
    edits: list[tuple[tuple[str, ...], Any]],
) -> None:
    spec = base_spec()
    for path, value in edits:
        apply_edit(spec, path, value)
    world = world_with(spec)
    reason, _ = outcome(world)
    if reason == "Synced":
        # It synced, so it is a spec the operator can stand behind: valid for the CRD
        # (up to the documented leniency of trimming whitespace), and parsed.
        parsed = api.parse_spec(world.hsec)
        assert parsed.target.name != parsed.auth_secret_name
        assert (NS, parsed.target.name) in world.kube.secrets


@settings(max_examples=40, deadline=None)
@given(whole=json_values | st.sampled_from([None, {}, [], "spec", {"target": {}}]))
def test_a_spec_of_any_shape_is_invalid_spec(whole: Any) -> None:
    reason, _ = outcome(world_with(whole))
    assert reason == "InvalidSpec"


@settings(max_examples=80, deadline=None)
@given(url=DANGEROUS_URLS)
@example(url="http://[::1")
@example(url="https://b\u00fccher.example")
@example(url="https://h.example/" + "a" * 2031)
def test_a_dangerous_api_url_is_invalid_spec_and_never_fetched(url: str) -> None:
    spec = base_spec()
    spec["apiUrl"] = url
    reason, message = outcome(world_with(spec))
    assert reason == "InvalidSpec", message
    assert "apiUrl" in message
    # A URL may hold credentials: the message never repeats it.
    if len(url) > 20:
        assert url not in message


@settings(max_examples=120, deadline=None)
@given(path_and_value=st.sampled_from([
    ("authSecretRef", "name"), ("target", "name"),
]).flatmap(lambda p: st.tuples(st.just(p), bad_names))
    | st.tuples(st.just(("authSecretRef", "key")), bad_keys)
    | st.tuples(st.just(("target", "template", "key")), bad_keys)
    | st.tuples(st.just(("refreshInterval",)), bad_durations)
    | st.tuples(st.just(("target", "template", "labels")), PATHS[("target", "template", "labels")])
    | st.tuples(st.just(("target", "template", "annotations")),
                PATHS[("target", "template", "annotations")]))
def test_a_value_the_crd_refuses_is_refused_by_the_operator_too(
    path_and_value: tuple[tuple[str, ...], Any],
) -> None:
    """The CRD is the first line; the operator is the second, for the same rules and for
    those the schema cannot express (label syntax, target == token Secret, sizes)."""
    path, value = path_and_value
    spec = base_spec()
    if path[-1] == "key" and path[0] == "target":
        spec["target"]["template"] = {"format": "Dotenv"}
    apply_edit(spec, path, value)
    world = world_with(spec)
    reason, message = outcome(world)
    crd_errors = admit({"apiVersion": api.API_VERSION, "kind": api.KIND,
                        "metadata": {"name": NAME, "namespace": NS}, "spec": spec})
    # The one leniency: an optional field left empty means "unset", so it gets its
    # default (the CRD, stricter, refuses the empty string outright).
    unset = isinstance(value, str) and not value.strip() and path[-1] == "key"
    if crd_errors and not unset:
        assert reason == "InvalidSpec", (crd_errors, message)
    if path[0] == "target" and path[-1] in ("labels", "annotations"):
        # Not a schema rule (the CRD says "string map"), but the apiserver refuses such a
        # Secret: refused before any request, not after a fetch as a WriteFailure.
        assert reason == "InvalidSpec", message


@settings(max_examples=40, deadline=None)
@given(
    url=clean_url,
    target=st.from_regex(node("spec", "target", "name")["pattern"], fullmatch=True)
    .filter(lambda s: len(s) <= 253 and s != "himitsu-token"),
    interval=st.from_regex(node("spec", "refreshInterval")["pattern"], fullmatch=True)
    .filter(lambda s: len(s) <= 64 and validate(s, node("spec", "refreshInterval")) == []),
    template=st.sampled_from([{}, {"format": "Dotenv"}, {"format": "Json", "key": "c.json"},
                              {"format": "KeyValue", "labels": {"team": "a",
                                                                "example.com/x": ""}}]),
    policy=st.sampled_from(["Owner", "Merge"]),
)
def test_every_valid_spec_syncs_once(
    url: str, target: str, interval: str, template: dict[str, Any], policy: str,
) -> None:
    """The other direction: validation that refused good specs would be just as broken."""
    spec = base_spec()
    spec.update(apiUrl=url, refreshInterval=interval)
    spec["target"] = {"name": target, "creationPolicy": policy, "template": template}
    world = world_with(spec)
    reason, message = outcome(world)
    if reason == "InvalidSpec":  # the one refusal a pattern cannot express
        assert "longer than a year" in message
        return
    assert reason == "Synced", message
    (call,) = world.fetcher.calls
    assert himitsu.validate_api_url(call.api_url) == himitsu.validate_api_url(url)
    assert (NS, target) in world.kube.secrets


@settings(max_examples=80, deadline=None)
@given(url=st.sampled_from([
    "https://himitsu.example.com.evil.test", "https://himitsu.example.comevil.test",
    "https://himitsu.example.com@evil.test", "https://evil.test/https://himitsu.example.com",
    "https://himitsu.example.com:8443", "http://himitsu.example.com",
    "https://evil.test#https://himitsu.example.com", "https://himitsu.example.com\\@evil.test",
    "https://HIMITSU.EXAMPLE.COM.", "https://himitsu.example.com%2eevil.test",
    "https://[::ffff:himitsu.example.com]",
]) | DANGEROUS_URLS | clean_url | st.builds(
    lambda suffix: API + suffix, st.text(max_size=12)))
def test_allowed_api_urls_cannot_be_escaped(url: str) -> None:
    spec = base_spec()
    spec["apiUrl"] = url
    world = world_with(spec, allowed=(API,))
    outcome(world)
    for call in world.fetcher.calls:
        parts = urlsplit(himitsu.validate_api_url(call.api_url))
        assert (parts.scheme, parts.hostname, parts.port) == ("https", "himitsu.example.com",
                                                              None)


def test_a_target_named_like_the_token_secret_is_never_written() -> None:
    """The CRD refuses it with a CEL rule; without that rule a Merge target would take
    Himitsu keys into the very Secret that holds the operator's token."""
    for policy in ("Owner", "Merge"):
        spec = base_spec()
        spec["target"] = {"name": "himitsu-token", "creationPolicy": policy}
        world = world_with(spec)
        token_secret = copy.deepcopy(world.kube.secrets[(NS, "himitsu-token")])
        reason, message = outcome(world)
        assert reason == "InvalidSpec"
        assert "authSecretRef" in message
        assert world.kube.secrets[(NS, "himitsu-token")] == token_secret


def test_status_and_event_stay_bounded_for_huge_inputs() -> None:
    for path, value in [
        (("authSecretRef", "key"), "k" * HUGE),
        (("target", "name"), "\u00e9" * HUGE),
        (("refreshInterval",), "1" * HUGE + "s"),
        (("apiUrl",), "https://" + "\U0001f600" * HUGE),
    ]:
        spec = base_spec()
        apply_edit(spec, path, value)
        reason, message = outcome(world_with(spec))
        assert reason == "InvalidSpec", (path, message)
    assert TARGET  # the world's target name, never touched above
