"""Command line: serve the stand-in (seeded from JSON), or mint a well-formed token.

Why a seed file: ``make demo`` and the stand-in Pod in kind start it with a known set of
projects, environments, secrets and tokens, before anything polls it. Seed format::

    {"environments": [{"project": "<uuid>", "environment": "<uuid>",
                       "secrets": {"KEY": "value"}, "deleted": false}],
     "tokens": [{"name": "demo", "token": "himi_...", "project": "<uuid>",
                 "environment": "<uuid>", "demoted": false, "revoked": false}]}

Every field but the ids is optional; a token without ``token`` is generated, one without
``project`` is org-wide. Tokens are never printed: ``--tokens-out`` writes ``{name:
token}`` to a file (mode 0600) for the caller; stdout shows fingerprints only. The
``--port-file`` is written last, once serving: when it appears, the tokens file is there.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import tempfile
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from .server import StandIn
from .wire import fingerprint, generate_token

_ENV_FIELDS = {"project", "environment", "secrets", "deleted"}
_TOKEN_FIELDS = {"name", "token", "project", "environment", "demoted", "revoked"}


def load_seed(standin: StandIn, seed: Mapping[str, Any]) -> dict[str, str]:
    """Apply a seed document; returns every seeded token by name (given or generated)."""
    if set(seed) - {"environments", "tokens"}:
        raise ValueError("a seed has only 'environments' and 'tokens'")
    for entry in seed.get("environments", []):
        _check_fields(entry, _ENV_FIELDS, "environment")
        project, environment = standin.create_environment(entry["project"],
                                                          entry["environment"])
        standin.set_secrets(project, environment, entry.get("secrets", {}))
        if entry.get("deleted", False):
            standin.delete_environment(project, environment)
    tokens: dict[str, str] = {}
    for index, entry in enumerate(seed.get("tokens", [])):
        _check_fields(entry, _TOKEN_FIELDS, "token")
        name = str(entry.get("name", f"token-{index}"))
        if name in tokens:
            raise ValueError(f"two seed tokens are named {name!r}")
        tokens[name] = standin.add_token(
            project=entry.get("project"), environment=entry.get("environment"),
            token=entry.get("token"), demoted=bool(entry.get("demoted", False)))
        if entry.get("revoked", False):
            standin.revoke_token(tokens[name])
    return tokens


def _check_fields(entry: Any, allowed: set[str], what: str) -> None:
    if not isinstance(entry, dict) or set(entry) - allowed:
        raise ValueError(f"a seed {what} is an object with fields among {sorted(allowed)}")


def _write_atomically(path: Path, text: str, *, mode: int = 0o644) -> None:
    """Write atomically (a reader polling for the file never sees half of it)."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    with os.fdopen(fd, "w") as handle:
        handle.write(text)
    os.chmod(tmp, mode)
    os.replace(tmp, path)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="himitsu_standin", description="An HTTP stand-in for the Himitsu API "
        "(runtime endpoint, tokens, rate limits, faults) with a /_standin control API.")
    commands = parser.add_subparsers(dest="command", required=True)
    serve = commands.add_parser("serve", help="serve until SIGTERM or SIGINT")
    serve.add_argument("--host", default="127.0.0.1",
                       help="address to bind (default 127.0.0.1); non-loopback needs "
                       "--allow-remote")
    serve.add_argument("--port", type=int, default=8700, help="port (default 8700; 0 = any)")
    serve.add_argument("--allow-remote", action="store_true",
                       help="allow a non-loopback --host, e.g. 0.0.0.0 in a kind Pod")
    serve.add_argument("--allow-remote-control", action="store_true",
                       help="answer /_standin/ control requests from non-loopback clients")
    serve.add_argument("--seed-file", type=Path, help="JSON seed (see the cli module)")
    serve.add_argument("--port-file", type=Path, help="write the bound port here")
    serve.add_argument("--tokens-out", type=Path,
                       help="write the seeded tokens as JSON {name: token} here (0600)")
    serve.add_argument("--per-key-limit", type=int, default=120,
                       help="requests per API key per window (default 120)")
    serve.add_argument("--per-ip-limit", type=int, default=300,
                       help="requests per client IP per window (default 300)")
    serve.add_argument("--window", type=float, default=60.0,
                       help="rate-limit window in seconds (default 60)")
    commands.add_parser("token", help="print a new random token in Himitsu's format")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "token":
        print(generate_token())
        return 0
    try:
        standin = StandIn(args.host, args.port, per_key_limit=args.per_key_limit,
                          per_ip_limit=args.per_ip_limit, window=args.window,
                          allow_remote=args.allow_remote,
                          allow_remote_control=args.allow_remote_control)
        seed = json.loads(args.seed_file.read_text()) if args.seed_file else {}
        tokens = load_seed(standin, seed)
    except (OSError, ValueError, KeyError) as exc:
        print(f"himitsu_standin: {exc}", file=sys.stderr)
        return 2
    if args.tokens_out:
        _write_atomically(args.tokens_out, json.dumps(tokens, indent=2) + "\n", mode=0o600)
    elif any("token" not in entry for entry in seed.get("tokens", [])):
        print("himitsu_standin: generated tokens are only available with --tokens-out",
              file=sys.stderr)
    done = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: done.set())
    standin.start()
    if args.port_file:
        _write_atomically(args.port_file, f"{standin.port}\n")
    for name, token in tokens.items():
        print(f"token {name}: fingerprint {fingerprint(token)}")
    print(f"himitsu stand-in serving {standin.url}", flush=True)
    done.wait()
    standin.stop()
    return 0
