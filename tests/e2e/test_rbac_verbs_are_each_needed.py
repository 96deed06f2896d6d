"""Every RBAC verb deploy/ grants is needed: without it, the code that uses it gets a 403.

deploy/rbac/role.yaml, leader_election_role.yaml and the rollout-restart role
(deploy/components/rollout-restarts, granted when that feature is on) claim least
privilege. The rest of
the e2e suite proves the roles are *enough* (the operator runs as a ServiceAccount bound
to them); this module proves each verb is *needed*, without a whole suite run per verb.
For every (apiGroup, resource, verb) the two roles grant, a ServiceAccount is bound to
the roles minus that one verb, and the one operator code path that uses it runs in this
process with that ServiceAccount's kubeconfig: a KubeClient call, an Informer's LIST or
WATCH, a LeaderElector's Lease call, or the CLI's start-up reachability check. It must be
refused with 403; with the full roles the very same call must succeed. A verb added to
the roles without such a check fails ``test_every_granted_verb_has_a_check``.

``himitsusecrets/finalizers update`` is only ever asked for by the
OwnerReferencesPermissionEnforcement admission plugin (OpenShift, hardened clusters),
for the blockOwnerDeletion flag on an Owner target's controller reference, so it is
proved on a kube-apiserver with that plugin on: the session's cluster if it has it,
otherwise one this module starts.
"""

from __future__ import annotations

import base64
import functools
import secrets
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from himitsu_controller import api, cli, kube
from himitsu_controller.runtime.cache.informer import Informer
from himitsu_controller.runtime.cache.store import Store
from himitsu_controller.runtime.client.rest import ApiError, Resource, RestClient, load_api_client
from himitsu_controller.runtime.leader.election import LeaderElectionConfig, LeaderElector
from himitsu_controller.sync.ports import KubeError
from himitsu_controller.sync.target import targets
from localcluster import LocalCluster

from . import cluster_setup
from .canary import Canary, LeakEvidence
from .cluster_setup import Cluster
from .kubehelp import REPO, KubeApi, hsec_path, secret_path, wait_for

pytestmark = pytest.mark.e2e

PLUGIN = "OwnerReferencesPermissionEnforcement"
Grant = tuple[str, str, str]
RBAC = REPO / "deploy" / "rbac"
RESTART_ROLE = REPO / "deploy" / "components" / "rollout-restarts" / "role.yaml"
OPERATOR_RULES: list[dict[str, Any]] = [
    *yaml.safe_load((RBAC / "role.yaml").read_text())["rules"],
    *yaml.safe_load(RESTART_ROLE.read_text())["rules"]]
LEASE_RULES: list[dict[str, Any]] = yaml.safe_load(
    (RBAC / "leader_election_role.yaml").read_text())["rules"]
FINALIZERS: Grant = ("himitsu.io", "himitsusecrets/finalizers", "update")
SA_NAMESPACE = cluster_setup.OPERATOR_NAMESPACE
WAIT = 30.0


def grants(rules: list[dict[str, Any]]) -> list[Grant]:
    return sorted({(g, r, v) for rule in rules for g in rule["apiGroups"]
                   for r in rule["resources"] for v in rule["verbs"]})


def without(rules: list[dict[str, Any]], grant: Grant | None) -> list[dict[str, Any]]:
    """The rules with one (group, resource, verb) taken away, and nothing else (their
    resourceNames kept)."""
    out = []
    for rule in rules:
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                verbs = [v for v in rule["verbs"] if (group, resource, v) != grant]
                if verbs:
                    names = {"resourceNames": rule["resourceNames"]} if rule.get(
                        "resourceNames") else {}
                    out.append({"apiGroups": [group], "resources": [resource], "verbs": verbs,
                                **names})
    return out


class RecordingRest(RestClient):
    """The operator's RestClient, noting every status the apiserver refused with."""

    def __init__(self, kubeconfig: Path) -> None:
        super().__init__(load_api_client(str(kubeconfig)), qps=200, burst=200)
        self.refusals: list[int] = []

    def request(self, method: str, path: str, **kwargs: Any) -> dict[str, Any]:
        try:
            return super().request(method, path, **kwargs)
        except ApiError as exc:
            self.refusals.append(exc.status)
            raise

    def watch(self, path: str, **kwargs: Any) -> Any:
        try:
            return super().watch(path, **kwargs)
        except ApiError as exc:
            self.refusals.append(exc.status)
            raise


