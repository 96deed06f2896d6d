"""Model-based test of sync correctness (issue 11, item 9).

A hypothesis ``RuleBasedStateMachine`` plays a user, a cluster and a Himitsu at the
operator: it creates, edits and deletes HimitsuSecrets (source, target type, creation
policy, format, refreshInterval including 0, force-sync), changes and deletes values in
Himitsu, deletes and edits targets (data, annotations, labels, ownerReference), puts a
foreign Secret where a target goes, injects failures (Himitsu 5xx, another client
spending the key's budget so Himitsu answers 429, slow answers, refused or lost
Kubernetes writes, the operator SIGKILLed right after one, or right after the Secret
write of a change a workload is owed a restart for), restarts the operator (all memory
lost: a crash, a rollout, a new leader, also while a restart is owed), rotates a token,
edits a target's data id or drops a workload's record by hand, and lets time pass,
stalls the process, or waits for a quiet period. The operator is the real one
(model_world.py), the worlds are in memory (model_kube.py, model_himitsu.py) and the
invariants are the oracle's (model_checks.py): none of them is what the code does,
each is what the contract promises.

Settings: derandomized and database-less, so every run (CI included) draws the same
examples and a failure replays; ``MAX_EXAMPLES`` x ``STEPS`` is what two cores run in
about a minute. Hunts: HIMITSU_MODEL_EXAMPLES and HIMITSU_MODEL_SEED (see MAX_EXAMPLES).
A failure prints the shrunk steps (hypothesis) and the violations.

What it draws depends on this file and the operator's code only, not on the other test
files a run imports (conftest.py pins Hypothesis's local constants; before, the whole suite
drew other examples than this file alone, one of which found a restart syncing a
refreshInterval 0 object again).
"""

from __future__ import annotations

import base64
import copy
import itertools
import logging
import os
from collections.abc import Iterator
from typing import Any

import hypothesis.core
import hypothesis.strategies as st
import pytest
import structlog
from hypothesis import HealthCheck, Phase, settings
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    consumes,
    initialize,
    invariant,
    multiple,
    rule,
    run_state_machine_as_test,
)
from model_checks import CHECKS, Oracle
from model_himitsu import WINDOW
from model_kube import DEPLOY, FAULTS, HSEC, SECRET
from model_merge import MERGE_CHECKS, MergeRules
from model_quiet import SPAN
from model_rollout import spec_fields, workload
from model_world import API_URL, ENVS, NS, PROJECT, TOKENS, World

from himitsu_controller import api
from himitsu_controller.runtime.client.errors import ApiError

