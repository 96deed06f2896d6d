"""Tests for runtime/apierrors.py: an ApiError never carries a value of the object refused.

The apiserver's Status message quotes what it refused (validation: ``Invalid value:
"..."``; admission webhooks: free text), and that message travels into logs, status
conditions and Events. The messages below are the apiserver's own (kube-apiserver 1.36
on the local control plane), with a canary where the value was.
"""

from __future__ import annotations

import json

import pytest

from himitsu_controller.runtime.apierrors import ApiError, describe_exception, redact_values

CANARY = "hunter2-CANARY-value"


@pytest.mark.parametrize(("message", "expected"), [
    (f'Secret "a-6drzm" is invalid: [metadata.labels: Invalid value: "{CANARY}": a valid '
     "label must be an empty string, data[bad key!]: Invalid value: \"bad key!\": a valid "
     "config key must consist of alphanumeric characters",
     'Secret "a-6drzm" is invalid: [metadata.labels: Invalid value: "[redacted]": a valid '
     'label must be an empty string, data[bad key!]: Invalid value: "[redacted]": a valid '
     "config key must consist of alphanumeric characters"),
    ('Secret "a-54zz5" is invalid: data[.dockercfg]: Invalid value: "<secret contents '
     "redacted>\": invalid character 'x' looking for beginning of value",
     'Secret "a-54zz5" is invalid: data[.dockercfg]: Invalid value: "[redacted]": invalid '
     "character 'x' looking for beginning of value"),
    (f'admission webhook "deny.example.com" denied the request: "{CANARY}" is weak',
     'admission webhook "deny.example.com" denied the request: "[redacted]" is weak'),
    (f'spec.type: Unsupported value: "{CANARY}": supported values: "A", "B"',
     'spec.type: Unsupported value: "[redacted]": supported values: "A", "B"'),
    (f'x: Invalid value: "a\\"{CANARY}" and a cut "{CANARY}',
     'x: Invalid value: "[redacted]" and a cut "[redacted]"'),
])
def test_quoted_values_are_redacted_and_the_rest_kept(message: str, expected: str) -> None:
    assert redact_values(message) == expected


@pytest.mark.parametrize("message", [
    'secrets "app" is forbidden: User "system:serviceaccount:himitsu-system:himitsu-operator"'
    ' cannot create resource "secrets" in API group "" in the namespace "apps"',
    'Operation cannot be fulfilled on secrets "app": the object has been modified',
    'leases.coordination.k8s.io "himitsu-operator" not found',
    'Secret "app" is invalid: [data[tls.crt]: Required value, data[tls.key]: Required value]',
    "Secret \"a\" is invalid: metadata.annotations: Too long: may not be more than 262144 bytes",
    "Timeout: Too large resource version: 123, current: 100",
    "too old resource version: 1 (2)",
])
def test_names_and_explanations_are_not_values(message: str) -> None:
    assert redact_values(message) == message


def test_every_way_of_making_an_api_error_redacts() -> None:
    message = f'data[A]: Invalid value: "{CANARY}"'
    body = json.dumps({"kind": "Status", "reason": "Invalid", "message": message}).encode()
    made = [ApiError.from_response(422, body), ApiError(422, "Invalid", message),
            ApiError.from_status({"kind": "Status", "code": 422, "message": message})]
    for error in made:
        for text in (error.message, str(error), repr(error), describe_exception(error)):
            assert CANARY not in text
            assert 'data[A]: Invalid value: "[redacted]"' in text or "Invalid value" in text


def test_a_long_message_is_cut_and_still_redacted() -> None:
    message = "x" * 990 + f'"{CANARY}"'
    assert CANARY[:5] not in ApiError(422, "Invalid", message).message
    assert len(ApiError(422, "Invalid", "y" * 5000).message) == 1000
