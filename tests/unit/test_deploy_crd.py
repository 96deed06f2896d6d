"""Static checks of the HimitsuSecret CRD and the samples, against the contract.

The CRD is hand-written YAML that nothing compiles, so a typo in a default, an enum or a
printer column would only show up on a live cluster. These tests pin it to the
contract (docs/reference.md, from the project's README spec) and to the code that reads
the same objects (src/himitsu_controller/api.py), and validate every sample against the
schema with a small validator for the subset of OpenAPI v3 + CEL the CRD uses (no
jsonschema dependency: the subset is tiny, and Kubernetes' structural-schema rules
differ from plain JSON Schema anyway).
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import re
from collections.abc import Callable, Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from himitsu_controller import api

ROOT = Path(__file__).resolve().parents[2]
CRD_PATH = ROOT / "deploy" / "crd" / "himitsu.io_himitsusecrets.yaml"
SAMPLES_PATH = ROOT / "deploy" / "samples" / "himitsusecret.yaml"

# The contract's first example, verbatim.
CONTRACT_EXAMPLE: dict[str, Any] = {
    "apiVersion": "himitsu.io/v1alpha1",
    "kind": "HimitsuSecret",
    "metadata": {"name": "app-config", "namespace": "apps"},
    "spec": {
        "apiUrl": "https://himitsu.example.com",
        "projectId": "11111111-1111-1111-1111-111111111111",
        "environmentId": "22222222-2222-2222-2222-222222222222",
        "authSecretRef": {"name": "himitsu-token"},
        "refreshInterval": "1m",
        "target": {"name": "app-secrets"},
    },
}

# Each CEL rule in the CRD with a Python twin, so samples are checked against the rules
# too. A rule added to the CRD without a twin fails test_every_cel_rule_has_a_twin.
CEL_TWINS: dict[str, Callable[[Any], bool]] = {
    "self.target.name != self.authSecretRef.name": (
        lambda s: s["target"]["name"] != s["authSecretRef"]["name"]
    ),
    "!has(self.__namespace__)": lambda s: "namespace" not in s,
    "!has(self.key) || (has(self.format) && self.format != 'KeyValue')": (
        lambda s: "key" not in s or ("format" in s and s["format"] != "KeyValue")
    ),
    "duration(self) == duration('0s') || duration(self) >= duration('1s')": (
        lambda s: _go_seconds(s) == 0 or _go_seconds(s) >= 1
    ),
    "duration(self) <= duration('24h')": lambda s: _go_seconds(s) <= 24 * 3600,
    "self.all(k, k != 'app.kubernetes.io/managed-by' && !k.matches('^([^/]*[.])?himitsu[.]io/'))": (
        lambda m: not any(api.is_reserved_key(k) for k in m)
    ),
    "self.all(k, !k.startsWith('kubernetes.io/service-account.'))": (
        lambda m: not any(k.startswith("kubernetes.io/service-account.") for k in m)
    ),
}


def _go_seconds(text: str) -> float:
    """CEL's duration() is Go's time.ParseDuration: a model of Go's code (time/format.go),
    not api.parse_duration, for what the pattern admits; an overflow is "too long"."""
    ns = _go_parse_duration(text.strip())
    return float("inf") if ns is None else ns / 1e9


def _go_parse_duration(s: str) -> int | None:
    """Go's ParseDuration, line for line: nanoseconds, None when Go says invalid."""
    units = {"ns": 1, "us": 1000, "µs": 1000, "μs": 1000, "ms": 10**6, "s": 10**9,
             "m": 60 * 10**9, "h": 3600 * 10**9}
    top = 1 << 63
    neg = s[:1] == "-"
    if s[:1] in "+-" and s:
        s = s[1:]
    if s == "0":
        return 0
    if not s:
        return None
    d = 0
    while s:
        i, v = 0, 0
        while i < len(s) and "0" <= s[i] <= "9":  # leadingInt
            if v > top // 10:
                return None
            v = v * 10 + ord(s[i]) - ord("0")
            if v > top:
                return None
            i += 1
        pre, s = i > 0, s[i:]
        f, scale, post = 0, 1.0, False
        if s[:1] == ".":
            s, i, overflow = s[1:], 0, False
            while i < len(s) and "0" <= s[i] <= "9":  # leadingFraction
                if not overflow:
                    if f > (top - 1) // 10:
                        overflow = True
                    else:
                        y = f * 10 + ord(s[i]) - ord("0")
                        if y > top:
                            overflow = True
                        else:
                            f, scale = y, scale * 10
                i += 1
            post, s = i > 0, s[i:]
        if not pre and not post:
            return None
        i = 0
        while i < len(s) and s[i] != "." and not "0" <= s[i] <= "9":
            i += 1
        unit = units.get(s[:i])
        if unit is None:
            return None
        s = s[i:]
        if v > top // unit:
            return None
        v *= unit
        if f > 0:
            v += int(float(f) * (float(unit) / scale))
            if v > top:
                return None
        d += v
        if d > top:
            return None
    return -d if neg else d if d <= top - 1 else None

