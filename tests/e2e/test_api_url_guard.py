"""Where a token may go, on a real control plane: the allow-list cannot be walked out of,
and a token bound to Himitsu by its Secret's annotation is never sent anywhere else.

Each test starts its own operator with its own --allowed-api-urls (so they are skipped
on kind, where the operator is the in-cluster Deployment). "Sends nothing" is read from
the request logs of whoever would have received the token: the stand-in's, and a
recording server standing in for the attacker's.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from himitsu_controller import api

from .harness import READY_TIMEOUT, Harness
from .kind import KindLauncher
from .kubehelp import ApiError, wait_for
from .operator_proc import OperatorLauncher

pytestmark = [pytest.mark.e2e]


class Catcher:
    """A server of the attacker's: records every request line (and whether a bearer
    token came with it), answers 404."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, bool]] = []
        catcher = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                catcher.seen.append((self.requestline,
                                     "Authorization" in self.headers))
                self.send_response(404)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._httpd.server_address[1]}"
        self._thread = threading.Thread(target=self._httpd.serve_forever, args=(0.05,),
                                        daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(timeout=10)


@pytest.fixture
def catcher() -> Iterator[Catcher]:
    server = Catcher()
    yield server
    server.stop()


def test_a_prefix_walk_sends_no_request(operator: OperatorLauncher | KindLauncher,
                                        h: Harness, ns: str) -> None:
    """The issue's reproduction: with {Himitsu}/himitsu allowed, {Himitsu}/himitsu/.. was
    accepted and requested as /api/v1/... (outside the prefix), where the stand-in
    answered it."""
    prefix = f"{h.standin.api_url}/himitsu"
    operator.start(f"--allowed-api-urls={prefix}", name="prefix-walk")
    env, _ = h.environment("API_KEY")
    h.token_secret(ns, h.token_for(env))
    h.hsec(ns, "walk", env, target="walk-secrets", refresh="5s", api_url=f"{prefix}/..")

    h.wait_ready(ns, "walk", reason="InvalidSpec", message_has="apiUrl's path")
    assert h.standin.requests_naming(env) == [], "the walk reached the stand-in"
    assert h.kube.secret(ns, "walk-secrets") is None


def test_a_token_bound_to_himitsu_is_invalid_spec_elsewhere_and_never_sent(
    operator: OperatorLauncher | KindLauncher, h: Harness, ns: str, catcher: Catcher,
) -> None:
    """The operator-wide list allows both URLs (say, two teams' Himitsu); the token's
    owner bound it to the stand-in, so a HimitsuSecret pointing it at the other one is
    refused before anything is sent, while the token keeps working where it belongs."""
    operator.start(f"--allowed-api-urls={h.standin.api_url},{catcher.url}", name="bound")
    env, values = h.environment("API_KEY", "DB_PASSWORD")
    h.secret(ns, "team-a-token", {"token": h.token_for(env)},
             annotations={api.ANN_ALLOWED_API_URLS: h.standin.api_url})

    h.hsec(ns, "team-a", env, target="team-a-secrets", auth_name="team-a-token")
    h.wait_ready(ns, "team-a")
    h.wait_data(ns, "team-a-secrets", values)

    h.hsec(ns, "steal", env, target="stolen", refresh="5s", auth_name="team-a-token",
           api_url=catcher.url)
    h.wait_ready(ns, "steal", reason="InvalidSpec", message_has=api.ANN_ALLOWED_API_URLS)
    assert catcher.seen == [], "the bound token was sent to another URL"
    assert h.kube.secret(ns, "stolen") is None
    wait_for(lambda: [e for e in h.events(ns, "steal")
                      if (e["type"], e["reason"]) == ("Warning", "InvalidSpec")],
             timeout=READY_TIMEOUT, what="a Warning InvalidSpec Event for 'steal'")
    assert catcher.seen == []


def test_a_himitsu_secret_author_cannot_rebind_or_overwrite_a_token_secret(
    operator: OperatorLauncher | KindLauncher, h: Harness, ns: str, catcher: Catcher,
) -> None:
    """The review's attack: team B (HimitsuSecrets, no Secret writes) Merges into team A's
    token Secret with template annotation himitsu.io/allowed-api-urls, rebinding the token
    to a URL of its own. The apiserver refuses such a template (the CRD's rule); a Merge
    into a token Secret is TargetConflict and writes nothing to it."""
    operator.start(f"--allowed-api-urls={h.standin.api_url},{catcher.url}", name="rebind")
    env_a, _ = h.environment("API_KEY")
    h.secret(ns, "team-a-token", {"token": h.token_for(env_a)},
             annotations={api.ANN_ALLOWED_API_URLS: h.standin.api_url})
    env_b, _ = h.environment("B_KEY")
    h.secret(ns, "team-b-token", {"token": h.token_for(env_b)})
    before = h.kube.secret(ns, "team-a-token")

    for labels, notes in (({}, {api.ANN_ALLOWED_API_URLS: catcher.url}),
                                ({}, {api.ANN_ALLOWED_API_URLS: ""}),
                                ({api.LABEL_MANAGED_BY: api.MANAGED_BY_VALUE}, {})):
        with pytest.raises(ApiError) as info:
            h.hsec(ns, "widen", env_b, target="team-a-token", policy="Merge",
                   auth_name="team-b-token", labels=labels, annotations=notes)
        assert info.value.status == 422 and "reserved" in info.value.message

    h.hsec(ns, "merge", env_b, target="team-a-token", policy="Merge",
           auth_name="team-b-token", annotations={"example.com/note": "x"})
    h.wait_ready(ns, "merge", reason="TargetConflict", message_has="token Secret")
    after = h.kube.secret(ns, "team-a-token")
    assert after is not None and before is not None
    assert after["metadata"]["resourceVersion"] == before["metadata"]["resourceVersion"]
    assert h.standin.requests_naming(env_b) == []  # refused before Himitsu is asked
    assert catcher.seen == []


def test_a_binding_added_while_the_token_is_cached_holds_at_once_for_a_new_url(
    operator: OperatorLauncher | KindLauncher, h: Harness, ns: str, catcher: Catcher,
) -> None:
    """The review's case: the token is in use (cached) when its owner binds it; a
    HimitsuSecret pointing it at another URL right after must not get it there (it did
    for up to the cache's five minutes)."""
    operator.start(f"--allowed-api-urls={h.standin.api_url},{catcher.url}", name="stale")
    env, _ = h.environment("API_KEY")
    h.secret(ns, "team-a-token", {"token": h.token_for(env)})
    h.hsec(ns, "team-a", env, target="team-a-secrets", auth_name="team-a-token")
    h.wait_ready(ns, "team-a")
    h.kube.merge_patch(f"/api/v1/namespaces/{ns}/secrets/team-a-token", {"metadata": {
        "annotations": {api.ANN_ALLOWED_API_URLS: h.standin.api_url}}})
    h.hsec(ns, "steal", env, target="stolen", refresh="5s", auth_name="team-a-token",
           api_url=catcher.url)
    h.wait_ready(ns, "steal", reason="InvalidSpec", message_has=api.ANN_ALLOWED_API_URLS)
    assert catcher.seen == [], "the bound token was sent to another URL"
