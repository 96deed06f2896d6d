"""Tests for api.py: Go durations, the contract's defaults, and every InvalidSpec branch.

parse_spec is the boundary between whatever a user (or an old stored object) put in a
HimitsuSecret and the rest of the operator, so besides the examples a hypothesis
property proves that no input makes it raise anything but InvalidSpec: any other
exception would escape the reconciler as a crash instead of a Ready=False status.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from himitsu_controller import api

PROJECT = "11111111-1111-1111-1111-111111111111"
ENVIRONMENT = "22222222-2222-2222-2222-222222222222"


def make_obj(**spec_overrides: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "apiUrl": "https://himitsu.example.com",
        "projectId": PROJECT,
        "environmentId": ENVIRONMENT,
        "authSecretRef": {"name": "himitsu-token"},
        "target": {"name": "app-secrets"},
    }
    spec.update(spec_overrides)
    return {"metadata": {"namespace": "apps", "name": "app-config"}, "spec": spec}


# --- durations ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("0", 0.0),
        ("+0", 0.0),
        ("0s", 0.0),
        ("30s", 30.0),
        ("1m", 60.0),
        ("1h30m", 5400.0),
        ("500ms", 0.5),
        ("1.5h", 5400.0),
        (".5s", 0.5),
        ("1h0m10s", 3610.0),
        ("2us", 2e-6),
        (" 1m ", 60.0),
    ],
)
def test_go_durations(text: str, seconds: float) -> None:
    assert api.parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("garbage", "not a Go duration"),
        ("1", "not a Go duration"),  # Go wants a unit on everything but 0
        ("1h 30m", "not a Go duration"),
        ("1e3s", "not a Go duration"),
        ("1d", "not a Go duration"),
        ("\u0661s", "not a Go duration"),  # ARABIC-INDIC DIGIT ONE: Go takes ASCII digits only
        ("-1m", "negative"),
        ("", "empty"),
        ("   ", "empty"),
        ("8785h", "longer than a year"),
        ("9" * 400 + "h", "longer than a year"),
    ],
)
def test_bad_durations_are_invalid_spec(text: str, message: str) -> None:
    with pytest.raises(api.InvalidSpec, match=message):
        api.parse_duration(text)


def test_huge_duration_message_is_bounded() -> None:
    with pytest.raises(api.InvalidSpec) as info:
        api.parse_duration("x" * 10_000)
    assert len(str(info.value)) < 200


@pytest.mark.parametrize(
    ("seconds", "text"), [(0, "0s"), (30, "30s"), (60, "1m"), (5400, "1h30m"), (3601, "1h1s")]
)
def test_format_duration(seconds: float, text: str) -> None:
    assert api.format_duration(seconds) == text


# --- defaults -------------------------------------------------------------------------


def test_defaults_follow_the_contract() -> None:
    spec = api.parse_spec(make_obj())
    assert spec.api_url == "https://himitsu.example.com"
    assert spec.project_id == PROJECT
    assert spec.environment_id == ENVIRONMENT
    assert spec.auth_secret_name == "himitsu-token"
    assert spec.auth_secret_key == "token"
    assert spec.refresh_interval == 60.0
    assert spec.target.name == "app-secrets"
    assert spec.target.type == "Opaque"
    assert spec.target.creation_policy == "Owner"
    assert spec.target.template.format == "KeyValue"
    assert spec.target.template.data_key is None
    assert dict(spec.target.template.labels) == {}
    assert dict(spec.target.template.annotations) == {}


@pytest.mark.parametrize(("fmt", "key"), [("Dotenv", ".env"), ("Json", "config.json")])
def test_blob_formats_default_their_key(fmt: str, key: str) -> None:
    spec = api.parse_spec(make_obj(target={"name": "t", "template": {"format": fmt}}))
    assert spec.target.template.data_key == key
    named = api.parse_spec(
        make_obj(target={"name": "t", "template": {"format": fmt, "key": "app.cfg"}}))
    assert named.target.template.data_key == "app.cfg"


def test_explicit_fields_are_kept() -> None:
    spec = api.parse_spec(make_obj(
        authSecretRef={"name": "tok", "key": "api-key", "namespace": "apps"},
        refreshInterval="0",
        target={
            "name": "t", "type": "kubernetes.io/tls", "creationPolicy": "Merge",
            "template": {"format": "Json", "labels": {"team": "a"},
                         "annotations": {"note": "x"}},
        },
    ))
    assert spec.auth_secret_key == "api-key"
    assert spec.refresh_interval == 0.0
    assert spec.target.type == "kubernetes.io/tls"
    assert spec.target.creation_policy == "Merge"
    assert dict(spec.target.template.labels) == {"team": "a"}
    assert dict(spec.target.template.annotations) == {"note": "x"}


@pytest.mark.parametrize("text", ["1ms", "100ms", "500ms", "0.999s", "999999us", "1ns"])
def test_a_refresh_interval_between_0_and_1s_is_invalid_spec(text: str) -> None:
    """Below 1s a poll loop runs on the requeue floor (~0.1 s): a Himitsu request and a
    status patch each time, one object spending its token's whole budget."""
    with pytest.raises(api.InvalidSpec, match=r"is shorter than 1s.*or 0 to sync once"):
        api.parse_spec(make_obj(refreshInterval=text))


