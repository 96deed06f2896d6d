"""client-go's reflector and indexer informer, on raw JSON dicts.

* LIST then WATCH from the list's resourceVersion (bookmarks on, a server timeout in
  [300, 600) s, a client read timeout for half-open connections); a watch that ends is
  reopened where it stopped, an expired one relists and synthesises the deletes missed.
* Failures back off 0.8 s doubling to 30 s; ``unhealthy_for``/``stalled_for`` feed the
  readiness and liveness probes.
* Objects are reduced by the transform before they are cached or handed to a handler;
  handlers run on the informer thread, in event order.

Design: docs/design/informers.md
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from typing import Any

import structlog

from himitsu_controller.runtime.cache.pager import Pager
from himitsu_controller.runtime.cache.store import (
    IndexFunc,
    Store,
    Transform,
    object_key,
    resource_version,
)
from himitsu_controller.runtime.client.errors import (
    ApiError,
    TransportError,
    describe_exception,
    is_resource_expired,
)
from himitsu_controller.runtime.client.rest import Resource, RestClient, WatchStream
from himitsu_controller.runtime.client.watchstream import WatchDecodeError

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
# A 410 relists at once only this long after the last relist, and once a watch has
# delivered something since; else after the backoff (as client-go, every time).
RELIST_AT_ONCE_AFTER = 30.0


class Informer:
    """Keeps ``store`` in step with one resource (optionally one namespace / selector)."""

    def __init__(self, rest: RestClient, resource: Resource, *, namespace: str | None = None,
                 label_selector: str | None = None, field_selector: str | None = None,
                 page_size: int = 500, indexers: Mapping[str, IndexFunc] | None = None,
                 name: str | None = None, watch_read_timeout: float = 90.0,
                 transform: Transform | None = None, shared: Collection[str] = (),
                 list_snapshots: bool = False,
                 clock: Callable[[], float] = time.monotonic,
                 rng: Callable[[], float] = random.random,
                 sleep: Callable[[threading.Event, float], object] | None = None) -> None:
        """``sleep(stop, seconds)``: how backoffs wait; ``transform``, ``shared``: see
        ``store.apply``; ``list_snapshots``: see ``pager.lists_from_snapshots``."""
        self.store = Store(indexers)
        self.name = name or resource.plural
        self._rest = rest
        self._path = resource.path(namespace if resource.namespaced else None)
        self._selectors = {"labelSelector": label_selector, "fieldSelector": field_selector}
        self._pager = Pager(rest, resource, namespace=namespace, selectors=self._selectors,
                            page_size=page_size, name=self.name, transform=transform,
                            shared=frozenset(shared), snapshots=list_snapshots)
        self._watch_read_timeout = watch_read_timeout
        self._clock = clock
        self._rng = rng
        self._handlers: dict[str, list[Callable[..., None]]] = {
            "add": [], "update": [], "delete": []}
        # Held while handlers run, so a handler added late sees a consistent replay.
        self._dispatch_lock = threading.RLock()
        self._synced = threading.Event()
        self._rv = ""
        self._state_lock = threading.Lock()
        self._failing_since: float | None = None
        self._stalled_since: float | None = None
        self._relisted_at = float("-inf")
        self._delivered_since_list = 0
        self._sleep = sleep or (lambda stop, seconds: stop.wait(seconds))
        self._stream: WatchStream | None = None
        self._failures = 0  # the backoff's
        self._last_failure = float("-inf")

    @property
    def last_sync_resource_version(self) -> str:
        return self._rv

    def has_synced(self) -> bool:
        return self._synced.is_set()

    def wait_for_sync(self, timeout: float | None = None) -> bool:
        return self._synced.wait(timeout)

    def unhealthy_for(self) -> float:
        """Seconds since list/watch started failing without a working watch since; 0 if
        healthy. A relist that succeeds while every watch fails does not reset it."""
        return self._age(self._failing_since)

    def stalled_for(self) -> float:
        """Seconds the apiserver has answered (lists work, watches are refused with a
        status) without a working watch; a refused connection or a timeout sets it to 0."""
        return self._age(self._stalled_since)

    def _age(self, since: float | None) -> float:
        return 0.0 if since is None else max(0.0, self._clock() - since)

    def add_handler(self, *, on_add: Callable[[Object], None] | None = None,
                    on_update: Callable[[Object, Object], None] | None = None,
                    on_delete: Callable[[Object], None] | None = None) -> None:
        """Register callbacks; objects already cached are replayed to ``on_add`` first."""
        with self._dispatch_lock:
            if on_add is not None:
                for obj in self.store.list():
                    self._call(on_add, "add", obj)
            for kind, func in (("add", on_add), ("update", on_update), ("delete", on_delete)):
                if func is not None:
                    self._handlers[kind].append(func)

    def run(self, stop: threading.Event) -> None:
        """List and watch until ``stop`` is set; never raises for API trouble."""
        closer = threading.Thread(target=self._close_stream_on, args=(stop,),
                                  name=f"informer-{self.name}-stop", daemon=True)
        closer.start()
        log.info("informer starting", informer=self.name, path=self._path)
        need_list = True
        while not stop.is_set():
            if need_list:
                try:
                    if not self._list_and_replace(stop):
                        break
                    need_list = False
                except Exception as exc:
                    self._failed(stop, "list", _describe(exc),
                                 answered=not isinstance(exc, TransportError))
                continue
            answered = True
            try:
                after = self._watch(stop)
            except Exception as exc:  # the watch request itself failed
                after = _after_refused_watch(exc)
                answered = not isinstance(exc, TransportError)
            if stop.is_set():
                break
            need_list, backoff, error = after.relist, after.backoff, after.error
            if error is None:
                continue
            if need_list and not backoff:
                if not self._relisted_lately():
                    log.info("resource version too old, relisting", informer=self.name)
                    continue
                error += " (again, soon after a relist)"
            if need_list:
                log.warning("watch failed, relisting after a backoff", informer=self.name,
                            error=error)
            self._failed(stop, "watch", error, answered=answered)
        log.info("informer stopped", informer=self.name)

    def _relisted_lately(self) -> bool:
        """Whether a 410 now would make a relist loop: nothing delivered since the last
        relist, or that relist was under RELIST_AT_ONCE_AFTER ago."""
        return (self._delivered_since_list == 0
                or self._clock() - self._relisted_at < RELIST_AT_ONCE_AFTER)

    def _close_stream_on(self, stop: threading.Event) -> None:
        stop.wait()
        with self._state_lock:
            stream = self._stream
        if stream is not None:
            stream.close()

    def _failed(self, stop: threading.Event, phase: str, error: str, *,
                answered: bool) -> None:
        with self._state_lock:
            now = self._clock()
            if self._failing_since is None:
                self._failing_since = now
            if not answered:  # the apiserver is unreachable: a restart would not help
                self._stalled_since = None
            elif self._stalled_since is None:
                self._stalled_since = now
        # client-go's reflector backoff: it starts over only after a quiet spell, so a
        # watch that opens and dies at once keeps backing off.
        if now - self._last_failure > BACKOFF_RESET:
            self._failures = 0
        self._last_failure = now
        base = min(BACKOFF_CAP, BACKOFF_INITIAL * 2.0 ** min(self._failures, 16))
        self._failures += 1
        delay = min(BACKOFF_CAP, base * (1.0 + self._rng()))
        log.warning("informer list/watch failed, backing off", informer=self.name,
                    phase=phase, error=error, retry_in=round(delay, 2))
        self._sleep(stop, delay)

    def _list_and_replace(self, stop: threading.Event) -> bool:
        listed = self._pager.list(self._rv, stop)
        if listed is None:
            return False
        items, rv = listed
        with self._dispatch_lock:
            changed, deleted = self.store.replace(items)
            for old, new in changed:
                if old is None:
                    self._dispatch("add", new)
                else:
                    self._dispatch("update", old, new)
            for obj in deleted:
                self._dispatch("delete", obj)
        self._rv = rv
        if self._synced.is_set():
            self._relisted_at = self._clock()
        self._delivered_since_list = 0
        self._synced.set()
        log.info("informer listed", informer=self.name, objects=len(items),
                 changed=len(changed), deleted=len(deleted), resource_version=rv)
        return True

    def _watch(self, stop: threading.Event) -> _After:
        """One watch request, from the last resourceVersion seen; what to do next."""
        query: dict[str, Any] = {
            **self._selectors, "resourceVersion": self._rv, "allowWatchBookmarks": True,
            "timeoutSeconds": WATCH_TIMEOUT_MIN + int(self._rng() * WATCH_TIMEOUT_SPREAD)}
        started = self._clock()
        stream = self._rest.watch(self._path, query=query,
                                  read_timeout=self._watch_read_timeout)
        with self._state_lock:
            # An accepted watch ends a failure streak, unless it fails before it delivers
            # anything (below): a watch refused that way over and over is no working watch.
            streak, self._failing_since = self._failing_since, None
            stalled, self._stalled_since = self._stalled_since, None
            self._stream = stream
        if stop.is_set():  # the closer may have run before the stream was published
            stream.close()
        events = 0
        after = _REWATCH
        try:
            with stream:
                for event in stream:
                    if event.get("type") == "ERROR":
                        after = _after_error_event(event.get("object"))
                        break
                    events += 1
                    self._delivered_since_list += 1
                    self._handle_event(event)
        except TransportError as exc:
            if not stop.is_set():
                log.info("watch connection broke, rewatching", informer=self.name,
                         error=str(exc), resource_version=self._rv)
        except WatchDecodeError as exc:
            # client-go turns an undecodable stream into an internal error: relist.
            after = _After(relist=True, backoff=True, error=str(exc))
        finally:
            with self._state_lock:
                self._stream = None
        if stop.is_set():
            return _REWATCH
        if after.error is None and events == 0 and self._clock() - started < SHORT_WATCH:
            after = _After(relist=True, backoff=True,
                           error="very short watch: closed within a second with no event")
        if events == 0 and after.error is not None:
            with self._state_lock:
                self._failing_since = streak if streak is not None else started
                self._stalled_since = stalled if stalled is not None else started
        return after

    def _handle_event(self, event: Mapping[str, Any]) -> None:
        kind = event.get("type")
        obj = event.get("object")
        if not isinstance(obj, dict) or kind not in ("ADDED", "MODIFIED", "DELETED", "BOOKMARK"):
            # As client-go: an event it cannot understand is reported and skipped.
            log.warning("skipping a watch event it cannot understand", informer=self.name,
                        type=str(kind)[:40])
            return
        rv = resource_version(obj)
        if kind != "BOOKMARK":  # a bookmark is a resourceVersion, never an object to cache
            key = object_key(obj)  # of the object as it came: the transform may fail on it
            kept = self._pager.keep(obj)
            with self._dispatch_lock:
                if kept is None or kind == "DELETED":
                    # An object not kept (as on the list path) drops its earlier version
                    # too, which would outlive this change with no handler hearing of it.
                    old = self.store.delete(key)
                    gone = old if kept is None else kept
                    if gone is not None:
                        self._dispatch("delete", gone)
                elif (current := self.store.get(key)) is None or resource_version(current) != rv:
                    old = self.store.upsert(key, kept)  # else already seen (a rewatch replay)
                    if old is None:
                        self._dispatch("add", kept)
                    else:
                        self._dispatch("update", old, kept)
        self._rv = rv or self._rv

    def _dispatch(self, kind: str, *objs: Object) -> None:
        for func in self._handlers[kind]:
            self._call(func, kind, *objs)

    def _call(self, func: Callable[..., None], kind: str, *objs: Object) -> None:
        try:
            func(*objs)
        except Exception:
            log.exception("informer event handler failed", informer=self.name, kind=kind,
                          key=object_key(objs[-1]))


@dataclass(frozen=True)
class _After:
    """What a watch's end calls for: rewatch or relist, at once or after a backoff."""

    relist: bool
    backoff: bool
    error: str | None = None


