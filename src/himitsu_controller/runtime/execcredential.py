"""A kubeconfig's exec credential plugin (client.authentication.k8s.io/v1 and v1beta1).

What client-go does, and so what cloud kubeconfigs expect (``aws eks get-token``,
``gke-gcloud-auth-plugin``, ``kubelogin``...): run ``command args...`` with the
kubeconfig's ``env`` added and ``KUBERNETES_EXEC_INFO`` describing the request (never
interactive here: the operator has no terminal; with ``provideClusterInfo``, the
cluster too), read an ExecCredential from its stdout and use ``status.token`` and/or
``status.clientCertificateData``/``clientKeyData`` until ``status.expirationTimestamp``
(for good without one). It is run again a little before that expiry, and after a 401
to a request that carried its credential.

A failure is a ``CredentialError`` naming the command (never its arguments, which may
hold secrets) with the first part of its stderr, scrubbed of anything token-like; the
plugin's stdout is never quoted, since it holds the credential.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from .credentials import Auth, ClientCert, CredentialError

__all__ = ["API_VERSIONS", "ExecCredentials", "ExecSpec", "scrub"]

API_VERSIONS = ("client.authentication.k8s.io/v1", "client.authentication.k8s.io/v1beta1")
# A plugin that hangs would hold up every request once the credential expired.
RUN_TIMEOUT = 60.0
# Run again this long before the expiry: 10 s, or a tenth of a shorter lifetime.
LEEWAY = 10.0
# After a failed run, requests fail with its error this long before it runs again: an
# outage of the identity provider must not start a process per request.
FAILURE_BACKOFF = 5.0
_STDERR_CHARS = 300
# Runs of token-ish characters long enough to be a credential (JWTs, base64, hex keys).
_TOKENISH = re.compile(r"[A-Za-z0-9+/=_.~-]{24,}")


def scrub(text: str, *secrets: str) -> str:
    """One line, at most a few hundred characters, with nothing that looks like a token."""
    for secret in secrets:
        if secret:
            text = text.replace(secret, "[redacted]")
    text = _TOKENISH.sub("[redacted]", " ".join(text.split()))
    return text[:_STDERR_CHARS] + ("..." if len(text) > _STDERR_CHARS else "")


@dataclass(frozen=True)
class ExecSpec:
    """A kubeconfig user's ``exec`` stanza, paths resolved."""

    api_version: str
    command: str
    args: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()
    cluster: Mapping[str, Any] | None = None  # provideClusterInfo: the ExecCredential's

    @property
    def name(self) -> str:
        return os.path.basename(self.command)

    def exec_info(self) -> str:
        spec: dict[str, Any] = {"interactive": False}
        if self.cluster is not None:
            spec["cluster"] = dict(self.cluster)
        return json.dumps({"apiVersion": self.api_version, "kind": "ExecCredential",
                           "spec": spec})


Runner = Callable[..., "subprocess.CompletedProcess[bytes]"]


class ExecCredentials:
    """Credentials from an exec plugin, cached until shortly before they expire."""

    def __init__(self, spec: ExecSpec, *, clock: Callable[[], float] = time.time,
                 run: Runner = subprocess.run) -> None:
        self.spec = spec
        self._clock = clock  # wall clock: expirationTimestamp is one
        self._run = run
        self._lock = threading.Lock()
        self._auth: Auth | None = None
        self._renew_at = float("-inf")
        self._failure: tuple[CredentialError, float] | None = None  # and until when

    def current(self) -> Auth:
        with self._lock:  # one run at a time; the others wait for its result
            if self._auth is None or self._clock() >= self._renew_at:
                obtained = self._clock()
                if self._failure is not None and obtained < self._failure[1]:
                    raise CredentialError(str(self._failure[0]))
                try:
                    self._auth, expires = self._obtain()
                except CredentialError as exc:
                    self._failure = (exc, obtained + FAILURE_BACKOFF)
                    raise
                self._failure = None
                if expires is None:
                    self._renew_at = float("inf")
                else:
                    self._renew_at = expires - min(LEEWAY, max(0.0, expires - obtained) / 10)
            return self._auth

    def refused(self, auth: Auth) -> None:
        with self._lock:
            if auth == self._auth:  # not one a concurrent refresh already replaced
                self._auth = None

    def _obtain(self) -> tuple[Auth, float | None]:
        spec = self.spec
        env = dict(os.environ)
        env.update(spec.env)
        env["KUBERNETES_EXEC_INFO"] = spec.exec_info()
        argv: Sequence[str] = [spec.command, *spec.args]
        try:
            done = self._run(argv, env=env, stdin=subprocess.DEVNULL, capture_output=True,
                             timeout=RUN_TIMEOUT, check=False)
        except FileNotFoundError:
            raise CredentialError(f"exec credential plugin {spec.command!r} not found"
                                  ) from None
        except subprocess.TimeoutExpired:
            raise CredentialError(f"exec credential plugin {spec.name} did not finish "
                                  f"within {RUN_TIMEOUT:.0f}s") from None
        except OSError as exc:
            raise CredentialError(f"exec credential plugin {spec.name} could not run: "
                                  f"{type(exc).__name__}: {exc.strerror}") from None
        if done.returncode != 0:
            stderr = scrub(done.stderr.decode("utf-8", "replace"))
            raise CredentialError(f"exec credential plugin {spec.name} exited with "
                                  f"{done.returncode}" + (f": {stderr}" if stderr else ""))
        return self._parse(done.stdout)

    def _parse(self, stdout: bytes) -> tuple[Auth, float | None]:
        name = self.spec.name

        def fail(why: str) -> CredentialError:
            return CredentialError(f"exec credential plugin {name}: {why}")

        try:
            credential = json.loads(stdout)
        except ValueError:
            raise fail("its output is not an ExecCredential (not JSON)") from None
        if not isinstance(credential, dict) or credential.get("kind") != "ExecCredential":
            raise fail("its output is not an ExecCredential")
        if credential.get("apiVersion") != self.spec.api_version:
            raise fail(f"it answered apiVersion {str(credential.get('apiVersion'))[:60]!r}, "
                       f"not {self.spec.api_version}")
        status = credential.get("status")
        if not isinstance(status, dict):
            raise fail("its ExecCredential has no status")
        token = status.get("token")
        cert, key = status.get("clientCertificateData"), status.get("clientKeyData")
        if token is not None and not (isinstance(token, str) and token):
            raise fail("status.token is not a non-empty string")
        if (cert is None) != (key is None):
            raise fail("status has only one of clientCertificateData and clientKeyData")
        if cert is not None and not (isinstance(cert, str) and isinstance(key, str)):
            raise fail("status.clientCertificateData/clientKeyData are not PEM strings")
        if token is None and cert is None:
            raise fail("status has neither a token nor a client certificate")
        expires = None
        stamp = status.get("expirationTimestamp")
        if stamp is not None:
            try:
                expires = datetime.fromisoformat(str(stamp).replace("Z", "+00:00")).timestamp()
            except ValueError:
                raise fail(f"status.expirationTimestamp {str(stamp)[:40]!r} is not a "
                           "RFC 3339 time") from None
        client_cert = (ClientCert(cert.encode(), key.encode())
                       if isinstance(cert, str) and isinstance(key, str) else None)
        return Auth(f"Bearer {token}" if token else None, client_cert), expires
