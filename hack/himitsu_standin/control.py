"""The control API: drive the stand-in over HTTP from another process or a Pod.

Why: e2e tests, ``make demo`` and a stand-in running inside kind cannot call Python
methods; they need the same levers over HTTP. JSON in and out, no auth, so it answers
loopback clients only (``--allow-remote-control`` lifts that), except ``GET health``, which
a kubelet's readiness probe reaches from the node's address. Control requests are not
rate-limited and not logged. Errors use the API's envelope: 400 INVALID_INPUT for bad
input, 404 NOT_FOUND for unknown objects or routes. ``{p}``/``{e}`` are UUIDs.

  GET    /_standin/health                          {"ok": true} (any client)
  POST   /_standin/environments                    {"project"?, "environment"?} -> info;
         missing ids are generated; info = {"project", "environment", "configVersion",
         "deleted", "keys"} (key names only, never values)
  GET    /_standin/projects/{p}/environments/{e}   info
  POST   /_standin/projects/{p}/environments/{e}   create (idempotent) -> info
  DELETE /_standin/projects/{p}/environments/{e}   delete: +1 version per live secret; then
         env-scoped keys get 401, project/org keys 404 -> info
  POST   /_standin/projects/{p}/environments/{e}/restore        undo it, same bump -> info
  PUT    /_standin/projects/{p}/environments/{e}/secrets        {"KEY": "value", ...}: set
         (creates the environment; +1 version per key, unchanged values too) -> info
  DELETE /_standin/projects/{p}/environments/{e}/secrets/{key}  key URL-encoded -> info
  POST   /_standin/tokens        {"token"?, "project"?, "environment"?, "demoted"?}
         -> {"token", "fingerprint"}; no project = org scope; generated if no token
  POST   /_standin/tokens/revoke {"token"} or {"fingerprint"}
  POST   /_standin/tokens/restore {"token"} or {"fingerprint"}: undo a revocation
  POST   /_standin/tokens/demote {"token"} or {"fingerprint"}, "demoted"?: bool (true); the
                                  key still reads, as the real one does (every role reads)
  POST   /_standin/faults        {"kind", "environment"?, "count"?, "status"?, "code"?,
         "seconds"?, "bytes_per_second"?, "size_mb"?, "retry_after"?, "body"?} -> {"id"}
         (kinds: see the faults module)
  DELETE /_standin/faults[/{id}]  clear every fault, or one
  GET    /_standin/stats          {"total", "by_status", "by_environment", "by_token"}
  DELETE /_standin/stats          reset the stats and the request log
  GET    /_standin/requests[?environment=&limit=&after=]  request log, oldest first;
         after=N skips the first N records logged since the last reset (a follower's count)
  POST   /_standin/wait           {"count", "environment"?, "status"?, "timeout"?}
         -> {"ok", "total"}: block until that many matching requests were logged
  DELETE /_standin/rate-limits    forget every rate-limit window
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict
from typing import Any
from urllib.parse import parse_qs, unquote

from .core import Himitsu
from .wire import Answer, error_answer, fingerprint, is_loopback, json_answer

_ENV_ROUTE = re.compile(r"^/projects/([^/]+)/environments/([^/]+)(/restore|/secrets(?:/(.+))?)?$")
_FAULT_FIELDS = {"kind", "environment", "count", "status", "code", "seconds",
                 "bytes_per_second", "size_mb", "retry_after", "body"}
_MAX_WAIT_SECONDS = 300.0
_HEALTH = "/_standin/health"  # open to every client: a kubelet's readiness probe is remote


def handle_control(himitsu: Himitsu, *, method: str, path: str, query: str, body: bytes,
                   client_ip: str, allow_remote: bool) -> Answer:
    """Answer one ``/_standin/...`` request."""
    if not (allow_remote or is_loopback(client_ip) or (method, path) == ("GET", _HEALTH)):
        return error_answer(403, "the control API answers loopback clients only")
    try:
        payload = json.loads(body) if body else {}
        if not isinstance(payload, dict):
            raise ValueError("the body must be a JSON object")
        result = _route(himitsu, method, path.removeprefix("/_standin"), parse_qs(query), payload)
    except KeyError as exc:
        return error_answer(404, str(exc.args[0]) if exc.args else "not found")
    except (ValueError, TypeError) as exc:
        return error_answer(400, str(exc), code="INVALID_INPUT")
    return json_answer(result)


def _route(himitsu: Himitsu, method: str, path: str, query: dict[str, list[str]],
           body: dict[str, Any]) -> Any:
    match = _ENV_ROUTE.match(path)
    if match:
        return _environment(himitsu, method, match, body)
    if (method, path) == ("POST", "/environments"):
        return himitsu.environment_info(*himitsu.create_environment(
            body.get("project"), body.get("environment")))
    if method == "POST" and path.startswith("/tokens"):
        return _tokens(himitsu, path, body)
    if (method, path) == ("POST", "/faults"):
        unknown = set(body) - _FAULT_FIELDS
        if unknown or "kind" not in body:
            raise ValueError(f"a fault needs 'kind' and takes only {sorted(_FAULT_FIELDS)}")
        return {"id": himitsu.fault(**body)}
    if method == "DELETE" and (path == "/faults" or path.startswith("/faults/")):
        himitsu.clear_faults(path.removeprefix("/faults").strip("/") or None)
        return {"ok": True}
    if (method, path) == ("POST", "/wait"):
        ok = himitsu.wait_for_requests(
            int(body["count"]), environment=body.get("environment"), status=body.get("status"),
            timeout=min(float(body.get("timeout", 10.0)), _MAX_WAIT_SECONDS))
        return {"ok": ok, "total": himitsu.stats()["total"]}
    return _observe(himitsu, method, path, query)


def _tokens(himitsu: Himitsu, path: str, body: dict[str, Any]) -> Any:
    if path == "/tokens":
        token = himitsu.add_token(project=body.get("project"), token=body.get("token"),
                                  environment=body.get("environment"),
                                  demoted=bool(body.get("demoted", False)))
        return {"token": token, "fingerprint": fingerprint(token)}
    ref = str(body.get("token") or body.get("fingerprint") or "")
    if path in ("/tokens/revoke", "/tokens/restore"):
        himitsu.revoke_token(ref, revoked=path == "/tokens/revoke")
    elif path == "/tokens/demote":
        himitsu.set_demoted(ref, bool(body.get("demoted", True)))
    else:
        raise KeyError(f"no control route POST {path}")
    return {"ok": True}


def _observe(himitsu: Himitsu, method: str, path: str, query: dict[str, list[str]]) -> Any:
    if (method, path) == ("GET", "/health"):
        return {"ok": True}
    if (method, path) == ("GET", "/stats"):
        return himitsu.stats()
    if (method, path) == ("DELETE", "/stats"):
        himitsu.reset_stats()
        return {"ok": True}
    if (method, path) == ("GET", "/requests"):
        records = himitsu.requests(environment=query.get("environment", [None])[0],
                                   limit=int(query.get("limit", ["0"])[0]),
                                   after=int(query.get("after", ["0"])[0]))
        return [asdict(record) for record in records]
    if (method, path) == ("DELETE", "/rate-limits"):
        himitsu.reset_rate_limits()
        return {"ok": True}
    raise KeyError(f"no control route {method} {path}")


def _environment(himitsu: Himitsu, method: str, route: re.Match[str],
                 body: dict[str, Any]) -> Any:
    project, environment, sub, key = route.groups()
    if sub is None and method in ("POST", "PUT"):
        himitsu.create_environment(project, environment)
    elif sub is None and method == "DELETE":
        himitsu.delete_environment(project, environment)
    elif sub == "/restore" and method == "POST":
        himitsu.restore_environment(project, environment)
    elif sub == "/secrets" and method in ("POST", "PUT"):
        himitsu.set_secrets(project, environment, body)
    elif key is not None and method == "DELETE":
        himitsu.delete_secret(project, environment, unquote(key))
    elif not (sub is None and method == "GET"):
        raise KeyError(f"no control route {method} {sub or ''} for an environment")
    return himitsu.environment_info(project, environment)