# A longer hunt: HIMITSU_MODEL_EXAMPLES=1000 (the same draws, more of them). Other draws:
# HIMITSU_MODEL_SEED=31 (derandomize off, that seed forced; a failure replays with it), e.g.
# HIMITSU_MODEL_SEED=31 HIMITSU_MODEL_EXAMPLES=600 pytest tests/unit/behaviour/test_model_based.py
MAX_EXAMPLES = int(os.environ.get("HIMITSU_MODEL_EXAMPLES", "250"))
SEED = os.environ.get("HIMITSU_MODEL_SEED")
STEPS = 40
MARGIN = 10.0  # seconds of processing a quiet period allows beyond the longest interval
SETTINGS = settings(
    max_examples=MAX_EXAMPLES, stateful_step_count=STEPS, deadline=None, derandomize=True,
    database=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

SLOT = st.integers(0, 3)
INTERVAL = st.sampled_from(["10s", "30s", "1m", "1m", "0"])
TYPE = st.sampled_from(["Opaque", "Opaque", "kubernetes.io/tls", "kubernetes.io/basic-auth",
                        "example.com/custom"])
POLICY = st.sampled_from(["Owner", "Owner", "Merge"])
FORMAT = st.sampled_from(["KeyValue", "KeyValue", "Dotenv", "Json"])
# Mostly one source, so polls are shared; sometimes another environment or token.
ENV = st.sampled_from(["e1", "e1", "e1", "e2"])
TOKEN = st.sampled_from(["tok-a", "tok-a", "tok-a", "tok-b"])
KEY = st.sampled_from(["A", "B", "tls.crt", "tls.key", "username"])
SPEC_EDIT = st.one_of(
    st.tuples(st.just(("refreshInterval",)), INTERVAL),
    st.tuples(st.just(("target", "type")), TYPE),
    st.tuples(st.just(("target", "creationPolicy")), POLICY),
    st.tuples(st.just(("target", "template", "format")), FORMAT),
    st.tuples(st.just(("environmentId",)), ENV.map(ENVS.__getitem__)),
    st.tuples(st.just(("authSecretRef", "name")), TOKEN),
    st.tuples(st.just(("target", "template", "labels")),
              st.sampled_from([{"team": "a"}, {"team": "b"}, {}])),
)
# Edits a user (or a GitOps tool) makes to a target. The first ones make it disagree with
# what the operator wrote, so the next sync must be a full one ("fresh").
DATA_EDITS = ("delete", "value", "remove_key", "add_key", "version_annotation")
QUIET_WAKE = st.sampled_from(["annotate_target", "merge_foreign_key", "spec_interval",
                              "spec_template", "token_secret"])
TARGET_EDIT = st.sampled_from([*DATA_EDITS, "prune_label", "drop_owner_ref",
                               "drop_template_label", "annotate", "edit_data_id"])


def b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


class SyncModel(MergeRules, RuleBasedStateMachine):
    """The user, the cluster and Himitsu; ``checks`` are the invariants enforced (the
    rules and checks of Merge targets, consent, template metadata and renames are
    model_merge.py's)."""

    checks: frozenset[str] = CHECKS | MERGE_CHECKS
    slots = Bundle("slots")  # HimitsuSecrets the user created (most rules act on one)

    def __init__(self) -> None:
        super().__init__()
        self._world: World | None = None
        self._force = itertools.count(1)

    @property
    def world(self) -> World:
        assert self._world is not None
        return self._world

    @property
    def oracle(self) -> Oracle:
        return self.world.oracle

    @initialize(target=slots, seed=st.integers(0, 2**16),
                kube_latency=st.sampled_from([0.0, 0.01, 0.2]),
                himitsu_latency=st.sampled_from([0.0, 0.05, 1.0]),
                informer_lag=st.sampled_from([0.0, 0.01, 0.5]),
                first=st.lists(st.tuples(SLOT, ENV, TOKEN, INTERVAL, POLICY, TYPE, FORMAT),
                               min_size=1, max_size=4, unique_by=lambda h: h[0]))
    def start(self, seed: int, kube_latency: float, himitsu_latency: float,
              informer_lag: float, first: list[tuple[int, str, str, str, str, str, str]],
              ) -> Any:
        """A cluster where a few HimitsuSecrets already run (the rules then perturb it)."""
        self._world = World(seed=seed, kube_latency=kube_latency,
                            himitsu_latency=himitsu_latency, informer_lag=informer_lag)
        for hsec in first:
            self._create(*hsec)
        self.world.run_until(self.world.clock.t + 1.0)
        return multiple(*(hsec[0] for hsec in first))

    # -- HimitsuSecrets ---------------------------------------------------------------

    @rule(target=slots, slot=SLOT, env=ENV, token=TOKEN, interval=INTERVAL, policy=POLICY,
          kind=TYPE, fmt=FORMAT)
    def create(self, *, slot: int, env: str, token: str, interval: str, policy: str,
               kind: str, fmt: str) -> Any:
        if self.world.server.get(HSEC, NS, f"h{slot}") is not None:
            return multiple()
        self._create(slot, env, token, interval, policy, kind, fmt)
        return slot

    def _create(self, *spec: Any) -> None:
        slot, env, token, interval, policy, kind, fmt = spec
        if slot % 2 == 0 and self.world.server.get(DEPLOY, NS, f"w{slot}") is None:
            self.world.server.create(DEPLOY, NS, workload(slot))
        self.oracle.rollout.named(f"h{slot}")
        obj = self.world.server.create(HSEC, NS, {
            "apiVersion": api.API_VERSION, "kind": api.KIND, "metadata": {"name": f"h{slot}"},
            "spec": {"apiUrl": API_URL, "projectId": PROJECT, "environmentId": ENVS[env],
                     "authSecretRef": {"name": token}, "refreshInterval": interval,
                     **spec_fields(slot),
                     "target": {"name": f"t{slot}", "type": kind, "creationPolicy": policy,
                                "template": {"format": fmt, "labels": {"team": "a"},
                                             "annotations": {"example.com/note": "x"}}}}})
        self._triggered(slot, "HimitsuSecret created", HSEC, obj)

    @rule(slot=slots, edit=SPEC_EDIT)
    def edit_spec(self, slot: int, edit: tuple[tuple[str, ...], Any]) -> None:
        obj = self.world.server.get(HSEC, NS, f"h{slot}")
        if obj is None:
            return
        path, value = edit
        spec = copy.deepcopy(obj["spec"])
        node = spec
        for part in path[:-1]:
            node = node.setdefault(part, {})
        node[path[-1]] = value
        if spec == obj["spec"]:
            return
        obj["spec"] = spec
        updated = self.world.server.update(HSEC, NS, f"h{slot}", obj)
        if path in (("environmentId",), ("authSecretRef", "name")):  # a new source: a first sync
            self._triggered(slot, f"spec edited: {'.'.join(path)}={value}", HSEC, updated)
        else:  # the data already held is as current as a timed poll's would be
            self.oracle.touched()
            self.world.run_until(self.world.clock.t)

    @rule(slot=slots)
    def force_sync(self, slot: int) -> None:
        obj = self.world.server.get(HSEC, NS, f"h{slot}")
        if obj is None:
            return
        obj["metadata"].setdefault("annotations", {})[api.ANN_FORCE_SYNC] = str(next(self._force))
        updated = self.world.server.update(HSEC, NS, f"h{slot}", obj)
        self._triggered(slot, "force-sync", HSEC, updated)

    @rule(slot=consumes(slots))
    def delete(self, slot: int) -> None:
        if self.world.server.get(HSEC, NS, f"h{slot}") is None:
            return
        self.world.server.delete(HSEC, NS, f"h{slot}")
        self.oracle.touched()
        self.oracle.triggers.pop(f"{NS}/h{slot}", None)
        self.oracle.floor.pop(f"{NS}/h{slot}", None)
        self.world.run_until(self.world.clock.t)

    # -- Himitsu ----------------------------------------------------------------------

    @rule(env=ENV, key=KEY, value=st.sampled_from(["v1", "v2", "v3"]))
    def set_value(self, env: str, key: str, value: str) -> None:
        self.world.himitsu.set(ENVS[env], key, value)

    @rule(slot=slots, key=KEY, value=st.sampled_from(["v4", "v5"]))
    def set_value_read_by(self, slot: int, key: str, value: str) -> None:
        """A change in the environment an existing HimitsuSecret reads."""
        obj = self.world.server.get(HSEC, NS, f"h{slot}")
        if obj is not None:
            self.world.himitsu.set(api.parse_spec(obj).environment_id, key, value)

    @rule(env=ENV, key=KEY)
    def delete_value(self, env: str, key: str) -> None:
        self.world.himitsu.delete(ENVS[env], key)

    # -- targets ----------------------------------------------------------------------

    @rule(slot=slots, how=TARGET_EDIT)
    def edit_target(self, slot: int, how: str) -> None:
        server = self.world.server
        secret = server.get(SECRET, NS, f"t{slot}")
        if secret is None:
            return
        meta = secret["metadata"]
        data, labels = secret.setdefault("data", {}), meta.setdefault("labels", {})
        annotations = meta.setdefault("annotations", {})
        managed = [k for k in sorted(data) if k != "foreign-key"]
        if how == "delete":
            server.delete(SECRET, NS, f"t{slot}")
        elif how in ("value", "remove_key") and managed:
            if how == "value":
                data[managed[0]] = b64("edited by hand")
            else:
                del data[managed[0]]
        elif how == "add_key":
            data["extra"] = b64("added by hand")
        elif how == "version_annotation":
            annotations[api.ANN_CONFIG_VERSION] = "999"
        elif how == "prune_label":
            labels.pop(api.LABEL_MANAGED, None)
        elif how == "drop_owner_ref":
            meta.pop("ownerReferences", None)
        elif how == "drop_template_label":
            labels.pop("team", None)
        elif how == "edit_data_id":  # no byte changes: nothing may restart (issue 22)
            annotations[api.ANN_DATA_ID] = "0123456789abcdef"
        else:
            annotations["example.com/by-hand"] = "yes"
        if how != "delete":
            try:
                server.update(SECRET, NS, f"t{slot}", secret)
            except ApiError as exc:  # the apiserver refuses it (a tls Secret needs its
                if exc.status != 422:  # keys): the user's edit never happened
                    raise
                how = "refused"
        hsec = server.get(HSEC, NS, f"h{slot}")
        # An edit that leaves what we wrote intact (a foreign key added to a Merge target,
        # metadata) needs no full sync; the others do.
        consistent = how == "add_key" and hsec is not None and \
            api.parse_spec(hsec).target.creation_policy == "Merge"
        if how in DATA_EDITS and not consistent and _ours_by_annotation(secret, slot):
            self._triggered(slot, f"target {how}", SECRET, {"metadata": {
                "resourceVersion": str(server.rv)}})
        else:
            self.oracle.touched()
            self.world.run_until(self.world.clock.t)

    @rule(slot=SLOT, kind=st.sampled_from(["Opaque", "example.com/custom"]))
    def create_foreign(self, slot: int, kind: str) -> None:
        if self.world.server.get(SECRET, NS, f"t{slot}") is not None:
            return
        self.world.server.create(SECRET, NS, {
            "metadata": {"name": f"t{slot}", "labels": {"app.kubernetes.io/managed-by": "Helm"}},
            "type": kind, "data": {"foreign-key": b64("helm's")}})
        self.oracle.touched()
        self.world.run_until(self.world.clock.t)

    @rule(slot=slots, how=QUIET_WAKE, n=st.integers(0, 3))
    def wake_not_due(self, slot: int, how: str, n: int) -> None:
        """Wakes that need no news (``idle``): a foreign annotation on the target, a
        foreign key in a Merge target, a spec edit keeping the source, a token Secret
        edited without changing its token (no wake at all: it is not watched)."""
        server, key = self.world.server, f"{NS}/h{slot}"
        obj, secret = server.get(HSEC, NS, f"h{slot}"), server.get(SECRET, NS, f"t{slot}")
        if obj is None or secret is None:
            return
        spec = api.parse_spec(obj)
        woken = [key]
        quiet = self.oracle.idle.quiet_now(key, self.oracle.sync_problem(obj))
        if how == "annotate_target":
            secret["metadata"].setdefault("annotations", {})[f"example.com/note-{n}"] = "x"
            server.update(SECRET, NS, f"t{slot}", secret)
        elif how == "merge_foreign_key" and spec.target.creation_policy == "Merge":
            secret.setdefault("data", {})[f"foreign-{n}"] = b64("someone else's")
            server.update(SECRET, NS, f"t{slot}", secret)
        elif how == "spec_interval":
            last = api.parse_time((obj.get("status") or {}).get("lastSyncTime"))
            new = "1h" if spec.refresh_interval <= 0 else "0"
            quiet = quiet and (new == "0" or (last is not None and last.timestamp() + 3240
                                              > self.world.clock.epoch() + SPAN + 1))
            obj["spec"]["refreshInterval"] = new
            server.update(HSEC, NS, f"h{slot}", obj)
        elif how == "spec_template":
            # Stamps to put back around the data held (its data id with it).
            obj["spec"]["target"].setdefault("template", {})["annotations"] = {
                "example.com/note": f"v{n}"}
            server.update(HSEC, NS, f"h{slot}", obj)
        elif how == "token_secret":
            token = server.get(SECRET, NS, spec.auth_secret_name)
            if token is None:
                return
            token["metadata"].setdefault("annotations", {})["example.com/rotated-by"] = f"{n}"
            server.update(SECRET, NS, spec.auth_secret_name, token)
            woken = [f"{NS}/{o['metadata']['name']}" for o in server.objects_of(HSEC)
                     if api.parse_spec(o).auth_secret_name == spec.auth_secret_name]
        else:
            return
        for other in woken:
            other_obj = server.get(HSEC, NS, other.partition("/")[2])
            if (other == key and quiet) or (other != key and other_obj is not None and
                    self.oracle.idle.quiet_now(other, self.oracle.sync_problem(other_obj))):
                self.oracle.idle.watch(other)
        self.oracle.touched()
        self.world.run_until(self.world.clock.t + SPAN)
        self.oracle.idle.close()

    # -- failures ---------------------------------------------------------------------

    @rule(count=st.integers(1, 6))
    def himitsu_fails(self, count: int) -> None:
        self.world.himitsu.fail_next = count

    @rule(token=TOKEN, count=st.sampled_from([60, 110, 125]))
    def another_client_spends_the_budget(self, token: str, count: int) -> None:
        self.world.himitsu.spend_budget(TOKENS[token], count)

    @rule(seconds=st.sampled_from([0.5, 3.0, 8.0]), count=st.integers(1, 4))
    def himitsu_slow(self, seconds: float, count: int) -> None:
        self.world.himitsu.slow_next = [seconds] * count

    @rule(mode=st.sampled_from(FAULTS), count=st.integers(1, 4))
    def kube_fails(self, mode: str, count: int) -> None:
        self.world.rest.faults = [mode] * count

    @rule(slot=slots, key=KEY, value=st.sampled_from(["v6", "v7"]))
    def crash_between_the_secret_write_and_the_restart(self, slot: int, key: str,
                                                       value: str) -> None:
        """A change is synced and the operator is SIGKILLed right after writing a Secret:
        the next process must make the restart owed, once (the oracle's ``restart``)."""
        obj = self.world.server.get(HSEC, NS, f"h{slot}")
        if obj is None:
            return
        self.world.himitsu.set(api.parse_spec(obj).environment_id, key, value)
        self.world.rest.crash_after = SECRET
        self.force_sync(slot)

    @rule(slot=slots, key=KEY, value=st.sampled_from(["v8", "v9"]), after=st.sampled_from(
        [0.2, 1.0, 2.5]))
    def leader_change_while_a_restart_is_owed(self, slot: int, key: str, value: str,
                                              after: float) -> None:
        """A change is synced, and the Lease moves inside the window: the new leader (all
        memory lost) restarts once, at once, and the old one never again."""
        obj = self.world.server.get(HSEC, NS, f"h{slot}")
        if obj is None:
            return
        self.world.himitsu.set(api.parse_spec(obj).environment_id, key, value)
        self.force_sync(slot)
        self.world.run_until(self.world.clock.t + after)
        self.restart()

    @rule(token=TOKEN)
    def rotate_token(self, token: str) -> None:
        """The token's owner replaces it with another of the same access: no byte of any
        target changes, so nothing may restart (the oracle's ``restart``)."""
        secret = self.world.server.get(SECRET, NS, token)
        assert secret is not None
        old = base64.b64decode(secret["data"]["token"]).decode()
        new = old[:-1] + ("Z" if old[-1] != "Z" else "Y")
        self.world.himitsu.tokens[new] = self.world.himitsu.tokens[old]
        secret["data"]["token"] = b64(new)
        self.world.server.update(SECRET, NS, token, secret)
        self.oracle.token_replaced(token, old)
        self.oracle.touched()
        self.world.run_until(self.world.clock.t)

    @rule(slot=slots)
    def record_dropped_by_another_tool(self, slot: int) -> None:
        """A GitOps sync drops ``himitsu.io/started-with`` from the workload: at most one
        needless restart, never a lost one."""
        deploy = self.world.server.get(DEPLOY, NS, f"w{slot}")
        annotations = ((deploy or {}).get("metadata") or {}).get("annotations") or {}
        if deploy is None or api.ANN_STARTED_WITH not in annotations:
            return
        del annotations[api.ANN_STARTED_WITH]
        self.world.server.update(DEPLOY, NS, f"w{slot}", deploy)
        self.oracle.rollout.record_dropped(f"w{slot}")
        self.oracle.touched()
        self.world.run_until(self.world.clock.t)

    # -- the process and time -----------------------------------------------------------

    @rule()
    def restart(self) -> None:
        self.world.restart()
        self.world.run_until(self.world.clock.t)

    @rule(seconds=st.sampled_from([0.2, 1.0, 3.0, 7.0, 12.0, 20.0, 40.0, 90.0]))
    def advance(self, seconds: float) -> None:
        self.world.run_until(self.world.clock.t + seconds)

    @rule(seconds=st.sampled_from([2.0, 6.0, 20.0]))
    def stall(self, seconds: float) -> None:
        """The process gets no CPU for a while (throttled, paused): timers fire late."""
        self.world.clock.advance(seconds)
        self.world.run_until(self.world.clock.t)

    @rule()
    def settle(self) -> None:
        """Failures heal, nothing changes for the longest interval (or the latest retry,
        or the end of a rate-limit window) plus a margin: every target must then hold
        Himitsu's current data, or its HimitsuSecret say why it cannot."""
        world = self.world
        world.himitsu.fail_next, world.himitsu.slow_next, world.rest.faults = 0, [], []
        world.rest.crash_after = None
        assert world.process is not None
        now = world.clock.epoch()
        waits = [api.parse_spec(o).refresh_interval for o in world.server.objects_of(HSEC)]
        waits += [t - now for t in world.process.timers()]  # the latest retry
        waits.append(world.himitsu.horizon - world.clock.t)
        end = world.clock.t + min(max(waits), 400.0) + MARGIN
        limit = end + 2 * WINDOW  # a rate-limit window met on the way ends the wait later
        ran_to = -1.0
        while ran_to < end:
            world.run_until(end)
            ran_to, end = end, min(max(end, world.himitsu.horizon + 1.0 + MARGIN), limit)
        if "settled" in self.checks:
            problems = [p for o in world.server.objects_of(HSEC)
                        if (p := world.oracle.sync_problem(o)) is not None]
            assert not problems, "settled: after a quiet period\n" + "\n".join(problems)
        if "restart" in self.checks:
            problems = world.oracle.rollout.settled_problems()
            assert not problems, "\n".join(problems)
        problems = world.oracle.merge.settled_problems(self.checks)
        assert not problems, "\n".join(problems)

    # -- helpers ----------------------------------------------------------------------

    def _triggered(self, slot: int, what: str, resource: str, obj: dict[str, Any]) -> None:
        rv = int(obj["metadata"]["resourceVersion"])
        self.oracle.trigger(f"{NS}/h{slot}", what, resource, rv)
        self.world.run_until(self.world.clock.t)

    @invariant()
    def nothing_broken(self) -> None:
        if self._world is None:
            return
        broken = [m for check, m in self.oracle.violations
                  if check in self.checks or check in ("raised", "livelock")]
        assert not broken, "\n".join(broken[:5])
        if "wake" in self.checks:
            problems = self.oracle.wake_problems()
            assert not problems, "\n".join(problems)
        if "restart" in self.checks:
            problems = self.oracle.rollout.due_problems()
            assert not problems, "\n".join(problems)


def _ours_by_annotation(secret: dict[str, Any], slot: int) -> bool:
    annotations = (secret.get("metadata") or {}).get("annotations") or {}
    return annotations.get(api.ANN_OWNED_BY) == f"h{slot}"


@pytest.fixture(autouse=True)
def quiet_logs() -> Iterator[None]:
    """Info lines of thousands of reconciles cost more than the reconciles."""
    saved = structlog.get_config()
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.ERROR))
    yield
    structlog.configure(**saved)


