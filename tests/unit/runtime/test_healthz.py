"""Probe endpoints over real loopback HTTP: ok/500 with failing check names, verbose
listings, single-check paths, and checks flipping at run time."""

from __future__ import annotations

import urllib.error
import urllib.request
from collections.abc import Iterator

import pytest

from himitsu_controller.runtime.healthz import ProbeServer


@pytest.fixture
def probes() -> Iterator[ProbeServer]:
    server = ProbeServer("127.0.0.1:0")
    server.start()
    yield server
    server.stop()


def get(server: ProbeServer, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{server.port}{path}", timeout=10) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()


def test_no_checks_is_ok(probes: ProbeServer) -> None:
    assert get(probes, "/healthz") == (200, "ok")
    assert get(probes, "/readyz") == (200, "ok")


def test_failing_check_gives_500_naming_it(probes: ProbeServer) -> None:
    probes.add_readyz("caches", lambda: "waiting for caches: secrets")
    probes.add_readyz("other", lambda: None)
    status, body = get(probes, "/readyz")
    assert status == 500
    assert "[-]caches failed: waiting for caches: secrets" in body
    assert "other" not in body  # only failures without ?verbose
    assert get(probes, "/healthz") == (200, "ok")  # readiness does not affect liveness


def test_verbose_lists_every_check(probes: ProbeServer) -> None:
    probes.add_healthz("ping", lambda: None)
    probes.add_healthz("workers", lambda: None)
    status, body = get(probes, "/healthz?verbose")
    assert status == 200
    assert body.splitlines() == ["[+]ping ok", "[+]workers ok", "healthz check passed"]


def test_checks_flip_at_run_time(probes: ProbeServer) -> None:
    state: dict[str, str | None] = {"reason": "not yet"}
    probes.add_readyz("flag", lambda: state["reason"])
    assert get(probes, "/readyz")[0] == 500
    state["reason"] = None
    assert get(probes, "/readyz") == (200, "ok")
    state["reason"] = "broken again"
    assert get(probes, "/readyz")[0] == 500


def test_single_check_path(probes: ProbeServer) -> None:
    probes.add_readyz("good", lambda: None)
    probes.add_readyz("bad", lambda: "down")
    assert get(probes, "/readyz/good") == (200, "ok")
    assert get(probes, "/readyz/bad")[0] == 500
    assert get(probes, "/readyz/missing")[0] == 404
    assert get(probes, "/nothing")[0] == 404


def test_a_raising_check_fails_without_breaking_the_probe(probes: ProbeServer) -> None:
    def broken() -> str | None:
        raise RuntimeError("oops")

    probes.add_healthz("broken", broken)
    status, body = get(probes, "/healthz")
    assert status == 500
    assert "[-]broken failed: check raised RuntimeError" in body


def test_duplicate_or_bad_check_names_are_refused(probes: ProbeServer) -> None:
    probes.add_healthz("x", lambda: None)
    with pytest.raises(ValueError, match="already registered"):
        probes.add_healthz("x", lambda: None)
    with pytest.raises(ValueError, match="invalid"):
        probes.add_readyz("a/b", lambda: None)


def test_disabled_address_serves_nothing() -> None:
    server = ProbeServer("0")
    server.start()
    with pytest.raises(RuntimeError):
        _ = server.port
    server.stop()


def test_stop_closes_the_port() -> None:
    server = ProbeServer("127.0.0.1:0")
    server.start()
    port = server.port
    server.stop()
    with pytest.raises(urllib.error.URLError):
        urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5)
