"""Tests for cli.run's wiring of the Event recorder, against a fake apiserver on loopback.

The recorder is built on the operator's own RestClient, handed to the KubeClient the
reconciler uses, started before the manager and stopped after it: an Event a reconcile
reports reaches the apiserver, and no recorder thread outlives ``run``.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from fake_apiserver import Canned, FakeApiServer, Recorded, kubeconfig_for

from himitsu_controller import __version__, api, cli

TIMEOUT = 30.0
EVENTS_PATH = "/api/v1/namespaces/apps/events"


class HimitsuApiServer(FakeApiServer):
    """Serves Secrets (none) and one HimitsuSecret whose spec is invalid, so its first
    reconcile reports InvalidSpec with a Warning Event and talks to nothing else."""

    def __init__(self) -> None:
        super().__init__(list_kind="SecretList", api_version="v1")

    def _get(self, path: str) -> Canned:
        if not path.endswith(f"/{api.PLURAL}"):
            return super()._get(path)
        broken = {"metadata": {"namespace": "apps", "name": "broken", "uid": "u-1",
                               "resourceVersion": "10", "generation": 1},
                  "spec": {"target": {"name": "app-secrets"}}}
        return Canned(200, {"kind": f"{api.KIND}List", "apiVersion": api.API_VERSION,
                            "metadata": {"resourceVersion": "10"}, "items": [broken]})


def event_posts(server: FakeApiServer) -> list[Recorded]:
    return [r for r in server.requests_of("POST") if r.path == EVENTS_PATH]


def recorder_threads() -> set[threading.Thread]:
    return {t for t in threading.enumerate() if t.name == "event-recorder" and t.is_alive()}


@pytest.mark.timeout(90)
def test_run_sends_reconcile_events_through_the_recorder_and_stops_it(tmp_path: Path) -> None:
    server = HimitsuApiServer().start()
    before = recorder_threads()
    try:
        args = cli.build_parser().parse_args([
            "--kubeconfig", str(kubeconfig_for(server, tmp_path / "kc")),
            "--metrics-bind-address", "0", "--health-probe-bind-address", "0",
            "--log-level", "warning", "--graceful-shutdown-timeout", "5s"])
        stop = threading.Event()
        codes: list[int] = []
        runner = threading.Thread(target=lambda: codes.append(cli.run(args, stop=stop)),
                                  daemon=True)
        runner.start()
        try:
            deadline = time.monotonic() + TIMEOUT
            while not event_posts(server):
                assert runner.is_alive(), "cli.run ended before any Event was sent"
                assert time.monotonic() < deadline, "no Event reached the apiserver"
                stop.wait(0.01)
        finally:
            stop.set()
            runner.join(TIMEOUT)
        assert not runner.is_alive()
        assert codes == [0]
    finally:
        server.stop()
    post = event_posts(server)[0]
    body: dict[str, Any] = json.loads(post.body)
    assert (body["type"], body["reason"]) == ("Warning", "InvalidSpec")
    assert body["involvedObject"]["kind"] == api.KIND
    assert body["involvedObject"]["name"] == "broken"
    # Sent on the recorder's own client: its own limiter, its own user agent.
    assert post.headers["user-agent"] == f"himitsu-controller/{__version__} events"
    assert recorder_threads() - before == set(), "the recorder outlived cli.run"