def run_model(checks: frozenset[str], *, shrink: bool = True) -> None:
    machine = type("Model", (SyncModel,), {"checks": checks})
    phases = [Phase.explicit, Phase.generate] + ([Phase.shrink] if shrink else [])
    if SEED is None:
        run_state_machine_as_test(machine, settings=settings(SETTINGS, phases=phases))
        return
    # --hypothesis-seed's own switch (derandomize would ignore it), restored after the run.
    saved = hypothesis.core.global_force_seed
    hypothesis.core.global_force_seed = int(SEED)  # type: ignore[assignment]  # typed None
    try:
        run_state_machine_as_test(machine, settings=settings(
            SETTINGS, phases=phases, derandomize=False))
    finally:
        hypothesis.core.global_force_seed = saved


# Invariants whose fix has not reached main yet. Each is checked on its own in a strict
# xfail test below, so the day its fix lands that test fails (XPASS): then delete its
# line here, and the main test enforces it with the others. Never weaken one instead.
PENDING: dict[str, str] = {}  # check -> why it is not enforced yet (a strict xfail)


# ~30 s of CPU; on a 2-core machine shared with other jobs it took 355 s, past the suite's
# 300 s hang guard (pyproject.toml), with nothing wrong.
MODEL_TIMEOUT = pytest.mark.timeout(1200)