@pytest.mark.parametrize(("text", "seconds"), [
    ("0", 0.0), ("0s", 0.0), ("0ms", 0.0), ("1s", 1.0), ("1000ms", 1.0), ("1.5s", 1.5)])
def test_zero_and_a_second_or_more_are_refresh_intervals(text: str, seconds: float) -> None:
    assert api.parse_spec(make_obj(refreshInterval=text)).refresh_interval == seconds


def test_uuids_are_normalised_to_lowercase() -> None:
    upper = PROJECT.replace("1", "A")
    spec = api.parse_spec(make_obj(projectId=upper))
    assert spec.project_id == upper.lower()


def test_source_hash_tracks_every_input_that_decides_the_data() -> None:
    base = api.parse_spec(make_obj()).source_hash()
    assert api.parse_spec(make_obj()).source_hash() == base
    changes: list[dict[str, Any]] = [
        {"apiUrl": "https://other.example.com"},
        {"projectId": "33333333-3333-3333-3333-333333333333"},
        {"environmentId": "44444444-4444-4444-4444-444444444444"},
        {"target": {"name": "app-secrets", "template": {"format": "Dotenv"}}},
        {"target": {"name": "app-secrets", "template": {"format": "Json", "key": "x.json"}}},
        {"target": {"name": "app-secrets", "creationPolicy": "Merge"}},
        {"target": {"name": "app-secrets", "type": "kubernetes.io/tls"}},
    ]
    hashes = {api.parse_spec(make_obj(**change)).source_hash() for change in changes}
    assert base not in hashes
    assert len(hashes) == len(changes)
    # The poll cadence does not decide the data: changing it must not force a fetch
    # through the source check (the generation check already covers spec edits).
    assert api.parse_spec(make_obj(refreshInterval="5m")).source_hash() == base


# --- every InvalidSpec branch -----------------------------------------------------------


def _spec_without(key: str) -> dict[str, Any]:
    obj = make_obj()
    del obj["spec"][key]
    return obj


