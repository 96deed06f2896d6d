"""What the target Secret should look like, and whether the one we have can be trusted.

* Pure functions over Secret dicts (summaries too; only a write needs a whole Secret).
* Ownership is recorded on the Secret (``owned-by``, ``owner-uid``); a Merge into a
  Secret the operator did not create needs its consent (``allow-merge-by``).

Design: docs/design/targets.md
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from himitsu_controller import api
from himitsu_controller.sync import summary
from himitsu_controller.sync.target import stamps
from himitsu_controller.sync.target.render import data_hash
from himitsu_controller.sync.target.stamps import annotations_of, has_controller_ref, labels_of

__all__ = ["Owner", "TargetConflict", "annotations_of", "check_ownership", "consents",
           "desired_secret", "holds_data", "holds_own_data", "holds_stamps", "is_consistent",
           "managed_keys", "our_previous_keys", "owned_by", "same_content"]


class TargetConflict(Exception):
    """The target belongs to someone else; the message says who, never any value."""


@dataclass(frozen=True)
class Owner:
    """The HimitsuSecret a target is written for: enough to stamp and reference it."""

    namespace: str
    name: str
    uid: str


def owned_by(secret: Mapping[str, Any] | None) -> str | None:
    return annotations_of(secret).get(api.ANN_OWNED_BY) or None


def managed_keys(secret: Mapping[str, Any] | None) -> list[str]:
    raw = annotations_of(secret).get(api.ANN_MANAGED_KEYS, "")
    return sorted({k for k in raw.split(",") if k})


def check_ownership(
    secret: Mapping[str, Any] | None, *, owner: Owner, policy: str,
    himitsu_secret_exists: Callable[[str], bool],
) -> None:
    """Raise TargetConflict when writing ``secret`` would take it from its rightful owner."""
    if secret is None:
        return
    meta = secret.get("metadata") or {}
    if api.ANN_ALLOWED_API_URLS in annotations_of(secret):
        # A token Secret is nobody's target: a write would carry other keys into it.
        raise TargetConflict(
            f"Secret {meta.get('name', '')!r} is a Himitsu token Secret (it carries "
            f"{api.ANN_ALLOWED_API_URLS}) and is never a target; point target.name at "
            "another Secret")
    if owner.uid and has_controller_ref(secret, uid=owner.uid):
        # Ours whatever else was done to it (pruned stamps are put back).
        return
    name = meta.get("name", "")
    holder = owned_by(secret)
    if holder and holder != owner.name and himitsu_secret_exists(holder):
        raise TargetConflict(
            f"Secret {name!r} is already managed by HimitsuSecret {holder!r}; "
            "point this HimitsuSecret at another target or delete the other one"
        )
    if policy == "Merge" and not consents(secret, owner=owner):
        raise TargetConflict(
            f"Secret {name!r} was not created by himitsu-operator for this HimitsuSecret "
            f"and does not consent to a Merge by it: whoever may write the Secret adds the "
            f"annotation {api.ANN_ALLOW_MERGE_BY}: {owner.name} (or '*') to it; until "
            "then it is left as it is")
    if policy == "Owner" and not stamps.created_for(secret, name=owner.name, uid=owner.uid):
        # Not even one created for another HimitsuSecret: our controller reference would
        # let garbage collection (or a later rename) delete whoever keeps it now.
        raise TargetConflict(
            f"Secret {name!r} already exists and was not created by himitsu-operator for "
            "this HimitsuSecret; creationPolicy Owner never adopts an existing Secret "
            "(delete it to let the operator create it, or use creationPolicy: Merge with "
            f"the Secret's consent, {api.ANN_ALLOW_MERGE_BY}: {owner.name})"
        )


def consents(secret: Mapping[str, Any], *, owner: Owner) -> bool:
    """May ``owner`` merge into ``secret``? Yes if the operator created it for ``owner``
    (only the operator writes those stamps), or if the Secret names it in
    ``himitsu.io/allow-merge-by`` (only who may write the Secret can put that there)."""
    if stamps.created_for(secret, name=owner.name, uid=owner.uid):
        return True
    allowed = {n.strip() for n in annotations_of(secret).get(api.ANN_ALLOW_MERGE_BY, "").split(",")}
    return "*" in allowed or owner.name in allowed


def our_previous_keys(secret: Mapping[str, Any] | None, *, policy: str, owner: Owner,
                      ) -> list[str]:
    """Keys of ``secret`` this HimitsuSecret wrote last time (all of them for an Owner
    target); keys another writer recorded are not among them (``target.stamps``)."""
    if secret is None or owned_by(secret) is None:
        return []
    # Judged by how it was written: a HimitsuSecret moved from Owner to Merge still knows
    # an Owner target's keys (our controller reference, no managed-keys record) as its own.
    if policy == "Owner" or _written_as_owner(secret, owner=owner):
        return summary.keys_of(secret)
    return sorted(stamps.applied(secret, api.ANN_MANAGED_KEYS, name=owner.name, uid=owner.uid))


def _written_as_owner(secret: Mapping[str, Any] | None, *, owner: Owner) -> bool:
    return (secret is not None and api.ANN_MANAGED_KEYS not in annotations_of(secret)
            and has_controller_ref(secret, uid=owner.uid))


def is_consistent(
    secret: Mapping[str, Any] | None, *, owner: Owner, spec: api.Spec, version: int | None,
) -> bool:
    """The target holds exactly what we wrote for this spec at ``version``: only then is
    a conditional request safe (a 304 would confirm data that is not there)."""
    return (holds_data(secret, owner=owner, spec=spec, version=version)
            and holds_stamps(secret, owner=owner, spec=spec))


def holds_data(
    secret: Mapping[str, Any] | None, *, owner: Owner, spec: api.Spec, version: int | None,
) -> bool:
    """The target's data is what we wrote for this spec's source at ``version``, whatever
    became of its labels and annotations."""
    if secret is None or version is None:
        return False
    return (annotations_of(secret).get(api.ANN_CONFIG_VERSION) == str(version)
            and holds_own_data(secret, owner=owner, spec=spec))


def holds_own_data(secret: Mapping[str, Any] | None, *, owner: Owner, spec: api.Spec) -> bool:
    """The target's data is what we wrote for this spec's source, at whichever version."""
    if secret is None:
        return False
    ann = annotations_of(secret)
    recorded = ann.get(api.ANN_DATA_HASH)
    return (
        recorded is not None
        and owned_by(secret) == owner.name
        and secret.get("type", "Opaque") == spec.target.type
        and ann.get(api.ANN_SOURCE) == spec.source_hash()
        and summary.holds_hash(
            secret, our_previous_keys(secret, policy=spec.target.creation_policy, owner=owner),
            recorded)
    )


def holds_own_bytes(secret: Mapping[str, Any] | None, *, owner: Owner, spec: api.Spec) -> bool:
    """The target's data is bytes we wrote, for this spec or an earlier one (a format or a
    source edited since): what pods reading it have, whatever the next sync writes."""
    recorded = annotations_of(secret).get(api.ANN_DATA_HASH)
    return secret is not None and recorded is not None and owned_by(secret) == owner.name \
        and summary.holds_hash(secret, our_previous_keys(
            secret, policy=spec.target.creation_policy, owner=owner), recorded)


def holds_stamps(secret: Mapping[str, Any] | None, *, owner: Owner, spec: api.Spec) -> bool:
    """Stamping and templating the target again would change nothing: a pruned stamp, a
    template key added or removed, a lost controller reference are a full sync's to repair."""
    if secret is None:
        return False
    meta = secret.get("metadata") or {}
    want_labels, want_ann = stamps.metadata(secret, name=owner.name, uid=owner.uid, spec=spec)
    return (
        dict(labels_of(secret)) == want_labels
        and dict(annotations_of(secret)) == want_ann
        and bool(annotations_of(secret).get(api.ANN_DATA_ID))
        and (spec.target.creation_policy != "Owner"
             or _owner_ref(owner) in (meta.get("ownerReferences") or []))
    )


