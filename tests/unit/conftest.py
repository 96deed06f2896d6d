"""Fixtures shared by the runtime tests that talk to the fake apiserver over loopback."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from fake_apiserver import FakeApiServer
from fakes import SleepClock
from kubernetes import client as k8s


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