INVALID: list[tuple[str, dict[str, Any], str]] = [
    ("no spec", {"metadata": {}}, "spec is missing"),
    ("spec not an object", {"spec": "x"}, "spec is missing"),
    ("no apiUrl", _spec_without("apiUrl"), "apiUrl is required"),
    ("blank apiUrl", make_obj(apiUrl="  "), "apiUrl is required"),
    ("apiUrl not a string", make_obj(apiUrl=5), "apiUrl is required"),
    ("no projectId", _spec_without("projectId"), "projectId is required"),
    ("projectId not a uuid", make_obj(projectId="proj-1"), "projectId 'proj-1' is not a UUID"),
    ("environmentId not a uuid", make_obj(environmentId="env"), "environmentId 'env' is not"),
    ("no authSecretRef", _spec_without("authSecretRef"), "spec.authSecretRef is missing"),
    ("authSecretRef not an object", make_obj(authSecretRef="tok"), "authSecretRef is missing"),
    ("no auth name", make_obj(authSecretRef={"key": "k"}), "authSecretRef.name is required"),
    ("bad auth name", make_obj(authSecretRef={"name": "Tok_1"}), "not a valid Secret name"),
    ("cross-namespace auth", make_obj(authSecretRef={"name": "t", "namespace": "other"}),
     "authSecretRef.namespace is not supported"),
    ("auth key not a string", make_obj(authSecretRef={"name": "t", "key": 1}),
     "authSecretRef.key must be a string"),
    ("bad auth key", make_obj(authSecretRef={"name": "t", "key": "a/b"}),
     "not a valid Secret data key"),
    ("interval not a string", make_obj(refreshInterval=60), "refreshInterval must be a string"),
    ("interval garbage", make_obj(refreshInterval="soon"), "not a Go duration"),
    ("interval negative", make_obj(refreshInterval="-5s"), "negative"),
    ("interval under 1s", make_obj(refreshInterval="500ms"),
     "refreshInterval '500ms' is shorter than 1s, the shortest poll cadence; use 1s or more, "
     "or 0 to sync once"),
    ("no target", _spec_without("target"), "spec.target is missing"),
    ("no target name", make_obj(target={"type": "Opaque"}), "target.name is required"),
    ("bad target name", make_obj(target={"name": "App_Secrets"}), "target.name 'App_Secrets'"),
    ("long target name", make_obj(target={"name": "a" * 254}), "not a valid Secret name"),
    ("bad type", make_obj(target={"name": "t", "type": "my type"}), "target.type"),
    ("type not a string", make_obj(target={"name": "t", "type": []}),
     "target.type must be a string"),
    ("bad policy", make_obj(target={"name": "t", "creationPolicy": "Orphan"}),
     "creationPolicy 'Orphan' must be Owner or Merge"),
    ("template not an object", make_obj(target={"name": "t", "template": "Json"}),
     "target.template is missing or not an object"),
    ("bad format", make_obj(target={"name": "t", "template": {"format": "Yaml"}}),
     "format 'Yaml' must be KeyValue, Dotenv or Json"),
    ("bad template key", make_obj(target={"name": "t", "template": {"key": "a b"}}),
     "target.template.key 'a b'"),
    ("dot template key", make_obj(target={"name": "t", "template": {"key": ".."}}),
     "target.template.key '..'"),
    ("labels not a map", make_obj(target={"name": "t", "template": {"labels": ["a"]}}),
     "target.template.labels must map strings to strings"),
    ("annotation value not a string",
     make_obj(target={"name": "t", "template": {"annotations": {"a": 1}}}),
     "target.template.annotations must map strings to strings"),
    # Rules the CRD states (CEL, patterns) or cannot state, checked again.
    ("target is the token Secret", make_obj(target={"name": "himitsu-token"}),
     "target.name must differ from authSecretRef.name"),
    ("key with KeyValue", make_obj(target={"name": "t", "template": {"key": "x.env"}}),
     "applies only to the Dotenv and Json formats"),
    ("auth key starts with ..", make_obj(authSecretRef={"name": "t", "key": "..x"}),
     "not a valid Secret data key"),
    ("auth key too long", make_obj(authSecretRef={"name": "t", "key": "k" * 254}),
     "not a valid Secret data key"),
    ("label key", make_obj(target={"name": "t", "template": {"labels": {"a b": "v"}}}),
     "target.template.labels key 'a b' is not a valid label key"),
    ("label prefix", make_obj(target={"name": "t", "template": {"labels": {"A.io/k": "v"}}}),
     "not a valid label key"),
    ("label value", make_obj(target={"name": "t", "template": {"labels": {"k": "v" * 64}}}),
     "not a valid label value"),
    ("annotation key", make_obj(target={"name": "t", "template": {"annotations": {"/k": "v"}}}),
     "not a valid annotation key"),
    ("reserved annotation", make_obj(target={"name": "t", "template": {"annotations": {
        api.ANN_ALLOWED_API_URLS: "https://evil.example"}}}),
     "target.template.annotations key 'himitsu.io/allowed-api-urls' is reserved"),
    ("reserved label", make_obj(target={"name": "t", "template": {"labels": {
        api.LABEL_MANAGED_BY: "himitsu-operator"}}}),
     "target.template.labels key 'app.kubernetes.io/managed-by' is reserved"),
    ("reserved subdomain", make_obj(target={"name": "t", "template": {"labels": {
        "a.himitsu.io/k": "v"}}}), "is reserved"),
    ("kubectl's last-applied annotation", make_obj(target={"name": "t", "template": {
        "annotations": {"kubectl.kubernetes.io/last-applied-configuration": "{}"}}}),
     "target.template.annotations key 'kubectl.kubernetes.io/last-applied-configuration' "
     "is kubectl's own record"),
    ("annotations too big",
     make_obj(target={"name": "t", "template": {"annotations": {"k": "v" * 262_144}}}),
     "256 KiB"),
]


@pytest.mark.parametrize(("obj", "message"), [(o, m) for _, o, m in INVALID],
                         ids=[i for i, _, _ in INVALID])
def test_invalid_spec(obj: dict[str, Any], message: str) -> None:
    with pytest.raises(api.InvalidSpec) as info:
        api.parse_spec(obj)
    assert message in str(info.value)


def test_same_namespace_auth_ref_is_accepted() -> None:
    spec = api.parse_spec(make_obj(authSecretRef={"name": "t", "namespace": "apps"}))
    assert spec.auth_secret_name == "t"


def test_invalid_spec_messages_are_bounded() -> None:
    with pytest.raises(api.InvalidSpec) as info:
        api.parse_spec(make_obj(projectId="p" * 100_000))
    assert len(str(info.value)) < 200


# --- status ---------------------------------------------------------------------------


