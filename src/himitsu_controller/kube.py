"""The adapter: ``sync.ports.Kube`` on the runtime's REST client and informer caches.

* Reads come from caches wherever they can (one apiserver request per poll: the status
  patch); what no cache holds (a target not yet adopted, the token Secret) is read
  directly.
* The token cache (per namespace, Secret, key) is re-read after five minutes, after a
  401/403 and before a token first goes to an apiUrl; a value goes with the last
  HimitsuSecret that names it.
* Secrets are only read in the HimitsuSecret's own namespace: RBAC cannot narrow that.

Design: docs/design/adapter.md
"""

from __future__ import annotations

import base64
import binascii
import builtins
import socket
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Protocol

from himitsu_controller import api
from himitsu_controller.runtime.client.rest import (
    ApiError,
    Resource,
    RestClient,
    TransportError,
    WriteRefused,
)
from himitsu_controller.runtime.events import EVENTS, EventSink, build_event
from himitsu_controller.sync.ports import Conflict, KubeError, SecretNotFound, SecretValue

SECRETS = Resource("", "v1", "secrets")
HIMITSU_SECRETS = Resource(api.GROUP, api.VERSION, api.PLURAL)
WORKLOADS = {kind: Resource("apps", "v1", f"{kind.lower()}s") for kind in api.WORKLOAD_KINDS}

TOKEN_TTL = 300.0
COMPONENT = "himitsu-operator"
REPORTING_CONTROLLER = f"{api.GROUP}/{COMPONENT}"
_SHOWN_MESSAGE = 300


class Store(Protocol):
    def get(self, key: str) -> dict[str, Any] | None: ...
    def list(self) -> builtins.list[dict[str, Any]]: ...
    def by_index(self, index: str, value: str) -> builtins.list[dict[str, Any]]: ...


OWNER_INDEX = "owner-uid"


def owner_uids(obj: Mapping[str, Any]) -> list[str]:
    """The HimitsuSecret uids a Secret is stamped or controlled by: an informer index
    function (how a renamed target's old Secret is found, without a record of names)."""
    meta = obj.get("metadata") or {}
    uids = {str(r.get("uid")) for r in meta.get("ownerReferences") or []
            if isinstance(r, Mapping) and r.get("controller") and r.get("kind") == api.KIND
            and r.get("uid")}
    stamped = (meta.get("annotations") or {}).get(api.ANN_OWNER_UID)
    if isinstance(stamped, str) and stamped:
        uids.add(stamped)
    return sorted(uids)


def token_refs(obj: Mapping[str, Any]) -> list[str]:
    """"namespace/secret/key" of the token a HimitsuSecret names (raw fields, key "token" by
    default; none holds a "/"): an informer index function."""
    namespace = (obj.get("metadata") or {}).get("namespace")
    ref = (obj.get("spec") or {}).get("authSecretRef")
    if not isinstance(namespace, str) or not isinstance(ref, dict):
        return []
    name, key = ref.get("name"), ref.get("key") or "token"
    if not isinstance(name, str) or not name or not isinstance(key, str):
        return []
    return [f"{namespace}/{name}/{key}"]