_REWATCH = _After(relist=False, backoff=False)


def _after_error_event(status: Any) -> _After:
    """client-go's reflector on a watch ERROR event (see ``_after_api_error``)."""
    if not isinstance(status, dict):
        return _After(relist=True, backoff=True, error="watch ERROR event without a Status")
    return _after_api_error(ApiError.from_status(status))


def _after_api_error(exc: ApiError) -> _After:
    """A 429 backs off and rewatches; an expired resourceVersion relists at once; anything
    else (a 504 "too large resource version", a 500, a 403...) backs off and relists."""
    if exc.status == 429:
        return _After(relist=False, backoff=True, error=str(exc))
    return _After(relist=True, backoff=not is_resource_expired(exc), error=str(exc))


def _after_refused_watch(exc: Exception) -> _After:
    """As client-go: only a refused connection (the watch resumes where it was) and a 429
    rewatch; the rest relists."""
    if isinstance(exc, ApiError):
        return _after_api_error(exc)
    # urllib3 names a failed connect NewConnectionError (the text may be cut before its
    # "Connection refused").
    message = str(exc)
    if isinstance(exc, TransportError) and (
            "NewConnectionError" in message or "connection refused" in message.lower()):
        return _After(relist=False, backoff=True, error=message)
    return _After(relist=True, backoff=True, error=_describe(exc))


def _describe(exc: Exception) -> str:
    return str(exc) if isinstance(exc, ApiError | TransportError) else describe_exception(exc)
