"""Writing the target: create, update, or replace it, and never lose a working Secret.

A Secret's type is immutable, so an Owner target whose ``target.type`` changed has to be
deleted and created again. Deleting first and learning afterwards that the create is
refused (``kubernetes.io/tls`` while the data holds ``TLS_CRT``) would leave the
application without its Secret, and every retry would fail the same way. So the
replacement is proven first: locally against the type's required keys and the size
limits (``validity``), then by the apiserver itself with a dry-run create, which runs
validation and every admission plugin and webhook but stores nothing. Only then is the
old Secret deleted (with a uid precondition) and the new one created. Every other write
is checked locally the same way, so a refusal is ``InvalidSpec`` naming the key, not a
raw 422.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from himitsu_controller import api, metrics
from himitsu_controller.sync import targets, validity
from himitsu_controller.sync.expectations import uid_of
from himitsu_controller.sync.ports import Conflict, Kube, KubeError

__all__ = ["Raced", "Refused", "Written", "write"]


class Refused(Exception):
    """Nothing was written; ``reason`` is the Ready reason, the message names no value."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message


class Raced(Exception):
    """Someone else wrote first (409): try again. ``creating``: a create found the name
    taken, so the target must be read directly from now on (the cache did not show it)."""

    def __init__(self, *, creating: bool) -> None:
        super().__init__()
        self.creating = creating


@dataclass(frozen=True)
class Written:
    secret: Mapping[str, Any]  # the target as it now is (unchanged: as it was)
    wrote: bool
    data_changed: bool


def write(
    kube: Kube, *, owner: targets.Owner, spec: api.Spec, target: dict[str, Any] | None,
    rendered: dict[str, str], version: int,
) -> Written:
    """Bring ``target`` (None: there is none) to what ``spec`` and ``rendered`` ask for.

    Raises Refused (nothing was written), Raced, or KubeError (a write was refused; for
    a replacement, only ever the create after the delete, which the dry run vouched for).
    """
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
            None if replacing else target, owner=owner, spec=spec, rendered=rendered,
            version=version)
    except targets.TargetConflict as exc:
        raise Refused("TargetConflict", str(exc)) from None
    try:
        validity.check(desired, ours=rendered)
    except validity.Unwritable as exc:
        raise Refused("InvalidSpec", str(exc)) from None
    ns = owner.namespace
    try:
        if target is not None and replacing:
            written = _replace(kube, ns, target, desired)
        elif target is None:
            written = kube.create_secret(ns, desired)
            metrics.count_write("create")
        elif targets.same_content(target, desired):
            return Written(secret=target, wrote=False, data_changed=False)
        else:
            written = kube.update_secret(ns, desired)
            metrics.count_write("update")
            return Written(secret=written, wrote=True,
                           data_changed=(target.get("data") or {}) != desired["data"])
    except Conflict:
        raise Raced(creating=target is None or replacing) from None
    return Written(secret=written, wrote=True, data_changed=True)


def _replace(
    kube: Kube, ns: str, target: Mapping[str, Any], desired: dict[str, Any],
) -> dict[str, Any]:
    name = desired["metadata"]["name"]
    try:
        kube.dry_run_create_secret(ns, desired)
    except KubeError as exc:
        raise Refused("WriteFailure", (
            f"Secret {name!r} was kept as it is (type {target.get('type', 'Opaque')!r}): "
            f"its replacement of type {desired.get('type')!r} would be refused: {exc}"
        )) from None
    kube.delete_secret(ns, name, uid=uid_of(target))
    metrics.count_write("delete")
    written = kube.create_secret(ns, desired)
    metrics.count_write("create")
    return written