@MODEL_TIMEOUT
def test_model_based_sync_invariants() -> None:
    run_model((CHECKS | MERGE_CHECKS) - PENDING.keys())


@MODEL_TIMEOUT
@pytest.mark.parametrize("check", [
    pytest.param(check, marks=pytest.mark.xfail(strict=True, reason=reason))
    for check, reason in sorted(PENDING.items())])
def test_model_based_pending_invariant(check: str) -> None:
    """The main run's checks and ``check``: the draws are the main run's up to the first
    failure (a check alone draws other examples, which may miss what the main run met)."""
    run_model((CHECKS | MERGE_CHECKS) - PENDING.keys() | {check}, shrink=False)


# Found by the restarts review (model, 700 examples, random seed): a HimitsuSecret
# deleted and created again under its name, its workload's record dropped by another
# tool, then a value change: the workload is never restarted for it (fixed).
def test_a_change_after_a_recreated_himitsusecret_s_record_was_dropped_restarts_its_workload(
) -> None:
    model = SyncModel()
    (slot,) = model.start(seed=0, kube_latency=0.0, himitsu_latency=0.0, informer_lag=0.0,
                          first=[(0, "e1", "tok-a", "10s", "Owner", "Opaque", "KeyValue")])
    model.delete(slot=slot)
    model.set_value(env="e1", key="tls.crt", value="v1")
    again = model.create(env="e1", fmt="KeyValue", interval="10s", kind="kubernetes.io/tls",
                         policy="Owner", slot=0, token="tok-a")
    model.record_dropped_by_another_tool(slot=again)
    model.set_value_read_by(key="tls.key", slot=again, value="v4")
    model.nothing_broken()
    model.settle()


