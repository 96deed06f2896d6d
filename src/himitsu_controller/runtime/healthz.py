"""Liveness (/healthz) and readiness (/readyz) endpoints built from named checks.

* Named so a failing probe says *which* part is unhealthy without anyone reading logs.
* As Kubernetes' healthz: "ok" when every check passes, else 500 listing the failures;
  ``?verbose`` lists all, ``/readyz/<name>`` probes one.
* A check returns None when healthy, else a short reason that describes state (thread
  names, seconds), never data: it is shown in the response.
"""

from __future__ import annotations

import threading
import urllib.parse
from collections.abc import Callable

import structlog

from .httpserver import Handler, HTTPServerHandle, serve

log = structlog.get_logger(__name__)

Check = Callable[[], str | None]


class ProbeServer:
    """Serves /healthz and /readyz from registered checks on ``addr`` (":8081")."""

    def __init__(self, addr: str) -> None:
        self._addr = addr
        self._checks: dict[str, dict[str, Check]] = {"healthz": {}, "readyz": {}}
        self._lock = threading.Lock()  # checks may be added while probes are served
        self._handle: HTTPServerHandle | None = None

    def add_healthz(self, name: str, check: Check) -> None:
        self._add("healthz", name, check)

    def add_readyz(self, name: str, check: Check) -> None:
        self._add("readyz", name, check)

    def _add(self, kind: str, name: str, check: Check) -> None:
        if not name or "/" in name:
            raise ValueError(f"invalid check name {name!r}")
        with self._lock:
            if name in self._checks[kind]:
                raise ValueError(f"{kind} check {name!r} already registered")
            self._checks[kind][name] = check

    @property
    def port(self) -> int:
        if self._handle is None:
            raise RuntimeError("probe server is not running")
        return self._handle.port

    def start(self) -> None:
        """Bind and serve in the background; a disabled address ("0") serves nothing."""
        if self._handle is None:
            handler = type("ProbeHandler", (_ProbeHandler,), {"probes": self})
            self._handle = serve(self._addr, handler, thread_name="probe-server")

    def stop(self) -> None:
        if self._handle is not None:
            self._handle.stop()
            self._handle = None

    def respond(self, path: str) -> tuple[int, str]:
        """Status and body for a probe request path."""
        url = urllib.parse.urlsplit(path)
        verbose = "verbose" in urllib.parse.parse_qs(url.query, keep_blank_values=True)
        kind, _, only = url.path.strip("/").partition("/")
        if kind not in self._checks:
            return 404, "not found\n"
        with self._lock:
            checks = [(n, c) for n, c in self._checks[kind].items() if only in ("", n)]
        if only and not checks:
            return 404, f"no {kind} check named {only!r}\n"
        results = [(name, _run(kind, name, check)) for name, check in checks]
        failed = any(reason is not None for _, reason in results)
        if not failed and not verbose:
            return 200, "ok"
        lines = [f"[-]{name} failed: {reason}" if reason is not None else f"[+]{name} ok"
                 for name, reason in results if reason is not None or verbose]
        lines.append(f"{kind} check {'failed' if failed else 'passed'}")
        return (500 if failed else 200), "\n".join(lines) + "\n"


class _ProbeHandler(Handler):
    probes: ProbeServer

    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        status, body = self.probes.respond(self.path)
        self.reply(status, body.encode())


def _run(kind: str, name: str, check: Check) -> str | None:
    try:
        return check()
    except Exception as exc:  # a broken check is a failing check, not a broken probe
        log.error("probe check raised", probe=kind, check=name, error_type=type(exc).__name__)
        return f"check raised {type(exc).__name__}"
