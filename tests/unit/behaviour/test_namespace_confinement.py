"""What RBAC cannot express, enforced in code: Secrets of one namespace, labelled ones only.

A ClusterRole that lets the operator read Secrets lets it read every Secret in the
cluster, and ``list``/``watch`` cannot be narrowed to a label. deploy/rbac/role.yaml
therefore promises two things the code must keep by itself:

* a HimitsuSecret's Secrets (its token, its target) are only ever read or written in
  that HimitsuSecret's own namespace, so one namespace's owner can never make the
  operator read or overwrite another namespace's Secret;
* the operator lists and watches only Secrets labelled ``himitsu.io/managed=true``, so
  it never caches, or even lists, every Secret of the cluster.

Proved at three levels: the reconciler (every Kube call it makes, for hostile specs in
random namespaces, names that namespace), KubeClient (the paths on the wire stay inside
the namespace it is given, whatever the name), and ``cli.run`` (every Secret LIST and
WATCH it sends, against a fake apiserver, carries the label selector).
"""

from __future__ import annotations

import contextlib
import copy
import threading
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import pytest
from fake_apiserver import Canned, FakeApiServer, kubeconfig_for
from fakes import FakeFetcher, FakeKube, b64
from hypothesis import given, settings
from hypothesis import strategies as st
from reconcile_world import API, ENV, PROJECT, TOKEN, fetched, values

from himitsu_controller import api, cli, himitsu, kube
from himitsu_controller.runtime.cache.store import Store
from himitsu_controller.runtime.client.rest import ClientConfig, RestClient, new_api_client
from himitsu_controller.sync.ports import SecretNotFound, SecretValue
from himitsu_controller.sync.reconciler import HimitsuSecretReconciler

# --- the reconciler ---------------------------------------------------------------------


class RecordingKube(FakeKube):
    """FakeKube noting the namespace of every call the reconciler makes."""

    def __init__(self) -> None:
        super().__init__()
        self.namespaces: list[tuple[str, str]] = []

    def _note(self, method: str, namespace: str) -> None:
        self.namespaces.append((method, namespace))

    def get_himitsu_secret(self, namespace: str, name: str) -> dict[str, Any] | None:
        self._note("get_himitsu_secret", namespace)
        return super().get_himitsu_secret(namespace, name)

    def get_secret(self, namespace: str, name: str, *, fresh: bool = False,
                   cached: bool = False) -> dict[str, Any] | None:
        self._note("get_secret", namespace)
        return super().get_secret(namespace, name, fresh=fresh, cached=cached)

    def read_secret_value(
        self, namespace: str, name: str, key: str, *, for_url: str | None = None,
        max_age: float | None = None,
    ) -> SecretValue:
        self._note("read_secret_value", namespace)
        return super().read_secret_value(namespace, name, key, for_url=for_url,
                                         max_age=max_age)

    def forget_secret_value(self, namespace: str, name: str, key: str) -> None:
        self._note("forget_secret_value", namespace)
        super().forget_secret_value(namespace, name, key)

    def create_secret(self, namespace: str, body: dict[str, Any]) -> dict[str, Any]:
        self._note("create_secret", namespace)
        self._note("create_secret body", str(body["metadata"].get("namespace", namespace)))
        return super().create_secret(namespace, body)

    def update_secret(self, namespace: str, body: dict[str, Any]) -> dict[str, Any]:
        self._note("update_secret", namespace)
        self._note("update_secret body", str(body["metadata"].get("namespace", namespace)))
        return super().update_secret(namespace, body)

    def delete_secret(self, namespace: str, name: str, *, uid: str,
                      resource_version: str | None = None) -> None:
        self._note("delete_secret", namespace)
        super().delete_secret(namespace, name, uid=uid, resource_version=resource_version)

    def secrets_owned_by(self, namespace: str, uid: str) -> list[dict[str, Any]]:
        self._note("secrets_owned_by", namespace)
        return super().secrets_owned_by(namespace, uid)

    def patch_status(self, namespace: str, name: str, status: dict[str, Any], *,
                     uid: str = "") -> None:
        self._note("patch_status", namespace)
        super().patch_status(namespace, name, status, uid=uid)

    def record_event(self, obj: Mapping[str, Any], *, type: str, reason: str,
                     message: str) -> None:
        self._note("record_event", str((obj.get("metadata") or {}).get("namespace")))
        super().record_event(obj, type=type, reason=reason, message=message)


namespaces = st.from_regex(r"[a-z0-9]([a-z0-9-]{0,10}[a-z0-9])?", fullmatch=True)
NEIGHBOUR = "kube-system"
TOKEN_NAME, TARGET_NAME = "himitsu-token", "app-secrets"

