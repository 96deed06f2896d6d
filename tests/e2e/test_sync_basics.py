"""A HimitsuSecret becomes Ready with the environment's data, as kubectl shows it."""

from __future__ import annotations

import re

import pytest

from .harness import Harness
from .kubehelp import KubeApi, kubectl, wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.usefixtures("default_operator")]


def test_himitsu_secret_becomes_ready_with_the_environment_data(h: Harness, ns: str,
                                                                kube: KubeApi) -> None:
    sync = h.sync(ns, "API_KEY", "DB_PASSWORD", "LOG_LEVEL")

    h.wait_data(ns, sync.target, sync.values)
    obj = h.get_hsec(ns, sync.name)
    status = obj["status"]
    version = h.standin.info(sync.env)["configVersion"]
    assert status["secretCount"] == 3
    assert status["configVersion"] == version
    assert status["observedGeneration"] == obj["metadata"]["generation"]
    assert status["lastSyncTime"]
    secret = kube.secret(ns, sync.target)
    assert secret is not None
    meta = secret["metadata"]
    assert secret["type"] == "Opaque"
    assert meta["labels"]["himitsu.io/managed"] == "true"
    assert meta["labels"]["app.kubernetes.io/managed-by"] == "himitsu-operator"
    assert meta["annotations"]["himitsu.io/config-version"] == str(version)
    [owner] = meta["ownerReferences"]
    assert (owner["kind"], owner["name"], owner["uid"], owner["controller"]) == (
        "HimitsuSecret", sync.name, obj["metadata"]["uid"], True)


def test_kubectl_get_shows_the_contract_columns(h: Harness, ns: str, kube: KubeApi) -> None:
    sync = h.sync(ns, "API_KEY", "DB_PASSWORD")
    version = h.standin.info(sync.env)["configVersion"]

    out = kubectl(kube.kubeconfig, "-n", ns, "get", "hsec").stdout
    header, *rows = out.strip().splitlines()
    assert re.split(r"\s{2,}", header.strip()) == [
        "NAME", "SECRET", "KEYS", "VERSION", "READY", "LAST SYNC", "AGE"]
    assert len(rows) == 1
    cells = re.split(r"\s{2,}", rows[0].strip())
    assert cells[:5] == [sync.name, sync.target, "2", str(version), "True"]
    assert re.fullmatch(r"\d+[smhd]\S*", cells[5]), f"LAST SYNC {cells[5]!r}"


def test_kubectl_describe_shows_events(h: Harness, ns: str, kube: KubeApi) -> None:
    sync = h.sync(ns, "API_KEY")
    wait_for(lambda: h.events(ns, sync.name), timeout=30, what="an Event on the HimitsuSecret")

    out = kubectl(kube.kubeconfig, "-n", ns, "describe", "hsec", sync.name).stdout
    events = out[out.index("Events:"):]
    assert re.search(r"Normal\s+Synced\s", events), out
    assert sync.target in events