@dataclass
class _Reader:
    """One token's reader lock and how many threads hold or wait for it."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    users: int = 0
    forgets: int = 0  # forgets of this token while it lives: a read then keeps nothing


class KubeClient:
    def __init__(
        self, rest: RestClient, *, himitsu_secrets: Store, secrets: Store,
        token_ttl: float = TOKEN_TTL, clock: Callable[[], float] = time.monotonic,
        instance: str | None = None, events: EventSink | None = None,
    ) -> None:
        self._rest = rest
        self._events = events
        self._hsecs = himitsu_secrets
        self._secrets = secrets
        self._token_ttl = token_ttl
        self._clock = clock
        self._instance = instance or socket.gethostname()
        # The value and the Secret's allowed-api-urls annotation, read together.
        self._tokens: dict[tuple[str, str, str], tuple[float, SecretValue]] = {}
        # The apiUrls each cached value was read afresh for: any other is a fresh read.
        self._urls: dict[tuple[str, str, str], tuple[str, ...]] = {}  # small: a tuple
        self._readers: dict[tuple[str, str, str], _Reader] = {}
        self._lock = threading.Lock()
        self._swept: float | None = None
        self._in_use: Callable[[str], bool] = lambda ref: True

    def track_token_users(self, still_named: Callable[[str], bool]) -> None:
        """``still_named("namespace/secret/key")``: whether a HimitsuSecret names that
        token; a value read for none is not kept (see ``token_refs``)."""
        self._in_use = still_named

    def _request(self, method: str, path: str, **kwargs: Any) -> dict[str, Any]:
        """One apiserver call; an unreachable apiserver becomes a KubeError like any refusal."""
        try:
            return self._rest.request(method, path, **kwargs)
        except WriteRefused:  # not sent: the write gate closed (the Lease may be another's)
            raise KubeError(f"{method} {_object_of(path)}: not the leader any more: write "
                            "refused", status=0, reason="NotLeader") from None
        except TransportError:
            raise KubeError(f"{method} {_object_of(path)}: Kubernetes API unreachable",
                            status=0, reason="Unreachable") from None

    def get_himitsu_secret(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self._hsecs.get(f"{namespace}/{name}")

    def list_himitsu_secrets(self) -> list[dict[str, Any]]:
        return self._hsecs.list()

    def get_secret(
        self, namespace: str, name: str, *, fresh: bool = False, cached: bool = False,
    ) -> dict[str, Any] | None:
        """The informer's copy, else a direct read; ``fresh`` skips the informer,
        ``cached`` skips the direct read (None: not among the labelled Secrets we watch)."""
        if not fresh:
            hit = self._secrets.get(f"{namespace}/{name}")
            if hit is not None or cached:
                return hit
        try:
            return self._request("GET", SECRETS.path(namespace, name))
        except ApiError as exc:
            if exc.status == 404:
                return None
            raise _kube_error(exc, f"reading Secret {name!r}") from None

    def secrets_owned_by(self, namespace: str, uid: str) -> list[dict[str, Any]]:
        return [s for s in self._secrets.by_index(OWNER_INDEX, uid)
                if (s.get("metadata") or {}).get("namespace") == namespace]

    def read_secret_value(
        self, namespace: str, name: str, key: str, *, for_url: str | None = None,
        max_age: float | None = None,
    ) -> SecretValue:
        """The value and the Secret's binding, cached for ``token_ttl`` (``max_age``: shorter
        for this read), read afresh before it first goes to a ``for_url``, so a binding
        changed since counts at once for a new apiUrl. Readers of one Secret share a GET."""
        ident = (namespace, name, key)
        cached = self._cached_value(ident, for_url, max_age)
        if cached is not None:
            return cached
        # One reader per token at a time: its readers come due together (a shared poll).
        with self._reader(ident) as reader:
            cached = self._cached_value(ident, for_url, max_age)
            if cached is not None:
                return cached
            self._sweep()  # on misses only: one comes at least every TTL while any is used
            found = self._read_value(namespace, name, key, reader)
            if for_url is not None:
                with self._lock:
                    urls = self._urls.get(ident, ())
                    if ident in self._tokens and for_url not in urls:  # not when a forget
                        self._urls[ident] = (*urls, for_url)  # overtook the read
            return found

    def _cached_value(self, ident: tuple[str, str, str], url: str | None,
                      max_age: float | None = None) -> SecretValue | None:
        with self._lock:
            hit = self._tokens.get(ident)
            known = url is None or url in self._urls.get(ident, ())
        now = self._clock()
        ttl = self._token_ttl if max_age is None else min(max_age, self._token_ttl)
        return hit[1] if known and hit is not None and now - hit[0] < ttl else None

    @contextmanager
    def _reader(self, ident: tuple[str, str, str]) -> Iterator[_Reader]:
        with self._lock:
            reader = self._readers.setdefault(ident, _Reader())
            reader.users += 1
        try:
            with reader.lock:
                yield reader
        finally:
            with self._lock:
                reader.users -= 1
                if reader.users == 0:
                    del self._readers[ident]

    def _sweep(self) -> None:
        """Drop values not read for a TTL (they would be read afresh): at most once a TTL."""
        now = self._clock()
        with self._lock:
            if self._swept is not None and now - self._swept < self._token_ttl:
                return
            self._swept = now
            stale = [i for i, (read_at, _) in self._tokens.items()
                     if now - read_at >= self._token_ttl]
            for ident in stale:
                del self._tokens[ident]
            for ident in [i for i in self._urls if i not in self._tokens]:
                del self._urls[ident]

    def cache_sizes(self) -> dict[str, int]:
        """How many token values and reader locks are held (for tests and benchmarks)."""
        with self._lock:
            return {"tokens": len(self._tokens), "readers": len(self._readers)}

    def _read_value(self, namespace: str, name: str, key: str, reader: _Reader,
                    ) -> SecretValue:
        now = self._clock()
        with self._lock:
            forgets = reader.forgets
        secret = self.get_secret(namespace, name, fresh=True)
        if secret is None:  # the token Secret is gone: so is our copy
            self.forget_secret_value(namespace, name, key)
            raise SecretNotFound(name)
        bound = ((secret.get("metadata") or {}).get("annotations") or {}).get(
            api.ANN_ALLOWED_API_URLS)
        bound = bound if isinstance(bound, str) else None
        encoded = (secret.get("data") or {}).get(key)
        if encoded is None:  # ...and so is a key that is gone
            self.forget_secret_value(namespace, name, key)
            return SecretValue(None, bound)
        try:
            found = SecretValue(base64.b64decode(encoded, validate=True), bound)
        except (binascii.Error, ValueError):
            return SecretValue(b"", bound)
        in_use = self._in_use(f"{namespace}/{name}/{key}")
        with self._lock:
            if in_use and reader.forgets == forgets:  # else forgotten during the read
                self._tokens[(namespace, name, key)] = (now, found)
        return found

    def forget_secret_value(self, namespace: str, name: str, key: str) -> None:
        ident = (namespace, name, key)
        with self._lock:
            self._tokens.pop(ident, None)
            self._urls.pop(ident, None)
            reader = self._readers.get(ident)
            if reader is not None:
                reader.forgets += 1

    def forget_token_of(self, obj: Mapping[str, Any], *,
                        still_named: Callable[[str], bool]) -> None:
        """A HimitsuSecret was deleted or changed: drop the value of the token it named
        unless ``still_named(ref)`` says another HimitsuSecret names it too."""
        for ref in token_refs(obj):
            if not still_named(ref):
                namespace, name, key = ref.split("/", 2)
                self.forget_secret_value(namespace, name, key)
        self._sweep()

    def create_secret(self, namespace: str, body: dict[str, Any]) -> dict[str, Any]:
        """Create ``body``; Conflict only when the apiserver itself says the name is taken
        (a race), any other refusal (a webhook's 409 too) is a KubeError."""
        name = body["metadata"]["name"]
        clean = _without_server_fields(body)
        try:
            return self._request("POST", SECRETS.path(namespace), body=clean)
        except ApiError as exc:
            if _name_taken(exc, name):
                raise Conflict(f"Secret {name!r} already exists", status=409,
                               reason="AlreadyExists") from None
            raise _kube_error(exc, f"creating Secret {name!r}") from None

    def dry_run_create_secret(self, namespace: str, body: dict[str, Any]) -> None:
        """Whether the apiserver would create ``body`` (``?dryRun=All``, under its real name):
        KubeError if not. Its own 409 AlreadyExists (docs/design/adapter.md) is a yes."""
        name = body["metadata"]["name"]
        try:
            self._request("POST", SECRETS.path(namespace), query={"dryRun": "All"},
                          body=_without_server_fields(body))
        except ApiError as exc:
            if _name_taken(exc, name):
                return
            raise _kube_error(exc, f"checking a new Secret {name!r} (dry run)") from None

    def update_secret(self, namespace: str, body: dict[str, Any]) -> dict[str, Any]:
        name = body["metadata"]["name"]
        try:
            return self._request("PUT", SECRETS.path(namespace, name), body=body)
        except ApiError as exc:
            if exc.status in (404, 409):
                raise Conflict(f"Secret {name!r} changed while writing", status=409) from None
            raise _kube_error(exc, f"updating Secret {name!r}") from None

    def delete_secret(self, namespace: str, name: str, *, uid: str,
                      resource_version: str | None = None) -> None:
        preconditions = {"uid": uid}
        if resource_version:
            preconditions["resourceVersion"] = resource_version
        body = {"kind": "DeleteOptions", "apiVersion": "v1", "preconditions": preconditions}
        try:
            self._request("DELETE", SECRETS.path(namespace, name), body=body)
        except ApiError as exc:
            if exc.status == 404:
                return
            if exc.status == 409:
                raise Conflict(f"Secret {name!r} was replaced", status=409) from None
            raise _kube_error(exc, f"deleting Secret {name!r}") from None

    def patch_status(self, namespace: str, name: str, status: dict[str, Any], *,
                     uid: str = "") -> None:
        """``status`` (None: a field to remove). With ``uid``, only that object's: a JSON patch
        testing ``metadata.uid`` first (422 for a namesake), then putting the whole status
        (a merge patch's uid is no precondition on the status subresource)."""
        if uid:
            body: Any = [
                {"op": "test", "path": "/metadata/uid", "value": uid},
                {"op": "add", "path": "/status",
                 "value": {k: v for k, v in status.items() if v is not None}},
            ]
            content_type = "application/json-patch+json"
        else:
            body, content_type = {"status": status}, "application/merge-patch+json"
        try:
            self._request(
                "PATCH", HIMITSU_SECRETS.path(namespace, name, "status"),
                body=body, content_type=content_type,
            )
        except ApiError as exc:
            raise _kube_error(exc, f"updating status of HimitsuSecret {name!r}") from None

    def get_workload(self, namespace: str, kind: str, name: str) -> dict[str, Any] | None:
        try:
            return self._request("GET", WORKLOADS[kind].path(namespace, name))
        except ApiError as exc:
            if exc.status == 404:
                return None
            raise _kube_error(exc, f"reading {kind} {name!r}") from None

    def patch_workload(
        self, namespace: str, kind: str, name: str, *, resource_version: str,
        annotations: Mapping[str, str], template: Mapping[str, str] | None = None,
    ) -> dict[str, Any]:
        """``kubectl rollout restart`` under our annotation, the workload's record beside it,
        in one strategic merge patch (its strategy paces the rollout); the resourceVersion
        is a precondition (409 when it moved on)."""
        body: dict[str, Any] = {"metadata": {"resourceVersion": resource_version,
                                             "annotations": dict(annotations)}}
        if template:
            body["spec"] = {"template": {"metadata": {"annotations": dict(template)}}}
        try:
            return self._request("PATCH", WORKLOADS[kind].path(namespace, name), body=body,
                                 content_type="application/strategic-merge-patch+json")
        except ApiError as exc:
            if exc.status == 409:
                raise Conflict(f"{kind} {name!r} changed while patching", status=409) from None
            raise _kube_error(exc, f"restarting {kind} {name!r}") from None

    def record_event(
        self, obj: Mapping[str, Any], *, type: str, reason: str, message: str,
    ) -> None:
        """Hand the Event to the recorder (it returns at once); without one, POST it here
        and raise KubeError when refused, for callers that need the apiserver's answer."""
        # The recorder is generic and reads the kind from the object; say it here.
        ref = {"apiVersion": api.API_VERSION, "kind": api.KIND,
               "metadata": obj.get("metadata") or {}}
        if self._events is not None:
            self._events.event(ref, type=type, reason=reason, message=message)
            return
        body = build_event(
            ref, type=type, reason=reason, message=message, component=COMPONENT,
            reporting_controller=REPORTING_CONTROLLER, instance=self._instance,
            now=datetime.now(UTC),
        )
        try:
            self._request("POST", EVENTS.path(body["metadata"]["namespace"]), body=body)
        except ApiError as exc:
            raise _kube_error(exc, "recording an Event") from None


def _name_taken(exc: ApiError, name: str) -> bool:
    """The apiserver's own 409 for a taken name: a webhook's denial may carry the same code,
    reason and details, never this message (the apiserver prefixes a webhook's text)."""
    return (exc.status == 409 and exc.reason == "AlreadyExists"
            and exc.details.get("kind") == "secrets" and exc.details.get("name") == name
            and exc.message == f'secrets "{name}" already exists')


def _kube_error(exc: ApiError, doing: str) -> KubeError:
    """Status and reason, plus the (redacted: never a Secret value) text of a denial, a
    conflict or a validation error."""
    text = f"{doing} failed: {exc.status} {exc.reason or 'error'}".rstrip()
    if exc.status in (403, 409, 422) and exc.message:
        text += f": {str(exc.message)[:_SHOWN_MESSAGE]}"
    return KubeError(text, status=exc.status, reason=exc.reason or "")


def _object_of(path: str) -> str:
    """What a path names after its (the HimitsuSecret's own) namespace: ``secrets``,
    ``secrets/app`` or ``himitsusecrets/app/status``."""
    _, found, rest = path.partition("/namespaces/")
    return rest.partition("/")[2] if found else path.rstrip("/").rsplit("/", 1)[-1]


def _without_server_fields(body: dict[str, Any]) -> dict[str, Any]:
    meta = {k: v for k, v in (body.get("metadata") or {}).items()
            if k not in ("resourceVersion", "uid", "creationTimestamp", "managedFields")}
    return {**body, "metadata": meta}