_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
_INT_RANGES = {"int32": (-(2**31), 2**31 - 1), "int64": (-(2**63), 2**63 - 1)}


def load_docs(path: Path) -> list[Any]:
    with path.open(encoding="utf-8") as fh:
        return [doc for doc in yaml.load_all(fh, Loader=_LOADER) if doc is not None]


@functools.cache
def _crd_cached() -> Any:
    (doc,) = load_docs(CRD_PATH)
    return doc


def crd() -> Any:
    """The parsed CRD, shared between tests: callers read it, never change it."""
    return _crd_cached()


def version() -> Any:
    (ver,) = crd()["spec"]["versions"]
    return ver


def root_schema() -> Any:
    return version()["schema"]["openAPIV3Schema"]


def node(*path: str) -> Any:
    """The schema node at spec/status property path, e.g. node("spec", "target", "name")."""
    schema = root_schema()
    for part in path:
        schema = schema["properties"][part]
    return schema


def samples() -> list[Any]:
    return load_docs(SAMPLES_PATH)


# ---- a validator for the OpenAPI subset the CRD uses ----------------------------------


def apply_defaults(value: Any, schema: Any) -> Any:
    """Fill defaults the way the apiserver does: missing properties of present objects."""
    if not isinstance(value, dict) or schema.get("type") != "object":
        return value
    out = dict(value)
    for name, sub in schema.get("properties", {}).items():
        if name not in out and "default" in sub:
            out[name] = copy.deepcopy(sub["default"])
        if name in out:
            out[name] = apply_defaults(out[name], sub)
    return out


def validate(value: Any, schema: Any, path: str = "") -> list[str]:
    """Errors of ``value`` against ``schema``; unknown fields count (the apiserver would
    prune them silently, which in a sample is just as wrong)."""
    kind = schema.get("type")
    checks: dict[str, Callable[[Any, Any, str], list[str]]] = {
        "object": _validate_object, "array": _validate_array,
        "string": _validate_string, "integer": _validate_integer,
        "boolean": _validate_boolean,
    }
    if kind not in checks:
        return [f"{path}: schema node without a supported type"]
    errors = checks[kind](value, schema, path)
    if not errors:
        for rule in schema.get("x-kubernetes-validations", []):
            if not CEL_TWINS[rule["rule"]](value):
                errors.append(f"{path}: {rule['message']}")
    return errors


def _validate_object(value: Any, schema: Any, path: str) -> list[str]:
    if not isinstance(value, dict):
        return [f"{path}: expected object"]
    errors = [f"{path}.{r}: Required value" for r in schema.get("required", []) if r not in value]
    props = schema.get("properties")
    extra = schema.get("additionalProperties")
    for key, item in value.items():
        if props is not None and key in props:
            errors += validate(item, props[key], f"{path}.{key}")
        elif isinstance(extra, dict):
            errors += validate(item, extra, f"{path}.{key}")
        elif props is not None:
            errors.append(f"{path}.{key}: unknown field")
    return errors


