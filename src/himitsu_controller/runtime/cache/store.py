"""The informer's cache: a thread-safe, indexed store of raw dicts keyed "namespace/name".

* client-go's ``cache.Indexer``: an index function maps an object to the values it is
  filed under; ``by_index`` finds them without a scan.
* The informer writes it; everyone else reads. Objects are the very dicts decoded from
  the apiserver: read-only for callers (deep-copy before changing), as with client-go.
* What it keeps of each object (``apply``, as controller-runtime's ``TransformFunc``):
  the store is most of the operator's memory.

Design: docs/design/informers.md
"""

from __future__ import annotations

import builtins
import sys
import threading
from collections.abc import Callable, Collection, Iterable, Mapping
from typing import Any

import structlog

__all__ = ["IndexFunc", "Store", "Transform", "apply", "drop_managed_fields", "intern_strings",
           "object_key"]

log = structlog.get_logger(__name__)

IndexFunc = Callable[[dict[str, Any]], builtins.list[str]]
Object = dict[str, Any]
Transform = Callable[[Object], Object]


def object_key(obj: Mapping[str, Any]) -> str:
    """client-go's MetaNamespaceKeyFunc: "namespace/name", or "name" when cluster-scoped."""
    metadata = obj.get("metadata") or {}
    name = str(metadata.get("name", ""))
    namespace = metadata.get("namespace")
    # Interned: the store, the work queue and memories share one string per object.
    return sys.intern(f"{namespace}/{name}") if namespace else sys.intern(name)


def resource_version(obj: Mapping[str, Any]) -> str:
    return str((obj.get("metadata") or {}).get("resourceVersion", ""))


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


class Store:
    """Objects by key, plus named indices (index name -> value -> set of keys)."""

    def __init__(self, indexers: Mapping[str, IndexFunc] | None = None) -> None:
        self._lock = threading.RLock()
        self._items: dict[str, Object] = {}
        self._indexers: dict[str, IndexFunc] = dict(indexers or {})
        self._indices: dict[str, dict[str, set[str]]] = {name: {} for name in self._indexers}

    def get(self, key: str) -> Object | None:
        with self._lock:
            return self._items.get(key)

    def keys(self) -> builtins.list[str]:
        with self._lock:
            return builtins.list(self._items)

    def by_index(self, index: str, value: str) -> builtins.list[Object]:
        """Objects filed under ``value`` by the indexer ``index`` (KeyError if unknown)."""
        with self._lock:
            keys = self._indices[index].get(value, ())
            return [self._items[key] for key in sorted(keys)]

    def add_indexer(self, name: str, func: IndexFunc) -> None:
        """Add an index; objects already cached are filed at once."""
        with self._lock:
            if name in self._indexers:
                raise ValueError(f"indexer {name!r} already exists")
            self._indexers[name] = func
            self._indices[name] = {}
            for key, obj in self._items.items():
                self._file(name, key, obj)

    # Writes, used by the informer only.

    def upsert(self, key: str, obj: Object) -> Object | None:
        """Store ``obj``; return what was there before (None if it is new)."""
        with self._lock:
            old = self._items.get(key)
            if old is not None:
                self._unfile(key, old)
            self._items[key] = obj
            for name in self._indexers:
                self._file(name, key, obj)
            return old

    def delete(self, key: str) -> Object | None:
        with self._lock:
            old = self._items.pop(key, None)
            if old is not None:
                self._unfile(key, old)
            return old

    def replace(self, items: Mapping[str, Object],
                ) -> tuple[builtins.list[tuple[Object | None, Object]], builtins.list[Object]]:
        """Swap in a fresh listing: ((old or None, new) in listing order, deleted), leaving
        out (and in place) an object whose resourceVersion did not change."""
        changed: builtins.list[tuple[Object | None, Object]] = []
        with self._lock:
            for key, obj in items.items():
                old = self._items.get(key)
                if old is not None and resource_version(old) == resource_version(obj):
                    continue
                self.upsert(key, obj)
                changed.append((old, obj))
            vanished = [key for key in self._items if key not in items]
            deleted = [obj for obj in (self.delete(key) for key in vanished) if obj is not None]
        return changed, deleted

    def _file(self, name: str, key: str, obj: Object) -> None:
        for value in self._index_values(name, obj):
            self._indices[name].setdefault(value, set()).add(key)

    def _unfile(self, key: str, obj: Object) -> None:
        for name in self._indexers:
            index = self._indices[name]
            for value in self._index_values(name, obj):
                keys = index.get(value)
                if keys is not None:
                    keys.discard(key)
                    if not keys:
                        del index[value]

    def _index_values(self, name: str, obj: Object) -> Iterable[str]:
        try:
            return builtins.list(self._indexers[name](obj))
        except Exception:  # a buggy index function must not take the informer down
            log.exception("index function failed", index=name, key=object_key(obj))
            return ()

    # Last: a method named ``list`` shadows the builtin for annotations below it.
    def list(self) -> builtins.list[Object]:
        with self._lock:
            return builtins.list(self._items.values())
