"""Test-side building blocks: a Himitsu environment, its token Secret, a HimitsuSecret.

Why one object (the ``h`` fixture): nearly every test says "an environment with these
keys, a token for it in the namespace, a HimitsuSecret syncing it into this target,
then wait until Ready". Keeping that in one place keeps each test about its behaviour,
and guarantees every value and token comes from the canary generator.
"""

from __future__ import annotations

import base64
import time
from dataclasses import dataclass, field
from typing import Any

from .canary import Canary
from .kubehelp import KubeApi, decoded, hsec_path, is_ready, ready, secret_path, wait_for
from .standin_client import Env, StandinClient

READY_TIMEOUT = 30.0


@dataclass
class Sync:
    """One HimitsuSecret set up by ``Harness.sync``."""

    namespace: str
    name: str
    target: str
    env: Env
    token: str
    values: dict[str, str] = field(default_factory=dict)


@dataclass
class Harness:
    kube: KubeApi
    standin: StandinClient
    canary: Canary

    # -- Himitsu side -----------------------------------------------------------------------
    def environment(self, *keys: str) -> tuple[Env, dict[str, str]]:
        """A fresh environment holding a canary value for each of ``keys``."""
        values = self.canary.values(*keys)
        return self.standin.new_environment(values), values

    def token_for(self, env: Env, *, project_only: bool = False) -> str:
        return self.standin.add_token(self.canary.token(), env=env, project_only=project_only)

    # -- Kubernetes side --------------------------------------------------------------------
    def secret(self, namespace: str, name: str, data: dict[str, str], *,
               labels: dict[str, str] | None = None,
               annotations: dict[str, str] | None = None,
               type: str = "Opaque") -> dict[str, Any]:
        body = {
            "apiVersion": "v1", "kind": "Secret", "type": type,
            "metadata": {"name": name, "labels": labels or {},
                         "annotations": annotations or {}},
            "data": {k: base64.b64encode(v.encode()).decode() for k, v in data.items()},
        }
        return self.kube.create(secret_path(namespace), body)

    def token_secret(self, namespace: str, token: str, *, name: str = "himitsu-token",
                     key: str = "token") -> dict[str, Any]:
        return self.secret(namespace, name, {key: token})

    def hsec(self, namespace: str, name: str, env: Env, *, target: str,
             refresh: str | None = "2s", auth_name: str = "himitsu-token",
             auth_key: str | None = None, policy: str | None = None,
             fmt: str | None = None, data_key: str | None = None,
             type: str | None = None, labels: dict[str, str] | None = None,
             annotations: dict[str, str] | None = None,
             api_url: str | None = None) -> dict[str, Any]:
        body = hsec_body(name, env, api_url=api_url or self.standin.api_url, target=target,
                         refresh=refresh, auth_name=auth_name, auth_key=auth_key,
                         policy=policy, fmt=fmt, data_key=data_key, type=type,
                         labels=labels, annotations=annotations)
        return self.kube.create(hsec_path(namespace), body)

    def sync(self, namespace: str, *keys: str, name: str = "app",
             target: str = "app-secrets", wait: bool = True, **options: Any) -> Sync:
        """Environment + token Secret + HimitsuSecret; waits for Ready unless told not to."""
        env, values = self.environment(*(keys or ("API_KEY", "DB_PASSWORD")))
        token = self.token_for(env)
        self.token_secret(namespace, token, name=options.get("auth_name", "himitsu-token"),
                          key=options.get("auth_key") or "token")
        self.hsec(namespace, name, env, target=target, **options)
        sync = Sync(namespace, name, target, env, token, values)
        if wait:
            self.wait_ready(namespace, name)
        return sync

    # -- observing ------------------------------------------------------------------------
    def get_hsec(self, namespace: str, name: str) -> dict[str, Any]:
        found = self.kube.hsec(namespace, name)
        assert found is not None, f"HimitsuSecret {namespace}/{name} does not exist"
        return found

    def wait_ready(self, namespace: str, name: str, *, reason: str = "Synced",
                   timeout: float = READY_TIMEOUT, message_has: str = "") -> dict[str, Any]:
        """Wait until Ready is True/Synced (or False with ``reason``); the HimitsuSecret."""
        def check() -> dict[str, Any] | None:
            obj = self.kube.hsec(namespace, name)
            if not is_ready(obj, reason=reason):
                return None
            message = str((ready(obj) or {}).get("message", ""))
            return obj if message_has in message else None

        return wait_for(check, timeout=timeout,
                        what=f"HimitsuSecret {namespace}/{name} Ready reason {reason}"
                             + (f" with message containing {message_has!r}" if message_has
                                else ""))

    def data(self, namespace: str, name: str) -> dict[str, str]:
        """The target Secret's data, decoded ({} when it does not exist)."""
        return decoded(self.kube.secret(namespace, name))

    def wait_data(self, namespace: str, name: str, expected: dict[str, str], *,
                  timeout: float = READY_TIMEOUT) -> dict[str, Any]:
        """Wait until Secret ``name`` holds exactly ``expected``; the Secret."""
        def check() -> dict[str, Any] | None:
            secret = self.kube.secret(namespace, name)
            return secret if secret is not None and decoded(secret) == expected else None

        return wait_for(check, timeout=timeout,
                        what=f"Secret {namespace}/{name} to hold keys {sorted(expected)}")

    def wait_answers_older_than(self, env: Env, seconds: float, *,
                                timeout: float = READY_TIMEOUT) -> None:
        """Until the stand-in's newest request for ``env`` is ``seconds`` old, so the
        operator holds no answer for it younger than that."""
        last = self.standin.requests(env)[-1]["time"]
        wait_for(lambda: time.time() - last > seconds, timeout=timeout,
                 what=f"the last answer for {env.environment} to be {seconds:g} s old")

    def events(self, namespace: str, name: str) -> list[dict[str, Any]]:
        return self.kube.events(namespace, kind="HimitsuSecret", name=name)


def hsec_body(name: str, env: Env, *, api_url: str, target: str, refresh: str | None,
              auth_name: str = "himitsu-token", auth_key: str | None = None,
              policy: str | None = None, fmt: str | None = None, data_key: str | None = None,
              type: str | None = None, labels: dict[str, str] | None = None,
              annotations: dict[str, str] | None = None) -> dict[str, Any]:
    """A HimitsuSecret manifest; unset options are left to the CRD's defaults."""
    auth: dict[str, Any] = {"name": auth_name}
    if auth_key is not None:
        auth["key"] = auth_key
    template: dict[str, Any] = {}
    for field_name, value in (("format", fmt), ("key", data_key), ("labels", labels),
                              ("annotations", annotations)):
        if value is not None:
            template[field_name] = value
    target_spec: dict[str, Any] = {"name": target}
    if policy is not None:
        target_spec["creationPolicy"] = policy
    if type is not None:
        target_spec["type"] = type
    if template:
        target_spec["template"] = template
    spec: dict[str, Any] = {"apiUrl": api_url, "projectId": env.project,
                            "environmentId": env.environment, "authSecretRef": auth,
                            "target": target_spec}
    if refresh is not None:
        spec["refreshInterval"] = refresh
    return {"apiVersion": "himitsu.io/v1alpha1", "kind": "HimitsuSecret",
            "metadata": {"name": name}, "spec": spec}