def _owner_ref(owner: Owner) -> dict[str, Any]:
    return {
        "apiVersion": api.API_VERSION, "kind": api.KIND, "name": owner.name, "uid": owner.uid,
        "controller": True, "blockOwnerDeletion": True,
    }


def desired_secret(
    existing: Mapping[str, Any] | None, *, owner: Owner, spec: api.Spec,
    rendered: Mapping[str, str], version: int, data_id: str,
) -> dict[str, Any]:
    """The full Secret we want, built on the whole ``existing`` so foreign metadata
    survives; ``data_id``: the id of ``rendered`` (``sync.restarts.rule.data_id``)."""
    if summary.is_summary(existing):
        raise ValueError("a cached Secret summary is no base for a write")
    policy = spec.target.creation_policy
    body: dict[str, Any] = copy.deepcopy(dict(existing)) if existing else {
        "apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": spec.target.name, "namespace": owner.namespace},
        "type": spec.target.type,
    }
    meta = body.setdefault("metadata", {})
    if policy == "Owner":
        data = dict(rendered)
        meta["ownerReferences"] = [
            *(r for r in meta.get("ownerReferences") or [] if not r.get("controller")),
            _owner_ref(owner)]
    else:
        data = _merged_data(existing, owner=owner, rendered=rendered)
        # Merge sets no controller reference (the Secret outlives the HimitsuSecret);
        # drop the one an earlier Owner policy set, or garbage collection would take it.
        refs = [r for r in meta.get("ownerReferences") or [] if not stamps.is_controller_ref(r)]
        if refs:
            meta["ownerReferences"] = refs
        else:
            meta.pop("ownerReferences", None)
    body["data"] = data
    body.pop("stringData", None)
    meta["labels"], ann = stamps.metadata(existing, name=owner.name, uid=owner.uid, spec=spec)
    meta["annotations"] = ann
    if ann.get(api.ANN_DATA_ID) != data_id or api.ANN_DATA_ID_CHECK not in ann:  # a new id
        ann[api.ANN_DATA_ID_CHECK] = api.data_id_check(data_id, data_hash(rendered))
    ann.update({
        api.ANN_CONFIG_VERSION: str(version),
        api.ANN_SOURCE: spec.source_hash(),
        api.ANN_DATA_HASH: data_hash(rendered),
        api.ANN_DATA_ID: data_id,
    })
    if policy == "Merge":
        ann[api.ANN_MANAGED_KEYS] = ",".join(sorted(rendered))
    else:
        ann.pop(api.ANN_MANAGED_KEYS, None)
    return body


