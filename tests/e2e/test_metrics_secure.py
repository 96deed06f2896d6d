"""--metrics-secure on a real apiserver: HTTPS, and each scrape reviewed by the apiserver.

The operator runs as its ServiceAccount with deploy/rbac; the reviews need
deploy/components/metrics-secure's ClusterRole, and a scraper needs its metrics-reader
ClusterRole. No token is 401, a token without the reader role 403, one with it 200; and
without the operator's review role a scrape is a 500 (the RBAC is needed, not decoration).
"""

from __future__ import annotations

import http.client
import shutil
import socket
import ssl
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from tls_server import Pki, make_pki

from . import cluster_setup
from .harness import Harness
from .kubehelp import REPO, KubeApi, kubectl, wait_for
from .operator_proc import OperatorLauncher

pytestmark = [pytest.mark.e2e, pytest.mark.local_only]

COMPONENT = REPO / "deploy" / "components" / "metrics-secure"
HOST = "kubernetes.default.svc"  # the name make_pki's server certificate is for
NS = cluster_setup.OPERATOR_NAMESPACE


def scrape(port: int, ca: Path, token: str | None) -> tuple[int, str]:
    context = ssl.create_default_context(cafile=str(ca))
    conn = http.client.HTTPSConnection(HOST, port, context=context, timeout=20)
    conn.sock = context.wrap_socket(socket.create_connection(("127.0.0.1", port), timeout=20),
                                    server_hostname=HOST)
    conn.request("GET", "/metrics", headers={"Authorization": f"Bearer {token}"} if token else {})
    resp = conn.getresponse()
    result = resp.status, resp.read().decode()
    conn.close()
    return result


def token_of(kube: KubeApi, name: str) -> str:
    kube.create(f"/api/v1/namespaces/{NS}/serviceaccounts",
                {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": name}})
    request = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
               "spec": {"expirationSeconds": 3600}}
    path = f"/api/v1/namespaces/{NS}/serviceaccounts/{name}/token"
    token: str = wait_for(lambda: kube.create(path, request)["status"]["token"], timeout=30,
                          what=f"a token for {name}")
    return token


@pytest.fixture
def component_rbac(kube: KubeApi) -> Iterator[list[dict[str, Any]]]:
    """The component's RBAC objects (applied by the test when it wants them), removed after."""
    objects = [yaml.safe_load((COMPONENT / f).read_text()) for f in
               ("metrics_auth_role.yaml", "metrics_auth_role_binding.yaml",
                "metrics_reader_role.yaml")]
    scraper_binding = {
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
        "metadata": {"name": "e2e-metrics-scraper"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                    "name": "himitsu-operator-metrics-reader"},
        "subjects": [{"kind": "ServiceAccount", "name": "e2e-metrics-scraper",
                      "namespace": NS}]}
    objects.append(scraper_binding)
    yield objects
    for obj in objects:
        kubectl(kube.kubeconfig, "delete", "--ignore-not-found", obj["kind"],
                obj["metadata"]["name"])
    for name in ("e2e-metrics-scraper", "e2e-metrics-stranger"):
        kube.delete(f"/api/v1/namespaces/{NS}/serviceaccounts/{name}")


@pytest.fixture
def serving_cert(tmp_path: Path) -> tuple[Pki, Path]:
    """A CA, and a directory holding tls.crt and tls.key it signed (as a tls Secret would)."""
    pki = make_pki(tmp_path)
    certs = tmp_path / "certs"
    certs.mkdir()
    shutil.copy(pki.server_cert, certs / "tls.crt")
    shutil.copy(pki.server_key, certs / "tls.key")
    return pki, certs


def apply(kube: KubeApi, *objects: dict[str, Any]) -> None:
    kubectl(kube.kubeconfig, "apply", "-f", "-",
            stdin="\n---\n".join(yaml.safe_dump(o) for o in objects))


@pytest.mark.timeout(300)
def test_secure_metrics_answer_401_403_and_200_as_the_apiserver_decides(
        h: Harness, ns: str, operator: OperatorLauncher, serving_cert: tuple[Pki, Path],
        component_rbac: list[dict[str, Any]]) -> None:
    pki, certs = serving_cert
    kube = h.kube
    auth_role, auth_binding, reader_role, scraper_binding = component_rbac
    apply(kube, reader_role, scraper_binding)  # the scraper's grant, not yet the operator's
    reader, stranger = token_of(kube, "e2e-metrics-scraper"), token_of(kube, "e2e-metrics-stranger")
    proc = operator.start("--metrics-secure", "--metrics-cert-dir", str(certs),
                          name="secure-metrics")
    port = proc.metrics_port
    h.sync(ns, "API_KEY")  # the operator works as ever; its reconcile is counted below

    # Without the component's role the operator may not ask: no scrape gets through.
    status, body = scrape(port, pki.ca, reader)
    assert status == 500 and "controller_runtime" not in body
    assert reader not in proc.log_text()

    apply(kube, auth_role, auth_binding)
    assert scrape(port, pki.ca, None)[0] == 401
    assert scrape(port, pki.ca, "not-a-token")[0] == 401
    # RBAC reaches the apiserver's authorizer within moments; errors are never cached.
    wait_for(lambda: scrape(port, pki.ca, stranger)[0] == 403, timeout=30,
             what="403 for a token without metrics-reader")
    def granted() -> tuple[int, str] | None:
        answer = scrape(port, pki.ca, reader)
        return answer if answer[0] == 200 else None

    status, body = wait_for(granted, timeout=30, what="200 for a token with metrics-reader")
    assert 'controller_runtime_reconcile_total{controller="himitsusecret",result="success"}' \
        in body
    # The probes stay plain HTTP for the kubelet.
    assert proc.probe("/healthz") == 200
    log = proc.log_text()
    assert reader not in log and stranger not in log