def _validate_array(value: Any, schema: Any, path: str) -> list[str]:
    if not isinstance(value, list):
        return [f"{path}: expected array"]
    errors: list[str] = []
    if len(value) > schema.get("maxItems", len(value)):
        errors.append(f"{path}: Too many")
    for i, item in enumerate(value):
        errors += validate(item, schema["items"], f"{path}[{i}]")
    if schema.get("x-kubernetes-list-type") == "map":
        keys = [tuple(i.get(k) for k in schema["x-kubernetes-list-map-keys"]) for i in value]
        if len(keys) != len(set(keys)):
            errors.append(f"{path}: duplicate map-list keys")
    return errors


def _validate_string(value: Any, schema: Any, path: str) -> list[str]:
    if not isinstance(value, str):
        return [f"{path}: expected string, got {type(value).__name__}"]
    errors = []
    if "enum" in schema and value not in schema["enum"]:
        errors.append(f"{path}: Unsupported value {value!r}")
    if len(value) > schema.get("maxLength", len(value)):
        errors.append(f"{path}: Too long")
    if len(value) < schema.get("minLength", 0):
        errors.append(f"{path}: Too short")
    if "pattern" in schema and not re.search(schema["pattern"], value):
        errors.append(f"{path}: does not match {schema['pattern']}")
    if schema.get("format") == "date-time":
        try:
            datetime.fromisoformat(value.replace("Z", "+00:00"))
        except ValueError:
            errors.append(f"{path}: not a date-time")
    return errors


def _validate_boolean(value: Any, schema: Any, path: str) -> list[str]:
    return [] if isinstance(value, bool) else [f"{path}: expected boolean"]


def _validate_integer(value: Any, schema: Any, path: str) -> list[str]:
    if not isinstance(value, int) or isinstance(value, bool):
        return [f"{path}: expected integer"]
    low, high = _INT_RANGES.get(schema.get("format", "int64"), _INT_RANGES["int64"])
    low = max(low, schema.get("minimum", low))
    return [] if low <= value <= high else [f"{path}: out of range"]


def admit(obj: Any) -> list[str]:
    """What the apiserver would say to a create of ``obj``: defaults, then validation."""
    schema = root_schema()
    return validate(apply_defaults(obj, schema), schema)


def walk(schema: Any, path: str = "") -> Iterator[tuple[str, Any]]:
    yield path, schema
    for name, sub in schema.get("properties", {}).items():
        yield from walk(sub, f"{path}.{name}")
    for key in ("items", "additionalProperties"):
        if isinstance(schema.get(key), dict):
            yield from walk(schema[key], f"{path}[{key}]")


# ---- the CRD ---------------------------------------------------------------------------


def test_names_scope_and_version() -> None:
    spec = crd()["spec"]
    assert crd()["apiVersion"] == "apiextensions.k8s.io/v1"
    assert crd()["metadata"]["name"] == f"{api.PLURAL}.{api.GROUP}"
    assert spec["group"] == api.GROUP == "himitsu.io"
    assert spec["scope"] == "Namespaced"
    names = spec["names"]
    assert (names["kind"], names["plural"], names["singular"]) == (
        api.KIND, api.PLURAL, "himitsusecret",
    )
    assert names["shortNames"] == ["hsec"]
    assert names["categories"] == ["himitsu"]
    ver = version()
    assert (ver["name"], ver["served"], ver["storage"]) == (api.VERSION, True, True)
    assert ver["subresources"] == {"status": {}}


def test_printer_columns_match_the_contract() -> None:
    ready = '.status.conditions[?(@.type=="Ready")]'
    columns = [
        (c["name"], c["type"], c["jsonPath"], c.get("priority", 0))
        for c in version()["additionalPrinterColumns"]
    ]
    assert columns == [
        ("Secret", "string", ".spec.target.name", 0),
        ("Keys", "integer", ".status.secretCount", 0),
        ("Version", "integer", ".status.configVersion", 0),
        ("Ready", "string", f"{ready}.status", 0),
        ("Reason", "string", f"{ready}.reason", 1),
        ("Last Sync", "date", ".status.lastSyncTime", 0),
        ("Age", "date", ".metadata.creationTimestamp", 0),
        ("Message", "string", f"{ready}.message", 1),
    ]
    # kubectl upper-cases headers and prints NAME first: the contract's header line.
    default_view = ["NAME"] + [c[0].upper() for c in columns if c[3] == 0]
    assert " ".join(default_view) == "NAME SECRET KEYS VERSION READY LAST SYNC AGE"