def _merged_data(
    existing: Mapping[str, Any] | None, *, owner: Owner, rendered: Mapping[str, str],
) -> dict[str, str]:
    current: dict[str, str] = dict((existing or {}).get("data") or {})
    ours = set(our_previous_keys(existing, policy="Merge", owner=owner))
    recorded = annotations_of(existing).get(api.ANN_DATA_HASH)
    if _written_as_owner(existing, owner=owner) and not (
            recorded and summary.holds_hash(existing or {}, sorted(ours), recorded)):
        ours &= set(rendered)  # an Owner target edited since: an added key is another's
    foreign = {k: v for k, v in current.items() if k not in ours}
    # Keys another HimitsuSecret recorded (a predecessor on this target) stay; one of
    # the same name is overwritten and becomes ours. Any other foreign key is refused.
    predecessor = set() if stamps.stamped_by(existing, name=owner.name, uid=owner.uid) \
        else set(managed_keys(existing)) | _owner_written(existing)
    collisions = sorted((set(rendered) & set(foreign)) - predecessor)
    if collisions:
        name = ((existing or {}).get("metadata") or {}).get("name", "")
        # One key, not a list or a count: the reader may not read this Secret.
        raise TargetConflict(
            f"Himitsu key {collisions[0]!r} would overwrite a key of Secret {name!r} that "
            "himitsu-operator did not write; rename it in Himitsu or remove it from the Secret"
        )
    return {**foreign, **rendered}


def _owner_written(secret: Mapping[str, Any] | None) -> set[str]:
    """Every key of another HimitsuSecret's Owner target (its controller reference, no
    managed-keys record) whose data is what it wrote (its data hash holds): its keys too
    are a predecessor's (docs/reference.md); a key added since is the Secret owner's."""
    if api.ANN_MANAGED_KEYS in annotations_of(secret) or not has_controller_ref(secret):
        return set()
    keys = sorted((secret or {}).get("data") or {})
    recorded = annotations_of(secret).get(api.ANN_DATA_HASH)
    held = recorded and summary.holds_hash(secret or {}, keys, recorded)
    return set(keys) if held else set()


def same_content(current: Mapping[str, Any], desired: Mapping[str, Any]) -> bool:
    """Would writing ``desired`` over ``current`` change anything a reader can see?"""
    cur_meta = current.get("metadata") or {}
    new_meta = desired.get("metadata") or {}
    return (
        (current.get("data") or {}) == (desired.get("data") or {})
        and (cur_meta.get("labels") or {}) == (new_meta.get("labels") or {})
        and (cur_meta.get("annotations") or {}) == (new_meta.get("annotations") or {})
        and (cur_meta.get("ownerReferences") or []) == (new_meta.get("ownerReferences") or [])
    )
