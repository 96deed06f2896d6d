"""Liveness (/healthz) and readiness (/readyz) endpoints built from named checks.

Why named checks rather than one flag: when a probe fails, the kubelet event and a
``curl /readyz?verbose`` should say *which* part is unhealthy (a dead worker thread, an
informer that cannot reconnect) without anyone reading logs. The shape follows
Kubernetes' and controller-runtime's healthz: "ok" with 200 when every check passes,
500 listing the failing checks otherwise, ``?verbose`` listing all of them, and
``/readyz/<name>`` probing one check.

Check functions return None when healthy or a short reason. Reasons are shown in the
response, so checks must describe state (thread names, seconds), never data.
"""

from __future__ import annotations

import http.server
import threading
import urllib.parse
from collections.abc import Callable

import structlog

from .httpserver import HTTPServerHandle, serve

log = structlog.get_logger(__name__)

Check = Callable[[], str | None]


class _CheckSet:
    """Named checks, safe to add to while probes are being served."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._checks: dict[str, Check] = {}
        self._lock = threading.Lock()

    def add(self, name: str, check: Check) -> None:
        if not name or "/" in name:
            raise ValueError(f"invalid check name {name!r}")
        with self._lock:
            if name in self._checks:
                raise ValueError(f"{self.kind} check {name!r} already registered")
            self._checks[name] = check

    def run(self, only: str | None = None) -> list[tuple[str, str | None]] | None:
        """[(name, failure reason or None)], or None when ``only`` names no check."""
        with self._lock:
            checks = list(self._checks.items())
        if only is not None:
            checks = [(name, fn) for name, fn in checks if name == only]
            if not checks:
                return None
        return [(name, _run_check(self.kind, name, fn)) for name, fn in checks]


def _run_check(kind: str, name: str, check: Check) -> str | None:
    try:
        return check()
    except Exception as exc:  # a broken check is a failing check, not a broken probe
        log.error("probe check raised", probe=kind, check=name, error_type=type(exc).__name__)
        return f"check raised {type(exc).__name__}"


def _render(kind: str, results: list[tuple[str, str | None]], verbose: bool) -> tuple[int, str]:
    failed = [(name, reason) for name, reason in results if reason is not None]
    if not failed and not verbose:
        return 200, "ok"
    lines = []
    for name, reason in results:
        if reason is None:
            if verbose:
                lines.append(f"[+]{name} ok")
        else:
            lines.append(f"[-]{name} failed: {reason}")
    lines.append(f"{kind} check {'failed' if failed else 'passed'}")
    return (500 if failed else 200), "\n".join(lines) + "\n"


class ProbeServer:
    """Serves /healthz and /readyz from registered checks on ``addr`` (":8081")."""

    def __init__(self, addr: str) -> None:
        self._addr = addr
        self._sets = {"healthz": _CheckSet("healthz"), "readyz": _CheckSet("readyz")}
        self._handle: HTTPServerHandle | None = None

    def add_healthz(self, name: str, check: Check) -> None:
        self._sets["healthz"].add(name, check)

    def add_readyz(self, name: str, check: Check) -> None:
        self._sets["readyz"].add(name, check)

    @property
    def port(self) -> int:
        if self._handle is None:
            raise RuntimeError("probe server is not running")
        return self._handle.port

    def start(self) -> None:
        """Bind and serve in the background; a disabled address ("0") serves nothing."""
        if self._handle is not None:
            return
        self._handle = serve(self._addr, self._handler_class(), thread_name="probe-server")

    def stop(self) -> None:
        if self._handle is not None:
            self._handle.stop()
            self._handle = None

    def respond(self, path: str) -> tuple[int, str]:
        """Status and body for a probe request path (exposed for the HTTP handler)."""
        url = urllib.parse.urlsplit(path)
        verbose = "verbose" in urllib.parse.parse_qs(url.query, keep_blank_values=True)
        kind, _, only = url.path.strip("/").partition("/")
        checks = self._sets.get(kind)
        if checks is None:
            return 404, "not found\n"
        results = checks.run(only or None)
        if results is None:
            return 404, f"no {kind} check named {only!r}\n"
        return _render(kind, results, verbose)

    def _handler_class(self) -> type[http.server.BaseHTTPRequestHandler]:
        probes = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                status, body = probes.respond(self.path)
                payload = body.encode()
                self.send_response(status)
                self.send_header("Content-Type", "text/plain; charset=utf-8")
                self.send_header("X-Content-Type-Options", "nosniff")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def log_message(self, format: str, *args: object) -> None:
                return  # the kubelet probes every few seconds; keep the log for events

        return Handler