@dataclass
class Env:
    """One cluster prepared for the checks: a namespace, objects, one identity per grant."""

    kube: KubeApi
    namespace: str
    workdir: Path
    token: str
    owner: dict[str, Any] = field(default_factory=dict)
    kubeconfigs: dict[Grant | None, Path] = field(default_factory=dict)

    def rest(self, grant: Grant | None) -> RecordingRest:
        """A client authenticated as the identity lacking ``grant`` (None: the full roles)."""
        return RecordingRest(self.kubeconfigs[grant])

    def secret(self, name: str, **labels: str) -> dict[str, Any]:
        body = {"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
                "metadata": {"name": name, "namespace": self.namespace, "labels": labels},
                "data": {"k": base64.b64encode(b"v").decode()}}
        return self.kube.create(secret_path(self.namespace), body)


def unique(prefix: str) -> str:
    return f"{prefix}-{secrets.token_hex(4)}"


# --- preparing a cluster ------------------------------------------------------------------


def prepare(kube_api: KubeApi, workdir: Path, canary: Canary, wanted: list[Grant]) -> Env:
    cluster_setup.install_crd(kube_api)
    namespace = unique("rbac-verbs")
    for ns in (SA_NAMESPACE, namespace):
        cluster_setup.ensure_namespace(kube_api, ns, labels={"himitsu.test/e2e": "true"})
    env = Env(kube_api, namespace, workdir, canary.token())
    env.kube.create(secret_path(namespace), {
        "apiVersion": "v1", "kind": "Secret", "metadata": {"name": "rbac-token"},
        "data": {"token": base64.b64encode(env.token.encode()).decode()}})
    env.owner = env.kube.create(hsec_path(namespace), {
        "apiVersion": api.API_VERSION, "kind": api.KIND, "metadata": {"name": "rbac-owner"},
        # Loopback's discard port: should an operator of the session reconcile it,
        # its request goes nowhere beyond this machine.
        "spec": {"apiUrl": "http://127.0.0.1:9",
                 "projectId": "11111111-1111-1111-1111-111111111111",
                 "environmentId": "22222222-2222-2222-2222-222222222222",
                 "authSecretRef": {"name": "rbac-token"}, "target": {"name": "rbac-target"}}})
    for kind in api.WORKLOAD_KINDS:
        env.kube.create(f"/apis/apps/v1/namespaces/{namespace}/{kind.lower()}s",
                        workload(kind))
    for grant in [None, *wanted]:
        env.kubeconfigs[grant] = _identity(env, grant)
    return env


WORKLOAD = "rbac-web"


def workload(kind: str) -> dict[str, Any]:
    """The smallest valid apps/v1 workload (the local control plane runs no pods)."""
    labels = {"app": WORKLOAD}
    spec: dict[str, Any] = {
        "selector": {"matchLabels": labels},
        "template": {"metadata": {"labels": labels},
                     "spec": {"containers": [{"name": "app", "image": "example.com/app"}]}}}
    if kind == "StatefulSet":
        spec["serviceName"] = WORKLOAD
    return {"apiVersion": "apps/v1", "kind": kind, "metadata": {"name": WORKLOAD},
            "spec": spec}


def _identity(env: Env, grant: Grant | None) -> Path:
    """A ServiceAccount bound to the operator's roles minus ``grant``; its kubeconfig."""
    name = unique("rbac-full" if grant is None else "rbac-minus")
    labels = {"himitsu.test/rbac-verbs": env.namespace}
    subject = [{"kind": "ServiceAccount", "name": name, "namespace": SA_NAMESPACE}]
    rbac = "/apis/rbac.authorization.k8s.io/v1"
    env.kube.create(f"/api/v1/namespaces/{SA_NAMESPACE}/serviceaccounts",
                    {"metadata": {"name": name, "labels": labels}})
    env.kube.create(f"{rbac}/clusterroles", {
        "metadata": {"name": name, "labels": labels}, "rules": without(OPERATOR_RULES, grant)})
    env.kube.create(f"{rbac}/clusterrolebindings", {
        "metadata": {"name": name, "labels": labels}, "subjects": subject,
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                    "name": name}})
    env.kube.create(f"{rbac}/namespaces/{env.namespace}/roles", {
        "metadata": {"name": name}, "rules": without(LEASE_RULES, grant)})
    env.kube.create(f"{rbac}/namespaces/{env.namespace}/rolebindings", {
        "metadata": {"name": name}, "subjects": subject,
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name}})
    # The authorizer's caches lag behind RBAC writes: wait until both bindings are in
    # effect, judged by a verb each of the two roles still grants.
    for rules in (without(OPERATOR_RULES, grant), without(LEASE_RULES, grant)):
        probe = next(g for g in grants(rules) if "/" not in g[1])
        wait_for(functools.partial(_allowed, env, name, probe), timeout=WAIT,
                 what=f"RBAC for {name} to take effect")
    return cluster_setup.service_account_kubeconfig(env.kube, name, env.workdir / f"{name}.kc")


