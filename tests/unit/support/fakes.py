"""In-memory stand-ins for the reconciler's two ports, shared by the unit tests.

`FakeKube` behaves like a tiny apiserver behind an informer: objects get a uid and a
resourceVersion that grows on every write, an update carrying a stale resourceVersion
gets a 409, a delete honours its uid precondition, a status patch is a JSON merge patch,
and a Secret a real apiserver would refuse (a well-known type without its required keys,
over the size limits) gets its 422, dry run (``?dryRun=All``) included.
Reads can be served from a deliberately stale "cache" (`freeze_cache`) while a fresh
read sees the truth, which is exactly the informer lag the reconciler's expectations
must survive. A read the informer would answer (a labelled Secret, not ``fresh``) gives
its summary (``sync.summary``: digests, no values), as the real Secret informer keeps.
Every call is counted, and any call can be made to fail once.

`FakeFetcher` plays back a script of results and exceptions and records the
``known_version`` each call carried, which is how the tests tell a conditional request
from a full fetch.
"""

from __future__ import annotations

import base64
import contextlib
import copy
import itertools
import json
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from himitsu_controller import himitsu, kube
from himitsu_controller.api import ANN_ALLOWED_API_URLS, LABEL_MANAGED
from himitsu_controller.sync import summary
from himitsu_controller.sync.ports import Conflict, KubeError, SecretNotFound, SecretValue

Key = tuple[str, str]


@dataclass(frozen=True)
class RecordedEvent:
    namespace: str
    name: str
    type: str
    reason: str
    message: str


def b64(text: str) -> str:
    return base64.b64encode(text.encode("utf-8")).decode("ascii")


