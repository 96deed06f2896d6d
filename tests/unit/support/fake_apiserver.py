"""A scriptable fake kube-apiserver on 127.0.0.1 for the runtime's REST and informer tests.

Why a real HTTP server rather than mocks: the behaviours under test live in the wire
protocol -- pagination tokens, chunked watch streams, a stream that ends cleanly versus
one that breaks, a connection that hangs -- and in how our urllib3
transport reacts to them. It speaks just enough of the API: LIST with limit/continue,
GET of one object, WATCH as chunked JSON lines driven by the test, bearer-token auth,
and an echo for writes. Tests can queue canned responses for the next requests.

LISTs follow kube-apiserver's resourceVersion rules and say where each was served
(``list_sources``): with ``watch_cache`` on, ``resourceVersion=0`` ("any", ``limit``
ignored, as servers before list snapshots do) and a known resourceVersion without
``limit`` ("not older than") come from the watch cache; everything else (no
resourceVersion: a consistent read; a resourceVersion with ``limit``: "exact"; continue
pages) from etcd. A resourceVersion newer than the server's gets 504 "Too large resource
version" (as after an etcd restore); an exact one below ``compacted`` gets 410.
"""

from __future__ import annotations

import http.server
import json
import queue
import ssl
import threading
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlsplit

from himitsu_controller.runtime.client.rest import ClientConfig, HttpClient, bearer, new_api_client

TOKEN = "test-token"
_CLOSE = object()
_ABORT = object()


@dataclass
class Recorded:
    method: str
    path: str
    query: dict[str, str]
    headers: dict[str, str]
    body: bytes


@dataclass
class Canned:
    status: int
    body: Any = None
    headers: dict[str, str] = field(default_factory=dict)


def status_body(code: int, reason: str, message: str) -> dict[str, Any]:
    return {"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": code,
            "reason": reason, "message": message}


def too_large_body(wanted: int, current: int) -> dict[str, Any]:
    """kube-apiserver's answer to a resourceVersion newer than it has (504 Timeout)."""
    body = status_body(504, "Timeout",
                       f"Too large resource version: {wanted}, current: {current}")
    body["details"] = {"causes": [{"reason": "ResourceVersionTooLarge",
                                   "message": "Too large resource version"}],
                       "retryAfterSeconds": 1}
    return body


class WatchSession:
    """One open watch; the test drives what the server writes."""

    def __init__(self, query: dict[str, str]) -> None:
        self.query = query
        self._commands: queue.Queue[object] = queue.Queue()

    def send(self, event: dict[str, Any]) -> None:
        self._commands.put((json.dumps(event) + "\n").encode())

    def send_raw(self, data: bytes) -> None:
        self._commands.put(data)

    def close(self) -> None:
        """End the stream cleanly (terminating chunk), as the apiserver does on timeout."""
        self._commands.put(_CLOSE)

    def abort(self) -> None:
        """Drop the connection mid-stream (no terminating chunk)."""
        self._commands.put(_ABORT)

    def serve(self, handler: http.server.BaseHTTPRequestHandler) -> None:
        handler.send_response(200)
        handler.send_header("Content-Type", "application/json")
        handler.send_header("Transfer-Encoding", "chunked")
        handler.end_headers()
        handler.wfile.flush()
        while True:
            command = self._commands.get()
            if command is _ABORT:
                handler.close_connection = True
                return
            if command is _CLOSE:
                handler.wfile.write(b"0\r\n\r\n")
                handler.wfile.flush()
                return
            assert isinstance(command, bytes)
            handler.wfile.write(b"%x\r\n%s\r\n" % (len(command), command))
            handler.wfile.flush()


