"""The Himitsu token a HimitsuSecret names: read from its Secret, trimmed, checked.

A token is read through ``Kube.read_secret_value`` (the adapter caches values per
(namespace, Secret, key) and re-reads them after a while or after a 401/403). Before
anything else, the Secret's ``himitsu.io/allowed-api-urls`` annotation, if any, must
allow the apiUrl (``TokenNotAllowed``: where a token may go is its owner's choice, not
the HimitsuSecret author's). Then the value is checked against Himitsu's token format
before it is ever sent, so a truncated or mistyped credential fails here with a message
that says how to fix it, instead of as a 401 on every poll. Messages name the Secret
and the key, never the value nor anything of it.
"""

from __future__ import annotations

from himitsu_controller import himitsu
from himitsu_controller.sync import allowlist
from himitsu_controller.sync.ports import Kube, KubeError, SecretNotFound

__all__ = ["TokenError", "TokenNotAllowed", "TokenReader"]


class TokenError(Exception):
    """The token cannot be used; ``str()`` says why and how to fix it (AuthenticationFailure)."""


class TokenNotAllowed(TokenError):
    """The token's Secret does not let it go to this apiUrl (InvalidSpec); nothing is sent."""


class TokenReader:
    def __init__(self, kube: Kube) -> None:
        self._kube = kube

    def read(self, namespace: str, name: str, key: str, *, api_url: str) -> str:
        """The checked token in ``namespace``/``name`` at ``key``, allowed to go to the
        normalised ``api_url``; else ``TokenNotAllowed`` or ``TokenError``."""
        try:
            found = self._kube.read_secret_value(namespace, name, key)
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
            raise TokenNotAllowed(str(exc)) from None
        raw = found.value
        if raw is None:
            raise TokenError(
                f"token Secret {name!r} has no key {key!r}; add it or set authSecretRef.key")
        try:
            text = raw.decode("utf-8").strip()
        except UnicodeDecodeError:
            text = ""
        if not text:
            self.forget(namespace, name, key)
            raise TokenError(f"key {key!r} of token Secret {name!r} is empty or not text")
        try:
            return himitsu.validate_token(text)
        except himitsu.InvalidToken as exc:
            self.forget(namespace, name, key)
            raise TokenError(f"token in Secret {name!r} key {key!r}: {exc}") from None

    def forget(self, namespace: str, name: str, key: str) -> None:
        """Drop a cached value (it was refused, or did not parse): read it afresh next time."""
        self._kube.forget_secret_value(namespace, name, key)
