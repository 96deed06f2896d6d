"""What an informer keeps of each object: controller-runtime's cache ``TransformFunc``.

An informer's store holds every object it watches for the life of the process, so what
it keeps is most of the operator's memory. A transform is applied to each object as it
arrives (every LIST page, a relist included, and every watch ADDED, MODIFIED and DELETED
event), before the store or any handler sees it; a BOOKMARK carries only a
resourceVersion and never enters the store. Handlers and readers therefore only ever see
transformed objects, whichever path they came by.

``metadata.managedFields`` (server-side apply's field ownership, often the largest part
of an object's metadata) is dropped for every informer: nothing reads it from a cache,
and a write that omits it keeps the stored one. A transform given to an informer runs
after that. It receives the freshly decoded dict, which nobody else holds: it may change
it in place or return a smaller one. It must keep the name, namespace and
resourceVersion, which the store and the relist diff are keyed on.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import structlog

__all__ = ["Transform", "apply", "drop_managed_fields"]

log = structlog.get_logger(__name__)

Object = dict[str, Any]
Transform = Callable[[Object], Object]


def drop_managed_fields(obj: Object) -> Object:
    """``obj`` without ``metadata.managedFields`` (in place)."""
    meta = obj.get("metadata")
    if isinstance(meta, dict):
        meta.pop("managedFields", None)
    return obj


def apply(transform: Transform | None, obj: Object, *, informer: str) -> Object | None:
    """``obj`` as the store keeps it; None when ``transform`` fails (logged): an object
    the transform could not reduce is not kept at all rather than kept whole, since a
    transform may exist to keep data (a Secret's values) out of memory."""
    obj = drop_managed_fields(obj)
    if transform is None:
        return obj
    try:
        return transform(obj)
    except Exception:
        found = obj.get("metadata")
        meta: dict[str, Any] = found if isinstance(found, dict) else {}
        log.exception("informer transform failed; object not cached", informer=informer,
                      namespace=str(meta.get("namespace", "")), name=str(meta.get("name", "")))
        return None
