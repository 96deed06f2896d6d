"""What a user sees through kubectl: `explain` describes every field, `get -o wide` shows
why an object is not Ready, and `describe` after a failure tells the story in order."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from .harness import Harness
from .kubehelp import KubeApi, kubectl, wait_for

pytestmark = [pytest.mark.e2e]

CRD = Path(__file__).resolve().parents[2] / "deploy" / "crd" / "himitsu.io_himitsusecrets.yaml"


def schema_fields(schema: dict[str, Any], path: str) -> list[str]:
    """Field paths of the CRD's schema under ``path``, array items flattened as explain
    flattens them."""
    if schema.get("type") == "array":
        schema = schema.get("items", {})
    found = [path]
    for name, sub in schema.get("properties", {}).items():
        found += schema_fields(sub, f"{path}.{name}")
    return found


def explained_fields(kubeconfig: str, root: str) -> list[str]:
    """Every field path under ``root`` (a top-level field of HimitsuSecret), read from
    `kubectl explain himitsusecret --recursive`: two spaces of indent per level."""
    def explained() -> str | None:  # the OpenAPI of a CRD just installed comes later
        result = kubectl(kubeconfig, "explain", "himitsusecret", "--recursive", check=False)
        return result.stdout if result.returncode == 0 else None

    out = wait_for(explained, timeout=60, what="kubectl explain himitsusecret")
    fields = out.split("FIELDS:", 1)[1].splitlines()
    paths: list[str] = []
    stack: list[str] = []
    for line in fields:
        match = re.match(r"^( +)([A-Za-z0-9_]+)\t<", line)
        if match is None:  # an enum line, a blank
            continue
        depth = len(match.group(1)) // 2 - 1
        del stack[depth:]
        stack.append(match.group(2))
        if stack[0] == root:
            paths.append(".".join(stack))
    return paths


def description(kubeconfig: str, path: str) -> str:
    out = kubectl(kubeconfig, "explain", f"himitsusecret.{path}").stdout
    return " ".join(out.split("DESCRIPTION:", 1)[1].split())


@pytest.mark.parametrize("root", ["spec", "status"])
def test_kubectl_explain_describes_every_field(
        kube: KubeApi, operator_kubeconfig: str, root: str) -> None:
    """The CRD installed on a real apiserver, read back the way users read it: no field of
    spec or status prints an empty description."""
    paths = explained_fields(kube.kubeconfig, root)
    (crd,) = [d for d in yaml.safe_load_all(CRD.read_text()) if d]
    schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"][root]
    assert sorted(paths) == sorted(schema_fields(schema, root))  # explain lists them all
    empty = [p for p in paths if description(kube.kubeconfig, p) in ("", "<empty>")]
    assert empty == []


def test_kubectl_get_wide_shows_the_ready_reason_and_message(
        h: Harness, ns: str, kube: KubeApi, default_operator: object) -> None:
    env, _ = h.environment("API_KEY")
    h.hsec(ns, "app", env, target="app-secrets", refresh="5s")  # no token Secret
    h.wait_ready(ns, "app", reason="AuthenticationFailure", message_has="not found")

    out = kubectl(kube.kubeconfig, "-n", ns, "get", "hsec", "-o", "wide").stdout
    header, row = out.strip().splitlines()
    assert re.split(r"\s{2,}", header.strip()) == [
        "NAME", "SECRET", "KEYS", "VERSION", "READY", "REASON", "LAST SYNC", "AGE", "MESSAGE"]
    assert "False" in row and "AuthenticationFailure" in row
    assert "token Secret 'himitsu-token' not found" in row


def test_kubectl_describe_after_a_failure_gives_reason_message_and_events_in_order(
        h: Harness, ns: str, kube: KubeApi, default_operator: object) -> None:
    env, values = h.environment("API_KEY")
    h.hsec(ns, "app", env, target="app-secrets", refresh="5s")
    h.wait_ready(ns, "app", reason="AuthenticationFailure", message_has="not found")
    h.token_secret(ns, h.token_for(env))
    h.wait_ready(ns, "app")
    h.wait_data(ns, "app-secrets", values)
    wait_for(lambda: len(h.events(ns, "app")) >= 2, timeout=30, what="two Events")

    out = kubectl(kube.kubeconfig, "-n", ns, "describe", "hsec", "app").stdout
    events = out[out.index("Events:"):]
    failure = re.search(r"Warning\s+AuthenticationFailure\s.*not found", events)
    synced = re.search(r"Normal\s+Synced\s", events)
    assert failure and synced, out
    assert failure.start() < synced.start(), "Events out of order"
    status = out[out.index("Status:"):out.index("Events:")]
    assert re.search(r"Reason:\s+Synced", status), status
