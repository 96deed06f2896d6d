"""The user: keeps changing Himitsu and the cluster while the faults run.

Values changed, added and removed in Himitsu; HimitsuSecrets created, edited (source,
template, type, policy) and deleted; targets deleted and hand-edited; foreign writes;
force-syncs. Choices come from a seeded generator. Every act is recorded (``Acted``) with
the resourceVersion its write produced, and each Himitsu change with the environment's
whole data after it: the checker's picture of what the user did and what Himitsu holds.
Workloads' HimitsuSecrets and targets are left alone (their restarts are judged on
Himitsu changes only: a hand edit of a watched target is the user's own restart cause).
"""

from __future__ import annotations

import base64
import random
import threading
import time
from collections.abc import Callable
from typing import Any
from urllib.parse import quote

from e2e.kubehelp import KubeApi, hsec_path, secret_path

from . import fleet as fl
from .records import Acted

WEIGHTS = {"himitsu-set": 25, "himitsu-add": 6, "himitsu-remove": 6, "hsec-create": 5,
           "hsec-delete": 4, "hsec-edit-source": 4, "hsec-edit-template": 5,
           "hsec-edit-type": 3, "hsec-edit-policy": 2, "target-delete": 4,
           "target-hand-edit": 4, "foreign-write": 5, "force-sync": 4}


def b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


