"""The HimitsuSecret resource: spec and status as typed values parsed from raw JSON dicts.

* The one place that knows the objects' shape; parsing applies the contract's defaults.
* Every CRD rule is checked again (an apiserver may lack our schema, an old object
  predate it, a pattern miss a case), reported as InvalidSpec saying what to fix.
"""

from __future__ import annotations

import hashlib
import json
import re
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

GROUP = "himitsu.io"
VERSION = "v1alpha1"
KIND = "HimitsuSecret"
PLURAL = "himitsusecrets"
API_VERSION = f"{GROUP}/{VERSION}"

# On every Secret we write: the Secret informer selects on it (never caching every Secret).
LABEL_MANAGED = "himitsu.io/managed"
LABEL_MANAGED_BY = "app.kubernetes.io/managed-by"
MANAGED_BY_VALUE = "himitsu-operator"

ANN_OWNED_BY = "himitsu.io/owned-by"
ANN_CONFIG_VERSION = "himitsu.io/config-version"
ANN_PROJECT_ID = "himitsu.io/project-id"
ANN_ENVIRONMENT_ID = "himitsu.io/environment-id"
ANN_SOURCE = "himitsu.io/source-hash"
ANN_DATA_HASH = "himitsu.io/data-hash"
ANN_MANAGED_KEYS = "himitsu.io/managed-keys"
# Beside owned-by, the writer's uid: a name is reused, a uid never is (sync.target).
ANN_OWNER_UID = "himitsu.io/owner-uid"
# The uid a Secret was created for, set on create only: no later writer inherits it.
ANN_CREATED_FOR = "himitsu.io/created-for"
# The template's label and annotation keys applied, so only those are ever removed.
ANN_TEMPLATE_LABELS = "himitsu.io/template-labels"
ANN_TEMPLATE_ANNOTATIONS = "himitsu.io/template-annotations"
# On a Secret, by whoever may write it: the HimitsuSecrets ("a,b" or "*") that may merge in.
ANN_ALLOW_MERGE_BY = "himitsu.io/allow-merge-by"
# On the HimitsuSecret: any new value forces one full fetch.
ANN_FORCE_SYNC = "himitsu.io/force-sync"
ANN_RESTARTED_AT = "himitsu.io/restartedAt"  # on a pod template, as kubectl rollout restart
# On a workload: "<HimitsuSecret>=<data id>,...", the data its pods started with.
ANN_STARTED_WITH = "himitsu.io/started-with"
# On a workload, by its owner: HimitsuSecrets that may restart it although its pods do
# not read their Secret (sync.restarts).
ANN_ALLOW_RESTART_BY = "himitsu.io/allow-restart-by"
# On a target: a random id the operator stamps whenever it writes other bytes.
ANN_DATA_ID = "himitsu.io/data-id"
# Beside it, written with each new id: ``data_id_check`` of the id and the data, so an id
# edited by hand is told from one the operator wrote, and the records checked against it.
ANN_DATA_ID_CHECK = "himitsu.io/data-id-check"
# On a token Secret, by its owner: URL prefixes the token may go to (narrows, never widens).
ANN_ALLOWED_API_URLS = "himitsu.io/allowed-api-urls"
ANN_LAST_APPLIED = "kubectl.kubernetes.io/last-applied-configuration"  # values included
# Dropped from the informers' cache (sync.summary), so a template may not set them: the
# operator would take its own stamp for pruned at every poll.
DROPPED_ANNOTATIONS = frozenset({ANN_LAST_APPLIED})

# Template keys refused: written onto a Merge target, the operator's stamps could rebind
# another team's token or make a Secret look created by the operator.
_RESERVED_KEY_RE = re.compile(r"^([^/]*[.])?himitsu[.]io/")
# The token controller's: set on a Merge target, they would make it any ServiceAccount's token.
_SERVICE_ACCOUNT_PREFIX = "kubernetes.io/service-account."

