"""Target layout: formats, Secret type, template metadata, token key, KeyValue's key rules."""

from __future__ import annotations

import base64
import io
import json

import pytest
from dotenv import dotenv_values

from .harness import Harness
from .kubehelp import KubeApi, hsec_path, kubectl, rv, wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.usefixtures("default_operator")]

AWKWARD = ' "quoted" \\ back $HOME ${NOT_EXPANDED} #not-a-comment\nsecond line é ✓'


@pytest.mark.parametrize(("fmt", "data_key"), [("Dotenv", ".env"), ("Json", "config.json")])
def test_blob_formats_are_byte_stable_across_full_fetches(h: Harness, ns: str, kube: KubeApi,
                                                          fmt: str, data_key: str) -> None:
    env = h.standin.new_environment()
    values = {key: value + AWKWARD
              for key, value in h.canary.values("API_KEY", "DB_PASSWORD", "Z_LAST").items()}
    h.standin.set_secrets(env, values)
    h.token_secret(ns, h.token_for(env))
    h.hsec(ns, "app", env, target="app-secrets", fmt=fmt, refresh="1h")
    h.wait_ready(ns, "app")

    secret = kube.secret(ns, "app-secrets")
    assert secret is not None and list(secret["data"]) == [data_key]
    blob = base64.b64decode(secret["data"][data_key]).decode()
    if fmt == "Dotenv":
        assert dotenv_values(stream=io.StringIO(blob), interpolate=False) == values
    else:
        assert json.loads(blob) == values
    before = rv(secret)

    # Each force-sync asks Himitsu and renders the same data afresh.
    for attempt in ("one", "two", "three"):
        mark = h.standin.mark(env)
        kubectl(kube.kubeconfig, "-n", ns, "annotate", "hsec", "app",
                f"himitsu.io/force-sync={attempt}", "--overwrite")
        wait_for(lambda: _last_force_sync(h, ns, "app") == attempt,  # noqa: B023 (waited here)
                 timeout=30, what=f"force-sync {attempt!r} honoured")
        assert h.standin.count(env, after=mark) >= 1, "force-sync without a request"

    after = kube.secret(ns, "app-secrets")
    assert rv(after) == before, "an unchanged render rewrote the Secret"
    assert after == secret


def test_non_opaque_target_type(h: Harness, ns: str, kube: KubeApi) -> None:
    sync = h.sync(ns, "username", "password", type="kubernetes.io/basic-auth")

    secret = h.wait_data(ns, sync.target, sync.values)
    assert secret["type"] == "kubernetes.io/basic-auth"


def test_template_labels_and_annotations_are_merged_onto_the_target(h: Harness, ns: str,
                                                                   kube: KubeApi) -> None:
    labels = {"app.kubernetes.io/name": "shop", "team": "payments"}
    annotations = {"example.com/owner": "payments", "example.com/tier": "gold"}
    sync = h.sync(ns, "API_KEY", labels=labels, annotations=annotations)

    secret = h.wait_data(ns, sync.target, sync.values)
    meta = secret["metadata"]
    assert labels.items() <= meta["labels"].items()
    assert annotations.items() <= meta["annotations"].items()
    assert meta["labels"]["himitsu.io/managed"] == "true"


def test_non_default_auth_secret_ref_key(h: Harness, ns: str) -> None:
    sync = h.sync(ns, "API_KEY", auth_name="himitsu-credentials", auth_key="api-token")

    h.wait_data(ns, sync.target, sync.values)


def test_key_outside_the_allowed_set_is_invalid_spec_and_keeps_the_secret(
        h: Harness, ns: str, kube: KubeApi) -> None:
    sync = h.sync(ns, "API_KEY", "DB_PASSWORD", refresh="2s")
    before = h.wait_data(ns, sync.target, sync.values)

    h.standin.set_secrets(sync.env, {"path/to:key": h.canary.value("bad-key")})

    obj = h.wait_ready(ns, sync.name, reason="InvalidSpec")
    assert "path/to:key" in obj["status"]["conditions"][0]["message"]
    assert kube.secret(ns, sync.target) == before, "the existing Secret was changed"


def test_a_template_faking_kubectl_s_last_applied_annotation_is_invalid_spec_and_keeps_the_secret(
        h: Harness, ns: str, kube: KubeApi) -> None:
    # kubectl's own record of the last apply: a template may not set it (it would mislead
    # the next kubectl apply, and the operator's cache drops it, so the stamp would look
    # pruned at every poll).
    last_applied = "kubectl.kubernetes.io/last-applied-configuration"
    sync = h.sync(ns, "API_KEY", refresh="2s")
    before = h.wait_data(ns, sync.target, sync.values)

    kube.merge_patch(hsec_path(ns, sync.name), {"spec": {"target": {"template": {
        "annotations": {last_applied: '{"kind":"Secret"}'}}}}})

    obj = h.wait_ready(ns, sync.name, reason="InvalidSpec")
    assert last_applied in obj["status"]["conditions"][0]["message"]
    assert kube.secret(ns, sync.target) == before, "the existing Secret was changed"


def _last_force_sync(h: Harness, ns: str, name: str) -> str | None:
    value = (h.get_hsec(ns, name).get("status") or {}).get("lastForceSync")
    return None if value is None else str(value)