# Found by review-r2 (model, 700 examples, random seed): a key deleted in Himitsu, a token
# rotation, then the target deleted; the repair's fetch, still with the cached old token
# (docs/syncing.md: read within the token cache's 5 min), is answered 5xx, and the repair
# writes from memory, as documented. The oracle counted only the new token's answers as
# refusals (fixed in the oracle: a replaced token's answers count while it may be cached).
def test_a_repair_refused_with_the_cached_old_token_may_write_from_memory() -> None:
    model = SyncModel()
    (slot,) = model.start(seed=0, kube_latency=0.0, himitsu_latency=0.0, informer_lag=0.0,
                          first=[(0, "e1", "tok-a", "10s", "Owner", "Opaque", "KeyValue")])
    model.delete_value(env="e1", key="A")
    model.advance(seconds=7.0)
    model.himitsu_fails(count=1)
    model.rotate_token(token="tok-a")
    model.edit_target(how="delete", slot=slot)
    model.nothing_broken()
    assert [r.status for r in model.world.himitsu.requests] == [200, 500]  # it asked first
    model.advance(seconds=3.0)  # past the failure hold: the repair's data is asked again
    model.nothing_broken()
    target = model.world.server.get(SECRET, NS, f"t{slot}")
    assert target is not None
    assert target["metadata"]["annotations"][api.ANN_CONFIG_VERSION] == "3"


