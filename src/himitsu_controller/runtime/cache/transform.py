"""What an informer keeps of each object: controller-runtime's cache ``TransformFunc``.

* Applied to every object as it arrives (LIST pages, watch events), before the store or
  any handler sees it: ``metadata.managedFields`` always goes, then the informer's own.
* Cached objects share their strings (``intern_strings``): keys and the named fields.
* Why: the store holds every watched object for the life of the process, so what it
  keeps is most of the operator's memory.

Design: docs/design/informers.md
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Collection
from typing import Any

import structlog

__all__ = ["Transform", "apply", "drop_managed_fields", "intern_strings"]

log = structlog.get_logger(__name__)

Object = dict[str, Any]
Transform = Callable[[Object], Object]


def drop_managed_fields(obj: Object) -> Object:
    """``obj`` without ``metadata.managedFields`` (in place)."""
    meta = obj.get("metadata")
    if isinstance(meta, dict):
        meta.pop("managedFields", None)
    return obj


def intern_strings(value: Any, values: Collection[str] = ()) -> Any:
    """``value`` rebuilt with every dict key interned, and every string value of a key in
    ``values`` (anywhere in it); lists are rebuilt, anything else is kept as it is."""
    if isinstance(value, dict):
        out = {}
        for raw, item in value.items():
            key = sys.intern(raw) if type(raw) is str else raw
            if type(item) is str and key in values:
                out[key] = sys.intern(item)
            elif isinstance(item, dict | list):
                out[key] = intern_strings(item, values)
            else:
                out[key] = item
        return out
    if isinstance(value, list):
        return [intern_strings(item, values) if isinstance(item, dict | list) else item
                for item in value]
    return value


def apply(transform: Transform | None, obj: Object, *, informer: str,
          shared: Collection[str] = ()) -> Object | None:
    """``obj`` as the store keeps it (the values of the fields ``shared`` names interned);
    None when ``transform`` fails (logged): not kept whole, as a transform may exist to
    keep data (a Secret's values) out of memory."""
    obj = drop_managed_fields(obj)
    try:
        kept = obj if transform is None else transform(obj)
        return intern_strings(kept, shared)  # type: ignore[no-any-return]
    except Exception:
        found = obj.get("metadata")
        meta: dict[str, Any] = found if isinstance(found, dict) else {}
        log.exception("informer transform failed; object not cached", informer=informer,
                      namespace=str(meta.get("namespace", "")), name=str(meta.get("name", "")))
        return None