def test_parse_status_reads_our_own_status() -> None:
    status = api.parse_status({"status": {
        "configVersion": 37, "secretCount": 14, "lastSyncTime": "2024-01-01T00:00:00Z",
        "observedGeneration": 3, "lastForceSync": "now",
        "conditions": [
            {"type": "Other", "status": "False"},
            {"type": "Ready", "status": "True", "reason": "Synced", "message": "ok",
             "lastTransitionTime": "2024-01-01T00:00:00Z", "observedGeneration": 3},
        ],
    }})
    assert (status.config_version, status.secret_count, status.observed_generation) == (37, 14, 3)
    assert status.last_sync_time == "2024-01-01T00:00:00Z"
    assert status.last_force_sync == "now"
    assert status.ready is not None
    assert (status.ready.status, status.ready.reason) == ("True", "Synced")
    assert status.ready.observed_generation == 3


@pytest.mark.parametrize(
    "raw",
    [
        None, "x", [], {}, {"conditions": 5}, {"conditions": "Ready"}, {"conditions": {"a": 1}},
        {"conditions": [5, None, "x"]}, {"configVersion": "²"}, {"configVersion": True},
        {"configVersion": "abc", "observedGeneration": [], "lastSyncTime": 5},
    ],
)
def test_parse_status_is_lenient(raw: Any) -> None:
    # A malformed status (someone with status RBAC, an old version) must only cost a
    # full fetch, never crash the reconcile.
    status = api.parse_status({"status": raw})
    assert status.ready is None
    assert status.config_version is None
    assert status.observed_generation is None


def test_parse_status_accepts_numeric_strings() -> None:
    assert api.parse_status({"status": {"configVersion": "12"}}).config_version == 12


def test_parse_time() -> None:
    parsed = api.parse_time("2024-05-06T07:08:09Z")
    assert parsed is not None
    assert parsed.utcoffset() is not None
    assert parsed.timestamp() == 1714979289
    assert api.parse_time(None) is None
    assert api.parse_time("") is None
    assert api.parse_time("yesterday") is None


def test_force_sync_value() -> None:
    assert api.force_sync_value({"metadata": {"annotations": {api.ANN_FORCE_SYNC: "1"}}}) == "1"
    assert api.force_sync_value({"metadata": {}}) is None
    assert api.force_sync_value({}) is None


def test_condition_to_dict() -> None:
    cond = api.Condition(type="Ready", status="True", reason="Synced", message="m",
                         last_transition_time="t", observed_generation=2)
    assert cond.to_dict() == {"type": "Ready", "status": "True", "reason": "Synced",
                              "message": "m", "lastTransitionTime": "t",
                              "observedGeneration": 2}
    bare = api.Condition(type="Ready", status="False", reason="R", message="m",
                         last_transition_time="t")
    assert "observedGeneration" not in bare.to_dict()


# --- property: parse_spec only ever raises InvalidSpec ------------------------------------

json_scalars = st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20)
json_values = st.recursive(
    json_scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner,
                                                                 max_size=4),
    max_leaves=12,
)
# Values that are often *nearly* right, so the property reaches the deep branches.
plausible = st.sampled_from([
    "https://himitsu.example.com", PROJECT, ENVIRONMENT.upper(), "token", "t", "1m", "0",
    "-1s", "1.5h", "Owner", "Merge", "KeyValue", "Dotenv", "Json", ".env", "..", "a/b",
    "apps", "other", "", " ", "\n",
]) | json_values
# Every place parse_spec reads, so a single edit lands anywhere in the tree.
PATHS = [
    ("apiUrl",), ("projectId",), ("environmentId",), ("refreshInterval",),
    ("authSecretRef",), ("authSecretRef", "name"), ("authSecretRef", "key"),
    ("authSecretRef", "namespace"), ("target",), ("target", "name"), ("target", "type"),
    ("target", "creationPolicy"), ("target", "template"), ("target", "template", "format"),
    ("target", "template", "key"), ("target", "template", "labels"),
    ("target", "template", "annotations"),
]
edit = st.tuples(st.sampled_from(PATHS), plausible | json_values)


def apply_edit(spec: dict[str, Any], path: tuple[str, ...], value: Any) -> None:
    node: Any = spec
    for part in path[:-1]:
        if not isinstance(node.get(part), dict):
            node[part] = {}
        node = node[part]
    node[path[-1]] = value


@settings(max_examples=300, deadline=None)
@given(edits=st.lists(edit, max_size=3), whole=st.none() | json_values)
def test_parse_spec_only_raises_invalid_spec(
    edits: list[tuple[tuple[str, ...], Any]], whole: Any,
) -> None:
    obj = make_obj()
    for path, value in edits:
        apply_edit(obj["spec"], path, value)
    if whole is not None:
        obj["spec"] = whole
    try:
        spec = api.parse_spec(obj)
    except api.InvalidSpec as exc:
        assert str(exc)
        return
    # Whatever parses is usable downstream as is.
    assert spec.refresh_interval >= 0
    assert spec.target.creation_policy in api.POLICIES
    assert spec.target.template.format in api.FORMATS
    assert len(spec.source_hash()) == 32
