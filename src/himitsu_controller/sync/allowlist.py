"""Which Himitsu API URLs a HimitsuSecret may point the operator at (--allowed-api-urls).

Anyone who may create a HimitsuSecret chooses where the operator sends a request (with
a token from their namespace). An administrator who lists the Himitsu URLs here turns
every other apiUrl into InvalidSpec before any request leaves. Prefixes are normalised
as apiUrl is and matched on URL boundaries.
"""

from __future__ import annotations

from collections.abc import Iterable

from himitsu_controller import himitsu


class NotAllowed(Exception):
    """The apiUrl is invalid or outside the allow-list; ``str()`` is safe to show."""


class AllowList:
    def __init__(self, prefixes: Iterable[str]) -> None:
        self._prefixes = [_normalise(p) for p in prefixes if p.strip()]

    def check(self, api_url: str) -> str:
        """The normalised apiUrl, or NotAllowed saying what to do about it."""
        try:
            url = himitsu.validate_api_url(api_url)
        except himitsu.HimitsuError as exc:
            raise NotAllowed(str(exc)) from None
        if self._prefixes and not any(_under(url, p) for p in self._prefixes):
            raise NotAllowed(
                f"apiUrl {api_url[:100]!r} is not in the operator's --allowed-api-urls; "
                "ask the cluster administrator to allow it")
        return url


def _normalise(prefix: str) -> str:
    """Normalise an allowed prefix as apiUrl is (host case, default port, trailing slash),
    or an operator's ``https://Himitsu.example.com:443/`` would refuse every apiUrl."""
    try:
        return himitsu.validate_api_url(prefix)
    except himitsu.HimitsuError:
        return prefix.strip().rstrip("/")


def _under(url: str, prefix: str) -> bool:
    """Prefix match on URL boundaries: ``https://a.example`` must not allow ``https://a.example.evil``."""
    base = prefix.rstrip("/")
    return url == base or url.startswith(base + "/")