def _allowed(env: Env, sa: str, grant: Grant) -> bool:
    group, resource, verb = grant
    review = env.kube.create("/apis/authorization.k8s.io/v1/subjectaccessreviews", {
        "apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
        "spec": {"user": cluster_setup.username(sa),
                 "groups": ["system:serviceaccounts", f"system:serviceaccounts:{SA_NAMESPACE}",
                            "system:authenticated"],
                 "resourceAttributes": {"group": group, "resource": resource, "verb": verb,
                                        "namespace": env.namespace,
                                        # the Lease rules name their one Lease
                                        **({"name": cli.LEASE_NAME} if resource == "leases"
                                           else {})}}})
    return bool(review["status"].get("allowed"))


def cleanup(env: Env, evidence: LeakEvidence) -> None:
    evidence.collect_namespace(env.kube, env.namespace)
    selector = f"himitsu.test/rbac-verbs={env.namespace}"
    rbac = "/apis/rbac.authorization.k8s.io/v1"
    env.kube.delete(f"{rbac}/clusterrolebindings", labelSelector=selector)
    env.kube.delete(f"{rbac}/clusterroles", labelSelector=selector)
    env.kube.delete(f"/api/v1/namespaces/{SA_NAMESPACE}/serviceaccounts",
                    labelSelector=selector)
    env.kube.delete(f"/api/v1/namespaces/{env.namespace}")


# --- the code paths, one per grant ---------------------------------------------------------
# Each returns True when the operation did what the operator needs, False when refused.


def kube_client(rest: RestClient) -> kube.KubeClient:
    return kube.KubeClient(rest, himitsu_secrets=Store(), secrets=Store())


def succeeds(call: Callable[[], object]) -> bool:
    try:
        call()
    except KubeError:
        return False
    return True


def informer_sees(env: Env, rest: RecordingRest, resource: Resource, *, selector: str | None,
                  change: Callable[[], str]) -> bool:
    """The operator's informer lists, then sees ``change`` arrive through its watch."""
    informer = Informer(rest, resource, label_selector=selector, name="rbac-check")
    stop = threading.Event()
    thread = threading.Thread(target=informer.run, args=(stop,), daemon=True)
    thread.start()
    try:
        wait_for(lambda: informer.has_synced() or 403 in rest.refusals, timeout=WAIT,
                 what="the informer's LIST (synced or refused)")
        if not informer.has_synced():
            return False
        key = change()
        wait_for(lambda: informer.store.get(key) is not None or 403 in rest.refusals,
                 timeout=WAIT, what="the informer's WATCH (an event or a refusal)")
        # A refused watch is a failure even if a relist later finds the object.
        return 403 not in rest.refusals and informer.store.get(key) is not None
    finally:
        stop.set()
        thread.join(timeout=WAIT)


def new_secret(env: Env) -> Callable[[], str]:
    def change() -> str:
        name = unique("watched")
        env.secret(name, **{api.LABEL_MANAGED: "true"})
        return f"{env.namespace}/{name}"
    return change


def new_himitsu_secret(env: Env) -> Callable[[], str]:
    def change() -> str:
        body = {**env.owner, "metadata": {"name": unique("watched")}}
        env.kube.create(hsec_path(env.namespace), body)
        return f"{env.namespace}/{body['metadata']['name']}"
    return change


def elector(env: Env, rest: RestClient, lease: str) -> LeaderElector:
    config = LeaderElectionConfig(namespace=env.namespace, name=lease, identity="rbac-check")
    return LeaderElector(rest, config, on_started_leading=lambda: None,
                         on_stopped_leading=lambda: None)


LEASES = "/apis/coordination.k8s.io/v1/namespaces/{}/leases"


