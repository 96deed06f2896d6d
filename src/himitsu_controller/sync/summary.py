"""What the informers keep of each object: only what the reconcile reads (their transforms).

A Secret informer that cached whole Secrets would hold every value of every target in
memory for the life of the process (and a ``kubectl apply``'d Secret carries its values a
second time, in the last-applied annotation). The reconcile needs none of them to decide
anything: whether a target still holds what we wrote is a comparison of digests, and the
values matter only to a write built on top of the target (a Merge target's foreign keys,
the old Secret a type change puts back), which reads the Secret afresh at that moment
(``writes.write``). So the Secret informer keeps a *summary*: the metadata the reconcile
reads, the type, and instead of ``data`` its sorted keys and two digests
(``render.data_hash``): of all of it, and of the keys the Secret's own
``himitsu.io/managed-keys`` names (a Merge target's part). ``targets`` reads summaries
and whole Secrets alike; a summary is never the base of a write.

The HimitsuSecret informer keeps its spec and status whole and of its metadata what the
reconcile reads (no labels, no creationTimestamp, no last-applied annotation; the
runtime drops managedFields of every informer). Both share the strings that repeat from
object to object (``SHARED``: the runtime interns those fields' values, and every key).
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from typing import Any, TypeGuard

from himitsu_controller import api
from himitsu_controller.sync.render import data_hash

__all__ = ["DIGEST", "SHARED", "hash_over", "himitsu_secret", "is_summary", "keys_of", "secret"]

# The field a summary holds instead of ``data`` (no Kubernetes object has it).
DIGEST = "himitsu.io/data-digest"
LAST_APPLIED = "kubectl.kubernetes.io/last-applied-configuration"
# Fields whose values many cached objects hold alike: a source's fields, our stamps, the
# Ready condition's words, the digests of data that many targets hold.
SHARED = frozenset({
    "apiVersion", "kind", "namespace", "type", "apiUrl", "projectId", "environmentId",
    "refreshInterval", "creationPolicy", "format", "key", "status", "reason",
    "lastSyncTime", "lastTransitionTime", "all", "managed", api.LABEL_MANAGED,
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
    annotations = _without_last_applied(meta.get("annotations"))
    if annotations is not None:
        kept["annotations"] = annotations
    raw = obj.get("data")
    data: Mapping[str, Any] = raw if isinstance(raw, dict) else {}
    managed = annotations.get(api.ANN_MANAGED_KEYS, "") if annotations else ""
    ours = {k: data[k] for k in {k for k in str(managed).split(",") if k} if k in data}
    digest_all = data_hash(data)
    digest_ours = data_hash(ours)
    summary: dict[str, Any] = {
        "apiVersion": obj.get("apiVersion", "v1"), "kind": obj.get("kind", "Secret"),
        "metadata": kept, "type": obj.get("type", "Opaque"),
        # One string (data keys hold no ","), shared by every target with the same keys.
        DIGEST: {"keys": sys.intern(",".join(sorted(str(k) for k in data))), "all": digest_all,
                 # one string when both are the same (an Owner target: no managed keys)
                 "managed": digest_all if digest_ours == digest_all else digest_ours},
    }
    return summary


def himitsu_secret(obj: dict[str, Any]) -> dict[str, Any]:
    """A HimitsuSecret as its informer keeps it (in place: the decoded dict is ours)."""
    meta = obj.get("metadata")
    if isinstance(meta, dict):
        kept = {k: meta[k] for k in _HSEC_METADATA if k in meta}
        annotations = _without_last_applied(meta.get("annotations"))
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


def hash_over(obj: Mapping[str, Any], keys: Sequence[str]) -> str | None:
    """``render.data_hash`` of the ``keys`` of ``obj`` that it holds. Of a summary, only
    for every key or for the managed-keys record (None otherwise: nothing is known)."""
    if not is_summary(obj):
        data = obj.get("data") or {}
        return data_hash({k: data[k] for k in keys if k in data})
    digest = obj[DIGEST]
    wanted = sorted(keys)
    if wanted == keys_of(obj):
        return str(digest["all"])
    annotations = (obj.get("metadata") or {}).get("annotations") or {}
    recorded = sorted({k for k in str(annotations.get(api.ANN_MANAGED_KEYS, "")).split(",")
                       if k})
    return str(digest["managed"]) if wanted == recorded else None


def _without_last_applied(annotations: Any) -> dict[str, Any] | None:
    """The annotations, the last-applied one aside (None: there are none)."""
    if not isinstance(annotations, dict):
        return None
    if LAST_APPLIED not in annotations:
        return annotations
    return {k: v for k, v in annotations.items() if k != LAST_APPLIED}
