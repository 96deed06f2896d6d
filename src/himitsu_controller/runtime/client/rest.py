"""Raw JSON to the apiserver over our own HTTP transport, with client-go's client-side rules.

* JSON dicts over one urllib3 pool: the ``kubernetes`` client's models are slower and
  larger, and importing it costs ~16 MiB.
* client-go's token bucket (QPS/burst) and Retry-After on 429; watches exempt.
* With leader election every write asks the write gate right before it leaves, is sent
  once and is over (aborted, ``httpdeadline``) by the time the gate gave it.
* Errors, configuration, pool and watch stream are siblings re-exported here.

Design: docs/design/apiserver-client.md
"""

from __future__ import annotations

import builtins
import functools
import http.client
import json
import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol
from urllib.parse import quote, urlencode

import structlog
import urllib3

from himitsu_controller.runtime.client.config import (
    ClientConfig,
    ConfigError,
    bearer,
    load_client_config,
)
from himitsu_controller.runtime.client.errors import ApiError, TransportError, WriteRefused
from himitsu_controller.runtime.client.transport import (
    REFRESH_SECONDS,
    HttpClient,
    LeanTransport,
    encode_body,
    load_api_client,
    new_api_client,
)
from himitsu_controller.runtime.client.watchstream import WatchStream
from himitsu_controller.runtime.workqueue import BucketRateLimiter

__all__ = ["APPLY_PATCH", "JSON_PATCH", "MERGE_PATCH", "ApiError", "ClientConfig", "ConfigError",
           "HttpClient", "Resource", "RestClient", "TokenBucket", "TransportError",
           "WatchStream", "WriteRefused", "bearer", "load_api_client", "load_client_config",
           "new_api_client"]

log = structlog.get_logger(__name__)

JSON = "application/json"
MERGE_PATCH = "application/merge-patch+json"
JSON_PATCH = "application/json-patch+json"
APPLY_PATCH = "application/apply-patch+yaml"

_VERB_BY_METHOD = {"GET": "get", "POST": "create", "PUT": "update", "PATCH": "patch",
                   "DELETE": "delete"}
_WRITE_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})


class WriteGate(Protocol):
    """What the client asks before each write (``runtime.leader.writegate.WriteGate``)."""

    def admit(self) -> float | None: ...

    def done(self, *, answered: bool) -> None: ...


@dataclass(frozen=True)
class Resource:
    """A resource type addressed by group/version/plural ("" group is the core API)."""

    group: str
    version: str
    plural: str
    namespaced: bool = True

    def path(self, namespace: str | None = None, name: str | None = None,
             subresource: str | None = None) -> str:
        for segment in (namespace, name):
            # Quoting cannot save these: "" turns a GET into a LIST, and urllib3 resolves
            # "." and ".." (secrets/.. would read the Namespace).
            if segment is not None and segment in ("", ".", ".."):
                raise ValueError(f"{segment!r} is not a namespace or object name")
        prefix = f"/api/{self.version}" if self.group == "" else \
            f"/apis/{self.group}/{self.version}"
        if namespace is not None:
            if not self.namespaced:
                raise ValueError(f"{self.plural} is cluster-scoped: no namespace")
            prefix += f"/namespaces/{quote(namespace, safe='')}"
        path = f"{prefix}/{self.plural}"
        if name is not None:
            path += f"/{quote(name, safe='')}"
        if subresource is not None:
            if name is None:
                raise ValueError("a subresource needs a name")
            path += f"/{subresource}"
        return path