def test_every_field_says_what_it_does_and_its_default() -> None:
    """`kubectl explain` prints these (tests/e2e/test_crd_explain.py checks it does): every
    spec and status field has a description; every spec field names its default, the
    schema's own when it has one, or says it is required."""
    missing = [path for path, schema in walk(root_schema())
               if path and path != ".metadata"  # the apiserver's ObjectMeta, described
               and "[additionalProperties]" not in path.split(".")[-1]
               and not path.endswith("[items]") and not schema.get("description")]
    assert missing == []
    spec_schema = node("spec")
    for path, schema in walk(spec_schema, "spec"):
        if path.endswith(("[items]", "[additionalProperties]")) or path == "spec":
            continue
        text = " ".join(schema["description"].split())
        if "default" in schema:
            assert f"Default: {schema['default']}" in text, path
        else:
            assert "Default:" in text or "Required." in text or "must be omitted" in text, path


def test_required_fields_defaults_and_enums() -> None:
    assert root_schema()["required"] == ["spec"]
    assert set(node("spec")["required"]) == {
        "apiUrl", "projectId", "environmentId", "authSecretRef", "target",
    }
    assert node("spec", "authSecretRef")["required"] == ["name"]
    assert node("spec", "target")["required"] == ["name"]
    defaults = {
        path: sub["default"] for path, sub in walk(node("spec"), "spec") if "default" in sub
    }
    assert defaults == {
        "spec.authSecretRef.key": "token",
        "spec.refreshInterval": "1m",
        "spec.target.type": "Opaque",
        "spec.target.creationPolicy": "Owner",
        "spec.target.template.format": "KeyValue",
    }
    assert node("spec", "target", "creationPolicy")["enum"] == list(api.POLICIES)
    assert node("spec", "target", "template", "format")["enum"] == list(api.FORMATS)
    # The blob key's default depends on the format (.env / config.json): the operator
    # applies it, a schema default would be wrong for one of the two.
    assert "default" not in node("spec", "target", "template", "key")
    assert node("spec", "apiUrl")["maxLength"] == 2048
    assert node("spec", "target", "name")["maxLength"] == 253
    for field in ("labels", "annotations"):
        sub = node("spec", "target", "template", field)
        assert sub["additionalProperties"] == {"type": "string"}


def test_rollout_restart_targets_schema_matches_the_operator() -> None:
    targets = node("spec", "rolloutRestartTargets")
    assert targets["maxItems"] == api.MAX_ROLLOUT_TARGETS
    assert targets["x-kubernetes-list-type"] == "map"
    assert targets["x-kubernetes-list-map-keys"] == ["kind", "name"] == targets["items"][
        "required"]
    assert targets["items"]["properties"]["kind"]["enum"] == list(api.WORKLOAD_KINDS)
    assert targets["items"]["properties"]["name"]["pattern"] == node(
        "spec", "target", "name")["pattern"]
    assert node("spec", "minRestartInterval")["pattern"] == node(
        "spec", "refreshInterval")["pattern"]
    status = node("status", "rolloutRestarts")
    assert status["x-kubernetes-list-map-keys"] == ["kind", "name"]
    assert set(status["items"]["properties"]) == {"kind", "name", "lastRestart", "warning"}
    good = {**CONTRACT_EXAMPLE["spec"], "minRestartInterval": "30s",
            "rolloutRestartOnCreate": True,
            "rolloutRestartTargets": [{"kind": "Deployment", "name": "web"}]}
    assert admit({**CONTRACT_EXAMPLE, "spec": good}) == []
    parsed = api.parse_spec({**CONTRACT_EXAMPLE, "spec": good})
    assert parsed.rollout.min_interval == 30.0 and parsed.rollout.on_create
    for bad in ([{"kind": "CronJob", "name": "x"}], [{"kind": "Deployment", "name": "X"}],
                [{"kind": "Deployment", "name": "w"}] * 2,
                [{"kind": "Deployment", "name": f"w{i}"} for i in range(17)]):
        assert admit({**CONTRACT_EXAMPLE, "spec": {**good, "rolloutRestartTargets": bad}})


