"""In steady state every poll is a conditional request answered 304, and nothing is rewritten."""

from __future__ import annotations

import time

import pytest

from .harness import Harness
from .kubehelp import KubeApi, rv, wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.usefixtures("default_operator")]

REFRESH_SECONDS = 2.0
POLLS = 5


def test_steady_state_answers_304_and_leaves_the_secret_alone(h: Harness, ns: str,
                                                               kube: KubeApi) -> None:
    sync = h.sync(ns, "API_KEY", "DB_PASSWORD", refresh="2s")
    wait_for(lambda: h.standin.count(sync.env, status=304) >= 1, timeout=30,
             what="the first conditional poll")
    secret_rv = rv(kube.secret(ns, sync.target))
    generation = h.get_hsec(ns, sync.name)["metadata"]["generation"]
    mark = h.standin.mark(sync.env)
    started = time.monotonic()

    wait_for(lambda: h.standin.count(sync.env, status=304, after=mark) >= POLLS, timeout=60,
             what=f"{POLLS} more polls answered 304")
    elapsed = time.monotonic() - started
    polls = h.standin.requests_after(sync.env, mark)

    version = h.standin.info(sync.env)["configVersion"]
    assert [p["status"] for p in polls] == [304] * len(polls)
    assert {p["if_none_match"] for p in polls} == {f'"himi-config-{version}"'}
    # One poll per refreshInterval: our own status writes must not cause extra polls.
    assert len(polls) <= elapsed / REFRESH_SECONDS + 2, (len(polls), elapsed)
    assert rv(kube.secret(ns, sync.target)) == secret_rv
    obj = h.get_hsec(ns, sync.name)
    assert obj["metadata"]["generation"] == generation
    assert obj["status"]["configVersion"] == version
