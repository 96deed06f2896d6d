"""A real HTTP stand-in for the Himitsu API, for e2e tests, benchmarks and ``make demo``.

Why a server and not mocks: what matters most in the operator (conditional GETs and 304s,
one rate-limit budget shared by every poll on a key, scope errors, a proxy answering HTML,
a reset connection, a trickling body) only shows against something that speaks HTTP the
way Himitsu does (spec/himitsu-api.md). Stdlib only, so it also runs in a bare
``python:3.11-slim`` Pod with these files mounted from a ConfigMap.

Modules, each depending only on those above it:
  wire     formats, ETags, error envelope, rate-limit windows (pure)
  faults   fault injection kinds and their answers
  core     ``Himitsu``: environments, tokens, the endpoint's decisions, request log
  control  the ``/_standin/...`` HTTP control API (every endpoint documented there)
  server   ``StandIn``: ``Himitsu`` plus the keep-alive HTTP/1.1 server
  cli      ``serve`` / ``token`` commands and the seed file format

In-process use::

    with StandIn(per_key_limit=5, window=60.0, clock=fake_clock) as standin:
        token = standin.add_token(project=p, environment=e)
        standin.set_secrets(p, e, {"API_KEY": "v"})
        ... GET {standin.url}/api/v1/projects/{p}/environments/{e}/secrets/runtime
        standin.stats(); standin.requests(); standin.fault("error", status=503, count=2)
"""

from .core import Himitsu
from .faults import FAULT_KINDS
from .server import StandIn
from .wire import TOKEN_RE, UUID_RE, RequestRecord, fingerprint, generate_token

__all__ = ["FAULT_KINDS", "TOKEN_RE", "UUID_RE", "Himitsu", "RequestRecord", "StandIn",
           "fingerprint", "generate_token"]