spec_edits = st.sampled_from([
    {}, {"authSecretRef": {"name": TOKEN_NAME, "namespace": NEIGHBOUR}},
    {"authSecretRef": {"name": TOKEN_NAME, "namespace": "same"}},
    {"target": {"name": f"{NEIGHBOUR}/{TARGET_NAME}"}},
    {"target": {"name": "../kube-system/secrets/app-secrets"}},
    {"target": {"name": TARGET_NAME, "namespace": NEIGHBOUR}},
    {"target": {"name": TARGET_NAME, "creationPolicy": "Merge"}},
    {"target": {"name": TARGET_NAME, "type": "kubernetes.io/tls"}},
    {"authSecretRef": {"name": "neighbours-only-token"}},
])
scripts = st.lists(st.sampled_from([
    fetched(5), fetched(6, values(3)), himitsu.NotModified(5),
    himitsu.Unauthorized("the Himitsu API rejected the token (401)", status=401),
    himitsu.ServerError("Himitsu API answered 503", status=503),
]), min_size=1, max_size=3)


def neighbour_secrets(world: RecordingKube) -> None:
    """Secrets a careless operator might touch: same names, another namespace."""
    for name in (TOKEN_NAME, TARGET_NAME, "neighbours-only-token"):
        world.put_secret({"metadata": {"namespace": NEIGHBOUR, "name": name},
                          "data": {"token": b64(TOKEN)}})


@settings(max_examples=80, deadline=None)
@given(namespace=namespaces.filter(lambda n: n != NEIGHBOUR), edit=spec_edits, script=scripts)
def test_the_reconciler_only_touches_its_own_namespace(
    namespace: str, edit: dict[str, Any], script: list[Any],
) -> None:
    fake = RecordingKube()
    neighbour_secrets(fake)
    before = copy.deepcopy({k: v for k, v in fake.secrets.items() if k[0] == NEIGHBOUR})
    fake.put_secret({"metadata": {"namespace": namespace, "name": TOKEN_NAME},
                     "data": {"token": b64(TOKEN)}})
    spec: dict[str, Any] = {
        "apiUrl": API, "projectId": PROJECT, "environmentId": ENV,
        "authSecretRef": {"name": TOKEN_NAME}, "target": {"name": TARGET_NAME},
    }
    edit = copy.deepcopy(edit)
    if (edit.get("authSecretRef") or {}).get("namespace") == "same":
        edit["authSecretRef"]["namespace"] = namespace
    spec.update(edit)
    fake.add_himitsu_secret({"apiVersion": api.API_VERSION, "kind": api.KIND,
                             "metadata": {"namespace": namespace, "name": "app"}, "spec": spec})
    fetcher = FakeFetcher(*script)
    reconciler = HimitsuSecretReconciler(fake, fetcher)
    for _ in script:
        reconciler.reconcile(f"{namespace}/app")
    assert fake.namespaces, "the reconciler made no Kube call at all"
    assert {ns for _, ns in fake.namespaces} == {namespace}, fake.namespaces
    assert {k: v for k, v in fake.secrets.items() if k[0] == NEIGHBOUR} == before
    for call in fetcher.calls:  # a token from another namespace never reaches Himitsu
        assert call.token == TOKEN
    assert all(ns == namespace for ns, _ in fake.secrets if ns != NEIGHBOUR)


def test_a_token_in_another_namespace_is_not_found() -> None:
    """The other side of the same rule: a token that only exists next door is missing."""
    fake = RecordingKube()
    neighbour_secrets(fake)
    fake.add_himitsu_secret({"apiVersion": api.API_VERSION, "kind": api.KIND,
                             "metadata": {"namespace": "apps", "name": "app"},
                             "spec": {"apiUrl": API, "projectId": PROJECT, "environmentId": ENV,
                                      "authSecretRef": {"name": "neighbours-only-token"},
                                      "target": {"name": TARGET_NAME}}})
    fetcher = FakeFetcher()
    HimitsuSecretReconciler(fake, fetcher).reconcile("apps/app")
    (cond,) = fake.status("apps", "app")["conditions"]
    assert (cond["reason"], fetcher.calls) == ("AuthenticationFailure", [])
    assert "not found in namespace 'apps'" in cond["message"]


# --- KubeClient, on the wire ----------------------------------------------------------------


@pytest.fixture(scope="module")
def apiserver() -> Iterator[FakeApiServer]:
    server = FakeApiServer(list_kind="SecretList", api_version="v1").start()
    yield server
    server.stop()


names = st.text(st.characters(exclude_categories=("Cs", "Co")), min_size=1,
                max_size=30).filter(lambda n: n not in (".", ".."))
NASTY_NAMES = ["../kube-system/secrets/x", "..%2F..%2Fkube-system", "a/b", "x?watch=1#f", "...",
               "\u00e9\u202e"]


class PathRecorder(RestClient):
    """RestClient whose requests go nowhere: (method, path, query) are recorded."""

    def __init__(self) -> None:
        # Port 9 (discard) on loopback, never contacted: _send is replaced below.
        super().__init__(new_api_client(ClientConfig("http://127.0.0.1:9")),
                         qps=1e6, burst=1_000_000)
        self.sent: list[tuple[str, str, Mapping[str, Any] | None]] = []

    def _send(self, method: str, path: str, *, query: Mapping[str, Any] | None, body: Any,
              content_type: str | None, timeout: float, verb: str,
              ) -> tuple[int, bytes, dict[str, str]]:
        self.sent.append((method, path, query))
        return (404, b"{}", {}) if method == "GET" else (200, b"{}", {})


