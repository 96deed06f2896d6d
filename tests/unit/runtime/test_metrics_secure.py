"""--metrics-secure: /metrics over HTTPS, each scrape authenticated by a TokenReview and
authorized by a SubjectAccessReview (nonResourceURL, verb get), answers cached briefly per
token; the certificate is read into a fresh context when its files change, and silent
peers stuck in their handshake give their slot to a scraper."""

from __future__ import annotations

import contextlib
import http.client
import os
import shutil
import socket
import ssl
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import structlog
from tls_server import Pki, make_pki

from himitsu_controller.runtime import httpserver, metrics
from himitsu_controller.runtime.httpserver import HTTPServerHandle
from himitsu_controller.runtime.metricsauth import (
    ACCESS_REVIEWS,
    CACHE_ENTRIES,
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
    secure = SecureServing(tls=cert.current,
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


def test_a_scraper_is_served_while_silent_peers_hold_every_slot_in_their_handshake(
        served: tuple[HTTPServerHandle, FakeReviews, FakeClock], pki: Pki) -> None:
    handle, _, _ = served
    silent = [socket.create_connection(("127.0.0.1", handle.port), timeout=20)
              for _ in range(httpserver.MAX_CONNECTIONS)]
    try:
        assert handle.connections.wait_until(
            lambda c: c.active == httpserver.MAX_CONNECTIONS, 20)
        assert scrape(handle, pki.ca, "reader-token")[0] == 200
        assert handle.connections.evicted >= 1
        silent[0].settimeout(20)
        assert silent[0].recv(64) == b""  # closed on, and no plaintext on the HTTPS port
    finally:
        for sock in silent:
            sock.close()


def _handshake(context: ssl.SSLContext, ca: Path) -> bytes:
    """The certificate (DER) a client verifying against ``ca`` is served by ``context``."""
    server = socket.create_server(("127.0.0.1", 0))
    client_ctx = ssl.create_default_context(cafile=str(ca))
    with server, socket.create_connection(server.getsockname()[:2], timeout=20) as raw:
        accepted, _ = server.accept()
        accepted.settimeout(20)

        def serve() -> None:
            with contextlib.suppress(OSError), context.wrap_socket(accepted, server_side=True):
                pass
            accepted.close()

        thread = threading.Thread(target=serve)
        thread.start()
        try:
            with client_ctx.wrap_socket(raw, server_hostname=HOST) as tls:
                return tls.getpeercert(binary_form=True) or b""
        finally:
            thread.join(20)


def test_a_certificate_reload_that_fails_keeps_serving_the_old_certificate(
        pki: Pki, tmp_path: Path) -> None:
    certs = cert_dir(pki, tmp_path / "certs")
    cert = ServingCert(str(certs))
    served = _handshake(cert.current(), pki.ca)
    # A renewal seen half-way: the new certificate, the key not yet (or a wrong pair).
    (tmp_path / "new").mkdir()
    shutil.copy(make_pki(tmp_path / "new").server_cert, certs / "tls.crt")
    stamp = os.stat(certs / "tls.crt").st_mtime + 5
    os.utime(certs / "tls.crt", (stamp, stamp))
    with structlog.testing.capture_logs() as logs:
        assert _handshake(cert.current(), pki.ca) == served
    assert [e["event"] for e in logs] == [
        "cannot reload the metrics certificate; serving the old one"]


def test_one_tokens_flood_of_distinct_paths_costs_one_review_pair_and_evicts_no_one(
        served: tuple[HTTPServerHandle, FakeReviews, FakeClock], pki: Pki) -> None:
    # Any pod's ServiceAccount token authenticates: whatever path it asks for, one review
    # (of get /metrics) and one cache entry, so the granted scraper's answer stays.
    handle, reviews, _ = served
    assert scrape(handle, pki.ca, "reader-token")[0] == 200
    for i in range(20):
        assert scrape(handle, pki.ca, "stranger-token", f"/x{i}")[0] == 403
    assert scrape(handle, pki.ca, "reader-token")[0] == 200
    assert [path for path, _ in reviews.sent] == [TOKEN_REVIEWS, ACCESS_REVIEWS] * 2
    assert all(body["spec"].get("nonResourceAttributes", {}).get("path", "/metrics")
               == "/metrics" for _, body in reviews.sent)


def test_the_answer_cache_holds_one_entry_a_token_and_at_most_cache_entries() -> None:
    reviews = FakeReviews()
    authorize = ScrapeAuthorizer(reviews, clock=lambda: 0.0).authorize
    assert authorize("Bearer reader-token") == (200, "")
    for i in range(CACHE_ENTRIES):  # as many other tokens as the cache holds
        assert authorize(f"Bearer token-{i}")[0] == 401
    sent = len(reviews.sent)
    assert authorize("Bearer reader-token")[0] == 200
    assert len(reviews.sent) == sent + 2  # the oldest entry, the reader's, made room