FORMATS = ("KeyValue", "Dotenv", "Json")
POLICIES = ("Owner", "Merge")
MAX_REFRESH_SECONDS = 366 * 24 * 3600.0
# The shortest poll cadence but 0 (below it a token's whole budget goes to one object).
MIN_REFRESH_SECONDS = 1.0

WORKLOAD_KINDS = ("Deployment", "StatefulSet", "DaemonSet")
MAX_ROLLOUT_TARGETS = 16
DEFAULT_MIN_RESTART_SECONDS = 60.0
MAX_MIN_RESTART_SECONDS = 24 * 3600.0

_UUID = re.compile(r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}")
_DNS_SUBDOMAIN_RE = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_DATA_KEY_RE = re.compile(r"^[-._a-zA-Z0-9]+$")
# Label and annotation keys and label values (the CRD types them as plain strings).
_QUALIFIED_NAME_RE = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")
_LABEL_VALUE_RE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
MAX_ANNOTATIONS_BYTES = 256 * 1024
# [0-9], not \d: Go accepts ASCII digits only, and \d would let float() read any script's.
_DURATION_PART_RE = re.compile(r"([0-9]+(?:\.[0-9]*)?|\.[0-9]+)(ns|us|µs|μs|ms|s|m|h)")
_UNIT_NS = {
    "ns": 1, "us": 10**3, "µs": 10**3, "μs": 10**3,
    "ms": 10**6, "s": 10**9, "m": 60 * 10**9, "h": 3600 * 10**9,
}
_GO_MAX_NS = 1 << 63  # Go's durations are int64 nanoseconds


class InvalidSpec(ValueError):
    """The HimitsuSecret cannot be acted on as written; the message says what to change."""


def parse_duration(text: str, what: str = "refreshInterval") -> float:
    """Seconds of a Go duration (``0``, ``30s``, ``1h30m``, ``500ms``), as Kubernetes users
    write them; a sign is refused. ``what``: the field the messages name."""
    raw = text.strip()
    if raw in ("0", "+0"):
        return 0.0
    if not raw:
        raise InvalidSpec(f"{what} is empty; use a Go duration such as 30s, 1m or 1h")
    if raw.startswith("-"):
        raise InvalidSpec(f"{what} {_show(raw)} is negative; use 0 to sync once")
    body = raw[1:] if raw.startswith("+") else raw
    total = 0
    pos = 0
    while pos < len(body):
        match = _DURATION_PART_RE.match(body, pos)
        if match is None:
            raise InvalidSpec(
                f"{what} {_show(raw)} is not a Go duration; use forms like 30s, 1m, 1h30m")
        total += _go_part_ns(match.group(1), _UNIT_NS[match.group(2)])
        pos = match.end()
        if total > _GO_MAX_NS:
            break
    if total > MAX_REFRESH_SECONDS * 10**9:
        raise InvalidSpec(f"{what} {_show(raw)} is longer than a year")
    return total / 10**9


def _go_part_ns(number: str, unit: int) -> int:
    """One ``<number><unit>`` in nanoseconds exactly as Go's time.ParseDuration (and CEL's
    duration()) adds it up: "24h0.1ns" is 24h to both; above 2**63 Go refuses it."""
    whole, _, fraction = number.partition(".")
    if len(whole.lstrip("0")) > 19:
        return _GO_MAX_NS + 1  # past int64 (and past Python's int() digit limit)
    ns = int(whole or "0") * unit
    digits, scale = 0, 1.0
    for char in fraction:
        if digits > _GO_MAX_NS // 10:
            break  # Go drops the digits that would overflow
        grown = digits * 10 + int(char)
        if grown > _GO_MAX_NS:
            break
        digits, scale = grown, scale * 10
    if digits:
        ns += int(float(digits) * (float(unit) / scale))
    return ns