class Driver:
    def __init__(self, fleet: fl.Fleet, kube: KubeApi, *, standin_call: Callable[..., Any],
                 api_url: str, rng: random.Random, sink: Callable[[Acted], None]) -> None:
        self.fleet, self.kube, self.standin_call = fleet, kube, standin_call
        self.api_url, self.rng, self.sink = api_url, rng, sink
        self.done: dict[str, int] = {}
        self.busy = threading.Lock()  # held during an act: a quiet phase waits for it
        self.failed: dict[str, int] = {}

    # -- Himitsu ---------------------------------------------------------------------------
    def set_values(self, env: fl.Environment, values: dict[str, str], kind: str) -> None:
        path = f"/projects/{env.project}/environments/{env.environment}/secrets"
        before = time.time()
        info = self.standin_call("PUT", path, values)
        env.data.update(values)
        env.version = int(info["configVersion"])
        self.sink(Acted(before, kind, environment=env.environment, data=dict(env.data),
                        version=env.version))

    def remove_value(self, env: fl.Environment, key: str) -> None:
        path = f"/projects/{env.project}/environments/{env.environment}/secrets/" \
               f"{quote(key, safe='')}"
        before = time.time()
        info = self.standin_call("DELETE", path)
        env.data.pop(key, None)
        env.version = int(info["configVersion"])
        self.sink(Acted(before, "himitsu-remove", environment=env.environment,
                        data=dict(env.data), version=env.version))

    def publish_initial(self) -> None:
        for env in self.fleet.environments:
            self.set_values(env, dict(env.data), "himitsu-initial")

    # -- acting ----------------------------------------------------------------------------
    def act(self) -> None:
        kinds = sorted(WEIGHTS)
        kind = self.rng.choices(kinds, weights=[WEIGHTS[k] for k in kinds])[0]
        try:
            getattr(self, "_" + kind.replace("-", "_"))(kind)
            self.done[kind] = self.done.get(kind, 0) + 1
        except (IndexError, TypeError, AttributeError, AssertionError):
            raise  # the driver's own bug
        except Exception:  # a fault refused the act: the user goes on
            self.failed[kind] = self.failed.get(kind, 0) + 1

    def run(self, *, acting: threading.Event, stop: threading.Event, interval: float) -> None:
        """Act every ``interval`` seconds (jittered) while ``acting`` is set."""
        while not stop.is_set():
            if not acting.wait(0.2):
                continue
            with self.busy:
                if acting.is_set():
                    self.act()
            stop.wait(interval * self.rng.uniform(0.5, 1.5))

    def _pick(self, *, rollout: bool = False, policy: str | None = None,
              fmt: str | None = None) -> fl.Member:
        members = [m for m in self.fleet.members.values()
                   if (rollout or m.deployment is None)
                   and (policy is None or m.policy == policy) and (fmt is None or m.format == fmt)]
        if not members:
            raise KeyError("no member fits")
        return self.rng.choice(sorted(members, key=lambda m: m.key))

    def _record(self, kind: str, namespace: str, name: str, obj: Any = None, *,
                when: float | None = None, env: str = "") -> None:
        rv = str(((obj or {}).get("metadata") or {}).get("resourceVersion", "")) \
            if isinstance(obj, dict) else ""
        self.sink(Acted(when or time.time(), kind, namespace, name, rv, env))

    def _himitsu_set(self, kind: str) -> None:
        env = self.rng.choice(self.fleet.environments)
        keys = self.rng.sample(sorted(env.data), min(len(env.data), self.rng.randint(1, 2)))
        self.set_values(env, {k: self.fleet.value(k) for k in keys}, kind)

    def _himitsu_add(self, kind: str) -> None:
        env = self.rng.choice(self.fleet.environments)
        key = f"KEY_{self.rng.randint(0, 40):02d}"
        self.set_values(env, {key: self.fleet.value(key)}, kind)

    def _himitsu_remove(self, kind: str) -> None:
        env = self.rng.choice([e for e in self.fleet.environments if len(e.data) > 2])
        self.remove_value(env, self.rng.choice(sorted(env.data)))

    def _apply_member(self, kind: str, member: fl.Member, *, create: bool = False) -> None:
        body = fl.hsec_body(self.fleet, member, self.api_url)
        env = self.fleet.environments[member.env].environment
        when = time.time()
        if create:
            obj = self.kube.create(hsec_path(member.namespace), body)
        else:
            obj = self.kube.merge_patch(hsec_path(member.namespace, member.name),
                                        {"spec": body["spec"]})
        self._record(kind, member.namespace, member.name, obj, when=when, env=env)

    def create_member(self, member: fl.Member, kind: str = "hsec-create") -> None:
        if member.policy == "Merge":
            self.create_merge_target(member)
        if member.deployment:
            self.kube.create(f"/apis/apps/v1/namespaces/{member.namespace}/deployments",
                             fl.deployment_body(member))
        self._apply_member(kind, member, create=True)

    def create_merge_target(self, member: fl.Member) -> None:
        when = time.time()
        obj = self.kube.create(secret_path(member.namespace),
                               fl.merge_target_body(self.fleet, member, self.rng))
        self._record("merge-target-create", member.namespace, member.target, obj, when=when)

    def _hsec_create(self, kind: str) -> None:
        self.create_member(fl.new_member(self.fleet, self.rng), kind)

    def _hsec_delete(self, kind: str) -> None:
        member = self._pick()
        when = time.time()
        self.kube.delete(hsec_path(member.namespace, member.name))
        del self.fleet.members[member.key]
        env = self.fleet.environments[member.env].environment
        self._record(kind, member.namespace, member.name, None, when=when, env=env)
        self._record(kind, member.namespace, member.target, None, when=when, env=env)

    def _hsec_edit_source(self, kind: str) -> None:
        member = self._pick()
        old_env = self.fleet.environments[member.env].environment
        env = self.rng.choice(self.fleet.environments)
        member.env = env.index
        member.token = self.rng.choice(self.fleet.tokens_for(env)).index
        self._record(kind, member.namespace, member.target, None, env=old_env)
        self._apply_member(kind, member)

    def _hsec_edit_template(self, kind: str) -> None:
        member = self._pick()
        if self.rng.random() < 0.5:
            member.format = self.rng.choice([f for f in ("KeyValue", "Dotenv", "Json")
                                             if f != member.format])
        else:
            member.labels = {"soak.example.com/edit": str(self.fleet.next_serial())}
        self._record(kind, member.namespace, member.target)
        self._apply_member(kind, member)

    def _hsec_edit_type(self, kind: str) -> None:
        member = self._pick(policy="Owner")
        member.type = fl.CUSTOM_TYPE if member.type == "Opaque" else "Opaque"
        self._record(kind, member.namespace, member.target)
        self._apply_member(kind, member)

    def _hsec_edit_policy(self, kind: str) -> None:
        member = self._pick()
        self._record(kind, member.namespace, member.target)
        serial = self.fleet.next_serial()
        if member.policy == "Owner":
            member.policy, member.target = "Merge", f"merge-{member.name}-{serial}"
            member.type = "Opaque"  # the type of the user's Secret it merges into
            self.create_merge_target(member)
        else:
            member.policy, member.target = "Owner", f"tgt-{member.name}-{serial}"
        self._apply_member(kind, member)

    def _target_delete(self, kind: str) -> None:
        member = self._pick()
        when = time.time()
        self.kube.delete(secret_path(member.namespace, member.target))
        self._record(kind, member.namespace, member.target, None, when=when)

    def _target_hand_edit(self, kind: str) -> None:
        member = self._pick()
        secret = self.kube.get(secret_path(member.namespace, member.target))
        ours = sorted(k for k in (secret.get("data") or {}) if not k.startswith("FOREIGN_"))
        if not ours:
            raise KeyError("target holds nothing yet")
        key = self.rng.choice(ours)
        when = time.time()
        obj = self.kube.merge_patch(secret_path(member.namespace, member.target),
                                    {"data": {key: b64(self.fleet.value("hand"))}})
        self._record(kind, member.namespace, member.target, obj, when=when)

    def _foreign_write(self, kind: str) -> None:
        member = self._pick(policy="Merge")
        key = self.rng.choice((fl.FOREIGN_KEY, "FOREIGN_EXTRA"))
        when = time.time()
        obj = self.kube.merge_patch(secret_path(member.namespace, member.target),
                                    {"data": {key: b64(self.fleet.value("foreign"))}})
        self._record(kind, member.namespace, member.target, obj, when=when)

    def _force_sync(self, kind: str) -> None:
        member = self._pick(rollout=True)
        when = time.time()
        obj = self.kube.merge_patch(hsec_path(member.namespace, member.name), {
            "metadata": {"annotations": {"himitsu.io/force-sync": str(self.fleet.next_serial())}}})
        env = self.fleet.environments[member.env].environment
        self._record(kind, member.namespace, member.name, obj, when=when, env=env)