def no_lease(env: Env) -> str:
    """The operator's Lease name (the rules name it), with no such Lease yet."""
    env.kube.delete(f"{LEASES.format(env.namespace)}/{cli.LEASE_NAME}")
    wait_for(lambda: env.kube.get_or_none(f"{LEASES.format(env.namespace)}/{cli.LEASE_NAME}")
             is None, timeout=WAIT, what="the Lease deleted")
    return cli.LEASE_NAME


def released_lease(env: Env) -> str:
    name = no_lease(env)
    env.kube.create(LEASES.format(env.namespace), {
        "metadata": {"name": name}, "spec": {"leaseDurationSeconds": 1}})
    return name


def owner_target(env: Env) -> dict[str, Any]:
    """What the reconciler creates for an Owner target: a controller reference with
    blockOwnerDeletion=true to the HimitsuSecret."""
    meta = env.owner["metadata"]
    spec = api.parse_spec(env.owner)
    body = targets.desired_secret(
        None, owner=targets.Owner(env.namespace, meta["name"], meta["uid"]), spec=spec,
        rendered={"A": base64.b64encode(b"x").decode()}, version=1, data_id="d1")
    body["metadata"]["name"] = unique("owned")
    return body


def updated_secret(env: Env) -> dict[str, Any]:
    body = env.secret(unique("updated"))
    body["data"] = {"k": base64.b64encode(b"w").decode()}
    return body


def starts_up(env: Env, rest: RecordingRest) -> bool:
    """cli's reachability check (one LIST, limit=1), then the HimitsuSecret informer."""
    try:
        cli._check_reachable(rest, None)
    except ApiError:
        return False
    return informer_sees(env, rest, kube.HIMITSU_SECRETS, selector=None,
                         change=new_himitsu_secret(env))


def creates(rest: RecordingRest, namespace: str, body: dict[str, Any]) -> bool:
    """The dry-run create that vouches for a type change's replacement, then the create:
    one verb for both (admission plugins see a dry run too)."""
    client = kube_client(rest)
    return (succeeds(lambda: client.dry_run_create_secret(namespace, body))
            and succeeds(lambda: client.create_secret(namespace, body)))


def deletes(env: Env, rest: RecordingRest) -> bool:
    doomed = env.secret(unique("deleted"))
    meta = doomed["metadata"]
    return succeeds(lambda: kube_client(rest).delete_secret(
        env.namespace, meta["name"], uid=meta["uid"]))


def watches_secrets(env: Env, rest: RecordingRest) -> bool:
    return informer_sees(env, rest, kube.SECRETS, selector=f"{api.LABEL_MANAGED}=true",
                         change=new_secret(env))


def acquires(env: Env, rest: RecordingRest, lease: str) -> bool:
    return elector(env, rest, lease).try_acquire_or_renew(timeout=WAIT)


CHECKS: dict[Grant, Callable[[Env, RecordingRest], bool]] = {
    ("himitsu.io", "himitsusecrets", "list"): starts_up,
    ("himitsu.io", "himitsusecrets", "watch"): starts_up,
    ("himitsu.io", "himitsusecrets/status", "patch"): lambda env, rest: succeeds(
        lambda: kube_client(rest).patch_status(
            env.namespace, env.owner["metadata"]["name"], {"secretCount": 0})),
    FINALIZERS: lambda env, rest: creates(rest, env.namespace, owner_target(env)),
    ("", "secrets", "get"): lambda env, rest: succeeds(
        lambda: kube_client(rest).read_secret_value(env.namespace, "rbac-token", "token")),
    ("", "secrets", "list"): watches_secrets,
    ("", "secrets", "watch"): watches_secrets,
    ("", "secrets", "create"): lambda env, rest: creates(rest, env.namespace, {
        "apiVersion": "v1", "kind": "Secret", "metadata": {"name": unique("created")},
        "data": {}}),
    ("", "secrets", "update"): lambda env, rest: succeeds(
        lambda: kube_client(rest).update_secret(env.namespace, updated_secret(env))),
    ("", "secrets", "delete"): deletes,
    **{("apps", f"{kind.lower()}s", "get"): functools.partial(
        lambda kind, env, rest: succeeds(lambda: kube_client(rest).get_workload(
            env.namespace, kind, WORKLOAD)), kind) for kind in api.WORKLOAD_KINDS},
    **{("apps", f"{kind.lower()}s", "patch"): functools.partial(
        lambda kind, env, rest: succeeds(lambda: kube_client(rest).patch_workload(
            env.namespace, kind, WORKLOAD, resource_version=env.kube.get(
                f"/apis/apps/v1/namespaces/{env.namespace}/{kind.lower()}s/{WORKLOAD}")[
                "metadata"]["resourceVersion"],
            annotations={api.ANN_STARTED_WITH: "rbac-owner=0123456789abcdef"},
            template={api.ANN_RESTARTED_AT: "2026-12-01T12:00:00.000000Z"})), kind)
       for kind in api.WORKLOAD_KINDS},
    ("", "events", "create"): lambda env, rest: succeeds(
        lambda: kube_client(rest).record_event(
            env.owner, type="Normal", reason="Synced", message="an RBAC check")),
    # No Lease yet: the elector reads (get), finds none, and creates it (create).
    ("coordination.k8s.io", "leases", "get"): lambda env, rest: acquires(
        env, rest, no_lease(env)),
    ("coordination.k8s.io", "leases", "create"): lambda env, rest: acquires(
        env, rest, no_lease(env)),
    # A released Lease: the elector reads it and takes it over (update).
    ("coordination.k8s.io", "leases", "update"): lambda env, rest: acquires(
        env, rest, released_lease(env)),
}


