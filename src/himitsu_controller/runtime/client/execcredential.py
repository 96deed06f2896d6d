"""A kubeconfig's exec credential plugin (client.authentication.k8s.io/v1 and v1beta1).

What client-go does, and so what cloud kubeconfigs expect (``aws eks get-token``,
``gke-gcloud-auth-plugin``, ``kubelogin``...): run ``command args...`` with the
kubeconfig's ``env`` added and ``KUBERNETES_EXEC_INFO`` describing the request (never
interactive here: the operator has no terminal; with ``provideClusterInfo``, the
cluster too), read an ExecCredential from its stdout and use ``status.token`` and/or
``status.clientCertificateData``/``clientKeyData`` until ``status.expirationTimestamp``
(for good without one). It is run again a little before that expiry, and after a 401
to a request that carried its credential.

While that early run is under way, other callers keep the credential (still valid);
once it has expired they wait for the run. A failed run is not repeated for
``FAILURE_BACKOFF`` seconds after it ended: until then an expired credential's callers
get its error, a still-valid one is used. The plugin's stdout is read up to
``MAX_STDOUT`` bytes (beyond that, it is killed and that is the error).

A failure is a ``CredentialError`` naming the command (never its arguments, which may
hold secrets) with the first part of its stderr, scrubbed of the kubeconfig's own values
for the plugin (its args and env values) and of anything token-like; the plugin's stdout
is never quoted, since it holds the credential.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, NamedTuple

import structlog

from himitsu_controller.runtime.client.credentials import (
    Auth,
    ClientCert,
    CredentialError,
    has_control_character,
)

__all__ = ["API_VERSIONS", "ExecCredentials", "ExecSpec", "run_bounded", "scrub"]

log = structlog.get_logger(__name__)

API_VERSIONS = ("client.authentication.k8s.io/v1", "client.authentication.k8s.io/v1beta1")
# A plugin that hangs would hold up every request once the credential expired.
RUN_TIMEOUT = 60.0
# Run again this long before the expiry: 10 s, or a tenth of a shorter lifetime.
LEEWAY = 10.0
# After a failed run, requests fail with its error this long before it runs again: an
# outage of the identity provider must not start a process per request.
FAILURE_BACKOFF = 5.0
_STDERR_CHARS = 300
# An ExecCredential is a few KiB; a plugin that writes more than this is broken.
MAX_STDOUT = 4 * 1024 * 1024
_STDERR_KEEP = 64 * 1024
# Shorter configured values are not scrubbed from stderr (they would be common words).
_MIN_SECRET = 4
# Runs of token-ish characters long enough to be a credential (JWTs, base64, hex keys).
_TOKENISH = re.compile(r"[A-Za-z0-9+/=_.~-]{24,}")


def scrub(text: str, *secrets: str) -> str:
    """One line, at most a few hundred characters, with nothing that looks like a token."""
    for secret in sorted(secrets, key=len, reverse=True):  # a longer one may hold another
        if secret:
            text = text.replace(secret, "[redacted]")
    text = _TOKENISH.sub("[redacted]", " ".join(text.split()))
    return text[:_STDERR_CHARS] + ("..." if len(text) > _STDERR_CHARS else "")


@dataclass(frozen=True)
class ExecSpec:
    """A kubeconfig user's ``exec`` stanza, paths resolved."""

    api_version: str
    command: str
    args: tuple[str, ...] = field(default=(), repr=False)  # may hold secrets
    env: tuple[tuple[str, str], ...] = field(default=(), repr=False)
    # the ExecCredential's spec.cluster (provideClusterInfo; may hold a proxy password)
    cluster: Mapping[str, Any] | None = field(default=None, repr=False)

    @property
    def name(self) -> str:
        return os.path.basename(self.command)

    def secrets(self) -> list[str]:
        """What the kubeconfig hands the plugin that may be secret: its args (and the
        value of an ``--opt=value`` one) and env values, to scrub from its stderr."""
        values = [*self.args, *(a.split("=", 1)[1] for a in self.args if "=" in a),
                  *(value for _, value in self.env)]
        return [v for v in values if len(v) >= _MIN_SECRET]

    def exec_info(self) -> str:
        spec: dict[str, Any] = {"interactive": False}
        if self.cluster is not None:
            spec["cluster"] = dict(self.cluster)
        return json.dumps({"apiVersion": self.api_version, "kind": "ExecCredential",
                           "spec": spec})


Runner = Callable[..., "subprocess.CompletedProcess[bytes]"]