def parse_refresh_interval(spec: Mapping[str, Any]) -> float:
    """``spec.refreshInterval`` in seconds: 0 (sync once), or from 1s to a year."""
    raw = spec.get("refreshInterval", "1m")
    if not isinstance(raw, str):
        raise InvalidSpec("refreshInterval must be a string such as 1m")
    seconds = parse_duration(raw)
    if 0 < seconds < MIN_REFRESH_SECONDS:
        raise InvalidSpec(
            f"refreshInterval {_show(raw.strip())} is shorter than 1s, the shortest poll "
            "cadence; use 1s or more, or 0 to sync once")
    return seconds


def format_duration(seconds: float) -> str:
    """Render seconds the way Go would print a whole-second duration (for messages)."""
    whole = round(seconds)
    hours, rest = divmod(whole, 3600)
    minutes, secs = divmod(rest, 60)
    out = (f"{hours}h" if hours else "") + (f"{minutes}m" if minutes else "")
    return out + (f"{secs}s" if secs or not out else "")


@dataclass(frozen=True)
class Template:
    format: str = "KeyValue"
    key: str | None = None
    labels: Mapping[str, str] = field(default_factory=dict)
    annotations: Mapping[str, str] = field(default_factory=dict)

    @property
    def data_key(self) -> str | None:
        """The single data key of a blob format, defaulted; None for KeyValue."""
        if self.format == "KeyValue":
            return None
        if self.key:
            return self.key
        return ".env" if self.format == "Dotenv" else "config.json"


@dataclass(frozen=True)
class Target:
    name: str
    type: str = "Opaque"
    creation_policy: str = "Owner"
    template: Template = field(default_factory=Template)


@dataclass(frozen=True)
class RolloutTarget:
    """A workload to restart when the target's data changes. ``kind`` outside
    WORKLOAD_KINDS is kept (and reported, never restarted): the sync stays Ready."""

    kind: str
    name: str

    @property
    def supported(self) -> bool:
        return self.kind in WORKLOAD_KINDS


@dataclass(frozen=True)
class Rollout:
    targets: tuple[RolloutTarget, ...] = ()
    on_create: bool = False  # restart on the target's first sync too
    min_interval: float = DEFAULT_MIN_RESTART_SECONDS  # the batching window


@dataclass(frozen=True)
class Spec:
    api_url: str
    project_id: str
    environment_id: str
    auth_secret_name: str
    auth_secret_key: str
    refresh_interval: float
    target: Target
    rollout: Rollout = field(default_factory=Rollout)

    def source_hash(self) -> str:
        """Fingerprint of what decides the target's data; a target recorded with another
        was written for another source, and a conditional request would be unsafe."""
        parts = (
            self.api_url, self.project_id.lower(), self.environment_id.lower(),
            self.target.template.format, self.target.template.data_key or "",
            self.target.creation_policy, self.target.type,
        )
        return hashlib.sha256("\x00".join(parts).encode()).hexdigest()[:32]


@dataclass(frozen=True)
class Condition:
    type: str
    status: str
    reason: str
    message: str
    last_transition_time: str
    observed_generation: int | None = None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "type": self.type, "status": self.status, "reason": self.reason,
            "message": self.message, "lastTransitionTime": self.last_transition_time,
        }
        if self.observed_generation is not None:
            out["observedGeneration"] = self.observed_generation
        return out


@dataclass(frozen=True)
class Status:
    config_version: int | None = None
    secret_count: int | None = None
    last_sync_time: str | None = None
    observed_generation: int | None = None
    last_force_sync: str | None = None
    ready: Condition | None = None