def unb64(data: Mapping[str, str]) -> dict[str, str]:
    return {k: base64.b64decode(v).decode("utf-8") for k, v in data.items()}


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch."""
    if not isinstance(patch, Mapping):
        return copy.deepcopy(patch)
    out = dict(target) if isinstance(target, Mapping) else {}
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = merge_patch(out.get(key), value)
    return out


class FakeKube:
    """The reconciler's ``Kube`` protocol over dicts, with apiserver-like concurrency."""

    def __init__(self) -> None:
        self.himitsu_secrets: dict[Key, dict[str, Any]] = {}
        self.secrets: dict[Key, dict[str, Any]] = {}
        self.events: list[RecordedEvent] = []
        # apps/v1 workloads by (namespace, kind, name); restarts: (ns, kind, name, at)
        self.workloads: dict[tuple[str, str, str], dict[str, Any]] = {}
        self.restarts: list[tuple[str, str, str, str]] = []
        self.status_patches: list[tuple[str, str, dict[str, Any]]] = []
        self.calls: Counter[str] = Counter()
        # The GETs of a Secret the real adapter would send: fresh reads, and reads the
        # informer cannot answer (not labelled as ours, or no such Secret) unless ``cached``.
        self.direct_reads = 0
        self.order: list[str] = []  # every call, in order
        self.forgotten: list[Key] = []
        # Exceptions to raise from the next call of a method (one per entry).
        self.fail_next: dict[str, list[Exception]] = {}
        self._frozen_secrets: dict[Key, dict[str, Any] | None] = {}
        self._frozen_hsecs: dict[Key, dict[str, Any] | None] = {}
        self._rv = itertools.count(1000)
        self._uid = itertools.count(1)

    # -- arranging the world ---------------------------------------------------------

    def add_himitsu_secret(self, obj: dict[str, Any]) -> dict[str, Any]:
        meta = obj.setdefault("metadata", {})
        meta.setdefault("uid", f"hsec-uid-{next(self._uid)}")
        meta.setdefault("generation", 1)
        meta["resourceVersion"] = str(next(self._rv))
        self.himitsu_secrets[(meta["namespace"], meta["name"])] = copy.deepcopy(obj)
        return obj

    def put_secret(self, secret: dict[str, Any]) -> dict[str, Any]:
        """Store a Secret as if someone else had written it (bypasses counting)."""
        stored = copy.deepcopy(secret)
        stored.setdefault("apiVersion", "v1")
        stored.setdefault("kind", "Secret")
        meta = stored.setdefault("metadata", {})
        meta.setdefault("uid", f"secret-uid-{next(self._uid)}")
        meta["resourceVersion"] = str(next(self._rv))
        self.secrets[(meta["namespace"], meta["name"])] = stored
        return copy.deepcopy(stored)

    def edit_secret(self, namespace: str, name: str, **changes: Any) -> dict[str, Any]:
        """A hand edit: replace top-level fields (``data=...``) and bump the version."""
        stored = copy.deepcopy(self.secrets[(namespace, name)])
        stored.update(copy.deepcopy(changes))
        stored["metadata"]["resourceVersion"] = str(next(self._rv))
        self.secrets[(namespace, name)] = stored
        return copy.deepcopy(stored)

    def freeze_cache(self, namespace: str, name: str) -> None:
        """From now on cached reads of this Secret return what it holds now."""
        self._frozen_secrets[(namespace, name)] = copy.deepcopy(
            self.secrets.get((namespace, name)))

    def freeze_himitsu_secret(self, namespace: str, name: str) -> None:
        """From now on reads of this HimitsuSecret return what it holds now (stale status)."""
        self._frozen_hsecs[(namespace, name)] = copy.deepcopy(
            self.himitsu_secrets.get((namespace, name)))

    def thaw(self) -> None:
        self._frozen_secrets.clear()
        self._frozen_hsecs.clear()

    def secret(self, namespace: str, name: str) -> dict[str, Any]:
        return copy.deepcopy(self.secrets[(namespace, name)])

    def status(self, namespace: str, name: str) -> dict[str, Any]:
        return copy.deepcopy(self.himitsu_secrets[(namespace, name)].get("status") or {})

    def writes(self) -> int:
        return self.calls["create_secret"] + self.calls["update_secret"] + self.calls[
            "delete_secret"]

    def _maybe_fail(self, method: str) -> None:
        self.calls[method] += 1
        self.order.append(method)
        pending = self.fail_next.get(method)
        if pending:
            raise pending.pop(0)

    # -- the Kube protocol -----------------------------------------------------------

    def get_himitsu_secret(self, namespace: str, name: str) -> dict[str, Any] | None:
        self._maybe_fail("get_himitsu_secret")
        key = (namespace, name)
        obj = self._frozen_hsecs[key] if key in self._frozen_hsecs else \
            self.himitsu_secrets.get(key)
        return copy.deepcopy(obj)

    def list_himitsu_secrets(self) -> list[dict[str, Any]]:
        """Read at scrape time (the lag gauges), not by a reconcile: not counted."""
        return [copy.deepcopy(obj) for obj in self.himitsu_secrets.values()]

    def get_secret(
        self, namespace: str, name: str, *, fresh: bool = False, cached: bool = False,
    ) -> dict[str, Any] | None:
        """Like the real one: the informer only sees Secrets labelled as ours."""
        self._maybe_fail("get_secret_fresh" if fresh else
                         "get_secret_cached" if cached else "get_secret")
        key = (namespace, name)
        if fresh:
            self.direct_reads += 1
            return copy.deepcopy(self.secrets.get(key))
        found = self._frozen_secrets[key] if key in self._frozen_secrets else \
            self.secrets.get(key)
        if found is None or not _labelled(found):
            if cached:
                return None
            self.direct_reads += 1
            return copy.deepcopy(found)
        return summary.secret(copy.deepcopy(found))  # what the informer keeps

    def secrets_owned_by(self, namespace: str, uid: str) -> list[dict[str, Any]]:
        """What the real adapter's index holds: labelled Secrets, as summaries."""
        return [summary.secret(copy.deepcopy(s)) for (ns, _), s in sorted(self.secrets.items())
                if ns == namespace and _labelled(s) and uid in kube.owner_uids(s)]

    def read_secret_value(
        self, namespace: str, name: str, key: str, *, for_url: str | None = None,
        max_age: float | None = None,
    ) -> SecretValue:
        self._maybe_fail("read_secret_value")
        secret = self.secrets.get((namespace, name))
        if secret is None:
            raise SecretNotFound(name)
        encoded = (secret.get("data") or {}).get(key)
        bound = ((secret.get("metadata") or {}).get("annotations") or {}).get(
            ANN_ALLOWED_API_URLS)
        return SecretValue(None if encoded is None else base64.b64decode(encoded), bound)

    def forget_secret_value(self, namespace: str, name: str, key: str) -> None:
        self.calls["forget_secret_value"] += 1
        self.forgotten.append((namespace, name))

    def create_secret(self, namespace: str, body: dict[str, Any]) -> dict[str, Any]:
        self._maybe_fail("create_secret")
        name = body["metadata"]["name"]
        _validate(body)
        if (namespace, name) in self.secrets:
            raise Conflict(f"Secret {name!r} already exists", status=409)
        stored = copy.deepcopy(body)
        stored["metadata"].pop("resourceVersion", None)
        stored["metadata"]["uid"] = f"secret-uid-{next(self._uid)}"
        stored["metadata"]["namespace"] = namespace
        stored["metadata"]["resourceVersion"] = str(next(self._rv))
        self.secrets[(namespace, name)] = stored
        return copy.deepcopy(stored)

    def dry_run_create_secret(self, namespace: str, body: dict[str, Any]) -> None:
        """Validation as the apiserver's: a 422 first, then 409 AlreadyExists (read by
        the adapter as "would be created": kube.py), and nothing is stored."""
        self._maybe_fail("dry_run_create_secret")
        _validate(body)

    def update_secret(self, namespace: str, body: dict[str, Any]) -> dict[str, Any]:
        self._maybe_fail("update_secret")
        name = body["metadata"]["name"]
        current = self.secrets.get((namespace, name))
        if current is None:
            raise Conflict(f"Secret {name!r} changed while writing", status=409)
        if body["metadata"].get("resourceVersion") != current["metadata"]["resourceVersion"]:
            raise Conflict(f"Secret {name!r} changed while writing", status=409)
        if body.get("type", "Opaque") != current.get("type", "Opaque"):
            raise KubeError(f"updating Secret {name!r} failed: 422 Invalid: type is immutable",
                            status=422)
        _validate(body)
        stored = copy.deepcopy(body)
        stored["metadata"]["uid"] = current["metadata"]["uid"]
        stored["metadata"]["resourceVersion"] = str(next(self._rv))
        self.secrets[(namespace, name)] = stored
        return copy.deepcopy(stored)

    def delete_secret(self, namespace: str, name: str, *, uid: str,
                      resource_version: str | None = None) -> None:
        self._maybe_fail("delete_secret")
        current = self.secrets.get((namespace, name))
        if current is None:
            return
        if current["metadata"]["uid"] != uid or resource_version not in (
                None, current["metadata"]["resourceVersion"]):
            raise Conflict(f"Secret {name!r} was replaced", status=409)
        if current["metadata"].get("finalizers"):  # terminating until they are removed
            current["metadata"].setdefault("deletionTimestamp", "2024-05-06T07:08:09Z")
            current["metadata"]["resourceVersion"] = str(next(self._rv))
            return
        del self.secrets[(namespace, name)]

    def finish_deletion(self, namespace: str, name: str) -> None:
        """The finalizers of a terminating Secret are done: it is gone."""
        assert self.secrets[(namespace, name)]["metadata"].get("deletionTimestamp")
        del self.secrets[(namespace, name)]

    def patch_status(self, namespace: str, name: str, status: dict[str, Any], *,
                     uid: str = "") -> None:
        self._maybe_fail("patch_status")
        obj = self.himitsu_secrets[(namespace, name)]
        if uid and uid != obj["metadata"].get("uid"):  # the adapter's JSON patch test op
            raise KubeError("updating status failed: 422 Invalid: the test operation failed",
                            status=422, reason="Invalid")
        self.status_patches.append((namespace, name, copy.deepcopy(status)))
        obj["status"] = ({k: v for k, v in status.items() if v is not None} if uid
                         else merge_patch(obj.get("status") or {}, status))
        obj["metadata"]["resourceVersion"] = str(next(self._rv))

    def add_workload(self, namespace: str, kind: str, name: str, *,
                     reads: str | None = None) -> dict[str, Any]:
        """A workload whose one container reads Secret ``reads`` through envFrom."""
        pod: dict[str, Any] = {"containers": [{"name": "app", "image": "app"}]}
        if reads is not None:
            pod["containers"][0]["envFrom"] = [{"secretRef": {"name": reads}}]
        obj = {"apiVersion": "apps/v1", "kind": kind,
               "metadata": {"namespace": namespace, "name": name,
                            "resourceVersion": str(next(self._rv))},
               "spec": {"template": {"metadata": {}, "spec": pod}}}
        self.workloads[(namespace, kind, name)] = obj
        return obj

    def get_workload(self, namespace: str, kind: str, name: str) -> dict[str, Any] | None:
        self._maybe_fail("get_workload")
        return copy.deepcopy(self.workloads.get((namespace, kind, name)))

    def patch_workload(self, namespace: str, kind: str, name: str, *, resource_version: str,
                       annotations: Mapping[str, str],
                       template: Mapping[str, str] | None = None) -> dict[str, Any]:
        """The apiserver's strategic merge patch of annotation maps, the body's
        resourceVersion a precondition (409 when the workload moved on)."""
        self._maybe_fail("patch_workload")
        obj = self.workloads.get((namespace, kind, name))
        if obj is None:
            raise KubeError(f"restarting {kind} {name!r} failed: 404 NotFound", status=404)
        meta = obj.setdefault("metadata", {})
        if str(meta.get("resourceVersion")) != resource_version:
            raise Conflict(f"{kind} {name!r} changed while patching", status=409)
        meta["annotations"] = {**(meta.get("annotations") or {}), **annotations}
        meta["resourceVersion"] = str(next(self._rv))
        if template:
            tmeta = obj["spec"]["template"].setdefault("metadata", {})
            tmeta["annotations"] = {**(tmeta.get("annotations") or {}), **template}
            self.restarts.append((namespace, kind, name, template["himitsu.io/restartedAt"]))
        return copy.deepcopy(obj)

    def record_event(
        self, obj: Mapping[str, Any], *, type: str, reason: str, message: str,
    ) -> None:
        self._maybe_fail("record_event")
        meta = obj.get("metadata") or {}
        self.events.append(RecordedEvent(
            namespace=str(meta.get("namespace")), name=str(meta.get("name")),
            type=type, reason=reason, message=message,
        ))


