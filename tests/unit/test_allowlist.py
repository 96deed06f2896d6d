"""Tests for allowlist.py: --allowed-api-urls matches normalised URLs on boundaries.
(That a refused apiUrl costs no request is tested through the reconciler.)"""

from __future__ import annotations

import pytest

from himitsu_controller.sync.allowlist import AllowList, NotAllowed


@pytest.mark.parametrize(("url", "allowed"), [
    ("https://himitsu.example.com", ("https://himitsu.example.com",)),
    ("https://himitsu.example.com/v2", ("https://himitsu.example.com/",)),
    ("https://himitsu.example.com", ("https://other.example", " https://himitsu.example.com")),
    ("https://HIMITSU.example.com:443/", ("https://himitsu.example.com",)),
    ("https://himitsu.example.com", ("https://Himitsu.Example.com:443",)),
    ("https://anything.example", ()),  # no list: any valid URL
    ("https://anything.example", ("", " ")),  # blank entries are no list either
])
def test_allowed_api_urls_permit(url: str, allowed: tuple[str, ...]) -> None:
    assert AllowList(allowed).check(url) == url.lower().replace(":443", "").rstrip("/")


@pytest.mark.parametrize(("url", "allowed"), [
    ("https://himitsu.example.com.evil", ("https://himitsu.example.com",)),
    ("https://himitsu.example.community", ("https://himitsu.example.com",)),
    ("https://himitsu.example.com:8443", ("https://himitsu.example.com",)),
    ("http://himitsu.example.com", ("https://himitsu.example.com",)),
    ("https://himitsu.example.com/other", ("https://himitsu.example.com/v2",)),
    ("https://evil.example", ("https://himitsu.example.com",)),
])
def test_allowed_api_urls_refuse_outside_the_list(url: str, allowed: tuple[str, ...]) -> None:
    with pytest.raises(NotAllowed, match="--allowed-api-urls; ask the cluster administrator"):
        AllowList(allowed).check(url)


def test_an_invalid_api_url_is_refused_whatever_the_list() -> None:
    with pytest.raises(NotAllowed) as refused:
        AllowList(()).check("ftp://himitsu.example.com")
    assert "https:// or http://" in str(refused.value)
