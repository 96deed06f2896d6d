"""The benchmark's own access to the apiserver: raw JSON as admin, and a watch thread.

Why not the operator's REST layer: the benchmark measures the operator, so it must not
share its code paths (nor its client-side rate limiter). Why ``requests`` with one
session per thread: creating thousands of objects "at once" needs a thread pool, each
thread keeping its own TLS connection alive, and a Session is not meant to be shared
across threads.

Why timestamps come from a watch: "seconds until Ready" and "seconds until restored"
are differences between two events the same watch stream delivered to this process, so
neither the apiserver's clock nor request round trips skew them.
"""

from __future__ import annotations

import base64
import json
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any
from urllib.parse import quote

import requests

HSEC_API = "/apis/himitsu.io/v1alpha1"
WATCH_SECONDS = 10  # the server ends each watch; the thread rewatches and checks for stop


class KubeError(Exception):
    def __init__(self, method: str, path: str, status: int, text: str) -> None:
        super().__init__(f"{method} {path}: HTTP {status} {text[:300]}")
        self.status = status


def secret_path(namespace: str, name: str | None = None) -> str:
    base = f"/api/v1/namespaces/{namespace}/secrets"
    return f"{base}/{quote(name)}" if name else base


def hsec_path(namespace: str | None = None, name: str | None = None) -> str:
    base = f"{HSEC_API}/namespaces/{namespace}/himitsusecrets" if namespace else \
        f"{HSEC_API}/himitsusecrets"
    return f"{base}/{quote(name)}" if name else base


def b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def decode_data(secret: Mapping[str, Any]) -> dict[str, str]:
    data = secret.get("data") or {}
    return {k: base64.b64decode(v).decode("utf-8", "replace") for k, v in data.items()}


class AdminApi:
    """JSON requests with a bearer token; safe to call from many threads at once."""

    def __init__(self, server: str, *, token: str, ca_path: str) -> None:
        self.server = server.rstrip("/")
        self._token = token
        self._ca = ca_path
        self._local = threading.local()
        self._sessions: list[requests.Session] = []
        self._lock = threading.Lock()

    def session(self) -> requests.Session:
        found: requests.Session | None = getattr(self._local, "session", None)
        if found is None:
            found = requests.Session()
            found.trust_env = False  # loopback only: never through a proxy from the env
            found.verify = self._ca
            found.headers["Authorization"] = f"Bearer {self._token}"
            found.headers["User-Agent"] = "himitsu-bench"
            self._local.session = found
            with self._lock:
                self._sessions.append(found)
        return found

    def close(self) -> None:
        with self._lock:
            for session in self._sessions:
                session.close()
            self._sessions.clear()

    def request(self, method: str, path: str, *, body: Any = None,
                params: Mapping[str, Any] | None = None,
                content_type: str = "application/json", ok404: bool = False) -> Any:
        headers = {"Content-Type": content_type, "Accept": "application/json"}
        response = self.session().request(
            method, self.server + path, data=None if body is None else json.dumps(body),
            params=params, headers=headers, timeout=60)
        if ok404 and response.status_code == 404:
            return None
        if not 200 <= response.status_code < 300:
            raise KubeError(method, path, response.status_code, response.text)
        return response.json() if response.content else None

    def get_text(self, path: str) -> str:
        response = self.session().get(self.server + path, timeout=60)
        if response.status_code != 200:
            raise KubeError("GET", path, response.status_code, response.text[:200])
        return response.text

    def get(self, path: str, **params: Any) -> Any:
        return self.request("GET", path, params=params or None)

    def create(self, path: str, body: Mapping[str, Any], *, exist_ok: bool = False) -> Any:
        try:
            return self.request("POST", path, body=dict(body))
        except KubeError as exc:
            if exist_ok and exc.status == 409:
                return None
            raise

    def merge_patch(self, path: str, body: Mapping[str, Any]) -> Any:
        return self.request("PATCH", path, body=dict(body),
                            content_type="application/merge-patch+json")

    def delete(self, path: str) -> None:
        self.request("DELETE", path, ok404=True)

    def list_rv(self, path: str, **params: Any) -> str:
        """The current resourceVersion of a collection (a one-item page is enough)."""
        listing = self.get(path, limit=1, **params)
        return str(listing["metadata"]["resourceVersion"])


EventHandler = Callable[[float, str, dict[str, Any]], None]


class Watcher:
    """Streams watch events of one collection to ``on_event(monotonic_time, type, obj)``.

    Starts from the collection's current resourceVersion (only changes from now on),
    rewatches from the last one seen when the server ends a watch, and relists the
    version (events in the gap are lost, and counted) after a 410 Gone.
    """

    def __init__(self, api: AdminApi, path: str, on_event: EventHandler, *,
                 label_selector: str | None = None, name: str = "watch") -> None:
        self._api = api
        self._path = path
        self._on_event = on_event
        self._params: dict[str, Any] = {"labelSelector": label_selector} \
            if label_selector else {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self.gaps = 0
        self.errors: list[str] = []
        self._rv = ""

    def start(self) -> Watcher:
        self._rv = self._api.list_rv(self._path, **self._params)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(WATCH_SECONDS + 30)

    def __enter__(self) -> Watcher:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self._watch_once()
            except (requests.RequestException, ValueError, KeyError) as exc:
                self.errors.append(type(exc).__name__)
                self._stop.wait(0.5)

    def _watch_once(self) -> None:
        params = {**self._params, "watch": "1", "resourceVersion": self._rv,
                  "allowWatchBookmarks": "true", "timeoutSeconds": str(WATCH_SECONDS)}
        session = self._api.session()
        with session.get(self._api.server + self._path, params=params, stream=True,
                         timeout=(10, WATCH_SECONDS + 30)) as response:
            if response.status_code == 410:
                self._relist()
                return
            response.raise_for_status()
            for line in response.iter_lines(chunk_size=None):
                if not line:
                    continue
                at = time.monotonic()
                event = json.loads(line)
                kind, obj = event.get("type"), event.get("object") or {}
                if kind == "ERROR":
                    if obj.get("code") == 410:
                        self._relist()
                    return
                self._rv = str(obj["metadata"]["resourceVersion"])
                if kind != "BOOKMARK":
                    self._on_event(at, str(kind), obj)
                if self._stop.is_set():
                    return

    def _relist(self) -> None:
        self.gaps += 1
        self._rv = self._api.list_rv(self._path, **self._params)
