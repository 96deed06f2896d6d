"""Poll sharing: HimitsuSecrets reading one environment with one token share one poll.

It checks the two promises that make sharing safe: every sharer gets the data, and
different tokens never share (revoking one fails only its own HimitsuSecret).
"""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest

from himitsu_standin import fingerprint

from .harness import Harness
from .kubehelp import wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.usefixtures("default_operator")]

REFRESH_SECONDS = 2.0
POLLS = 5


def test_shared_polls_serve_every_sharer_and_never_mix_tokens(
        h: Harness, make_ns: Callable[[str], str]) -> None:
    env, values = h.environment("API_KEY", "DB_PASSWORD")
    shared_token, own_token = h.token_for(env), h.token_for(env)
    sharers = [make_ns("share-a"), make_ns("share-b")]
    loner = make_ns("share-c")
    for ns in sharers:
        h.token_secret(ns, shared_token)
        h.hsec(ns, "app", env, target="app-secrets", refresh="2s")
    h.token_secret(loner, own_token)
    h.hsec(loner, "app", env, target="app-secrets", refresh="2s")
    for ns in (*sharers, loner):
        h.wait_data(ns, "app-secrets", values)

    shared_fp = fingerprint(shared_token)
    mark = h.standin.mark(env)
    started = time.monotonic()
    wait_for(lambda: sum(r["token_fingerprint"] == shared_fp
                         for r in h.standin.requests_after(env, mark)) >= POLLS,
             timeout=60, what=f"{POLLS} polls with the shared token")
    elapsed = time.monotonic() - started
    shared_polls = [r for r in h.standin.requests_after(env, mark)
                    if r["token_fingerprint"] == shared_fp]
    assert len(shared_polls) <= elapsed / REFRESH_SECONDS + 2, "the sharers polled apart"

    changed = {**values, "API_KEY": h.canary.value("shared-rotation")}
    h.standin.set_secrets(env, {"API_KEY": changed["API_KEY"]})
    for ns in (*sharers, loner):
        h.wait_data(ns, "app-secrets", changed, timeout=30)

    h.standin.revoke_token(own_token)
    h.wait_ready(loner, "app", reason="AuthenticationFailure", timeout=30)
    for ns in sharers:
        h.wait_ready(ns, "app")