class TokenBucket(BucketRateLimiter):
    """client-go's QPS/burst limiter: the work queue's bucket, callers sleeping for their
    reservation outside the lock (served in arrival order)."""

    def __init__(self, qps: float, burst: int, *, clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        super().__init__(qps, burst, clock=clock)
        self._sleep = sleep

    def reserve(self) -> float:
        """Take a token; return how long the caller must wait before using it."""
        return self.when("")

    def accept(self) -> None:
        delay = self.reserve()
        if delay > 0:
            self._sleep(delay)


def _encode_query(query: Mapping[str, Any] | None) -> str:
    pairs = [(key, ("true" if value else "false") if isinstance(value, bool) else str(value))
             for key, value in (query or {}).items() if value is not None]
    return urlencode(pairs, quote_via=quote)


def _decode(data: bytes) -> dict[str, Any]:
    decoded = json.loads(data) if data else {}
    return decoded if isinstance(decoded, dict) else {"items": decoded}


class RestClient:
    """JSON requests to the apiserver with client-go's client-side behaviour; thread-safe.
    One per process, and the elector's own (renewals never queue behind other requests)."""

    def __init__(self, api_client: HttpClient, *, qps: float = 50.0, burst: int = 100,
                 user_agent: str | None = None, max_retries: int = 10,
                 credentials_refresh: float = REFRESH_SECONDS,
                 write_gate: WriteGate | None = None, request_deadlines: bool = False,
                 clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        """``max_retries``: 429s retried after their Retry-After; ``request_deadlines``:
        each request's timeout bounds the whole request (the leader elector's)."""
        self.api_client = api_client
        self._write_gate = write_gate
        self._request_deadlines = request_deadlines
        self._limiter = TokenBucket(qps, burst, clock=clock, sleep=sleep) if qps > 0 else None
        self._transport = LeanTransport(api_client, user_agent=user_agent,
                                        refresh_every=credentials_refresh, clock=clock)
        self._max_retries = max_retries
        self._sleep = sleep
        self._counts: Counter[str] = Counter()
        self._counts_lock = threading.Lock()

    @property
    def request_counts(self) -> dict[str, int]:
        """Requests sent so far by verb (get, list, watch, create, update, patch, delete)."""
        with self._counts_lock:
            return dict(self._counts)

    def _count(self, verb: str) -> None:
        with self._counts_lock:
            self._counts[verb] += 1

    def request(self, method: str, path: str, *, query: Mapping[str, Any] | None = None,
                body: Any = None, content_type: str | None = None, timeout: float = 30.0,
                verb: str | None = None) -> dict[str, Any]:
        """Send one request: the decoded JSON body, or ApiError/TransportError. A 429 with
        Retry-After is retried after it, at most ``max_retries`` times (as client-go)."""
        if content_type == JSON_PATCH and not isinstance(body, builtins.list):
            raise ValueError("a JSON patch body must be a list of operations")
        verb = verb or _VERB_BY_METHOD.get(method, method.lower())
        attempt = 0
        while True:
            if self._limiter is not None:
                self._limiter.accept()
            status, data, headers = self._send(method, path, query=query, body=body,
                                               content_type=content_type, timeout=timeout,
                                               verb=verb)
            if 200 <= status < 300:
                return _decode(data)
            error = ApiError.from_response(status, data, headers)
            if status != 429 or error.retry_after is None or attempt >= self._max_retries:
                raise error
            attempt += 1
            log.info("apiserver throttled the request, retrying", verb=verb,
                     retry_after=error.retry_after, attempt=attempt)
            self._sleep(error.retry_after)

    def _send(self, method: str, path: str, *, query: Mapping[str, Any] | None, body: Any,
              content_type: str | None, timeout: float, verb: str,
              ) -> tuple[int, bytes, Mapping[str, str]]:
        if content_type is None and body is not None:
            content_type = JSON
        send = functools.partial(self._transport.send, self._transport.route(), method, path,
                                 _encode_query(query), body=encode_body(body, content_type),
                                 content_type=content_type)
        gate = self._write_gate if method in _WRITE_METHODS else None
        allowed = gate.admit() if gate is not None else None  # the last thing before it leaves
        if gate is not None and allowed is None:
            raise WriteRefused(f"{method} {path}: not sent, this replica is not leading")
        self._count(verb)
        if gate is None or allowed is None:
            return send(timeout=timeout, deadline=self._request_deadlines)
        # Sent once, and over (aborted if need be) when the gate said; in flight until then.
        answered = False
        try:
            answer = send(timeout=min(timeout, allowed), deadline=True, once=True)
            answered = True
            return answer
        finally:
            gate.done(answered=answered)

    def watch(self, path: str, *, query: Mapping[str, Any] | None = None,
              read_timeout: float = 90.0) -> WatchStream:
        """Open a watch (not rate limited); the caller iterates and closes the stream."""
        self._count("watch")
        response = self._transport.open(path, _encode_query({**(query or {}), "watch": "true"}),
                                        read_timeout=read_timeout)
        if not 200 <= response.status < 300:
            try:
                data = response.read()
            except (urllib3.exceptions.HTTPError, http.client.HTTPException, OSError):
                data = b""
            finally:
                response.release_conn()
            raise ApiError.from_response(response.status, data, dict(response.headers))
        assert isinstance(response, urllib3.HTTPResponse)
        return WatchStream(response)

    # Convenience verbs on a Resource (the verb counted is the method's, but for list).
    # The namespace defaults to the body's own.

    def get(self, resource: Resource, name: str, *, namespace: str | None = None,
            timeout: float = 30.0) -> dict[str, Any]:
        return self.request("GET", resource.path(namespace, name), timeout=timeout)

    def create(self, resource: Resource, body: Mapping[str, Any], *,
               namespace: str | None = None, timeout: float = 30.0) -> dict[str, Any]:
        namespace = namespace if namespace is not None else _body_namespace(resource, body)
        return self.request("POST", resource.path(namespace), body=body, timeout=timeout)

    def update(self, resource: Resource, body: Mapping[str, Any], *,
               namespace: str | None = None, timeout: float = 30.0) -> dict[str, Any]:
        """PUT; the body's metadata.resourceVersion makes it conditional (409 if stale)."""
        namespace = namespace if namespace is not None else _body_namespace(resource, body)
        name = str(body.get("metadata", {}).get("name", ""))
        return self.request("PUT", resource.path(namespace, name), body=body, timeout=timeout)

    def patch(self, resource: Resource, name: str, patch: Any, *,
              namespace: str | None = None, content_type: str = MERGE_PATCH,
              subresource: str | None = None, query: Mapping[str, Any] | None = None,
              timeout: float = 30.0) -> dict[str, Any]:
        """PATCH with a merge (default), JSON or apply (pass fieldManager in query) patch."""
        return self.request("PATCH", resource.path(namespace, name, subresource), query=query,
                            body=patch, content_type=content_type, timeout=timeout)

    def delete(self, resource: Resource, name: str, *, namespace: str | None = None,
               timeout: float = 30.0) -> dict[str, Any]:
        return self.request("DELETE", resource.path(namespace, name), timeout=timeout)

    # Last: a method named ``list`` shadows the builtin for annotations below it.
    def list(self, resource: Resource, *, namespace: str | None = None,
             query: Mapping[str, Any] | None = None, timeout: float = 60.0) -> dict[str, Any]:
        """One LIST request (one page when ``query`` has a limit); the raw List object."""
        return self.request("GET", resource.path(namespace), query=query, timeout=timeout,
                            verb="list")


def _body_namespace(resource: Resource, body: Mapping[str, Any]) -> str | None:
    namespace = body.get("metadata", {}).get("namespace") if resource.namespaced else None
    return str(namespace) if namespace else None
