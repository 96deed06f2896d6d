"""A status write reaches only the object it was computed for, on a real kube-apiserver.

The status subresource ignores ``metadata.uid`` in a merge patch (the CRD status strategy
keeps the stored metadata), so the operator's status patch is a JSON patch whose first op
tests the uid: a write computed from the cached copy of a HimitsuSecret deleted and
recreated under its name is refused and leaves the namesake's status alone.
"""

from __future__ import annotations

import pytest

from himitsu_controller import api
from himitsu_controller.kube import KubeClient
from himitsu_controller.runtime.cache.store import Store
from himitsu_controller.runtime.client.rest import RestClient, load_api_client
from himitsu_controller.sync.ports import KubeError

from .kubehelp import KubeApi, hsec_path

pytestmark = pytest.mark.e2e

OTHER_UID = "00000000-0000-4000-8000-000000000000"


def _body(name: str) -> dict[str, object]:
    return {"apiVersion": api.API_VERSION, "kind": api.KIND, "metadata": {"name": name},
            "spec": {"apiUrl": "https://himitsu.example.com",
                     "projectId": "0b4f6d2e-3c1a-4e5f-9a7b-1c2d3e4f5a6b",
                     "environmentId": "1c2d3e4f-5a6b-4c7d-8e9f-0a1b2c3d4e5f",
                     "authSecretRef": {"name": "himitsu-token"}, "target": {"name": "t"}}}


def test_a_status_patch_for_another_uid_is_refused_and_changes_nothing(
        kube: KubeApi, operator_kubeconfig: str, ns: str) -> None:
    created = kube.create(hsec_path(ns), _body("uid-check"))
    client = KubeClient(RestClient(load_api_client(operator_kubeconfig)),
                        himitsu_secrets=Store(), secrets=Store())
    client.patch_status(ns, "uid-check", {"secretCount": 1, "configVersion": None},
                        uid=created["metadata"]["uid"])
    assert kube.get(hsec_path(ns, "uid-check"))["status"] == {"secretCount": 1}
    with pytest.raises(KubeError) as refused:
        client.patch_status(ns, "uid-check", {"secretCount": 2}, uid=OTHER_UID)
    assert refused.value.status == 422
    assert kube.get(hsec_path(ns, "uid-check"))["status"] == {"secretCount": 1}