def test_schema_is_structural_and_defaults_are_valid() -> None:
    for path, sub in walk(root_schema()):
        assert sub.get("type") in {"object", "array", "string", "integer", "boolean"}, path
        if "default" in sub:
            assert validate(sub["default"], sub, path) == [], path
        for name in sub.get("required", []):
            assert name in sub["properties"], f"{path} requires undeclared {name}"
        if "pattern" in sub:
            re.compile(sub["pattern"])


def test_status_holds_every_field_the_operator_writes() -> None:
    status = node("status")["properties"]
    assert status["configVersion"] == {**status["configVersion"], "type": "integer",
                                       "format": "int64"}
    assert status["observedGeneration"]["format"] == "int64"
    assert status["secretCount"]["type"] == "integer"
    assert status["lastSyncTime"]["format"] == "date-time"
    conditions = status["conditions"]
    assert conditions["x-kubernetes-list-type"] == "map"
    assert conditions["x-kubernetes-list-map-keys"] == ["type"]
    # A status field missing from the schema is pruned on write without any error, so
    # tie the schema to api.Status: every field it carries must survive.
    camel = {re.sub(r"_(\w)", lambda m: m.group(1).upper(), f.name)
             for f in dataclasses.fields(api.Status)}
    assert camel - {"ready"} <= set(status), camel - set(status)
    cond = api.Condition(
        type="Ready", status="False", reason="InvalidSpec", message="target.name is required",
        last_transition_time="2024-05-01T12:00:00Z", observed_generation=3,
    )
    assert validate([cond.to_dict()], conditions, "status.conditions") == []


@pytest.mark.parametrize(
    "reason",
    ["Synced", "AuthenticationFailure", "FetchFailure", "WriteFailure", "InvalidSpec",
     "TargetConflict"],
)
def test_contract_reasons_fit_the_condition_schema(reason: str) -> None:
    sub = node("status", "conditions")["items"]["properties"]["reason"]
    assert validate(reason, sub) == []


def test_every_cel_rule_has_a_twin() -> None:
    rules = {
        rule["rule"] for _, sub in walk(root_schema())
        for rule in sub.get("x-kubernetes-validations", [])
    }
    assert rules == set(CEL_TWINS)


# ---- patterns --------------------------------------------------------------------------

MICRO, MU = "\u00b5", "\u03bc"


@pytest.mark.parametrize(
    ("field", "good", "bad"),
    [
        (("apiUrl",),
         ["https://himitsu.example.com", "http://127.0.0.1:8080", "https://h.example/api/",
          "http://[::1]:9000", "https://himitsu_api.internal"],
         ["ftp://h.example", "https://", "himitsu.example.com", "https://u:p@h.example",
          "https://h.example/?token=x", "https://h.example/#x", "https://h .example"]),
        (("projectId",),
         ["11111111-1111-1111-1111-111111111111", "ABCDEF01-2345-6789-abcd-ef0123456789"],
         ["1111", "11111111111111111111111111111111", "11111111-1111-1111-1111-11111111111g"]),
        (("refreshInterval",),
         ["0", "0s", "0ms", "1s", "1m", "1h30m", "1.5h", "1500ms", "90s", "500ms500ms",
          "1000000000ns", "1000000us", f"1000000{MICRO}s", f"1000000{MU}s"],
         ["", "1", "-1m", "+1m", "1d", "m", "1 m", "1m ", ".5s", "1.s", "P1M",
          "500ms", "0.5s", "999ms", "1ns", "2us", f"3{MICRO}s", f"4{MU}s"]),
        (("target", "name"),
         ["app-secrets", "a", "a.b-c.d"],
         ["App", "-a", "a-", "a_b", "a..b", "a" * 254]),
        (("authSecretRef", "key"),
         ["token", ".env", "config.json", "a..b", "x.", "_t-1"],
         [".", "..", "..x", "a/b", "a b", ""]),
        (("target", "type"),
         ["Opaque", "kubernetes.io/dockerconfigjson"],
         ["", "has space"]),
    ],
)
def test_field_patterns(field: tuple[str, ...], good: list[str], bad: list[str]) -> None:
    sub = node("spec", *field)
    for value in good:
        assert validate(value, sub) == [], value
    for value in bad:
        assert validate(value, sub) != [], value


