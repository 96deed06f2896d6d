"""The fake Himitsu backend: environments, tokens, faults, rate limits and the request log.

Why apart from HTTP: every decision the runtime endpoint makes is a function of this state
and an ``Inbound`` request, so it lives here under one lock and the HTTP layer only
carries out the ``Answer`` (including the slow or broken ways of sending it).

Order of checks for API requests, the real server's: injected faults -> per-IP limit ->
500 for a POST or DELETE with a JSON Content-Type and no body (its body parser; on a GET
the header is harmless) -> the framework's own 404 body, not the envelope, for other
routes -> token (401) -> per-key limit (429) -> UUID ids (400) -> scope (403
API_SCOPE_FORBIDDEN; a demoted creator's key still reads, every role has secret.read) ->
environment (404; when deleted, env-scoped keys have already failed with 401 because
their scope is gone) -> If-None-Match (304) -> 200.
RateLimit-* headers come from the IP limiter until the key is known, from the key's after.
"""

from __future__ import annotations

import json
import re
import threading
import time
import uuid
from collections import Counter, deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from .faults import FaultBook
from .wire import (
    JSON_TYPE,
    RUNTIME_RE,
    TOKEN_RE,
    UUID_RE,
    Answer,
    FixedWindows,
    Inbound,
    RequestRecord,
    check_secret,
    error_answer,
    fingerprint,
    generate_token,
    if_none_match_hits,
    json_answer,
    token_digest,
    uuid_arg,
    version_headers,
)


@dataclass
class _Token:
    project: str | None  # None: org-wide
    environment: str | None
    revoked: bool = False
    demoted: bool = False


@dataclass
class _Environment:
    project: str
    version: int = 0
    secrets: dict[str, str] = field(default_factory=dict)
    deleted: bool = False


