"""A restart with every target in sync reads no secret again: its first polls are 304s.

A rollout, a crash or a failover starts a process with nothing in memory. It still
sends the version each target holds as If-None-Match, so Himitsu answers 304 (no secret
material on the wire, no ``secret.read`` audit event per source per rollout) and the
Secrets are left alone. An empty environment (version 0) is no exception: Himitsu
answers 304 to ``"himi-config-0"`` too, before and after the restart.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import pytest

from .harness import Harness
from .kubehelp import KubeApi, rv, wait_for
from .operator_proc import OperatorLauncher
from .standin_client import Env

pytestmark = [pytest.mark.e2e, pytest.mark.local_only]

POLLS_AFTER_RESTART = 2


def _count_at_least(h: Harness, env: Env, n: int, *, status: int | None = None,
                    after: int = 0) -> bool:
    return h.standin.count(env, status=status, after=after) >= n


def test_a_restart_with_targets_in_sync_reads_no_secret_again(
        h: Harness, kube: KubeApi, make_ns: Callable[[str], str],
        operator: OperatorLauncher) -> None:
    before = operator.start(name="before-restart")
    ns = make_ns("restart")
    shared, shared_values = h.environment("API_KEY", "DB_PASSWORD")
    other, other_values = h.environment("QUEUE_URL")
    empty = h.standin.new_environment()  # no secrets: version 0
    readers: dict[str, tuple[Env, dict[str, str]]] = {
        "shared-1": (shared, shared_values), "shared-2": (shared, shared_values),
        "other": (other, other_values), "empty": (empty, {})}
    for env in (shared, other, empty):
        h.token_secret(ns, h.token_for(env), name=f"token-{env.environment[:8]}")
    for name, (env, _) in readers.items():
        h.hsec(ns, name, env, target=name, refresh="2s",
               auth_name=f"token-{env.environment[:8]}")
    for name, (_, values) in readers.items():
        h.wait_data(ns, name, values)
        h.wait_ready(ns, name)
    envs = (shared, other, empty)
    for env in envs:  # steady state, the empty environment included
        wait_for(functools.partial(_count_at_least, h, env, 1, status=304), timeout=30,
                 what=f"a poll of {env.environment} answered 304")
    before.stop()
    marks = {env: h.standin.mark(env) for env in envs}
    versions = {name: rv(kube.secret(ns, name)) for name in readers}

    operator.start(name="after-restart")

    for env in envs:
        wait_for(functools.partial(_count_at_least, h, env, POLLS_AFTER_RESTART,
                                   after=marks[env]),
                 timeout=60, what=f"{POLLS_AFTER_RESTART} polls of {env.environment} "
                                  "after the restart")
    for env in envs:
        after = h.standin.requests_after(env, marks[env])
        version = h.standin.info(env)["configVersion"]
        assert [r["status"] for r in after] == [304] * len(after), env
        assert {r["if_none_match"] for r in after} == {f'"himi-config-{version}"'}, env
    assert {name: rv(kube.secret(ns, name)) for name in readers} == versions
    for name in readers:
        h.wait_ready(ns, name)
