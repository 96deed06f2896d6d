"""What the apiserver would refuse in a target Secret, checked before anything is written.

The type's required keys and the size limits (InvalidSpec naming keys or sizes, never a
value); no service-account-token Secret is created; where Python cannot judge as Go does,
the apiserver decides.

Design: docs/design/targets.md
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Collection, Mapping
from typing import Any

from himitsu_controller import api
from himitsu_controller.sync.target.render import MAX_SECRET_BYTES, quote

__all__ = ["MAX_ANNOTATION_BYTES", "Unwritable", "check"]

MAX_ANNOTATION_BYTES = 256 * 1024  # apimachinery's TotalAnnotationSizeLimitB

SERVICE_ACCOUNT_TOKEN = "kubernetes.io/service-account-token"  # noqa: S105 (a type name)
_REQUIRED = {  # type -> data keys that must all be present
    "kubernetes.io/tls": ("tls.crt", "tls.key"),
    "kubernetes.io/ssh-auth": ("ssh-privatekey",),  # and not empty
    "kubernetes.io/dockercfg": (".dockercfg",),  # and a JSON object
    "kubernetes.io/dockerconfigjson": (".dockerconfigjson",),  # and a JSON object
}
_ONE_OF = {"kubernetes.io/basic-auth": ("username", "password")}
_JSON_KEYS = frozenset({".dockercfg", ".dockerconfigjson"})
_NAMED = 3  # keys named in a message
# The annotations targets.desired_secret writes whatever the template (sized in messages).
_STAMPS = frozenset({api.ANN_OWNED_BY, api.ANN_CONFIG_VERSION, api.ANN_PROJECT_ID,
                     api.ANN_ENVIRONMENT_ID, api.ANN_SOURCE, api.ANN_DATA_HASH,
                     api.ANN_MANAGED_KEYS, api.ANN_DATA_ID, api.ANN_DATA_ID_CHECK})


class Unwritable(ValueError):
    """The apiserver would refuse this Secret; the message names keys and sizes only."""


def check(secret: Mapping[str, Any], *, ours: Collection[str], creating: bool) -> None:
    """Raise Unwritable when the apiserver would refuse ``secret``; ``ours``: the keys
    from Himitsu (for messages); ``creating``: a create or a replacement, not an update."""
    _check_type(secret, ours=ours, creating=creating)
    _check_sizes(secret, ours=ours)


def _check_type(secret: Mapping[str, Any], *, ours: Collection[str], creating: bool) -> None:
    kind = str(secret.get("type") or "Opaque")
    data: Mapping[str, str] = secret.get("data") or {}
    name = _name(secret)
    if kind == SERVICE_ACCOUNT_TOKEN and creating:
        raise Unwritable(
            f"target.type {kind!r} is not supported: Kubernetes' token controller writes "
            "such Secrets and deletes them with their ServiceAccount; use Opaque")
    if kind in _ONE_OF and not set(_ONE_OF[kind]) & set(data):
        wanted = " or ".join(repr(k) for k in _ONE_OF[kind])
        raise Unwritable(
            f"target.type {kind!r} needs data key {wanted}, which Secret {name!r} would "
            f"not hold ({_held(data, ours)}); {_HINT}")
    required = _REQUIRED.get(kind, ())
    missing = [k for k in required if k not in data]
    if kind == "kubernetes.io/ssh-auth" and not missing and not data["ssh-privatekey"]:
        raise Unwritable(f"target.type {kind!r} needs a non-empty data key 'ssh-privatekey'; "
                         f"it would be empty in Secret {name!r}")
    if missing:
        needs = ("data keys " if len(required) > 1 else "data key ") + " and ".join(
            repr(k) for k in required)
        lacks = ", ".join(repr(k) for k in missing)
        raise Unwritable(
            f"target.type {kind!r} needs {needs}; Secret {name!r} would lack "
            f"{lacks} ({_held(data, ours)}); {_HINT}")
    for key in _JSON_KEYS.intersection(required):
        if not _json_object(data[key]):
            raise Unwritable(f"target.type {kind!r} needs data key {key!r} to hold a JSON "
                             f"object; in Secret {name!r} it would not")


_HINT = ("name the Himitsu keys so the template renders these data keys (KeyValue writes "
         "each Himitsu key as it is), or choose another target.type")


def _check_sizes(secret: Mapping[str, Any], *, ours: Collection[str]) -> None:
    """Sizes shown are of what we write only (another's would be a length oracle)."""
    data: Mapping[str, str] = secret.get("data") or {}
    sizes = {k: _decoded_size(v) for k, v in data.items()}
    name = _name(secret)
    if sum(sizes.values()) > MAX_SECRET_BYTES:
        mine = sum(n for k, n in sizes.items() if k in ours)
        others = (", and the keys himitsu-operator does not manage count too"
                  if len(sizes) > len(set(ours) & set(sizes)) else "")
        raise Unwritable(
            f"Secret {name!r} would exceed the 1 MiB ({MAX_SECRET_BYTES} bytes) Kubernetes "
            f"Secret limit: the data from Himitsu is {mine} bytes{others}")
    annotations: Mapping[str, str] = (secret.get("metadata") or {}).get("annotations") or {}
    if sum(len(k.encode()) + len(v.encode()) for k, v in annotations.items()) \
            > MAX_ANNOTATION_BYTES:
        stamps = sum(len(k.encode()) + len(v.encode())
                     for k, v in annotations.items() if k in _STAMPS)
        record = annotations.get(api.ANN_MANAGED_KEYS)
        of_which = "" if record is None else (
            f", {len(api.ANN_MANAGED_KEYS) + len(record.encode())} of them the "
            f"{api.ANN_MANAGED_KEYS} record of {len(ours)} key names (a Dotenv or Json "
            "template writes one key)")
        raise Unwritable(
            f"the annotations of Secret {name!r} would exceed the 256 KiB "
            f"({MAX_ANNOTATION_BYTES} bytes) Kubernetes limit for all annotations together: "
            f"himitsu-operator's own take {stamps} bytes{of_which}; "
            "target.template.annotations and the Secret's other annotations count too")


def _held(data: Mapping[str, str], ours: Collection[str]) -> str:
    """The keys from Himitsu, by name; a Merge target's others only as "others"."""
    ordered = sorted(k for k in data if k in ours)
    others = " and keys himitsu-operator does not manage" if len(ordered) < len(data) else ""
    if not ordered:
        return f"it would hold no keys from Himitsu{others}"
    shown = ", ".join(quote(k) for k in ordered[:_NAMED])
    more = f" and {len(ordered) - _NAMED} more" if len(ordered) > _NAMED else ""
    return f"it would hold {shown}{more} from Himitsu{others}"


def _name(secret: Mapping[str, Any]) -> str:
    return str((secret.get("metadata") or {}).get("name", ""))


def _decoded_size(value: str) -> int:
    try:
        return len(base64.b64decode(value, validate=True))
    except (binascii.Error, ValueError):
        return len(value)  # not ours to judge; the apiserver will say


def _json_object(value: str) -> bool:
    """False only when Go's ``json.Unmarshal`` into a map surely fails."""
    try:
        raw = base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        return False
    # Go replaces invalid UTF-8 in a string with U+FFFD; a BOM it refuses (so does
    # json.loads); NaN and Infinity it refuses (json.loads takes them).
    text = raw.decode("utf-8", errors="replace")
    try:
        return isinstance(json.loads(text, parse_constant=_no_constant), dict | None)
    except json.JSONDecodeError:
        return False
    except (RecursionError, ValueError):  # deeper than Python's stack; a 5000-digit int
        return True


def _no_constant(name: str) -> Any:
    raise json.JSONDecodeError(f"{name} is not JSON", name, 0)
