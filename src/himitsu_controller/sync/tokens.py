"""The Himitsu token a HimitsuSecret names: read from its Secret, trimmed, checked.

* Its Secret's ``himitsu.io/allowed-api-urls`` must allow the apiUrl; its format is
  checked before it is ever sent. Messages never show the value (the log says why).

Design: docs/design/adapter.md
"""

from __future__ import annotations

import structlog

from himitsu_controller import himitsu
from himitsu_controller.sync import allowlist
from himitsu_controller.sync.ports import Kube, KubeError, SecretNotFound

__all__ = ["TokenError", "TokenNotAllowed", "TokenReader"]

log = structlog.get_logger(__name__)


class TokenError(Exception):
    """The token cannot be used; ``str()`` says why and how to fix it (AuthenticationFailure)."""


class TokenNotAllowed(TokenError):
    """The token's Secret does not let it go to this apiUrl (InvalidSpec); nothing is sent."""


class TokenReader:
    def __init__(self, kube: Kube) -> None:
        self._kube = kube

    def read(self, namespace: str, name: str, key: str, *, api_url: str,
             max_age: float | None = None) -> str:
        """The checked token, allowed to go to the normalised ``api_url``; else
        ``TokenNotAllowed`` or ``TokenError``. ``max_age``: the cache's, in seconds."""
        try:
            found = self._kube.read_secret_value(namespace, name, key, for_url=api_url,
                                                 max_age=max_age)
        except SecretNotFound:
            raise TokenError(
                f"token Secret {name!r} not found in namespace {namespace!r}; create it with "
                f"kubectl -n {namespace} create secret generic {name} --from-literal={key}=<token>"
            ) from None
        except KubeError as exc:
            raise TokenError(f"reading token Secret {name!r} failed: {exc}") from None
        try:
            allowlist.check_token_binding(found.allowed_api_urls, api_url, secret=name)
        except allowlist.NotAllowed as exc:
            self.forget(namespace, name, key)  # the owner's fix counts at the next retry
            log.info("token not allowed to this apiUrl", namespace=namespace, secret=name,
                     detail=exc.detail)
            raise TokenNotAllowed(str(exc)) from None
        token, problem = _checked(found.value)
        if token is None:
            self.forget(namespace, name, key)
            log.info("token unusable", namespace=namespace, secret=name, key=key,
                     detail=problem)
            # One message for every unusable value (docs/security.md, "No oracle").
            raise TokenError(
                f"key {key!r} of Secret {name!r} does not hold a usable Himitsu API key "
                "(himi_<16 hex>_<43 base64url>, no more); put the token there, or point "
                "authSecretRef at the Secret and key that hold it")
        return token

    def forget(self, namespace: str, name: str, key: str) -> None:
        """Drop a cached value (it was refused, or did not parse): read it afresh next time."""
        self._kube.forget_secret_value(namespace, name, key)


def _checked(raw: bytes | None) -> tuple[str | None, str]:
    """The checked token, or None and what is wrong with the value (for the log)."""
    if raw is None:
        return None, "the Secret has no such key"
    try:
        text = raw.decode("utf-8").strip()
    except UnicodeDecodeError:
        return None, "the value is not UTF-8 text"
    if not text:
        return None, "the value is empty"
    try:
        return himitsu.validate_token(text), ""
    except himitsu.InvalidToken:
        return None, "the value is not in the Himitsu API key format"
