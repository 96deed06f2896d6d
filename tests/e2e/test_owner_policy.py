"""creationPolicy Owner: the operator is the target's sole author, and never adopts."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from . import admission
from .harness import Harness
from .kubehelp import ApiError, KubeApi, decoded, hsec_path, rv, secret_path, wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.usefixtures("default_operator")]

GC_TIMEOUT = 60.0  # the garbage collector's informers are not ours to hurry
RECOVERY_TIMEOUT = 60.0


def test_deleting_the_himitsu_secret_garbage_collects_the_secret(h: Harness, ns: str,
                                                                kube: KubeApi) -> None:
    sync = h.sync(ns, "API_KEY")
    h.wait_data(ns, sync.target, sync.values)

    kube.delete(hsec_path(ns, sync.name))

    wait_for(lambda: kube.secret(ns, sync.target) is None, timeout=GC_TIMEOUT,
             what="the garbage collector to delete the Owner target")


def test_key_removed_upstream_disappears_from_the_secret(h: Harness, ns: str) -> None:
    sync = h.sync(ns, "API_KEY", "OLD_FLAG", refresh="2s")
    h.wait_data(ns, sync.target, sync.values)

    h.standin.delete_secret(sync.env, "OLD_FLAG")

    h.wait_data(ns, sync.target, {"API_KEY": sync.values["API_KEY"]}, timeout=30)
    wait_for(lambda: h.get_hsec(ns, sync.name)["status"]["secretCount"] == 1, timeout=30,
             what="status.secretCount 1")


def test_pre_existing_foreign_secret_is_refused_and_left_untouched(h: Harness, ns: str,
                                                                  kube: KubeApi) -> None:
    foreign = h.secret(ns, "app-secrets", h.canary.values("PASSWORD", "USERNAME"),
                       labels={"app.kubernetes.io/managed-by": "Helm"},
                       annotations={"meta.helm.sh/release-name": "app"})

    sync = h.sync(ns, "API_KEY", target="app-secrets", wait=False)

    obj = h.wait_ready(ns, sync.name, reason="TargetConflict")
    assert "app-secrets" in obj["status"]["conditions"][0]["message"]
    after = kube.secret(ns, "app-secrets")
    assert after == foreign, "the foreign Secret was modified"
    assert rv(after) == rv(foreign)
    wait_for(lambda: any(e["reason"] == "TargetConflict" and e["type"] == "Warning"
                         for e in h.events(ns, sync.name)),
             timeout=30, what="a Warning TargetConflict Event")


def test_a_type_the_data_cannot_satisfy_keeps_the_secret_byte_for_byte(
    h: Harness, ns: str, kube: KubeApi,
) -> None:
    # KeyValue writes TLS_CRT / TLS_KEY as they are: no tls.crt, which kubernetes.io/tls
    # requires. Deleting first would leave the application without its Secret.
    sync = h.sync(ns, "TLS_CRT", "TLS_KEY")
    h.wait_data(ns, sync.target, sync.values)
    before = kube.secret(ns, sync.target)

    kube.merge_patch(hsec_path(ns, sync.name), {"spec": {"target": {"type": "kubernetes.io/tls"}}})

    obj = h.wait_ready(ns, sync.name, reason="InvalidSpec", message_has="'tls.crt'")
    message = obj["status"]["conditions"][0]["message"]
    assert "'tls.key'" in message and "'TLS_CRT'" in message
    assert kube.secret(ns, sync.target) == before, "the working Secret was touched"
    wait_for(lambda: any(e["reason"] == "InvalidSpec" and e["type"] == "Warning"
                         for e in h.events(ns, sync.name)),
             timeout=30, what="a Warning InvalidSpec Event")
    assert kube.secret(ns, sync.target) == before


def test_a_type_the_data_satisfies_replaces_the_secret(h: Harness, ns: str,
                                                       kube: KubeApi) -> None:
    sync = h.sync(ns, "tls.crt", "tls.key")
    before = h.wait_data(ns, sync.target, sync.values)
    assert before["type"] == "Opaque"

    kube.merge_patch(hsec_path(ns, sync.name), {"spec": {"target": {"type": "kubernetes.io/tls"}}})

    def replaced() -> dict[str, Any] | None:
        secret = kube.secret(ns, sync.target)
        return secret if secret is not None and secret["type"] == "kubernetes.io/tls" else None

    after = wait_for(replaced, timeout=30, what="the target replaced with type kubernetes.io/tls")
    assert after["metadata"]["uid"] != before["metadata"]["uid"]
    assert decoded(after) == sync.values
    owner = h.get_hsec(ns, sync.name)
    assert [r["uid"] for r in after["metadata"]["ownerReferences"]] == [owner["metadata"]["uid"]]
    h.wait_ready(ns, sync.name)


def _writes(operator: Any, operation: str) -> float:
    prefix = f'himitsu_secret_writes_total{{operation="{operation}"}} '
    lines = [line for line in operator.scrape().splitlines() if line.startswith(prefix)]
    return float(lines[0].rsplit(" ", 1)[1]) if lines else 0.0


def _failed_syncs(operator: Any, reason: str) -> float:
    found = 0.0
    for line in operator.scrape().splitlines():
        if line.startswith("himitsu_syncs_total{") and 'result="failed"' in line \
                and f'reason="{reason}"' in line:
            found += float(line.rsplit(" ", 1)[1])
    return found


def _webhook_409(obj: dict[str, Any]) -> dict[str, Any] | None:
    if obj.get("type") != "kubernetes.io/tls":
        return None
    return {"code": 409, "reason": "AlreadyExists",
            "message": 'a TLS Secret for host "shop.example.com" already exists'}


def test_a_webhook_denying_with_409_already_exists_keeps_the_secret(
    h: Harness, ns: str, kube: KubeApi, *, cluster: Any, tmp_path: Path,
    default_operator: Any,
) -> None:
    # A uniqueness webhook denies with 409 AlreadyExists: that is not the apiserver's
    # "the name is taken, the rest would pass" (review: the Secret was deleted, the real
    # create denied, Ready stayed True, a silent 0.5 s requeue forever).
    if cluster.on_kind:
        pytest.skip("the webhook is served from the test process on 127.0.0.1")
    sync = h.sync(ns, "tls.crt", "tls.key", refresh="10s")
    before = h.wait_data(ns, sync.target, sync.values)
    with admission.webhook(kube, ns, tmp_path, name="unique-tls.example.com",
                           decide=_webhook_409) as seen:
        probe = {"apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/tls",
                 "metadata": {"name": "webhook-probe"},
                 "data": {"tls.crt": "", "tls.key": ""}}

        def enforced() -> bool:
            try:
                kube.request("POST", secret_path(ns), body=probe, query={"dryRun": "All"})
            except ApiError as exc:
                return exc.status == 409
            return False

        wait_for(enforced, timeout=30, what="the webhook to be called")
        deletes = _writes(default_operator, "delete")

        kube.merge_patch(hsec_path(ns, sync.name),
                         {"spec": {"target": {"type": "kubernetes.io/tls"}}})

        obj = h.wait_ready(ns, sync.name, reason="WriteFailure",
                           message_has="unique-tls.example.com")
        message = obj["status"]["conditions"][0]["message"]
        assert "was kept as it is" in message and "409 AlreadyExists" in message
        assert "shop.example.com" not in message, "the webhook's own text is shown"
        after = kube.secret(ns, sync.target)
        assert after is not None and after["metadata"]["uid"] == before["metadata"]["uid"]
        assert decoded(after) == sync.values
        assert _writes(default_operator, "delete") == deletes
        assert all(r["dryRun"] for r in seen if r["operation"] == "CREATE"), \
            "a real create was sent"

    h.wait_ready(ns, sync.name, timeout=RECOVERY_TIMEOUT)
    replaced = kube.secret(ns, sync.target)
    assert replaced is not None and replaced["type"] == "kubernetes.io/tls"
    assert decoded(replaced) == sync.values


def test_a_type_change_on_a_secret_held_by_a_finalizer_deletes_it_once_and_waits(
    h: Harness, ns: str, kube: KubeApi, default_operator: Any,
) -> None:
    # Review: 20 DELETEs in 10 s against a terminating Secret, Ready True throughout.
    sync = h.sync(ns, "tls.crt", "tls.key", refresh="10s")
    h.wait_data(ns, sync.target, sync.values)
    kube.merge_patch(secret_path(ns, sync.target),
                     {"metadata": {"finalizers": ["example.com/hold"]}})
    deletes = _writes(default_operator, "delete")
    failed = _failed_syncs(default_operator, "WriteFailure")
    try:
        kube.merge_patch(hsec_path(ns, sync.name),
                         {"spec": {"target": {"type": "kubernetes.io/tls"}}})

        h.wait_ready(ns, sync.name, reason="WriteFailure",
                     message_has="waiting for the Secret's finalizers")
        # Several retries later (each a failed sync), still the one delete.
        wait_for(lambda: _failed_syncs(default_operator, "WriteFailure") >= failed + 3,
                 timeout=RECOVERY_TIMEOUT, what="three retries of the waiting write")
        assert _writes(default_operator, "delete") == deletes + 1
        held = kube.secret(ns, sync.target)
        assert held is not None and held["metadata"].get("deletionTimestamp")
        assert decoded(held) == sync.values
    finally:
        kube.merge_patch(secret_path(ns, sync.target), {"metadata": {"finalizers": None}})

    h.wait_ready(ns, sync.name, timeout=RECOVERY_TIMEOUT)
    replaced = kube.secret(ns, sync.target)
    assert replaced is not None and replaced["type"] == "kubernetes.io/tls"
    assert decoded(replaced) == sync.values
