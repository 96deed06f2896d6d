"""client-go's reflector and indexer informer, on raw JSON dicts.

Why our own: ``kubernetes.watch.Watch`` turns a 410 into an exception (or one silent
retry), never shows ERROR events, cannot tell a clean end of stream from a broken one,
and has no store; the client's SharedInformer (37.x) builds generated models and has no
relist-on-410 diff. A controller needs the reflector's guarantees:

* LIST (paginated) then WATCH from the list's resourceVersion, so no change is missed
  between the two; ``allowWatchBookmarks`` keeps our resourceVersion fresh on quiet
  resources so a rewatch rarely hits 410.
* A server ``timeoutSeconds`` random in [300, 600) spreads rewatches of many clients; a
  client read timeout (90 s, longer than the ~60 s bookmark interval) bounds a half-open
  connection, which would otherwise hang the watch forever.
* A watch that ends (cleanly, by read timeout or by a reset) is reopened from the last
  resourceVersion seen: no relist, no duplicate events. Only "too old resource version"
  (410 Gone / Expired) forces a relist, which diffs against the cache and synthesises
  deletes for objects that vanished meanwhile.
* Other failures back off 0.8 s doubling to 30 s with jitter, so an unavailable
  apiserver is not hammered; ``unhealthy_for()`` feeds the readiness probe.

Handlers run on the informer thread, in event order; a failing handler is logged and
the informer carries on. On a relist an object whose resourceVersion did not change is
not re-announced (client-go's resync-on-relist is what the workqueue's timed requeues
already give us).
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import structlog

from .apierrors import ApiError, TransportError, describe_exception
from .rest import Resource, RestClient, WatchStream
from .store import IndexFunc, Store, object_key, resource_version

__all__ = ["Informer", "Store", "object_key"]

log = structlog.get_logger(__name__)

Object = dict[str, Any]

BACKOFF_INITIAL = 0.8
BACKOFF_CAP = 30.0
BACKOFF_RESET = 120.0
WATCH_TIMEOUT_MIN = 300
WATCH_TIMEOUT_SPREAD = 300
# client-go's "very short watch": ended in under a second with no event -> back off.
SHORT_WATCH = 1.0


@dataclass(frozen=True)
class _Handlers:
    on_add: Callable[[Object], None] | None
    on_update: Callable[[Object, Object], None] | None
    on_delete: Callable[[Object], None] | None


class _Backoff:
    """Exponential backoff with jitter, starting over after a quiet spell.

    As client-go's reflector backoff manager: the delay only resets once no failure has
    happened for BACKOFF_RESET seconds, so a watch that opens and dies at once keeps
    backing off instead of restarting from 0.8 s every time.
    """

    def __init__(self, rng: Callable[[], float], clock: Callable[[], float]) -> None:
        self._rng = rng
        self._clock = clock
        self._failures = 0
        self._last_failure: float | None = None

    def next_delay(self) -> float:
        now = self._clock()
        if self._last_failure is not None and now - self._last_failure > BACKOFF_RESET:
            self._failures = 0
        self._last_failure = now
        base = min(BACKOFF_CAP, BACKOFF_INITIAL * 2.0 ** min(self._failures, 16))
        self._failures += 1
        return min(BACKOFF_CAP, base * (1.0 + self._rng()))


class Informer:
    """Keeps ``store`` in step with one resource (optionally one namespace / selector)."""

    def __init__(self, rest: RestClient, resource: Resource, *, namespace: str | None = None,
                 label_selector: str | None = None, field_selector: str | None = None,
                 page_size: int = 500, indexers: Mapping[str, IndexFunc] | None = None,
                 name: str | None = None, watch_read_timeout: float = 90.0,
                 clock: Callable[[], float] = time.monotonic,
                 rng: Callable[[], float] = random.random) -> None:
        self.store = Store(indexers)
        self.resource = resource
        self.namespace = namespace
        self.name = name or resource.plural
        self._rest = rest
        self._path = resource.path(namespace if resource.namespaced else None)
        self._selectors = {"labelSelector": label_selector, "fieldSelector": field_selector}
        self._page_size = page_size
        self._watch_read_timeout = watch_read_timeout
        self._clock = clock
        self._rng = rng
        self._handlers: list[_Handlers] = []
        # Held while handlers run, so a handler added late sees a consistent replay.
        self._dispatch_lock = threading.RLock()
        self._synced = threading.Event()
        self._rv = ""
        self._state_lock = threading.Lock()
        self._failing_since: float | None = None
        self._stream: WatchStream | None = None
        self._backoff = _Backoff(rng, clock)

    # Public state.

    @property
    def last_sync_resource_version(self) -> str:
        return self._rv

    def has_synced(self) -> bool:
        return self._synced.is_set()

    def wait_for_sync(self, timeout: float | None = None) -> bool:
        return self._synced.wait(timeout)

    def unhealthy_for(self) -> float:
        """Seconds since list/watch started failing without a success since; 0 if healthy."""
        with self._state_lock:
            since = self._failing_since
        return 0.0 if since is None else max(0.0, self._clock() - since)

    def add_handler(self, *, on_add: Callable[[Object], None] | None = None,
                    on_update: Callable[[Object, Object], None] | None = None,
                    on_delete: Callable[[Object], None] | None = None) -> None:
        """Register callbacks; objects already cached are replayed to ``on_add`` first."""
        handlers = _Handlers(on_add, on_update, on_delete)
        with self._dispatch_lock:
            if on_add is not None:
                for obj in self.store.list():
                    self._call(on_add, "add", obj)
            self._handlers.append(handlers)

    # The reflector loop.

    def run(self, stop: threading.Event) -> None:
        """List and watch until ``stop`` is set; never raises for API trouble."""
        closer = threading.Thread(target=self._close_stream_on, args=(stop,),
                                  name=f"informer-{self.name}-stop", daemon=True)
        closer.start()
        log.info("informer starting", informer=self.name, path=self._path)
        need_list = True
        while not stop.is_set():
            phase = "list" if need_list else "watch"
            try:
                if need_list:
                    if not self._list_and_replace(stop):
                        break
                    need_list = False
                    self._succeeded()
                    continue
                need_list = self._watch(stop)
                if need_list:  # an ERROR event said so: the same line as a refused watch
                    log.info("resource version too old, relisting", informer=self.name)
            except ApiError as exc:
                if phase == "watch" and _is_expired(exc.status, exc.reason):
                    log.info("resource version too old, relisting", informer=self.name)
                    need_list = True
                    continue
                self._failed(stop, phase, str(exc))
            except Exception as exc:
                self._failed(stop, phase, describe_exception(exc))
        log.info("informer stopped", informer=self.name)

    def _close_stream_on(self, stop: threading.Event) -> None:
        stop.wait()
        with self._state_lock:
            stream = self._stream
        if stream is not None:
            stream.close()

    def _succeeded(self) -> None:
        with self._state_lock:
            self._failing_since = None

    def _failed(self, stop: threading.Event, phase: str, error: str) -> None:
        with self._state_lock:
            if self._failing_since is None:
                self._failing_since = self._clock()
        delay = self._backoff.next_delay()
        log.warning("informer list/watch failed, backing off", informer=self.name,
                    phase=phase, error=error, retry_in=round(delay, 2))
        stop.wait(delay)

    def _list_and_replace(self, stop: threading.Event) -> bool:
        listed = self._list(stop)
        if listed is None:
            return False
        items, rv = listed
        with self._dispatch_lock:
            changed, deleted = self.store.replace(items)
            for old, new in changed:
                if old is None:
                    self._dispatch("add", new)
                else:
                    self._dispatch("update", new, old)
            for obj in deleted:
                self._dispatch("delete", obj)
        self._rv = rv
        self._synced.set()
        log.info("informer listed", informer=self.name, objects=len(items),
                 changed=len(changed), deleted=len(deleted), resource_version=rv)
        return True

    def _list(self, stop: threading.Event) -> tuple[dict[str, Object], str] | None:
        """All pages of one consistent LIST.

        If a continue token expires (the snapshot was compacted away mid-listing), start
        over with a single unpaginated LIST, as client-go's pager does.
        """
        limit: int | None = self._page_size
        while True:
            items: dict[str, Object] = {}
            token: str | None = None
            while True:
                if stop.is_set():
                    return None
                query: dict[str, Any] = {**self._selectors, "limit": limit, "continue": token}
                try:
                    page = self._rest.list(self.resource, namespace=self._list_namespace(),
                                           query=query)
                except ApiError as exc:
                    if token is not None and exc.status == 410:
                        log.info("list continue token expired, listing again in one page",
                                 informer=self.name)
                        limit = None
                        break
                    raise
                _collect(page, items)
                metadata = page.get("metadata") or {}
                token = metadata.get("continue") or None
                if token is None:
                    return items, str(metadata.get("resourceVersion", ""))

    def _list_namespace(self) -> str | None:
        return self.namespace if self.resource.namespaced else None

    def _watch(self, stop: threading.Event) -> bool:
        """One watch request; True when the resourceVersion expired (relist needed)."""
        query: dict[str, Any] = {
            **self._selectors, "resourceVersion": self._rv, "allowWatchBookmarks": True,
            "timeoutSeconds": WATCH_TIMEOUT_MIN + int(self._rng() * WATCH_TIMEOUT_SPREAD)}
        started = self._clock()
        stream = self._rest.watch(self._path, query=query,
                                  read_timeout=self._watch_read_timeout)
        with self._state_lock:
            # An accepted watch ends a failure streak, unless it dies at once (below).
            streak, self._failing_since = self._failing_since, None
            self._stream = stream
        if stop.is_set():  # the closer may have run before the stream was published
            stream.close()
        events = 0
        try:
            with stream:
                for event in stream:
                    if _is_expired_event(event):
                        return True
                    events += 1
                    self._handle_event(event)
        except TransportError as exc:
            if not stop.is_set():
                log.info("watch connection broke, rewatching", informer=self.name,
                         error=str(exc), resource_version=self._rv)
        finally:
            with self._state_lock:
                self._stream = None
        if not stop.is_set() and events == 0 and self._clock() - started < SHORT_WATCH:
            with self._state_lock:
                self._failing_since = streak
            raise TransportError("very short watch: closed within a second with no event")
        return False

    def _handle_event(self, event: Mapping[str, Any]) -> None:
        kind = event.get("type")
        obj = event.get("object")
        if not isinstance(obj, dict):
            raise TransportError(f"watch event {kind!r} without an object")
        if kind == "ERROR":
            raise ApiError.from_status(obj)
        rv = resource_version(obj)
        if kind == "BOOKMARK":
            self._rv = rv or self._rv
            return
        if kind not in ("ADDED", "MODIFIED", "DELETED"):
            raise TransportError(f"unknown watch event type {kind!r}")
        key = object_key(obj)
        with self._dispatch_lock:
            if kind == "DELETED":
                self.store.delete(key)
                self._dispatch("delete", obj)
            else:
                current = self.store.get(key)
                if current is not None and resource_version(current) == rv:
                    pass  # already seen (e.g. replayed after a rewatch)
                else:
                    old = self.store.upsert(key, obj)
                    if old is None:
                        self._dispatch("add", obj)
                    else:
                        self._dispatch("update", obj, old)
        self._rv = rv or self._rv

    def _dispatch(self, kind: str, obj: Object, old: Object | None = None) -> None:
        for handlers in self._handlers:
            if kind == "add" and handlers.on_add is not None:
                self._call(handlers.on_add, kind, obj)
            elif kind == "update" and handlers.on_update is not None and old is not None:
                self._call(handlers.on_update, kind, old, obj)
            elif kind == "delete" and handlers.on_delete is not None:
                self._call(handlers.on_delete, kind, obj)

    def _call(self, func: Callable[..., None], kind: str, *objs: Object) -> None:
        try:
            func(*objs)
        except Exception:
            log.exception("informer event handler failed", informer=self.name, kind=kind,
                          key=object_key(objs[-1]))


def _collect(page: Mapping[str, Any], items: dict[str, Object]) -> None:
    # List items carry no apiVersion/kind; fill them in so cached objects look the same
    # whether they came from a LIST or a watch event.
    api_version = page.get("apiVersion")
    list_kind = str(page.get("kind", ""))
    kind = list_kind.removesuffix("List") if list_kind.endswith("List") else None
    for item in page.get("items") or []:
        if api_version and "apiVersion" not in item:
            item["apiVersion"] = api_version
        if kind and "kind" not in item:
            item["kind"] = kind
        items[object_key(item)] = item


def _is_expired(status: int | None, reason: str | None) -> bool:
    return status == 410 or reason in ("Expired", "Gone")


def _is_expired_event(event: Mapping[str, Any]) -> bool:
    obj = event.get("object")
    if event.get("type") != "ERROR" or not isinstance(obj, dict):
        return False
    return _is_expired(obj.get("code"), obj.get("reason"))
