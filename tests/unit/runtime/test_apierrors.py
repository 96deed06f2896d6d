"""Tests for runtime/client/errors.py: an ApiError never carries a value of the object refused.

The apiserver's Status message quotes what it refused (validation: ``Invalid value:
"..."``; admission webhooks: free text), and that message travels into logs, status
conditions and Events. The messages below are the apiserver's own (kube-apiserver 1.36
on the local control plane), with a canary where the value was.
"""

from __future__ import annotations

import json

import pytest

from himitsu_controller.runtime.client.errors import ApiError, describe_exception, redact_values

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
     'character "[redacted]" looking for beginning of value'),
    (f'admission webhook "deny.example.com" denied the request: "{CANARY}" is weak',
     'admission webhook "deny.example.com" denied the request'),
    ('Secret "a" is invalid: data: Forbidden: field is immutable when `immutable` is set',
     'Secret "a" is invalid: data: Forbidden: field is immutable when `immutable` is set'),
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


# Every shape an admission denial's free text may take (review of issue 12 item 4). The
# apiserver words who denied; the rest is the webhook's or the policy's own text.
FREE_TEXT = [
    f"password '{CANARY}' is too weak",
    f"value `{CANARY}` not allowed",
    f"password={CANARY} is too weak",
    f'{{"data":{{"password":"{CANARY}"}}}}',
    f'Secret "app" has data.password "{CANARY}"',
    f'the value of user "{CANARY}" is forbidden',
    f'key token in namespace "{CANARY}"',
    f'value "abc"{CANARY}" bad',
    f'supported values: "{CANARY}"',
    f"\u201c{CANARY}\u201d is not allowed".encode().decode("unicode_escape"),
    f'value \\"{CANARY}\\" rejected',
    f'group "{CANARY}" not allowed',
    f"[secret {CANARY}]",
    f"tls key must be a PEM, got {CANARY}",  # a CEL messageExpression printing the data
]
DENIERS = [
    ('admission webhook "deny.example.com" denied the request: ',
     'admission webhook "deny.example.com" denied the request'),
    ("ValidatingAdmissionPolicy 'rb-x' with binding 'rb-y' denied request: ",
     "ValidatingAdmissionPolicy 'rb-x' with binding 'rb-y' denied request"),
    ('secrets "app" is forbidden: ValidatingAdmissionPolicy \'p\' with binding \'b\' '
     "denied request: ",
     "secrets \"app\" is forbidden: ValidatingAdmissionPolicy 'p' with binding 'b' "
     "denied request"),
]


@pytest.mark.parametrize("text", FREE_TEXT)
@pytest.mark.parametrize(("denier", "kept"), DENIERS)
@pytest.mark.parametrize(("status", "reason"), [
    (403, "Forbidden"), (422, "Invalid"), (400, "BadRequest"), (409, "AlreadyExists"),
    (500, "InternalError"), (429, "TooManyRequests")])
def test_an_admission_denial_keeps_who_denied_and_none_of_its_text(
    text: str, denier: str, kept: str, status: int, reason: str,
) -> None:
    body = json.dumps({"kind": "Status", "code": status, "reason": reason,
                       "message": denier + text}).encode()
    error = ApiError.from_response(status, body)
    assert error.message == kept
    assert CANARY not in str(error) and CANARY[:7] not in repr(error)
    assert (error.status, error.reason) == (status, reason)


@pytest.mark.parametrize("text", FREE_TEXT)
@pytest.mark.parametrize("status", [400, 403, 422])
def test_a_refusal_in_none_of_the_apiservers_shapes_keeps_no_text(text: str, status: int) -> None:
    assert CANARY not in ApiError(status, "Forbidden", text).message


@pytest.mark.parametrize("quoted", [
    f"'{CANARY}'", f"`{CANARY}`", f"\u201c{CANARY}\u201d", f"\u2018{CANARY}\u2019",
    f'"{CANARY}"'])
def test_every_kind_of_quote_is_redacted_in_the_apiservers_own_text(quoted: str) -> None:
    quoted = quoted.encode().decode("unicode_escape") if "\\u" in quoted else quoted
    message = f'Secret "app" is invalid: data[k]: Invalid value: {quoted}: bad'
    assert CANARY not in redact_values(message, status=422)
    assert redact_values(message, status=422).startswith('Secret "app" is invalid: data[k]:')


def test_every_way_of_making_an_api_error_redacts() -> None:
    message = f'Secret "a" is invalid: data[A]: Invalid value: "{CANARY}"'
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
    assert len(ApiError(500, "InternalError", "y" * 5000).message) == 1000
