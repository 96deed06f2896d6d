"""An in-memory kube-apiserver for the model-based test (test_model_based.py).

What it keeps faithful, because the operator's safety rests on it: a cluster-wide
resourceVersion that grows on every write (a no-op update writes nothing and keeps it);
uids; an update carrying a stale resourceVersion or another uid is 409, and so is a
create of a name that exists; a Secret's ``type`` is immutable (422) and the well-known
types need their keys (``kubernetes.io/tls`` without ``tls.crt``: 422, as
ValidateSecret says); data keys and base64 values are validated; a delete honours its
uid precondition; ``dryRun=All`` validates without storing; the status subresource
changes only status and never ``generation``, a spec change always does; the garbage
collector deletes a Secret once every owner its ownerReferences name is gone.

Every change is appended to a change log. Watches read it through a label selector as
the real watch cache does: an object that starts matching is ADDED, one that stops
matching is DELETED. ``ModelRest`` is the ``RestClient`` the operator's ``KubeClient``
and ``Informer`` are given: it routes paths to the server, costs simulated time, can be
told to fail the next writes, and shows every write to an auditor before and after.
"""

from __future__ import annotations

import base64
import binascii
import copy
import itertools
import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from fakes import merge_patch

from himitsu_controller import api
from himitsu_controller.runtime.client.errors import ApiError, TransportError
from himitsu_controller.runtime.client.rest import Resource

SECRET = "secrets"
HSEC = api.PLURAL
DEPLOY = "deployments"  # apps/v1: read and patched by rollout restarts only
Obj = dict[str, Any]
_KEY_RE = re.compile(r"[-._a-zA-Z0-9]+")
_NAME_RE = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
# ValidateSecret's per-type rules: (required keys, "any one of" keys).
_REQUIRED: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "kubernetes.io/tls": (("tls.crt", "tls.key"), ()),
    "kubernetes.io/basic-auth": ((), ("username", "password")),
    "kubernetes.io/ssh-auth": (("ssh-privatekey",), ()),
    "kubernetes.io/dockerconfigjson": ((".dockerconfigjson",), ()),
    "kubernetes.io/dockercfg": ((".dockercfg",), ()),
}
_JSON_KEYS = {"kubernetes.io/dockerconfigjson": ".dockerconfigjson",
              "kubernetes.io/dockercfg": ".dockercfg"}
MAX_SECRET_BYTES = 1024 * 1024


@dataclass(frozen=True)
class Change:
    """One entry of the change log: ``old`` None for a create, ``new`` None for a delete."""

    rv: int
    resource: str
    old: Obj | None
    new: Obj | None


def status_error(code: int, reason: str, message: str,
                 details: Mapping[str, str] | None = None) -> ApiError:
    return ApiError(code, reason, message, details=details)


def secret_errors(secret: Mapping[str, Any]) -> list[str]:
    """The field errors ValidateSecret would report for ``secret`` (empty: valid)."""
    errors: list[str] = []
    name = str((secret.get("metadata") or {}).get("name", ""))
    if not _NAME_RE.fullmatch(name) or len(name) > 253:
        errors.append("metadata.name: Invalid value")
    data = secret.get("data") or {}
    size = 0
    decoded: dict[str, bytes] = {}
    for key, value in data.items():
        if not _KEY_RE.fullmatch(key) or key in (".", "..") or key.startswith("..") \
                or len(key) > 253:
            errors.append(f"data[{key}]: Invalid value: a valid config key must consist of "
                          "alphanumeric characters, '-', '_' or '.'")
        try:
            decoded[key] = base64.b64decode(str(value), validate=True)
        except (binascii.Error, ValueError):
            errors.append(f"data[{key}]: Invalid value: illegal base64 data")
            continue
        size += len(decoded[key])
    if size > MAX_SECRET_BYTES:
        errors.append("data: Too long: must have at most 1048576 bytes")
    kind = str(secret.get("type") or "Opaque")
    required, any_of = _REQUIRED.get(kind, ((), ()))
    errors += [f"data[{key}]: Required value" for key in required if key not in data]
    if any_of and not any(key in data for key in any_of):
        errors += [f"data[{key}]: Required value" for key in any_of]
    json_key = _JSON_KEYS.get(kind)
    if json_key in decoded:
        try:
            json.loads(decoded[json_key])
        except ValueError:
            errors.append(f"data[{json_key}]: Invalid value: invalid JSON")
    if kind == "kubernetes.io/service-account-token" and not (
            (secret.get("metadata") or {}).get("annotations") or {}).get(
                "kubernetes.io/service-account.name"):
        errors.append("metadata.annotations[kubernetes.io/service-account.name]: Required value")
    return errors


