"""Tests for writes.py through the reconcile: a write the apiserver would refuse is never
half done, and a type change never deletes a working Secret.

The fake apiserver (fakes.FakeKube) refuses what kube-apiserver refuses (a well-known
type without its required keys, data over 1 MiB, annotations over 256 KiB), so on the
code before writes.py these tests watch a type change delete the application's Secret
and every refusal come back as a raw 422 WriteFailure.
"""

from __future__ import annotations

import base64
import json

import pytest
from fakes import b64
from reconcile_world import CANARY, NS, TARGET, World, fetched, merge_world, values

from himitsu_controller import api
from himitsu_controller.sync.ports import KubeError

TLS_AS_HIMITSU_NAMES = {"TLS_CRT": f"{CANARY}-crt", "TLS_KEY": f"{CANARY}-key"}
TLS_AS_DATA_KEYS = {"tls.crt": f"{CANARY}-crt", "tls.key": f"{CANARY}-key"}


def writes_of(world: World) -> list[str]:
    kinds = ("dry_run_create_secret", "create_secret", "update_secret", "delete_secret")
    return [call for call in world.kube.order if call in kinds]


def assert_no_value_in(text: str) -> None:
    assert CANARY not in text
    assert "Q0FOQVJZ" not in text  # nor its base64


# --- type changes ------------------------------------------------------------------------


def test_a_type_the_data_cannot_satisfy_keeps_the_old_secret_byte_for_byte() -> None:
    world = World()
    world.sync(5, TLS_AS_HIMITSU_NAMES)
    before = world.target()
    world.kube.order.clear()
    world.edit_target_spec(type="kubernetes.io/tls")

    result = world.reconcile(fetched(5, TLS_AS_HIMITSU_NAMES))

    assert result.error == "InvalidSpec"
    assert world.target() == before, "the working Secret was touched"
    assert writes_of(world) == []
    message = world.ready()["message"]
    assert "'tls.crt'" in message and "'tls.key'" in message and "'TLS_CRT'" in message
    assert_no_value_in(message)
    assert world.kube.events[-1].reason == "InvalidSpec"


def test_a_type_the_data_satisfies_is_proven_then_replaces_the_secret() -> None:
    world = World()
    world.sync(5, TLS_AS_DATA_KEYS)
    old_uid = world.target()["metadata"]["uid"]
    world.kube.order.clear()
    world.edit_target_spec(type="kubernetes.io/tls")

    world.sync(5, TLS_AS_DATA_KEYS)

    target = world.target()
    assert target["type"] == "kubernetes.io/tls"
    assert target["metadata"]["uid"] != old_uid
    assert world.data() == TLS_AS_DATA_KEYS
    assert writes_of(world) == ["dry_run_create_secret", "delete_secret", "create_secret"]
    assert world.ready()["reason"] == "Synced"


def test_a_replacement_the_apiserver_refuses_keeps_the_old_secret() -> None:
    # Admission (a webhook, a policy) may refuse what the local rules allow.
    world = World()
    world.sync(5)
    before = world.target()
    world.kube.order.clear()
    world.kube.fail_next["dry_run_create_secret"] = [KubeError(
        "checking a new Secret 'app-secrets' (dry run) failed: 403 Forbidden: admission "
        'webhook "policy.example.com" denied the request', status=403, reason="Forbidden")]
    world.edit_target_spec(type="example.com/custom")

    result = world.reconcile(fetched(5))

    assert result.error == "WriteFailure"
    assert world.target() == before
    assert writes_of(world) == ["dry_run_create_secret"]
    message = world.ready()["message"]
    assert "was kept as it is" in message and "policy.example.com" in message


def test_a_merge_target_of_another_type_is_never_replaced() -> None:
    world = merge_world()
    before = world.target()
    world.edit_target_spec(type="kubernetes.io/tls")
    assert world.reconcile(fetched(5, TLS_AS_DATA_KEYS)).error == "InvalidSpec"
    assert world.target() == before
    assert writes_of(world) == []


# --- required keys on any write ------------------------------------------------------------


