"""Tests for cli.run's wiring of the Event recorder, against a fake apiserver on loopback.

The recorder is built on the operator's own RestClient, handed to the KubeClient the
reconciler uses, started before the manager and stopped after it: an Event a reconcile
reports reaches the apiserver, and no recorder thread outlives ``run``.
"""

from __future__ import annotations

import base64
import json
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import structlog
from fake_apiserver import Canned, FakeApiServer, Recorded, kubeconfig_for

from himitsu_controller import __version__, api, cli, kube, watches
from himitsu_controller.runtime.cache.informer import Informer
from himitsu_controller.runtime.client.config import ConfigError
from himitsu_controller.runtime.client.rest import ApiError, RestClient, TransportError
from himitsu_controller.runtime.leader.election import LeaderElector
from himitsu_controller.runtime.metrics import REGISTRY

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


@pytest.mark.timeout(90)
def test_run_hands_one_write_gate_to_the_reconcile_client_the_recorder_and_the_elector(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """With --leader-elect, reconcile writes and Events go out only while the elector
    vouches for the Lease: all three must share the one gate the elector opens."""
    gates: dict[str, Any] = {}

    class RecordingRestClient(RestClient):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            agent = str(kwargs.get("user_agent") or "")
            role = agent.rsplit(" ", 1)[-1] if " " in agent else "reconcile"
            gates[role] = kwargs.get("write_gate")

    class RecordingElector(LeaderElector):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            gates["elector"] = self.gate

    monkeypatch.setattr(cli, "RestClient", RecordingRestClient)
    monkeypatch.setattr(cli, "LeaderElector", RecordingElector)
    server = HimitsuApiServer().start()
    try:
        args = cli.build_parser().parse_args([
            "--kubeconfig", str(kubeconfig_for(server, tmp_path / "kc")), "--leader-elect",
            "--metrics-bind-address", "0", "--health-probe-bind-address", "0",
            "--log-level", "warning", "--graceful-shutdown-timeout", "5s"])
        stop = threading.Event()
        runner = threading.Thread(target=lambda: cli.run(args, stop=stop), daemon=True)
        runner.start()
        try:
            deadline = time.monotonic() + TIMEOUT
            while "elector" not in gates:
                assert runner.is_alive(), "cli.run ended before the elector was built"
                assert time.monotonic() < deadline, "no elector was built"
                stop.wait(0.01)
        finally:
            stop.set()
            runner.join(TIMEOUT)
        assert not runner.is_alive(), "cli.run did not stop"
    finally:
        server.stop()
    assert set(gates) == {"reconcile", "events", "leader-election", "elector"}
    assert gates["leader-election"] is None  # the elector's own client is not gated
    assert gates["reconcile"] is not None
    assert gates["reconcile"] is gates["events"] is gates["elector"]


@pytest.mark.timeout(60)
def test_a_lease_duration_that_is_not_whole_seconds_stops_the_operator_with_one_line(
        tmp_path: Path) -> None:
    server = HimitsuApiServer().start()
    try:
        args = cli.build_parser().parse_args([
            "--kubeconfig", str(kubeconfig_for(server, tmp_path / "kc")), "--leader-elect",
            "--leader-election-lease-duration", "3.5s",
            "--leader-election-renew-deadline", "3s",
            "--leader-election-retry-period", "1s",
            "--metrics-bind-address", "0", "--health-probe-bind-address", "0"])
        stopped = threading.Event()
        stopped.set()  # were it accepted, the operator would stop at once
        with pytest.raises(ConfigError, match="whole seconds"):
            cli.run(args, stop=stopped)
    finally:
        server.stop()


# --- where tokens may go: checked at start ---------------------------------------------------


def unrestricted_gauge() -> float | None:
    return REGISTRY.get_sample_value("himitsu_api_urls_unrestricted")


@pytest.mark.parametrize(("flags", "warned", "gauge"), [
    ([], True, 1.0),
    (["--allowed-api-urls", "https://himitsu.example.com,https://b.example/himitsu"],
     False, 0.0),
])
def test_running_without_an_allow_list_warns_and_says_so_in_a_metric(
    tmp_path: Path, flags: list[str], warned: bool, gauge: float,
) -> None:
    args = cli.build_parser().parse_args(
        [*flags, "--kubeconfig", str(tmp_path / "none"), "--metrics-bind-address", "0"])
    with structlog.testing.capture_logs() as logs, pytest.raises(ConfigError):
        cli.run(args)  # stops at the missing kubeconfig, after the check
    warnings = [e for e in logs if e["log_level"] == "warning"
                and "--allowed-api-urls" in e["event"]]
    assert bool(warnings) == warned
    assert unrestricted_gauge() == gauge


@pytest.mark.timeout(60)
@pytest.mark.parametrize(("flags", "said"), [
    (["--allowed-api-urls", "http://himitsu.example.com"], "--allow-insecure-http"),
    (["--allowed-api-urls", "https://himitsu.example.com/a/../b"], "entry"),
    (["--allowed-api-urls", "himitsu.example.com"], "https:// or http://"),
    # Given but empty is an install gone wrong (HIMITSU_API_URLS=,), not "unrestricted".
    (["--allowed-api-urls="], "holds no URL"),
    (["--allowed-api-urls", " "], "holds no URL"),
    (["--allowed-api-urls", ", ,"], "holds no URL"),
])
def test_an_unusable_allow_list_stops_the_operator_with_one_line(
    tmp_path: Path, flags: list[str], said: str,
) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "himitsu_controller", *flags,
         "--kubeconfig", str(tmp_path / "none")],
        capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 1
    (line,) = [ln for ln in result.stderr.splitlines() if ln.strip()]
    assert line.startswith("himitsu-controller: error: --allowed-api-urls")
    assert said in line


