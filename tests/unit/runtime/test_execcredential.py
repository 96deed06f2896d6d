"""An exec credential plugin under load and failure: who waits for it, what it may cost.

Three clients (main, Events, leader election) share one ExecCredentials. While an early
renewal runs (before expiry), the others use the still-valid credential; a failed run is
not repeated for FAILURE_BACKOFF seconds after it ended; a plugin's stdout is bounded;
its stderr never carries what the kubeconfig handed it (env values, arguments).
"""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from himitsu_controller.runtime.client import execcredential
from himitsu_controller.runtime.client.credentials import CredentialError
from himitsu_controller.runtime.client.execcredential import ExecCredentials, ExecSpec

V1 = "client.authentication.k8s.io/v1"
EXPIRES = "1970-01-01T00:20:00Z"  # 1200 s after the epoch


def answer(token: str, expires: str | None = EXPIRES) -> bytes:
    status: dict[str, Any] = {"token": token}
    if expires is not None:
        status["expirationTimestamp"] = expires
    return json.dumps({"apiVersion": V1, "kind": "ExecCredential", "status": status}).encode()


def script(tmp_path: Path, body: str) -> str:
    path = tmp_path / "plugin"
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(0o755)
    return str(path)


def test_a_valid_credential_is_used_while_its_early_renewal_runs() -> None:
    """The plugin runs again LEEWAY before expiry, while the credential is still good:
    the leader elector must not wait on a slow plugin (up to RUN_TIMEOUT) then, or it
    loses the Lease."""
    now = [1000.0]
    release = threading.Event()
    calls = [0]

    def run(argv: Any, **kwargs: Any) -> subprocess.CompletedProcess[bytes]:
        calls[0] += 1
        if calls[0] > 1:
            release.wait(30)
        return subprocess.CompletedProcess(argv, 0, answer(f"tok-{calls[0]}"), b"")

    credentials = ExecCredentials(ExecSpec(V1, "plugin"), clock=lambda: now[0], run=run)
    assert credentials.current().authorization == "Bearer tok-1"
    now[0] = 1195.0  # within the leeway: renewal due, tok-1 valid for 5 s more
    renewing = threading.Thread(target=credentials.current, daemon=True)
    renewing.start()
    for _ in range(1000):  # until the slow renewal has started (at most ~10 s)
        if calls[0] >= 2:
            break
        renewing.join(0.01)
    assert calls[0] == 2
    got: list[str | None] = []
    other = threading.Thread(target=lambda: got.append(credentials.current().authorization),
                             daemon=True)
    other.start()
    other.join(5.0)
    release.set()
    renewing.join(5.0)
    assert got == ["Bearer tok-1"], "a caller waited on the plugin with a valid credential"
    assert credentials.current().authorization == "Bearer tok-2"


def test_a_failed_early_renewal_keeps_the_valid_credential_then_its_error() -> None:
    now = [1000.0]
    outcomes = [answer("tok-1"), None, None]

    def run(argv: Any, **kwargs: Any) -> subprocess.CompletedProcess[bytes]:
        out = outcomes.pop(0)
        if out is None:
            return subprocess.CompletedProcess(argv, 2, b"", b"idp down")
        return subprocess.CompletedProcess(argv, 0, out, b"")

    credentials = ExecCredentials(ExecSpec(V1, "plugin"), clock=lambda: now[0], run=run)
    assert credentials.current().authorization == "Bearer tok-1"
    now[0] = 1195.0
    assert credentials.current().authorization == "Bearer tok-1"  # the run failed
    assert len(outcomes) == 1
    now[0] = 1200.0 + execcredential.FAILURE_BACKOFF  # expired, backoff over
    with pytest.raises(CredentialError, match="idp down"):
        credentials.current()
    assert outcomes == []


def test_the_failure_backoff_counts_from_the_end_of_a_slow_run() -> None:
    """A plugin that takes longer than FAILURE_BACKOFF to fail must not run again for every
    request: the backoff starts when its run ended."""
    now = [1000.0]
    calls = [0]

    def run(argv: Any, **kwargs: Any) -> subprocess.CompletedProcess[bytes]:
        calls[0] += 1
        now[0] += 2 * execcredential.FAILURE_BACKOFF  # a slow failure
        return subprocess.CompletedProcess(argv, 1, b"", b"timed out talking to the idp")

    credentials = ExecCredentials(ExecSpec(V1, "plugin"), clock=lambda: now[0], run=run)
    for _ in range(3):
        with pytest.raises(CredentialError, match="timed out talking"):
            credentials.current()
    assert calls[0] == 1
    now[0] += execcredential.FAILURE_BACKOFF
    with pytest.raises(CredentialError):
        credentials.current()
    assert calls[0] == 2