def test_the_go_duration_model_is_go_s() -> None:
    """The twin's model, on what Go's time.ParseDuration answers (go1.22)."""
    for text, ns in (("24h0.1ns", 86400 * 10**9), ("0.0000000001s", 0), ("1.5h", 5400 * 10**9),
                     (".5s", 5 * 10**8), ("1h0m10s", 3610 * 10**9), ("2µs", 2000),
                     ("0", 0), ("9223372036.854775807s", 2**63 - 1)):
        assert _go_parse_duration(text) == ns, text
    for text in ("", "1", ".s", "1d", "9223372036854775808ns", "3000000h"):
        assert _go_parse_duration(text) is None, text


def test_the_operator_adds_up_durations_as_go_does() -> None:
    """api.parse_duration is Go's sum in nanoseconds (a fraction of a nanosecond dropped),
    so the operator and CEL's duration() agree to the nanosecond."""
    for text in ("24h0.1ns", "24h0.0000000001s", "1.5h", "1h0m10s", "0.3s", "1.000000001s",
                 "59m59.999999999s", "8784h"):
        assert api.parse_duration(text) == _go_seconds(text), text


@settings(max_examples=50, deadline=None)
@given(st.from_regex(node("spec", "refreshInterval")["pattern"], fullmatch=True))
def test_every_duration_the_crd_admits_the_operator_parses(text: str) -> None:
    admitted = validate(text, node("spec", "refreshInterval")) == []
    try:
        seconds = api.parse_refresh_interval({"refreshInterval": text})
    except api.InvalidSpec as exc:
        # Too long an interval is the one refusal the schema does not express.
        assert "longer than a year" in str(exc) or not admitted, (text, exc)
    else:  # and what the CEL rule refuses, the operator refuses too
        assert seconds == 0 or seconds >= api.MIN_REFRESH_SECONDS, text


def test_a_sub_second_refresh_interval_is_refused_at_admission() -> None:
    for text in ("500ms", "0.5s", "999ms", "1ns"):
        errors = admit({**CONTRACT_EXAMPLE, "spec": {**CONTRACT_EXAMPLE["spec"],
                                                     "refreshInterval": text}})
        assert errors == [".spec.refreshInterval: refreshInterval must be 0 (sync once) or "
                          "at least 1s"], text


def test_the_crd_refuses_every_min_restart_interval_the_operator_refuses() -> None:
    """A window the CRD admits and the operator calls InvalidSpec would stop the whole
    sync (Ready=False) over a batching knob: the apiserver refuses it at admission."""
    disagree = []
    for text in ("25h", "24h0m1s", "1000h", "24h", "0.5s", "1ns", "999ms", "0", "1m",
                 "24h0.1ns", "24h0.0000000001s", "24h1ns", "23h59m59.9999999999s"):
        obj = {**CONTRACT_EXAMPLE, "spec": {**CONTRACT_EXAMPLE["spec"],
                                            "minRestartInterval": text}}
        try:
            api.parse_spec(obj)
            operator_ok = True
        except api.InvalidSpec:
            operator_ok = False
        if (admit(obj) == []) != operator_ok:
            disagree.append(text)
    assert disagree == [], f"the CRD and the operator disagree on {disagree}"


