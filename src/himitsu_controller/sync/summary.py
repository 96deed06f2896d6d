"""What the informers keep of each object: only what the reconcile reads (their transforms).

* A Secret's summary: its metadata, type, sorted keys and one keyed digest of the
  operator's values, never a value; a write reads the Secret afresh.
* A HimitsuSecret keeps its spec, status and the metadata the reconcile reads.

Design: docs/design/targets.md
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import sys
from collections.abc import Mapping, Sequence
from typing import Any, TypeGuard

from himitsu_controller import api

__all__ = ["DIGEST", "SHARED", "himitsu_secret", "holds_hash", "is_summary", "keys_of",
           "secret"]

# The field a summary holds instead of ``data`` (no Kubernetes object has it).
DIGEST = "himitsu.io/data-digest"
LAST_APPLIED = api.ANN_LAST_APPLIED
# This process's digest key: no digest outlives it, none is compared across processes.
_KEY = secrets.token_bytes(32)
# Fields whose values many cached objects hold alike (interned by the informer).
SHARED = frozenset({
    "apiVersion", "kind", "namespace", "type", "apiUrl", "projectId", "environmentId",
    "refreshInterval", "creationPolicy", "format", "key", "status", "reason",
    "lastSyncTime", "lastTransitionTime", "ours", api.LABEL_MANAGED,
    api.LABEL_MANAGED_BY, api.ANN_PROJECT_ID, api.ANN_ENVIRONMENT_ID, api.ANN_CONFIG_VERSION,
    api.ANN_SOURCE, api.ANN_DATA_HASH, api.ANN_MANAGED_KEYS,
})
_HSEC_METADATA = ("name", "namespace", "uid", "resourceVersion", "generation",
                  "annotations", "deletionTimestamp")
_SECRET_METADATA = ("name", "namespace", "uid", "resourceVersion", "labels", "annotations",
                    "ownerReferences", "deletionTimestamp")


def secret(obj: dict[str, Any]) -> dict[str, Any]:
    """A Secret as the Secret informer keeps it (an informer transform)."""
    meta = obj.get("metadata")
    meta = meta if isinstance(meta, dict) else {}
    kept = {k: meta[k] for k in _SECRET_METADATA if k in meta}
    annotations = _without_dropped(meta.get("annotations"))
    if annotations is not None:
        kept["annotations"] = annotations
    raw = obj.get("data")
    data: Mapping[str, Any] = raw if isinstance(raw, dict) else {}
    keys = sorted(data)
    digested = _digested_keys(annotations or {}, keys)
    return {
        "apiVersion": obj.get("apiVersion", "v1"), "kind": obj.get("kind", "Secret"),
        "metadata": kept, "type": obj.get("type", "Opaque"),
        # One string (data keys hold no ","), shared by every target with the same keys.
        DIGEST: {"keys": sys.intern(",".join(str(k) for k in keys)),
                 "ours": None if digested is None else _keyed(
                     api.data_hash({k: data[k] for k in digested if k in data}))},
    }


def himitsu_secret(obj: dict[str, Any]) -> dict[str, Any]:
    """A HimitsuSecret as its informer keeps it (in place: the decoded dict is ours)."""
    meta = obj.get("metadata")
    if isinstance(meta, dict):
        kept = {k: meta[k] for k in _HSEC_METADATA if k in meta}
        annotations = _without_dropped(meta.get("annotations"))
        if annotations is not None:
            kept["annotations"] = annotations
        obj["metadata"] = kept
    return obj


def is_summary(obj: Mapping[str, Any] | None) -> TypeGuard[Mapping[str, Any]]:
    return obj is not None and DIGEST in obj


def keys_of(obj: Mapping[str, Any]) -> list[str]:
    """The sorted data keys of a Secret or of its summary."""
    if is_summary(obj):
        joined = str(obj[DIGEST]["keys"])
        return joined.split(",") if joined else []
    return sorted((obj.get("data") or {}).keys())


def holds_hash(obj: Mapping[str, Any], keys: Sequence[str], recorded: str) -> bool:
    """Do the values of ``obj``'s ``keys`` have ``api.data_hash`` ``recorded``? Of a
    summary, known only for the keys its digest covers (False else)."""
    if not is_summary(obj):
        data = obj.get("data") or {}
        return api.data_hash({k: data[k] for k in keys if k in data}) == recorded
    digest = obj[DIGEST]["ours"]
    annotations = (obj.get("metadata") or {}).get("annotations") or {}
    return (digest is not None and sorted(keys) == _digested_keys(annotations, keys_of(obj))
            and _keyed(recorded) == digest)


def _digested_keys(annotations: Mapping[str, Any], keys: list[str]) -> list[str] | None:
    """The keys whose values a summary digests: its managed-keys record, or all of them
    for an Owner target (owned, no record); None: none of its values is ours."""
    if api.ANN_MANAGED_KEYS in annotations:
        return sorted({k for k in str(annotations[api.ANN_MANAGED_KEYS]).split(",") if k})
    return keys if annotations.get(api.ANN_OWNED_BY) else None


def _keyed(hashed: str) -> str:
    # (surrogatepass: an annotation edited by hand may hold anything; it then matches nothing)
    return hmac.new(_KEY, hashed.encode("utf-8", "surrogatepass"), hashlib.sha256).hexdigest()


def _without_dropped(annotations: Any) -> dict[str, Any] | None:
    """The annotations but ``api.DROPPED_ANNOTATIONS`` (None: there are none)."""
    if not isinstance(annotations, dict):
        return None
    if api.DROPPED_ANNOTATIONS.isdisjoint(annotations):
        return annotations
    return {k: v for k, v in annotations.items() if k not in api.DROPPED_ANNOTATIONS}