# Duration flags: Go durations in, Go durations shown.

DURATION_FLAGS = {
    "--leader-election-lease-duration": ("leader_election_lease_duration", "15s", 15.0),
    "--leader-election-renew-deadline": ("leader_election_renew_deadline", "10s", 10.0),
    "--leader-election-retry-period": ("leader_election_retry_period", "2s", 2.0),
    "--graceful-shutdown-timeout": ("graceful_shutdown_timeout", "30s", 30.0),
    "--watch-liveness-timeout": ("watch_liveness_timeout", "5m", 300.0),
    "--sync-period": ("sync_period", "10h", 36000.0),
}


@pytest.mark.parametrize("flag", sorted(DURATION_FLAGS))
def test_duration_flags_take_what_help_shows(flag: str) -> None:
    dest, shown, seconds = DURATION_FLAGS[flag]
    parser = cli.build_parser()
    help_text = " ".join(parser.format_help().split())
    entry = help_text.rpartition(f"{flag} DURATION")[2].partition(" --")[0]  # not usage
    assert f"(default: {shown})" in entry
    assert getattr(parser.parse_args([]), dest) == seconds
    # What the help shows is what the flag takes.
    assert getattr(parser.parse_args([flag, shown]), dest) == seconds
    assert getattr(parser.parse_args([flag, "1m30s"]), dest) == 90.0
    # (over a minute: --sync-period's floor, test_resync.py)
    assert getattr(parser.parse_args([flag, "90500ms"]), dest) == 90.5


