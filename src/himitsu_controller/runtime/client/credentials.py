"""What a request to the apiserver carries, kept current as credentials rotate.

* ``Credentials.current()`` is asked once per transport refresh (about a second);
  ``refused()`` hears of a 401. Shared by every client of one configuration: thread-safe.
* ``TokenFile``: the in-cluster token, re-read once a minute as client-go does and at
  once after a 401. Never a token in a log line or an exception.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

import structlog

from himitsu_controller.runtime.client.errors import TransportError

__all__ = ["NO_CREDENTIALS", "Auth", "CredentialError", "Credentials", "StaticCredentials",
           "TokenFile", "bearer"]

log = structlog.get_logger(__name__)

TOKEN_FILE_PERIOD = 60.0  # client-go's transport.NewCachedFileTokenSource


class CredentialError(TransportError):
    """The credentials could not be had just now: the request is not sent."""


@dataclass(frozen=True)
class Auth:
    """What a request carries: an Authorization header value."""

    authorization: str | None = field(default=None, repr=False)


class Credentials(Protocol):
    def current(self) -> Auth:
        """The credentials to use now (CredentialError if there are none to be had)."""
        ...

    def refused(self, auth: Auth) -> None:
        """The apiserver answered 401 to a request that carried ``auth``."""
        ...


@dataclass(frozen=True)
class StaticCredentials:
    """The same credentials for good (a bearer token, or none)."""

    auth: Auth

    def current(self) -> Auth:
        return self.auth

    def refused(self, auth: Auth) -> None:
        pass


NO_CREDENTIALS = StaticCredentials(Auth())


def bearer(token: str) -> StaticCredentials:
    return StaticCredentials(Auth(f"Bearer {token}"))


def read_token(path: str) -> Auth:
    """The bearer token in ``path``; OSError or ValueError (naming the path only) if there
    is none or it holds a control character."""
    with open(path, encoding="utf-8") as file:
        token = file.read().strip()
    if not token:
        raise ValueError(f"token file {path} is empty")
    if any(ord(ch) < 0x20 or ord(ch) == 0x7F for ch in token):
        raise ValueError(f"token file {path} contains a control character")
    return Auth(f"Bearer {token}")


class TokenFile:
    """A bearer token read from a file, re-read every ``period`` seconds and after a 401.

    The first read happens here (OSError/ValueError: the configuration is unusable).
    Later, a file that cannot be read keeps the last token (logged, path only), as
    client-go does: a rotation in progress must not stop every request.
    """

    def __init__(self, path: str, *, period: float = TOKEN_FILE_PERIOD,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.path = path
        self._period = period
        self._clock = clock
        self._lock = threading.Lock()
        self._auth = read_token(path)
        self._next_read = clock() + period

    def current(self) -> Auth:
        with self._lock:
            now = self._clock()
            if now >= self._next_read:
                self._next_read = now + self._period
                try:
                    self._auth = read_token(self.path)
                except (OSError, ValueError, UnicodeDecodeError) as exc:
                    log.warning("cannot re-read the token file, keeping the last token",
                                path=self.path, error=type(exc).__name__)
            return self._auth

    def refused(self, auth: Auth) -> None:
        with self._lock:
            if auth == self._auth:  # not a token already replaced meanwhile
                self._next_read = float("-inf")
