"""Turning informer events into work-queue keys: event handlers and predicates.

* Enqueue the object itself (optionally only when an update matters: its own status
  writes must not wake it), or map an object to the keys that depend on it.
* Handlers run on the informer's thread: they only enqueue, never block; a failing map
  function is logged and contained.

Design: docs/design/workqueue.md
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import structlog

log = structlog.get_logger(__name__)

UpdatePredicate = Callable[[Mapping[str, Any], Mapping[str, Any]], bool]


class Enqueuer(Protocol):
    """Anything keys can be sent to (a Controller)."""

    def enqueue(self, key: str) -> None: ...


@dataclass(frozen=True)
class Handlers:
    """The three callbacks an informer's ``add_handler`` takes, as one value."""

    on_add: Callable[[dict[str, Any]], None]
    on_update: Callable[[dict[str, Any], dict[str, Any]], None]
    on_delete: Callable[[dict[str, Any]], None]


def _meta(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    meta = obj.get("metadata")
    return meta if isinstance(meta, Mapping) else {}


def object_key(obj: Mapping[str, Any]) -> str:
    """The work-queue key of an object: "namespace/name", or "name" if cluster-scoped."""
    meta = _meta(obj)
    name = str(meta.get("name") or "")
    if not name:
        raise ValueError("object has no metadata.name")
    namespace = meta.get("namespace")
    # Interned as the store's keys are: one string per object wherever it is queued.
    return sys.intern(f"{namespace}/{name}") if namespace else sys.intern(name)


def generation_changed(old: Mapping[str, Any], new: Mapping[str, Any]) -> bool:
    """True when ``metadata.generation`` moved: the spec changed, not just status/metadata."""
    return _meta(old).get("generation") != _meta(new).get("generation")


def annotation_changed(name: str) -> UpdatePredicate:
    """A predicate true when annotation ``name`` was added, removed or changed."""

    def changed(old: Mapping[str, Any], new: Mapping[str, Any]) -> bool:
        return bool((_meta(old).get("annotations") or {}).get(name)
                    != (_meta(new).get("annotations") or {}).get(name))

    return changed


def any_of(*predicates: UpdatePredicate) -> UpdatePredicate:
    """A predicate true when any of ``predicates`` is."""
    return lambda old, new: any(predicate(old, new) for predicate in predicates)


def enqueue_for_object(ctrl: Enqueuer, update_predicate: UpdatePredicate | None = None,
                       ) -> Handlers:
    """Enqueue the object's own key on add and delete, and on updates that pass."""

    def on_update(old: dict[str, Any], new: dict[str, Any]) -> None:
        if update_predicate is None or update_predicate(old, new):
            ctrl.enqueue(object_key(new))

    return Handlers(on_add=lambda obj: ctrl.enqueue(object_key(obj)), on_update=on_update,
                    on_delete=lambda obj: ctrl.enqueue(object_key(obj)))


def enqueue_mapped(ctrl: Enqueuer, map_fn: Callable[[dict[str, Any]], Iterable[str]]) -> Handlers:
    """Enqueue the keys ``map_fn`` derives from an object (both old and new on update:
    the key an update moves the object away from must be woken too)."""

    def enqueue(*objs: dict[str, Any]) -> None:
        keys: dict[str, None] = {}
        for obj in objs:
            try:
                keys.update(dict.fromkeys(map_fn(obj)))
            except Exception as exc:  # a bad mapping must not break event delivery
                try:
                    name = object_key(obj)
                except ValueError:
                    name = "<unnamed>"
                log.error("event mapping failed", object=name, error_type=type(exc).__name__)
        for key in keys:
            ctrl.enqueue(key)

    return Handlers(on_add=enqueue, on_update=enqueue, on_delete=enqueue)
