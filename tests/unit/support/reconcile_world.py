"""The world the reconciler tests run in: one namespace, the fakes, a reconciler.

Shared by test_reconciler.py (the sync contract) and test_reconciler_failures.py
(failures, timing, Events, the canary), so both speak of the same objects: a token
Secret ``himitsu-token``, a HimitsuSecret ``apps/app-config`` and its target
``app-secrets``. The token and the secret values have recognisable shapes so the canary
test can look for any piece of them in every output.
"""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta
from typing import Any

from fakes import FakeFetcher, FakeKube, b64, unb64

from himitsu_controller import api, himitsu
from himitsu_controller.runtime.controller import Result
from himitsu_controller.sync.reconciler import HimitsuSecretReconciler

NS, NAME, TARGET, KEY = "apps", "app-config", "app-secrets", "apps/app-config"
API = "https://himitsu.example.com"
PROJECT = "11111111-1111-1111-1111-111111111111"
ENV = "22222222-2222-2222-2222-222222222222"
OTHER_ENV = "33333333-3333-3333-3333-333333333333"
# Recognisable shapes: the canary test greps every output for these.
TOKEN_SECRET_PART = "CanaryTok3n-7f3aQ9zK2mX8vB4nL6pR1sT5wY0uE2h"
TOKEN = "himi_c0ffee00c0ffee00_" + TOKEN_SECRET_PART
CANARY = "CANARY-SECRET-VALUE"
T0 = datetime(2024, 5, 6, 7, 8, 9, tzinfo=UTC)
T0_EPOCH = T0.timestamp()

assert himitsu.TOKEN_PATTERN.fullmatch(TOKEN)


def values(n: int = 2, *, tag: str = "") -> dict[str, str]:
    return {f"KEY_{i}": f"{CANARY}-{tag}{i}" for i in range(n)}


def fetched(version: int, secrets: dict[str, str] | None = None) -> himitsu.Fetched:
    return himitsu.Fetched(version=version, secrets=values() if secrets is None else secrets)


class SimClock:
    """Integer microseconds since T0, read as a datetime (the reconciler) or as epoch
    seconds (queue, poller, clients): both always name the same moment."""

    def __init__(self) -> None:
        self.us = 0

    def now(self) -> datetime:
        return T0 + timedelta(microseconds=self.us)

    def epoch(self) -> float:
        return self.now().timestamp()

    @property
    def t(self) -> float:
        """Simulated seconds since T0."""
        return self.us / 1e6

    def advance(self, seconds: float) -> None:
        self.us += max(0, math.ceil(seconds * 1e6))

    def reach(self, epoch: float) -> None:
        """Move on to ``epoch`` (never back), so that ``epoch() >= epoch`` holds."""
        target = math.ceil((epoch - T0_EPOCH) * 1e6)
        self.us = max(self.us, target)
        while self.epoch() < epoch:
            self.us += 1


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> datetime:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += timedelta(seconds=seconds)


def make_hsec(**over: Any) -> dict[str, Any]:
    target: dict[str, Any] = {"name": TARGET, "creationPolicy": over.pop("policy", "Owner")}
    if "target_type" in over:
        target["type"] = over.pop("target_type")
    target["template"] = over.pop("template", {})
    spec: dict[str, Any] = {
        "apiUrl": API, "projectId": PROJECT, "environmentId": ENV,
        "authSecretRef": {"name": "himitsu-token"}, "refreshInterval": "1m", "target": target,
    }
    spec.update(over)
    return {"apiVersion": api.API_VERSION, "kind": api.KIND,
            "metadata": {"namespace": NS, "name": NAME, "generation": 1}, "spec": spec}


class World:
    """One namespace: a token Secret, a HimitsuSecret, the fakes and a reconciler."""

    def __init__(self, *, allowed: tuple[str, ...] = (), insecure_http: bool = False,
                 rng: float = 0.0, **spec: Any) -> None:
        self.kube = FakeKube()
        self.fetcher = FakeFetcher()
        self.clock = Clock()
        self.rng = rng
        self.allowed = allowed
        self.insecure_http = insecure_http
        self.kube.put_secret({"metadata": {"namespace": NS, "name": "himitsu-token"},
                              "data": {"token": b64(TOKEN)}})
        self.kube.add_himitsu_secret(make_hsec(**spec))
        self.reconciler = self.restart()

    def restart(self) -> HimitsuSecretReconciler:
        self.reconciler = HimitsuSecretReconciler(
            self.kube, self.fetcher, allowed_api_urls=self.allowed,
            allow_insecure_http=self.insecure_http, now=self.clock, rng=lambda: self.rng)
        return self.reconciler

    def reconcile(self, *script: himitsu.FetchResult | Exception) -> Result:
        self.fetcher.then(*script)
        result = self.reconciler.reconcile(KEY)
        assert not self.fetcher.script, "the scripted fetch was not made"
        return result

    def poll(self, *script: himitsu.FetchResult | Exception) -> Result:
        """The next timed poll: a minute on (the default refreshInterval), then reconcile."""
        self.clock.advance(60)
        return self.reconcile(*script)

    def sync(self, version: int = 5, secrets: dict[str, str] | None = None) -> Result:
        result = self.reconcile(fetched(version, secrets))
        assert result.error is None, self.ready()
        return result

    @property
    def hsec(self) -> dict[str, Any]:
        return self.kube.himitsu_secrets[(NS, NAME)]

    def edit_spec(self, *, bump: bool = True, **changes: Any) -> None:
        self.hsec["spec"].update(changes)
        if bump:
            self.hsec["metadata"]["generation"] += 1

    def edit_target_spec(self, *, bump: bool = True, **changes: Any) -> None:
        self.hsec["spec"]["target"].update(changes)
        if bump:
            self.hsec["metadata"]["generation"] += 1

    def annotate(self, key: str, value: str) -> None:
        self.hsec["metadata"].setdefault("annotations", {})[key] = value

    def target(self) -> dict[str, Any]:
        return self.kube.secret(NS, TARGET)

    def data(self) -> dict[str, str]:
        return unb64(self.target().get("data") or {})

    def status(self) -> dict[str, Any]:
        return self.kube.status(NS, NAME)

    def ready(self) -> dict[str, Any]:
        conds = self.status().get("conditions") or [{}]
        assert isinstance(conds[0], dict)
        return conds[0]


def merge_world(*, consent: str | None = NAME, **over: Any) -> World:
    """A Merge HimitsuSecret and a Helm-owned target that consents to it (``consent``:
    its ``himitsu.io/allow-merge-by``; None: the annotation is absent)."""
    world = World(policy="Merge", **over)
    annotations = {"meta.helm.sh/release-name": "r"}
    if consent is not None:
        annotations[api.ANN_ALLOW_MERGE_BY] = consent
    world.kube.put_secret({
        "metadata": {"namespace": NS, "name": TARGET,
                     "labels": {api.LABEL_MANAGED_BY: "Helm"}, "annotations": annotations},
        "type": "Opaque", "data": {"HELM_KEY": b64("helm-value")},
    })
    return world


def add_other(world: World) -> None:
    other = make_hsec()
    other["metadata"]["name"] = "other"
    world.kube.add_himitsu_secret(other)


def set_token(world: World, data: dict[str, str] | None) -> None:
    if data is None:
        del world.kube.secrets[(NS, "himitsu-token")]
    else:
        world.kube.edit_secret(NS, "himitsu-token", data=data)