def run_bounded(argv: Sequence[str], *, env: Mapping[str, str], timeout: float,
                limit: int = MAX_STDOUT, **_: Any) -> subprocess.CompletedProcess[bytes]:
    """``subprocess.run(argv, capture_output=True)`` that keeps at most ``limit`` + 1 bytes
    of stdout (the process is killed at that) and the first 64 KiB of stderr;
    ``subprocess.TimeoutExpired`` after ``timeout`` seconds (the process is killed). The
    plugin runs in a session of its own: killing it kills what it started too."""
    # The kubeconfig's own command (as kubectl runs it), without a shell.
    with subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL,  # noqa: S603
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          start_new_session=True) as process:  # killed with its children
        assert process.stdout is not None and process.stderr is not None
        stderr = bytearray()
        timed_out = threading.Event()

        def drain(stream: Any = process.stderr) -> None:
            with contextlib.suppress(OSError, ValueError):  # closed under us: done
                while chunk := stream.read1(65536):
                    stderr.extend(chunk[:max(0, _STDERR_KEEP - len(stderr))])

        def kill() -> None:
            with contextlib.suppress(OSError):  # already gone
                os.killpg(process.pid, signal.SIGKILL)

        def expire() -> None:
            timed_out.set()
            kill()

        reader = threading.Thread(target=drain, name="exec-plugin-stderr", daemon=True)
        reader.start()
        timer = threading.Timer(timeout, expire)
        timer.daemon = True
        timer.start()
        try:
            stdout = process.stdout.read(limit + 1)  # until EOF, or one byte too many
            if len(stdout) > limit:
                kill()
            code = process.wait()
        finally:
            timer.cancel()
        reader.join(timeout=1.0)
    if timed_out.is_set():
        raise subprocess.TimeoutExpired(list(argv), timeout)
    return subprocess.CompletedProcess(list(argv), code, stdout, bytes(stderr))


class _Cached(NamedTuple):
    auth: Auth
    renew_at: float  # run the plugin again from then on
    expires: float  # usable until then


class ExecCredentials:
    """Credentials from an exec plugin, cached until shortly before they expire."""

    def __init__(self, spec: ExecSpec, *, clock: Callable[[], float] = time.time,
                 run: Runner = run_bounded) -> None:
        self.spec = spec
        self._clock = clock  # wall clock: expirationTimestamp is one
        self._run = run
        self._lock = threading.Lock()  # held by the one run under way
        self._cached: _Cached | None = None
        self._failure: tuple[CredentialError, float] | None = None  # and until when

    def current(self) -> Auth:
        cached = self._cached
        if cached is not None and self._clock() < cached.renew_at:
            return cached.auth
        valid = cached is not None and self._clock() < cached.expires
        # One run at a time. While it runs, a still-valid credential is used; an expired
        # one's callers wait for its result.
        if not self._lock.acquire(blocking=not valid):
            assert cached is not None
            return cached.auth
        try:
            return self._renew()
        finally:
            self._lock.release()

    def _renew(self) -> Auth:
        cached, now = self._cached, self._clock()
        if cached is not None and now < cached.renew_at:  # renewed while we waited
            return cached.auth
        valid = cached is not None and now < cached.expires
        if self._failure is not None and now < self._failure[1]:
            if valid:
                assert cached is not None
                return cached.auth
            raise CredentialError(str(self._failure[0]))
        try:
            auth, expires = self._obtain()
        except CredentialError as exc:
            ended = self._clock()  # the backoff counts from the end of a slow run
            self._failure = (exc, ended + FAILURE_BACKOFF)
            if cached is not None and ended < cached.expires:
                log.warning("exec credential plugin failed, using its credential until it "
                            "expires", error=str(exc))
                return cached.auth
            raise
        self._failure = None
        if expires is None:
            self._cached = _Cached(auth, float("inf"), float("inf"))
        else:
            lifetime = max(0.0, expires - now)
            self._cached = _Cached(auth, expires - min(LEEWAY, lifetime / 10), expires)
        return auth

    def refused(self, auth: Auth) -> None:
        with self._lock:
            cached = self._cached
            if cached is not None and auth == cached.auth:  # not one already replaced
                self._cached = None

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
        if len(done.stdout) > MAX_STDOUT:
            raise CredentialError(f"exec credential plugin {spec.name} wrote more than "
                                  f"{MAX_STDOUT // (1024 * 1024)} MiB to stdout")
        if done.returncode != 0:
            stderr = scrub(done.stderr.decode("utf-8", "replace"), *spec.secrets())
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
        if isinstance(token, str):
            token = token.strip()  # a trailing newline would be an invalid header
        if token is not None and not (isinstance(token, str) and token):
            raise fail("status.token is not a non-empty string")
        if isinstance(token, str) and has_control_character(token):
            raise fail("status.token contains a control character")
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