class Himitsu:
    """Thread-safe fake backend; ``StandIn`` adds the HTTP server on top."""

    def __init__(self, *, per_key_limit: int = 120, per_ip_limit: int = 300,
                 window: float = 60.0, clock: Callable[[], float] = time.monotonic,
                 log_limit: int = 100_000) -> None:
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._tokens: dict[str, _Token] = {}  # by sha256 digest: the token itself is not kept
        self._envs: dict[str, _Environment] = {}
        self._key_limits = FixedWindows(per_key_limit, window, clock)
        self._faults = FaultBook(self._key_limits)
        self._ip_limits = FixedWindows(per_ip_limit, window, clock)
        self._log: deque[RequestRecord] = deque(maxlen=log_limit)
        self._logged = 0  # records appended since the last reset, dropped ones included
        self._counts: Counter[tuple[str | None, str, str | None]] = Counter()

    # -- environments and secrets ----------------------------------------------------------
    def create_environment(self, project: str | None = None,
                           environment: str | None = None) -> tuple[str, str]:
        """Create (idempotently) an environment at version 0; ids are generated if absent."""
        project = uuid_arg(project or str(uuid.uuid4()))
        environment = uuid_arg(environment or str(uuid.uuid4()))
        with self._lock:
            self._env(project, environment, create=True)
        return project, environment

    def environment_info(self, project: str, environment: str) -> dict[str, Any]:
        with self._lock:
            env = self._env(project, environment, allow_deleted=True)
            return {"project": env.project, "environment": uuid_arg(environment),
                    "configVersion": env.version, "deleted": env.deleted,
                    "keys": sorted(env.secrets)}

    def config_version(self, project: str, environment: str) -> int:
        return int(self.environment_info(project, environment)["configVersion"])

    def set_secrets(self, project: str, environment: str, values: Mapping[str, str]) -> int:
        """Create or update secrets, +1 version per key (unchanged values too) -> version.

        Creates the environment if it does not exist yet.
        """
        for key, value in values.items():
            check_secret(key, value)
        with self._lock:
            env = self._env(project, environment, create=True)
            for key, value in values.items():
                env.secrets[key] = value
                env.version += 1
            return env.version

    def delete_secret(self, project: str, environment: str, key: str) -> int:
        with self._lock:
            env = self._env(project, environment)
            if key not in env.secrets:
                raise KeyError("no such secret")
            del env.secrets[key]
            env.version += 1
            return env.version

    def delete_environment(self, project: str, environment: str) -> int:
        return self._set_deleted(project, environment, deleted=True)

    def restore_environment(self, project: str, environment: str) -> int:
        return self._set_deleted(project, environment, deleted=False)

    def _set_deleted(self, project: str, environment: str, *, deleted: bool) -> int:
        with self._lock:
            env = self._env(project, environment, allow_deleted=True)
            if env.deleted != deleted:
                env.deleted = deleted
                env.version += len(env.secrets)  # Himitsu counts one change per live secret
            return env.version

    def _env(self, project: str, environment: str, *, create: bool = False,
             allow_deleted: bool = False) -> _Environment:
        project, environment = uuid_arg(project), uuid_arg(environment)
        env = self._envs.get(environment)
        if env is None and create:
            env = self._envs[environment] = _Environment(project)
        if env is None or env.project != project:
            raise KeyError("no such environment in this project")
        if env.deleted and not allow_deleted:
            raise ValueError("environment is deleted")
        return env

    # -- tokens --------------------------------------------------------------------------
    def add_token(self, *, project: str | None = None, environment: str | None = None,
                  token: str | None = None, demoted: bool = False) -> str:
        """Register a token (generated if not given): org, project or project+env scope.

        An environment scope creates that environment if needed, so it can be polled.
        """
        token = token or generate_token()
        if not TOKEN_RE.match(token):
            raise ValueError("token does not have Himitsu's format")
        if environment is not None and project is None:
            raise ValueError("an environment scope needs its project")
        if environment is not None:
            project, environment = self.create_environment(project, environment)
        elif project is not None:
            project = uuid_arg(project)
        with self._lock:
            self._tokens[token_digest(token)] = _Token(project, environment, demoted=demoted)
        return token

    def revoke_token(self, token_or_fingerprint: str, *, revoked: bool = True) -> None:
        """Revoke a token (``revoked=False``: restore it, as re-issuing the same key would)."""
        with self._lock:
            self._find_token(token_or_fingerprint).revoked = revoked

    def set_demoted(self, token_or_fingerprint: str, demoted: bool = True) -> None:
        """Model the token's creator losing (or regaining) the role the key acts with."""
        with self._lock:
            self._find_token(token_or_fingerprint).demoted = demoted

    def _find_token(self, ref: str) -> _Token:
        if TOKEN_RE.match(ref):
            found = [self._tokens[token_digest(ref)]] if token_digest(ref) in self._tokens else []
        else:
            found = [t for d, t in self._tokens.items() if len(ref) >= 16 and d.startswith(ref)]
        if len(found) != 1:
            raise KeyError("unknown token")
        return found[0]

    # -- faults --------------------------------------------------------------------------
    def fault(self, kind: str, *, environment: str | None = None, count: int | None = None,
              status: int | None = None, code: str | None = None, seconds: float = 0.0,
              bytes_per_second: int = 0, size_mb: float = 0.0, retry_after: int = 1,
              body: str | None = None) -> str:
        """Inject a fault (kinds: see the ``faults`` module); returns its id."""
        env = uuid_arg(environment) if environment else None
        with self._lock:
            return self._faults.add(
                kind, environment=env, count=count, status=status, code=code,
                seconds=seconds, bytes_per_second=bytes_per_second, size_mb=size_mb,
                retry_after=retry_after, body=body)

    def clear_faults(self, fault_id: str | None = None) -> None:
        with self._lock:
            self._faults.clear(fault_id)

    # -- the runtime endpoint --------------------------------------------------------------
    def serve_api(self, req: Inbound) -> Answer:
        """Decide the answer to one API request and log it."""
        match = RUNTIME_RE.match(req.path)
        environment = match.group(2).lower() if match else None
        with self._lock:
            faults: tuple[Answer | None, float, int, list[str]] = (None, 0.0, 0, [])
            if environment is not None:
                env = self._envs.get(environment)
                faults = self._faults.take(environment, env.version if env else 0)
            replacement, delay, trickle, used = faults
            answer = replacement or self._decide(req, match)
            answer.delay, answer.trickle, answer.fault = delay, trickle, ",".join(used) or None
            self._record(req, environment, answer)
        return answer

    def _decide(self, req: Inbound, match: re.Match[str] | None) -> Answer:
        allowed, headers = self._ip_limits.hit(req.client_ip)
        if not allowed:
            return error_answer(429, "too many requests", headers)
        media_type = (req.content_type or "").split(";")[0].strip().lower()
        if (media_type == "application/json" and req.body_length == 0
                and req.method in ("POST", "DELETE")):
            return error_answer(500, "internal server error", headers)
        if match is None or req.method != "GET":
            return json_answer({"message": f"Route {req.method}:{req.path} not found",
                                "error": "Not Found", "statusCode": 404}, 404, headers)
        token, failure = self._authenticate(req.token)
        if token is None or req.token is None:
            return error_answer(401, failure, headers)
        allowed, headers = self._key_limits.hit(token_digest(req.token))
        if not allowed:
            return error_answer(429, "too many requests", headers)
        project, environment = match.group(1).lower(), match.group(2).lower()
        if not (UUID_RE.match(project) and UUID_RE.match(environment)):
            return error_answer(400, "projectId and environmentId must be UUIDs", headers)
        if token.project not in (None, project) or token.environment not in (None, environment):
            return error_answer(403, "the API key does not cover this environment", headers,
                                code="API_SCOPE_FORBIDDEN")
        env = self._envs.get(environment)
        if env is None or env.project != project or env.deleted:
            return error_answer(404, "environment not found", headers)
        headers.update(version_headers(env.version))
        if if_none_match_hits(req.if_none_match, env.version):
            return Answer(304, headers)
        body = {"data": {"configVersion": env.version, "secrets": dict(env.secrets)}}
        return Answer(200, {**headers, "Content-Type": JSON_TYPE}, json.dumps(body).encode())

    def _authenticate(self, token: str | None) -> tuple[_Token | None, str]:
        if not token:
            return None, "missing bearer token"
        if not TOKEN_RE.match(token):
            return None, "malformed API key"
        found = self._tokens.get(token_digest(token))
        if found is None or found.revoked:
            return None, "invalid, expired or revoked API key"
        scope = self._envs.get(found.environment) if found.environment else None
        if scope is not None and scope.deleted:
            return None, "the API key's environment no longer exists"
        return found, ""

    # -- request log and counters ----------------------------------------------------------
    def _record(self, req: Inbound, environment: str | None, answer: Answer) -> None:
        status = None if answer.reset else answer.status
        token_fp = fingerprint(req.token) if req.token else None
        self._log.append(RequestRecord(
            time.time(), req.method, req.path, environment, token_fp, status,
            req.if_none_match, req.user_agent, req.content_type is not None, answer.fault))
        self._logged += 1
        self._counts[(environment, "reset" if status is None else str(status), token_fp)] += 1
        self._changed.notify_all()

    def stats(self) -> dict[str, Any]:
        """Counts since the last reset: total, by_status ("reset" for resets), by env/token.

        Requests without an environment or a token count under "-".
        """
        by_status: Counter[str] = Counter()
        by_env: Counter[str] = Counter()
        by_token: Counter[str] = Counter()
        with self._lock:
            for (environment, status, token_fp), n in self._counts.items():
                by_status[status] += n
                by_env[environment or "-"] += n
                by_token[token_fp or "-"] += n
        return {"total": by_status.total(), "by_status": dict(by_status),
                "by_environment": dict(by_env), "by_token": dict(by_token)}

    def requests(self, *, environment: str | None = None, limit: int | None = None,
                 after: int = 0) -> list[RequestRecord]:
        """The request log, oldest first (the newest ``limit`` when given).

        ``after``: skip the first ``after`` records ever logged since the last reset (a
        reader following the log passes the count it has read; records the bounded log
        dropped meanwhile are gone).
        """
        env = environment.lower() if environment else None
        with self._lock:
            skip = max(0, after - (self._logged - len(self._log)))
            tail = list(self._log)[skip:] if after else self._log
            records = [r for r in tail if env in (None, r.environment)]
        return records[-limit:] if limit else records

    def logged(self) -> int:
        """Records appended since the last reset (dropped ones included)."""
        with self._lock:
            return self._logged

    def reset_stats(self) -> None:
        with self._lock:
            self._log.clear()
            self._logged = 0
            self._counts.clear()

    def key_window(self, token: str) -> tuple[float, int] | None:
        """(seconds left, requests counted) of the key's open rate-limit window, or None."""
        with self._lock:
            return self._key_limits.peek(token_digest(token))

    def reset_rate_limits(self) -> None:
        with self._lock:
            self._key_limits.clear()
            self._ip_limits.clear()

    def wait_for_requests(self, count: int, *, environment: str | None = None,
                          status: int | str | None = None, timeout: float = 10.0) -> bool:
        """Block until ``count`` matching requests were logged since the last reset.

        ``status`` is an HTTP status or "reset". Lets tests wait on an event, not a sleep.
        """
        env = environment.lower() if environment else None
        wanted = None if status is None else str(status)

        def seen() -> int:
            return sum(n for (e, s, _), n in self._counts.items()
                       if env in (None, e) and wanted in (None, s))

        with self._changed:
            return self._changed.wait_for(lambda: seen() >= count, timeout)
