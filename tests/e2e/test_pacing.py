"""Pacing against Himitsu's real limits: another client sharing the key costs no failure.

The session's stand-in has generous limits; this test starts one of its own with
Himitsu's (120 per key, 300 per IP, fixed 60 s windows opened by the key's first
request). 19 HimitsuSecrets at 10s read 19 environments with one key (no sharing: 114
requests a minute wanted), and another client spends 70 of the key's window with direct
requests. Measured against the real server before pacing read the headers: 19 x 429 and
19 HimitsuSecrets flipping to FetchFailure. Now: no HimitsuSecret is ever Ready=False, no
429 reaches the operator, and every one is polled again after the other client's burst.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator

import pytest
import requests

from himitsu_standin import StandIn

from .harness import Harness
from .kubehelp import is_ready, ready, wait_for
from .standin_client import Env

pytestmark = [pytest.mark.e2e, pytest.mark.local_only,
              pytest.mark.usefixtures("default_operator")]

COUNT = 19
OTHERS = 70
WATCH_SECONDS = 75.0  # past the end of the server window the other client spent in


@pytest.fixture
def limited() -> Iterator[StandIn]:
    server = StandIn("127.0.0.1", 0)  # Himitsu's own limits
    server.start()
    try:
        yield server
    finally:
        server.stop()


def test_another_client_spending_the_keys_budget_turns_no_himitsusecret_ready_false(
        h: Harness, ns: str, limited: StandIn) -> None:
    project = str(uuid.uuid4())
    token = limited.add_token(project=project, token=h.canary.token())
    envs = [Env(project, str(uuid.uuid4())) for _ in range(COUNT)]
    for env in envs:
        limited.set_secrets(env.project, env.environment, {"API_KEY": h.canary.value("pace")})
    h.token_secret(ns, token)
    names = [f"app-{i}" for i in range(COUNT)]
    for name, env in zip(names, envs, strict=True):
        h.hsec(ns, name, env, target=name, refresh="10s", api_url=limited.url)
    for name in names:
        h.wait_ready(ns, name, timeout=60)

    # The other client: 70 requests of the same key, early in one of the key's windows
    # (later, what we already spent plus 70 is over 120: then the other client overspends,
    # and no client could help the 429s that follow).
    def fresh_window() -> bool:
        window = limited.key_window(token)
        return window is not None and window[0] > 45 and window[1] <= 25

    wait_for(fresh_window, timeout=90, interval=0.2, what="a fresh window of the key")
    url = f"{limited.url}/api/v1/projects/{project}/environments/{envs[0].environment}" \
          "/secrets/runtime"
    with requests.Session() as other:
        statuses = [other.get(url, headers={"Authorization": f"Bearer {token}",
                                            "User-Agent": "another-client/1.0"},
                              timeout=10).status_code for _ in range(OTHERS)]
    burst_done = time.time()

    turned: list[str] = []  # every HimitsuSecret seen not Ready, and how

    def watched() -> bool:
        for name in names:
            obj = h.kube.hsec(ns, name)
            if not is_ready(obj):
                turned.append(f"{name}: {ready(obj)}")
        return time.monotonic() >= watched_until

    watched_until = time.monotonic() + WATCH_SECONDS
    wait_for(watched, timeout=WATCH_SECONDS + 30, interval=1.0,
             what="the watch over every HimitsuSecret's Ready condition")
    assert turned == [], turned[:5]

    ours = [r for r in limited.requests()
            if (r.user_agent or "").startswith("himitsu-k8s-operator/")]
    assert ours, "the operator sent nothing to the limited stand-in"
    assert [r for r in ours if r.status == 429] == [], "the operator ran into the key's limit"
    polled_after = {r.environment for r in ours if r.time > burst_done}
    assert polled_after == {env.environment for env in envs}, "a source stopped being polled"
    assert statuses.count(200) + statuses.count(304) >= 1  # the other client was served
