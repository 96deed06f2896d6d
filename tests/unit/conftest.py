"""Fixtures shared by the runtime tests that talk to the fake apiserver over loopback."""

from __future__ import annotations

import functools
import importlib
import io
import logging
import os
import pkgutil
import socket
from collections.abc import Iterator
from typing import Any

import pytest
import structlog
import urllib3.util.connection
from fake_apiserver import FakeApiServer
from fakes import SleepClock
from hypothesis import HealthCheck, settings
from hypothesis.internal import constants_ast
from hypothesis.internal.conjecture import providers
from hypothesis.internal.floats import float_to_int
from sortedcontainers import SortedSet
from tls_server import Pki, TlsApiServer, make_pki

import himitsu_controller
from himitsu_controller import logging as hlog
from himitsu_controller.runtime.client.transport import HttpClient

# Property and model-based tests judge behaviour, never speed: no per-example deadline and
# no too_slow health check (a loaded 2-core CI machine is slow, not wrong). Under CI the
# examples are derandomized, so a CI run is reproducible; locally each run explores anew.
settings.register_profile(
    "himitsu", deadline=None, suppress_health_check=[HealthCheck.too_slow],
    derandomize=bool(os.environ.get("CI")),
)
settings.load_profile("himitsu")


def _pin_local_constants() -> None:
    """Make what a derandomized test draws depend on the test and the operator only.

    Hypothesis (6.131.1+) sometimes draws a constant found in the source of a local module,
    from every local module imported so far. So the examples a test drew depended on
    which other test files the run had imported: the model-based test drew another 250
    after the whole suite than alone (bench/, the old hack/check_layers.py and
    hack/himitsu_standin add ~160 constants). The pool is pinned to the operator's own
    modules (what a test of one module already imports), whatever else a run imports.
    """
    if not hasattr(providers, "_get_local_constants"):
        raise RuntimeError("Hypothesis draws local constants another way: update "
                           "tests/unit/conftest.py:_pin_local_constants")

    @functools.cache
    def pinned() -> constants_ast.Constants:  # at the first draw, as Hypothesis does
        found = constants_ast.constants_from_module(himitsu_controller)
        for info in pkgutil.walk_packages(himitsu_controller.__path__, "himitsu_controller."):
            if not info.name.endswith(".__main__"):  # importing it would run the operator
                found |= constants_ast.constants_from_module(importlib.import_module(info.name))
        providers.CONSTANTS_CACHE.cache.clear()
        # Sorted, as Hypothesis keeps them: a set of strings iterates in hash order.
        return constants_ast.Constants(
            integers=SortedSet(found.integers), floats=SortedSet(found.floats, key=float_to_int),
            bytes=SortedSet(found.bytes), strings=SortedSet(found.strings))

    providers._get_local_constants = pinned


_pin_local_constants()


@pytest.fixture
def server() -> Iterator[FakeApiServer]:
    fake = FakeApiServer().start()
    yield fake
    fake.stop()


@pytest.fixture
def api_client(server: FakeApiServer) -> Iterator[HttpClient]:
    client = server.api_client()
    yield client
    FakeApiServer.close_client(client)


@pytest.fixture(scope="session")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture
def tls_server(pki: Pki) -> Iterator[TlsApiServer]:
    server = TlsApiServer(pki)
    yield server
    server.stop()


@pytest.fixture
def clock() -> SleepClock:
    return SleepClock()


@pytest.fixture
def connects(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, int]]:
    """Every TCP connection a client opens, counted as it opens it: a count that needs no
    server thread to have caught up (urllib3 makes a new connection for each re-send)."""
    opened: list[tuple[str, int]] = []
    create = urllib3.util.connection.create_connection

    def counting(address: tuple[str, int], *args: Any, **kwargs: Any) -> socket.socket:
        opened.append(address)
        return create(address, *args, **kwargs)

    monkeypatch.setattr(urllib3.util.connection, "create_connection", counting)
    return opened


@pytest.fixture
def log_stream() -> Iterator[io.StringIO]:
    """The operator's log lines (JSON, debug and up) for one test; logging restored after."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    stream = io.StringIO()
    hlog.configure(level="debug", fmt="json", stream=stream)
    yield stream
    structlog.reset_defaults()
    root.handlers[:] = handlers
    root.setLevel(level)
