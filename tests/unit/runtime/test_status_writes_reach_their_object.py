"""Status writes land on the object they were computed for, and a failure is reported even
when its status cannot be written.

Found by the final review of session 5 (each test failed before its fix).

F1: a merge patch of a CRD's status subresource carrying ``metadata.uid`` is no
precondition on the real apiserver. The patch handler (apiserver
endpoints/handlers/patch.go, ``applyPatch``) checks a uid only when no object exists; the
CRD status strategy (apiextensions customresource/status_strategy.go, ``PrepareForUpdate``)
then copies the stored object over the patched one and keeps only ``status``: the stale
uid is dropped and the status lands on the namesake. FakeKube and model_kube answer 409
there, which the apiserver does not. A JSON patch whose first op is
``{"op": "test", "path": "/metadata/uid", ...}`` is refused (422) when the uid differs.

F4: a Warning Event is lost whenever the Ready=False status patch fails.
"""

from __future__ import annotations

import builtins
import copy
from datetime import UTC, datetime
from typing import Any

import pytest
from fakes import FakeKube

from himitsu_controller.kube import KubeClient
from himitsu_controller.runtime.client.rest import ApiError
from himitsu_controller.sync.ports import KubeError
from himitsu_controller.sync.status import StatusWriter

STATUS_PATH = "/apis/himitsu.io/v1alpha1/namespaces/apps/himitsusecrets/app-config/status"


def _merge(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    out = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = _merge(out.get(key), value)
    return out


class CrdStatusApiserver:
    """The status subresource of a CRD as kube-apiserver serves a PATCH of it: the patch
    is applied to the stored object, then the status strategy keeps the stored object
    and only the patched ``status`` (so ``metadata`` in a merge patch is dropped). A JSON
    patch's ``test`` op that fails is a 422."""

    def __init__(self, stored: dict[str, Any]) -> None:
        self.stored = stored

    def request(self, method: str, path: str, *, body: Any = None,
                content_type: str | None = None, **_: Any) -> dict[str, Any]:
        assert (method, path) == ("PATCH", STATUS_PATH)
        if content_type == "application/merge-patch+json":
            patched = _merge(self.stored, body)
        elif content_type == "application/json-patch+json":
            patched = copy.deepcopy(self.stored)
            for op in body:
                if op["op"] == "test":
                    node: Any = patched
                    for part in op["path"].strip("/").split("/"):
                        node = node.get(part) if isinstance(node, dict) else None
                    if node != op["value"]:
                        raise ApiError(422, "Invalid", "the test operation failed")
                elif op["op"] in ("add", "replace") and op["path"] == "/status":
                    patched["status"] = op["value"]
                else:
                    raise AssertionError(f"op not modelled: {op}")
        else:
            raise AssertionError(f"content type not modelled: {content_type}")
        result = copy.deepcopy(self.stored)  # statusStrategy.PrepareForUpdate
        if "status" in patched:
            result["status"] = patched["status"]
        else:
            result.pop("status", None)
        self.stored = result
        return copy.deepcopy(result)


class _NoStore:
    def get(self, key: str) -> None:
        return None

    def list(self) -> list[dict[str, Any]]:
        return []

    def by_index(self, index: str, value: str) -> builtins.list[dict[str, Any]]:
        return []


def test_status_patch_from_a_deleted_objects_copy_never_lands_on_its_namesake() -> None:
    """F1. docs/syncing.md: 'one computed from the cached copy of a HimitsuSecret deleted and
    recreated under its name is refused (409), never merged into the new one's status'."""
    namesake_status = {"configVersion": 1, "rolloutRestarts": [{"kind": "Deployment"}]}
    server = CrdStatusApiserver({
        "metadata": {"namespace": "apps", "name": "app-config", "uid": "u-new"},
        "status": copy.deepcopy(namesake_status)})
    client = KubeClient(server, himitsu_secrets=_NoStore(),  # type: ignore[arg-type]
                        secrets=_NoStore())
    stale = {"configVersion": 7, "rolloutRestarts": [{"kind": "StatefulSet"}]}
    with pytest.raises(KubeError):
        client.patch_status("apps", "app-config", stale, uid="u-old")
    assert server.stored["status"] == namesake_status


def test_a_failure_whose_status_cannot_be_written_still_gets_its_event() -> None:
    """F4. StatusWriter.failed writes Ready=False before recording the Warning Event; when
    the status patch is refused (403: the Role lacks himitsusecrets/status patch, or a
    5xx every retry) the exception skips the Event, so the user learns of the failure
    from neither status nor Events (house rule: bad input gets Ready=False, an Event and
    a log line; the Event is the one channel left). The Event must not depend on the
    status write."""
    kube = FakeKube()
    obj = kube.add_himitsu_secret({"metadata": {"namespace": "apps", "name": "app-config"},
                                   "spec": {}})
    kube.fail_next["patch_status"] = [
        KubeError("updating status of HimitsuSecret 'app-config' failed: 403 Forbidden",
                  status=403, reason="Forbidden") for _ in range(3)]
    writer = StatusWriter(kube, now=lambda: datetime(2026, 12, 1, tzinfo=UTC))
    for _ in range(3):  # every retry of the reconcile
        with pytest.raises(KubeError):
            writer.failed("apps/app-config", obj, reason="InvalidSpec",
                          message="spec.target.name is required", generation=1)
    assert {e.reason for e in kube.events} == {"InvalidSpec"}  # once, or once a retry