# ---- samples ---------------------------------------------------------------------------


def test_samples_are_the_three_documented_variants() -> None:
    docs = samples()
    assert [d["kind"] for d in docs] == ["HimitsuSecret"] * 3
    assert docs[0] == CONTRACT_EXAMPLE
    layouts = [
        (t.get("creationPolicy", "Owner"), t.get("template", {}).get("format", "KeyValue"))
        for t in (d["spec"]["target"] for d in docs)
    ]
    assert layouts == [("Owner", "KeyValue"), ("Merge", "Dotenv"), ("Owner", "Json")]
    template = docs[2]["spec"]["target"]["template"]
    assert template["key"] != "config.json"
    assert template["labels"]
    assert template["annotations"]
    targets = [(d["metadata"]["namespace"], d["spec"]["target"]["name"]) for d in docs]
    assert len(set(targets)) == len(targets), "samples must not fight over one target"


def test_samples_hold_no_token() -> None:
    text = SAMPLES_PATH.read_text(encoding="utf-8")
    assert not re.search(r"himi_[0-9a-f]{16}_", text)
    assert all(d["kind"] != "Secret" for d in samples())
    assert "kubectl -n apps create secret generic himitsu-token" in text


@pytest.mark.parametrize("index", [0, 1, 2])
def test_sample_is_admitted_and_parsed(index: int) -> None:
    sample = samples()[index]
    assert admit(sample) == []
    parsed = api.parse_spec(apply_defaults(sample, root_schema()))
    assert parsed.target.name == sample["spec"]["target"]["name"]


def _mutated(change: Callable[[Any], None]) -> Any:
    obj = copy.deepcopy(CONTRACT_EXAMPLE)
    change(obj["spec"])
    return obj


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        (lambda s: s.pop("apiUrl"), "spec.apiUrl: Required value"),
        (lambda s: s.update(apiUrl="ftp://h.example"), "spec.apiUrl: does not match"),
        (lambda s: s.update(projectId="project-1"), "spec.projectId: does not match"),
        (lambda s: s.update(refreshInterval="1d"), "spec.refreshInterval: does not match"),
        (lambda s: s.update(refreshInterval=60), "spec.refreshInterval: expected string"),
        (lambda s: s["target"].pop("name"), "spec.target.name: Required value"),
        (lambda s: s["target"].update(creationPolicy="Adopt"), "Unsupported value 'Adopt'"),
        (lambda s: s["target"].update(template={"format": "Yaml"}), "Unsupported value"),
        (lambda s: s["target"].update(template={"key": "x.env"}), "only to the Dotenv"),
        (lambda s: s["target"].update(template={"labels": {"a": 1}}), "expected string"),
        (lambda s: s["target"].update(name="himitsu-token"), "must differ from"),
        (lambda s: s["target"].update(template={"annotations": {
            api.ANN_ALLOWED_API_URLS: "https://evil.example"}}), "reserved"),
        (lambda s: s["target"].update(template={"annotations": {
            "x.himitsu.io/a": ""}}), "reserved"),
        (lambda s: s["target"].update(template={"labels": {
            api.LABEL_MANAGED_BY: "himitsu-operator"}}), "reserved"),
        (lambda s: s["target"].update(template={"labels": {
            api.LABEL_MANAGED: "true"}}), "reserved"),
        (lambda s: s["target"].update(template={"annotations": {
            "kubernetes.io/service-account.name": "default"}}), "token controller"),
        (lambda s: s["authSecretRef"].update(namespace="other"), "namespace is not supported"),
        (lambda s: s["target"].update(namespace="other"), "spec.target.namespace: unknown"),
    ],
)
def test_schema_rejects(change: Callable[[Any], None], expected: str) -> None:
    errors = admit(_mutated(change))
    assert any(expected in e for e in errors), errors


def test_schema_accepts_blob_key_with_blob_format() -> None:
    obj = _mutated(lambda s: s["target"].update(template={"format": "Dotenv", "key": "x.env"}))
    assert admit(obj) == []