ALL_GRANTS = grants(OPERATOR_RULES) + grants(LEASE_RULES)
CLUSTER_GRANTS = [g for g in ALL_GRANTS if g != FINALIZERS]


# --- fixtures -------------------------------------------------------------------------------


class PluginCluster(LocalCluster):
    """The local control plane with OwnerReferencesPermissionEnforcement switched on."""

    def _apiserver_argv(self) -> list[str]:
        return [*super()._apiserver_argv(), f"--enable-admission-plugins={PLUGIN}"]


def owner_references_resolve(env: Env) -> Env:
    """Wait until the plugin can map our ownerReference's kind to a resource: until then
    it refuses everyone, admin included, which would look like a missing verb."""
    wait_for(lambda: env.kube.create(secret_path(env.namespace), owner_target(env)),
             timeout=WAIT, what="admission to resolve HimitsuSecret ownerReferences")
    return env


def has_plugin(cluster: Cluster) -> bool:
    if cluster.local is None:
        return False
    argv = cluster.local.processes["kube-apiserver"].argv
    return any(arg.startswith("--enable-admission-plugins=") and PLUGIN in arg for arg in argv)


@pytest.fixture(scope="module")
def env(kube: KubeApi, canary: Canary, leak_evidence: LeakEvidence,
        tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    prepared = prepare(kube, tmp_path_factory.mktemp("rbac"), canary, CLUSTER_GRANTS)
    yield prepared
    cleanup(prepared, leak_evidence)


@pytest.fixture(scope="module")
def plugin_env(cluster: Cluster, kube: KubeApi, canary: Canary, leak_evidence: LeakEvidence,
               tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    workdir = tmp_path_factory.mktemp("rbac-plugin")
    if has_plugin(cluster):
        prepared = prepare(kube, workdir, canary, [FINALIZERS])
        yield owner_references_resolve(prepared)
        cleanup(prepared, leak_evidence)
        return
    if cluster.on_kind:
        pytest.skip(f"needs a kube-apiserver with {PLUGIN}: run on the local control plane")
    own = PluginCluster(workdir / "cluster", bin_dir=cluster.local.bin_dir)
    try:
        own.start()
        prepared = prepare(KubeApi(own.kubeconfig_path), workdir, canary, [FINALIZERS])
        yield owner_references_resolve(prepared)
    finally:
        own.stop()


# --- the checks ------------------------------------------------------------------------------


def test_every_granted_verb_has_a_check() -> None:
    assert set(ALL_GRANTS) == set(CHECKS)
    assert FINALIZERS in ALL_GRANTS


@pytest.mark.parametrize("grant", CLUSTER_GRANTS, ids=["/".join(g) for g in CLUSTER_GRANTS])
def test_each_verb_is_needed(env: Env, grant: Grant) -> None:
    assert_needed(env, grant)


def test_finalizers_update_is_needed_under_owner_references_enforcement(plugin_env: Env) -> None:
    assert_needed(plugin_env, FINALIZERS)


def assert_needed(env: Env, grant: Grant) -> None:
    check = CHECKS[grant]
    refused = env.rest(grant)
    assert not check(env, refused), f"{grant} was taken away, yet the call succeeded"
    assert 403 in refused.refusals, refused.refusals
    full = env.rest(None)
    assert check(env, full), f"with the full roles the call failed: {full.refusals}"
    assert 403 not in full.refusals, full.refusals