def _labelled(secret: Mapping[str, Any]) -> bool:
    return ((secret.get("metadata") or {}).get("labels") or {}).get(LABEL_MANAGED) == "true"


# What kube-apiserver's ValidateSecret requires of each well-known type (checked on the
# local control plane): every key of the tuple, or one of them for basic-auth.
_REQUIRED_ALL = {"kubernetes.io/tls": ("tls.crt", "tls.key"),
                 "kubernetes.io/ssh-auth": ("ssh-privatekey",),
                 "kubernetes.io/dockercfg": (".dockercfg",),
                 "kubernetes.io/dockerconfigjson": (".dockerconfigjson",)}
_JSON_KEY = {"kubernetes.io/dockercfg": ".dockercfg",
             "kubernetes.io/dockerconfigjson": ".dockerconfigjson"}


def _validate(body: Mapping[str, Any]) -> None:
    """Raise the 422 the apiserver would answer to this Secret (field paths, no values)."""
    data = body.get("data") or {}
    meta = body.get("metadata") or {}
    kind = body.get("type", "Opaque")
    missing = [k for k in _REQUIRED_ALL.get(kind, ()) if k not in data]
    if kind == "kubernetes.io/ssh-auth" and not data.get("ssh-privatekey"):
        missing = ["ssh-privatekey"]
    if kind == "kubernetes.io/basic-auth" and not {"username", "password"} & set(data):
        missing = ["username", "password"]
    fields = [f"data[{k}]: Required value" for k in missing]
    if (kind == "kubernetes.io/service-account-token"
            and not (meta.get("annotations") or {}).get("kubernetes.io/service-account.name")):
        fields.append("metadata.annotations[kubernetes.io/service-account.name]: Required value")
    json_key = _JSON_KEY.get(kind)
    if json_key is not None and json_key in data:
        try:  # json.Unmarshal into a map: an object, or null
            ok = isinstance(json.loads(base64.b64decode(data[json_key])), dict | None)
        except ValueError:
            ok = False
        if not ok:
            fields.append(f'data[{json_key}]: Invalid value: "<secret contents redacted>"')
    if sum(len(base64.b64decode(v)) for v in data.values()) > 1024 * 1024:
        fields.append("data: Too long: may not be more than 1048576 bytes")
    annotations = meta.get("annotations") or {}
    if sum(len(k.encode()) + len(v.encode()) for k, v in annotations.items()) > 256 * 1024:
        fields.append("metadata.annotations: Too long: may not be more than 262144 bytes")
    if fields:
        name = meta.get("name", "")
        raise KubeError(f"Secret {name!r} failed: 422 Invalid: " + ", ".join(fields),
                        status=422, reason="Invalid")


