"""Fixtures shared by the runtime tests that talk to the fake apiserver over loopback."""

from __future__ import annotations

import io
import logging
import os
import socket
from collections.abc import Iterator
from typing import Any

import pytest
import structlog
import urllib3.util.connection
from fake_apiserver import FakeApiServer
from fakes import SleepClock
from hypothesis import HealthCheck, settings
from kubernetes import client as k8s

from himitsu_controller import logging as hlog

# Property and model-based tests judge behaviour, never speed: no per-example deadline and
# no too_slow health check (a loaded 2-core CI machine is slow, not wrong). Under CI the
# examples are derandomized, so a CI run is reproducible; locally each run explores anew.
settings.register_profile(
    "himitsu", deadline=None, suppress_health_check=[HealthCheck.too_slow],
    derandomize=bool(os.environ.get("CI")),
)
settings.load_profile("himitsu")


@pytest.fixture
def server() -> Iterator[FakeApiServer]:
    fake = FakeApiServer().start()
    yield fake
    fake.stop()


@pytest.fixture
def api_client(server: FakeApiServer) -> Iterator[k8s.ApiClient]:
    client = server.api_client()
    yield client
    FakeApiServer.close_client(client)


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
