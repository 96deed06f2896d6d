"""The checker's eyes: watches, the audit log and the stand-in's request log, as records.

Watches are our own (plain HTTP streams with the admin token, nothing of the operator's
code): list, then watch from the list's resourceVersion; on 410 or a broken stream they
list again and report what changed meanwhile as synthetic events, as a reflector does.
Every record is stamped with this machine's clock when it arrived.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import requests
from bench.auditlog import AuditLog

from .records import Polled, Watched, Written

WRITE_VERBS = frozenset({"create", "update", "patch", "delete", "deletecollection"})


class Recorder:
    """Every record of the run, in arrival order (thread-safe)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._records: list[Any] = []

    def add(self, record: Any) -> None:
        with self._lock:
            self._records.append(record)

    def snapshot(self) -> list[Any]:
        with self._lock:
            return list(self._records)


def _trim(obj: Mapping[str, Any]) -> dict[str, Any]:
    meta = {k: v for k, v in (obj.get("metadata") or {}).items() if k != "managedFields"}
    return {**obj, "metadata": meta}


class Watcher:
    """One resource, all namespaces (``keep`` filters), into ``sink`` as Watched records."""

    def __init__(self, *, server: str, token: str, ca: Path, path: str, kind: str,
                 sink: Callable[[Watched], None],
                 keep: Callable[[Mapping[str, Any]], bool] = lambda _o: True) -> None:
        self.server, self.path, self.kind, self.sink, self.keep = server, path, kind, sink, keep
        self.session = requests.Session()
        self.session.trust_env = False
        self.session.verify = str(ca)
        self.session.headers["Authorization"] = f"Bearer {token}"
        self.known: dict[tuple[str, str], dict[str, Any]] = {}
        self.relists = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"watch-{kind}", daemon=True)

    def start(self) -> Watcher:
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop recording. The thread (a daemon) ends with its stream, within a minute:
        closing a stream another thread reads would block on that read."""
        self._stop.set()

    def _emit(self, kind: str, obj: Mapping[str, Any]) -> None:
        meta = obj.get("metadata") or {}
        key = (str(meta.get("namespace", "")), str(meta.get("name", "")))
        if not self.keep(obj) or self._stop.is_set():
            return
        trimmed = _trim(obj)
        if kind == "DELETED":
            self.known.pop(key, None)
        else:
            self.known[key] = trimmed
        self.sink(Watched(time.time(), self.kind, kind, trimmed))

    def _list(self) -> str:
        response = self.session.get(self.server + self.path, timeout=60)
        response.raise_for_status()
        body = response.json()
        seen: set[tuple[str, str]] = set()
        for item in body.get("items") or []:
            meta = item.get("metadata") or {}
            key = (str(meta.get("namespace", "")), str(meta.get("name", "")))
            seen.add(key)
            old = self.known.get(key)
            if old is None:
                self._emit("ADDED", item)
            elif old["metadata"].get("resourceVersion") != meta.get("resourceVersion"):
                self._emit("MODIFIED", item)
        for key in [k for k in self.known if k not in seen]:
            self._emit("DELETED", self.known[key])
        return str(body["metadata"]["resourceVersion"])

    def _run(self) -> None:
        rv: str | None = None
        while not self._stop.is_set():
            try:
                if rv is None:
                    rv = self._list()
                    self.relists += 1
                rv = self._watch(rv)
            except (requests.RequestException, ValueError, KeyError, AttributeError):
                rv = None
                self._stop.wait(1.0)

    def _watch(self, rv: str) -> str | None:
        params = {"watch": "1", "resourceVersion": rv, "allowWatchBookmarks": "true",
                  "timeoutSeconds": "60"}
        with self.session.get(self.server + self.path, params=params, stream=True,
                              timeout=(10, 300)) as response:
            if response.status_code == 410:
                return None
            response.raise_for_status()
            for line in response.iter_lines():
                if self._stop.is_set():
                    return rv
                if not line:
                    continue
                event = json.loads(line)
                kind, obj = event.get("type"), event.get("object") or {}
                if kind == "ERROR":
                    return None if obj.get("code") == 410 else rv
                rv = str((obj.get("metadata") or {}).get("resourceVersion", rv))
                if kind in ("ADDED", "MODIFIED", "DELETED"):
                    self._emit(kind, obj)
        return rv


class Follower:
    """Polls the audit log and the stand-in's request log once a second into records."""

    def __init__(self, *, audit_path: Path, user_prefix: str, standin_call: Callable[..., Any],
                 sink: Callable[[Any], None]) -> None:
        self.audit = AuditLog(audit_path, username=user_prefix, prefix=True)
        self._audit_read = 0
        self._standin_call = standin_call
        self._standin_read = 0
        self.sink = sink
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="follower", daemon=True)

    def start(self) -> Follower:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=30)
        self.poll()  # whatever came in last
        self.audit.close()

    def _run(self) -> None:
        while not self._stop.wait(1.0):
            with contextlib.suppress(requests.RequestException, RuntimeError):
                self.poll()

    def poll(self) -> None:
        events = self.audit.refresh()
        for event in events[self._audit_read:]:
            if event.stage != "ResponseComplete" or event.verb not in WRITE_VERBS:
                continue
            if event.code is None or not 200 <= event.code < 300:
                continue
            resource, _, sub = event.resource.partition("/")
            self.sink(Written(event.received, event.username, event.verb, resource, sub,
                              event.namespace, event.name))
        self._audit_read = len(events)
        records = self._standin_call("GET", "/requests", after=self._standin_read)
        self._standin_read += len(records)
        for rec in records:
            if rec.get("environment"):
                self.sink(Polled(float(rec["time"]), str(rec["environment"]),
                                 str(rec.get("token_fingerprint") or ""), rec.get("status"),
                                 bool(rec.get("if_none_match"))))
