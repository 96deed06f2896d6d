"""Writing the target: create, update, or replace it, and never lose a working Secret.

* A type change replaces an Owner target only once proven (``validity``, a dry-run
  create); the old Secret comes back if the real create is refused.
* A write is built on the whole Secret read at that moment; a refusal quotes no value.

Design: docs/design/targets.md
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from himitsu_controller import api, metrics
from himitsu_controller.sync import summary
from himitsu_controller.sync.memory import resource_version, uid_of
from himitsu_controller.sync.ports import Conflict, Kube, KubeError
from himitsu_controller.sync.target import scrub, targets, validity

__all__ = ["Raced", "Refused", "Written", "write"]


class Refused(Exception):
    """Nothing was written; ``reason`` is the Ready reason, the message names no value."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason, self.message = reason, message


class Raced(Exception):
    """Someone else wrote first (409): try again. ``creating``: a create found the name
    taken, so the target must be read directly from now on (the cache did not show it).
    ``seen``: the resourceVersion a direct read found instead of the summary's."""

    def __init__(self, *, creating: bool, seen: str | None = None) -> None:
        super().__init__()
        self.creating, self.seen = creating, seen


@dataclass(frozen=True)
class Written:
    secret: Mapping[str, Any]  # the target as it now is (unchanged: as it was)
    wrote: bool
    data_changed: bool


def write(
    kube: Kube, *, owner: targets.Owner, spec: api.Spec, target: dict[str, Any] | None,
    rendered: dict[str, str], version: int, data_id: str,
) -> Written:
    """Bring ``target`` (None: there is none) to what ``spec`` and ``rendered`` ask for.
    Raises Refused (nothing written), Raced, or KubeError, none quoting a value."""
    if summary.is_summary(target):
        target = _whole(kube, owner.namespace, spec.target.name, target)
    if target is not None and (target.get("metadata") or {}).get("deletionTimestamp"):
        raise Refused("WriteFailure", _terminating(target))
    replacing = target is not None and target.get("type", "Opaque") != spec.target.type
    if replacing and spec.target.creation_policy == "Merge":
        assert target is not None
        raise Refused("InvalidSpec", (
            f"target.type {spec.target.type!r} differs from the existing Secret's type "
            f"{target.get('type', 'Opaque')!r}; Secret types are immutable and a Merge "
            "target is not ours to recreate"
        ))
    try:
        desired = targets.desired_secret(
            _carried_over(target, spec) if target is not None and replacing else target,
            owner=owner, spec=spec,
            rendered=rendered, version=version, data_id=data_id)
    except targets.TargetConflict as exc:
        raise Refused("TargetConflict", str(exc)) from None
    try:
        validity.check(desired, ours=rendered, creating=target is None or replacing)
    except validity.Unwritable as exc:
        raise Refused("InvalidSpec", str(exc)) from None
    ns = owner.namespace
    sent = [*(desired.get("data") or {}).values(), *((target or {}).get("data") or {}).values()]
    try:
        with scrub.redacting(sent):
            if target is not None and replacing:
                written = _replace(kube, ns, target, desired, sent=sent)
            elif target is None:
                written = kube.create_secret(ns, desired)
                metrics.count_write("create")
                return Written(secret=written, wrote=True, data_changed=True)
            elif targets.same_content(target, desired):
                return Written(secret=target, wrote=False, data_changed=False)
            else:
                written = kube.update_secret(ns, desired)
                changed = (target.get("data") or {}) != desired["data"]
                # Only our stamps put back: a GitOps tool pruning them shows as a rate.
                metrics.count_write("update" if changed else "relabel")
                return Written(secret=written, wrote=True, data_changed=changed)
    except Conflict:
        raise Raced(creating=target is None or replacing) from None
    return Written(secret=written, wrote=True, data_changed=True)


def _whole(kube: Kube, ns: str, name: str, cached: Mapping[str, Any],
           ) -> dict[str, Any] | None:
    """The Secret ``cached`` summarises, read directly (None: it is gone, so create it)."""
    whole = kube.get_secret(ns, name, fresh=True)
    if whole is not None and resource_version(whole) != resource_version(cached):
        raise Raced(creating=False, seen=resource_version(whole))
    return whole


def _terminating(target: Mapping[str, Any]) -> str:
    meta = target.get("metadata") or {}
    finalizers = ", ".join(str(f) for f in meta.get("finalizers") or []) or "none left"
    return (f"Secret {meta.get('name', '')!r} is being deleted (finalizers: {finalizers}): "
            "waiting for the Secret's finalizers to finish its deletion; it is written "
            "again once it is gone")


def _carried_over(target: Mapping[str, Any], spec: api.Spec) -> dict[str, Any]:
    """What a replacement keeps: labels, annotations, other owners and ``immutable``."""
    meta = target.get("metadata") or {}
    kept: dict[str, Any] = {k: copy.deepcopy(meta[k]) for k in ("labels", "annotations")
                            if meta.get(k)}
    refs = [r for r in meta.get("ownerReferences") or [] if not r.get("controller")]
    if refs:
        kept["ownerReferences"] = copy.deepcopy(refs)
    body: dict[str, Any] = {
        "apiVersion": "v1", "kind": "Secret", "type": spec.target.type,
        "metadata": {"name": meta.get("name", spec.target.name),
                     "namespace": meta.get("namespace"), **kept},
    }
    if target.get("immutable"):
        body["immutable"] = True
    return body


def _replace(
    kube: Kube, ns: str, target: Mapping[str, Any], desired: dict[str, Any], *,
    sent: list[str],
) -> dict[str, Any]:
    name = desired["metadata"]["name"]
    try:
        with scrub.redacting(sent):
            kube.dry_run_create_secret(ns, desired)
    except KubeError as exc:
        raise Refused("WriteFailure", (
            f"Secret {name!r} was kept as it is (type {target.get('type', 'Opaque')!r}): "
            f"its replacement of type {desired.get('type')!r} would be refused: {exc}"
        )) from None
    kube.delete_secret(ns, name, uid=uid_of(target))
    metrics.count_write("delete")
    try:
        written = kube.create_secret(ns, desired)
    except Conflict:
        raise  # someone created it first, or the old one waits for its finalizers
    except KubeError as exc:
        raise KubeError(f"{exc}; {_restore(kube, ns, target)}",
                        status=exc.status, reason=exc.reason) from None
    metrics.count_write("create")
    return written


def _restore(kube: Kube, ns: str, target: Mapping[str, Any]) -> str:
    """The dry run vouched for a create the apiserver then refused: the old one comes back."""
    meta = {k: v for k, v in (target.get("metadata") or {}).items()
            if k not in ("deletionTimestamp", "deletionGracePeriodSeconds", "finalizers")}
    try:
        kube.create_secret(ns, {**target, "metadata": meta})
    except KubeError:
        return "the old Secret could not be created again"
    metrics.count_write("create")
    return "the old Secret was created again as it was"
