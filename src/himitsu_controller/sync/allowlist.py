"""Where the operator may send a token: --allowed-api-urls, plain http, the token's own list.

Plain ``http://`` only with ``--allow-insecure-http``; the token Secret's
``himitsu.io/allowed-api-urls`` narrows further. Normalised URLs match on path segments.

Design: docs/design/himitsu-client.md
"""

from __future__ import annotations

from collections.abc import Iterable

from himitsu_controller import api, himitsu

__all__ = ["AllowList", "InvalidPrefix", "NotAllowed", "check_token_binding"]


class NotAllowed(Exception):
    """The apiUrl is invalid or not allowed; ``str()`` is safe to show, ``detail`` (when
    set) is for the operator's log only."""

    detail = ""


class InvalidPrefix(ValueError):
    """An operator-wide prefix is unusable; ``str()`` says which and why (for the CLI)."""


class AllowList:
    def __init__(self, prefixes: Iterable[str], *, allow_insecure_http: bool = False) -> None:
        self._insecure = allow_insecure_http
        self._prefixes: list[str] = []
        for entry in (p.strip() for p in prefixes):
            if not entry:
                continue
            # Shown to say which entry is wrong, unless it may hold a password.
            shown = repr(entry[:100]) if "@" not in entry else "(not shown)"
            try:
                prefix = himitsu.validate_api_url(entry)
            except himitsu.HimitsuError as exc:
                raise InvalidPrefix(f"--allowed-api-urls entry {shown}: "
                                    f"{exc.message.replace('apiUrl', 'the URL')}") from None
            if prefix.startswith("http://") and not allow_insecure_http:
                raise InvalidPrefix(
                    f"--allowed-api-urls entry {shown} is plain http://, which sends "
                    "tokens unencrypted; use https://, or pass --allow-insecure-http")
            self._prefixes.append(prefix)

    @property
    def unrestricted(self) -> bool:
        """No operator-wide list: any https (or allowed http) apiUrl is accepted."""
        return not self._prefixes

    def check(self, api_url: str) -> str:
        """The normalised apiUrl (the URL to request), or NotAllowed saying what to do."""
        try:
            url = himitsu.validate_api_url(api_url)
        except himitsu.HimitsuError as exc:
            raise NotAllowed(str(exc)) from None
        if url.startswith("http://") and not self._insecure:
            raise NotAllowed(
                "apiUrl is plain http://, which would send the token unencrypted; use "
                "https://, or ask the cluster administrator to run the operator with "
                "--allow-insecure-http")
        if self._prefixes and not any(_under(url, p) for p in self._prefixes):
            raise NotAllowed(
                f"apiUrl {api_url[:100]!r} is not in the operator's --allowed-api-urls; "
                "ask the cluster administrator to allow it")
        return url


def check_token_binding(annotation: str | None, url: str, *, secret: str) -> None:
    """NotAllowed unless ``url`` is under one of the token Secret's ``allowed-api-urls``
    (None: no binding). Fails closed (blank, or one entry not a URL: nowhere), with one
    message that shows no prefix; ``NotAllowed.detail`` says why, for the log."""
    if annotation is None:
        return
    prefixes = []
    detail = "the apiUrl is under none of its URLs"
    for entry in (e.strip() for e in annotation.split(",")):
        if not entry:
            continue
        try:
            prefixes.append(himitsu.validate_api_url(entry))
        except himitsu.HimitsuError:
            prefixes, detail = [], "an entry is not an http(s) URL, so it allows nowhere"
            break
    if not any(_under(url, p) for p in prefixes):
        refused = NotAllowed(
            f"token Secret {secret!r} does not allow this apiUrl (its "
            f"{api.ANN_ALLOWED_API_URLS} annotation); use the Himitsu URL the token is "
            "meant for, or ask the token's owner")
        refused.detail = detail
        raise refused


def _under(url: str, prefix: str) -> bool:
    """Prefix match on path segments (both sides normalised): ``https://a.example`` does
    not allow ``https://a.example.evil``, nor ``/himitsu`` allow ``/himitsu-other``."""
    return url == prefix or url.startswith(prefix + "/")