class FakeApiServer:
    """Objects of one resource type, served on every collection path."""

    def __init__(self, *, list_kind: str = "WidgetList", api_version: str = "example.io/v1",
                 tls: ssl.SSLContext | None = None) -> None:
        self.list_kind = list_kind
        self.api_version = api_version
        self.tokens = {TOKEN}
        self.objects: dict[str, dict[str, Any]] = {}
        self.resource_version = 100
        self.expire_continue = 0
        self.watch_cache = False
        # kube-apiserver 1.34+: the watch cache serves paginated lists too (list snapshots);
        # ``version`` is what GET /version answers (None: 404).
        self.list_snapshots = False
        self.version: dict[str, str] | None = None
        self.collections = {"widgets", "configmaps", "secrets", "leases"}  # LIST, not GET
        self.compacted = 0
        self.list_sources: list[str] = []
        self.canned: deque[Canned] = deque()
        self.watch_refusal: Canned | None = None  # the answer to every watch request
        self.requests: list[Recorded] = []
        self._watches: queue.Queue[WatchSession] = queue.Queue()
        self._sessions: list[WatchSession] = []
        self._lock = threading.Lock()
        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _make_handler(self))
        self._server.daemon_threads = True
        self._tls = tls is not None  # https (the in-cluster configuration's)
        if tls is not None:
            self._server.socket = tls.wrap_socket(self._server.socket, server_side=True)
        # A client that hangs up mid-watch makes writes fail: expected, not worth a traceback.
        self._server.handle_error = lambda request, client_address: None  # type: ignore[method-assign]
        self._thread = threading.Thread(target=self._server.serve_forever, args=(0.05,),
                                        daemon=True)

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"{'https' if self._tls else 'http'}://{host!s}:{port}"

    def start(self) -> FakeApiServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        with self._lock:
            sessions = list(self._sessions)
        for session in sessions:
            session.abort()
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)

    @staticmethod
    def close_client(client: HttpClient) -> None:
        client.close()

    def api_client(self) -> HttpClient:
        return new_api_client(ClientConfig(self.url, credentials=bearer(TOKEN)), pool_maxsize=8)

    # Object helpers: return the stored object, as a watch event would carry it.

    def put(self, name: str, *, namespace: str = "ns", labels: dict[str, str] | None = None,
            data: dict[str, Any] | None = None,
            spec: dict[str, Any] | None = None) -> dict[str, Any]:
        with self._lock:
            self.resource_version += 1
            obj = {"apiVersion": self.api_version, "kind": self.list_kind[:-4],
                   "metadata": {"name": name, "namespace": namespace,
                                "resourceVersion": str(self.resource_version),
                                "labels": labels or {}},
                   "data": data or {}}
            if spec is not None:
                obj["spec"] = spec
            self.objects[f"{namespace}/{name}"] = obj
            return json.loads(json.dumps(obj))  # type: ignore[no-any-return]

    def remove(self, name: str, *, namespace: str = "ns") -> dict[str, Any]:
        with self._lock:
            self.resource_version += 1
            obj = self.objects.pop(f"{namespace}/{name}")
            obj["metadata"]["resourceVersion"] = str(self.resource_version)
            return obj

    # Test-side waiting.

    def next_watch(self, timeout: float = 15.0) -> WatchSession:
        return self._watches.get(timeout=timeout)

    def requests_of(self, method: str, *, watch: bool | None = None) -> list[Recorded]:
        with self._lock:
            found = [r for r in self.requests if r.method == method]
        if watch is not None:
            found = [r for r in found if (r.query.get("watch") == "true") == watch]
        return found

    # Request handling (called on server threads).

    def _record(self, request: Recorded) -> Canned | None:
        with self._lock:
            self.requests.append(request)
            if self.watch_refusal is not None and request.query.get("watch") == "true":
                return self.watch_refusal
            return self.canned.popleft() if self.canned else None

    def _open_watch(self, query: dict[str, str]) -> WatchSession:
        session = WatchSession(query)
        with self._lock:
            self._sessions.append(session)
        self._watches.put(session)
        return session

    def _list(self, query: dict[str, str]) -> Canned:
        with self._lock:
            token = query.get("continue")
            version = query.get("resourceVersion", "")
            if token and version:
                return Canned(400, status_body(400, "BadRequest", "specifying resource "
                                               "version is not allowed when using continue"))
            if version not in ("", "0") and int(version) > self.resource_version:
                return Canned(504, too_large_body(int(version), self.resource_version))
            from_cache = self.watch_cache and not token and (
                version == "0" or (version != "" and "limit" not in query))
            snapshots = self.watch_cache and self.list_snapshots
            from_cache = from_cache or snapshots
            self.list_sources.append("cache" if from_cache else "etcd")
            if not from_cache and version not in ("", "0") and not token \
                    and int(version) < self.compacted:
                return Canned(410, status_body(410, "Expired", "too old resource version"))
            if token and self.expire_continue > 0:
                self.expire_continue -= 1
                return Canned(410, status_body(410, "Expired", "continue token too old"))
            ordered = [self.objects[key] for key in sorted(self.objects)]
            start = int(token) if token else 0
            paged = "limit" in query and not (from_cache and (version == "0" or not snapshots))
            limit = int(query["limit"]) if paged else len(ordered)
            page = ordered[start:start + limit]
            metadata: dict[str, Any] = {"resourceVersion": str(self.resource_version)}
            if start + limit < len(ordered):
                metadata["continue"] = str(start + limit)
            items = []
            for obj in page:
                item = json.loads(json.dumps(obj))
                item.pop("apiVersion")  # real list items carry neither
                item.pop("kind")
                items.append(item)
        return Canned(200, {"kind": self.list_kind, "apiVersion": self.api_version,
                            "metadata": metadata, "items": items})

    def _get(self, path: str) -> Canned:
        parts = path.strip("/").split("/")
        key = f"{parts[-3]}/{parts[-1]}" if "namespaces" in parts else parts[-1]
        with self._lock:
            obj = self.objects.get(key)
        if obj is None:
            return Canned(404, status_body(404, "NotFound", f"{key} not found"))
        return Canned(200, obj)


