"""Secure metrics: HTTPS from a mounted certificate, each scrape authenticated and authorized.

* As controller-runtime: a TokenReview (else 401), then a SubjectAccessReview for ``get``
  on the nonResourceURL /metrics (else 403), whatever path was asked.
* Answers cached briefly per token hash; a failed review is a 500; a token is never kept,
  logged or quoted. The certificate is reloaded when its files change.

Design: docs/design/metrics.md
"""

from __future__ import annotations

import hashlib
import os
import ssl
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import structlog

from .parts import Requester

log = structlog.get_logger(__name__)

TOKEN_REVIEWS = "/apis/authentication.k8s.io/v1/tokenreviews"  # noqa: S105 (a path)
ACCESS_REVIEWS = "/apis/authorization.k8s.io/v1/subjectaccessreviews"
ALLOWED_TTL = 60.0  # a granted scrape is asked about again after this long
DENIED_TTL = 10.0  # a refusal, so a token just granted the role works soon
CACHE_ENTRIES = 1024
REVIEW_TIMEOUT = 5.0
METRICS_PATH = "/metrics"  # the nonResourceURL reviewed, whatever path was asked for


@dataclass(frozen=True)
class SecureServing:
    """What ``start_metrics_server`` needs to serve HTTPS and check each scrape."""

    tls: Callable[[], ssl.SSLContext]  # the context for the next handshake
    authorize: Callable[[str | None], tuple[int, str]]


class ServingCert:
    """``tls.crt`` and ``tls.key`` of ``cert_dir`` in a server context, replaced by a fresh
    one when the files change (never modified while handshakes use it)."""

    def __init__(self, cert_dir: str) -> None:
        self.cert_file = os.path.join(cert_dir, "tls.crt")
        self.key_file = os.path.join(cert_dir, "tls.key")
        self._lock = threading.Lock()
        # A missing or bad pair fails the start (OSError, ssl.SSLError).
        self._loaded = self._stamp()
        self.context = self._load()

    def _stamp(self) -> tuple[float, float]:
        return os.stat(self.cert_file).st_mtime, os.stat(self.key_file).st_mtime

    def _load(self) -> ssl.SSLContext:
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        context.load_cert_chain(self.cert_file, self.key_file)
        return context

    def current(self) -> ssl.SSLContext:
        """The context for the next handshake, the pair loaded again if either file changed
        (the old one kept if that fails)."""
        with self._lock:
            try:
                stamp = self._stamp()
                if stamp != self._loaded:
                    self.context, self._loaded = self._load(), stamp
                    log.info("metrics certificate reloaded", cert_file=self.cert_file)
            except (OSError, ssl.SSLError) as exc:
                log.warning("cannot reload the metrics certificate; serving the old one",
                            cert_file=self.cert_file, error_type=type(exc).__name__)
            return self.context


class ScrapeAuthorizer:
    """``authorize(authorization_header) -> (status, reason)``: 200 when the token's user
    may ``get /metrics``."""

    def __init__(self, client: Requester, *, clock: Callable[[], float] = time.monotonic,
                 ) -> None:
        self._client = client
        self._clock = clock
        self._cache: OrderedDict[str, tuple[float, int, str]] = OrderedDict()
        self._lock = threading.Lock()

    def authorize(self, authorization: str | None) -> tuple[int, str]:
        scheme, _, token = (authorization or "").strip().partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not token:
            return 401, "Unauthorized: a bearer token is required"
        key = hashlib.sha256(token.encode()).hexdigest()
        now = self._clock()
        with self._lock:
            cached = self._cache.get(key)
            if cached is not None and cached[0] > now:
                return cached[1], cached[2]
        status, reason = self._review(token)
        if status in (200, 401, 403):
            with self._lock:
                ttl = ALLOWED_TTL if status == 200 else DENIED_TTL
                self._cache[key] = (now + ttl, status, reason)
                self._cache.move_to_end(key)
                while len(self._cache) > CACHE_ENTRIES:
                    self._cache.popitem(last=False)
        return status, reason

    def _review(self, token: str) -> tuple[int, str]:
        try:
            review = self._client.request("POST", TOKEN_REVIEWS, timeout=REVIEW_TIMEOUT, body={
                "apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview",
                "spec": {"token": token}})
        except Exception as exc:  # no detail: a response may carry the token back
            log.error("TokenReview failed", error_type=type(exc).__name__)
            return 500, "Internal Server Error: authentication failed"
        status = review.get("status") or {}
        if not status.get("authenticated"):
            return 401, "Unauthorized"
        user = status.get("user") or {}
        spec: dict[str, Any] = {
            "user": user.get("username", ""), "groups": user.get("groups") or [],
            "nonResourceAttributes": {"path": METRICS_PATH, "verb": "get"}}
        spec.update({name: user[name] for name in ("uid", "extra") if user.get(name)})
        try:
            access = self._client.request("POST", ACCESS_REVIEWS, timeout=REVIEW_TIMEOUT, body={
                "apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
                "spec": spec})
        except Exception as exc:
            log.error("SubjectAccessReview failed", error_type=type(exc).__name__)
            return 500, "Internal Server Error: authorization failed"
        if not (access.get("status") or {}).get("allowed"):
            return 403, f"Forbidden: user may not get {METRICS_PATH}"
        return 200, ""
