"""The soak's fleet: Himitsu environments and tokens, namespaces, HimitsuSecrets, targets.

Drawn from the seed: N HimitsuSecrets over N/30 namespaces and N/15 environments in three
projects; each names an environment-scoped token (separate) or its project's token
(shared by every environment of the project); a quarter Merge into a Secret the user
made first (with a foreign key and the ``himitsu.io/allow-merge-by`` consent), the rest
Owner; KeyValue, Dotenv and Json; refreshInterval 5 to 30 s; one in ten (Owner) restarts
a Deployment of its own. Every value carries the leak marker CANARY.
"""

from __future__ import annotations

import base64
import random
import secrets
from dataclasses import dataclass, field
from typing import Any

PROJECTS = 3
FORMATS = ("KeyValue", "KeyValue", "Dotenv", "Json")
CUSTOM_TYPE = "soak.himitsu.io/custom"
ALLOW_MERGE_BY = "himitsu.io/allow-merge-by"
FOREIGN_KEY = "FOREIGN_OWNER_KEY"


def canary(label: str) -> str:
    return f"CANARY-{label.lower()[:12]}-{secrets.token_hex(6)}"


@dataclass
class Environment:
    index: int
    project: str
    environment: str
    data: dict[str, str] = field(default_factory=dict)
    version: int = 0


@dataclass
class Token:
    index: int
    token: str
    project: int  # the project index it covers
    environment: int | None  # None: the whole project (shared)

    @property
    def secret_name(self) -> str:
        return f"tok-{self.index}"


@dataclass
class Member:
    namespace: str
    name: str
    env: int
    token: int
    policy: str
    format: str
    target: str
    refresh: int
    type: str = "Opaque"
    deployment: str | None = None
    labels: dict[str, str] = field(default_factory=dict)

    @property
    def key(self) -> tuple[str, str]:
        return (self.namespace, self.name)


@dataclass
class Fleet:
    namespaces: list[str]
    environments: list[Environment]
    tokens: list[Token]
    members: dict[tuple[str, str], Member]
    issued: set[str] = field(default_factory=set)
    serial: int = 0

    def value(self, label: str) -> str:
        value = canary(label)
        self.issued.add(value)
        return value

    def next_serial(self) -> int:
        self.serial += 1
        return self.serial

    def tokens_for(self, env: Environment) -> list[Token]:
        project = self.project_of(env)
        return [t for t in self.tokens if t.project == project
                and t.environment in (None, env.index)]

    def project_of(self, env: Environment) -> int:
        return env.index % PROJECTS


def plan(rng: random.Random, objects: int, *, project_ids: list[str],
         env_ids: list[str]) -> Fleet:
    """The fleet's shape (ids come from the stand-in; tokens are filled in by the rig)."""
    namespaces = [f"soak-{i:02d}" for i in range(max(2, objects // 30))]
    environments = [Environment(i, project_ids[i % PROJECTS], env_id)
                    for i, env_id in enumerate(env_ids)]
    tokens = [Token(i, "", i % PROJECTS, i) for i in range(len(environments))]
    tokens += [Token(len(environments) + p, "", p, None) for p in range(PROJECTS)]
    fleet = Fleet(namespaces, environments, tokens, {})
    for env in environments:
        env.data = {f"KEY_{k:02d}": fleet.value(f"k{k}") for k in range(rng.randint(3, 8))}
    for _ in range(objects):
        new_member(fleet, rng, rollout=rng.random() < 0.1)
    return fleet


def new_member(fleet: Fleet, rng: random.Random, *, rollout: bool = False) -> Member:
    serial = fleet.next_serial()
    env = rng.choice(fleet.environments)
    token = rng.choice(fleet.tokens_for(env)) if rng.random() < 0.3 else \
        next(t for t in fleet.tokens if t.environment == env.index)
    policy = "Owner" if rollout or rng.random() < 0.75 else "Merge"
    fmt = "KeyValue" if rollout else rng.choice(FORMATS)
    member = Member(
        namespace=rng.choice(fleet.namespaces), name=f"hs-{serial}", env=env.index,
        token=token.index, policy=policy, format=fmt,
        target=f"{'merge' if policy == 'Merge' else 'tgt'}-{serial}",
        refresh=rng.randint(5, 30), deployment=f"dep-{serial}" if rollout else None)
    fleet.members[member.key] = member
    return member


def hsec_body(fleet: Fleet, member: Member, api_url: str) -> dict[str, Any]:
    env = fleet.environments[member.env]
    target: dict[str, Any] = {"name": member.target, "creationPolicy": member.policy,
                              "template": {"format": member.format}}
    if member.labels:
        target["template"]["labels"] = dict(member.labels)
    target["type"] = member.type  # a merge patch keeps what it does not name
    spec: dict[str, Any] = {
        "apiUrl": api_url, "projectId": env.project, "environmentId": env.environment,
        "authSecretRef": {"name": fleet.tokens[member.token].secret_name},
        "refreshInterval": f"{member.refresh}s", "target": target}
    if member.deployment:
        spec["rolloutRestartTargets"] = [{"kind": "Deployment", "name": member.deployment}]
        spec["minRestartInterval"] = "5s"
    return {"apiVersion": "himitsu.io/v1alpha1", "kind": "HimitsuSecret",
            "metadata": {"name": member.name, "namespace": member.namespace}, "spec": spec}


def merge_target_body(fleet: Fleet, member: Member, rng: random.Random) -> dict[str, Any]:
    """The Secret a Merge member merges into: the user's, with a foreign key and consent."""
    value = fleet.value("foreign")
    return {"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
            "metadata": {"name": member.target, "namespace": member.namespace,
                         "annotations": {ALLOW_MERGE_BY: rng.choice((member.name, "*"))}},
            "data": {FOREIGN_KEY: base64.b64encode(value.encode()).decode()}}


def deployment_body(member: Member) -> dict[str, Any]:
    assert member.deployment is not None
    labels = {"app": member.deployment}
    return {"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": member.deployment, "namespace": member.namespace},
            "spec": {"replicas": 0, "selector": {"matchLabels": labels},
                     "template": {"metadata": {"labels": labels}, "spec": {"containers": [{
                         "name": "app", "image": "registry.invalid/soak-app:1",
                         "envFrom": [{"secretRef": {"name": member.target}}]}]}}}}