def _make_handler(server: FakeApiServer) -> type[http.server.BaseHTTPRequestHandler]:
    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:
            pass  # keep pytest output clean

        def _handle(self) -> None:
            split = urlsplit(self.path)
            query = dict(parse_qsl(split.query, keep_blank_values=True))
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length) if length else b""
            canned = server._record(Recorded(self.command, split.path, query,
                                             {k.lower(): v for k, v in self.headers.items()}, body))
            auth = self.headers.get("Authorization", "")
            if auth not in {f"Bearer {token}" for token in server.tokens}:
                canned = Canned(401, status_body(401, "Unauthorized", "Unauthorized"))
            if canned is None:
                canned = self._default(split.path, query, body)
            if canned is None:
                return
            self._respond(canned)

        def _default(self, path: str, query: dict[str, str], body: bytes) -> Canned | None:
            if self.command == "GET" and query.get("watch") == "true":
                server._open_watch(query).serve(self)
                return None
            if self.command == "GET" and path == "/version" and server.version is not None:
                return Canned(200, server.version)
            if self.command == "GET":
                last = path.rstrip("/").split("/")[-1]
                collection = last in server.collections
                return server._list(query) if collection else server._get(path)
            try:
                parsed: Any = json.loads(body) if body else None
            except ValueError:
                parsed = body.decode()
            return Canned(200, {"method": self.command, "path": path, "query": query,
                                "contentType": self.headers.get("Content-Type"),
                                "body": parsed})

        def _respond(self, canned: Canned) -> None:
            raw = canned.body if isinstance(canned.body, bytes) else \
                json.dumps(canned.body).encode()
            self.send_response(canned.status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(raw)))
            for name, value in canned.headers.items():
                self.send_header(name, value)
            self.end_headers()
            self.wfile.write(raw)
            self.wfile.flush()

        def do_GET(self) -> None:
            self._handle()

        def do_POST(self) -> None:
            self._handle()

        def do_PUT(self) -> None:
            self._handle()

        def do_PATCH(self) -> None:
            self._handle()

        def do_DELETE(self) -> None:
            self._handle()

    return Handler


def kubeconfig_for(server: FakeApiServer, path: Path) -> Path:
    """A kubeconfig file pointing at ``server`` with its bearer token (for cli.run)."""
    path.write_text(
        "apiVersion: v1\nkind: Config\n"
        f"clusters: [{{name: fake, cluster: {{server: '{server.url}'}}}}]\n"
        f"users: [{{name: op, user: {{token: {TOKEN}}}}}]\n"
        "contexts: [{name: fake, context: {cluster: fake, user: op}}]\n"
        "current-context: fake\n")
    return path