def exercise(client: kube.KubeClient, namespace: str, name: str) -> None:
    """Every KubeClient method, for one namespace and one (possibly hostile) name."""
    body = {"metadata": {"name": name, "namespace": namespace}, "data": {}}
    client.get_secret(namespace, name, fresh=True)
    with contextlib.suppress(SecretNotFound):  # not in any cache: always read directly
        client.read_secret_value(namespace, name, "token")
    client.create_secret(namespace, body)
    client.update_secret(namespace, body)
    client.delete_secret(namespace, name, uid="u")
    client.patch_status(namespace, name, {"secretCount": 1})
    client.record_event({"metadata": {"namespace": namespace, "name": name}},
                        type="Normal", reason="Synced", message="m")


def assert_inside(path: str, namespace: str, name: str) -> None:
    # /api/v1/namespaces/<ns>/<plural>[/<name>[/status]] or /apis/<g>/<v>/namespaces/...
    parts = [unquote(part) for part in path.split("/")[1:]]
    at = parts.index("namespaces")
    assert parts[:at] in (["api", "v1"], ["apis", api.GROUP, api.VERSION]), path
    assert parts[at + 1] == namespace, path
    tail = parts[at + 2:]
    assert tail[0] in ("secrets", "events", api.PLURAL), path
    assert tail[1:] in ([], [name], [name, "status"]), path


@settings(max_examples=120, deadline=None)
@given(namespace=namespaces, name=names)
def test_kube_client_paths_stay_inside_the_namespace(namespace: str, name: str) -> None:
    rest = PathRecorder()
    exercise(kube.KubeClient(rest, himitsu_secrets=Store(), secrets=Store()), namespace, name)
    assert len(rest.sent) == 7  # the token read went out: nothing was answered from a cache
    for _, path, query in rest.sent:
        assert_inside(path, namespace, name)
        assert not query  # no selectors, no watches: single objects only


@pytest.mark.parametrize("name", NASTY_NAMES)
def test_on_the_wire_requests_stay_inside_the_namespace(
    apiserver: FakeApiServer, name: str,
) -> None:
    """What arrives at a server, after urllib3 had its say (it resolves dot segments)."""
    rest = RestClient(apiserver.api_client())
    start = len(apiserver.requests)
    exercise(kube.KubeClient(rest, himitsu_secrets=Store(), secrets=Store()), "apps", name)
    sent = apiserver.requests[start:]
    assert len(sent) == 7
    for request in sent:
        assert_inside(request.path, "apps", name)
    rest.api_client.close()


@pytest.mark.parametrize("bad", ["", ".", ".."])
def test_kube_client_refuses_names_that_would_leave_the_namespace(
    apiserver: FakeApiServer, bad: str,
) -> None:
    rest = RestClient(apiserver.api_client())
    client = kube.KubeClient(rest, himitsu_secrets=Store(), secrets=Store())
    start = len(apiserver.requests)
    with pytest.raises(ValueError):
        client.get_secret("apps", bad, fresh=True)
    with pytest.raises(ValueError):
        client.get_secret(bad, "x", fresh=True)
    assert apiserver.requests[start:] == []
    rest.api_client.close()


# --- cli.run: the Secret informer -------------------------------------------------------------


@pytest.mark.timeout(60)
@pytest.mark.parametrize("namespace", [None, "apps"])
def test_cli_lists_and_watches_only_labelled_secrets(
    tmp_path: Path, namespace: str | None,
) -> None:
    server = FakeApiServer(list_kind="SecretList", api_version="v1").start()
    try:
        # The start-up reachability check is the first request: answer it as an empty
        # HimitsuSecret list (the fake serves no himitsusecrets collection otherwise).
        server.canned.append(Canned(200, {"kind": "HimitsuSecretList", "items": [],
                                          "metadata": {"resourceVersion": "1"}}))
        argv = ["--kubeconfig", str(kubeconfig_for(server, tmp_path / "kc")),
                "--metrics-bind-address", "0", "--health-probe-bind-address", "0",
                "--log-level", "warning"]
        args = cli.build_parser().parse_args(argv + (["--namespace", namespace]
                                                     if namespace else []))
        stop = threading.Event()
        runner = threading.Thread(target=cli.run, args=(args,), kwargs={"stop": stop},
                                  daemon=True)
        runner.start()
        try:
            watch = server.next_watch(timeout=30)  # the Secret informer's watch is open
        finally:
            stop.set()
            runner.join(timeout=30)
        assert not runner.is_alive()
        selector = f"{api.LABEL_MANAGED}=true"
        assert watch.query.get("labelSelector") == selector
        prefix = f"/api/v1/namespaces/{namespace}" if namespace else "/api/v1"
        secret_requests = [r for r in server.requests if "/secrets" in r.path]
        assert {r.path for r in secret_requests} == {f"{prefix}/secrets"}
        assert {r.query.get("watch") for r in secret_requests} == {None, "true"}
        for request in secret_requests:  # every LIST and WATCH of Secrets, none unselected
            assert request.query.get("labelSelector") == selector, request
            assert request.method == "GET"
    finally:
        server.stop()
