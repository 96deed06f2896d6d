"""--metrics-secure: /metrics over HTTPS, each scrape authenticated by a TokenReview and
authorized by a SubjectAccessReview (nonResourceURL, verb get), answers cached briefly;
the certificate is read again when its files change."""

from __future__ import annotations

import http.client
import os
import shutil
import socket
import ssl
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import structlog
from tls_server import Pki, make_pki

from himitsu_controller.runtime import metrics
from himitsu_controller.runtime.httpserver import HTTPServerHandle
from himitsu_controller.runtime.metricsauth import (
    ACCESS_REVIEWS,
    TOKEN_REVIEWS,
    ScrapeAuthorizer,
    SecureServing,
    ServingCert,
)

HOST = "kubernetes.default.svc"  # the name make_pki's server certificate is for
USERS = {"reader-token": "system:serviceaccount:monitoring:prometheus",
         "stranger-token": "system:serviceaccount:apps:app"}


class FakeClock:
    def __init__(self) -> None:
        self.now = 50.0

    def __call__(self) -> float:
        return self.now


class FakeReviews:
    """The apiserver's review APIs: USERS authenticate, only the prometheus SA may read."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, dict[str, Any]]] = []
        self.fail = False

    def request(self, method: str, path: str, *, body: Any = None,
                timeout: float = 30.0) -> dict[str, Any]:
        assert method == "POST"
        self.sent.append((path, body))
        if self.fail:
            raise RuntimeError("apiserver down")
        if path == TOKEN_REVIEWS:
            user = USERS.get(body["spec"]["token"])
            if user is None:
                return {"status": {"authenticated": False}}
            return {"status": {"authenticated": True,
                               "user": {"username": user, "uid": "u-1", "groups": ["g"]}}}
        assert path == ACCESS_REVIEWS
        spec = body["spec"]
        allowed = (spec["user"] == USERS["reader-token"]
                   and spec["nonResourceAttributes"] == {"path": "/metrics", "verb": "get"})
        return {"status": {"allowed": allowed}}


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


def cert_dir(pki: Pki, base: Path) -> Path:
    base.mkdir(exist_ok=True)
    shutil.copy(pki.server_cert, base / "tls.crt")
    shutil.copy(pki.server_key, base / "tls.key")
    return base


@pytest.fixture
def served(pki: Pki, tmp_path: Path) -> Iterator[tuple[HTTPServerHandle, FakeReviews, FakeClock]]:
    reviews, clock = FakeReviews(), FakeClock()
    cert = ServingCert(str(cert_dir(pki, tmp_path / "certs")))
    secure = SecureServing(tls=cert.context, refresh=cert.refresh,
                           authorize=ScrapeAuthorizer(reviews, clock=clock).authorize)
    handle = metrics.start_metrics_server("127.0.0.1:0", secure=secure)
    assert handle is not None
    yield handle, reviews, clock
    handle.stop()


def scrape(handle: HTTPServerHandle, ca: Path, token: str | None,
           path: str = "/metrics") -> tuple[int, bytes, bytes]:
    """(status, body, the server certificate's DER)."""
    context = ssl.create_default_context(cafile=str(ca))
    conn = http.client.HTTPSConnection(HOST, handle.port, context=context, timeout=20)
    sock = context.wrap_socket(socket.create_connection(("127.0.0.1", handle.port), timeout=20),
                               server_hostname=HOST)  # the certificate's name, verified
    conn.sock = sock
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    conn.request("GET", path, headers=headers)
    der = sock.getpeercert(binary_form=True) or b""
    resp = conn.getresponse()
    result = resp.status, resp.read(), der
    conn.close()
    return result


def test_a_scrape_without_a_token_is_401_one_the_apiserver_rejects_401(
        served: tuple[HTTPServerHandle, FakeReviews, FakeClock], pki: Pki) -> None:
    handle, reviews, _ = served
    assert scrape(handle, pki.ca, None)[0] == 401
    assert reviews.sent == []  # no review for a missing token
    assert scrape(handle, pki.ca, "forged-token")[0] == 401
    assert [path for path, _ in reviews.sent] == [TOKEN_REVIEWS]


def test_a_token_without_the_grant_is_403_and_one_with_it_gets_the_metrics(
        served: tuple[HTTPServerHandle, FakeReviews, FakeClock], pki: Pki) -> None:
    handle, reviews, _ = served
    assert scrape(handle, pki.ca, "stranger-token")[0] == 403
    status, body, _ = scrape(handle, pki.ca, "reader-token")
    assert status == 200 and b"controller_runtime_reconcile_total" in body
    sar = [body for path, body in reviews.sent if path == ACCESS_REVIEWS][-1]["spec"]
    assert sar["user"] == USERS["reader-token"] and sar["uid"] == "u-1"
    # Every path is checked, so an unauthorized caller cannot even tell what exists.
    assert scrape(handle, pki.ca, "stranger-token", "/nothing")[0] == 403


def test_answers_are_cached_briefly_per_token(
        served: tuple[HTTPServerHandle, FakeReviews, FakeClock], pki: Pki) -> None:
    handle, reviews, clock = served
    for _ in range(3):
        assert scrape(handle, pki.ca, "reader-token")[0] == 200
    assert len(reviews.sent) == 2  # one TokenReview, one SubjectAccessReview
    clock.now += 61
    assert scrape(handle, pki.ca, "reader-token")[0] == 200
    assert len(reviews.sent) == 4


def test_a_failing_review_is_500_never_cached_and_logs_no_token(
        served: tuple[HTTPServerHandle, FakeReviews, FakeClock], pki: Pki) -> None:
    handle, reviews, _ = served
    reviews.fail = True
    with structlog.testing.capture_logs() as logs:
        status, body, _ = scrape(handle, pki.ca, "reader-token")
    assert status == 500 and b"reader-token" not in body
    assert "reader-token" not in repr(logs)
    reviews.fail = False
    assert scrape(handle, pki.ca, "reader-token")[0] == 200


def test_a_renewed_certificate_is_served_without_a_restart(
        served: tuple[HTTPServerHandle, FakeReviews, FakeClock], pki: Pki,
        tmp_path: Path) -> None:
    handle, _, _ = served
    first = scrape(handle, pki.ca, "reader-token")[2]
    (tmp_path / "renewed").mkdir()
    renewed = make_pki(tmp_path / "renewed")
    certs = tmp_path / "certs"
    cert_dir(renewed, certs)
    stamp = os.stat(certs / "tls.crt").st_mtime + 5  # a new mtime, whatever the clock
    for name in ("tls.crt", "tls.key"):
        os.utime(certs / name, (stamp, stamp))
    status, _, second = scrape(handle, renewed.ca, "reader-token")
    assert status == 200 and second != first
    assert second == ssl.PEM_cert_to_DER_cert(renewed.server_cert.read_text())


def test_a_missing_certificate_fails_the_start(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        ServingCert(str(tmp_path))
