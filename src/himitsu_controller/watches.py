"""What wakes a HimitsuSecret: the informers' index on targets and the event handlers.

* Its own spec changes and the force-sync annotation, never its status writes.
* Any event on its target Secret; a deleted HimitsuSecret wakes the others naming the
  same target (one of them may have lost a TargetConflict to it).
* A token value stays cached only while some HimitsuSecret names it.
"""

from __future__ import annotations

from typing import Any

from himitsu_controller import api, kube
from himitsu_controller.runtime import handler
from himitsu_controller.runtime.cache.informer import Informer
from himitsu_controller.runtime.controller import Controller

TARGET_INDEX = "target"
AUTH_INDEX = "auth-secret-ref"  # kube.token_refs


def target_index(obj: dict[str, Any]) -> list[str]:
    """"namespace/name" of the target a HimitsuSecret names: an informer index function."""
    namespace = (obj.get("metadata") or {}).get("namespace", "")
    target = ((obj.get("spec") or {}).get("target") or {}).get("name")
    return [f"{namespace}/{target}"] if isinstance(target, str) and target else []


def wire_events(ctrl: Controller, hsecs: Informer, secrets: Informer) -> None:
    """Enqueue on spec changes, force-sync and any event on a target Secret (never on our
    own status writes); a deleted HimitsuSecret wakes the others naming its target."""
    hsecs.add_handler(**vars(handler.enqueue_for_object(ctrl, update_predicate=handler.any_of(
        handler.generation_changed, handler.annotation_changed(api.ANN_FORCE_SYNC)))))

    def wake_rivals(obj: dict[str, Any]) -> None:
        for key in target_index(obj):
            for rival in hsecs.store.by_index(TARGET_INDEX, key):
                ctrl.enqueue(handler.object_key(rival))

    hsecs.add_handler(on_delete=wake_rivals)

    def claimants(secret: dict[str, Any]) -> list[str]:
        meta = secret.get("metadata") or {}
        key = f"{meta.get('namespace', '')}/{meta.get('name', '')}"
        return [handler.object_key(o) for o in hsecs.store.by_index(TARGET_INDEX, key)]

    secrets.add_handler(**vars(handler.enqueue_mapped(ctrl, claimants)))


def forget_tokens_with_their_users(hsecs: Informer, kube_client: kube.KubeClient) -> None:
    """A token value stays cached only while some HimitsuSecret names its Secret and key
    (the store has already dropped or replaced the object when these handlers run)."""
    def still_named(ref: str) -> bool:
        return bool(hsecs.store.by_index(AUTH_INDEX, ref))

    kube_client.track_token_users(still_named)
    hsecs.add_handler(
        on_update=lambda old, new: kube_client.forget_token_of(old, still_named=still_named),
        on_delete=lambda obj: kube_client.forget_token_of(obj, still_named=still_named))