def parse_spec(obj: Mapping[str, Any]) -> Spec:
    """Parse and default a HimitsuSecret's spec; InvalidSpec names the first bad field."""
    spec = _mapping(obj.get("spec"), "spec")
    api_url = _required_str(spec, "apiUrl")
    project_id = _uuid_field(spec, "projectId")
    environment_id = _uuid_field(spec, "environmentId")
    auth = _mapping(spec.get("authSecretRef"), "spec.authSecretRef")
    auth_name = _required_str(auth, "name", "authSecretRef.name")
    if not _DNS_SUBDOMAIN_RE.match(auth_name) or len(auth_name) > 253:
        raise InvalidSpec(f"authSecretRef.name {_show(auth_name)} is not a valid Secret name")
    if "namespace" in auth and auth["namespace"] not in (None, "", _namespace(obj)):
        raise InvalidSpec(
            "authSecretRef.namespace is not supported: the token Secret must live in the "
            "HimitsuSecret's own namespace"
        )
    auth_key = _optional_str(auth, "key", "authSecretRef.key") or "token"
    if not _is_data_key(auth_key):
        raise InvalidSpec(f"authSecretRef.key {_show(auth_key)} is not a valid Secret data key")
    refresh = parse_refresh_interval(spec)
    target = _parse_target(_mapping(spec.get("target"), "spec.target"))
    if target.name == auth_name:
        raise InvalidSpec(
            "target.name must differ from authSecretRef.name: the operator would write "
            "Himitsu secrets into the Secret that holds its own token"
        )
    return Spec(
        api_url=api_url, project_id=project_id, environment_id=environment_id,
        auth_secret_name=auth_name, auth_secret_key=auth_key, refresh_interval=refresh,
        target=target, rollout=_parse_rollout(spec),
    )


def _parse_rollout(spec: Mapping[str, Any]) -> Rollout:
    raw = spec.get("rolloutRestartTargets")
    if raw is None:
        raw = []
    if not isinstance(raw, list):
        raise InvalidSpec("rolloutRestartTargets must be a list of {kind, name}")
    if len(raw) > MAX_ROLLOUT_TARGETS:
        raise InvalidSpec(f"rolloutRestartTargets has {len(raw)} entries; at most "
                          f"{MAX_ROLLOUT_TARGETS} are allowed")
    found: list[RolloutTarget] = []
    for i, item in enumerate(raw):
        where = f"rolloutRestartTargets[{i}]"
        entry = _mapping(item, where)
        kind = _required_str(entry, "kind", f"{where}.kind")
        name = _required_str(entry, "name", f"{where}.name")
        if len(name) > 253 or not _DNS_SUBDOMAIN_RE.fullmatch(name):
            raise InvalidSpec(f"{where}.name {_show(name)} is not a valid workload name "
                              "(lowercase DNS subdomain)")
        if any(t.kind == kind and t.name == name for t in found):
            raise InvalidSpec(f"{where} names {kind} {name!r} twice")
        found.append(RolloutTarget(kind=kind, name=name))
    on_create = spec.get("rolloutRestartOnCreate", False)
    if not isinstance(on_create, bool):
        raise InvalidSpec("rolloutRestartOnCreate must be true or false")
    text = spec.get("minRestartInterval", "1m")
    if not isinstance(text, str):
        raise InvalidSpec("minRestartInterval must be a string such as 1m")
    window = parse_duration(text, "minRestartInterval")
    if window > MAX_MIN_RESTART_SECONDS:
        raise InvalidSpec(f"minRestartInterval {_show(text.strip())} is longer than 24h")
    return Rollout(targets=tuple(found), on_create=on_create, min_interval=window)