def matches(obj: Mapping[str, Any] | None, selector: str | None) -> bool:
    """Equality-based label selectors (``a=b,c=d``), all the operator uses."""
    if obj is None:
        return False
    labels = (obj.get("metadata") or {}).get("labels") or {}
    for term in filter(None, (selector or "").split(",")):
        key, _, value = term.partition("=")
        if labels.get(key) != value:
            return False
    return True


class ApiServer:
    """Secrets and HimitsuSecrets of any namespace, with the apiserver's write rules."""

    def __init__(self, *, on_change: Callable[[Change], None]) -> None:
        self.objects: dict[tuple[str, str, str], Obj] = {}
        self.rv = 100
        self._uids = itertools.count(1)
        self._on_change = on_change

    # -- reads ------------------------------------------------------------------------

    def get(self, resource: str, namespace: str, name: str) -> Obj | None:
        found = self.objects.get((resource, namespace, name))
        return copy.deepcopy(found) if found is not None else None

    def objects_of(self, resource: str, selector: str | None = None) -> list[Obj]:
        return [copy.deepcopy(o) for (r, _, _), o in sorted(self.objects.items())
                if r == resource and matches(o, selector)]

    # -- writes -----------------------------------------------------------------------

    def create(self, resource: str, namespace: str, body: Mapping[str, Any], *,
               dry_run: bool = False) -> Obj:
        obj = copy.deepcopy(dict(body))
        meta = obj.setdefault("metadata", {})
        name = str(meta.get("name") or "")
        if meta.get("namespace") not in (None, namespace):
            raise status_error(400, "BadRequest", "the namespace of the object does not "
                               "match the namespace on the request")
        if meta.get("resourceVersion"):
            raise status_error(500, "InternalError",
                               "resourceVersion should not be set on objects to be created")
        meta.update(namespace=namespace, uid=f"uid-{next(self._uids)}",
                    creationTimestamp="2024-05-06T07:08:09Z")
        if resource == SECRET:  # validation comes first: invalid and taken is a 422
            obj["type"] = obj.get("type") or "Opaque"
            self._validate(obj)
        else:
            meta["generation"] = 1
            obj.pop("status", None)
        if (resource, namespace, name) in self.objects:
            # As the apiserver answers: its Status names the kind and the object in details.
            raise status_error(409, "AlreadyExists", f'{_kind(resource)} "{name}" already exists',
                               {"kind": _kind(resource), "name": name})
        if dry_run:
            return obj
        return self._store(resource, namespace, name, None, obj)

    def update(self, resource: str, namespace: str, name: str, body: Mapping[str, Any]) -> Obj:
        """PUT of the main resource (the status of a HimitsuSecret is kept as it is)."""
        current = self.objects.get((resource, namespace, name))
        if current is None:
            raise status_error(404, "NotFound", f'{_kind(resource)} "{name}" not found')
        obj = copy.deepcopy(dict(body))
        meta = obj.setdefault("metadata", {})
        cur_meta = current["metadata"]
        if meta.get("resourceVersion") and meta["resourceVersion"] != cur_meta["resourceVersion"]:
            raise status_error(409, "Conflict", (
                f'Operation cannot be fulfilled on {resource} "{name}": the object has been '
                "modified; please apply your changes to the latest version and try again"))
        if meta.get("uid") and meta["uid"] != cur_meta["uid"]:
            raise status_error(409, "Conflict", (
                f'Operation cannot be fulfilled on {resource} "{name}": Precondition failed: '
                f"UID in precondition: {cur_meta['uid']}, UID in object meta: {meta['uid']}"))
        for field in ("uid", "creationTimestamp", "namespace", "name", "resourceVersion"):
            meta[field] = cur_meta.get(field)
        if resource == SECRET:
            obj["type"] = obj.get("type") or "Opaque"
            if obj["type"] != current.get("type", "Opaque"):
                raise status_error(422, "Invalid", (
                    f'Secret "{name}" is invalid: type: Invalid value: "{obj["type"]}": '
                    "field is immutable"))
            self._validate(obj)
        else:
            obj["status"] = copy.deepcopy(current.get("status"))
            if obj.get("status") is None:
                obj.pop("status", None)
            same_spec = obj.get("spec") == current.get("spec")
            meta["generation"] = cur_meta["generation"] + (0 if same_spec else 1)
        if obj == current:
            return copy.deepcopy(current)  # a no-op update writes nothing
        return self._store(resource, namespace, name, current, obj)

    def patch_status(self, namespace: str, name: str, patch: Any) -> Obj:
        current = self.objects.get((HSEC, namespace, name))
        if current is None:
            raise status_error(404, "NotFound", f'{api.PLURAL}.{api.GROUP} "{name}" not found')
        obj = copy.deepcopy(current)
        if isinstance(patch, list):  # a JSON patch: the adapter's uid test, then the status
            for op in patch:
                if op["op"] == "test" and op["path"] == "/metadata/uid":
                    if op["value"] != current["metadata"]["uid"]:
                        raise status_error(422, "Invalid", "the test operation failed")
                elif op["op"] in ("add", "replace") and op["path"] == "/status":
                    obj["status"] = copy.deepcopy(op["value"])
                else:
                    raise status_error(422, "Invalid", f"op not served here: {op}")
        else:  # a merge patch: metadata in it is dropped (the status strategy keeps it)
            obj["status"] = merge_patch(current.get("status") or {}, patch.get("status") or {})
        if obj == current:
            return copy.deepcopy(current)
        return self._store(HSEC, namespace, name, current, obj)

    def patch(self, resource: str, namespace: str, name: str, patch: Mapping[str, Any]) -> Obj:
        """A merge patch of the main resource (for the annotation maps a rollout restart
        patches, what a strategic merge patch does too); a resourceVersion in it is a
        precondition (409), and generation moves when the spec changes."""
        current = self.objects.get((resource, namespace, name))
        if current is None:
            raise status_error(404, "NotFound", f'{_kind(resource)} "{name}" not found')
        expected = (patch.get("metadata") or {}).get("resourceVersion")
        if expected is not None and expected != current["metadata"]["resourceVersion"]:
            raise status_error(409, "Conflict", (
                f'Operation cannot be fulfilled on {_kind(resource)} "{name}": the object '
                "has been modified; please apply your changes to the latest version and "
                "try again"))
        obj = merge_patch(current, patch)
        obj["metadata"]["resourceVersion"] = current["metadata"]["resourceVersion"]
        if obj == current:
            return copy.deepcopy(current)
        if obj.get("spec") != current.get("spec"):
            obj["metadata"]["generation"] = current["metadata"]["generation"] + 1
        return self._store(resource, namespace, name, current, obj)

    def delete(self, resource: str, namespace: str, name: str, *,
               preconditions: Mapping[str, Any] | None = None) -> None:
        current = self.objects.get((resource, namespace, name))
        if current is None:
            raise status_error(404, "NotFound", f'{_kind(resource)} "{name}" not found')
        uid = (preconditions or {}).get("uid")
        rv = (preconditions or {}).get("resourceVersion")
        if rv and rv != current["metadata"]["resourceVersion"]:
            raise status_error(409, "Conflict", (
                f'Operation cannot be fulfilled on {resource} "{name}": Precondition failed: '
                f"ResourceVersion in precondition: {rv}, ResourceVersion in object meta: "
                f"{current['metadata']['resourceVersion']}"))
        if uid and uid != current["metadata"]["uid"]:
            raise status_error(409, "Conflict", (
                f'Operation cannot be fulfilled on {resource} "{name}": Precondition failed: '
                f"UID in precondition: {uid}, UID in object meta: {current['metadata']['uid']}"))
        del self.objects[(resource, namespace, name)]
        self.rv += 1
        gone = copy.deepcopy(current)
        gone["metadata"]["resourceVersion"] = str(self.rv)
        self._on_change(Change(self.rv, resource, gone, None))

    def collect_garbage(self) -> list[str]:
        """The garbage collector: delete Secrets whose every owner is gone (background
        propagation); returns the names deleted."""
        alive = {(ns, o["metadata"]["uid"]) for (r, ns, _), o in self.objects.items() if r == HSEC}
        doomed = []
        for (resource, ns, name), obj in list(self.objects.items()):
            refs = (obj.get("metadata") or {}).get("ownerReferences") or []
            if resource == SECRET and refs and all((ns, ref.get("uid")) not in alive
                                                   for ref in refs):
                self.delete(resource, ns, name)
                doomed.append(f"{ns}/{name}")
        return doomed

    # -- helpers ----------------------------------------------------------------------

    def _validate(self, secret: Obj) -> None:
        errors = secret_errors(secret)
        if errors:
            name = secret["metadata"].get("name", "")
            raise status_error(422, "Invalid", f'Secret "{name}" is invalid: ' + ", ".join(errors))

    def _store(self, resource: str, namespace: str, name: str, old: Obj | None, obj: Obj) -> Obj:
        self.rv += 1
        obj["metadata"]["resourceVersion"] = str(self.rv)
        self.objects[(resource, namespace, name)] = obj
        self._on_change(Change(self.rv, resource, copy.deepcopy(old) if old else None,
                               copy.deepcopy(obj)))
        return copy.deepcopy(obj)


