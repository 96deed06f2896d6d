"""Event handlers enqueue the right keys, and predicates filter updates that don't matter."""

from __future__ import annotations

from typing import Any

import pytest
from structlog.testing import capture_logs

from himitsu_controller.runtime.handler import (
    annotation_changed,
    any_of,
    enqueue_for_object,
    enqueue_mapped,
    generation_changed,
    object_key,
)

FORCE = "example.io/force-sync"


class Recorder:
    def __init__(self) -> None:
        self.keys: list[str] = []

    def enqueue(self, key: str) -> None:
        self.keys.append(key)


def obj(
    name: str = "app",
    namespace: str | None = "ns",
    generation: int | None = 1,
    annotations: dict[str, str] | None = None,
    **extra: Any,
) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name}
    if namespace is not None:
        meta["namespace"] = namespace
    if generation is not None:
        meta["generation"] = generation
    if annotations is not None:
        meta["annotations"] = annotations
    return {"metadata": meta, **extra}


def test_object_key_is_namespace_slash_name_or_name() -> None:
    assert object_key(obj("a", "ns")) == "ns/a"
    assert object_key(obj("node-1", None)) == "node-1"
    with pytest.raises(ValueError, match=r"metadata\.name"):
        object_key({"metadata": {}})


def test_generation_changed() -> None:
    assert generation_changed(obj(generation=1), obj(generation=2))
    assert not generation_changed(obj(generation=3), obj(generation=3, status={"x": 1}))
    assert not generation_changed(obj(generation=None), obj(generation=None))


def test_annotation_changed_sees_add_change_and_removal_of_that_annotation_only() -> None:
    changed = annotation_changed(FORCE)
    assert changed(obj(), obj(annotations={FORCE: "1"}))
    assert changed(obj(annotations={FORCE: "1"}), obj(annotations={FORCE: "2"}))
    assert changed(obj(annotations={FORCE: "1"}), obj(annotations={}))
    assert not changed(obj(annotations={FORCE: "1"}), obj(annotations={FORCE: "1", "o": "x"}))
    assert not changed(obj(), obj(annotations={"other": "x"}))


def test_any_of() -> None:
    pred = any_of(generation_changed, annotation_changed(FORCE))
    assert pred(obj(generation=1), obj(generation=2))
    assert pred(obj(), obj(annotations={FORCE: "now"}))
    assert not pred(obj(), obj(status={"ready": True}))


def test_enqueue_for_object_enqueues_on_add_and_delete() -> None:
    ctrl = Recorder()
    handlers = enqueue_for_object(ctrl)
    handlers.on_add(obj("a"))
    handlers.on_delete(obj("b"))
    handlers.on_update(obj("c"), obj("c"))  # no predicate: every update counts
    assert ctrl.keys == ["ns/a", "ns/b", "ns/c"]


def test_enqueue_for_object_filters_updates_with_the_predicate() -> None:
    ctrl = Recorder()
    handlers = enqueue_for_object(ctrl, any_of(generation_changed, annotation_changed(FORCE)))
    handlers.on_update(obj(generation=1), obj(generation=1, status={"ready": True}))
    assert ctrl.keys == []  # our own status write must not wake us
    handlers.on_update(obj(generation=1), obj(generation=2))
    handlers.on_update(obj(), obj(annotations={FORCE: "1"}))
    assert ctrl.keys == ["ns/app", "ns/app"]


def test_enqueue_mapped_maps_both_old_and_new_and_dedupes() -> None:
    ctrl = Recorder()

    def owners(o: dict[str, Any]) -> list[str]:
        return [f"ns/{name}" for name in o.get("owners", [])]

    handlers = enqueue_mapped(ctrl, owners)
    handlers.on_add(obj(owners=["x"]))
    assert ctrl.keys == ["ns/x"]
    ctrl.keys.clear()
    handlers.on_update(obj(owners=["x", "y"]), obj(owners=["y", "z"]))
    assert ctrl.keys == ["ns/x", "ns/y", "ns/z"]
    ctrl.keys.clear()
    handlers.on_delete(obj(owners=["z", "z"]))
    assert ctrl.keys == ["ns/z"]


def test_enqueue_mapped_contains_a_failing_map_function() -> None:
    ctrl = Recorder()

    def flaky(o: dict[str, Any]) -> list[str]:
        if o["metadata"]["name"] == "bad":
            raise KeyError("nope")
        return ["ns/ok"]

    handlers = enqueue_mapped(ctrl, flaky)
    with capture_logs() as logs:
        handlers.on_update(obj("bad"), obj("good"))
    assert ctrl.keys == ["ns/ok"]  # the new object's keys still go out
    assert logs[0]["error_type"] == "KeyError"
    assert logs[0]["object"] == "ns/bad"
