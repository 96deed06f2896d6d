"""Poll sharing: HimitsuSecrets reading one environment with one token share one poll.

It checks the two promises that make sharing safe: every sharer gets the data, and
different tokens never share (revoking one fails only its own HimitsuSecret).
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from himitsu_standin import fingerprint

from .harness import Harness
from .kubehelp import wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.usefixtures("default_operator")]

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

    shared_fp, own_fp = fingerprint(shared_token), fingerprint(own_token)
    mark = h.standin.mark(env)
    wait_for(lambda: sum(r["token_fingerprint"] == shared_fp
                         for r in h.standin.requests_after(env, mark)) >= POLLS,
             timeout=60, what=f"{POLLS} polls with the shared token")
    seen = h.standin.requests_after(env, mark)
    shared_polls = [r for r in seen if r["token_fingerprint"] == shared_fp]
    loner_polls = [r for r in seen if r["token_fingerprint"] == own_fp]
    # The loner polls once a round on its own: two sharers that shared one poll a round
    # asked about as often, two that polled apart twice as often. Compared with the
    # loner over the same window, not with a wall clock, so a slow machine changes nothing.
    assert len(shared_polls) <= len(loner_polls) + 2, (
        f"the sharers polled apart: {len(shared_polls)} polls vs the loner's {len(loner_polls)}")

    changed = {**values, "API_KEY": h.canary.value("shared-rotation")}
    h.standin.set_secrets(env, {"API_KEY": changed["API_KEY"]})
    for ns in (*sharers, loner):
        h.wait_data(ns, "app-secrets", changed, timeout=30)

    h.standin.revoke_token(own_token)
    h.wait_ready(loner, "app", reason="AuthenticationFailure", timeout=30)
    for ns in sharers:
        h.wait_ready(ns, "app")
