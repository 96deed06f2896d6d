"""The one interface the tests use to drive the Himitsu stand-in: its HTTP control API.

Why HTTP even when the stand-in runs in the test process: on kind it runs as a Pod that
tests reach through a port-forward, and the operator reaches through a Service URL. By
always going through ``/_standin/`` (hack/himitsu_standin/control.py documents it) the
same test code runs in both places, and the local run exercises the kind path's client.

``api_url`` is the address the *operator* uses (a HimitsuSecret's spec.apiUrl);
``control_url`` is where the tests reach the control API. Locally they are the same.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import requests


@dataclass(frozen=True)
class Env:
    """A Himitsu project/environment pair."""

    project: str
    environment: str

    @property
    def path(self) -> str:
        return f"/projects/{self.project}/environments/{self.environment}"


class StandinError(Exception):
    pass


class StandinClient:
    def __init__(self, *, api_url: str, control_url: str) -> None:
        self.api_url = api_url.rstrip("/")
        self.control_url = control_url.rstrip("/")
        self._session = requests.Session()

    def close(self) -> None:
        self._session.close()

    def _call(self, method: str, path: str, body: Any = None, *,
              params: dict[str, Any] | None = None, timeout: float = 30.0) -> Any:
        response = self._session.request(
            method, f"{self.control_url}/_standin{path}", json=body, params=params,
            timeout=timeout)
        if response.status_code != 200:
            raise StandinError(f"{method} /_standin{path}: {response.status_code} "
                               f"{response.text[:300]}")
        return response.json()

    def healthy(self) -> bool:
        try:
            return bool(self._call("GET", "/health", timeout=2.0).get("ok"))
        except (requests.RequestException, StandinError):
            return False

    # -- environments and secrets ---------------------------------------------------------
    def new_environment(self, secrets: dict[str, str] | None = None, *,
                        project: str | None = None) -> Env:
        """A fresh environment (random ids; in ``project`` if given), seeded with secrets."""
        info = self._call("POST", "/environments", {"project": project} if project else {})
        env = Env(info["project"], info["environment"])
        if secrets:
            self.set_secrets(env, secrets)
        return env

    def set_secrets(self, env: Env, values: dict[str, str]) -> int:
        """Create or update secrets; returns the environment's new config version."""
        return int(self._call("PUT", f"{env.path}/secrets", values)["configVersion"])

    def delete_secret(self, env: Env, key: str) -> int:
        return int(self._call("DELETE", f"{env.path}/secrets/{quote(key, safe='')}")
                   ["configVersion"])

    def info(self, env: Env) -> dict[str, Any]:
        """{"configVersion", "deleted", "keys"} (key names only)."""
        found: dict[str, Any] = self._call("GET", env.path)
        return found

    # -- tokens ---------------------------------------------------------------------------
    def add_token(self, token: str, *, env: Env | None = None,
                  project_only: bool = False) -> str:
        """Register ``token``: scoped to ``env`` (or its project with project_only)."""
        body: dict[str, Any] = {"token": token}
        if env is not None:
            body["project"] = env.project
            if not project_only:
                body["environment"] = env.environment
        self._call("POST", "/tokens", body)
        return token

    def revoke_token(self, token: str) -> None:
        self._call("POST", "/tokens/revoke", {"token": token})

    def set_demoted(self, token: str, demoted: bool = True) -> None:
        self._call("POST", "/tokens/demote", {"token": token, "demoted": demoted})

    # -- faults ---------------------------------------------------------------------------
    def fault(self, kind: str, *, env: Env | None = None, **options: Any) -> str:
        body = {"kind": kind, **options}
        if env is not None:
            body["environment"] = env.environment
        return str(self._call("POST", "/faults", body)["id"])

    def clear_faults(self, fault_id: str | None = None) -> None:
        self._call("DELETE", f"/faults/{fault_id}" if fault_id else "/faults")

    # -- what the operator did ------------------------------------------------------------
    def requests(self, env: Env) -> list[dict[str, Any]]:
        """The API requests for ``env``, oldest first (see RequestRecord in the stand-in)."""
        found: list[dict[str, Any]] = self._call(
            "GET", "/requests", params={"environment": env.environment})
        return found

    def requests_naming(self, env: Env) -> list[dict[str, Any]]:
        """Every API request whose path names ``env``, wherever under the stand-in it went
        (``requests`` sees only those routed to the environment): proof of none at all."""
        found: list[dict[str, Any]] = self._call("GET", "/requests")
        return [r for r in found if env.environment in str(r["path"]).lower()]

    def mark(self, env: Env) -> int:
        """A position in ``env``'s request log; pass it as ``after`` to see what came next.

        Positions rather than timestamps: the stand-in may run on another clock (a Pod).
        """
        return len(self.requests(env))

    def requests_after(self, env: Env, after: int = 0) -> list[dict[str, Any]]:
        return self.requests(env)[after:]

    def count(self, env: Env, *, status: int | None = None, after: int = 0) -> int:
        """Requests for ``env`` (answered ``status``, if given) after position ``after``."""
        return sum(1 for r in self.requests_after(env, after)
                   if status is None or r["status"] == status)

    def full_fetches(self, env: Env, *, after: int = 0) -> list[dict[str, Any]]:
        """Unconditional requests (no If-None-Match) answered 200, after ``after``."""
        return [r for r in self.requests_after(env, after)
                if r["status"] == 200 and not r["if_none_match"]]