@pytest.mark.parametrize(("token", "expected"), [("tok-1\n", "Bearer tok-1"),
                                                 ("  tok-1 \r\n", "Bearer tok-1")])
def test_a_plugin_token_is_trimmed(token: str, expected: str) -> None:
    def run(argv: Any, **kwargs: Any) -> subprocess.CompletedProcess[bytes]:
        return subprocess.CompletedProcess(argv, 0, answer(token, None), b"")

    assert ExecCredentials(ExecSpec(V1, "p"), run=run).current().authorization == expected


def test_a_plugin_token_with_a_control_character_is_refused() -> None:
    secret = "secret-tok-0123456789"

    def run(argv: Any, **kwargs: Any) -> subprocess.CompletedProcess[bytes]:
        return subprocess.CompletedProcess(argv, 0, answer(f"{secret}\nX: 1", None), b"")

    with pytest.raises(CredentialError, match=r"status\.token contains a control character"
                       ) as info:
        ExecCredentials(ExecSpec(V1, "p"), run=run).current()
    assert secret not in str(info.value)


def test_a_plugin_echoing_its_configured_secrets_to_stderr_is_scrubbed(tmp_path: Path) -> None:
    """The kubeconfig hands the plugin secrets (an env value, an argument); its error
    echoes them. A short secret does not look token-like: it is scrubbed as configured."""
    command = script(tmp_path, 'echo "login failed: client secret $CLIENT_SECRET for $1,'
                               ' password ${1#pw=}" >&2\nexit 1')
    spec = ExecSpec(V1, command, ("pw=Tr0ub4dor&3",), (("CLIENT_SECRET", "s3cr3t!pw"),))
    with pytest.raises(CredentialError) as info:
        ExecCredentials(spec).current()
    message = str(info.value)
    assert "login failed: client secret [redacted]" in message
    assert "s3cr3t!pw" not in message and "Tr0ub4dor&3" not in message


def test_a_plugin_writing_too_much_to_stdout_is_an_error(tmp_path: Path) -> None:
    padded = answer("tok", None) + b" " * execcredential.MAX_STDOUT

    def run(argv: Any, **kwargs: Any) -> subprocess.CompletedProcess[bytes]:
        return subprocess.CompletedProcess(argv, 0, padded, b"")

    with pytest.raises(CredentialError, match="wrote more than 4 MiB to stdout"):
        ExecCredentials(ExecSpec(V1, "p"), run=run).current()
    # A real process: its output is cut at the limit (it is killed), not all read.
    command = script(tmp_path, f'{sys.executable} -c "import sys\n'
                               'while True: sys.stdout.write(65536 * chr(32))"')
    done = execcredential.run_bounded([command], env={}, timeout=30.0, limit=1 << 20)
    assert len(done.stdout) == (1 << 20) + 1 and done.returncode != 0
    with pytest.raises(CredentialError, match="wrote more than"):
        ExecCredentials(ExecSpec(V1, command)).current()


def test_the_bounded_runner_reports_output_exit_code_and_timeout(tmp_path: Path) -> None:
    command = script(tmp_path, 'echo out; echo err >&2; exit 3')
    done = execcredential.run_bounded([command], env={}, timeout=30.0)
    assert (done.returncode, done.stdout, done.stderr) == (3, b"out\n", b"err\n")
    slow = tmp_path / "slow"
    slow.write_text(f"#!/bin/sh\nsleep 60 &\necho $! > {tmp_path}/child\nwait\n")
    slow.chmod(0o755)
    with pytest.raises(subprocess.TimeoutExpired):
        execcredential.run_bounded([str(slow)], env={}, timeout=0.5)
    child = int((tmp_path / "child").read_text())
    try:  # the plugin's children are killed with it: the pidfd turns readable on exit
        fd = os.pidfd_open(child)
    except ProcessLookupError:
        fd = None
    if fd is not None:
        select.select([fd], [], [], 10.0)
        os.close(fd)
    assert not alive(child)


def alive(pid: int) -> bool:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return False
    return "State:\tZ" not in status  # a zombie is dead, waiting for its reaper