@pytest.mark.parametrize(("target_type", "secrets", "named"), [
    ("kubernetes.io/tls", {"tls.crt": CANARY}, "'tls.key'"),
    ("kubernetes.io/basic-auth", {"user": CANARY}, "'username' or 'password'"),
    ("kubernetes.io/ssh-auth", {"ssh-privatekey": ""}, "'ssh-privatekey'"),
    ("kubernetes.io/dockerconfigjson", {"config": CANARY}, "'.dockerconfigjson'"),
    ("kubernetes.io/dockercfg", {".dockercfg": f"[{json.dumps(CANARY)}]"}, "'.dockercfg'"),
    ("kubernetes.io/service-account-token", {"token": CANARY}, "not supported"),
])
def test_a_first_create_the_type_refuses_is_invalid_spec_naming_the_key(
    target_type: str, secrets: dict[str, str], named: str,
) -> None:
    world = World(target_type=target_type)
    result = world.reconcile(fetched(5, secrets))
    assert result.error == "InvalidSpec"
    assert writes_of(world) == []
    message = world.ready()["message"]
    assert named in message
    assert_no_value_in(message)


@pytest.mark.parametrize(("target_type", "secrets"), [
    ("kubernetes.io/tls", {"tls.crt": CANARY, "tls.key": ""}),
    ("kubernetes.io/basic-auth", {"password": CANARY}),
    ("kubernetes.io/ssh-auth", {"ssh-privatekey": CANARY}),
    ("kubernetes.io/dockerconfigjson", {".dockerconfigjson": json.dumps({"auths": {}})}),
    ("bootstrap.kubernetes.io/token", {"anything": CANARY}),
])
def test_a_type_the_data_satisfies_is_written(target_type: str, secrets: dict[str, str]) -> None:
    world = World(target_type=target_type)
    world.sync(5, secrets)
    assert world.target()["type"] == target_type


def test_an_update_that_would_drop_a_required_key_leaves_the_secret_as_it_is() -> None:
    world = World(target_type="kubernetes.io/tls")
    world.sync(5, TLS_AS_DATA_KEYS)
    before = world.target()
    world.clock.advance(60)
    result = world.reconcile(fetched(6, {"tls.crt": CANARY}))
    assert result.error == "InvalidSpec" and "'tls.key'" in world.ready()["message"]
    assert world.target() == before


# --- sizes ---------------------------------------------------------------------------------


def test_a_merge_target_over_the_data_limit_is_invalid_spec_with_our_size_only() -> None:
    world = merge_world()
    big = base64.b64encode(b"x" * (1024 * 1024 - 10)).decode()
    world.kube.edit_secret(NS, TARGET, data={"HELM_KEY": big})
    before = world.target()
    result = world.reconcile(fetched(5, {"A": "0123456789ABCDEF"}))
    assert result.error == "InvalidSpec"
    message = world.ready()["message"]
    assert "the data from Himitsu is 16 bytes" in message
    assert "keys himitsu-operator does not manage count too" in message
    assert "1048582" not in message and "1048566" not in message  # their size: an oracle
    assert world.target() == before


def test_a_managed_keys_record_over_the_annotation_limit_is_invalid_spec_with_sizes() -> None:
    world = merge_world()
    before = world.target()
    many = {f"K{i:04d}" + "x" * 240: "v" for i in range(1100)}
    result = world.reconcile(fetched(5, many))
    assert result.error == "InvalidSpec"
    message = world.ready()["message"]
    assert api.ANN_MANAGED_KEYS in message and "1100 key names" in message
    assert "262144 bytes" in message
    assert world.target() == before
    assert writes_of(world) == []


def test_an_owner_target_at_the_data_limit_is_written() -> None:
    world = World()
    world.sync(5, {"A": "x" * (1024 * 1024)})
    assert world.data() == {"A": "x" * (1024 * 1024)}


def test_values_never_reach_a_size_message() -> None:
    world = merge_world()
    world.kube.edit_secret(NS, TARGET, data={"HELM_KEY": b64(CANARY * 60000)})
    world.reconcile(fetched(5, values()))
    assert_no_value_in(json.dumps(world.status()))
    assert_no_value_in(json.dumps([e.message for e in world.kube.events]))