def _kind(resource: str) -> str:
    if resource == DEPLOY:
        return "deployments.apps"
    return "secrets" if resource == SECRET else f"{api.PLURAL}.{api.GROUP}"


class Auditor(Protocol):
    """Sees every write the operator sends, before it is applied and once it was."""

    def before_write(self, method: str, resource: str, namespace: str, name: str,
                     body: Mapping[str, Any] | None) -> None: ...

    def after_write(self, method: str, resource: str, namespace: str, name: str,
                    stored: Obj | None) -> None: ...

    def faulted(self) -> None: ...


_SECRETS = re.compile(r"/api/v1/namespaces/(?P<ns>[^/]+)/secrets(?:/(?P<name>[^/]+))?")
_HSECS = re.compile(rf"/apis/{api.GROUP}/{api.VERSION}/namespaces/(?P<ns>[^/]+)/{api.PLURAL}"
                    r"(?:/(?P<name>[^/]+)(?P<status>/status)?)?")
_DEPLOYS = re.compile(r"/apis/apps/v1/namespaces/(?P<ns>[^/]+)/deployments(?:/(?P<name>[^/]+))?")
FAULTS = ("error", "unreachable", "lost", "crash")


class Crash(BaseException):
    """The operator is SIGKILLed right after this write reached the apiserver (no
    ``except Exception`` of the operator catches it: model_world.py starts a new process)."""