def _parse_target(target: Mapping[str, Any]) -> Target:
    name = _required_str(target, "name", "target.name")
    if len(name) > 253 or not _DNS_SUBDOMAIN_RE.match(name):
        raise InvalidSpec(
            f"target.name {_show(name)} is not a valid Secret name (lowercase DNS subdomain)"
        )
    secret_type = _optional_str(target, "type", "target.type") or "Opaque"
    if len(secret_type) > 253 or any(c.isspace() for c in secret_type):
        raise InvalidSpec(f"target.type {_show(secret_type)} is not a valid Secret type")
    policy = _optional_str(target, "creationPolicy", "target.creationPolicy") or "Owner"
    if policy not in POLICIES:
        raise InvalidSpec(f"target.creationPolicy {_show(policy)} must be Owner or Merge")
    tpl = _mapping(target.get("template") or {}, "target.template")
    fmt = _optional_str(tpl, "format", "target.template.format") or "KeyValue"
    if fmt not in FORMATS:
        raise InvalidSpec(f"target.template.format {_show(fmt)} must be KeyValue, Dotenv or Json")
    key = _optional_str(tpl, "key", "target.template.key") or None
    if key is not None and not _is_data_key(key):
        raise InvalidSpec(f"target.template.key {_show(key)} is not a valid Secret data key")
    if key is not None and fmt == "KeyValue":
        raise InvalidSpec("target.template.key applies only to the Dotenv and Json formats; "
                          "KeyValue writes one data key per Himitsu secret")
    template = Template(
        format=fmt, key=key,
        labels=_labels(tpl.get("labels")),
        annotations=_annotations(tpl.get("annotations")),
    )
    return Target(name=name, type=secret_type, creation_policy=policy, template=template)


def parse_status(obj: Mapping[str, Any]) -> Status:
    """Read our own status back, leniently: a malformed status only costs a full fetch."""
    raw = obj.get("status")
    if not isinstance(raw, Mapping):
        return Status()
    ready = None
    conditions = raw.get("conditions")
    for cond in conditions if isinstance(conditions, list) else []:
        if isinstance(cond, Mapping) and cond.get("type") == "Ready":
            ready = Condition(
                type="Ready", status=str(cond.get("status", "Unknown")),
                reason=str(cond.get("reason", "")), message=str(cond.get("message", "")),
                last_transition_time=str(cond.get("lastTransitionTime", "")),
                observed_generation=_int_or_none(cond.get("observedGeneration")),
            )
    force = raw.get("lastForceSync")
    last_sync = raw.get("lastSyncTime")
    return Status(
        config_version=_int_or_none(raw.get("configVersion")),
        secret_count=_int_or_none(raw.get("secretCount")),
        last_sync_time=last_sync if isinstance(last_sync, str) else None,
        observed_generation=_int_or_none(raw.get("observedGeneration")),
        last_force_sync=force if isinstance(force, str) else None,
        ready=ready,
    )


def parse_time(value: str | None) -> datetime | None:
    """Parse an RFC 3339 timestamp as Kubernetes writes it; None when absent or unreadable."""
    if not value:
        return None
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None


def force_sync_value(obj: Mapping[str, Any]) -> str | None:
    annotations = (obj.get("metadata") or {}).get("annotations") or {}
    value = annotations.get(ANN_FORCE_SYNC)
    return value if isinstance(value, str) else None


def _namespace(obj: Mapping[str, Any]) -> str:
    return str((obj.get("metadata") or {}).get("namespace") or "")


def _show(value: str, limit: int = 64) -> str:
    """Quote user input for a message, bounded, so a huge or odd value cannot flood a status."""
    shown = value if len(value) <= limit else value[:limit] + "…"
    return repr(shown)


def _mapping(value: Any, where: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise InvalidSpec(f"{where} is missing or not an object")
    return value


def _required_str(obj: Mapping[str, Any], key: str, where: str | None = None) -> str:
    value = obj.get(key)
    if not isinstance(value, str) or not value.strip():
        raise InvalidSpec(f"{where or key} is required")
    return value.strip()


def _optional_str(obj: Mapping[str, Any], key: str, where: str) -> str | None:
    value = obj.get(key)
    if value is None:
        return None
    if not isinstance(value, str):
        raise InvalidSpec(f"{where} must be a string")
    return value.strip()


def _uuid_field(obj: Mapping[str, Any], key: str) -> str:
    value = _required_str(obj, key)
    if not _UUID.fullmatch(value):
        raise InvalidSpec(f"{key} {_show(value)} is not a UUID; copy it from the Himitsu console")
    return str(uuid.UUID(value))


def _string_map(value: Any, where: str) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, Mapping) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in value.items()
    ):
        raise InvalidSpec(f"{where} must map strings to strings")
    return dict(value)


