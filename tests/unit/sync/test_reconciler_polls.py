"""The reconciler in front of the real shared poller: what reaches Himitsu, and when.

The promises (issue 11, items 3 and 4; issue 12, item 3), checked by counting the
requests an in-memory Himitsu sees, never by timing:

* after a restart (a fresh poller and reconciler, every target in sync) the first poll
  of every source is conditional: no full fetch, no secret material on the wire;
* a first sync and a repair hold Himitsu's current data, not another reader's answer
  from up to half an interval ago; readers repaired together still share one request;
* the poller forgets a source once no HimitsuSecret reads it;
* no failure ever leaves a target missing that memory could restore (review E).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest
from fakes import FakeKube, b64, unb64
from reconcile_world import API, ENV, NS, OTHER_ENV, PROJECT, TOKEN, Clock, make_hsec, values

from himitsu_controller import api, himitsu
from himitsu_controller.runtime.controller import Result
from himitsu_controller.sync.polling import schedule
from himitsu_controller.sync.polling.polls import LocallyRateLimited, SharedPoller
from himitsu_controller.sync.reconciler import HimitsuSecretReconciler

EMPTY_ENV = "44444444-4444-4444-4444-444444444444"


@dataclass
class FakeHimitsu:
    """Environments with a version and secrets; 304 when the request names the current
    version. Every request is recorded as (environment, version sent, status)."""

    envs: dict[str, tuple[int, dict[str, str]]] = field(default_factory=dict)
    requests: list[tuple[str, int | None, int]] = field(default_factory=list)
    error: Exception | None = None  # raised (and recorded as status 0) while set

    def change(self, env: str, secrets: dict[str, str]) -> int:
        version = self.envs[env][0] + len(secrets) if env in self.envs else len(secrets)
        self.envs[env] = (version, {**self.envs.get(env, (0, {}))[1], **secrets})
        return version

    def fetch(
        self, *, api_url: str, project_id: str, environment_id: str, token: str,
        known_version: int | None,
    ) -> himitsu.FetchResult:
        if self.error is not None:
            self.requests.append((environment_id, known_version, 0))
            raise self.error
        version, secrets = self.envs[environment_id]
        status = 304 if known_version == version else 200
        self.requests.append((environment_id, known_version, status))
        if status == 304:
            return himitsu.NotModified(version=version)
        return himitsu.Fetched(version=version, secrets=dict(secrets))

    def full_fetches(self, since: int = 0) -> list[tuple[str, int | None, int]]:
        return [r for r in self.requests[since:] if r[2] == 200]


class Operator:
    """One namespace of HimitsuSecrets (each named after its target), and an operator
    process (reconciler + shared poller) that ``restart`` replaces, memory and all."""

    def __init__(self) -> None:
        self.kube = FakeKube()
        self.clock = Clock()
        self.himitsu = FakeHimitsu()
        self.himitsu.change(ENV, values(tag="a"))
        self.himitsu.change(OTHER_ENV, values(3, tag="b"))
        self.himitsu.envs[EMPTY_ENV] = (0, {})  # a new, empty environment: version 0
        self.kube.put_secret({"metadata": {"namespace": NS, "name": "himitsu-token"},
                              "data": {"token": b64(TOKEN)}})
        self.restart()

    def restart(self) -> None:
        self.poller = SharedPoller(self.himitsu, clock=self.epoch)
        self.reconciler = HimitsuSecretReconciler(
            self.kube, self.poller, now=self.clock, rng=lambda: 0.0)

    def epoch(self) -> float:
        return self.clock.now.timestamp()

    def add(self, name: str, env: str = ENV, **spec: Any) -> None:
        obj = make_hsec(environmentId=env, **spec)
        obj["metadata"]["name"] = name
        obj["spec"]["target"]["name"] = name
        self.kube.add_himitsu_secret(obj)

    def reconcile(self, *names: str) -> list[Result]:
        results = [self.reconciler.reconcile(f"{NS}/{name}") for name in names]
        for name, result in zip(names, results, strict=True):
            assert result.error is None, (name, self.kube.status(NS, name))
        return results

    def data(self, name: str) -> dict[str, str]:
        return unb64(self.kube.secret(NS, name).get("data") or {})

    def delete_target(self, name: str) -> None:
        del self.kube.secrets[(NS, name)]

    def delete_hsec(self, name: str) -> None:
        del self.kube.himitsu_secrets[(NS, name)]
        assert self.reconciler.reconcile(f"{NS}/{name}") == Result()


@pytest.fixture
def op() -> Operator:
    return Operator()


READERS = {"a1": ENV, "a2": ENV, "b1": OTHER_ENV, "b2": OTHER_ENV, "e1": EMPTY_ENV}


def test_after_a_restart_targets_in_sync_are_confirmed_by_304s(op: Operator) -> None:
    for name, env in READERS.items():
        op.add(name, env)
    op.reconcile(*READERS)
    assert len(op.himitsu.full_fetches()) == 3  # the first syncs: one per source
    writes, mark = op.kube.writes(), len(op.himitsu.requests)

    op.restart()  # a rollout, a crash or a failover: nothing in memory
    op.clock.advance(61)  # every poll is due
    op.reconcile(*READERS)

    after = op.himitsu.requests[mark:]
    assert op.himitsu.full_fetches(mark) == []
    assert sorted(env for env, _, _ in after) == sorted({*READERS.values()})
    assert {(env, known) for env, known, _ in after} == {
        (ENV, 2), (OTHER_ENV, 3), (EMPTY_ENV, 0)}  # the versions the targets hold
    assert op.kube.writes() == writes
    for name in READERS:
        assert op.kube.status(NS, name)["conditions"][0]["reason"] == "Synced"


def test_after_a_restart_a_repair_needs_the_full_data_once(op: Operator) -> None:
    # With nothing in memory the target is the only copy: a deleted one needs a 200.
    op.add("a1")
    op.reconcile("a1")
    op.restart()
    op.delete_target("a1")
    mark = len(op.himitsu.requests)
    op.reconcile("a1")
    assert op.himitsu.requests[mark:] == [(ENV, None, 200)]
    assert op.data("a1") == values(tag="a")


def test_a_himitsu_secret_created_right_after_a_change_gets_the_new_value(
    op: Operator,
) -> None:
    op.add("a1", refreshInterval="1h")
    op.reconcile("a1")
    op.clock.advance(10)  # a1's answer is 10 s old: well inside half an hour
    changed = {**values(tag="a"), "KEY_0": "rotated"}
    op.himitsu.change(ENV, {"KEY_0": "rotated"})
    op.add("a2", refreshInterval="1h")
    op.reconcile("a2")
    assert op.data("a2") == changed
    # a conditional request at the version the poller held, answered with the change
    assert op.himitsu.requests[-1] == (ENV, 2, 200)


def test_deleting_a_target_after_a_change_gives_back_the_new_data(op: Operator) -> None:
    op.add("a1", refreshInterval="1h")
    op.reconcile("a1")
    op.clock.advance(10)
    op.himitsu.change(ENV, {"KEY_1": "rotated"})
    op.delete_target("a1")
    op.reconcile("a1")
    assert op.data("a1") == {**values(tag="a"), "KEY_1": "rotated"}


def test_an_edited_target_is_repaired_with_the_current_data(op: Operator) -> None:
    op.add("a1", refreshInterval="1h")
    op.reconcile("a1")
    op.clock.advance(10)
    op.himitsu.change(ENV, {"KEY_1": "rotated"})
    op.kube.edit_secret(NS, "a1", data={"KEY_0": b64("hand-edit")})
    op.reconcile("a1")
    assert op.data("a1") == {**values(tag="a"), "KEY_1": "rotated"}


def test_a_repair_with_nothing_changed_is_a_304_rebuilt_from_memory(op: Operator) -> None:
    op.add("a1", refreshInterval="1h")
    op.reconcile("a1")
    op.clock.advance(10)
    op.delete_target("a1")
    mark = len(op.himitsu.requests)
    op.reconcile("a1")
    assert op.himitsu.requests[mark:] == [(ENV, 2, 304)]  # no secret material on the wire
    assert op.data("a1") == values(tag="a")


def test_readers_repaired_or_created_together_share_one_request(op: Operator) -> None:
    names = [f"r{i}" for i in range(20)]
    for name in names:
        op.add(name)
    op.reconcile(*names)
    assert len(op.himitsu.requests) == 1  # a cold sync: created together, one request
    op.clock.advance(30)
    for name in names:
        op.delete_target(name)
    op.reconcile(*names)  # all within schedule.FRESH of each other
    assert len(op.himitsu.requests) == 2
    assert all(op.data(name) == values(tag="a") for name in names)


def test_a_mass_spec_edit_keeping_the_source_asks_himitsu_nothing(op: Operator) -> None:
    # A Helm upgrade touching every HimitsuSecret: the targets are intact, the data is
    # where it was; rewriting them must not cost a request per object (nor per source).
    names = [f"r{i}" for i in range(20)]
    for name in names:
        op.add(name)
    op.reconcile(*names)
    op.clock.advance(30)
    for name in names:
        hsec = op.kube.himitsu_secrets[(NS, name)]
        hsec["spec"]["target"]["template"] = {"labels": {"release": "2"}}
        hsec["metadata"]["generation"] += 1
    mark = len(op.himitsu.requests)
    op.reconcile(*names)
    assert op.himitsu.requests[mark:] == []
    assert all(op.kube.secret(NS, n)["metadata"]["labels"]["release"] == "2" for n in names)


def test_a_first_sync_takes_an_answer_only_seconds_old(op: Operator) -> None:
    op.add("a1")
    op.reconcile("a1")
    op.clock.advance(schedule.FRESH / 2)
    op.add("a2")
    op.reconcile("a2")
    assert len(op.himitsu.requests) == 1  # shared: seconds old
    op.clock.advance(schedule.FRESH)
    op.add("a3")
    op.reconcile("a3")
    assert op.himitsu.requests[1:] == [(ENV, 2, 304)]  # older: revalidated


def test_the_poller_forgets_a_source_when_its_last_himitsu_secret_goes(op: Operator) -> None:
    op.add("a1")
    op.add("a2")
    op.reconcile("a1", "a2")
    op.delete_hsec("a1")
    op.delete_target("a2")
    op.reconcile("a2")  # a2 still reads ENV: its repair is served from memory
    assert op.himitsu.full_fetches() == [(ENV, None, 200)]
    op.delete_hsec("a2")
    op.add("a3")
    op.reconcile("a3")  # nothing remembered: the secrets were dropped with a2
    assert op.himitsu.full_fetches() == [(ENV, None, 200)] * 2


# -- review E: refusals, token moves, shared answers, memory following the spec -------

TOKEN2 = "himi_0123456789abcdef_" + "Z" * 43
REFUSALS = [
    pytest.param(himitsu.ServerError("Himitsu API answered 503", status=503), id="503"),
    pytest.param(himitsu.RateLimited("429", retry_after=30), id="429"),
    pytest.param(himitsu.TransportError("connection refused"), id="transport"),
    pytest.param(LocallyRateLimited("paced", retry_after=5), id="paced"),
]


def ready(op: Operator, name: str) -> str:
    return str(op.kube.status(NS, name)["conditions"][0]["status"])


def bump_spec(op: Operator, name: str, **spec: Any) -> None:
    obj = op.kube.himitsu_secrets[(NS, name)]
    obj["spec"].update(spec)
    obj["metadata"]["generation"] += 1


def put_token(op: Operator, name: str, token: str) -> None:
    op.kube.put_secret({"metadata": {"namespace": NS, "name": name},
                        "data": {"token": b64(token)}})


@pytest.mark.parametrize("error", REFUSALS)
def test_a_target_deleted_while_himitsu_refuses_is_rebuilt_from_memory_at_once(
    op: Operator, error: Exception,
) -> None:
    # Before: the repair had to revalidate, so the target stayed missing for as long as
    # Himitsu refused (the old code, and the contract, restore it from memory).
    op.add("a1", refreshInterval="1h")
    op.reconcile("a1")
    op.clock.advance(30)
    op.himitsu.error = error
    op.delete_target("a1")
    (result,) = op.reconcile("a1")
    assert op.data("a1") == values(tag="a") and ready(op, "a1") == "True"
    # ... and Himitsu is asked again soon, not an hour later: the change made meanwhile
    # arrives with the first answer.
    assert result.requeue_after is not None and result.requeue_after <= 30
    op.himitsu.error = None
    op.himitsu.change(ENV, {"KEY_0": "rotated"})
    op.clock.advance(result.requeue_after)
    op.reconcile("a1")
    assert op.data("a1")["KEY_0"] == "rotated"


def test_a_mass_repair_while_himitsu_fails_asks_once_per_source(op: Operator) -> None:
    names = [f"r{i}" for i in range(20)]
    for name in names:
        op.add(name, refreshInterval="1h")
    op.reconcile(*names)
    op.clock.advance(30)
    op.himitsu.error = himitsu.ServerError("Himitsu API answered 503", status=503)
    for name in names:
        op.delete_target(name)
    mark = len(op.himitsu.requests)
    results = op.reconcile(*names)
    assert len(op.himitsu.requests) - mark == 1
    assert all(op.data(name) == values(tag="a") for name in names)
    # the revalidation is shared too: one request for every reader once Himitsu answers
    op.himitsu.error = None
    op.clock.advance(max(r.requeue_after or 0.0 for r in results))
    op.reconcile(*names)
    assert op.himitsu.requests[mark + 1:] == [(ENV, 2, 304)]


def test_a_refusal_never_writes_memory_of_another_token(op: Operator) -> None:
    put_token(op, "tok2", TOKEN2)
    op.add("a2", authSecretRef={"name": "tok2"})
    op.reconcile("a2")  # TOKEN2's secrets are in memory
    op.himitsu.error = himitsu.ServerError("Himitsu API answered 503", status=503)
    op.add("a1")  # TOKEN, same environment: a first sync
    result = op.reconciler.reconcile(f"{NS}/a1")
    assert result.error == "FetchFailure" and (NS, "a1") not in op.kube.secrets


def test_moving_to_another_token_never_writes_data_older_than_the_target_holds(
    op: Operator,
) -> None:
    # The target's source stamp leaves the token out, the poller's source does not: the
    # move counted as intact and took the other key's 30 s old answer (version 2 over 3).
    put_token(op, "tok2", TOKEN2)
    op.add("a2", refreshInterval="1h", authSecretRef={"name": "tok2"})
    op.reconcile("a2")  # TOKEN2's answer: version 2
    op.clock.advance(10)
    op.himitsu.change(ENV, {"KEY_0": "rotated"})
    op.clock.advance(10)
    op.add("a1", refreshInterval="1h")
    op.reconcile("a1")  # version 3
    op.clock.advance(10)
    bump_spec(op, "a1", authSecretRef={"name": "tok2"})
    op.reconcile("a1")
    assert op.data("a1")["KEY_0"] == "rotated"
    assert op.kube.status(NS, "a1")["configVersion"] == op.himitsu.envs[ENV][0]


def test_a_token_rotated_in_place_never_regresses_data_on_a_metadata_repair(
    op: Operator,
) -> None:
    put_token(op, "tok2", TOKEN2)
    op.add("a2", refreshInterval="1h", authSecretRef={"name": "tok2"})
    op.reconcile("a2")
    op.clock.advance(10)
    op.himitsu.change(ENV, {"KEY_0": "rotated"})
    op.clock.advance(10)
    op.add("a1", refreshInterval="1h")
    op.reconcile("a1")
    op.clock.advance(10)
    put_token(op, "himitsu-token", TOKEN2)  # a1's key rotated to the shared one
    op.reconciler._tokens.forget(NS, "himitsu-token", "token")
    secret = op.kube.secret(NS, "a1")
    labels = dict(secret["metadata"]["labels"])
    labels.pop(api.LABEL_MANAGED_BY, None)  # a GitOps tool prunes a label
    op.kube.edit_secret(NS, "a1", metadata={**secret["metadata"], "labels": labels})
    op.reconcile("a1")
    assert op.data("a1")["KEY_0"] == "rotated"


def test_readers_with_their_data_intact_ride_out_another_readers_429(op: Operator) -> None:
    # One repair's request gets a 429 (another client shares the key). The other readers'
    # label-only spec edits need no request: they must not turn Ready=False.
    names = [f"r{i}" for i in range(10)]
    for name in names:
        op.add(name, refreshInterval="1h")
    op.reconcile(*names)
    op.clock.advance(30)
    op.himitsu.error = himitsu.RateLimited("429", retry_after=30)
    op.kube.edit_secret(NS, "r0", data={"KEY_0": b64("hand-edit")})
    own = op.reconciler.reconcile(f"{NS}/r0")
    assert op.data("r0") == values(tag="a")  # repaired from memory
    assert own.requeue_after is not None and own.requeue_after >= 30
    for name in names[1:]:
        bump_spec(op, name, target={"name": name, "template": {"labels": {"release": "2"}}})
    op.reconcile(*names[1:])  # asserts no error
    assert all(ready(op, name) == "True" for name in names)
    assert len([r for r in op.himitsu.requests if r[2] == 0]) == 1


def test_a_reader_whose_own_request_got_a_429_says_so(op: Operator) -> None:
    op.add("a1", refreshInterval="1m")
    op.reconcile("a1")
    op.clock.advance(60)
    op.himitsu.error = himitsu.RateLimited("429", retry_after=30)
    result = op.reconciler.reconcile(f"{NS}/a1")
    assert result.error == "FetchFailure" and result.requeue_after == 30
    assert "rate limited" in op.kube.status(NS, "a1")["conditions"][0]["message"]
    op.add("a2", refreshInterval="1m")  # reads the same source, has nothing written
    other = op.reconciler.reconcile(f"{NS}/a2")
    assert other.error is None and other.requeue_after is not None  # waits its turn
    assert op.data("a2") == values(tag="a")  # and its first sync came from memory


@pytest.mark.parametrize("creating", [False, True], ids=["deleted", "created"])
def test_a_target_written_right_after_a_change_gets_the_new_value_within_seconds(
    op: Operator, creating: bool,
) -> None:
    # The promise of docs/syncing.md. A first sync or repair within FRESH of another reader's
    # answer shares it (one request per source for a mass repair), then revalidates once.
    op.add("a1", refreshInterval="1h")
    op.reconcile("a1")
    op.clock.advance(1.0)
    op.himitsu.change(ENV, {"KEY_0": "rotated"})
    op.clock.advance(0.5)
    name = "a2" if creating else "a1"
    if creating:
        op.add("a2", refreshInterval="1h")
    else:
        op.delete_target("a1")
    (result,) = op.reconcile(name)
    assert result.requeue_after is not None and result.requeue_after <= schedule.FRESH
    op.clock.advance(result.requeue_after)
    (result,) = op.reconcile(name)
    assert op.data(name)["KEY_0"] == "rotated"
    assert result.requeue_after is not None and result.requeue_after > 3000  # done


def test_a_himitsu_secret_leaving_a_source_releases_it_even_if_its_sync_fails(
    op: Operator,
) -> None:
    op.add("a1")
    op.reconcile("a1")
    bump_spec(op, "a1", environmentId=OTHER_ENV, authSecretRef={"name": "missing"})
    assert op.reconciler.reconcile(f"{NS}/a1").error == "AuthenticationFailure"
    assert op.poller.remembered(api_url=API, project_id=PROJECT, environment_id=ENV,
                                token=TOKEN) is None