def test_a_duration_without_a_unit_is_refused_with_the_fix(
        capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        cli.build_parser().parse_args(["--leader-election-lease-duration", "15"])
    assert exit_info.value.code == 2
    assert "'15' has no unit: write a Go duration such as 15s" in capsys.readouterr().err
    assert cli.build_parser().parse_args(["--watch-liveness-timeout", "0"]) \
        .watch_liveness_timeout == 0.0


@pytest.mark.parametrize(("flag", "value", "said"), [
    ("--graceful-shutdown-timeout", "-1s", "'-1s' is negative: it takes 0 or more"),
    ("--leader-election-retry-period", "0", "'0' is too short: it takes more than 0"),
    ("--leader-election-lease-duration", "-5s", "'-5s' is negative"),
    ("--watch-liveness-timeout", "5s", "'5s' is too short: it takes 0 (off) or at least 10s"),
])
def test_a_duration_flag_error_names_the_flag_and_what_it_takes(
        capsys: pytest.CaptureFixture[str], flag: str, value: str, said: str) -> None:
    with pytest.raises(SystemExit) as exit_info:
        cli.build_parser().parse_args([f"{flag}={value}"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert f"argument {flag}: {said}" in err
    assert "refreshInterval" not in err and "sync once" not in err


def test_minus_zero_is_zero_as_in_go() -> None:
    parser = cli.build_parser()
    assert parser.parse_args(["--graceful-shutdown-timeout=-0"]).graceful_shutdown_timeout == 0
    assert parser.parse_args(["--watch-liveness-timeout=-0s"]).watch_liveness_timeout == 0
    assert parser.parse_args(["--watch-liveness-timeout=10s"]).watch_liveness_timeout == 10


@pytest.mark.parametrize("flags", [
    ["--leader-election-renew-deadline=2s", "--leader-election-retry-period=1.9s"],
    ["--leader-election-lease-duration=10s", "--leader-election-renew-deadline=10s"],
], ids=["renew-under-1.2x-retry", "lease-not-over-renew"])
def test_a_leader_election_flag_combination_client_go_refuses_is_one_line(
        tmp_path: Path, flags: list[str]) -> None:
    server = FakeApiServer().start()  # never asked: bad flags stop the operator first
    try:
        result = subprocess.run(
            [sys.executable, "-m", "himitsu_controller", "--leader-elect", *flags,
             "--kubeconfig", str(kubeconfig_for(server, tmp_path / "kubeconfig"))],
            capture_output=True, text=True, timeout=60, check=False)
        assert result.returncode == 1
        assert "Traceback" not in result.stderr
        (line,) = [ln for ln in result.stderr.splitlines() if "error:" in ln]
        assert line.startswith("himitsu-controller: error: --leader-election-")
        assert "must be greater than" in line
        assert server.requests == []
    finally:
        server.stop()


# Startup waits for an unreachable apiserver (bounded, logged) instead of exiting at once.

class Unreachable:
    """``request`` fails ``failures`` times (an exception each), then answers."""

    def __init__(self, *failures: Exception) -> None:
        self.failures = list(failures)
        self.calls = 0

    def request(self, method: str, path: str, **options: Any) -> dict[str, Any]:
        self.calls += 1
        if self.failures:
            raise self.failures.pop(0)
        return {"items": []}


class SimulatedWait(threading.Event):
    """A stop event whose waits pass on a simulated clock at once."""

    def __init__(self) -> None:
        super().__init__()
        self.now = 0.0
        self.waits: list[float] = []

    def wait(self, timeout: float | None = None) -> bool:
        assert timeout is not None
        self.waits.append(timeout)
        self.now += timeout
        return False


def test_startup_waits_for_an_unreachable_apiserver_with_a_backoff_and_says_why() -> None:
    refused = TransportError("GET /apis/...: NewConnectionError: Connection refused")
    rest = Unreachable(refused, refused, ApiError(503, "ServiceUnavailable", "starting"), refused)
    stop = SimulatedWait()
    with structlog.testing.capture_logs() as logs:
        cli._check_reachable(rest, None, stop=stop, clock=lambda: stop.now)  # type: ignore[arg-type]
    assert rest.calls == 5
    assert stop.waits == [1.0, 2.0, 4.0, 8.0]
    waiting = [e for e in logs if e["event"] == "Kubernetes API unreachable, waiting for it"]
    assert [e["attempt"] for e in waiting] == [1, 2, 3, 4]
    assert "Connection refused" in waiting[0]["error"]
    assert {"event": "Kubernetes API reachable", "attempts": 5, "log_level": "info"} in logs


def test_startup_gives_up_on_an_unreachable_apiserver_after_a_bound() -> None:
    refused = TransportError("Connection refused")
    rest = Unreachable(*[refused] * 100)
    stop = SimulatedWait()
    with structlog.testing.capture_logs() as logs, pytest.raises(TransportError):
        cli._check_reachable(rest, None, stop=stop, clock=lambda: stop.now)  # type: ignore[arg-type]
    assert sum(stop.waits) == pytest.approx(cli.STARTUP_API_WAIT)
    assert max(stop.waits) <= cli.STARTUP_API_BACKOFF[1]
    assert any(e["event"] == "giving up: Kubernetes API unreachable" for e in logs)


@pytest.mark.parametrize(("answer", "raised"), [
    (ApiError(403, "Forbidden", "cannot list"), ApiError),
    (ApiError(404, "NotFound", "no such resource"), ConfigError),
])
def test_startup_does_not_wait_when_the_apiserver_refuses_us(
        answer: ApiError, raised: type[Exception]) -> None:
    rest = Unreachable(answer)
    stop = SimulatedWait()
    with pytest.raises(raised):
        cli._check_reachable(rest, None, stop=stop, clock=lambda: stop.now)  # type: ignore[arg-type]
    assert stop.waits == []


# The token cache follows the HimitsuSecrets that name a token.

def test_a_token_value_goes_with_the_last_himitsu_secret_naming_it() -> None:
    server = FakeApiServer(list_kind=f"{api.KIND}List", api_version=api.API_VERSION)
    server.collections.add(api.PLURAL)
    server.start()
    client = server.api_client()
    stop = threading.Event()
    try:
        for name in ("one", "two"):
            server.put(name, namespace="apps", spec={"authSecretRef": {"name": "tok"}})
        hsecs = Informer(RestClient(client), kube.HIMITSU_SECRETS, name="himitsusecrets",
                         indexers={watches.AUTH_INDEX: kube.token_refs})
        tokens = TokenReads()
        kube_client = kube.KubeClient(tokens, himitsu_secrets=hsecs.store,  # type: ignore[arg-type]
                                      secrets=hsecs.store)
        watches.forget_tokens_with_their_users(hsecs, kube_client)
        runner = threading.Thread(target=hsecs.run, args=(stop,), daemon=True)
        runner.start()
        session = server.next_watch(TIMEOUT)
        assert kube_client.read_secret_value("apps", "tok", "token").value == b"t0k3n"
        session.send({"type": "DELETED", "object": server.remove("one", namespace="apps")})
        wait_for(lambda: hsecs.store.get("apps/one") is None)
        assert kube_client.cache_sizes()["tokens"] == 1  # "two" still names it
        session.send({"type": "DELETED", "object": server.remove("two", namespace="apps")})
        wait_for(lambda: kube_client.cache_sizes()["tokens"] == 0)
    finally:
        stop.set()
        server.stop()
        FakeApiServer.close_client(client)


class TokenReads:
    """The token Secret's GET, for KubeClient."""

    def request(self, method: str, path: str, **_: Any) -> dict[str, Any]:
        assert (method, path) == ("GET", "/api/v1/namespaces/apps/secrets/tok")
        return {"metadata": {"name": "tok", "namespace": "apps"},
                "data": {"token": base64.b64encode(b"t0k3n").decode()}}


def wait_for(condition: Callable[[], bool]) -> None:
    deadline = time.monotonic() + TIMEOUT
    while not condition():
        assert time.monotonic() < deadline, "condition not reached"
        threading.Event().wait(0.01)


@pytest.mark.timeout(60)
@pytest.mark.parametrize(("flags", "said"), [
    (["--metrics-secure"], "--metrics-secure needs --metrics-cert-dir"),
    (["--metrics-secure", "--metrics-cert-dir", "/nonexistent"], "cannot load tls.crt"),
    (["--metrics-cert-dir", "/tmp"], "only read with --metrics-secure"),
])
def test_secure_metrics_without_a_usable_certificate_stops_the_operator_with_one_line(
    tmp_path: Path, flags: list[str], said: str,
) -> None:
    kubeconfig = tmp_path / "kc"  # checked before the apiserver is ever asked
    kubeconfig.write_text(
        "apiVersion: v1\nkind: Config\n"
        "clusters: [{name: c, cluster: {server: 'https://127.0.0.1:1'}}]\n"
        "users: [{name: u, user: {token: t}}]\n"
        "contexts: [{name: c, context: {cluster: c, user: u}}]\ncurrent-context: c\n")
    args = cli.build_parser().parse_args([*flags, "--kubeconfig", str(kubeconfig)])
    with pytest.raises(ConfigError, match=said):
        cli.run(args)
