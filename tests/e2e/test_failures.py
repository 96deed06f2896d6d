"""Failures show as Ready=False with a reason and a useful message, and heal by themselves.

refreshInterval is 5s here, so the failure backoff is capped at 5 s and recovery after a
fix is a matter of seconds; the deadlines stay generous. A failed sync never empties or
changes the target.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from typing import Any

import pytest

from .harness import Harness
from .kubehelp import ApiError, KubeApi, hsec_path, secret_path, wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.usefixtures("default_operator")]

RECOVERY_TIMEOUT = 45.0
VAP_API = "/apis/admissionregistration.k8s.io/v1"


def _set_token(kube: KubeApi, ns: str, token: str, *, name: str = "himitsu-token") -> None:
    kube.merge_patch(secret_path(ns, name),
                     {"data": {"token": base64.b64encode(token.encode()).decode()}})


def test_missing_token_secret_is_authentication_failure_until_created(h: Harness,
                                                                     ns: str) -> None:
    env, values = h.environment("API_KEY")
    h.hsec(ns, "app", env, target="app-secrets", refresh="5s")

    h.wait_ready(ns, "app", reason="AuthenticationFailure", message_has="not found")
    assert h.standin.requests(env) == []

    h.token_secret(ns, h.token_for(env))
    h.wait_ready(ns, "app", timeout=RECOVERY_TIMEOUT)
    h.wait_data(ns, "app-secrets", values)


def test_malformed_token_is_authentication_failure_without_a_request(h: Harness, ns: str,
                                                                    kube: KubeApi) -> None:
    env, values = h.environment("API_KEY")
    h.token_secret(ns, h.canary.malformed_token())
    h.hsec(ns, "app", env, target="app-secrets", refresh="5s")

    h.wait_ready(ns, "app", reason="AuthenticationFailure", message_has="token")
    assert h.standin.requests(env) == [], "a malformed token was sent to Himitsu"

    _set_token(kube, ns, h.token_for(env))
    h.wait_ready(ns, "app", timeout=RECOVERY_TIMEOUT)
    h.wait_data(ns, "app-secrets", values)


def test_revoked_token_401_is_authentication_failure_until_replaced(h: Harness, ns: str,
                                                                   kube: KubeApi) -> None:
    sync = h.sync(ns, "API_KEY", refresh="5s")
    h.wait_data(ns, sync.target, sync.values)

    h.standin.revoke_token(sync.token)

    h.wait_ready(ns, sync.name, reason="AuthenticationFailure", message_has="401",
                 timeout=RECOVERY_TIMEOUT)
    assert h.standin.count(sync.env, status=401) >= 1
    assert h.data(ns, sync.target) == sync.values, "a failed sync changed the target"

    _set_token(kube, ns, h.token_for(sync.env))
    h.wait_ready(ns, sync.name, timeout=RECOVERY_TIMEOUT)


def test_out_of_scope_token_403_is_authentication_failure_until_replaced(
        h: Harness, ns: str, kube: KubeApi) -> None:
    env, values = h.environment("API_KEY")
    elsewhere = h.standin.new_environment()
    h.token_secret(ns, h.token_for(elsewhere))
    h.hsec(ns, "app", env, target="app-secrets", refresh="5s")

    h.wait_ready(ns, "app", reason="AuthenticationFailure", message_has="403")
    assert h.standin.count(env, status=403) >= 1

    _set_token(kube, ns, h.token_for(env))
    h.wait_ready(ns, "app", timeout=RECOVERY_TIMEOUT)
    h.wait_data(ns, "app-secrets", values)


def test_server_errors_are_fetch_failure_and_keep_the_secret(h: Harness, ns: str,
                                                            kube: KubeApi) -> None:
    sync = h.sync(ns, "API_KEY", "DB_PASSWORD", refresh="5s")
    before = h.wait_data(ns, sync.target, sync.values)
    fault = h.standin.fault("error", env=sync.env, status=503)

    try:
        obj = h.wait_ready(ns, sync.name, reason="FetchFailure", timeout=RECOVERY_TIMEOUT)
        assert "503" in obj["status"]["conditions"][0]["message"]
        assert kube.secret(ns, sync.target) == before, "a failed fetch changed the target"
    finally:
        h.standin.clear_faults(fault)

    h.wait_ready(ns, sync.name, timeout=RECOVERY_TIMEOUT)


@pytest.fixture
def deny_managed_secrets(kube: KubeApi, ns: str) -> Iterator[str]:
    """A ValidatingAdmissionPolicy refusing Secrets labelled himitsu.io/managed in ``ns``.

    Yields the binding's path: deleting it lifts the denial.
    """
    name = f"deny-managed-{ns}"
    kube.create(f"{VAP_API}/validatingadmissionpolicies", {
        "apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicy",
        "metadata": {"name": name},
        "spec": {
            "failurePolicy": "Fail",
            "matchConstraints": {"resourceRules": [{
                "apiGroups": [""], "apiVersions": ["v1"], "resources": ["secrets"],
                "operations": ["CREATE", "UPDATE"]}]},
            "validations": [{
                "expression": "!has(object.metadata.labels) || "
                              "!('himitsu.io/managed' in object.metadata.labels)",
                "message": "e2e policy refuses managed Secrets", "reason": "Forbidden"}],
        },
    })
    binding = f"{VAP_API}/validatingadmissionpolicybindings/{name}"
    kube.create(f"{VAP_API}/validatingadmissionpolicybindings", {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicyBinding", "metadata": {"name": name},
        "spec": {"policyName": name, "validationActions": ["Deny"],
                 "matchResources": {"namespaceSelector": {
                     "matchLabels": {"kubernetes.io/metadata.name": ns}}}},
    })
    _wait_until_enforced(kube, ns)
    try:
        yield binding
    finally:
        kube.delete(binding)
        kube.delete(f"{VAP_API}/validatingadmissionpolicies/{name}")


def _wait_until_enforced(kube: KubeApi, ns: str, probe: dict[str, Any] | None = None) -> None:
    """Policies load asynchronously: probe with a dry-run create until it is refused."""
    probe = probe or {"apiVersion": "v1", "kind": "Secret",
                      "metadata": {"name": "policy-probe",
                                   "labels": {"himitsu.io/managed": "true"}}}

    def refused() -> bool:
        try:
            kube.request("POST", secret_path(ns), body=probe, query={"dryRun": "All"})
        except ApiError as exc:
            return exc.status in (403, 422)
        return False

    wait_for(refused, timeout=30, what="the admission policy to be enforced")


def test_refused_secret_write_is_write_failure_until_allowed(
        h: Harness, ns: str, kube: KubeApi, deny_managed_secrets: str) -> None:
    sync = h.sync(ns, "API_KEY", refresh="5s", wait=False)

    # Who denied is shown, not the policy's text (it may print the object's data).
    obj = h.wait_ready(ns, sync.name, reason="WriteFailure",
                       message_has=f"ValidatingAdmissionPolicy 'deny-managed-{ns}'")
    assert sync.target in obj["status"]["conditions"][0]["message"]
    assert kube.secret(ns, sync.target) is None

    kube.delete(deny_managed_secrets)

    h.wait_ready(ns, sync.name, timeout=RECOVERY_TIMEOUT)
    h.wait_data(ns, sync.target, sync.values)


def test_a_policy_that_prints_the_data_in_its_denial_leaks_nothing(
        h: Harness, ns: str, kube: KubeApi) -> None:
    # Review: a messageExpression printing object.data put the value into the status, the
    # Events and the operator log (redaction covered double-quoted text only). The
    # session's canary check searches the operator log too.
    name = f"print-data-{ns}"[:63]
    kube.create(f"{VAP_API}/validatingadmissionpolicies", {
        "apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicy",
        "metadata": {"name": name},
        "spec": {
            "failurePolicy": "Fail",
            "matchConstraints": {"resourceRules": [{
                "apiGroups": [""], "apiVersions": ["v1"], "resources": ["secrets"],
                "operations": ["CREATE"]}]},
            "validations": [{
                "expression": "object.type != 'kubernetes.io/tls'",
                "messageExpression": "'tls key must be a PEM, got ' + "
                                     "string(object.data['tls.key']) + ' and \"' + "
                                     "string(object.data['tls.crt']) + '\"'",
                "reason": "Forbidden"}],
        },
    })
    binding = f"{VAP_API}/validatingadmissionpolicybindings/{name}"
    kube.create(f"{VAP_API}/validatingadmissionpolicybindings", {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicyBinding", "metadata": {"name": name},
        "spec": {"policyName": name, "validationActions": ["Deny"],
                 "matchResources": {"namespaceSelector": {
                     "matchLabels": {"kubernetes.io/metadata.name": ns}}}},
    })
    try:
        sync = h.sync(ns, "tls.crt", "tls.key", refresh="5s")
        before = h.wait_data(ns, sync.target, sync.values)
        _wait_until_enforced(kube, ns, {
            "apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/tls",
            "metadata": {"name": "policy-probe"},
            "data": {"tls.crt": "YQ==", "tls.key": "Yg=="}})

        kube.merge_patch(hsec_path(ns, sync.name),
                         {"spec": {"target": {"type": "kubernetes.io/tls"}}})

        obj = h.wait_ready(ns, sync.name, reason="WriteFailure", message_has=name)
        message = obj["status"]["conditions"][0]["message"]
        assert "was kept as it is" in message and "denied request" in message
        assert "must be a PEM" not in message, "the policy's own text is shown"
        wait_for(lambda: any(e["reason"] == "WriteFailure" for e in h.events(ns, sync.name)),
                 timeout=30, what="a WriteFailure Event")
        shown = json.dumps(obj["status"]) + json.dumps(h.events(ns, sync.name))
        for value in sync.values.values():
            encoded = base64.b64encode(value.encode()).decode()
            assert value not in shown and encoded not in shown
        after = kube.secret(ns, sync.target)
        assert after is not None and after["metadata"]["uid"] == before["metadata"]["uid"]
    finally:
        kube.delete(binding)
        kube.delete(f"{VAP_API}/validatingadmissionpolicies/{name}")
