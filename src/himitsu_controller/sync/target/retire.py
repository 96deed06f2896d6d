"""A renamed target leaves no stale copy.

Any other Secret with this HimitsuSecret's stamps or controller reference (by uid, from
the informer's index) is an earlier target: an owned one is deleted, a merged one loses
what we wrote. A Normal Event says which.

Design: docs/design/merge-ownership.md
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import structlog

from himitsu_controller import api, metrics
from himitsu_controller.sync.memory import resource_version, uid_of
from himitsu_controller.sync.ports import Kube
from himitsu_controller.sync.target import scrub, stamps, targets

__all__ = ["old_targets"]

log = structlog.get_logger(__name__)
REASON = "PreviousTargetReleased"


def old_targets(kube: Kube, obj: Mapping[str, Any], *, owner: targets.Owner,
                spec: api.Spec) -> None:
    """Release every earlier target of ``owner``; KubeError (Conflict: a race) when a
    write is refused, and the next sync tries again."""
    ns = owner.namespace
    for cached in kube.secrets_owned_by(ns, owner.uid):
        name = str((cached.get("metadata") or {}).get("name", ""))
        if not name or name == spec.target.name or (
                (cached.get("metadata") or {}).get("deletionTimestamp")):
            continue  # (one held by a finalizer costs no read per poll)
        whole = kube.get_secret(ns, name, fresh=True)
        if whole is None or (whole.get("metadata") or {}).get("deletionTimestamp"):
            continue
        if stamps.labels_of(whole).get(api.LABEL_MANAGED) != "true" and \
                not stamps.has_controller_ref(whole, uid=owner.uid):
            continue  # our label removed since the index showed it: not ours to touch
        sent = [str(v) for v in (whole.get("data") or {}).values()]
        with scrub.redacting(sent):
            if stamps.has_controller_ref(whole, uid=owner.uid):
                # Unchanged since read: a Secret rewritten meanwhile (another
                # HimitsuSecret took the name over) is judged again next time.
                kube.delete_secret(ns, name, uid=uid_of(whole),
                                   resource_version=resource_version(whole))
                metrics.count_write("delete")
                said = (f"deleted Secret {name!r}, the earlier target of this HimitsuSecret "
                        f"(target.name is now {spec.target.name!r})")
            elif stamps.stamped_by(whole, name=owner.name, uid=owner.uid):
                said = _release_merged(kube, whole, owner=owner, spec=spec)
            else:
                continue
        try:
            kube.record_event(obj, type="Normal", reason=REASON, message=said)
        except Exception as exc:  # best effort, as every Event
            log.warning("recording event failed", reason=REASON, error=type(exc).__name__)


def _release_merged(kube: Kube, whole: dict[str, Any], *, owner: targets.Owner,
                    spec: api.Spec) -> str:
    """A Merge target loses what this HimitsuSecret wrote; one the operator created for
    it, holding nothing of anyone else's once that is gone, is deleted instead."""
    name = str(whole["metadata"]["name"])
    stripped = stamps.without_ours(whole, name=owner.name, uid=owner.uid)
    meta = stripped["metadata"]
    now = f"(target.name is now {spec.target.name!r})"
    if stamps.created_for(whole, name=owner.name, uid=owner.uid) and not (
            stripped.get("data") or meta.get("labels") or meta.get("annotations")):
        kube.delete_secret(owner.namespace, name, uid=uid_of(whole),
                           resource_version=resource_version(whole))
        metrics.count_write("delete")
        return (f"deleted Secret {name!r}, the earlier target the operator created for this "
                f"HimitsuSecret, which held nothing else {now}")
    kube.update_secret(owner.namespace, stripped)
    metrics.count_write("update")
    return (f"removed this HimitsuSecret's keys and stamps from Secret {name!r}, its earlier "
            f"target {now}; its other keys, labels and annotations are left as they are")