# Found by the restarts review (model, 1500 examples, random seed; here with other data):
# h0 retargeted to t2, h2 created for t2 (refused: h0 owns it), h0 deleted: h2's first
# sync writes other bytes to t2 and w2, whose pods read h0's data of t2, is never
# restarted (fixed).
def test_a_target_handed_over_to_another_himitsusecret_restarts_the_workloads_reading_it(
) -> None:
    model = SyncModel()
    (slot,) = model.start(seed=0, kube_latency=0.0, himitsu_latency=0.0, informer_lag=0.0,
                          first=[(0, "e1", "tok-a", "10s", "Owner", "Opaque", "KeyValue")])
    model.retarget(policy="Owner", slot=slot, to=2)
    model.create(env="e2", fmt="KeyValue", interval="10s", kind="Opaque", policy="Owner",
                 slot=2, token="tok-a")  # other data than h0 wrote to t2 (e1 in the find)
    model.delete(slot=slot)
    model.nothing_broken()
    model.settle()


# Found by the restarts review (model, 1500 examples, random seed): after the crash
# between a Secret write and the restart, a not-due wake of another HimitsuSecret (a
# template edit) asks Himitsu unconditionally (fixed).
def test_a_not_due_wake_after_a_crash_between_the_write_and_the_restart_asks_nothing(
) -> None:
    model = SyncModel()
    first, second = model.start(
        seed=0, kube_latency=0.0, himitsu_latency=0.0, informer_lag=0.0,
        first=[(0, "e1", "tok-a", "10s", "Owner", "Opaque", "KeyValue"),
               (1, "e1", "tok-a", "10s", "Owner", "kubernetes.io/tls", "KeyValue")])
    model.crash_between_the_secret_write_and_the_restart(key="A", slot=second, value="v6")
    model.wake_not_due(how="spec_template", n=0, slot=first)
    model.nothing_broken()