class ModelRest:
    """What ``KubeClient`` and ``Informer`` use of ``RestClient``, on an ``ApiServer``.

    ``faults`` fails the next writes, one entry each: "error" (a 500, nothing applied),
    "unreachable" (no answer, nothing applied), "lost" (applied, then the answer is lost;
    a delete is never lost, see test_model_based.py), "crash" (applied, then the process
    dies: ``Crash``). ``spend`` is called once per
    request so each costs simulated time.
    """

    def __init__(self, server: ApiServer, *, auditor: Auditor,
                 spend: Callable[[], None]) -> None:
        self.server = server
        self.faults: list[str] = []
        self.crash_after: str | None = None  # SIGKILL right after the next write of this
        self._auditor = auditor
        self._spend = spend

    def request(self, method: str, path: str, *, query: Mapping[str, Any] | None = None,
                body: Any = None, content_type: str | None = None, timeout: float = 30.0,
                verb: str | None = None) -> Obj:
        self._spend()
        method = method.upper()
        match = _SECRETS.fullmatch(path)
        resource = SECRET
        if match is None:
            match = _HSECS.fullmatch(path)
            resource = HSEC
        if match is None:
            match = _DEPLOYS.fullmatch(path)
            resource = DEPLOY
        if match is None:
            raise ApiError(404, "NotFound", f"the server could not find the resource {path}")
        ns, name = match["ns"], match["name"]
        if method == "GET":
            found = self.server.get(resource, ns, name) if name else None
            if found is None:
                raise status_error(404, "NotFound", f'{_kind(resource)} "{name}" not found')
            return found
        dry_run = "All" in _values((query or {}).get("dryRun"))
        fault = self.faults.pop(0) if self.faults else None
        if fault is not None:
            self._auditor.faulted()
        if fault in ("error", "unreachable"):
            if fault == "error":
                raise status_error(500, "InternalError", "etcdserver: request timed out")
            raise TransportError(f"{method} {path}: connection refused")
        target = name or str(((body or {}).get("metadata") or {}).get("name", ""))
        if not dry_run:
            self._auditor.before_write(method, resource, ns, target, body)
        stored = self._write(method, resource, ns, name, body, dry_run=dry_run,
                             status=bool(match.groupdict().get("status")))
        if not dry_run:
            self._auditor.after_write(method, resource, ns, target, stored)
        if fault == "lost" and not dry_run and method != "DELETE":
            raise TransportError(f"{method} {path}: connection reset by peer")
        if fault == "crash" and not dry_run and method != "DELETE":
            raise Crash(f"{method} {path}")
        if self.crash_after == resource and not dry_run and method in ("POST", "PUT"):
            self.crash_after = None
            raise Crash(f"{method} {path}")
        return stored or {}

    def _write(self, method: str, resource: str, ns: str, name: str | None, body: Any, *,
               dry_run: bool, status: bool) -> Obj | None:
        if method == "POST" and name is None:
            return self.server.create(resource, ns, body, dry_run=dry_run)
        if name is None:
            raise status_error(405, "MethodNotAllowed", f"{method} on a collection")
        if method == "PUT" and not status:
            return self.server.update(resource, ns, name, body)
        if method == "PATCH" and status and resource == HSEC:
            return self.server.patch_status(ns, name, body)
        if method == "PATCH" and resource == DEPLOY:  # a strategic merge patch of a map
            return self.server.patch(DEPLOY, ns, name, body)
        if method == "DELETE" and not status:
            preconditions = (body or {}).get("preconditions")
            self.server.delete(resource, ns, name, preconditions=preconditions)
            return None
        raise status_error(405, "MethodNotAllowed", f"{method} {resource}")

    def list(self, resource: Resource, *, namespace: str | None = None,
             query: Mapping[str, Any] | None = None, timeout: float = 60.0) -> Obj:
        self._spend()
        plural = SECRET if resource.plural == SECRET else HSEC
        selector = (query or {}).get("labelSelector")
        items = [o for o in self.server.objects_of(plural, selector)
                 if namespace is None or o["metadata"]["namespace"] == namespace]
        kind = "SecretList" if plural == SECRET else f"{api.KIND}List"
        version = f"{resource.group}/{resource.version}" if resource.group else resource.version
        return {"apiVersion": version, "kind": kind,
                "metadata": {"resourceVersion": str(self.server.rv)}, "items": items}


def _values(value: Any) -> list[str]:
    if value is None:
        return []
    if isinstance(value, (list, tuple)):
        return [str(v) for v in value]
    return [str(value)]