@dataclass(frozen=True)
class FetchCall:
    api_url: str
    project_id: str
    environment_id: str
    token: str
    known_version: int | None


class FakeFetcher:
    """Plays back ``script`` (results, or exceptions to raise) one call at a time."""

    def __init__(self, *script: himitsu.FetchResult | Exception) -> None:
        self.script: list[himitsu.FetchResult | Exception] = list(script)
        self.calls: list[FetchCall] = []
        self.max_ages: list[float] = []
        self.released: list[str] = []

    def then(self, *more: himitsu.FetchResult | Exception) -> FakeFetcher:
        self.script.extend(more)
        return self

    @property
    def known_versions(self) -> list[int | None]:
        return [c.known_version for c in self.calls]

    def fetch(
        self, *, api_url: str, project_id: str, environment_id: str, token: str,
        known_version: int | None, max_age: float = 0.0, reader: str | None = None,
    ) -> himitsu.FetchResult:
        self.calls.append(FetchCall(api_url, project_id, environment_id, token, known_version))
        self.max_ages.append(max_age)
        if not self.script:
            raise AssertionError(f"unexpected fetch #{len(self.calls)}")
        step = self.script.pop(0)
        if isinstance(step, Exception):
            raise step
        return step

    def remembered(
        self, *, api_url: str, project_id: str, environment_id: str, token: str,
    ) -> himitsu.Fetched | None:
        return None  # holds nothing

    def release(self, reader: str) -> None:
        self.released.append(reader)


class SleepClock:
    """A monotonic clock that ``sleep`` moves on (and records): for the rate limiter and
    retry tests, which must never really wait."""

    def __init__(self) -> None:
        self.now = 1000.0
        self.slept: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


@contextlib.contextmanager
def himitsu_clients(**defaults: Any) -> Iterator[Callable[..., himitsu.HimitsuClient]]:
    """A factory of HimitsuClients built with ``defaults`` (a test's own options win),
    every one of them closed at the end."""
    made: list[himitsu.HimitsuClient] = []

    def make(**options: Any) -> himitsu.HimitsuClient:
        client = himitsu.HimitsuClient(**{**defaults, **options})
        made.append(client)
        return client

    try:
        yield make
    finally:
        for client in made:
            client.close()
