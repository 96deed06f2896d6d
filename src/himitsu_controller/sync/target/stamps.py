"""Who wrote a target, and the labels and annotations the operator puts on it.

* A record on a target (``managed-keys``, the template's keys) counts only when the
  stamps name this HimitsuSecret by name and uid; another writer's is foreign.
* Template metadata overwrites on an Owner target, only adds on a Merge one; a key goes
  only when the template applied it and holds it no more.

Design: docs/design/merge-ownership.md
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from himitsu_controller import api

__all__ = ["annotations_of", "applied", "created_for", "has_controller_ref", "is_controller_ref",
           "labels_of", "metadata", "stamped_by", "without_ours"]


def _meta(secret: Mapping[str, Any] | None) -> Mapping[str, Any]:
    return (secret or {}).get("metadata") or {}


def annotations_of(secret: Mapping[str, Any] | None) -> Mapping[str, str]:
    return _meta(secret).get("annotations") or {}


def labels_of(secret: Mapping[str, Any] | None) -> Mapping[str, str]:
    return _meta(secret).get("labels") or {}


def _keys(raw: str | None) -> set[str]:
    return {k for k in (raw or "").split(",") if k}


def is_controller_ref(ref: Any, *, uid: str | None = None) -> bool:
    """A controller reference to a HimitsuSecret (with ``uid``: to that one)."""
    return (isinstance(ref, Mapping) and bool(ref.get("controller"))
            and ref.get("kind") == api.KIND
            and str(ref.get("apiVersion", "")).startswith(f"{api.GROUP}/")
            and (uid is None or ref.get("uid") == uid))


def has_controller_ref(secret: Mapping[str, Any] | None, *, uid: str | None = None) -> bool:
    return any(is_controller_ref(r, uid=uid) for r in _meta(secret).get("ownerReferences") or [])


def stamped_by(secret: Mapping[str, Any] | None, *, name: str, uid: str) -> bool:
    """The stamps name this HimitsuSecret, by name and uid: its records are its own."""
    ann = annotations_of(secret)
    return bool(uid) and ann.get(api.ANN_OWNED_BY) == name and ann.get(api.ANN_OWNER_UID) == uid


def created_for(secret: Mapping[str, Any] | None, *, name: str, uid: str) -> bool:
    """The operator created this Secret for the HimitsuSecret of ``uid``: its
    ``created-for`` or its controller reference names that uid (docs/design/merge-ownership.md)."""
    if not uid:
        return False
    ann = annotations_of(secret)
    if ann.get(api.ANN_CREATED_FOR) == uid or has_controller_ref(secret, uid=uid):
        return True
    return (api.ANN_CREATED_FOR not in ann and stamped_by(secret, name=name, uid=uid)
            and labels_of(secret).get(api.LABEL_MANAGED_BY) == api.MANAGED_BY_VALUE)


def applied(secret: Mapping[str, Any] | None, record: str, *, name: str, uid: str) -> set[str]:
    """The keys ``record`` (a managed-keys or template record) names, if ours."""
    if not stamped_by(secret, name=name, uid=uid):
        return set()
    return _keys(annotations_of(secret).get(record))


def _apply(have: Mapping[str, str], want: Mapping[str, str], before: set[str], *,
           overwrite: bool) -> tuple[dict[str, str], list[str]]:
    out = {k: v for k, v in have.items() if k not in before or k in want}
    ours = []
    for key, value in want.items():
        if overwrite or key in before or key not in have:
            out[key] = value
            ours.append(key)
    return out, sorted(ours)


def _record(ann: dict[str, str], record: str, keys: list[str]) -> None:
    if keys:
        ann[record] = ",".join(keys)
    else:
        ann.pop(record, None)


def metadata(existing: Mapping[str, Any] | None, *, name: str, uid: str, spec: api.Spec,
             ) -> tuple[dict[str, str], dict[str, str]]:
    """The target's labels and annotations once stamped and templated (the data-bound
    annotations aside: ``targets.desired_secret`` adds them)."""
    owner_policy = spec.target.creation_policy == "Owner"
    tpl = spec.target.template
    labels, applied_labels = _apply(
        labels_of(existing), tpl.labels,
        applied(existing, api.ANN_TEMPLATE_LABELS, name=name, uid=uid), overwrite=owner_policy)
    ann, applied_ann = _apply(
        annotations_of(existing), tpl.annotations,
        applied(existing, api.ANN_TEMPLATE_ANNOTATIONS, name=name, uid=uid),
        overwrite=owner_policy)
    labels[api.LABEL_MANAGED] = "true"
    if existing is None or created_for(existing, name=name, uid=uid):
        labels[api.LABEL_MANAGED_BY] = api.MANAGED_BY_VALUE
        ann[api.ANN_CREATED_FOR] = uid  # (put back if pruned: our controller ref says it)
    else:  # another writer's creation facts are not ours to carry on
        ann.pop(api.ANN_CREATED_FOR, None)
        if labels.get(api.LABEL_MANAGED_BY) == api.MANAGED_BY_VALUE:
            labels.pop(api.LABEL_MANAGED_BY)
    ann.update({api.ANN_OWNED_BY: name, api.ANN_OWNER_UID: uid,
                api.ANN_PROJECT_ID: spec.project_id, api.ANN_ENVIRONMENT_ID: spec.environment_id})
    _record(ann, api.ANN_TEMPLATE_LABELS, applied_labels)
    _record(ann, api.ANN_TEMPLATE_ANNOTATIONS, applied_ann)
    return labels, ann


# What the operator stamps on a target (the owner's consent, allow-merge-by, is not ours).
_STAMPS = frozenset({
    api.ANN_OWNED_BY, api.ANN_OWNER_UID, api.ANN_PROJECT_ID, api.ANN_ENVIRONMENT_ID,
    api.ANN_CONFIG_VERSION, api.ANN_SOURCE, api.ANN_DATA_HASH, api.ANN_MANAGED_KEYS,
    api.ANN_DATA_ID, api.ANN_DATA_ID_CHECK, api.ANN_TEMPLATE_LABELS,
    api.ANN_TEMPLATE_ANNOTATIONS,
})


def without_ours(secret: Mapping[str, Any], *, name: str, uid: str) -> dict[str, Any]:
    """``secret`` (a whole Secret this HimitsuSecret wrote) with its keys, stamps
    and applied template metadata removed: foreign keys, labels and annotations stay."""
    meta = dict(_meta(secret))
    keys = applied(secret, api.ANN_MANAGED_KEYS, name=name, uid=uid)
    if api.ANN_MANAGED_KEYS not in annotations_of(secret) and stamped_by(
            secret, name=name, uid=uid) and created_for(secret, name=name, uid=uid):
        # Written as Owner (an Owner write drops the record) into a Secret created for
        # it: every key is its own, its controller reference pruned or not.
        keys = set(secret.get("data") or {})
    ann_gone = applied(secret, api.ANN_TEMPLATE_ANNOTATIONS, name=name, uid=uid) | _STAMPS
    label_gone = applied(secret, api.ANN_TEMPLATE_LABELS, name=name, uid=uid) | {
        api.LABEL_MANAGED}
    if created_for(secret, name=name, uid=uid):
        label_gone.add(api.LABEL_MANAGED_BY)
        ann_gone = ann_gone | {api.ANN_CREATED_FOR}
    meta["annotations"] = {k: v for k, v in annotations_of(secret).items() if k not in ann_gone}
    meta["labels"] = {k: v for k, v in labels_of(secret).items() if k not in label_gone}
    data = {k: v for k, v in (secret.get("data") or {}).items() if k not in keys}
    return {**secret, "metadata": meta, "data": data}