def _is_data_key(key: str) -> bool:
    """Kubernetes' rule for Secret data keys (IsConfigMapKey)."""
    return len(key) <= 253 and bool(_DATA_KEY_RE.fullmatch(key)) and key != "." \
        and not key.startswith("..")


def _is_qualified_name(key: str) -> bool:
    # fullmatch, not match: "$" also matches before a trailing newline.
    prefix, slash, name = key.rpartition("/")
    if slash and (len(prefix) > 253 or not _DNS_SUBDOMAIN_RE.fullmatch(prefix)):
        return False
    return len(name) <= 63 and bool(_QUALIFIED_NAME_RE.fullmatch(name))


def is_reserved_key(key: str) -> bool:
    """A label or annotation key only the operator, or a token Secret's owner, writes:
    anything under ``himitsu.io/`` (or a subdomain of it) and ``app.kubernetes.io/managed-by``."""
    return key == LABEL_MANAGED_BY or bool(_RESERVED_KEY_RE.match(key))


def _refuse_reserved(key: str, where: str) -> None:
    if is_reserved_key(key):
        raise InvalidSpec(
            f"{where} key {_show(key)} is reserved: himitsu.io/ keys and "
            f"{LABEL_MANAGED_BY} are written by himitsu-operator (and a token Secret's "
            "owner) only; use a key under a domain of your own")


def _labels(value: Any) -> dict[str, str]:
    labels = _string_map(value, "target.template.labels")
    for key, text in labels.items():
        if not _is_qualified_name(key):
            raise InvalidSpec(f"target.template.labels key {_show(key)} is not a valid label key")
        _refuse_reserved(key, "target.template.labels")
        if len(text) > 63 or not _LABEL_VALUE_RE.fullmatch(text):
            raise InvalidSpec(
                f"target.template.labels value {_show(text)} of {_show(key)} is not a valid "
                "label value (at most 63 letters, digits, '-', '_' or '.')"
            )
    return labels


def _annotations(value: Any) -> dict[str, str]:
    annotations = _string_map(value, "target.template.annotations")
    for key in annotations:
        if not _is_qualified_name(key):
            raise InvalidSpec(
                f"target.template.annotations key {_show(key)} is not a valid annotation key")
        _refuse_reserved(key, "target.template.annotations")
        if key.startswith(_SERVICE_ACCOUNT_PREFIX):
            raise InvalidSpec(
                f"target.template.annotations key {_show(key)} is reserved: "
                f"{_SERVICE_ACCOUNT_PREFIX}* annotations are Kubernetes' token controller's")
        if key in DROPPED_ANNOTATIONS:
            raise InvalidSpec(
                f"target.template.annotations key {_show(key)} is kubectl's own record of "
                "the last kubectl apply: a template may not set it (it would mislead the "
                "next kubectl apply of the Secret)")
    size = sum(len(k.encode()) + len(v.encode()) for k, v in annotations.items())
    if size > MAX_ANNOTATIONS_BYTES:
        raise InvalidSpec("target.template.annotations exceed Kubernetes' 256 KiB limit")
    return annotations


def _int_or_none(value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, str) and value.isascii() and value.isdigit():
        return int(value)
    return None


def data_id_check(data_id: str, digest: str) -> str:
    """Binds a data id to the ``data_hash`` of the data it was minted for (on the target
    only: it is derived from the data)."""
    return hashlib.sha256(f"{data_id}\n{digest}".encode()).hexdigest()[:16]


def data_hash(data: Mapping[str, str]) -> str:
    """sha256 hex of Secret ``data`` (base64 values): the compact ASCII JSON of its sorted
    ``[key, value]`` pairs. Recorded on objects, so a known-answer test pins it."""
    pairs = sorted(data.items())
    canonical = json.dumps(pairs, ensure_ascii=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode("ascii")).hexdigest()