# Found by the restarts review (model, 1500 examples, random seed): h1 retargeted to t0,
# t0's label pruned, h1 retargeted to t2: t1 keeps h1's stamps (fixed).
def test_a_target_left_by_a_twice_retargeted_himitsusecret_keeps_none_of_its_stamps(
) -> None:
    model = SyncModel()
    _, second = model.start(
        seed=0, kube_latency=0.0, himitsu_latency=0.0, informer_lag=0.0,
        first=[(0, "e1", "tok-a", "10s", "Owner", "Opaque", "KeyValue"),
               (1, "e1", "tok-a", "10s", "Owner", "Opaque", "KeyValue")])
    model.retarget(policy="Owner", slot=second, to=0)
    model.edit_target(how="prune_label", slot=second)
    model.retarget(policy="Owner", slot=second, to=2)
    model.nothing_broken()
    model.settle()


# Found by review-r2 (model, 1200 random examples x 60 steps): h0 deleted (its Owner
# target with it), another team's Secret created under the target's name, h0 created
# again as Merge: after an operator restart w0 is restarted once. The documented trade (a
# target deleted and created anew may cost one extra restart; the oracle now excuses a
# Secret someone else creates anew as it does one the operator creates), and only one.
def test_a_recreated_merge_himitsusecret_over_a_foreign_target_costs_at_most_one_restart(
) -> None:
    model = SyncModel()
    (slot,) = model.start(seed=0, kube_latency=0.0, himitsu_latency=0.0, informer_lag=0.0,
                          first=[(0, "e1", "tok-a", "10s", "Owner", "Opaque", "KeyValue")])
    model.delete(slot=slot)
    model.create_foreign_with_metadata(consent="*", slot=0)
    again = model.create(env="e1", fmt="KeyValue", interval="10s", kind="Opaque",
                         policy="Merge", slot=0, token="tok-a")
    model.restart()
    model.nothing_broken()
    for _ in range(3):
        model.restart()
        model.advance(seconds=12.0)
        model.nothing_broken()
    model.settle()
    assert model.oracle.rollout.restarts.get(f"h{again}", 0) <= 1
